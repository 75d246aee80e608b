"""Kernels: the checks of ``Batch.validate`` that pass over every call, each one loop instead of
numpy's temporaries (docs/decisions-engine.md "Batch validation"), with its plain-Python
definition beside it (``*_py``, what the tests hold the kernel to).

Each kernel reads only what its caller's contract makes safe: every index it follows is one of
its own loop counters or a value the caller has already checked. These are the checks that
make the other kernels safe, so they must not need them.
"""

from __future__ import annotations

import numpy as np

from chainrows.engine.jit import jit


@jit
def first_outside_owner(idx, idx_off, call_off, allow):
    """The first i whose ``idx[i]`` is neither in ``allow`` nor a call of its owner r (the r with
    ``idx_off[r] <= i < idx_off[r + 1]``: ``call_off[r] <= idx[i] < call_off[r + 1]``); -1 when
    every one is. Contract: ``idx_off`` and ``call_off`` are sound offsets (start 0, never fall)
    of as many owners, ``idx_off[-1] == len(idx)``."""
    for r in range(len(idx_off) - 1):
        lo = call_off[r]
        hi = call_off[r + 1]
        for i in range(idx_off[r], idx_off[r + 1]):
            v = idx[i]
            if lo <= v < hi:
                continue
            allowed = False
            for a in allow:
                allowed |= v == a
            if not allowed:
                return i
    return -1


def first_outside_owner_py(idx, idx_off, call_off, allow) -> int:
    owner = np.repeat(np.arange(len(idx_off) - 1, dtype=np.int64), np.diff(idx_off))
    ok = (idx >= call_off[owner]) & (idx < call_off[owner + 1])
    for a in allow:
        ok |= idx == a
    return -1 if ok.all() else int(np.argmin(ok))


@jit
def first_bad_range(start, stop, chunk, sizes, absent):
    """The first i whose range ``start[i]:stop[i]`` (unless ``start[i] == absent``) leaves
    buffer ``chunk[i]`` of ``sizes[chunk[i]]`` items or runs backwards; -1 when none.
    Contract: ``start``, ``stop`` and ``chunk`` as long, every ``chunk[i]`` in
    ``[0, len(sizes))``."""
    for i in range(len(start)):
        s = start[i]
        if s != absent and (s < 0 or stop[i] < s or stop[i] > sizes[chunk[i]]):
            return i
    return -1


def first_bad_range_py(start, stop, chunk, sizes, absent) -> int:
    size = np.asarray(sizes, dtype=np.int64)[chunk]
    bad = (start != absent) & ((start < 0) | (stop < start) | (stop > size))
    return int(np.argmax(bad)) if bad.any() else -1


ORDER_OK, ORDER_OUTSIDE, ORDER_NOT_BY_BUFFER, ORDER_NOT_ONCE = 0, 1, 2, 3


@jit
def order_problem(order, tok_start, tok_chunk, absent):
    """Whether ``order`` lists every call with a token row (``tok_start != absent``) exactly
    once and no call twice, buffer by buffer (``tok_chunk`` never falls along it): the first
    of these that fails, in this order, as ``ORDER_OUTSIDE`` (an entry outside
    ``[0, len(tok_start))``), ``ORDER_NOT_BY_BUFFER``, ``ORDER_NOT_ONCE``; ``ORDER_OK``.
    Contract: ``tok_start`` and ``tok_chunk`` as long."""
    C = len(tok_start)
    for c in order:
        if c < 0 or c >= C:
            return ORDER_OUTSIDE
    for j in range(1, len(order)):
        if tok_chunk[order[j]] < tok_chunk[order[j - 1]]:
            return ORDER_NOT_BY_BUFFER
    seen = np.zeros(C, dtype=np.uint8)
    for c in order:
        if seen[c]:
            return ORDER_NOT_ONCE
        seen[c] = 1
    for c in range(C):
        if tok_start[c] != absent and not seen[c]:
            return ORDER_NOT_ONCE
    return ORDER_OK


def order_problem_py(order, tok_start, tok_chunk, absent) -> int:
    C = len(tok_start)
    if len(order) and (order.min() < 0 or order.max() >= C):
        return ORDER_OUTSIDE
    if np.any(np.diff(tok_chunk[order]) < 0):
        return ORDER_NOT_BY_BUFFER
    seen = np.bincount(order, minlength=C)
    if np.any(seen > 1) or np.any(seen[tok_start != absent] != 1):
        return ORDER_NOT_ONCE
    return ORDER_OK


@jit
def lengths_match(length, call, key_off):
    """``length[j] == key_off[call[j] + 1] - key_off[call[j]]`` for every j. Contract: ``length``
    and ``call`` as long, every ``call[j]`` in ``[0, len(key_off) - 1)``."""
    for j in range(len(call)):
        c = call[j]
        if length[j] != key_off[c + 1] - key_off[c]:
            return False
    return True


def lengths_match_py(length, call, key_off) -> bool:
    return bool(np.all(length == key_off[call + 1] - key_off[call]))
