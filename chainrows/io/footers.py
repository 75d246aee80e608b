"""Parquet footers: what a run needs of each input file before reading its data, read once.

A bulk run asks for every input file's footer several times: the schema checks of each table
plan (sizes, the id scan, the stream), the input's uncompressed size, the partitioner's rows per
batch. On a dataset of thousands of small files those re-reads cost seconds (docs/limits.md,
"Many small files"), so within :func:`remembered` each file's :class:`FileFacts` are read once;
outside it every call reads the file. While any block is open, every thread of the process
shares the one memory; an entry is used only while the file keeps its size, inode, and
modification and change times (a file rewritten in place gets a new change time, which
``utime`` cannot set back).
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from chainrows.io.errors import InputError


@dataclass(frozen=True)
class FileFacts:
    """A Parquet file's Arrow schema (as ``pq.read_schema`` gives it), its row count, and the
    uncompressed bytes of its column chunks: in all (``total_bytes``) and per top-level column
    (``column_bytes``; None when the footer's leaf columns could not be matched to the schema's
    fields). Sums of each chunk's own size, not of the row groups' ``total_byte_size``, which
    some writers fill with the compressed size or 0."""

    schema: pa.Schema
    num_rows: int
    total_bytes: int
    column_bytes: Mapping[str, int] | None = None

    def bytes_of(self, columns: Iterable[str]) -> int:
        """Uncompressed bytes of the named top-level columns (a name the file lacks counts 0):
        what reading those columns decodes. Columns a run does not read (a capture's request
        text, its transcripts) do not count. ``total_bytes`` when the split is unknown."""
        if self.column_bytes is None:
            return self.total_bytes
        return sum(self.column_bytes.get(c, 0) for c in columns)


def _column_bytes(leaf_bytes: list[int], schema: pa.Schema) -> dict[str, int] | None:
    """Uncompressed bytes of each top-level field of ``schema`` (a file's Arrow schema), from
    ``leaf_bytes`` (per leaf column of its footer, summed over the row groups). A footer lists
    leaf columns in the schema's depth-first order, so each field owns the next as many leaves as
    it has (a list one per leaf of its values, a struct its children's, a map its keys' and
    values'). None when the leaf counts do not add up to the footer's columns."""
    leaves = [_leaves(f.type) for f in schema]
    if sum(leaves) != len(leaf_bytes):
        return None
    out, j = {}, 0
    for name, n in zip(schema.names, leaves):
        out[name] = sum(leaf_bytes[j:j + n])
        j += n
    return out


def _leaves(t: pa.DataType) -> int:
    if isinstance(t, pa.BaseExtensionType):  # pyarrow's own (opaque, uuid, ...) and Python-defined ones
        t = t.storage_type
    n = t.num_fields
    return 1 if n == 0 else sum(_leaves(t.field(i).type) for i in range(n))


_remembered: dict[Path, tuple[tuple[int, int, int, int], FileFacts]] | None = None
_holders = 0  # blocks of remembered() open, on any thread
_lock = threading.Lock()


@contextmanager
def remembered() -> Iterator[None]:
    """Within the block (on every thread), :func:`file_facts` reads each file's footer once.
    Blocks open at the same time (nested, or on other threads) share one memory, dropped when
    the last closes. Also a decorator."""
    global _remembered, _holders
    with _lock:
        _holders += 1
        if _remembered is None:
            _remembered = {}
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                _remembered = None


@contextmanager
def reading(name: str, file: Path) -> Iterator[None]:
    """Errors of the Parquet reader inside the block become one InputError naming the table and
    the file ("unreadable Parquet file"); running out of memory (pyarrow's ArrowMemoryError is
    a MemoryError) passes as it is: it is the machine's, not the file's."""
    try:
        yield
    except MemoryError:
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(f"unreadable Parquet file: {one_line(exc)}", table=name, file=file) from exc


def one_line(exc: BaseException) -> str:
    """An exception's text on one line of at most 300 characters."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def file_facts(name: str, file: Path) -> FileFacts:
    """The footer facts of ``file`` (of table ``name``); an unreadable footer is an InputError
    naming both."""
    memory = _remembered
    if memory is None:
        return _read(name, file)
    with reading(name, file):
        st = os.stat(file)
    stamp = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    hit = memory.get(file)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    facts = _read(name, file)
    memory[file] = (stamp, facts)
    return facts


def _read(name: str, file: Path) -> FileFacts:
    with reading(name, file):
        return facts_of(pq.ParquetFile(file))


def facts_of(pf: pq.ParquetFile) -> FileFacts:
    """The facts of an open Parquet file, from its footer."""
    md, schema = pf.metadata, pf.schema_arrow
    leaf_bytes = [0] * md.num_columns
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        for j in range(md.num_columns):
            leaf_bytes[j] += rg.column(j).total_uncompressed_size
    return FileFacts(schema, md.num_rows, sum(leaf_bytes), _column_bytes(leaf_bytes, schema))
