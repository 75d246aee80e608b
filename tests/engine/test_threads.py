"""chainrows.engine.threads: serial kernels run over parts of their chunks on several threads."""

from __future__ import annotations

import importlib
import os
import pkgutil
import signal
import threading

import numba
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import chainrows
from chainrows.engine.chunks import even_chunks
from chainrows.engine.jit import jit
from chainrows.engine.threads import Step, parts, run, run_steps, step_parts


@jit
def _count_items(chunks, hits):
    for kk in range(len(chunks) - 1):
        for i in range(chunks[kk], chunks[kk + 1]):
            hits[i] += 1


@given(n_chunks=st.integers(1, 200), n_threads=st.integers(1, 9))
def test_parts_cover_every_chunk_once_in_order_and_evenly(n_chunks, n_threads):
    split = parts(n_chunks, n_threads)
    assert len(split) == min(n_chunks, n_threads)
    assert split[0][0] == 0 and split[-1][1] == n_chunks
    assert all(a == b for (_, a), (b, _) in zip(split, split[1:]))  # contiguous
    sizes = [b - a for a, b in split]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [0, 1, 5, 1000])
def test_run_does_every_item_once(threads, n):
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"needs {threads} threads")
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        hits = np.zeros(n, dtype=np.int64)
        run(_count_items, even_chunks(n), hits)
        assert np.array_equal(hits, np.ones(n, dtype=np.int64))
    finally:
        numba.set_num_threads(before)


@jit
def _double_counted(chunks, hits, out):
    """out[i] = 2 * hits[i]: reads what _count_items wrote for the same chunks."""
    for kk in range(len(chunks) - 1):
        for i in range(chunks[kk], chunks[kk + 1]):
            out[i] = 2 * hits[i]


_weights = st.lists(st.lists(st.integers(0, 50), min_size=0, max_size=12), min_size=1, max_size=6)


@given(weights=_weights, n_threads=st.integers(1, 5))
def test_step_parts_cover_every_chunk_once_in_order_and_even_out_the_weight(weights, n_threads):
    steps = [Step(np.arange(len(w) + 1, dtype=np.int64), np.concatenate(([0], np.cumsum(w))).astype(np.int64), ())
             for w in weights]
    split = step_parts(steps, n_threads)
    flat = [(k, c) for ranges in split for k, a, b in ranges for c in range(a, b)]
    assert flat == [(k, c) for k, w in enumerate(weights) for c in range(len(w))]  # each once, in order
    assert len(split) <= n_threads and all(a < b for ranges in split for _, a, b in ranges)
    chunk_w = [x for w in weights for x in w]
    if chunk_w:
        part_w = [sum(weights[k][c] for k, a, b in ranges for c in range(a, b)) for ranges in split]
        assert max(part_w) <= sum(chunk_w) / len(split) + max(chunk_w)


@given(sizes=st.lists(st.integers(0, 12), min_size=1, max_size=6), n_threads=st.integers(1, 5))
def test_step_parts_of_equal_weights_use_every_thread_evenly(sizes, n_threads):
    steps = [Step(np.arange(n + 1, dtype=np.int64), np.arange(n + 1, dtype=np.int64), ()) for n in sizes]
    split = step_parts(steps, n_threads)
    chunks_per_part = [sum(b - a for _, a, b in ranges) for ranges in split]
    assert len(split) == min(n_threads, sum(sizes))
    assert not chunks_per_part or max(chunks_per_part) - min(chunks_per_part) <= 1


def test_step_parts_skip_steps_without_chunks():
    empty = np.zeros(0, dtype=np.int64)
    steps = [Step(empty, empty, ()), Step(np.array([0]), np.array([0]), ()), Step(np.array([0, 4]), np.array([0, 4]), ())]
    assert step_parts(steps, 2) == [[(2, 0, 1)]]
    assert step_parts(steps[:2], 2) == []


