"""Parquet footers: what a run needs of each input file before reading its data, read once.

A bulk run asks for every input file's footer several times: the schema checks of each table
plan (sizes, the id scan, the stream), the input's size (stored, and decoded as estimated from
the footer: :func:`decoded_estimate`), the partitioner's rows per batch. On a dataset of thousands of small files those re-reads cost seconds (docs/limits.md,
"Many small files"), so within :func:`remembered` each file's :class:`FileFacts` are read once;
outside it every call reads the file. While any block is open, every thread of the process
shares the one memory; an entry is used only while the file keeps its size, inode, and
modification and change times (a file rewritten in place gets a new change time, which
``utime`` cannot set back).
"""

from __future__ import annotations

import math
import os
import posixpath
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from chainrows.errors import InputError
from chainrows.formats.native.guard import check_footer
from chainrows.formats.native.thrift import unzigzag, varint


@dataclass(frozen=True)
class FileFacts:
    """A Parquet file's Arrow schema (as ``pq.read_schema`` gives it), its row count, and the
    bytes of its column chunks, in all and per top-level column (None when the footer's leaf
    columns could not be matched to the schema's fields):

    - ``stored_bytes`` / ``column_stored``: uncompressed, as stored (sums of each chunk's own
      size, not of the row groups' ``total_byte_size``, which some writers fill with the
      compressed size or 0);
    - ``decoded_bytes`` / ``column_decoded``: estimated Arrow bytes once read
      (:func:`decoded_estimate`), what a read holds in memory. Dictionary and run-length
      encodings store far less than that: token ids of a small vocabulary, 8x less.
    """

    schema: pa.Schema
    num_rows: int
    stored_bytes: int
    decoded_bytes: int
    column_stored: Mapping[str, int] | None = None
    column_decoded: Mapping[str, int] | None = None
    group_rows: tuple[int, ...] = ()
    group_decoded: tuple[int, ...] = ()  # per row group, all columns: at most what a read of it holds

    def stored_of(self, columns: Iterable[str]) -> int:
        """Uncompressed bytes of the named top-level columns (a name the file lacks counts 0).
        Columns a run does not read (a capture's request text, its transcripts) do not count.
        ``stored_bytes`` when the split is unknown."""
        return _sum_of(self.column_stored, self.stored_bytes, columns)

    def decoded_of(self, columns: Iterable[str]) -> int:
        """Estimated Arrow bytes of the named top-level columns once read: what reading them
        holds in memory. ``decoded_bytes`` when the split is unknown."""
        return _sum_of(self.column_decoded, self.decoded_bytes, columns)


def _sum_of(per_column: Mapping[str, int] | None, whole: int, columns: Iterable[str]) -> int:
    if per_column is None:
        return whole
    return sum(per_column.get(c, 0) for c in columns)


_WIDTH = {"BOOLEAN": 0.125, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}
OFFSET_BYTES = 4  # an Arrow list's or string's offset per entry (large types: 8; an estimate)


class Leaf(NamedTuple):
    """What a leaf column's decoded size per value and per row is, from its footer schema
    (``pq.ColumnSchema``): ``width``, bytes per value (None for strings: per chunk, from their
    statistics); ``validity``, bytes per value of its validity bitmap (1/8 when the leaf or a
    level above it is optional: an upper bound, as pyarrow leaves out bitmaps of no nulls);
    ``lists``, the list levels above it (an offset per row each)."""

    width: float | None
    validity: float
    lists: int

    @classmethod
    def of(cls, column: pq.ColumnSchema) -> Leaf:
        kind = column.physical_type
        width = column.length if kind == "FIXED_LEN_BYTE_ARRAY" else _WIDTH.get(kind)
        optional = column.max_definition_level > column.max_repetition_level
        return cls(width, 0.125 if optional else 0.0, column.max_repetition_level)


def decoded_estimate(chunk: pq.ColumnChunkMetaData, leaf: Leaf, rows: int) -> int:
    """Estimated Arrow bytes of one leaf column chunk (``chunk``, of ``leaf``, in a row group of
    ``rows`` rows) once decoded as the types chainrows reads (strings, flat integers and floats,
    one list level; deeper nesting and decimals are not read, and counted low): a slot per value
    (nulls and empty lists included) of the physical type's width, its validity bit, and an
    offset per row for each list level above the leaf. A string slot is its offset; each
    non-null string counts the longer of its chunk's min and max statistics (the byte-order
    extremes, usually as long as any id), and a string chunk counts never less than its
    uncompressed bytes: one without statistics counts those (low when it is dictionary-encoded;
    docs/limits.md)."""
    n = chunk.num_values
    offsets = OFFSET_BYTES * rows * leaf.lists
    if leaf.width is not None:
        return math.ceil(n * (leaf.width + leaf.validity) + offsets)
    strings = n * (OFFSET_BYTES + leaf.validity)
    if chunk.is_stats_set and (st := chunk.statistics).has_min_max:
        strings += st.num_values * max(len(st.min_raw), len(st.max_raw))
    return max(chunk.total_uncompressed_size, math.ceil(strings + offsets))


