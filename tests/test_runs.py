"""The k-way merge of sorted runs (chainrows.bulk.runs.merge_sorted, merge_tree) against a
plain sort of all their rows: any batch sizes, empty runs, rows of one rollout in several
segments, ids whose UTF-8 byte order is not their UTF-16 order, the steps written one by one
or gathered up to ``flush_bytes``, copied out at once (``release``) or taken by the writer."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from chainrows.bulk.runs import RunWriter, merge_sorted, merge_tree

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


def _runs(tmp_path, rng: random.Random, n_runs: int, segments: bool = True) -> tuple[list, pa.Table]:
    """Sorted runs with disjoint rollout ids (each rollout 1-3 segments, all in one run; one
    row per rollout and no segment column without ``segments``, as the report has it), and
    every row sorted by (rollout_id, segment)."""
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
