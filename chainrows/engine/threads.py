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

import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numba
import numpy as np

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_KERNEL_THREADS = "chainrows-kernel"  # the pool's thread names start with this


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
            _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=_KERNEL_THREADS)
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
    _run_parts([functools.partial(kernel, chunks[a:b + 1], *args)
                for a, b in parts(n_chunks, numba.get_num_threads())])


@dataclass(frozen=True)
class Step:
    """Kernels that run one after the other over the same chunks: ``kernel(chunks[a:b + 1],
    *args)`` for each (kernel, args) of ``calls``, in order, on a range of chunks;
    ``weight_off``: the cumulative weight at each chunk bound (int64, ``len(chunks)`` of them),
    which :func:`run_steps` evens out across threads."""

    chunks: np.ndarray
    weight_off: np.ndarray
    calls: tuple


def step_parts(steps: list[Step], n_threads: int) -> list[list[tuple[int, int, int]]]:
    """The chunks of all ``steps``, in order, cut into at most ``n_threads`` contiguous parts of
    about equal weight (cuts fall on chunk bounds): per part, its (step, first chunk bound, last
    chunk bound) ranges, in step order, none empty."""
    sizes = [max(len(s.chunks) - 1, 0) for s in steps]
    total = sum(sizes)
    if total <= 0:
        return []
    weight = np.zeros(total + 1, dtype=np.float64)
    np.cumsum(np.concatenate([np.diff(s.weight_off) for s in steps if len(s.chunks) > 1]), out=weight[1:])
    n = max(1, min(n_threads, total))
    cuts = np.searchsorted(weight, weight[-1] * np.arange(1, n) / n, side="left")
    cuts = np.unique(np.concatenate(([0], np.minimum(cuts, total), [total]))).tolist()
    first = np.concatenate(([0], np.cumsum(sizes))).tolist()  # global index of each step's chunk 0
    out = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        out.append([(k, max(lo, first[k]) - first[k], min(hi, first[k + 1]) - first[k])
                    for k in range(len(steps)) if max(lo, first[k]) < min(hi, first[k + 1])])
    return out


def run_steps(steps: list[Step]) -> None:
    """Every step's calls over all of its chunks, on ``numba.get_num_threads()`` threads at once:
    the chunks of all steps split by :func:`step_parts`, one part per thread, each thread doing
    its ranges step by step, a range's calls in order. One wait for all, where :func:`run` per
    kernel and step would wait after each (tens of waits for one gather, each on its slowest
    part). Within a range a call sees what the calls before it wrote for the same chunks.
    Ranges on different threads run at the same time: an output two of them write must come
    out right in any interleaving of their writes (disjoint outputs do; the row copy's checks
    argue their own, chainrows.engine.gather.copy_check_logprobs). An error in any part is
    raised after every part has run to its end."""
    split = step_parts(steps, numba.get_num_threads())

    def do(ranges):
        for k, a, b in ranges:
            chunks = steps[k].chunks[a:b + 1]
            for kernel, args in steps[k].calls:
                kernel(chunks, *args)

    if split:
        _run_parts([functools.partial(do, ranges) for ranges in split])


def run_jobs(jobs: list) -> None:
    """Call each of ``jobs`` (no arguments): with one thread, in order, the first error raised
    at once; with more, side by side as :func:`_run_parts` does, every job finished on return
    and the error of the first failing job in list order raised. Either way the error raised is
    the one the jobs run in order would give, provided no job's safety depends on another's
    checks.

    A job other than the first runs on a kernel thread: it must not itself split work across
    threads (``run``, ``run_steps``, ``run_jobs``), which would wait for the kernel threads
    from one of them. Called from a kernel thread, the jobs run in order there."""
    if numba.get_num_threads() <= 1 or threading.current_thread().name.startswith(_KERNEL_THREADS):
        for job in jobs:
            job()
        return
    _run_parts(jobs)


def _run_parts(jobs: list) -> None:
    """Call each of ``jobs`` (no arguments), the first here and the others on the kernel
    threads; all finished on return, an error in any raised after every job has stopped."""
    if len(jobs) == 1:
        jobs[0]()
        return
    futures, here = [], [jobs[0]]
    error = None  # the first job's error, else the first failing submitted job's
    try:  # from the first submit on, an error or interrupt still waits for the submitted parts:
        # a kernel may read memory only the caller keeps alive (e.g. chunks passed by address)
        pool = _pool()
        for job in jobs[1:]:
            try:
                futures.append(pool.submit(job))
            except RuntimeError:  # the interpreter is shutting down: no new threads, run it here
                here.append(job)
        for job in here:
            job()
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
