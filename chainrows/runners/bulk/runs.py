"""Sorted runs and their k-way merge: how windows and spill buckets become one sorted output.

Every reassembled batch (a streaming window, a spill bucket) is sorted by rollout_id; its rows
are kept as a *run*, and the runs are merged by rollout_id into the final writers, so the output
is the bytes an in-memory run writes. A run is an Arrow IPC file, or, for a stream whose runs fit
its memory budget, the table itself held until the merge (``RunStore``). IPC, not Parquet: a run
needs no second check and an IPC reader holds just its batches (docs/limits.md has the
measurements).
"""

from __future__ import annotations

import bisect
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from chainrows.errors import writing
from chainrows.lowering.take import take_rows
from chainrows.memory.process import release_memory
from chainrows.outdir.digest import file_digest
from chainrows.runners.bulk.partition import SPILL_IPC as IPC_OPTIONS
from chainrows.runners.bulk.partition import open_mapped

RUN_SUFFIX = ".arrow"
RUN_TABLES = ("rows", "report")


class RunWriter:
    """Writes a sorted run (Arrow IPC file) in batches of ``batch_rows`` rows, whatever the
    sizes of the tables appended. A context manager; ``close`` is idempotent. ``commit=True``
    writes to ``<path>.tmp`` and renames it to ``path`` on a clean close only. A failed write
    is a WriteError naming the file."""

    def __init__(self, path: Path, schema: pa.Schema, batch_rows: int, *, commit: bool = False,
                 ipc: pa.ipc.IpcWriteOptions = IPC_OPTIONS):
        self.path = Path(path)
        self._target = self.path.with_name(self.path.name + ".tmp") if commit else self.path
        with writing(self._target):
            self._sink = pa.OSFile(str(self._target), "wb")
            self._w = pa.ipc.new_file(self._sink, schema, options=ipc)
        self.batch_rows = batch_rows
        self._pending: list[pa.Table] = []
        self._rows = 0
        self._closed = False

    def write(self, table: pa.Table) -> None:
        """Append rows; batches are cut every ``batch_rows`` rows."""
        self._pending.append(table)
        self._rows += table.num_rows
        if self._rows >= self.batch_rows:
            with writing(self._target):
                self._emit(final=False)

    def write_taken(self, source: pa.Table, order) -> None:
        """Append ``source``'s rows in the order ``order`` (the Parquet writers' interface)."""
        self.write(take_rows(source, order))

    def _emit(self, final: bool) -> None:
        if not self._pending:
            return
        table = pa.concat_tables(self._pending)
        full = table.num_rows if final else _whole_batches(table, self.batch_rows)
        for batch in table.slice(0, full).to_batches(max_chunksize=self.batch_rows):
            self._w.write_batch(batch)
        rest = table.slice(full)
        self._pending, self._rows = ([rest], rest.num_rows) if rest.num_rows else ([], 0)

    def close(self, *, failed: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if not failed:
            try:
                with writing(self._target):
                    try:
                        self._emit(final=True)
                        self._w.close()
                    finally:
                        self._sink.close()
            except BaseException:
                self._target.unlink(missing_ok=True)
                raise
            if self._target != self.path:
                os.replace(self._target, self.path)
            return
        try:  # the file is discarded: its footer failing to write too (a full disk) hides nothing
            self._w.close()
        except OSError:
            pass
        finally:
            self._sink.close()
        self._target.unlink(missing_ok=True)

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)


def _whole_batches(table: pa.Table, batch_rows: int) -> int:
    """The rows of ``table`` that fill whole batches of ``batch_rows``."""
    return table.num_rows - table.num_rows % batch_rows


def run_cut(table: pa.Table, batch_rows: int) -> list[pa.RecordBatch]:
    """The record batches ``write_run`` writes ``table`` as: its rows that fill whole batches
    of ``batch_rows``, then the rest, each part cut at most ``batch_rows`` rows a batch and at
    the table's chunk boundaries."""
    full = _whole_batches(table, batch_rows)
    return table.slice(0, full).to_batches(max_chunksize=batch_rows) + \
        table.slice(full).to_batches(max_chunksize=batch_rows)


def write_run(table: pa.Table, path: Path, batch_rows: int, ipc: pa.ipc.IpcWriteOptions = IPC_OPTIONS) -> None:
    """``table`` (sorted) as the run ``path``, atomically."""
    with RunWriter(path, table.schema, batch_rows, commit=True, ipc=ipc) as w:
        w.write(table)


