"""The Ray path's pure parts, without Ray: routing, output ranges, error unwrapping, CLI rules."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from chainrows.errors import InputError
from chainrows.runners.bulk.partition import string_hashes
from chainrows.runners.ray.cluster import input_error_in
from chainrows.runners.ray.route import (
    GroupMap,
    bucket_of,
    cut_sorted,
    group_keys,
    merge_buckets,
    own_keys,
    range_bounds,
    sample_ids,
    split_by_bucket,
)
from chainrows.runners.ray.source import ONE_LINE


def _bucket_of(key: str, n: int) -> int:
    return int(bucket_of(string_hashes(pa.array([key])), n)[0])


def _map(rollout_ids, group_ids, n) -> GroupMap:
    return GroupMap.build(*group_keys(pa.array(rollout_ids, pa.string()), pa.array(group_ids, pa.string())), n)


def test_every_row_of_a_rollout_takes_the_bucket_of_its_first_rollouts_row():
    n = 1 << 20  # wide enough that the groups' buckets differ
    assert len({_bucket_of(g, n) for g in ("A", "B", "C")}) == 3
    groups = _map(["r1", "r4", "r5", "r3"], ["A", "A", "C", None], n)
    got = groups.buckets_of(pa.array(["r1", "r4", "r5", "r3", "r2"]))
    assert got[0] == got[1] == _bucket_of("A", n)
    assert got[2] == _bucket_of("C", n)
    own = bucket_of(own_keys(string_hashes(pa.array(["r3", "r2"]))), n)
    assert got[3] == own[0] and got[4] == own[1]  # a null group, no rollouts row: its own group


def test_a_later_rollouts_row_naming_another_group_merges_the_two_buckets():
    """Only the first row names r1's group (A); the later row (B) cannot split anything: A's and
    B's buckets become one, so A, B and r1 are decided together."""
    n = 1 << 20
    groups = _map(["r1", "a2", "b1", "r1"], ["A", "A", "B", "B"], n)
    got = groups.buckets_of(pa.array(["r1", "a2", "b1"]))
    assert got[0] == got[1] == got[2]
    assert got[0] == min(_bucket_of("A", n), _bucket_of("B", n))


def _union_find(n, pairs):
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for a, b in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return [find(x) for x in range(n)]


@given(st.integers(1, 30).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=40))))
def test_merge_buckets_is_union_find(case):
    n, pairs = case
    a = np.array([p[0] for p in pairs], np.int64)
    b = np.array([p[1] for p in pairs], np.int64)
    got = merge_buckets(n, a, b)
    want = _union_find(n, pairs)
    same = [[want[x] == want[y] for y in range(n)] for x in range(n)]
    assert [[got[x] == got[y] for y in range(n)] for x in range(n)] == same
    assert all(got[x] <= x for x in range(n))


@given(st.lists(st.tuples(st.integers(0, 40), st.one_of(st.none(), st.integers(0, 6))), max_size=60),
       st.integers(1, 8), st.integers(1, 4))
def test_group_map_keeps_groups_whole_even_when_rollout_hashes_collide(rows, n, width):
    """Rollout r has hash r // width (``width`` > 1: distinct ids collide). Whatever collides,
    every rollout of a group (named by the rollout's first row) lands in one bucket, and each
    rollout id in exactly one."""
    rids = np.array([r for r, _ in rows], np.uint64)
    hashes = rids // np.uint64(width)
    keys = np.array([1000 + g if g is not None else int(own_keys(np.array([h], np.uint64))[0])
                     for (_, g), h in zip(rows, hashes)], np.uint64)
    groups = GroupMap.build(hashes, keys, n)
    target = dict(zip(groups.hashes.tolist(), groups.targets.tolist()))
    first_group = {}
    for (r, g), h in zip(rows, hashes.tolist()):
        first_group.setdefault(r, (g, h))
    by_group = {}
    for g, h in first_group.values():
        if g is not None:
            by_group.setdefault(g, set()).add(target[h])
    assert all(len(b) == 1 for b in by_group.values()), by_group
    assert all(0 <= t < n for t in target.values())


def test_split_by_bucket_keeps_read_order():
    t = pa.table({"x": list(range(8))})
    pieces = split_by_bucket(t, np.array([2, 0, 2, 1, 0, 2, 0, 0]), 4)
    assert [p["x"].to_pylist() if p is not None else None for p in pieces] == \
        [[1, 4, 6, 7], [3], [0, 2, 5], None]


