"""``take_rows``: rows of an Arrow table by index, fast on token-sized list columns."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from chainrows.engine.ragged import take_ragged_chunks
from chainrows.io.arrays import list_offsets, string_parts


def _lists_of(col: pa.ChunkedArray, *value_kinds) -> bool:
    """``col`` is a list or large_list column without null lists whose values pass one of
    ``value_kinds`` (pa.types predicates)."""
    t = col.type
    return ((pa.types.is_list(t) or pa.types.is_large_list(t)) and col.null_count == 0 and
            any(kind(t.value_type) for kind in value_kinds))


def _take_list(col: pa.ChunkedArray, idx: np.ndarray) -> pa.Array:
    chunks = [c for c in col.chunks if len(c)] or [col.combine_chunks()]
    if any(c.values.null_count for c in chunks):
        return col.take(pa.array(idx)).combine_chunks()
    new_off, new_values = take_ragged_chunks(
        [c.offsets.to_numpy(zero_copy_only=False).astype(np.int64, copy=False) for c in chunks],
        [c.values.to_numpy(zero_copy_only=True) for c in chunks], idx)
    t = col.type
    off_type = pa.int64() if pa.types.is_large_list(t) else pa.int32()
    cls = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
    return cls.from_arrays(pa.array(new_off.astype(off_type.to_pandas_dtype(), copy=False), off_type),
                           pa.array(new_values, t.value_type), type=t)


def _take_string_list(col: pa.ChunkedArray, idx: np.ndarray) -> pa.Array:
    """A list<string> column's rows ``idx``: a row's strings are a run of string lengths and a
    run of bytes, so two block gathers (lengths, bytes) and two prefix sums rebuild it."""
    chunks = [c for c in col.chunks if len(c)] or [col.combine_chunks()]
    if any(c.values.null_count for c in chunks):
        return col.take(pa.array(idx)).combine_chunks()
    list_off, byte_off, lengths, data = [], [], [], []
    for c in chunks:
        lo = list_offsets(c)
        so, bytes_, _ = string_parts(c.values)
        list_off.append(lo)
        byte_off.append(so[lo] - so[0])
        lengths.append(np.diff(so))
        data.append(bytes_[so[0]:so[-1]])
    new_list_off, new_lengths = take_ragged_chunks(list_off, lengths, idx)
    _, new_data = take_ragged_chunks(byte_off, data, idx)
    t = col.type
    wide_strings = pa.types.is_large_string(t.value_type)
    if not wide_strings and len(new_data) > np.iinfo(np.int32).max:
        return col.take(pa.array(idx)).combine_chunks()  # pyarrow's error, or its chunking
    str_off = np.zeros(len(new_lengths) + 1, dtype=np.int64 if wide_strings else np.int32)
    np.cumsum(new_lengths, out=str_off[1:])
    strings = (pa.LargeStringArray if wide_strings else pa.StringArray).from_buffers(
        len(new_lengths), pa.py_buffer(str_off), pa.py_buffer(new_data))
    wide_lists = pa.types.is_large_list(t)
    offsets = pa.array(new_list_off.astype(np.int64 if wide_lists else np.int32, copy=False))
    return (pa.LargeListArray if wide_lists else pa.ListArray).from_arrays(offsets, strings, type=t)


def take_rows(table: pa.Table, idx) -> pa.Table:
    """``table.take(idx)``; list columns of numbers or strings without nulls are gathered one
    block copy per row, straight from each chunk (pyarrow's take builds them element by
    element, after concatenating the chunks)."""
    idx = np.asarray(idx, dtype=np.int64)
    cols = [_take_list(c, idx) if _lists_of(c, pa.types.is_integer, pa.types.is_floating)
            else _take_string_list(c, idx) if _lists_of(c, pa.types.is_string, pa.types.is_large_string)
            else c.take(pa.array(idx)) for c in table.columns]
    return pa.Table.from_arrays(cols, schema=table.schema)