class RunStore:
    """Where a batch's sorted runs are kept: held in memory while their buffers fit
    ``allowance`` bytes in all, else written as IPC files (``write_run``, with ``ipc``), which
    ``--resume`` can reuse. A held run costs no write to the page cache and no read back
    (docs/decisions-io.md "Runs held in memory"); ``held_bytes`` counts every run held so far
    (the merge freeing them does not lower it). The merge reads every run through
    :meth:`batches` and :meth:`schema`, once: a held run is let go as it is handed over. One
    thread keeps runs; the merge reads them after. ``RunStore()`` holds nothing."""

    def __init__(self, allowance: int = 0, ipc: pa.ipc.IpcWriteOptions = IPC_OPTIONS):
        self.allowance = allowance
        self.ipc = ipc
        self.held_bytes = 0
        self._held: dict[Path, tuple[pa.Table, int]] = {}

    def keep(self, stem: Path, runs: dict[str, tuple[pa.Table, int]]) -> dict:
        """Keep the runs of one batch (table name -> (table sorted by rollout_id, rows per run
        batch)) under ``stem``: ``{"held": True}`` when held (a file an earlier run left under
        that name is removed), else the written runs' record (``runs_record``). A run counts
        every buffer it references whole (``get_total_buffer_size``): what holding it keeps
        alive."""
        size = sum(table.get_total_buffer_size() for table, _ in runs.values())
        if self.allowance > 0 and self.held_bytes + size <= self.allowance:
            self.held_bytes += size
            for name, kept in runs.items():
                path = run_path(stem, name)
                path.unlink(missing_ok=True)
                self._held[path] = kept
            return {"held": True}
        for name, (table, batch_rows) in runs.items():
            write_run(table, run_path(stem, name), batch_rows, self.ipc)
        return runs_record(stem, runs)

    def batches(self, path: Path):
        """The run's record batches in order: a held run's as ``write_run`` would have cut them
        (``run_cut``), else ``run_batches``."""
        kept = self._held.pop(Path(path), None)
        if kept is None:
            return run_batches(path)
        return iter(run_cut(*kept))

    def schema(self, path: Path) -> pa.Schema:
        """The run's schema (a held run stays held)."""
        kept = self._held.get(Path(path))
        return kept[0].schema if kept is not None else run_schema(path)


ON_DISK = RunStore()


def run_path(stem: Path, table: str) -> Path:
    """The run of ``table`` (rows, report) a batch kept under ``stem``."""
    return stem.with_name(f"{stem.name}.{table}{RUN_SUFFIX}")


def kept_record(marker: Path) -> dict | None:
    """The record a finished window or bucket left at ``marker``, or None when the marker or
    either of its runs is missing, unreadable, or not the size and digest it recorded. Runs
    are not fsynced (a finished run is rarely worth a forced disk write): a resumed job redoes
    what a crash of the machine cut short or damaged instead of trusting it."""
    try:
        record = json.loads(marker.read_text())
        stem = Path(record["stem"])
        if all(run_intact(run_path(stem, t), int(record["sizes"][t]), record["digests"][t]) for t in RUN_TABLES):
            return record
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def runs_record(stem: Path, tables=RUN_TABLES) -> dict:
    """What :func:`kept_record` checks the runs kept under ``stem`` against: each run's size and
    content digest."""
    paths = {t: run_path(stem, t) for t in tables}
    return {"sizes": {t: p.stat().st_size for t, p in paths.items()},
            "digests": {t: file_digest(p) for t, p in paths.items()}}


def run_intact(path: Path, size: int, digest: str) -> bool:
    """The run at ``path`` is the one written: ``size`` bytes and the recorded digest (a run cut
    short, emptied or with a page zeroed by a crash fails one or the other)."""
    try:
        return path.stat().st_size == size and file_digest(path) == digest
    except OSError:
        return False


def run_batches(path: Path):
    """The record batches of a run, one at a time, as written. Each batch is read through its
    own memory map of the file: an uncompressed batch is then the page cache's pages, not a
    copy in new memory, and its pages leave the process when the batch is freed (a map
    opened once would keep every page read so far resident until the run is done)."""
    pool = pa.default_memory_pool()
    i = 0
    while True:
        with open_mapped(path) as src:  # the batch's buffers keep a mapping alive
            reader = pa.ipc.open_file(src, memory_pool=pool)
            if i >= reader.num_record_batches:
                return
            batch = reader.get_batch(i)
        yield batch
        i += 1


def run_schema(path: Path) -> pa.Schema:
    with pa.OSFile(str(path)) as src:
        return pa.ipc.open_file(src).schema


