"""Datasets of many small files: footers read once per bulk run (chainrows.formats.native.footers), small
files read a group at a time (chainrows.formats.native.small_files) with the errors of one-by-one reads, and
small batches joined for the id scan (chainrows.arrays.coalesced)."""

from __future__ import annotations

import collections
import json
import os
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from chainrows.api import run_tables
from chainrows.arrays import coalesced
from chainrows.errors import InputError
from chainrows.formats.native import dataset as dsmod
from chainrows.formats.native import footers, small_files
from chainrows.formats.native.dataset import TABLES, TablePlan, iter_table_batches, plan_table, read_table
from chainrows.runners import bulk
from chainrows.runners.bulk import plan as planner
from chainrows.runners.bulk import stream, windows
from chainrows.synth import write_synth_dataset
from tests.support.builders import scribble_pages
from tests.support.outputs import output_bytes_but_input


@pytest.fixture(scope="module")
def many_files(tmp_path_factory):
    """A synth dataset and the same tables cut into 9 files each."""
    root = tmp_path_factory.mktemp("footers")
    one = root / "one"
    write_synth_dataset(one, 60, seed=3, corrupt_rate=0.2)
    many = root / "many"
    for name in TABLES:
        table = pq.read_table(one / f"{name}.parquet")
        (many / name).mkdir(parents=True)
        step = -(-table.num_rows // 9)
        for i in range(9):
            pq.write_table(table.slice(i * step, step), many / name / f"part-{i}.parquet")
    return one, many


@pytest.fixture
def reads(monkeypatch):
    """Counts footer reads per file."""
    counts = collections.Counter()
    real = footers._read

    def counting(name, file):
        counts[file] += 1
        return real(name, file)

    monkeypatch.setattr(footers, "_read", counting)
    return counts


@pytest.mark.parametrize("route", [bulk.Route("stream", 3, "test"), bulk.Route("spill", 2, "test"), None],
                         ids=["stream", "spill", "chosen"])
def test_a_bulk_run_reads_each_footer_once(many_files, reads, tmp_path, route):
    one, many = many_files
    bulk.run(one, tmp_path / "want", route=bulk.Route("memory", 1, "test"))
    reads.clear()
    bulk.run(many, tmp_path / "got", route=route)
    files = sorted(p for p in many.rglob("*.parquet"))
    assert sorted(reads) == files
    assert set(reads.values()) == {1}, reads
    assert output_bytes_but_input(tmp_path / "got") == output_bytes_but_input(tmp_path / "want")
    assert footers._remembered is None  # dropped with the run


def test_outside_a_run_every_call_reads(many_files, reads):
    _, many = many_files
    plan_table(many, "ledger")
    plan_table(many, "ledger")
    assert set(reads.values()) == {2} and len(reads) == 9


def test_a_file_changed_inside_the_block_is_read_again(tmp_path, reads):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": [1, 2]}), path)
    with footers.remembered():
        first = footers.file_facts("ledger", path)
        assert footers.file_facts("ledger", path) is first
        pq.write_table(pa.table({"a": [1, 2, 3], "b": ["x", "y", "z"]}), path)
        os.utime(path, ns=(1, 1))  # a new stamp even on a coarse clock
        again = footers.file_facts("ledger", path)
    assert reads[path] == 2
    assert again.num_rows == 3 and again.schema.names == ["a", "b"]
    assert first.num_rows == 2


def test_blocks_on_two_threads_share_one_memory_dropped_by_the_last(tmp_path, reads):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": [1]}), path)
    inside, release = threading.Event(), threading.Event()

    def other():
        with footers.remembered():
            footers.file_facts("ledger", path)
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    with footers.remembered():
        t.start()
        assert inside.wait(10)
        footers.file_facts("ledger", path)  # remembered from the other thread's read
        assert reads[path] == 1
    assert footers._remembered is not None  # the other block is still open
    release.set()
    t.join(10)
    assert footers._remembered is None


def test_an_unreadable_footer_names_the_table_and_file(tmp_path):
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"PAR1 not a parquet file")
    for block in (footers.remembered(), open(os.devnull)):
        with block, pytest.raises(InputError) as exc:
            footers.file_facts("tokens", path)
        assert "unreadable Parquet file" in str(exc.value) and "bad.parquet" in str(exc.value)
        assert "tokens" in str(exc.value)


