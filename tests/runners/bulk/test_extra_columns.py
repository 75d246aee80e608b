"""Columns a capture carries beside the format's (the request's text, a transcript, metadata):
never read, so never counted where a run sizes itself: the input's bytes, the route and its
spill buckets, the reader's batch rows, the small-file groups."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chainrows.formats.native import dataset as dsmod
from chainrows.formats.native import footers, small_files
from chainrows.formats.native.dataset import TABLES, footer_totals, plan_table
from chainrows.options import Options
from chainrows.runners import bulk
from chainrows.runners.bulk import job as bulk_job
from chainrows.runners.bulk import plan as planner
from chainrows.synth import write_synth_dataset
from tests.support.outputs import output_bytes_but_input

ROW_GROUP = 50  # several row groups per file: the column sizes are summed over them


def _text(rng, n: int, mean: int) -> pa.Array:
    letters = np.frombuffer(b"abcdefghij klmnopqrstuvwxyz", np.uint8)
    return pa.array([rng.choice(letters, int(k)).tobytes().decode() for k in rng.integers(1, 2 * mean, n)])


def _extras(name: str, n: int, rng) -> dict[str, pa.Array]:
    """Columns of every nesting Parquet stores, named as users name them (a dot included)."""
    if name == "ledger":
        return {"request.messages": _text(rng, n, 2000),
                "meta": pa.array([{"model": "policy-v3", "latency_ms": [float(i), 2.5]} for i in range(n)])}
    if name == "tokens":
        return {"text": _text(rng, n, 6000),
                "debug": pa.array([[("k", [i, i + 1])] for i in range(n)],
                                  pa.map_(pa.string(), pa.list_(pa.int32()))),
                "rgb": pa.array([[i, i, i] for i in range(n)], pa.list_(pa.int16(), 3))}
    return {"transcript_json": _text(rng, n, 8000)}


def _rewrite(src: Path, dst: Path, extras: bool) -> Path:
    """``src``'s files written again with ROW_GROUP-row groups, and with large extra columns
    appended to every table (row for row) when ``extras``."""
    rng = np.random.default_rng(1)
    for name in TABLES:
        for f in plan_table(src, name).files:
            table = pq.read_table(f)
            if extras:
                for col, values in _extras(name, table.num_rows, rng).items():
                    table = table.append_column(col, values)
            out = dst / f.relative_to(src)
            out.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table, out, row_group_size=ROW_GROUP)
    return dst


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    path = tmp_path_factory.mktemp("synth") / "data"
    write_synth_dataset(path, 120, seed=5, corrupt_rate=0.2)
    return path


@pytest.fixture(scope="module")
def narrow(synth, tmp_path_factory):
    return _rewrite(synth, tmp_path_factory.mktemp("narrow") / "data", extras=False)


@pytest.fixture(scope="module")
def wide(synth, tmp_path_factory):
    return _rewrite(synth, tmp_path_factory.mktemp("wide") / "data", extras=True)


def test_each_columns_bytes_are_what_it_takes_written_alone(tmp_path):
    """The footer's leaf columns are mapped to the right top-level fields, nested types and a
    dotted name included: each field's bytes equal those of a file holding that field alone
    (a column chunk's uncompressed size depends on its own values only)."""
    rng = np.random.default_rng(0)
    n = 3 * ROW_GROUP + 7
    opaque = pa.opaque(pa.struct([("k", pa.string()), ("v", pa.list_(pa.int64()))]), "trace", "harness")
    trace = pa.ExtensionArray.from_storage(opaque, pa.array([{"k": f"t{i}", "v": [i] * (i % 4)} for i in range(n)],
                                                            opaque.storage_type))
    table = pa.table({"rollout_id": [f"r{i}" for i in range(n)], **_extras("ledger", n, rng),
                      **_extras("tokens", n, rng), "trace": trace, "n": list(range(n))})
    pq.write_table(table, tmp_path / "all.parquet", row_group_size=ROW_GROUP)
    facts = footers.file_facts("ledger", tmp_path / "all.parquet")
    assert facts.column_stored is not None and list(facts.column_stored) == table.column_names
    for col in table.column_names:
        pq.write_table(table.select([col]), tmp_path / "one.parquet", row_group_size=ROW_GROUP)
        alone = footers.file_facts("ledger", tmp_path / "one.parquet")
        assert facts.column_stored[col] == alone.stored_bytes, col
    assert sum(facts.column_stored.values()) == facts.stored_bytes
    assert facts.stored_of(["n", "rollout_id", "absent"]) == facts.column_stored["n"] + facts.column_stored["rollout_id"]


def test_a_footer_whose_columns_cannot_be_matched_counts_the_whole_file(tmp_path, monkeypatch):
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), tmp_path / "f.parquet")
    monkeypatch.setattr(footers, "_leaves", lambda t: 2)  # 4 leaves claimed, 2 in the footer
    facts = footers.file_facts("ledger", tmp_path / "f.parquet")
    assert facts.column_stored is None and facts.column_decoded is None
    assert facts.stored_of(["a"]) == facts.stored_bytes > 0
    assert facts.decoded_of(["a"]) == facts.decoded_bytes > 0