def _per_field(leaf_values: list[int], schema: pa.Schema, field_leaves: list[int]) -> dict[str, int] | None:
    """Each top-level field of ``schema`` (a file's Arrow schema) with the sum of its leaves'
    ``leaf_values`` (per leaf column of its footer, summed over the row groups);
    ``field_leaves``: each field's leaf count (:func:`_leaves`). A footer lists leaf columns in the schema's
    depth-first order, so each field owns the next as many leaves as it has (a list one per
    leaf of its values, a struct its children's, a map its keys' and values'). None when the
    leaf counts do not add up to the footer's columns."""
    if sum(field_leaves) != len(leaf_values):
        return None
    out, j = {}, 0
    for name, n in zip(schema.names, field_leaves):
        out[name] = sum(leaf_values[j:j + n])
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
    with reading(name, file), pa.OSFile(str(file)) as fh:
        return facts_of(fh)


MAGIC = b"PAR1"
SIGNATURE_BYTES = 28  # after a plaintext footer of an encrypted file: 12-byte nonce, 16-byte tag
ENCRYPTION_FIELDS = (8, 9)  # FileMetaData's encryption_algorithm, footer_signing_key_metadata


def names_encryption(metadata: bytes) -> bool:
    """The serialized FileMetaData (Thrift compact protocol) has a top-level field naming
    encryption: what tells a plaintext footer of an encrypted file from a footer followed by
    as many stray bytes as a signature (pyarrow reads such a file). Unparseable metadata counts
    as encrypted: refused, never handed to the reader that aborts on encrypted columns."""
    try:
        return bool(set(_top_level_fields(metadata)) & set(ENCRYPTION_FIELDS))
    except (IndexError, ValueError):
        return True


def _top_level_fields(buf: bytes) -> list[int]:
    """The field ids of the Thrift compact-protocol struct at the start of ``buf``."""
    ids: list[int] = []
    _struct_end(buf, 0, 0, ids)
    return ids


def _struct_end(buf: bytes, pos: int, depth: int, ids: list[int] | None = None) -> int:
    """The position after the fields of the struct at ``pos`` (its stop byte included); each
    field's id appended to ``ids`` when given."""
    field = 0
    while True:
        byte = buf[pos]
        pos += 1
        kind = byte & 0x0F
        if kind == 0:  # stop
            return pos
        if byte >> 4:  # the id as a delta from the previous field's
            field += byte >> 4
        else:
            raw, pos = varint(buf, pos)
            field = unzigzag(raw)
        if ids is not None:
            ids.append(field)
        pos = _skip(buf, pos, kind, in_field=True, depth=depth)


def _skip(buf: bytes, pos: int, kind: int, in_field: bool = False, depth: int = 0) -> int:
    """The position after a value of compact type ``kind`` at ``pos`` (a bool is in its field
    header when ``in_field``, else one byte)."""
    if depth > 64:
        raise ValueError("nested too deep")
    if kind in (1, 2):  # bool
        return pos if in_field else pos + 1
    if kind == 3:  # byte
        return pos + 1
    if kind in (4, 5, 6):  # i16, i32, i64
        return varint(buf, pos)[1]
    if kind == 7:  # double
        return pos + 8
    if kind == 8:  # binary
        n, pos = varint(buf, pos)
        return pos + n
    if kind in (9, 10):  # list, set
        head = buf[pos]
        pos += 1
        n, elem = head >> 4, head & 0x0F
        if n == 15:
            n, pos = varint(buf, pos)
        for _ in range(n):
            pos = _skip(buf, pos, elem, depth=depth + 1)
        return pos
    if kind == 11:  # map
        n, pos = varint(buf, pos)
        if n:
            types = buf[pos]
            pos += 1
            for _ in range(n):
                pos = _skip(buf, pos, types >> 4, depth=depth + 1)
                pos = _skip(buf, pos, types & 0x0F, depth=depth + 1)
        return pos
    if kind == 12:  # struct
        return _struct_end(buf, pos, depth + 1)
    raise ValueError(f"unknown compact type {kind}")


