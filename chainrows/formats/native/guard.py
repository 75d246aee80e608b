"""The footer fields pyarrow checks by throwing from its metadata accessors, checked first.

pyarrow's ``RowGroupMetaData.column``, ``ColumnChunkMetaData.statistics`` / ``is_stats_set`` and
``.compression`` (and ``to_dict``, which calls them) validate parts of a column chunk's metadata
by throwing a C++ ``parquet::ParquetException`` that Cython cannot catch there: the process dies
by SIGABRT (apache/arrow#45283 is one of them). pyarrow's readers catch the same checks (a clean
OSError), so only the accessors need the guard. :func:`check_footer` walks the serialized
FileMetaData (:mod:`chainrows.formats.native.thrift`) and refuses, naming the row group and the
column, each case found to abort on pyarrow 26 (tests/formats/native/test_footer_guard.py crafts
one footer per case):

- a row group whose column chunks are not one per leaf column of the schema;
- a column chunk without its metadata, or whose physical type is not its schema column's;
- a compression codec Parquet does not define;
- size statistics whose repetition or definition level histogram is neither empty nor one
  count per level (max level + 1), or that give unencoded byte-array bytes for a column that is
  not BYTE_ARRAY;
- min/max statistics of a fixed-width type shorter than the type's width.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from chainrows.formats.native.thrift import decode_struct

PHYSICAL = ("BOOLEAN", "INT32", "INT64", "INT96", "FLOAT", "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY")
WIDTH = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}
CODECS = range(8)  # UNCOMPRESSED, SNAPPY, GZIP, LZO, BROTLI, LZ4, ZSTD, LZ4_RAW
# Thrift field ids of parquet.thrift
FMD_ROW_GROUPS, RG_COLUMNS, CC_META = 4, 1, 3
CMD_TYPE, CMD_CODEC, CMD_STATISTICS, CMD_SIZE_STATISTICS = 1, 4, 12, 16
STAT_MINMAX = (1, 2, 5, 6)  # max, min (deprecated), max_value, min_value
SIZE_UNENCODED, SIZE_REP_HIST, SIZE_DEF_HIST = 1, 2, 3


def footer_bytes(fh: pa.NativeFile) -> bytes:
    """The serialized FileMetaData of an open Parquet file (the bytes before its last 8)."""
    size = fh.size()
    tail = fh.read_at(8, size - 8)
    n = int.from_bytes(tail[:4], "little")
    if n > size - 12:
        raise ValueError("the footer's length exceeds the file")
    return fh.read_at(n, size - 8 - n)


def check_footer(fh: pa.NativeFile, md: pq.FileMetaData) -> None:
    """ValueError naming the row group and column of the first field of the file's footer that
    a pyarrow metadata accessor would abort on (module docstring); ``md``: the file's metadata
    as pyarrow opened it (its schema, which pyarrow checks when it opens the file)."""
    meta, _ = decode_struct(footer_bytes(fh))
    leaves = [md.schema.column(j) for j in range(md.num_columns)]
    for g, group in enumerate(meta.get(FMD_ROW_GROUPS, ())):
        chunks = group.get(RG_COLUMNS, ()) if isinstance(group, dict) else ()
        if len(chunks) != len(leaves):
            raise ValueError(f"row group {g} has {len(chunks)} column chunks, the schema "
                             f"{len(leaves)} leaf columns")
        for leaf, chunk in zip(leaves, chunks):
            problem = _chunk_problem(chunk.get(CC_META) if isinstance(chunk, dict) else None, leaf)
            if problem:
                raise ValueError(f"row group {g}, column {leaf.path!r}: {problem}")


def _chunk_problem(cmd, leaf: pq.ColumnSchema) -> str | None:
    if not isinstance(cmd, dict):
        return "no column metadata"
    kind = cmd.get(CMD_TYPE)
    name = PHYSICAL[kind] if isinstance(kind, int) and 0 <= kind < len(PHYSICAL) else f"type {kind}"
    if name != leaf.physical_type:
        return f"physical type {name} in the footer, {leaf.physical_type} in the schema"
    if cmd.get(CMD_CODEC) not in CODECS:
        return f"unknown compression codec {cmd.get(CMD_CODEC)}"
    return _size_problem(cmd.get(CMD_SIZE_STATISTICS), leaf) or _stats_problem(cmd.get(CMD_STATISTICS), leaf)


def _size_problem(size, leaf: pq.ColumnSchema) -> str | None:
    if size is None:
        return None
    if not isinstance(size, dict):
        return "malformed size statistics"
    for fid, what, top in ((SIZE_REP_HIST, "repetition", leaf.max_repetition_level),
                           (SIZE_DEF_HIST, "definition", leaf.max_definition_level)):
        hist = size.get(fid, ())
        if not isinstance(hist, list) or len(hist) not in (0, top + 1):
            n = len(hist) if isinstance(hist, list) else "?"
            return f"size statistics: {what} level histogram of {n} counts, expected {top + 1}"
    if SIZE_UNENCODED in size and leaf.physical_type != "BYTE_ARRAY":
        return f"size statistics: unencoded byte-array bytes on a {leaf.physical_type} column"
    return None


def _stats_problem(stats, leaf: pq.ColumnSchema) -> str | None:
    if stats is None:
        return None
    if not isinstance(stats, dict):
        return "malformed statistics"
    width = leaf.length if leaf.physical_type == "FIXED_LEN_BYTE_ARRAY" else WIDTH.get(leaf.physical_type)
    if width is None:
        return None
    for fid in STAT_MINMAX:
        value = stats.get(fid)
        if value is not None and (not isinstance(value, bytes) or len(value) < width):
            return f"statistics: a min/max of {len(value) if isinstance(value, bytes) else '?'} bytes, " \
                   f"a {leaf.physical_type} needs {width}"
    return None
