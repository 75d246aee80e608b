"""Kernels' growable arrays: an array with room for ``n`` values, doubled when it is full (the
kernels that write as much as they find: a JSON scan, a trie)."""

from __future__ import annotations

import numpy as np

from chainrows.engine.jit import jit


@jit
def grow(a, n):
    """``a`` (1-D) with room for at least ``n`` values: ``a`` itself when it has it, else a new
    array of max(n, 2 * len(a)) values holding ``a``'s at the start (the rest uninitialized)."""
    if n <= len(a):
        return a
    b = np.empty(max(n, 2 * len(a)), a.dtype)
    b[:len(a)] = a
    return b
