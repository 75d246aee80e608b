"""Parquet writers whose row groups (and part files) depend only on the rows written, not on
how they arrive.

Byte-identical output whatever the batch size or memory budget needs row-group boundaries that
are a function of content: a group closes after the row where it reaches ``max_rows`` rows or
``max_units`` units (tokens for ``rows``, 1 per row otherwise). ``RowGroupWriter`` writes the
groups to one file; ``PartsWriter`` writes them to a directory of part files of
``groups_per_part`` groups each, encoding several parts at once on their own threads (a
pyarrow ``ParquetWriter`` encodes on one core; docs/decisions-io.md "Parts").
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from chainrows.errors import writing
from chainrows.lowering.take import take_rows
from chainrows.outdir.atomic import fsync_file
from chainrows.outdir.parquet import WRITE_OPTIONS

ROWS_GROUP_TOKENS = 1 << 20
GROUP_ROWS = 65536
GROUPS_PER_PART = 16
ENCODERS = 2


def _units(table: pa.Table, unit_column: str | None) -> np.ndarray:
    if unit_column is None or table.num_rows == 0:
        return np.ones(table.num_rows, dtype=np.int64)
    lengths = pc.list_value_length(table[unit_column]).to_numpy(zero_copy_only=False)
    return lengths.astype(np.int64) + 1


class _GroupCutter:
    """Append tables in order; ``_emit(group)`` gets each row group, one chunk per column, as
    soon as its content-determined last row has arrived."""

    def __init__(self, schema: pa.Schema, unit_column: str | None, max_units: int, max_rows: int):
        self.schema = schema
        self.unit_column = unit_column
        self.max_units = max_units
        self.max_rows = max_rows
        self._pending: list[pa.Table] = []
        self._rows = 0
        self._units = 0
        self.rows_written = 0
        self.groups_written = 0

    def write(self, table: pa.Table) -> None:
        """Append rows (columns matched to the schema by name)."""
        self._check_open()
        table = table.select(self.schema.names)
        self._append(table, None, _units(table, self.unit_column))

    def write_taken(self, source: pa.Table, order: np.ndarray) -> None:
        """Append ``source``'s rows in the order ``order`` (``write(take_rows(source, order))``,
        same groups and bytes). The token-sized list columns are copied once, per row group as it
        is cut, instead of once here and again to make a group that spans two calls one chunk per
        column; the other columns are taken by pyarrow (which may concatenate a source's chunks
        of them for each group). ``source`` stays referenced until its last group is cut."""
        self._check_open()
        source = source.select(self.schema.names)
        order = np.asarray(order, dtype=np.int64)
        self._append(source, order, _units(source, self.unit_column)[order])

    def _append(self, table: pa.Table, order: np.ndarray | None, units: np.ndarray) -> None:
        start = 0
        n = len(units)
        while start < n:
            # rows this group can still take: stop after the row that reaches a limit
            room_rows = self.max_rows - self._rows
            cum = np.cumsum(units[start:start + room_rows]) + self._units
            hit = np.flatnonzero(cum >= self.max_units)
            take = int(hit[0]) + 1 if len(hit) else min(room_rows, n - start)
            self._pending.append(table.slice(start, take) if order is None else (table, order[start:start + take]))
            self._rows += take
            self._units = int(cum[take - 1])
            start += take
            if self._rows >= self.max_rows or self._units >= self.max_units:
                self._flush()

    def _pending_group(self) -> pa.Table:
        """The pending rows as one table: appended slices as they are, taken rows gathered by
        one ``take_rows`` over all the sources."""
        if all(isinstance(p, pa.Table) for p in self._pending):
            return pa.concat_tables(self._pending)
        sources, idx, at = [], [], 0
        for p in self._pending:
            table, order = (p, np.arange(p.num_rows, dtype=np.int64)) if isinstance(p, pa.Table) else p
            if not sources or table is not sources[-1][0]:
                sources.append((table, at))
                at += table.num_rows
            idx.append(order + sources[-1][1])
        return take_rows(pa.concat_tables([t for t, _ in sources]), np.concatenate(idx))

    def _flush(self) -> None:
        if not self._pending:
            return
        group = self._pending_group()
        if group.schema != self.schema:
            group = group.cast(self.schema)
        group = group.combine_chunks()  # one chunk per column: page layout independent of arrival
        self._pending, self._rows, self._units = [], 0, 0
        self._emit(group)
        self.rows_written += group.num_rows
        self.groups_written += 1

    def _emit(self, group: pa.Table) -> None:
        raise NotImplementedError

    def _check_open(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self


class RowGroupWriter(_GroupCutter):
    """One Parquet file; row groups cut at content-determined rows. A context manager; ``close``
    is idempotent; leaving the block on an exception releases the file without a footer. A
    failed write is a WriteError naming the file."""

    def __init__(self, path: str | os.PathLike, schema: pa.Schema, *, unit_column: str | None = None,
                 max_units: int = ROWS_GROUP_TOKENS, max_rows: int = GROUP_ROWS):
        super().__init__(schema, unit_column, max_units, max_rows)
        self.path = path
        with writing(path):
            self._writer = pq.ParquetWriter(path, schema, **WRITE_OPTIONS)

    def _check_open(self) -> None:
        if self._writer is None:
            raise RuntimeError("RowGroupWriter is closed")

    def _emit(self, group: pa.Table) -> None:
        with writing(self.path):
            self._writer.write_table(group, row_group_size=max(group.num_rows, 1))

    def close(self) -> None:
        """Write what is pending and the footer (idempotent)."""
        if self._writer is None:
            return
        try:
            self._flush()
        finally:
            writer, self._writer = self._writer, None
            with writing(self.path):
                writer.close()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        elif self._writer is not None:  # the staged file is discarded: just release it
            writer, self._writer = self._writer, None
            try:
                writer.close()
            except OSError:  # its footer failed to write too (a full disk): the first error stands
                pass


_END = object()


class PartsWriter(_GroupCutter):
    """A directory of Parquet part files: row groups cut as ``RowGroupWriter`` cuts them, part
    ``p`` holding groups ``[p * groups_per_part, (p + 1) * groups_per_part)``, so the files and
    their bytes depend only on the rows written. ``next_path()`` names each new part, in order
    (e.g. ``AtomicOutput.reserve_part``).

    Up to ``encoders`` parts are encoded at once, each on its own thread; ``write`` blocks while
    more than ``max_pending_bytes`` of cut groups wait for an encoder (it always lets one
    through). An encoder's error is raised by the next ``write`` or ``close`` (a failed write: a
    WriteError naming the part). ``sync_parts``:
    each finished part is fsynced on its encoder thread, while later parts are still being
    written, so a durable commit afterwards finds little left to flush. A context
    manager; ``close`` is idempotent; leaving the block on an exception stops the encoders and
    leaves the part files incomplete (the caller discards them, as AtomicOutput does).
    """

    def __init__(self, next_path: Callable[[], os.PathLike], schema: pa.Schema, *,
                 unit_column: str | None = None, max_units: int = ROWS_GROUP_TOKENS,
                 max_rows: int = GROUP_ROWS, groups_per_part: int = GROUPS_PER_PART,
                 encoders: int = ENCODERS, max_pending_bytes: int = 256 << 20, sync_parts: bool = False):
        super().__init__(schema, unit_column, max_units, max_rows)
        self.sync_parts = sync_parts
        if groups_per_part < 1 or encoders < 1:
            raise ValueError("groups_per_part and encoders must be at least 1")
        self.next_path = next_path
        self.groups_per_part = groups_per_part
        self.max_pending_bytes = max_pending_bytes
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(encoders, thread_name_prefix="chainrows-encode")
        self._queue: queue.SimpleQueue | None = None  # the open part's groups
        self._futures: list[Future] = []
        self._pending_bytes = 0
        self._room = threading.Condition()
        self._stop = False
        self.parts_written = 0

    def _check_open(self) -> None:
        if self._pool is None:
            raise RuntimeError("PartsWriter is closed")
        self._raise_failed()

    def _raise_failed(self) -> None:
        for f in self._futures:
            if f.done() and f.exception() is not None:
                raise f.exception()
        self._futures = [f for f in self._futures if not f.done()]

    def _emit(self, group: pa.Table) -> None:
        if self.groups_written % self.groups_per_part == 0:
            self._start_part()
        size = group.nbytes
        with self._room:
            while self._pending_bytes and self._pending_bytes + size > self.max_pending_bytes:
                self._room.wait(0.1)
                self._raise_failed()
            self._pending_bytes += size
        self._queue.put((group, size))

    def _start_part(self) -> None:
        if self._queue is not None:
            self._queue.put(_END)
        self._queue = queue.SimpleQueue()
        self._futures.append(self._pool.submit(self._encode, self.next_path(), self._queue))
        self.parts_written += 1

    def _encode(self, path, groups: queue.SimpleQueue) -> None:
        with writing(path), pq.ParquetWriter(path, self.schema, **WRITE_OPTIONS) as writer:
            while (item := groups.get()) is not _END:
                group, size = item
                try:
                    if not self._stop:
                        writer.write_table(group, row_group_size=max(group.num_rows, 1))
                finally:
                    with self._room:
                        self._pending_bytes -= size
                        self._room.notify_all()
        if self.sync_parts and not self._stop:
            fsync_file(path)

    def close(self) -> None:
        """Write what is pending, finish every part (at least one, possibly empty) and wait for
        the encoders (idempotent)."""
        if self._pool is None:
            return
        try:
            self._flush()
            if self.parts_written == 0:
                self._start_part()
            self._queue.put(_END)
            for f in self._futures:
                f.result()
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        pool, self._pool = self._pool, None
        if self._queue is not None:
            self._queue.put(_END)
        pool.shutdown(wait=True)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        elif self._pool is not None:
            self._stop = True
            self._shutdown()