def facts_of(fh: pa.NativeFile) -> FileFacts:
    """The facts of an open Parquet file (any pyarrow file: local, or of another filesystem),
    from its footer.

    A file with encrypted columns and a plaintext footer (Parquet modular encryption) is refused
    (ValueError) before any column's metadata is touched: pyarrow aborts the process there,
    throwing from code that cannot pass the error on. Its footer is the metadata and then a
    signature, which no other file has (the metadata fills the whole footer; the file's last 8
    bytes give the footer's length, then the magic); a file whose footer itself is encrypted
    never opens. A footer with a field that pyarrow's metadata accessors would abort on is
    refused too (ValueError naming its row group and column: :func:`guard.check_footer`)."""
    pf = pq.ParquetFile(fh)
    md = pf.metadata
    tail = fh.read_at(len(MAGIC) + 4, fh.size() - len(MAGIC) - 4)
    footer_len = int.from_bytes(tail[:4], "little")
    if tail[4:] == MAGIC and footer_len == md.serialized_size + SIGNATURE_BYTES and \
            names_encryption(fh.read_at(md.serialized_size, fh.size() - len(MAGIC) - 4 - footer_len)):
        raise ValueError("encrypted columns (Parquet modular encryption), which chainrows does not "
                         "read: decrypt the file first")
    check_footer(fh, md)
    schema = pf.schema_arrow
    leaves = [Leaf.of(md.schema.column(j)) for j in range(md.num_columns)]
    stored = [0] * md.num_columns
    decoded = [0] * md.num_columns
    group_rows, group_decoded = [], []
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        in_group = 0
        for j, leaf in enumerate(leaves):
            chunk = rg.column(j)
            stored[j] += chunk.total_uncompressed_size
            estimate = decoded_estimate(chunk, leaf, rg.num_rows)
            decoded[j] += estimate
            in_group += estimate
        group_rows.append(rg.num_rows)
        group_decoded.append(in_group)
    fields = [_leaves(f.type) for f in schema]
    return FileFacts(schema, md.num_rows, sum(stored), sum(decoded), _per_field(stored, schema, fields),
                     _per_field(decoded, schema, fields), tuple(group_rows), tuple(group_decoded))


FOOTER_TAIL = len(MAGIC) + 4  # a Parquet file ends with its footer's length (4 bytes LE) and the magic


def input_fingerprint(paths: Iterable, root, fs=None) -> dict:
    """What identifies a dataset's files without reading their data: ``{"files": N, "bytes":
    total size, "fingerprint": xxh3_128 hex}``, the hash over each file's name relative to
    ``root`` (POSIX form), its size and its footer's bytes, in name order. ``fs``: a pyarrow
    filesystem the paths are on (default: local). Moving the dataset elsewhere keeps it; a file
    renamed, resized or with other rows changes it. A file too short to hold a footer is an
    InputError naming it."""
    base = Path(root).as_posix() if fs is None else str(root)
    entries = sorted((posixpath.relpath(Path(p).as_posix() if fs is None else str(p), base), p) for p in paths)
    digest = xxhash.xxh3_128()
    total = 0
    for name, path in entries:
        size, footer = _footer_bytes(path, fs)
        total += size
        for part in (name.encode(), b"\0", size.to_bytes(8, "little"), len(footer).to_bytes(8, "little"), footer):
            digest.update(part)
    return {"files": len(entries), "bytes": total, "fingerprint": digest.hexdigest()}


def _footer_bytes(path, fs) -> tuple[int, bytes]:
    """``path``'s size and its footer (the serialized metadata, its length and the magic)."""
    try:
        with (pa.OSFile(str(path)) if fs is None else fs.open_input_file(str(path))) as fh:
            size = fh.size()
            tail = fh.read_at(FOOTER_TAIL, size - FOOTER_TAIL) if size >= FOOTER_TAIL else b""
            length = int.from_bytes(tail[:4], "little") if tail[4:] == MAGIC else -1
            if length < 0 or length + FOOTER_TAIL > size:
                raise ValueError("no Parquet footer at the end of the file")
            return size, fh.read_at(length + FOOTER_TAIL, size - length - FOOTER_TAIL)
    except MemoryError:
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(f"unreadable Parquet file: {one_line(exc)}", file=path) from exc
