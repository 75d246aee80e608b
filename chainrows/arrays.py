"""Array idioms the IO layer uses in many places, each written once: one chunk of a column, the
offsets of a list array, offsets from lengths, concatenated ranges, exact-match probes of
sorted keys, and small record batches joined."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa


def one_chunk(col) -> pa.Array:
    """``col`` as one Array: a ChunkedArray's only chunk as it is (zero copy), or its chunks
    concatenated; an Array unchanged."""
    if isinstance(col, pa.ChunkedArray):
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return col


def list_offsets(arr: pa.Array) -> np.ndarray:
    """int64 offsets (length ``len(arr) + 1``) of a list or large_list Array into ``arr.values``;
    a slice keeps its offsets into the unsliced values."""
    return arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def string_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(int64 offsets of length ``len(arr) + 1``, uint8 bytes, bool validity or None when no
    nulls) of a string or large_string Array, zero copy but for int32 offsets widened. Offsets
    outside the bytes are refused (ValueError) before any kernel reads them. Other string-like
    types are cast to large_string first."""
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = arr.cast(pa.large_string())
    if len(arr) == 0:  # may come without buffers, or with an empty offsets buffer
        return np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.uint8), None
    _, off_buf, data_buf = arr.buffers()
    offsets = offsets_view(off_buf, pa.types.is_large_string(arr.type), arr.offset, len(arr))
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    if offsets is None or not offsets_rise_within(offsets, len(data)):
        raise ValueError("string offsets outside the data buffer")
    offsets = offsets.astype(np.int64, copy=False)
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool) if arr.null_count else None
    return offsets, data, valid


def offsets_view(buf, wide: bool, first: int, n: int) -> np.ndarray | None:
    """The ``n + 1`` offsets from entry ``first`` of an Arrow offsets buffer (int64 when
    ``wide``, else int32), zero copy; None when the buffer is too short to hold them. Exactly
    that many are read: Arrow allows a buffer longer than its offsets, by any number of bytes."""
    dtype = np.dtype(np.int64 if wide else np.int32)
    if buf is None or buf.size < (first + n + 1) * dtype.itemsize:
        return None
    return np.frombuffer(buf, dtype=dtype, count=n + 1, offset=first * dtype.itemsize)


def offsets_rise_within(offsets: np.ndarray, size: int) -> bool:
    """Offsets that never fall and stay within [0, size]: safe to read ranges of a buffer of
    ``size`` items with."""
    return bool(offsets[0] >= 0 and offsets[-1] <= size and not np.any(offsets[1:] < offsets[:-1]))


def grown(a: np.ndarray, n: int, fill=None) -> np.ndarray:
    """``a`` with room for at least ``n`` values: ``a`` itself when it has it, else a new array of
    max(n, 2 * len(a)) values holding ``a``'s at the start and ``fill`` after (uninitialized when
    None), so that growing one value at a time costs amortized O(1)."""
    if n <= len(a):
        return a
    size = max(n, 2 * len(a))
    b = np.empty(size, a.dtype) if fill is None else np.full(size, fill, a.dtype)
    b[:len(a)] = a
    return b


def offsets_from_lengths(lengths) -> np.ndarray:
    """``[0, l0, l0 + l1, ...]`` as int64."""
    off = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    return off


def range_index(starts, lengths) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each (s, n), vectorised."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(np.asarray(starts, dtype=np.int64) - (np.cumsum(lengths) - lengths), lengths)
    return shift + np.arange(total, dtype=np.int64)


def probe_sorted(sorted_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``keys``: (a position in ``sorted_keys``, whether the key is there). Where it
    is, the position is its first occurrence; elsewhere the position is in range but meaningless."""
    pos = np.searchsorted(sorted_keys, keys, side="left")
    n = len(sorted_keys)
    if n == 0:
        return np.zeros(len(keys), dtype=np.int64), np.zeros(len(keys), dtype=bool)
    pos_c = np.minimum(pos, n - 1)
    return pos_c, (pos < n) & (sorted_keys[pos_c] == keys)


class FirstValue:
    """uint64 key -> the value of its first occurrence (a lookup table built from two arrays)."""

    def __init__(self, keys: np.ndarray, values: np.ndarray):
        self.keys, first = np.unique(keys, return_index=True)
        self.values = values[first]

    def get(self, keys: np.ndarray, default: np.ndarray) -> np.ndarray:
        """The value of each of ``keys``, ``default[i]`` where a key is absent."""
        pos, hit = probe_sorted(self.keys, keys)
        return np.where(hit, self.values[pos] if len(self.keys) else default, default)


def coalesced(batches: Iterable[pa.RecordBatch], max_rows: int) -> Iterator[pa.RecordBatch]:
    """The same rows in the same order, consecutive batches of one schema joined into batches
    of at most ``max_rows`` rows (a larger batch passes as it is). Batches whose join would not
    fit 32-bit offsets pass as they are.

    A dataset of many small files gives one small batch per file; a caller with a fixed cost
    per batch (a kernel launch, a hash pass) pays it once per ``max_rows`` rows instead."""
    pending: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        if pending and (rows + batch.num_rows > max_rows or not batch.schema.equals(pending[0].schema)):
            yield from _joined(pending)
            pending, rows = [], 0
        pending.append(batch)
        rows += batch.num_rows
    if pending:
        yield from _joined(pending)


def _joined(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    if len(batches) == 1:
        return batches
    table = pa.Table.from_batches(batches)
    try:
        columns = [one_chunk(c) for c in table.columns]
    except (pa.ArrowInvalid, pa.ArrowCapacityError):  # offsets past 2**31 - 1
        return batches
    return [pa.RecordBatch.from_arrays(columns, schema=table.schema)]