def _batches(sizes, schema=pa.schema([("id", pa.string()), ("n", pa.int64())])):
    start = 0
    for size in sizes:
        yield pa.RecordBatch.from_pydict({"id": [f"r{i}" for i in range(start, start + size)],
                                          "n": list(range(start, start + size))}, schema=schema)
        start += size


@pytest.mark.parametrize("sizes,max_rows,want", [
    ([3, 3, 3, 3], 7, [6, 6]),
    ([3, 0, 4, 1], 7, [7, 1]),
    ([10, 2, 2], 4, [10, 4]),
    ([1] * 5, 100, [5]),
    ([], 4, []),
])
def test_coalesced_joins_small_batches_in_order(sizes, max_rows, want):
    got = list(coalesced(_batches(sizes), max_rows))
    assert [b.num_rows for b in got] == want
    assert all(c.num_chunks == 1 for b in got for c in pa.Table.from_batches([b]).columns)
    joined = pa.Table.from_batches(got, schema=got[0].schema) if got else None
    if joined is not None:
        assert joined.column("n").to_pylist() == list(range(sum(sizes)))


def test_coalesced_never_joins_two_schemas():
    wide = pa.schema([("id", pa.large_string()), ("n", pa.int64())])
    batches = [*_batches([2, 2]), *_batches([2], wide), *_batches([2])]
    got = list(coalesced(iter(batches), 100))
    assert [(b.num_rows, b.schema.field("id").type) for b in got] == [
        (4, pa.string()), (2, pa.large_string()), (2, pa.string())]


def test_scan_of_many_files_is_the_scan_of_one(many_files):
    one, many = many_files
    a, b = windows.scan(one, True), windows.scan(many, True)
    for name in TABLES:
        for field in ("group", "nbytes"):
            assert (getattr(a.tables[name], field) == getattr(b.tables[name], field)).all(), (name, field)


def _decoded(root, name) -> int:
    return dsmod.footer_totals(root, name).decoded


@pytest.fixture
def keep_nine(monkeypatch):
    """The fixture's nine files per table count as many (the real floor is for real datasets)."""
    monkeypatch.setattr(planner, "KEEP_MIN_FILES", 9)


def test_the_scan_keeps_tables_of_small_files_that_fit(many_files, monkeypatch):
    one, many = many_files
    ledger, rollouts = _decoded(many, "ledger"), _decoded(many, "rollouts")
    assert ledger > rollouts > 0  # what the cases below rely on
    room = planner.KEEP_SHARE * (ledger + rollouts)
    assert planner.scan_keeps(many, room) == ()  # 9 files: too few (KEEP_MIN_FILES)
    monkeypatch.setattr(planner, "KEEP_MIN_FILES", 9)
    assert planner.scan_keeps(many, room) == ("ledger", "rollouts")
    assert planner.scan_keeps(many, room - planner.KEEP_SHARE) == ("ledger",)  # the two no longer fit
    assert planner.scan_keeps(many, planner.KEEP_SHARE * rollouts) == ("rollouts",)  # the ledger alone is larger
    assert planner.scan_keeps(one, 1 << 40) == ()  # one file per table: the stream reads it once anyway


def _choose_with_room(monkeypatch, many) -> list:
    """choose_route as a run calls it, with a room that streams the small test data; returns the
    routes it chose (appended as chosen)."""
    total = sum(t.decoded for t in planner.input_totals(many).values())
    room = int(total * planner.MEMORY_FACTOR / planner.SHARE)  # a stream (memory needs MEMORY_FIXED more)
    assert not planner.fits_in_memory(total, room)
    assert _decoded(many, "ledger") + _decoded(many, "rollouts") <= room / planner.KEEP_SHARE
    monkeypatch.setattr(planner, "STREAM_MIN_ROOM", 0)  # the data is small; the rule is the point
    choose = bulk.job.choose_route
    chosen = []
    monkeypatch.setattr(bulk.job, "choose_route", lambda d, t, r, lp: chosen.append(choose(d, t, room, lp)) or chosen[-1])
    return chosen


