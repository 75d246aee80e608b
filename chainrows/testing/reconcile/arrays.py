"""Column-to-numpy helpers of the checker: string dictionaries and codes, list columns, floats
compared with NaN equal, and the one sorted-probe lookup."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chainrows.arrays import list_offsets, one_chunk, probe_sorted


def dictionary(cols: Iterable) -> pa.Array:
    """Sorted (byte order) distinct non-null strings of the given string columns."""
    chunks = []
    for col in cols:
        col = one_chunk(col)
        if pa.types.is_dictionary(col.type):
            col = col.dictionary_decode()
        chunks.append(col.cast(pa.large_string()))
    if not chunks:
        return pa.array([], pa.large_string())
    u = pc.unique(pa.chunked_array(chunks, pa.large_string()))
    u = u.filter(pc.is_valid(u))
    return u.take(pc.sort_indices(u))


def codes(col, dictionary: pa.Array) -> np.ndarray:
    """Index of each value in ``dictionary``; -1 for nulls."""
    col = one_chunk(col)
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    idx = pc.index_in(col.cast(pa.large_string()), value_set=dictionary)
    return pc.fill_null(idx, -1).to_numpy(zero_copy_only=False).astype(np.int64)


def list_parts(col) -> tuple[np.ndarray, pa.Array]:
    """(offsets as int64 relative to values, values) of a list column; null lists are empty."""
    arr = one_chunk(col)
    if arr.null_count:
        arr = pc.fill_null(arr, pa.scalar([], arr.type))
        arr = one_chunk(arr)
    off = list_offsets(arr)
    values = arr.values
    if off[0] != 0 or len(values) != off[-1]:  # a sliced array: re-base on the used values
        values = values.slice(int(off[0]), int(off[-1] - off[0]))
        off = off - off[0]
    return off, values


def to_np(col, dtype=None, fill=None) -> np.ndarray:
    """A column as numpy, nulls replaced by ``fill`` first, cast to ``dtype``."""
    arr = one_chunk(col)
    if fill is not None:
        arr = pc.fill_null(arr, fill)
    out = arr.to_numpy(zero_copy_only=False)
    return out.astype(dtype) if dtype is not None else out


def first_index(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sorted distinct keys, first position of each, count of each)."""
    uniq, first, counts = np.unique(keys, return_index=True, return_counts=True)
    return uniq, first, counts


def lookup(uniq: np.ndarray, payload: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """payload of each key in the sorted ``uniq`` (-1 where absent)."""
    out = np.full(len(keys), -1, dtype=np.int64)
    if len(uniq) == 0 or len(keys) == 0:
        return out
    pos, hit = probe_sorted(uniq, keys)
    out[hit] = payload[pos[hit]]
    return out


def same_float(a, b) -> bool:
    """Equal, None only equal to None, NaN equal to NaN."""
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b


def finite(x) -> bool:
    return x is not None and math.isfinite(x)
