"""Kernel: 64-bit FNV-1a of each string of an Arrow-style string array (offsets + bytes).

Used (:func:`hash_strings`) to route rollouts to streaming windows and spill buckets. A second
hash with another offset basis lets the caller detect ids whose first hashes collide
(chainrows.runners.bulk.partition). The per-string function :func:`fnv1a` also places strings in
chainrows.engine.strjoin's tables.
"""

from __future__ import annotations

import numpy as np

from chainrows.engine.chunks import even_chunks
from chainrows.engine.jit import jit
from chainrows.engine.threads import run

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
SECOND_OFFSET = np.uint64(0x84222325CBF29CE4)
FNV_PRIME = np.uint64(0x100000001B3)


@jit(inline="always")
def fnv1a(offsets, data, i, basis):
    """FNV-1a-64 (offset basis ``basis``) of data[offsets[i]:offsets[i+1]], then a final
    avalanche mix."""
    h = basis
    for j in range(offsets[i], offsets[i + 1]):
        h = (h ^ np.uint64(data[j])) * FNV_PRIME
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    return h


@jit
def fnv1a_strings(chunks, offsets, data, basis, out):
    """out[i] = :func:`fnv1a` of string i, for i in chunks[0]:chunks[-1] (split over threads by
    chainrows.engine.threads)."""
    for i in range(chunks[0], chunks[-1]):
        out[i] = fnv1a(offsets, data, i, basis)


def hash_strings(offsets: np.ndarray, data: np.ndarray, basis=FNV_OFFSET) -> np.ndarray:
    """uint64[n]: :func:`fnv1a` (offset basis ``basis``) of each of the n strings of int64
    ``offsets`` (validated by the caller) and uint8 ``data``, on all threads."""
    out = np.empty(len(offsets) - 1, dtype=np.uint64)
    run(fnv1a_strings, even_chunks(len(out)), offsets, data, basis, out)
    return out
