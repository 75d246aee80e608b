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
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from chainrows.io.errors import InputError


@dataclass(frozen=True)
class FileFacts:
    """A Parquet file's Arrow schema (as ``pq.read_schema`` gives it), its row count and the
    uncompressed bytes of its row groups."""

    schema: pa.Schema
    num_rows: int
    uncompressed_bytes: int


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
        pf = pq.ParquetFile(file)
        md = pf.metadata
        return FileFacts(pf.schema_arrow, md.num_rows,
                         sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups)))
