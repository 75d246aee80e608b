"""Kernel: 64-bit FNV-1a of each string of an Arrow-style string array (offsets + bytes).

Used to route rollouts to streaming windows and spill buckets. A second hash with another offset
basis lets the caller detect ids whose first hashes collide (chainrows.io.partition). The
per-string function :func:`fnv1a` also places strings in chainrows.engine.strjoin's tables.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from chainrows.engine._jit import jit, pjit

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


@pjit
def fnv1a_strings(offsets, data, basis, out):
    """out[i] = :func:`fnv1a` of string i."""
    for i in prange(len(offsets) - 1):
        out[i] = fnv1a(offsets, data, i, basis)