def test_a_stream_reads_tables_of_small_files_once(many_files, tmp_path, monkeypatch, keep_nine):
    """A stream's scan keeps the ledger and rollouts tables (nine small files each) whole and
    the stream takes them from memory: each is read once, the tokens table twice (its ids, then
    its rows). The bytes are those of the in-memory path."""
    one, many = many_files
    bulk.run(one, tmp_path / "want", route=bulk.Route("memory", 1, "test"))
    chosen = _choose_with_room(monkeypatch, many)
    passes = collections.Counter()
    grouped = dsmod._grouped

    def counting(plan, batch_rows):
        passes[plan.name] += 1
        return grouped(plan, batch_rows)

    monkeypatch.setattr(dsmod, "_grouped", counting)
    summary = bulk.run(many, tmp_path / "got")
    assert [(r.path, r.resident) for r in chosen] == [("stream", ("ledger", "rollouts"))]
    assert "ledger and rollouts in many small files" in summary.why and chosen[0].batches > 1
    assert passes == {"ledger": 1, "rollouts": 1, "tokens": 2}
    assert output_bytes_but_input(tmp_path / "got") == output_bytes_but_input(tmp_path / "want")


def test_a_stream_without_room_for_the_kept_tables_streams_them(many_files, monkeypatch, keep_nine):
    """When no plan fits with the kept tables held, the route is planned as if none were kept
    (a fresh scan, nothing resident), before a resident tokens table or a spill is tried."""
    _, many = many_files
    chosen = _choose_with_room(monkeypatch, many)
    plan = bulk.job._stream_plan
    monkeypatch.setattr(bulk.job, "_stream_plan", lambda sc, room, resident: None if resident else plan(sc, room, resident))
    route = bulk.job.choose_route(many, 0, 0, True)
    assert [(r.path, r.resident) for r in chosen] == [("stream", ())] and route.plan.kept is None
    assert "many small files" not in route.why


def test_a_stream_that_kept_tables_resumes_with_the_same_windows(many_files, tmp_path, monkeypatch, keep_nine):
    """The tables kept are recorded as resident in the work manifest: a resumed run plans the
    same windows, decides only those not finished, and writes the same bytes. Every window's
    runs are written (the default budget would hold all of this small data's in memory)."""
    one, many = many_files
    bulk.run(one, tmp_path / "want", route=bulk.Route("memory", 1, "test"))
    chosen = _choose_with_room(monkeypatch, many)
    monkeypatch.setattr(bulk.job, "_hold_allowance", lambda room, plan, tight: 0)
    out = tmp_path / "out"
    calls = collections.Counter()

    def crash_at_2(*tables):
        calls["first"] += 1
        if calls["first"] == 2:
            raise RuntimeError("simulated crash")
        return run_tables(*tables)

    with pytest.raises(RuntimeError, match="simulated crash"):
        bulk.run(many, out, reassemble=crash_at_2)
    manifest = json.loads((out / bulk.WORK_DIR / "manifest.json").read_text())
    assert manifest["resident"] == ["ledger", "rollouts"] and manifest["path"] == "stream"
    steps = manifest["batches"]

    def counted(*tables):
        calls["again"] += 1
        return run_tables(*tables)

    summary = bulk.run(many, out, resume=True, reassemble=counted)
    assert len(chosen) == 1  # the resumed run took the recorded route
    assert summary.batches == steps and 0 < calls["again"] < steps  # the first window was kept
    assert output_bytes_but_input(out) == output_bytes_but_input(tmp_path / "want")


def test_kept_batches_are_handed_over_once_and_let_go_as_read():
    batches = [pa.record_batch({"x": [i]}) for i in range(3)]
    kept = windows.Kept({"ledger": batches})
    assert kept.names == ("ledger",) and kept.hand_over("rollouts") is None
    got = kept.hand_over("ledger")
    assert kept.hand_over("ledger") is None
    drained = stream._drain(got)
    assert next(drained).column("x").to_pylist() == [0] and len(got) == 2  # the reader holds what it read
    assert [b.column("x").to_pylist() for b in drained] == [[1], [2]] and got == []


