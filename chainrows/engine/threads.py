"""Run a serial kernel on several threads, each thread on one contiguous part of its chunks.

Kernels are compiled without ``parallel=True``: Numba's parallel lowering compiles every
kernel's loop body a second time, as a gufunc, and doubled the cold compile for no run-time
gain here (docs/decisions-engine.md "Threads"). Instead every kernel that splits its work takes
``chunks`` first (int64 bounds over its items: rollouts, calls, strings) and does the items of
``chunks[0]:chunks[-1]``, chunk by chunk; jitted with ``nogil=True``, its call releases the GIL,
so plain Python threads run the parts side by side.

Thread count: the calling thread's ``numba.get_num_threads()``, as for Numba's own parallel
kernels. Numba's setting is per thread: ``numba.set_num_threads`` (the CLI's ``--threads``) sets
it for the thread that calls it, a new thread starts at ``NUMBA_NUM_THREADS``, and helper
threads that call kernels take their creator's through :func:`inherit_threads`. Parts are split
statically, the first run by the calling thread, as Numba's parfors scheduler splits a prange.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _forget_pool() -> None:
    """In a forked child: the parent's threads (and a lock one of them may hold) do not exist."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _pool() -> ThreadPoolExecutor:
    """The kernel threads: NUMBA_NUM_THREADS - 1 of them (the caller is the last one)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            workers = max(1, numba.config.NUMBA_NUM_THREADS - 1)
            _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="chainrows-kernel")
        return _POOL


def parts(n_chunks: int, n_threads: int) -> list[tuple[int, int]]:
    """``n_threads`` contiguous (first, last) chunk-index ranges covering ``n_chunks`` chunks
    (fewer when there are fewer chunks), each of ``n_chunks // n_threads`` or one more."""
    n = max(1, min(n_threads, n_chunks))
    cuts = [i * n_chunks // n for i in range(n + 1)]
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def run(kernel, chunks: np.ndarray, *args) -> None:
    """``kernel(chunks[a:b + 1], *args)`` for each part (a, b) of :func:`parts`, one part per
    thread, all finished on return. The parts must write disjoint outputs (the kernels' own
    contract: a chunk's items write only their own slots). An error in any part is raised
    after every part has stopped."""
    n_chunks = len(chunks) - 1
    if n_chunks <= 0:
        return
    split = parts(n_chunks, numba.get_num_threads())
    if len(split) == 1:
        kernel(chunks, *args)
        return
    futures, here = [], [split[0]]
    error = None
    try:  # from the first submit on, an error or interrupt still waits for the submitted parts:
        # a kernel may read memory only the caller keeps alive (e.g. chunks passed by address)
        pool = _pool()
        for a, b in split[1:]:
            try:
                futures.append(pool.submit(kernel, chunks[a:b + 1], *args))
            except RuntimeError:  # the interpreter is shutting down: no new threads, run it here
                here.append((a, b))
        for a, b in here:
            kernel(chunks[a:b + 1], *args)
    except BaseException as err:  # noqa: BLE001 - re-raised once the other parts are done
        error = err
    for f in futures:
        waited = wait_out(f)  # every part waited for, whatever error came first
        error = error or waited
    if error is not None:
        raise error


def wait_out(future) -> BaseException | None:
    """Wait until ``future`` is done, whatever interrupts come meanwhile: a task left running
    may read memory its caller frees, or write files in a directory its caller removes. Returns
    the first error seen (the task's own, or an interrupt that came while waiting), or None."""
    error = None
    while True:
        try:
            future.result()
        except BaseException as err:  # noqa: BLE001 - returned, for the caller to raise or not
            error = error or err
        if future.done():
            return error


def inherit_threads() -> dict:
    """Keyword arguments for a ``ThreadPoolExecutor`` whose threads call kernels: they start with
    the calling thread's ``numba.get_num_threads()``. Numba's setting is per thread, and a new
    thread starts at ``NUMBA_NUM_THREADS``, so without this ``--threads 1`` would not reach them."""
    return dict(initializer=numba.set_num_threads, initargs=(numba.get_num_threads(),))
