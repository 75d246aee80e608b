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
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from chainrows.engine.threads import inherit_threads, wait_out
from chainrows.errors import InputError
from chainrows.formats.calls.arrow_input import TABLE, check_columns, records_from_table
from chainrows.formats.calls.jsonl import read_jsonl
from chainrows.formats.native.guard import check_footer

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
        return any(_opened(f).schema_arrow.get_field_index("completion_logprobs") >= 0 for f in self.files)

    def batches(self, chunk_bytes: int, advance: Callable[[int], None] | None = None,
                scan_bytes: int = 0) -> Iterator[pa.RecordBatch]:
        """Records batches of about ``chunk_bytes`` (of JSON, or of decoded Parquet values) in
        input order, records numbered from 0; ``advance(n)`` is told each ``n`` bytes of input
        consumed; ``scan_bytes``: room for reading Parquet row groups side by side."""
        for piece in self.pieces(chunk_bytes, advance, scan_bytes):
            yield piece()

    def pieces(self, chunk_bytes: int, advance: Callable[[int], None] | None = None,
               scan_bytes: int = 0) -> Iterator[Callable]:
        """What :meth:`batches` yields, in two steps: each item is read (a Parquet batch decoded,
        JSON lines scanned) when the iterator gives it, and its records batch is made when it is
        called. A reader thread takes the first step (pyarrow's decoding and the JSON kernel let go
        of the GIL); the caller the second (form checks and item fingerprints, Python)."""
        if self.kind == "jsonl":
            for batch in read_jsonl(self.files[0], batch_bytes=chunk_bytes, advance=advance):
                yield partial(_given, batch)
            return
        first = 0
        for file in self.files:
            for table, row0, consumed in parquet_tables(file, chunk_bytes, scan_bytes):
                yield partial(records_from_table, table, file=file, row0=row0, first_record=first + row0)
                if advance:
                    advance(consumed)
            first += _opened(file).metadata.num_rows


def _opened(file: Path) -> pq.ParquetFile:
    """The Parquet file opened (its footer read); an unreadable one (cut short, not Parquet) is
    the InputError :func:`parquet_tables` gives, not a traceback."""
    try:
        return pq.ParquetFile(file)
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"cannot read Parquet file: {' '.join(str(exc).split())}", table=TABLE,
                         file=file) from exc


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


def _given(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch


def decoded_bytes(meta, groups=None) -> int:
    """About the bytes a Parquet file's columns (of row groups ``groups``, default all) decode
    to: numbers by their count and width (a dictionary-encoded token column stores less than it
    decodes to), strings as stored."""
    total = 0
    for g in range(meta.num_row_groups) if groups is None else groups:
        group = meta.row_group(g)
        for c in range(group.num_columns):
            col = group.column(c)
            width = _WIDTH.get(col.physical_type)
            total += col.num_values * width if width else col.total_uncompressed_size
    return total


SCAN_AHEAD = 4  # batches the parallel scanner decodes ahead


def parquet_tables(file: Path, chunk_bytes: int, scan_bytes: int = 0) -> Iterator[tuple[pa.Table, int, int]]:
    """(rows, their first row's number in the file, file bytes they stand for) of one Parquet call
    log file, in row order, about ``chunk_bytes`` decoded at a time, the call-log columns only.

    Where ``scan_bytes`` holds SCAN_AHEAD of the file's largest row groups decoded, Arrow's
    dataset scanner reads it, decoding row groups side by side: a call log's token column is
    most of its bytes, so one group's columns decoded side by side leave a core idle (measured:
    as fast as pyarrow reading the whole file, at a quarter of its memory). Else the file is
    streamed, column chunks read READ_BUFFER bytes at a time (a row group can be hundreds of MB)."""
    try:
        pf = pq.ParquetFile(file, buffer_size=READ_BUFFER, pre_buffer=False)
        columns = check_columns(pf.schema_arrow, file)
        meta = pf.metadata
        _check_footer(file, meta)
        rows = max(1, chunk_bytes * max(meta.num_rows, 1) // max(decoded_bytes(meta), 1))
        largest = max((decoded_bytes(meta, [g]) for g in range(meta.num_row_groups)), default=0)
        threads = pa.cpu_count() > 1
        if threads and SCAN_AHEAD * (largest + chunk_bytes) <= scan_bytes:
            batches = _scanner(file, columns, rows)
        else:
            batches = pf.iter_batches(batch_size=rows, columns=columns, use_threads=threads)
        row0, size, told = 0, os.path.getsize(file), 0
        for batch in batches:
            at = size * (row0 + batch.num_rows) // max(meta.num_rows, 1)
            yield pa.Table.from_batches([batch]), row0, at - told
            row0 += batch.num_rows
            told = at
    except (OSError, pa.ArrowInvalid) as exc:
        raise InputError(f"cannot read Parquet file: {' '.join(str(exc).split())}", table=TABLE,
                         file=file) from exc


def _check_footer(file: Path, meta: pq.FileMetaData) -> None:
    """InputError when the footer has a field pyarrow's metadata accessors abort on
    (:func:`chainrows.formats.native.guard.check_footer`), before :func:`decoded_bytes` reads it."""
    try:
        with pa.OSFile(str(file)) as fh:
            check_footer(fh, meta)
    except ValueError as exc:
        raise InputError(f"cannot read Parquet file: {exc}", table=TABLE, file=file) from exc


def _scanner(file: Path, columns: list, rows: int) -> Iterator[pa.RecordBatch]:
    import pyarrow.dataset as ds

    options = ds.ParquetFragmentScanOptions(pre_buffer=False, use_buffered_stream=True, buffer_size=READ_BUFFER)
    fmt = ds.ParquetFileFormat(default_fragment_scan_options=options)
    return ds.dataset(str(file), format=fmt).to_batches(columns=columns, batch_size=rows, batch_readahead=SCAN_AHEAD,
                                                        fragment_readahead=1, use_threads=True)


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
