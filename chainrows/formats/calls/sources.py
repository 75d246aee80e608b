"""Where a call log lives (SPEC §8.1): a JSON Lines file (``.jsonl``, ``.jsonl.gz``), a Parquet
file, or a directory of Parquet files; and its records batches, in input order.

A directory is read file by file in lexicographic order of file names, skipping names that
start with ``.`` or ``_`` (as the dataset reader does). A file that is neither (by its name or,
for other names, its first bytes) is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from chainrows.engine.threads import inherit_threads, wait_out
from chainrows.errors import InputError
from chainrows.formats.calls.arrow_input import TABLE, check_columns, records_from_table
from chainrows.formats.calls.jsonl import read_jsonl

READ_BUFFER = 4 << 20  # bytes of a column chunk read at a time
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass
class CallsSource:
    """A call log: ``kind`` "jsonl" or "parquet", its files, their total size in bytes."""

    path: Path
    kind: str
    files: list
    size: int

    @property
    def maybe_logprobs(self) -> bool:
        """Whether records may carry completion_logprobs: a Parquet log without the column in
        any file has none; a JSON Lines log may have them anywhere."""
        if self.kind == "jsonl":
            return True
        return any(pq.read_schema(f).get_field_index("completion_logprobs") >= 0 for f in self.files)

    def batches(self, chunk_bytes: int, advance: Callable[[int], None] | None = None) -> Iterator[pa.RecordBatch]:
        """Records batches of about ``chunk_bytes`` (of JSON, or of decoded Parquet values) in
        input order, records numbered from 0; ``advance(n)`` is told each ``n`` bytes of input
        consumed."""
        if self.kind == "jsonl":
            yield from read_jsonl(self.files[0], batch_bytes=chunk_bytes, advance=advance)
            return
        first = 0
        for file in self.files:
            for batch, consumed in parquet_batches(file, first, chunk_bytes):
                first += batch.num_rows
                yield batch
                if advance:
                    advance(consumed)


def open_source(path: str | os.PathLike) -> CallsSource:
    """The call log at ``path``; InputError when there is none, or it is of no known kind."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if not p.name.startswith((".", "_")))
        for f in files:
            if not f.is_file():
                raise InputError(f"{f.name!r} in the call log directory is not a regular file",
                                 table=TABLE, directory=path)
        return CallsSource(path, "parquet", files, sum(f.stat().st_size for f in files))
    if not path.is_file():
        raise InputError(f"call log {str(path)!r} does not exist or is not a file or directory", table=TABLE)
    return CallsSource(path, _kind(path), [path], path.stat().st_size)


def _kind(path: Path) -> str:
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".json", ".json.gz", ".ndjson", ".ndjson.gz")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head == b"PAR1":
        return "parquet"
    if head[:2] == _GZIP_MAGIC or head[:1] in (b"{", b" ", b"\n", b"\t", b"\r") or not head:
        return "jsonl"
    raise InputError("not a call log: expected JSON Lines (.jsonl, .jsonl.gz) or Parquet", table=TABLE,
                     file=path)


_WIDTH = {"INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "BOOLEAN": 1}


def decoded_bytes(meta) -> int:
    """About the bytes a Parquet file's columns decode to: numbers by their count and width (a
    dictionary-encoded token column stores less than it decodes to), strings as stored."""
    total = 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            col = group.column(c)
            width = _WIDTH.get(col.physical_type)
            total += col.num_values * width if width else col.total_uncompressed_size
    return total


def parquet_batches(file: Path, first_record: int, chunk_bytes: int) -> Iterator[tuple[pa.RecordBatch, int]]:
    """(records batch, file bytes it stands for) of one Parquet call log file, in row order,
    about ``chunk_bytes`` decoded at a time; column chunks are read in buffers of
    READ_BUFFER bytes, not whole (a row group of a call log can be hundreds of MB)."""
    try:
        pf = pq.ParquetFile(file, buffer_size=READ_BUFFER, pre_buffer=False)
        columns = check_columns(pf.schema_arrow, file)
        meta = pf.metadata
        rows = max(1, chunk_bytes * max(meta.num_rows, 1) // max(decoded_bytes(meta), 1))
        row0, size, told = 0, os.path.getsize(file), 0
        for batch in pf.iter_batches(batch_size=rows, columns=columns, use_threads=pa.cpu_count() > 1):
            table = pa.Table.from_batches([batch])
            records = records_from_table(table, file=file, row0=row0, first_record=first_record + row0)
            row0 += batch.num_rows
            at = size * row0 // max(meta.num_rows, 1)
            yield records, at - told
            told = at
    except (OSError, pa.ArrowInvalid) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"cannot read Parquet file: {' '.join(str(exc).split())}", table=TABLE,
                         file=file) from exc


_END = object()


def read_ahead(items: Iterator) -> Iterator:
    """The items of ``items``, each read on a helper thread while the caller works on the one
    before (Parquet decoding and the JSON kernel release the GIL): one item ahead, no more. An
    error of the reader is raised where the item would have been; leaving early waits for the
    item being read."""
    with ThreadPoolExecutor(1, thread_name_prefix="chainrows-read", **inherit_threads()) as pool:
        ahead = pool.submit(next, items, _END)
        while True:
            error = wait_out(ahead)
            if error is not None:
                raise error
            item = ahead.result()
            if item is _END:
                return
            ahead = pool.submit(next, items, _END)
            try:
                yield item
            except BaseException:
                wait_out(ahead)
                raise