@given(st.lists(st.text(alphabet="ab\u00e9z", max_size=4), max_size=50), st.integers(1, 9))
def test_range_bounds_cut_sorted_ids_into_ordered_ranges(ids, ranges):
    sample = sample_ids(pa.array(ids, pa.string()), 16)
    assert len(sample) <= 16 and sample.to_pylist() == sorted(set(sample.to_pylist()), key=str.encode)
    bounds = range_bounds([sample], ranges)
    assert len(bounds) <= ranges - 1
    b = bounds.to_pylist()
    assert b == sorted(set(b), key=str.encode)
    ordered = pa.array(sorted(ids, key=str.encode), pa.string())
    cuts = cut_sorted(ordered, bounds)
    assert cuts[0] == 0 and cuts[-1] == len(ids) and list(cuts) == sorted(cuts)
    for r in range(len(cuts) - 1):
        for x in ordered[cuts[r]:cuts[r + 1]].to_pylist():
            assert (r == 0 or x.encode() >= b[r - 1].encode()) and (r == len(b) or x.encode() < b[r].encode())


def test_input_error_is_found_in_ray_style_wrapping():
    original = InputError("column 'x' is bad", table="ledger", file="f.parquet")
    setattr(original, ONE_LINE, str(original))
    shipped = pickle.loads(pickle.dumps(original))
    shipped.args = (f"{shipped.args[0]} Failed to apply UDF transform after 1/1 attempts",)  # what Ray Data does
    try:
        try:
            raise shipped
        except InputError as exc:
            raise RuntimeError("task failed") from exc
    except RuntimeError as outer:
        found = input_error_in(outer)
    assert str(found) == "ledger: column 'x' is bad (file f.parquet)"
    assert input_error_in(RuntimeError("nothing of ours")) is None


@pytest.mark.parametrize("flag", [["--resume"], ["--memory-budget", "1GiB"], ["--threads", "2"],
                                  ["--steps", "2"], ["--hold-runs", "0"]])
def test_single_process_knobs_are_usage_errors_with_ray(tmp_path, capsys, flag):
    from chainrows.cli import main

    rc = main(["reassemble", str(tmp_path / "d"), str(tmp_path / "o"), "--ray", *flag])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith(f"chainrows: error: {flag[0]} does not apply with --ray")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("failure", ["out of memory", "damaged"])
