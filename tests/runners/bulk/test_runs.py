"""The k-way merge of sorted runs (chainrows.runners.bulk.runs.merge_sorted, merge_tree) against a
plain sort of all their rows: any batch sizes, empty runs, rows of one rollout in several
segments, ids whose UTF-8 byte order is not their UTF-16 order, the steps written one by one
or gathered up to ``flush_bytes``, copied out at once (``release``) or taken by the writer; runs
held in memory by a ``RunStore`` beside runs written to disk."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from chainrows.runners.bulk.runs import (
    RunStore,
    RunWriter,
    merge_sorted,
    merge_tree,
    run_batches,
    run_path,
    runs_record,
    write_run,
)

ALPHABET = ["a", "b", "z", "é", "\u00ff", "\u4e00", "\U0001f600", "\uffff"]  # multi-byte UTF-8 too


class Collect:
    """A writer that keeps what it is given, as the Parquet writers' interface has it."""

    def __init__(self):
        self.tables: list[pa.Table] = []

    def write(self, table: pa.Table) -> None:
        self.tables.append(table)

    def write_taken(self, source: pa.Table, order) -> None:
        self.tables.append(source.take(pa.array(order)))

    def rows(self) -> pa.Table:
        return pa.concat_tables(self.tables).combine_chunks()


def _runs(tmp_path, rng: random.Random, n_runs: int, segments: bool = True,
          store: RunStore | None = None) -> tuple[list, pa.Table]:
    """Sorted runs with disjoint rollout ids (each rollout 1-3 segments, all in one run; one
    row per rollout and no segment column without ``segments``, as the report has it), and
    every row sorted by (rollout_id, segment). Written to disk, or kept by ``store`` (as the
    rows of ``run-<k>``)."""
    ids = sorted({"".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 4))) for _ in range(60)})
    owner = {rid: rng.randrange(n_runs) for rid in ids}
    files, every = [], []
    for k in range(n_runs):
        rows = [(rid, seg) for rid in ids if owner[rid] == k for seg in range(rng.randint(1, 3) if segments else 1)]
        rows.sort(key=lambda r: (r[0].encode("utf-8"), r[1]))
        table = pa.table({"rollout_id": pa.array([r[0] for r in rows], pa.string()),
                          "segment": pa.array([r[1] for r in rows], pa.int32()),
                          "input_ids": pa.array([[len(r[0]), r[1]] * (r[1] + 1) for r in rows],
                                                pa.list_(pa.int32()))})
        if not segments:
            table = table.drop_columns(["segment"])
        path = tmp_path / f"run-{k}.arrow"
        if store is not None:
            path = run_path(tmp_path / f"run-{k}", "rows")
            store.keep(tmp_path / f"run-{k}", {"rows": (table, rng.randint(1, 5))})
        else:
            with RunWriter(path, table.schema, rng.randint(1, 5)) as w:
                w.write(table)
        files.append(path)
        every.append(table)
    whole = pa.concat_tables(every)
    keys = [("rollout_id", "ascending")] + ([("segment", "ascending")] if segments else [])
    order = pc.sort_indices(whole, sort_keys=keys)
    return files, whole.take(order).combine_chunks()


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("release", [False, True])
def test_merge_sorted_is_a_sort_of_all_rows(tmp_path, seed, release):
    rng = random.Random(seed)
    files, expected = _runs(tmp_path, rng, rng.randint(1, 6), segments=seed % 3 != 0)
    for flush_bytes in (0, rng.randint(1, 400), 1 << 40):
        writer = Collect()
        merge_sorted(files, writer, release, flush_bytes)
        assert writer.rows().equals(expected), (seed, release, flush_bytes)
        if flush_bytes == 1 << 40:
            assert len(writer.tables) == 1  # every step's rows gathered into one write
        elif flush_bytes == 0:  # a write per step; each step empties the buffer that ends first
            batches = sum(pa.ipc.open_file(pa.OSFile(str(f))).num_record_batches for f in files)
            assert len(writer.tables) == batches


def test_merge_tree_in_levels_is_the_same_sort(tmp_path):
    rng = random.Random(7)
    files, expected = _runs(tmp_path, rng, 7)
    writer = Collect()
    merge_tree(files, writer, batch_rows=2, fan_in=2, scratch=tmp_path / "levels", flush_bytes=64)
    assert writer.rows().equals(expected)


def test_a_run_out_of_order_is_an_error_not_a_hang(tmp_path):
    """Runs are this project's own sorted files; a batch of one that ends before it starts (a
    bug) stops the merge with an error naming the run (without the check a step would take
    nothing, and the merge would never end)."""
    table = pa.table({"rollout_id": pa.array(["b", "a"], pa.string())})
    path = tmp_path / "run-0.arrow"
    with RunWriter(path, table.schema, 2) as w:
        w.write(table)
    with pytest.raises(RuntimeError, match=f"the run {path} is not sorted"):
        merge_sorted([path], Collect())


