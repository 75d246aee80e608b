"""Kernel: gather rows of a ragged (offsets + content) column, as bytes.

Plain-Python definition: ``out = concat(content[offsets[i] * w:offsets[i + 1] * w] for i in idx)``
with ``w`` the item width in bytes, and ``out_off`` the running sums of those lengths.
pyarrow's ``take`` on list columns builds the result element by element; this copies each
row's bytes as one block (docs/decisions-engine.md).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from chainrows.engine._jit import pjit
from chainrows.engine.batch import readonly

CHUNKS = 64


@pjit
def _gather(src_off, content, idx, width, dst_off, out):
    n = len(idx)
    for kk in prange(CHUNKS):
        for j in range(kk * n // CHUNKS, (kk + 1) * n // CHUNKS):
            s = src_off[idx[j]] * width
            d = dst_off[j] * width
            src = content[s:s + (src_off[idx[j] + 1] - src_off[idx[j]]) * width]
            dst = out[d:d + len(src)]
            for i in range(len(src)):
                dst[i] = src[i]


def take_ragged(offsets: np.ndarray, content: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``idx`` of the ragged column (int64 ``offsets`` of length rows + 1, ``content`` a
    1-D array): returns (new offsets, new content). Offsets must be non-decreasing and within
    ``content``; ``idx`` within the rows (checked here: the kernel does no bounds checks)."""
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    rows = len(offsets) - 1
    if len(idx) and (idx.min() < 0 or idx.max() >= rows):
        raise ValueError("row index outside the column")
    if rows > 0 and (offsets[0] < 0 or offsets[-1] > len(content) or np.any(np.diff(offsets) < 0)):
        raise ValueError("offsets outside the content")
    lengths = offsets[idx + 1] - offsets[idx] if len(idx) else np.zeros(0, np.int64)
    dst_off = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(lengths, out=dst_off[1:])
    width = content.dtype.itemsize
    raw = np.ascontiguousarray(content).view(np.uint8)
    out = np.empty(int(dst_off[-1]) * width, dtype=np.uint8)
    if len(idx):
        _gather(readonly(offsets), readonly(raw), readonly(idx), width, readonly(dst_off), out)
    return dst_off, out.view(content.dtype)