def test_ray_file_reader_lets_out_of_memory_pass_and_names_a_damaged_file(tmp_path, monkeypatch, failure):
    """The Ray reader shares the single-process reader's error handling: pyarrow's
    ArrowMemoryError (an ArrowException too) is the machine's, not an unreadable file."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from chainrows.runners.ray.source import check_tables, locate, read_file
    from chainrows.synth import write_synth_dataset

    write_synth_dataset(tmp_path / "data", 4, seed=1)
    loc = locate(tmp_path / "data")
    tf = check_tables(loc)["tokens"]
    raised = pa.ArrowMemoryError("malloc of size 39925248 failed") if failure == "out of memory" else OSError("bad page")

    def fail(self, *args, **kwargs):
        raise raised

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", fail)
    if failure == "out of memory":
        with pytest.raises(MemoryError):
            list(read_file(pafs.LocalFileSystem(), tf, 0))
    else:
        with pytest.raises(InputError, match="unreadable Parquet file: bad page") as err:
            list(read_file(pafs.LocalFileSystem(), tf, 0))
        assert tf.shown[0] in str(err.value)


def test_ray_footer_totals_refuse_an_encrypted_file_naming_it(tmp_path):
    """A dataset given as a URI is checked by the Ray path's own footer reads: an encrypted
    column there is the same one-line InputError as on the single-process paths, before Ray
    starts (review: it was an internal error there)."""
    import pyarrow.parquet as pq

    from chainrows.runners.ray.source import check_tables, locate, read_plan
    from chainrows.synth import write_synth_dataset
    from tests.support.tables import write_encrypted

    write_synth_dataset(tmp_path / "data", 4, seed=1)
    ledger = tmp_path / "data" / "ledger.parquet"
    table = pq.read_table(ledger)
    ledger.unlink()
    write_encrypted(ledger, table, ["call_id"], plaintext_footer=True)
    loc = locate(f"file://{tmp_path / 'data'}")
    with pytest.raises(InputError, match="encrypted columns") as err:
        read_plan(loc, check_tables(loc), 1 << 30)
    assert "ledger.parquet" in str(err.value)


@pytest.mark.parametrize("cpus, gib, want", [(2, 0, 4), (2, 1.2, 6), (3, 0.1, 6), (4, 10, 40), (0, 0, 2)])
def test_default_buckets_fill_every_wave(cpus, gib, want):
    from chainrows.runners.ray.job import BUCKET_BYTES, TASKS_PER_CPU, default_buckets

    got = default_buckets(cpus, int(gib * (1 << 30)))
    assert got == want
    assert got % max(cpus, 1) == 0 and got >= TASKS_PER_CPU * max(cpus, 1)
    assert got * BUCKET_BYTES >= gib * (1 << 30)


@pytest.mark.parametrize("sizes, limit, want", [
    ([], 10, [None]), ([50], 10, [None]), ([3, 3, 3], 10, [None]),
    ([4, 4, 4, 4], 10, [range(0, 2), range(2, 4)]),
    ([4, 20, 1, 1, 9], 10, [range(0, 1), range(1, 2), range(2, 4), range(4, 5)]),
])
def test_row_group_runs_cut_a_file_into_bounded_reads(sizes, limit, want):
    from chainrows.runners.ray.source import row_group_runs

    assert row_group_runs(sizes, limit) == want


def test_reads_of_row_group_runs_give_the_whole_file_in_order(tmp_path):
    """A file read as runs of row groups gives the rows, and the row numbers in errors, of the
    whole file read at once."""
    import pyarrow.parquet as pq

    from chainrows.runners.ray.source import check_tables, locate, read_file, read_plan
    from chainrows.synth import write_synth_dataset

    write_synth_dataset(tmp_path / "data", 40, seed=1)
    tokens = tmp_path / "data" / "tokens.parquet"
    table = pq.read_table(tokens)
    pq.write_table(table, tokens, row_group_size=7)
    loc = locate(tmp_path / "data")
    tables = check_tables(loc)
    sizes, reads = read_plan(loc, tables, 4096)
    runs = [r.row_groups for r in reads if r.table == "tokens"]
    assert len(runs) > 2 and runs[0].start == 0 and all(a.stop == b.start for a, b in zip(runs, runs[1:]))
    assert runs[-1].stop == pq.ParquetFile(tokens).num_row_groups
    whole = pa.concat_tables(read_file(loc.fs, tables["tokens"], 0))
    pieces = pa.concat_tables(t for g in runs for t in read_file(loc.fs, tables["tokens"], 0, row_groups=g))
    assert pieces.equals(whole) and whole.num_rows == table.num_rows
    ids = table["call_id"].to_pylist()
    ids[30] = None
    pq.write_table(table.set_column(table.schema.get_field_index("call_id"), "call_id", pa.array(ids, pa.string())),
                   tokens, row_group_size=7)
    with pytest.raises(InputError, match="row 30") as err:
        for g in runs:
            list(read_file(loc.fs, tables["tokens"], 0, row_groups=g))
    assert "tokens.parquet" in str(err.value)


def test_a_short_read_in_a_run_of_row_groups_gives_the_whole_file_message(tmp_path, monkeypatch):
    """A damaged page can make pyarrow return fewer rows than the footer promises; read in runs
    of row groups, the message still counts the whole file's rows, as the single-process read
    does."""
    import pyarrow.parquet as pq

    from chainrows.formats.native import dataset as dsio
    from chainrows.runners.ray.source import check_tables, locate, read_file, read_plan
    from chainrows.synth import write_synth_dataset

    write_synth_dataset(tmp_path / "data", 40, seed=1)
    tokens = tmp_path / "data" / "tokens.parquet"
    pq.write_table(pq.read_table(tokens), tokens, row_group_size=7)
    loc = locate(tmp_path / "data")
    tables = check_tables(loc)
    runs = [r.row_groups for r in read_plan(loc, tables, 4096)[1] if r.table == "tokens"]
    real = pq.ParquetFile.iter_batches

    def short(self, *args, **kwargs):  # the last row of every batch lost, no error raised
        for batch in real(self, *args, **kwargs):
            yield batch.slice(0, batch.num_rows - 1)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", short)
    with pytest.raises(InputError) as whole:
        list(dsio.iter_file_tables("tokens", tables["tokens"].shown[0], tables["tokens"].columns,
                                   tables["tokens"].present[0], 1 << 16))
    with pytest.raises(InputError) as in_run:
        list(read_file(loc.fs, tables["tokens"], 0, row_groups=runs[1]))
    assert str(in_run.value) == str(whole.value) and "footer says" in str(whole.value)