def _cut(table: pa.Table, folder, cuts, **options):
    folder.mkdir(parents=True)
    bounds = [0, *cuts, table.num_rows]
    paths = []
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        paths.append(folder / f"part-{i:03d}.parquet")
        pq.write_table(table.slice(a, b - a), paths[-1], **options)
    return paths


@pytest.fixture
def ledger(many_files):
    return pq.read_table(many_files[0] / "ledger.parquet")


def _read_all(root, name, batch_rows):
    return pa.Table.from_batches(list(iter_table_batches(root, name, None, batch_rows)))


def _same_table(a: pa.Table, b: pa.Table) -> bool:
    """Equal schemas and values, NaN equal to the same NaN (the synth data has NaN logprobs,
    which ``Table.equals`` never finds equal)."""
    if a.schema != b.schema:
        return False
    for x, y in zip(a.columns, b.columns):
        x, y = x.combine_chunks(), y.combine_chunks()
        if pa.types.is_list(x.type) and pa.types.is_floating(x.type.value_type):
            if not (pc.list_value_length(x).equals(pc.list_value_length(y))
                    and x.is_null().equals(y.is_null())
                    and (x.flatten().to_numpy().view(np.uint32) == y.flatten().to_numpy().view(np.uint32)).all()):
                return False
        elif not x.equals(y):
            return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("batch_rows", [1, 7, 40, 10_000])
def test_groups_of_small_files_give_the_rows_of_one_file(many_files, batch_rows, monkeypatch, reads):
    one, many = many_files
    groups, alone = [], []  # groups read and checked as one table; files read one by one
    real_group, real_file = dsmod._read_small_files, dsmod._iter_file
    monkeypatch.setattr(dsmod, "_read_small_files", lambda plan, g: groups.append(
        (len(g), (t := real_group(plan, g)) is not None)) or t)
    monkeypatch.setattr(dsmod, "_iter_file", lambda plan, f, *a: alone.append(f) or real_file(plan, f, *a))
    for name in TABLES:
        want = _read_all(one, name, batch_rows)
        reads.clear()
        got = _read_all(many, name, batch_rows)
        assert set(reads.values()) == {1}  # outside a bulk run: each footer read once a read
        assert _same_table(got, want), name
        assert max(b.num_rows for b in iter_table_batches(many, name, None, batch_rows)) <= batch_rows
    if batch_rows == 10_000:
        # every table's 9 files fit one batch: three groups of 9 a pass (a file alone for the one-file
        # dataset), each read as one table; the in-memory reader alike
        assert groups == [(9, True)] * 6 and set(alone) == {one / f"{n}.parquet" for n in TABLES}
        for name in TABLES:
            assert _same_table(read_table(many, name), read_table(one, name)), name
        assert groups == [(9, True)] * 9
    if batch_rows == 1:
        assert not groups


def _plan(paths, present, name="ledger"):
    """A TablePlan of ``paths`` reading ``present[i]`` from file i (file_groups' input)."""
    columns = list(dict.fromkeys(c for p in present for c in p))
    return TablePlan(name, list(paths), columns, present, [footers.file_facts(name, p) for p in paths])


def test_file_groups_keep_to_rows_bytes_schema_and_columns(tmp_path, monkeypatch):
    table = pa.table({"rollout_id": [f"r{i}" for i in range(40)], "n": list(range(40))})
    paths = _cut(table, tmp_path / "a", [5, 10, 15, 20, 25, 30, 35])  # 8 files of 5 rows
    pq.write_table(table.slice(10, 5).cast(pa.schema([("rollout_id", pa.large_string()), ("n", pa.int64())])),
                   paths[2])  # another Arrow schema: a group of its own... and starts the next
    present = [["rollout_id", "n"]] * 8
    present[6] = ["rollout_id"]
    plan = _plan(paths, present)
    groups = small_files.file_groups(plan, batch_rows=15)
    assert groups == [[0, 1], [2], [3, 4, 5], [6], [7]]
    assert small_files.file_groups(plan, batch_rows=4) == [[i] for i in range(8)]
    whole = _plan(paths, [present[0]] * 8)
    sizes = [whole.read_decoded(i) for i in range(8)]
    monkeypatch.setattr(small_files, "GROUP_BYTES", sizes[0] + sizes[1])
    assert small_files.file_groups(whole, 100)[:2] == [[0, 1], [2]]
    monkeypatch.setattr(small_files, "SMALL_FILE_BYTES", min(sizes) - 1)
    assert small_files.file_groups(whole, 100) == [[i] for i in range(8)]