def test_the_input_size_counts_only_the_columns_read(narrow, wide):
    for name in TABLES:
        assert footer_totals(wide, name) == footer_totals(narrow, name), name
        facts = plan_table(wide, name).facts
        totals = footer_totals(wide, name)
        # the extras are most of each file, stored and decoded
        assert sum(f.stored_bytes for f in facts) > 2 * totals.stored, name
        assert sum(f.decoded_bytes for f in facts) > 2 * totals.decoded, name
    assert planner.input_totals(wide) == planner.input_totals(narrow)


def test_the_reader_sizes_its_batches_by_the_columns_read(narrow, wide):
    for name in TABLES:
        a, b = plan_table(narrow, name), plan_table(wide, name)
        assert [dsmod._read_batch_rows(b, i) for i in range(len(b.files))] == \
               [dsmod._read_batch_rows(a, i) for i in range(len(a.files))], name
    assert bulk_job._batch_rows(wide, 1 << 20) == bulk_job._batch_rows(narrow, 1 << 20) < 1 << 20  # partitioning


def test_small_files_are_grouped_by_the_bytes_of_the_columns_read(narrow, tmp_path, monkeypatch):
    ledger = pq.read_table(plan_table(narrow, "ledger").files[0])
    rng = np.random.default_rng(2)
    for d, extras in (("narrow", False), ("wide", True)):
        for k in range(6):
            part = ledger.slice(k * 20, 20)
            if extras:
                for col, values in _extras("ledger", part.num_rows, rng).items():
                    part = part.append_column(col, values)
            (tmp_path / d / "ledger").mkdir(parents=True, exist_ok=True)
            pq.write_table(part, tmp_path / d / "ledger" / f"part-{k}.parquet")
    narrow_plan, wide_plan = plan_table(tmp_path / "narrow", "ledger"), plan_table(tmp_path / "wide", "ledger")
    read = max(wide_plan.read_decoded(i) for i in range(6))
    assert read == max(narrow_plan.read_decoded(i) for i in range(6))
    assert min(f.stored_bytes for f in wide_plan.facts) > 4 * read
    monkeypatch.setattr(small_files, "SMALL_FILE_BYTES", 2 * read)  # far below each whole file
    assert small_files.file_groups(wide_plan, 10_000) == [list(range(6))]


def test_spill_buckets_follow_the_columns_read_and_the_bytes_stay_the_same(narrow, wide, tmp_path, monkeypatch):
    """The spill path's bucket count comes from the input size: sized by whole files, the
    extras here would have multiplied it."""
    sizes = planner.input_totals(narrow).values()
    total = sum(t.decoded for t in sizes)  # what the bucket count is sized by
    room = planner.measure_footprint(Options(), True).room(planner.DEFAULT_BUDGET)
    monkeypatch.setattr(planner, "MEMORY_FIXED", 1 << 60)  # never in memory
    monkeypatch.setattr(planner, "STREAM_MIN_ROOM", 1 << 60)  # a tight budget: spill
    monkeypatch.setattr(planner, "SPILL_PEAK_FACTOR", planner.BUCKET_SHARE * room * 2.5 / total)  # 3 buckets
    a = bulk.run(narrow, tmp_path / "a")
    b = bulk.run(wide, tmp_path / "b")
    assert a.path == b.path == "spill"
    assert a.batches == b.batches == 3
    assert a.input_bytes == b.input_bytes == sum(t.stored for t in sizes)
    assert output_bytes_but_input(tmp_path / "b") == output_bytes_but_input(tmp_path / "a")


def test_a_ray_run_counts_the_columns_read_as_the_single_process_run_does(narrow, wide):
    pytest.importorskip("ray")
    from chainrows.runners.ray.source import check_tables, locate, read_plan

    sizes = planner.input_totals(narrow).values()
    want = tuple(sum(t[k] for t in sizes) for k in range(3))  # rows, stored, decoded
    for path in (narrow, wide):
        loc = locate(str(path))
        assert tuple(read_plan(loc, check_tables(loc), 1 << 30)[0]) == want
