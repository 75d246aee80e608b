"""Kernel: gather rows of a ragged (offsets + content) column, as bytes.

Plain-Python definition: ``out = concat(content[offsets[i] * w:offsets[i + 1] * w] for i in idx)``
with ``w`` the item width in bytes, and ``out_off`` the running sums of those lengths.
pyarrow's ``take`` on list columns builds the result element by element; this copies each
row's bytes as one block (docs/decisions-engine.md).
"""

from __future__ import annotations

import numpy as np

from chainrows.engine._jit import jit
from chainrows.engine.batch import readonly
from chainrows.engine.buffers import empty
from chainrows.engine.chunks import even_chunks
from chainrows.engine.threads import run

# Below this many bytes a copy runs on the calling thread: a part handed to another thread waits
# for a time slice while other threads keep the cores busy (the Parquet encoders of a merge),
# far longer than a small copy takes (docs/decisions-engine.md).
PARALLEL_MIN_BYTES = 16 << 20


@jit
def _scatter_rows(chunks, src_off, content, rows, dst, width, out):
    """Copy rows ``rows[chunks[0]:chunks[-1]]`` of the ragged bytes (``src_off`` in items of
    ``width`` bytes, ``content`` uint8) to ``out`` at byte ``dst[j] * width`` each."""
    for j in range(chunks[0], chunks[-1]):
        s = src_off[rows[j]] * width
        d = dst[j] * width
        src = content[s:s + (src_off[rows[j] + 1] - src_off[rows[j]]) * width]
        target = out[d:d + len(src)]
        for i in range(len(src)):
            target[i] = src[i]


def _checked_offsets(offsets: np.ndarray, content: np.ndarray) -> np.ndarray:
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    if len(offsets) > 1 and (offsets[0] < 0 or offsets[-1] > len(content) or np.any(np.diff(offsets) < 0)):
        raise ValueError("offsets outside the content")
    return offsets


def take_ragged(offsets: np.ndarray, content: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``idx`` of the ragged column (int64 ``offsets`` of length rows + 1, ``content`` a
    1-D array): returns (new offsets, new content). Offsets must be non-decreasing and within
    ``content``; ``idx`` within the rows (checked here: the kernel does no bounds checks)."""
    return take_ragged_chunks([offsets], [content], idx)


def take_ragged_chunks(offsets: list[np.ndarray], contents: list[np.ndarray],
                       idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``take_ragged`` over a column stored in chunks (``offsets[c]``, ``contents[c]``, all of
    one dtype), ``idx`` counting rows across the chunks in order: each chunk's rows are copied
    straight into the result, without concatenating the chunks first."""
    if len(offsets) != len(contents) or not contents:
        raise ValueError("one offsets array per content chunk, at least one")
    offsets = [_checked_offsets(o, c) for o, c in zip(offsets, contents)]
    dtype = contents[0].dtype
    if any(c.dtype != dtype for c in contents):
        raise ValueError("content chunks of different types")
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    starts = np.zeros(len(offsets) + 1, dtype=np.int64)
    np.cumsum([len(o) - 1 for o in offsets], out=starts[1:])
    if len(idx) and (idx.min() < 0 or idx.max() >= starts[-1]):
        raise ValueError("row index outside the column")
    chunk_of = np.searchsorted(starts[1:], idx, side="right") if len(offsets) > 1 else np.zeros(len(idx), np.int64)
    local = idx - starts[chunk_of]
    picks = [np.flatnonzero(chunk_of == c) for c in range(len(offsets))] if len(offsets) > 1 \
        else [np.arange(len(idx))]  # positions in idx of each chunk's rows
    lengths = np.empty(len(idx), dtype=np.int64)
    for o, sel in zip(offsets, picks):
        lengths[sel] = o[local[sel] + 1] - o[local[sel]]
    dst_off = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(lengths, out=dst_off[1:])
    width = dtype.itemsize
    out = empty(int(dst_off[-1]) * width, np.uint8)  # Arrow's pool: freed pages are reused
    for o, content, sel in zip(offsets, contents, picks):
        if len(sel):
            args = (readonly(o), readonly(np.ascontiguousarray(content).view(np.uint8)),
                    readonly(np.ascontiguousarray(local[sel])), readonly(dst_off[sel]), width, out)
            whole = np.array([0, len(sel)], dtype=np.int64)  # one chunk: run() keeps it on this thread
            run(_scatter_rows, even_chunks(len(sel)) if lengths[sel].sum() * width >= PARALLEL_MIN_BYTES
                else whole, *args)
    return dst_off, out.view(dtype)