def test_empty_files_in_a_group(ledger, tmp_path):
    n = ledger.num_rows
    paths = _cut(ledger, tmp_path / "ledger", [0, 10, 10, 10, n // 2, n, n])  # empty ones between
    assert len(small_files.file_groups(_plan(paths, [ledger.column_names] * len(paths)), 10_000)) == 1
    got = _read_all(tmp_path, "ledger", 10_000)
    assert got.column("call_id").to_pylist() == ledger.column("call_id").to_pylist()
    assert read_table(tmp_path, "ledger").column("call_id").to_pylist() == ledger.column("call_id").to_pylist()


@pytest.mark.parametrize("bad_file", [0, 3, 8])
def test_an_error_in_a_group_names_its_file_and_row(ledger, tmp_path, bad_file):
    col = ledger.column("call_id").to_pylist()
    step = -(-ledger.num_rows // 9)
    col[bad_file * step + 2] = None  # row 2 of that file
    bad = ledger.set_column(ledger.column_names.index("call_id"), "call_id", pa.array(col, pa.string()))
    paths = _cut(bad, tmp_path / "ledger", [i * step for i in range(1, 9)])
    with pytest.raises(InputError) as exc:
        list(iter_table_batches(tmp_path, "ledger", None, 10_000))
    err = exc.value
    assert (err.column, err.row, err.file) == ("call_id", 2, str(paths[bad_file]))


def test_a_group_short_of_its_footers_rows_is_read_file_by_file(many_files, monkeypatch):
    _, many = many_files
    real = small_files.read_group
    monkeypatch.setattr(dsmod, "read_group", lambda *a: real(*a).slice(1))  # a row lost, no error
    want = pq.read_table(many_files[0] / "ledger.parquet")
    got = _read_all(many, "ledger", 10_000)
    assert got.num_rows == want.num_rows
    assert got.column("call_id").equals(want.column("call_id").cast(got.schema.field("call_id").type))


def test_damaged_pages_in_a_group_name_the_file(ledger, tmp_path):
    step = -(-ledger.num_rows // 5)
    paths = _cut(ledger, tmp_path / "ledger", [i * step for i in range(1, 5)], compression="zstd")
    scribble_pages(paths[3])
    with pytest.raises(InputError) as exc:
        list(iter_table_batches(tmp_path, "ledger", None, 10_000))
    assert "unreadable Parquet file" in str(exc.value) and exc.value.file == str(paths[3])


def test_the_first_bad_file_of_a_group_in_read_order_is_the_error(ledger, tmp_path):
    """A file with a null id (file 1) before a file with damaged pages (file 3): the null's
    error, as a file-by-file read gives it, though the scanner may meet the damage first."""
    col = ledger.column("call_id").to_pylist()
    step = -(-ledger.num_rows // 5)
    col[step + 4] = None
    bad = ledger.set_column(ledger.column_names.index("call_id"), "call_id", pa.array(col, pa.string()))
    paths = _cut(bad, tmp_path / "ledger", [i * step for i in range(1, 5)], compression="zstd")
    scribble_pages(paths[3])
    for read in (lambda: list(iter_table_batches(tmp_path, "ledger", None, 10_000)),
                 lambda: read_table(tmp_path, "ledger")):
        with pytest.raises(InputError) as exc:
            read()
        assert (exc.value.column, exc.value.row, exc.value.file) == ("call_id", 4, str(paths[1]))


@pytest.mark.slow
def test_coalesced_passes_batches_whose_join_overflows_32_bit_offsets():
    big = "x" * (1 << 20)
    batches = [pa.record_batch({"id": pa.array([big] * 1100)}) for _ in range(2)]  # 2 x 1.1 GiB
    got = list(coalesced(iter(batches), 10_000))
    assert [b.num_rows for b in got] == [1100, 1100]
