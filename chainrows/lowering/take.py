"""``take_rows``: rows of an Arrow table by index, fast on token-sized list columns."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from chainrows.arrays import list_offsets, string_parts
from chainrows.engine.ragged import take_ragged_chunks

STRING_BLOCK_MIN_ROWS = 64  # rows taken per chunk from which list<string> block copies pay


def _lists_of(col: pa.ChunkedArray, *value_kinds) -> bool:
    """``col`` is a list or large_list column whose values pass one of ``value_kinds``
    (pa.types predicates)."""
    t = col.type
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and any(kind(t.value_type) for kind in value_kinds)


def _chunks(col: pa.ChunkedArray) -> list[pa.Array]:
    """The chunks of a list column to gather from (empty ones left out: they hold no rows)."""
    return [c for c in col.chunks if len(c)] or [col.combine_chunks()]


def _validity(arrays: list[pa.Array], idx: np.ndarray | None = None) -> np.ndarray | None:
    """The validity of the arrays' elements end to end (rows ``idx`` of it), as bools; None
    when none is null."""
    if not any(a.null_count for a in arrays):
        return None
    valid = np.concatenate([np.asarray(a.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
                            for a in arrays])
    return valid if idx is None else valid[idx]


def _bitmap(valid: np.ndarray | None):
    """An Arrow validity bitmap (offset 0) of bools, None for none null (pyarrow packs a
    boolean array's bools into bits, the layout of a validity bitmap)."""
    return None if valid is None else pa.array(valid, pa.bool_()).buffers()[1]


def _list_array(t: pa.DataType, offsets: np.ndarray, values: pa.Array, valid=None) -> pa.Array:
    """A list or large_list array of type ``t`` from int64 ``offsets`` and its ``values``;
    ``valid``: bools per list, False for a null one (None: none is null)."""
    wide = pa.types.is_large_list(t)
    arr = pa.array(offsets.astype(np.int64 if wide else np.int32, copy=False))
    mask = None if valid is None else pa.array(~valid, pa.bool_())
    return (pa.LargeListArray if wide else pa.ListArray).from_arrays(arr, values, type=t, mask=mask)


def _over_int32(t: pa.DataType, n: int) -> bool:
    """``n`` values or strings do not fit the 32-bit offsets of type ``t`` (list or string)."""
    return not (pa.types.is_large_list(t) or pa.types.is_large_string(t)) and n > np.iinfo(np.int32).max


def _take_list(col: pa.ChunkedArray, idx: np.ndarray) -> pa.Array:
    chunks = _chunks(col)
    if any(c.values.null_count for c in chunks):
        return col.take(pa.array(idx)).combine_chunks()  # a null number inside: pyarrow keeps it
    new_off, new_values = take_ragged_chunks([list_offsets(c) for c in chunks],
                                             [c.values.to_numpy(zero_copy_only=True) for c in chunks], idx)
    if _over_int32(col.type, len(new_values)):
        return col.take(pa.array(idx)).combine_chunks()  # pyarrow's error, or its chunking
    return _list_array(col.type, new_off, pa.array(new_values, col.type.value_type), _validity(chunks, idx))


def _take_string_list(col: pa.ChunkedArray, idx: np.ndarray) -> pa.Array:
    """A list<string> column's rows ``idx``: a row's strings are a run of string lengths and a
    run of bytes, so two block gathers (lengths, bytes) and two prefix sums rebuild it; the
    validity of the lists, and of the strings (a third block gather) when one is null."""
    chunks = _chunks(col)
    list_off, byte_off, lengths, data, string_valid = [], [], [], [], []
    with_null_strings = any(c.values.null_count for c in chunks)
    for c in chunks:
        lo = list_offsets(c)
        so, bytes_, valid = string_parts(c.values)
        list_off.append(lo)
        byte_off.append(so[lo] - so[0])
        lengths.append(np.diff(so))
        data.append(bytes_[so[0]:so[-1]])
        if with_null_strings:
            string_valid.append(np.ones(len(so) - 1, dtype=np.uint8) if valid is None else valid.view(np.uint8))
    new_list_off, new_lengths = take_ragged_chunks(list_off, lengths, idx)
    _, new_data = take_ragged_chunks(byte_off, data, idx)
    wide_strings = pa.types.is_large_string(col.type.value_type)
    if _over_int32(col.type.value_type, len(new_data)) or _over_int32(col.type, len(new_lengths)):
        return col.take(pa.array(idx)).combine_chunks()  # pyarrow's error, or its chunking
    str_off = np.zeros(len(new_lengths) + 1, dtype=np.int64 if wide_strings else np.int32)
    np.cumsum(new_lengths, out=str_off[1:])
    new_valid = take_ragged_chunks(list_off, string_valid, idx)[1].view(bool) if with_null_strings else None
    strings = (pa.LargeStringArray if wide_strings else pa.StringArray).from_buffers(
        len(new_lengths), pa.py_buffer(str_off), pa.py_buffer(new_data), _bitmap(new_valid),
        0 if new_valid is None else len(new_valid) - int(np.count_nonzero(new_valid)))
    return _list_array(col.type, new_list_off, strings, _validity(chunks, idx))


def _string_blocks_pay(col: pa.ChunkedArray, n_rows: int) -> bool:
    """Block copies beat pyarrow's take on a list<string> column: one non-empty chunk, or on
    average at least STRING_BLOCK_MIN_ROWS rows taken per non-empty chunk (the block copy
    costs tens of microseconds per chunk, pyarrow's take tens of nanoseconds per string)."""
    chunks = len(_chunks(col))
    return chunks == 1 or n_rows >= STRING_BLOCK_MIN_ROWS * chunks


def take_rows(table: pa.Table, idx) -> pa.Table:
    """``table.take(idx)``; list columns of numbers are gathered one block copy per row,
    straight from each chunk, null lists included (pyarrow's take builds them element by
    element, after concatenating the chunks); so are list<string> columns when that pays
    (``_string_blocks_pay``: a merge's row group takes a hundred rows of short call_ids lists
    from ~44 chunks), null strings included. A list of numbers holding a null number goes
    through pyarrow's take. The result equals ``table.take(idx)`` logically; a null list keeps
    the values its range covers, where pyarrow's take leaves it empty (a null list read from
    Parquet covers none)."""
    idx = np.asarray(idx, dtype=np.int64)
    cols = [_take_list(c, idx) if _lists_of(c, pa.types.is_integer, pa.types.is_floating)
            else _take_string_list(c, idx) if _lists_of(c, pa.types.is_string, pa.types.is_large_string)
            and _string_blocks_pay(c, len(idx))
            else c.take(pa.array(idx)) for c in table.columns]
    return pa.Table.from_arrays(cols, schema=table.schema)