@pytest.mark.parametrize("threads", [1, 2])
def test_run_steps_runs_each_steps_calls_in_order_over_every_item_once(threads):
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"needs {threads} threads")
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        sizes = [1000, 0, 7, 300]
        hits = [np.zeros(n, dtype=np.int64) for n in sizes]
        out = [np.zeros(n, dtype=np.int64) for n in sizes]
        steps = [Step(even_chunks(n), np.arange(len(even_chunks(n)), dtype=np.int64) * 10,
                      ((_count_items, (h,)), (_double_counted, (h, o)))) for n, h, o in zip(sizes, hits, out)]
        run_steps(steps)
        for n, h, o in zip(sizes, hits, out):
            assert np.array_equal(h, np.ones(n, dtype=np.int64)) and np.array_equal(o, 2 * h)
    finally:
        numba.set_num_threads(before)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 threads")
@pytest.mark.parametrize("threads", [1, 2])
def test_run_jobs_raises_the_first_jobs_error_and_runs_in_place_on_a_kernel_thread(threads):
    """run_jobs: with two failing jobs, the first's error (at 2 threads after the second has
    finished, on another thread; at 1 the second never runs); called from a kernel thread, the
    jobs run there in order (waiting for the one kernel thread from it would never end)."""
    from chainrows.engine import threads as th

    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    where = []

    def job(name, fails):
        def f():
            where.append((name, threading.current_thread().name))
            if fails:
                raise ValueError(name)
        return f

    try:
        with pytest.raises(ValueError, match="first"):
            th.run_jobs([job("first", True), job("second", True)])
        ran = dict(where)
        assert list(ran) == ["first"] if threads == 1 else sorted(ran) == ["first", "second"]
        assert ran["first"] == threading.current_thread().name
        if threads == 2:
            assert ran["second"].startswith("chainrows-kernel")
        where.clear()
        nested = th._pool().submit(th.run_jobs, [job("a", False), job("b", False)])
        nested.result(timeout=30)
        kernel_thread = where[0][1]
        assert [n for n, _ in where] == ["a", "b"] and all(t == kernel_thread for _, t in where)
    finally:
        numba.set_num_threads(before)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 threads")
@pytest.mark.parametrize("how", ["run", "run_steps"])
def test_parts_run_on_two_threads_and_an_error_waits_for_the_others(how):
    """run: chunks [0, 3, 6, 9] in parts (0, 3) and (3, 9); run_steps: two steps of equal weight,
    one whole step per thread. The first part fails while the second still runs."""
    before = numba.get_num_threads()
    numba.set_num_threads(2)
    seen, done = [], threading.Event()

    def kernel(chunks, step):
        seen.append((threading.get_ident(), step, int(chunks[0]), int(chunks[-1])))
        if step == 0 or (step is None and chunks[0] == 0):
            raise ValueError("first part fails")
        done.wait(5)  # the other part still runs when the first has failed
        seen.append("second part finished")

    try:
        threading.Timer(0.2, done.set).start()
        with pytest.raises(ValueError, match="first part fails"):
            if how == "run":
                run(kernel, np.array([0, 3, 6, 9], dtype=np.int64), None)
            else:
                run_steps([Step(np.array([0, 2, 4]), np.array([0, 1, 2]), ((kernel, (0,)),)),
                           Step(np.array([0, 3, 6]), np.array([0, 1, 2]), ((kernel, (1,)),))])
        assert seen[-1] == "second part finished"  # returned only after it
        starts = [s for s in seen if isinstance(s, tuple)]
        expected = {(None, 0, 3), (None, 3, 9)} if how == "run" else {(0, 0, 4), (1, 0, 6)}
        assert len(starts) == 2 and {(k, a, b) for _, k, a, b in starts} == expected
        assert starts[0][0] != starts[1][0]  # two threads
    finally:
        numba.set_num_threads(before)


