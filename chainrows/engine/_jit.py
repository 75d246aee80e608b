"""One place for the jit options of every kernel."""

from __future__ import annotations

import os

import numba

# cache=True: compiled kernels are written next to the source (or NUMBA_CACHE_DIR) so a second
# process starts in well under a second. error_model="numpy": division never raises, and the
# kernels avoid it on their hot paths anyway. boundscheck stays off: every offset and index is
# validated in chainrows.engine.batch before a kernel sees it.
OPTIONS = dict(nogil=True, cache=True, error_model="numpy", boundscheck=False)

# Kernels that split work across threads. NUMBA_NUM_THREADS / chainrows.set_threads() decide how many.
PARALLEL_OPTIONS = dict(OPTIONS, parallel=True)

# Small helpers inlined into the kernels that call them.
INLINE_OPTIONS = dict(OPTIONS, inline="always")


def jit(*args, **kwargs):
    """numba.njit with the project's options."""
    return numba.njit(*args, **{**OPTIONS, **kwargs})


def pjit(*args, **kwargs):
    """numba.njit(parallel=True) with the project's options."""
    return numba.njit(*args, **{**PARALLEL_OPTIONS, **kwargs})


DISABLED = os.environ.get("NUMBA_DISABLE_JIT", "0") == "1"
