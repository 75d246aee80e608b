"""Kernel: gather rows of a ragged (offsets + content) column, as bytes.

Plain-Python definition: ``out = concat(content[offsets[i] * w:offsets[i + 1] * w] for i in idx)``
with ``w`` the item width in bytes, and ``out_off`` the running sums of those lengths.
pyarrow's ``take`` on list columns builds the result element by element; this copies each
row's bytes as one block (docs/decisions-engine.md).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

from chainrows.engine.batch import readonly
from chainrows.engine.buffers import empty
from chainrows.engine.chunks import even_chunks
from chainrows.engine.jit import jit
from chainrows.engine.streamcopy import copy_run, store_fence, stream_from
from chainrows.engine.threads import run

# Below this many bytes a copy runs on the calling thread: a part handed to another thread waits
# for a time slice while other threads keep the cores busy (the Parquet encoders of a merge),
# far longer than a small copy takes (docs/decisions-engine.md).
PARALLEL_MIN_BYTES = 16 << 20


@intrinsic
def _byte_pointer(typingctx, address):
    """The int64 ``address`` as a uint8 pointer, for ``numba.carray``."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.uint8)))
    return types.CPointer(types.uint8)(types.int64), codegen


@jit
def _gather_rows(chunks, chunk_address, chunk_bytes, row_chunk, src, dst, out, stream_bytes):
    """Copy rows ``chunks[0]:chunks[-1]``: row ``j``'s bytes ``[src[j], src[j] + dst[j + 1] -
    dst[j])`` of chunk ``row_chunk[j]`` to ``out[dst[j]:dst[j + 1]]``.

    A chunk is ``chunk_bytes[c]`` bytes at address ``chunk_address[c]`` (int64): one array of
    addresses passes any number of chunks in one call, where a typed list of arrays costs
    microseconds per chunk to build. The caller keeps the chunks alive and checks every row's
    range against its chunk's size. ``row_chunk``, ``src``, ``dst``: int64 (``dst`` one longer).
    A row of at least ``stream_bytes`` is streamed (``streamcopy.copy_run``; ``stream_from``
    of len(out))."""
    for j in range(chunks[0], chunks[-1]):
        c = row_chunk[j]
        n = dst[j + 1] - dst[j]
        chunk = numba.carray(_byte_pointer(chunk_address[c]), chunk_bytes[c])
        copy_run(out, dst[j], chunk, src[j], n, stream_bytes)
    store_fence()


def _checked_offsets(offsets: list[np.ndarray], contents: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """The chunks' offsets end to end (int64), where each chunk's offsets start in it, and each
    chunk's number of items (int64); ValueError unless every chunk's offsets are non-decreasing,
    start at 0 or later and end within its content (one vectorised pass, whatever the number of
    chunks: the kernel trusts them)."""
    counts = np.array([len(o) for o in offsets], dtype=np.int64)
    if np.any(counts < 1):
        raise ValueError("offsets of a chunk are empty (need rows + 1 entries)")
    base = np.zeros(len(offsets), dtype=np.int64)
    np.cumsum(counts[:-1], out=base[1:])
    flat = np.concatenate(offsets).astype(np.int64, copy=False)
    last = base + counts - 1
    steps = np.diff(flat)
    steps[last[:-1]] = 0  # from one chunk's last entry to the next chunk's first: not a row
    sizes = np.array([len(c) for c in contents], dtype=np.int64)
    if np.any(flat[base] < 0) or np.any(flat[last] > sizes) or np.any(steps < 0):
        raise ValueError("offsets outside the content")
    return flat, base, sizes


def take_ragged(offsets: np.ndarray, content: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``idx`` of the ragged column (int64 ``offsets`` of length rows + 1, ``content`` a
    1-D array): returns (new offsets, new content). Offsets must be non-decreasing and within
    ``content``; ``idx`` within the rows (checked here: the kernel does no bounds checks)."""
    return take_ragged_chunks([offsets], [content], idx)


def take_ragged_chunks(offsets: list[np.ndarray], contents: list[np.ndarray],
                       idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``take_ragged`` over a column stored in chunks (``offsets[c]``, ``contents[c]``, all of
    one dtype), ``idx`` counting rows across the chunks in order: each chunk's rows are copied
    straight into the result, without concatenating the chunks first, by one kernel call over
    all the rows (a merge's row group takes rows from dozens of chunks: a call per chunk cost
    more than the copy, docs/decisions-engine.md)."""
    if len(offsets) != len(contents) or not contents:
        raise ValueError("one offsets array per content chunk, at least one")
    dtype = contents[0].dtype
    if any(c.dtype != dtype for c in contents):
        raise ValueError("content chunks of different types")
    flat, base, sizes = _checked_offsets(offsets, contents)
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    starts = np.zeros(len(offsets) + 1, dtype=np.int64)  # each chunk's first row
    np.cumsum(np.diff(base, append=len(flat)) - 1, out=starts[1:])
    if len(idx) and (idx.min() < 0 or idx.max() >= starts[-1]):
        raise ValueError("row index outside the column")
    row_chunk = np.searchsorted(starts[1:], idx, side="right") if len(offsets) > 1 else np.zeros(len(idx), np.int64)
    at = base[row_chunk] + (idx - starts[row_chunk])  # each row's entry in flat
    width = dtype.itemsize
    src = flat[at] * width
    dst_off = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(flat[at + 1] - flat[at], out=dst_off[1:])
    out = empty(int(dst_off[-1]) * width, np.uint8)  # Arrow's pool: freed pages are reused
    if len(idx):
        contents = [np.ascontiguousarray(c) for c in contents]  # alive until the kernel returns
        address = np.array([c.__array_interface__["data"][0] for c in contents], dtype=np.int64)
        whole = np.array([0, len(idx)], dtype=np.int64)  # one chunk: run() keeps it on this thread
        run(_gather_rows, even_chunks(len(idx)) if len(out) >= PARALLEL_MIN_BYTES else whole,
            readonly(address), readonly(sizes * width), readonly(row_chunk), readonly(src),
            readonly(dst_off * width), out, stream_from(len(out)))
    return dst_off, out.view(dtype)