def _batch_count(table: pa.Table, batch_rows: int) -> int:
    return -(-table.num_rows // batch_rows)


@pytest.mark.parametrize("seed", range(6))
def test_a_store_holds_runs_while_they_fit_and_the_merge_reads_both_kinds(tmp_path, seed):
    """Runs kept while the store's allowance lasts are held (no file), the others written
    (their record as ``runs_record`` gives it); a merge over both is the plain sort, in as many
    steps as if every run were a file cut the same way."""
    rng = random.Random(seed)
    ids = [f"r{i:03d}" for i in range(40)]
    rng.shuffle(ids)
    cuts = sorted(rng.sample(range(41), 4))
    disjoint = []
    for a, b in zip([0, *cuts], [*cuts, 40]):  # five runs of disjoint ids, some empty maybe
        part = sorted(ids[a:b])
        disjoint.append(pa.table({"rollout_id": pa.array(part, pa.string()),
                                  "input_ids": pa.array([[len(r)] * rng.randint(0, 3) for r in part],
                                                        pa.list_(pa.int32()))}))
    sizes = [t.get_total_buffer_size() for t in disjoint]
    allowance = sum(sizes[:2]) + rng.randint(0, 1)
    store = RunStore(allowance)
    files, records, batch_rows = [], [], []
    for k, table in enumerate(disjoint):
        stem = tmp_path / f"run-{k}"
        batch_rows.append(rng.randint(1, 4))
        records.append(store.keep(stem, {"rows": (table, batch_rows[-1])}))
        files.append(run_path(stem, "rows"))
    held = [r.get("held", False) for r in records]
    fits, used = [], 0
    for size in sizes:  # first fit, in the order kept
        fits.append(used + size <= allowance)
        used += size if fits[-1] else 0
    assert held == fits and store.held_bytes == used
    for k, f in enumerate(files):
        assert f.exists() != held[k]
        if not held[k]:
            assert records[k] == runs_record(tmp_path / f"run-{k}", ["rows"])
    whole = pa.concat_tables(disjoint)
    expected = whole.take(pc.sort_indices(whole, sort_keys=[("rollout_id", "ascending")])).combine_chunks()
    writer = Collect()
    merge_sorted(files, writer, store=store)
    assert writer.rows().equals(expected)
    assert len(writer.tables) == sum(_batch_count(t, b) for t, b in zip(disjoint, batch_rows))
    assert store.held_bytes == used and not store._held  # every held run handed over, once


def test_merge_tree_in_levels_over_held_runs_is_the_same_sort(tmp_path):
    """More runs than the fan-in: the first level merges held runs into written ones."""
    rng = random.Random(11)
    store = RunStore(1 << 40)
    files, expected = _runs(tmp_path, rng, 7, store=store)
    assert not any(f.exists() for f in files)
    writer = Collect()
    merge_tree(files, writer, batch_rows=2, fan_in=2, scratch=tmp_path / "levels", flush_bytes=64, store=store)
    assert writer.rows().equals(expected)


@pytest.mark.parametrize("seed", range(8))
def test_a_held_run_is_cut_into_the_batches_its_file_has(tmp_path, seed):
    """Multi-chunk tables (the engine's rows are) cut at their chunk boundaries: a held run's
    batches are those ``write_run`` writes, row for row."""
    rng = random.Random(seed)
    chunks = [rng.randint(0, 9) for _ in range(rng.randint(1, 5))]
    ids = iter(f"r{i:03d}" for i in range(sum(chunks)))
    table = pa.Table.from_batches([pa.record_batch({"rollout_id": pa.array([next(ids) for _ in range(n)], pa.string())})
                                   for n in chunks])
    batch_rows = rng.randint(1, 6)
    write_run(table, tmp_path / "w.rows.arrow", batch_rows)
    store = RunStore(1 << 30)
    store.keep(tmp_path / "h", {"rows": (table, batch_rows)})
    held = [b.num_rows for b in store.batches(tmp_path / "h.rows.arrow")]
    written = [b.num_rows for b in run_batches(tmp_path / "w.rows.arrow")]
    assert held == written, (chunks, batch_rows)


def test_a_store_with_no_allowance_holds_nothing_and_a_held_run_replaces_a_file(tmp_path):
    empty = pa.table({"rollout_id": pa.array([], pa.string())})
    assert "held" not in RunStore(0).keep(tmp_path / "a", {"rows": (empty, 1)})
    assert (tmp_path / "a.rows.arrow").exists()
    assert RunStore(1 << 20).keep(tmp_path / "a", {"rows": (empty, 1)}) == {"held": True}
    assert not (tmp_path / "a.rows.arrow").exists()
