"""A Parquet writer whose row groups depend only on the rows written, not on how they arrive.

Byte-identical output whatever the batch size or memory budget needs row-group boundaries that
are a function of content: a group closes after the row where it reaches ``max_rows`` rows or
``max_units`` units (tokens for ``rows``, 1 per row otherwise).
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from chainrows.io.write import WRITE_OPTIONS

ROWS_GROUP_TOKENS = 1 << 20
GROUP_ROWS = 65536


def _units(table: pa.Table, unit_column: str | None) -> np.ndarray:
    if unit_column is None or table.num_rows == 0:
        return np.ones(table.num_rows, dtype=np.int64)
    lengths = pc.list_value_length(table[unit_column]).to_numpy(zero_copy_only=False)
    return lengths.astype(np.int64) + 1


class RowGroupWriter:
    """Append tables in order; row groups are cut at content-determined rows."""

    def __init__(self, path: str | os.PathLike, schema: pa.Schema, *, unit_column: str | None = None,
                 max_units: int = ROWS_GROUP_TOKENS, max_rows: int = GROUP_ROWS):
        self.schema = schema
        self.unit_column = unit_column
        self.max_units = max_units
        self.max_rows = max_rows
        self._writer = pq.ParquetWriter(path, schema, **WRITE_OPTIONS)
        self._pending: list[pa.Table] = []
        self._rows = 0
        self._units = 0
        self.rows_written = 0

    def write(self, table: pa.Table) -> None:
        """Append rows (columns matched to the schema by name)."""
        if self._writer is None:
            raise RuntimeError("RowGroupWriter is closed")
        table = table.select(self.schema.names)
        units = _units(table, self.unit_column)
        start = 0
        n = table.num_rows
        while start < n:
            # rows this group can still take: stop after the row that reaches a limit
            room_rows = self.max_rows - self._rows
            cum = np.cumsum(units[start:start + room_rows]) + self._units
            hit = np.flatnonzero(cum >= self.max_units)
            take = int(hit[0]) + 1 if len(hit) else min(room_rows, n - start)
            piece = table.slice(start, take)
            self._pending.append(piece)
            self._rows += take
            self._units = int(cum[take - 1])
            start += take
            if self._rows >= self.max_rows or self._units >= self.max_units:
                self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        group = pa.concat_tables(self._pending)
        if group.schema != self.schema:
            group = group.cast(self.schema)
        group = group.combine_chunks()  # one chunk per column: page layout independent of arrival
        self._writer.write_table(group, row_group_size=max(group.num_rows, 1))
        self.rows_written += group.num_rows
        self._pending, self._rows, self._units = [], 0, 0

    def close(self) -> None:
        """Write what is pending and the footer (idempotent)."""
        if self._writer is None:
            return
        try:
            self._flush()
        finally:
            writer, self._writer = self._writer, None
            writer.close()

    def __enter__(self) -> "RowGroupWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        elif self._writer is not None:  # the staged file is discarded: just release it
            writer, self._writer = self._writer, None
            writer.close()
