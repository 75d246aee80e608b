"""The Ray path's pure parts, without Ray: routing, splitting back, error unwrapping, CLI rules."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from chainrows.errors import InputError
from chainrows.formats.native.dataset import CANONICAL, TABLES
from chainrows.runners.bulk.partition import string_hashes
from chainrows.runners.ray.cluster import input_error_in
from chainrows.runners.ray.route import BUCKET_COL, add_buckets, split_tables
from chainrows.runners.ray.source import ONE_LINE, RKEY_COL, SEQ_COL, TABLE_COL, TAG, TableFiles, wide_schema


def _tables() -> dict:
    return {n: TableFiles(n, [], [], [], [c for c in CANONICAL[n].names if c not in ("logprobs", "accepted_response_ids")])
            for n in TABLES}


def _wide(rows: list[dict]) -> pa.Table:
    schema = wide_schema(_tables())
    full = [{f.name: r.get(f.name) for f in schema} for r in rows]
    for r in full:
        r[RKEY_COL] = 0
    return pa.Table.from_pylist(full, schema=schema)


def _bucket_of(key: str, n: int) -> int:
    return int(string_hashes(pa.array([key]))[0] % n)


def test_every_row_of_a_rollout_takes_the_bucket_of_its_first_rollouts_row():
    n = 1 << 20  # wide enough that the two groups' buckets differ
    assert _bucket_of("g:A", n) != _bucket_of("g:B", n)
    rows = _wide([
        {TABLE_COL: TAG["rollouts"], SEQ_COL: 7, "rollout_id": "r1", "group_id": "B"},  # later in read order
        {TABLE_COL: TAG["ledger"], SEQ_COL: 0, "rollout_id": "r1", "call_id": "c1"},
        {TABLE_COL: TAG["rollouts"], SEQ_COL: 3, "rollout_id": "r1", "group_id": "A"},  # first: counts
        {TABLE_COL: TAG["tokens"], SEQ_COL: 1, "rollout_id": "r1", "call_id": "c1"},
        {TABLE_COL: TAG["ledger"], SEQ_COL: 2, "rollout_id": "r2", "call_id": "c1"},   # no rollouts row
        {TABLE_COL: TAG["rollouts"], SEQ_COL: 4, "rollout_id": "r3", "group_id": None},  # null group
    ])
    out = add_buckets(rows, n)
    assert RKEY_COL not in out.column_names
    got = dict(zip(zip(out["rollout_id"].to_pylist(), out[SEQ_COL].to_pylist()), out[BUCKET_COL].to_pylist()))
    a = _bucket_of("g:A", n)
    assert [got[("r1", s)] for s in (0, 1, 3, 7)] == [a] * 4
    assert got[("r2", 2)] == _bucket_of("r:r2", n)
    assert got[("r3", 4)] == _bucket_of("r:r3", n)


def test_split_tables_restores_read_order_per_table():
    rows = _wide([
        {TABLE_COL: TAG["ledger"], SEQ_COL: 5, "rollout_id": "r", "call_id": "b"},
        {TABLE_COL: TAG["tokens"], SEQ_COL: 1, "rollout_id": "r", "call_id": "x"},
        {TABLE_COL: TAG["ledger"], SEQ_COL: (1 << 40) + 0, "rollout_id": "r", "call_id": "c"},  # second file
        {TABLE_COL: TAG["ledger"], SEQ_COL: 2, "rollout_id": "r", "call_id": "a"},
    ])
    ledger, tokens, rollouts = split_tables(add_buckets(rows, 4), _tables())
    assert ledger["call_id"].to_pylist() == ["a", "b", "c"]
    assert tokens["call_id"].to_pylist() == ["x"] and rollouts.num_rows == 0
    assert ledger.schema.names == _tables()["ledger"].columns


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
    schema = wide_schema(check_tables(loc))
    raised = pa.ArrowMemoryError("malloc of size 39925248 failed") if failure == "out of memory" else OSError("bad page")

    def fail(self, *args, **kwargs):
        raise raised

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", fail)
    if failure == "out of memory":
        with pytest.raises(MemoryError):
            list(read_file(pafs.LocalFileSystem(), tf, 0, schema, 4))
    else:
        with pytest.raises(InputError, match="unreadable Parquet file: bad page") as err:
            list(read_file(pafs.LocalFileSystem(), tf, 0, schema, 4))
        assert tf.shown[0] in str(err.value)


def test_ray_footer_totals_refuse_an_encrypted_file_naming_it(tmp_path):
    """A dataset given as a URI is checked by the Ray path's own footer reads: an encrypted
    column there is the same one-line InputError as on the single-process paths, before Ray
    starts (review: it was an internal error there)."""
    import pyarrow.parquet as pq

    from chainrows.runners.ray.job import _input_totals
    from chainrows.runners.ray.source import check_tables, locate
    from chainrows.synth import write_synth_dataset
    from tests.support.tables import write_encrypted

    write_synth_dataset(tmp_path / "data", 4, seed=1)
    ledger = tmp_path / "data" / "ledger.parquet"
    table = pq.read_table(ledger)
    ledger.unlink()
    write_encrypted(ledger, table, ["call_id"], plaintext_footer=True)
    loc = locate(f"file://{tmp_path / 'data'}")
    with pytest.raises(InputError, match="encrypted columns") as err:
        _input_totals(loc, check_tables(loc))
    assert "ledger.parquet" in str(err.value)
