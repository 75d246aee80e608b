"""The bucketed import, for logs whose rollouts' tries do not fit the memory budget together.

1. :func:`partition`: the records batches, routed by a hash of their rollout_id into K bucket
   files (Arrow IPC, LZ4) under the import's staging directory; a rollout's records land in
   one bucket, in input order. Each record's bucket is kept (one byte or two per record).
2. Each bucket is imported alone (a fresh state: its rollouts' tries only), its ledger, tokens
   and import_report rows written to run files, in the bucket's record order.
3. :class:`Merge`: the runs read back in input order: for each window of record numbers, the
   next rows of every bucket's run, put back in record order by the kept buckets. The output
   then holds the same rows in the same order as an import in one pass, so the files are
   byte-identical to it (chainrows.formats.calls.outputs cuts them by content).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from chainrows.engine.dense import group_order
from chainrows.errors import writing
from chainrows.lowering.take import take_rows
from chainrows.runners.bulk.partition import SPILL_IPC, string_hashes

MERGE_RECORDS = 16384  # records per merge window, at most


class Partition:
    """K bucket files of records batches, and every record's bucket (``bucket_of``)."""

    def __init__(self, folder: Path, k: int):
        folder.mkdir(parents=True, exist_ok=True)
        self.k = k
        self.paths = [folder / f"bucket-{b:05d}.arrow" for b in range(k)]
        self._writers: list = [None] * k
        self.bucket_of = np.zeros(1 << 16, np.uint16)
        self.failed = np.zeros(1 << 16, bool)
        self.delta_len = np.zeros(0, np.int64)  # per record, once its bucket is imported
        self.records = 0

    def add(self, batch: pa.RecordBatch) -> None:
        n = batch.num_rows
        buckets = (string_hashes(batch.column("rollout_id")) % np.uint64(self.k)).astype(np.int64)
        self._keep(buckets, np.asarray(batch.column("failed").to_numpy(zero_copy_only=False), bool))
        order, off = group_order(buckets, self.k)
        table = pa.Table.from_batches([batch])
        for b in np.flatnonzero(np.diff(off)).tolist():
            piece = take_rows(table, order[off[b]:off[b + 1]])
            if self._writers[b] is None:
                with writing(self.paths[b]):
                    self._writers[b] = pa.ipc.new_stream(self.paths[b], piece.schema, options=SPILL_IPC)
            with writing(self.paths[b]):
                self._writers[b].write_table(piece)
        self.records += n

    def _keep(self, buckets: np.ndarray, failed: np.ndarray) -> None:
        end = self.records + len(buckets)
        if end > len(self.bucket_of):
            size = max(end, 2 * len(self.bucket_of))
            self.bucket_of = np.resize(self.bucket_of, size)
            self.failed = np.resize(self.failed, size)
        self.bucket_of[self.records:end] = buckets
        self.failed[self.records:end] = failed

    def close(self) -> None:
        for b, w in enumerate(self._writers):
            if w is not None:
                with writing(self.paths[b]):
                    w.close()
        self._writers = [None] * self.k
        self.delta_len = np.zeros(self.records, np.int64)

    def batches(self, b: int) -> Iterator[pa.RecordBatch]:
        """Bucket ``b``'s records batches, in input order."""
        if not self.paths[b].exists():
            return
        with pa.OSFile(str(self.paths[b])) as f, pa.ipc.open_stream(f) as reader:  # read, not mapped:
            yield from reader  # a mapped file's pages would count in the process's resident set


class RunWriter:
    """One bucket's output rows (ledger, tokens, import_report) as three IPC run files."""

    NAMES = ("ledger", "tokens", "report")

    def __init__(self, folder: Path, b: int, schemas: tuple):
        self.paths = [folder / f"run-{b:05d}.{name}.arrow" for name in self.NAMES]
        self.schemas = schemas
        self._writers = []
        for path, schema in zip(self.paths, schemas):
            with writing(path):
                self._writers.append(pa.ipc.new_stream(path, schema, options=SPILL_IPC))

    def write(self, *tables: pa.Table) -> None:
        for path, writer, schema, table in zip(self.paths, self._writers, self.schemas, tables):
            with writing(path):
                writer.write_table(table.select(schema.names))

    def close(self) -> None:
        for path, writer in zip(self.paths, self._writers):
            with writing(path):
                writer.close()


class _RunReader:
    """Rows of one run file, handed out in order, ``n`` at a time."""

    def __init__(self, path: Path):
        self._file = pa.OSFile(str(path))
        self._reader = pa.ipc.open_stream(self._file)
        self._pending: list[pa.Table] = []
        self._have = 0

    def take(self, n: int) -> pa.Table:
        while self._have < n:
            batch = self._reader.read_next_batch()
            self._pending.append(pa.Table.from_batches([batch]))
            self._have += batch.num_rows
        table = pa.concat_tables(self._pending) if len(self._pending) != 1 else self._pending[0]
        head, rest = table.slice(0, n), table.slice(n)
        self._pending, self._have = ([rest] if rest.num_rows else []), rest.num_rows
        return head

    def close(self) -> None:
        self._reader.close()
        self._file.close()


class Merge:
    """The runs of every bucket read back in input order (see the module docstring)."""

    def __init__(self, partition: Partition, run_paths: list, window_tokens: int):
        self.p = partition
        self.readers = [[_RunReader(path) for path in paths] for paths in run_paths]
        self.window_tokens = max(window_tokens, 1)

    def windows(self) -> Iterator[tuple[pa.Table, pa.Table, pa.Table]]:
        """(ledger, tokens, import_report) of consecutive windows of records, in order: at most
        MERGE_RECORDS records, cut after the record that brings its deltas to window_tokens."""
        cum = np.cumsum(self.p.delta_len[:self.p.records])
        a = 0
        while a < self.p.records:
            done = cum[a - 1] if a else 0
            b = int(np.searchsorted(cum, done + self.window_tokens, side="left")) + 1
            b = min(max(b, a + 1), a + MERGE_RECORDS, self.p.records)
            buckets = self.p.bucket_of[a:b].astype(np.int64)
            kept = ~self.p.failed[a:b]
            ledger = self._gather(0, buckets)
            report = self._gather(2, buckets)
            tokens = self._gather(1, buckets[kept])
            yield ledger, tokens, report
            a = b

    def _gather(self, which: int, buckets: np.ndarray) -> pa.Table:
        order, off = group_order(buckets, self.p.k)
        parts = [self.readers[k][which].take(int(off[k + 1] - off[k]))
                 for k in np.flatnonzero(np.diff(off)).tolist()]
        grouped = pa.concat_tables(parts) if parts else None
        if grouped is None:
            return self.readers[0][which]._reader.schema.empty_table()
        back = np.empty(len(order), np.int64)
        back[order] = np.arange(len(order))  # record j sits at grouped row back[j]
        return take_rows(grouped, back)

    def close(self) -> None:
        for readers in self.readers:
            for r in readers:
                r.close()
