"""The one set of Parquet writer options of every output (rows, report, datasets, parts) and the
plain single-file write (SPEC §4): row groups of about ROW_GROUP_BYTES, bytes that depend on the
rows alone."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from chainrows.errors import writing

# Writer options, chosen by measurement: zstd(1), dictionaries on the id strings only, values
# handed to the encoders 64 Ki at a time (docs/decisions-io.md "Writer option measurement").
DICTIONARY_COLUMNS = [
    "rollout_id", "group_id", "status", "reason", "detail", "call_ids.list.element",
]
WRITE_OPTIONS: dict = {
    "compression": "zstd",
    "compression_level": 1,
    "use_dictionary": DICTIONARY_COLUMNS,  # absent columns are ignored by pyarrow
    "write_statistics": True,
    "write_batch_size": 1 << 16,
}
ROW_GROUP_BYTES = 128 << 20   # target in-memory bytes per row group


def row_group_rows(table: pa.Table | pa.RecordBatch) -> int:
    """Rows per row group so that a group holds about ROW_GROUP_BYTES of in-memory data."""
    n = table.num_rows
    return max(1, min(n, ROW_GROUP_BYTES * n // max(table.nbytes, 1))) if n else 1


def write_parquet(path: str | os.PathLike, table: pa.Table, **options) -> Path:
    """Write ``table`` to one Parquet file with WRITE_OPTIONS (``options`` override them).

    The bytes depend on the rows alone, not on how the table's columns are chunked (pyarrow
    cuts data pages at chunk boundaries; an API rows table comes in several chunks when
    rollouts failed their hash or logprob checks): each row group is made one chunk per column
    before it is written, so a multi-chunk table costs one row group's copy at a time. A failed
    write is a WriteError naming ``path``."""
    opts = {**WRITE_OPTIONS, **options}
    group_rows = row_group_rows(table)
    if table.num_rows == 0 or all(col.num_chunks == 1 for col in table.columns):
        with writing(path):
            pq.write_table(table, path, row_group_size=group_rows, **opts)
        return Path(path)
    with writing(path), pq.ParquetWriter(path, table.schema, **opts) as writer:
        for start in range(0, table.num_rows, group_rows):
            group = table.slice(start, group_rows).combine_chunks()
            writer.write_table(group, row_group_size=group.num_rows)
    return Path(path)
