"""Bin packing for :func:`chainrows.batches.iter_packed`: rows (by token count) into bins of a
token budget, the number of bins a multiple of the data-parallel world size, and bins dealt to
ranks so that every rank gets as many bins and about as many tokens as every other.

Plain Python and numpy over one window of rows (a few thousand): one loop step per row, never
per token. The base layer may not import the engine's Numba kernels, and the loop is measured
cheap next to reading the rows (docs/trainers.md, "Packed batches").
"""

from __future__ import annotations

import heapq

import numpy as np

__all__ = ["plan_bins", "first_fit_decreasing", "deal_bins"]


def _round_up(n: int, k: int) -> int:
    return -(-n // k) * k


def plan_bins(lengths: np.ndarray, capacity: int, multiple: int = 1) -> list[np.ndarray]:
    """Pack items of ``lengths`` (each at most ``capacity``) into bins of at most ``capacity``
    in total; the number of bins is a multiple of ``multiple``. Returns each bin's item
    positions (into ``lengths``), longest item first.

    Items go longest first (ties in the given order, so a caller shuffles to break ties at
    random) into the least loaded bin (LPT), with the fewest bins the total allows, rounded up
    to ``multiple``; bins come out balanced. When that fails, first-fit decreasing (FFD) is
    run, and LPT tried again with ``multiple`` and ``2 * multiple`` more bins, then with FFD's
    count rounded up; when all fail, FFD's own bins are used (spread into the extra bins one
    smallest item at a time). So never more bins than FFD rounded up to ``multiple``. A bin is
    empty only when there are fewer items than bins. Deterministic: the result depends only on
    the arguments.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if n == 0:
        return []
    if int(lengths.max()) > capacity:
        raise ValueError(f"an item of {int(lengths.max())} exceeds the capacity {capacity}")
    order = np.argsort(-lengths, kind="stable")
    sizes = lengths[order].tolist()
    k = _round_up(max(-(-int(lengths.sum()) // capacity), 1), multiple)
    bins = _lpt(sizes, capacity, k)
    if bins is None:
        ffd = first_fit_decreasing(sizes, capacity)
        k_ffd = _round_up(len(ffd), multiple)
        for tried in sorted({min(k + multiple, k_ffd), min(k + 2 * multiple, k_ffd), k_ffd} - {k}):
            bins = _lpt(sizes, capacity, tried)
            if bins is not None:
                break
        if bins is None:
            bins = _spread(ffd, k_ffd)
    return [order[np.asarray(b, dtype=np.int64)] for b in bins]


def _lpt(sizes: list[int], capacity: int, k: int) -> list[list[int]] | None:
    """Each item (sizes sorted descending) into the least loaded of ``k`` bins (then the one
    with fewest items, then the lowest index); None when an item fits in none."""
    heap = [(0, 0, b) for b in range(k)]
    bins: list[list[int]] = [[] for _ in range(k)]
    for i, s in enumerate(sizes):
        load, count, b = heap[0]
        if load + s > capacity:
            return None
        heapq.heapreplace(heap, (load + s, count + 1, b))
        bins[b].append(i)
    return bins


def first_fit_decreasing(sizes: list[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: each item (``sizes`` sorted descending, each ≤ ``capacity``)
    into the first bin with room, a new bin when none has; positions into ``sizes``."""
    room = np.full(max(len(sizes), 1), capacity, dtype=np.int64)
    bins: list[list[int]] = []
    for i, s in enumerate(sizes):
        b = int(np.argmax(room[:len(bins) + 1] >= s))  # the unopened bin at len(bins) has room
        if b == len(bins):
            bins.append([])
        bins[b].append(i)
        room[b] -= s
    return bins


def _spread(bins: list[list[int]], k: int) -> list[list[int]]:
    """``bins`` grown to ``k`` bins: each new bin takes the smallest item of the bin with the
    most items (empty bins only once every bin holds one item)."""
    bins = [list(b) for b in bins]
    while len(bins) < k:
        most = max(range(len(bins)), key=lambda b: (len(bins[b]), -b)) if bins else None
        if most is None or len(bins[most]) < 2:
            bins.append([])
        else:
            bins.append([bins[most].pop()])
    return bins


def deal_bins(loads: np.ndarray, world_size: int) -> list[list[int]]:
    """Deal bins (their token ``loads``; the count a multiple of ``world_size``) to ranks: each
    rank gets ``len(loads) // world_size`` bins; heaviest bin first, each to the rank with the
    fewest tokens among those still short of bins (lowest rank on ties). Returns each rank's
    bin indices, in the order dealt. The token totals of two ranks differ by at most the
    heaviest bin's load."""
    k = len(loads)
    if k % world_size:
        raise ValueError(f"{k} bins cannot be dealt evenly to {world_size} ranks")
    per = k // world_size
    dealt: list[list[int]] = [[] for _ in range(world_size)]
    totals = [0] * world_size
    for b in np.argsort(-np.asarray(loads, dtype=np.int64), kind="stable").tolist():
        r = min((r for r in range(world_size) if len(dealt[r]) < per), key=lambda r: (totals[r], r))
        dealt[r].append(b)
        totals[r] += int(loads[b])
    return dealt
