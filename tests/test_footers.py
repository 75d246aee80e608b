"""Footers read once per bulk run (chainrows.io.footers), and small files' batches joined for
the id scan (chainrows.io.arrays.coalesced)."""

from __future__ import annotations

import collections
import os
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chainrows import bulk
from chainrows.bulk import windows
from chainrows.io import footers
from chainrows.io.arrays import coalesced
from chainrows.io.dataset import TABLES, plan_table
from chainrows.io.errors import InputError
from chainrows.synth import write_synth_dataset

from outputs import output_bytes


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
    assert output_bytes(tmp_path / "got") == output_bytes(tmp_path / "want")
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
