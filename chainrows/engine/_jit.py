"""One place for the jit options of every kernel."""

from __future__ import annotations

import numba

# cache=True: compiled kernels are written next to the source (or NUMBA_CACHE_DIR) so a second
# process starts in well under a second. error_model="numpy": division never raises, and the
# kernels avoid it on their hot paths anyway. boundscheck stays off: every offset and index is
# validated in chainrows.engine.batch before a kernel sees it.
OPTIONS = dict(nogil=True, cache=True, error_model="numpy", boundscheck=False)

# Kernels that split work across threads: NUMBA_NUM_THREADS or numba.set_num_threads (the
# CLI's --threads) decide how many.
PARALLEL_OPTIONS = dict(OPTIONS, parallel=True)


# Helpers called once per call or candidate inside a kernel's loop take inline="always" (Numba IR
# inlining): a jitted call that passes a dozen arrays costs more than the helper's body
# (docs/decisions-engine.md). Each inlined call site is compiled again, so keep those sites few.
def jit(*args, **kwargs):
    """numba.njit with the project's options."""
    return numba.njit(*args, **{**OPTIONS, **kwargs})


def pjit(*args, **kwargs):
    """numba.njit(parallel=True) with the project's options."""
    return numba.njit(*args, **{**PARALLEL_OPTIONS, **kwargs})