@pytest.mark.skipif(not hasattr(os, "fork") or numba.config.NUMBA_NUM_THREADS < 2, reason="needs fork, 2 threads")
def test_a_forked_child_gets_its_own_kernel_threads():
    before = numba.get_num_threads()
    numba.set_num_threads(2)
    try:
        run(_count_items, even_chunks(100), np.zeros(100, dtype=np.int64))  # the parent's pool exists
        pid = os.fork()
        if pid == 0:  # child: the parent's threads are gone; a stale pool would hang here
            signal.alarm(20)
            hits = np.zeros(100, dtype=np.int64)
            run(_count_items, even_chunks(100), hits)
            os._exit(0 if hits.sum() == 100 else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        numba.set_num_threads(before)


def test_no_kernel_is_compiled_parallel():
    """parallel=True compiles a kernel's loop body twice and doubled the cold compile; kernels
    that split work go through chainrows.engine.threads instead."""
    dispatchers = []
    for info in pkgutil.walk_packages(chainrows.__path__, "chainrows."):
        if info.name.startswith("chainrows.runners.ray") or info.name.endswith("__main__"):  # Ray: optional
            continue
        module = importlib.import_module(info.name)
        dispatchers += [v for v in vars(module).values() if isinstance(v, numba.core.registry.CPUDispatcher)]
    assert len(dispatchers) > 20
    assert [d.py_func.__name__ for d in dispatchers if d.targetoptions.get("parallel")] == []



@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 threads")
def test_helper_threads_inherit_the_callers_thread_count():
    """Numba's count is per thread (a new one starts at NUMBA_NUM_THREADS): the bulk path's
    reader and keeper threads take the caller's, so --threads 1 reaches their kernels."""
    from concurrent.futures import ThreadPoolExecutor

    from chainrows.engine.threads import inherit_threads

    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        with ThreadPoolExecutor(1) as plain, ThreadPoolExecutor(1, **inherit_threads()) as inheriting:
            assert plain.submit(numba.get_num_threads).result() == numba.config.NUMBA_NUM_THREADS
            assert inheriting.submit(numba.get_num_threads).result() == 1
    finally:
        numba.set_num_threads(before)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 threads")
def test_build_helper_runs_each_task_with_its_submitters_thread_count():
    """build_batch's helper thread serves callers of any thread count: a task runs with the
    count of the thread that submitted it, not with what an earlier task left there."""
    import pyarrow as pa

    from chainrows.lowering import columnar

    before, arrow_before = numba.get_num_threads(), pa.cpu_count()
    pa.set_cpu_count(max(2, arrow_before))  # the helper runs only with Arrow on more than one thread
    try:
        numba.set_num_threads(2)
        columnar._submit(numba.set_num_threads, 1).result()  # leaves the helper thread at 1
        assert columnar._submit(numba.get_num_threads).result() == 2
        assert columnar._submit(lambda: threading.current_thread().name).result().startswith("chainrows-build")
    finally:
        numba.set_num_threads(before)
        pa.set_cpu_count(arrow_before)


@pytest.mark.skipif(not hasattr(os, "fork") or numba.config.NUMBA_NUM_THREADS < 2, reason="needs fork, 2 threads")
def test_a_forked_child_gets_its_own_build_helper():
    """build_batch's helper thread is gone in a forked child as well: a task submitted to the
    parent's pool would wait forever."""
    import pyarrow as pa

    from chainrows.lowering import columnar

    before, arrow_before = numba.get_num_threads(), pa.cpu_count()
    numba.set_num_threads(2)
    pa.set_cpu_count(max(2, arrow_before))
    try:
        assert columnar._submit(lambda: 7).result() == 7  # the parent's helper exists
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)
            os._exit(0 if columnar._submit(lambda: 7).result() == 7 else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        numba.set_num_threads(before)
        pa.set_cpu_count(arrow_before)


def test_parts_run_on_the_caller_when_no_thread_can_be_started(monkeypatch):
    """After interpreter shutdown has begun, ThreadPoolExecutor.submit raises RuntimeError: the
    parts it refused run on the calling thread, and the ones it took are still waited for."""
    from chainrows.engine import threads

    class HalfShutDown:
        def __init__(self):
            self.real, self.taken = threads.ThreadPoolExecutor(1), 0

        def submit(self, fn, *args):
            if self.taken:
                raise RuntimeError("cannot schedule new futures after interpreter shutdown")
            self.taken += 1
            return self.real.submit(fn, *args)

    pool = HalfShutDown()
    monkeypatch.setattr(threads, "_pool", lambda: pool)
    monkeypatch.setattr(threads, "parts", lambda n_chunks, n_threads: [(0, 1), (1, 2), (2, 3)])
    monkeypatch.setattr(numba, "get_num_threads", lambda: 3)
    hits = np.zeros(30, dtype=np.int64)
    try:
        run(_count_items, np.array([0, 10, 20, 30], dtype=np.int64), hits)
    finally:
        pool.real.shutdown()
    assert pool.taken == 1 and np.array_equal(hits, np.ones(30, dtype=np.int64))