def merge_tree(files: list[Path], writer, batch_rows: int, fan_in: int, scratch: Path,
               release: bool = False, flush_bytes: int = 0, store: RunStore = ON_DISK) -> None:
    """Merge sorted runs into ``writer``, at most ``fan_in`` open at once (extra levels through
    intermediate runs of ``batch_rows``-row batches, written with ``store``'s IPC options, when
    there are more); ``release``, ``flush_bytes`` and ``store`` (where the runs named ``files``
    are) as :func:`merge_sorted` has them."""
    level = 0
    while len(files) > fan_in:
        scratch.mkdir(parents=True, exist_ok=True)
        merged = []
        for i in range(0, len(files), fan_in):
            group = files[i:i + fan_in]
            path = scratch / f"run-{level}-{i // fan_in:05d}{RUN_SUFFIX}"
            with RunWriter(path, store.schema(group[0]), batch_rows, ipc=store.ipc) as w:
                merge_sorted(group, w, release, flush_bytes, store)
            if level:  # intermediate runs only: the first level's inputs stay for --resume
                for f in group:
                    Path(f).unlink(missing_ok=True)
            merged.append(path)
        files, level = merged, level + 1
    merge_sorted(files, writer, release, flush_bytes, store)


def merge_sorted(files: list[Path], writer, release: bool = False, flush_bytes: int = 0,
                 store: RunStore = ON_DISK) -> None:
    """k-way merge of runs sorted by rollout_id (ids disjoint across runs), a step at a time:
    each step takes the rows of every open run up to the smallest last id buffered. The steps'
    rows go to the writer sorted, together once they hold ``flush_bytes`` (0: after every step),
    so that the per-call work of a write is not paid per step: under a tight budget run batches
    are a row or two, and so is a step. The writer gathers them with its row groups
    (``write_taken``), except with ``release`` (tight budgets): then the rows are copied out at
    once, so that their run batches are not held by a pending row group, and freed memory is
    handed back to the OS. Each buffer's first and last id are read once, when it changes: a
    step compares Python strings (code point order is UTF-8 byte order), and searches only the
    buffers that hold ids past the bound. ``store``: where the runs are (held or on disk)."""
    iters = [store.batches(f) for f in files]
    bufs: list[pa.Table | None] = [None] * len(iters)
    first: list[str] = [""] * len(iters)
    last: list[str] = [""] * len(iters)

    def refill(i):
        while bufs[i] is None or bufs[i].num_rows == 0:
            nxt = next(iters[i], None)
            if nxt is None:
                bufs[i] = None
                return
            bufs[i] = pa.Table.from_batches([nxt])
        ids = bufs[i]["rollout_id"]
        first[i], last[i] = ids[0].as_py(), ids[-1].as_py()

    pending: list[pa.Table] = []
    pending_bytes = 0

    def flush():
        nonlocal pending, pending_bytes
        if not pending:
            return
        merged = pa.concat_tables(pending)
        pending, pending_bytes = [], 0
        keys = [("rollout_id", "ascending")] + ([("segment", "ascending")] if "segment" in merged.column_names else [])
        order = pc.sort_indices(merged.select([k for k, _ in keys]), sort_keys=keys).to_numpy()
        if release:  # a tight budget: these rows' run batches are freed now, not with the group
            writer.write(take_rows(merged, order))
            del merged
            release_memory()
        else:
            writer.write_taken(merged, order)

    for i in range(len(iters)):
        refill(i)
    live = [i for i, b in enumerate(bufs) if b is not None]
    while live:
        ends_first = min(live, key=lambda i: last[i])
        bound = last[ends_first]
        if first[ends_first] > bound:  # a batch that ends before it starts: the step would take nothing
            raise RuntimeError(f"merge: the run {files[ends_first]} is not sorted by rollout_id")
        for i in live:  # the buffer that ends first is emptied: every step moves on
            if first[i] > bound:
                continue
            n = bufs[i].num_rows if last[i] <= bound else rows_up_to(bufs[i]["rollout_id"], bound)
            pending.append(bufs[i].slice(0, n))
            pending_bytes += pending[-1].nbytes
            bufs[i] = bufs[i].slice(n)
            if bufs[i].num_rows:
                first[i] = bufs[i]["rollout_id"][0].as_py()
            else:
                refill(i)
        live = [i for i in live if bufs[i] is not None]
        if pending_bytes >= flush_bytes:
            flush()
    flush()


def rows_up_to(ids: pa.ChunkedArray, bound: str) -> int:
    """How many leading ``ids`` (sorted by UTF-8 bytes) are at most ``bound``: a binary search,
    each step one id read as Python (code point order is UTF-8 byte order), instead of comparing
    every buffered id at every merge step."""
    return bisect.bisect_right(range(len(ids)), bound, key=lambda i: ids[i].as_py())
