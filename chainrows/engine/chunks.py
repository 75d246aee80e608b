"""Work split for the kernels run on several threads (chainrows.engine.threads): contiguous
ranges of items (rollouts, calls, strings) of about equal weight."""

from __future__ import annotations

import numba
import numpy as np

CHUNKS_PER_THREAD = 8  # rollout sizes are skewed; several chunks per thread even out the load


def balanced_chunks(weight_off: np.ndarray, n_chunks: int | None = None) -> np.ndarray:
    """Chunk bounds over rollouts: int64[k+1] from 0 to R, each chunk ~ equal weight.

    ``weight_off`` is a cumulative weight per rollout (int64[R+1], e.g. token offsets + 1 per
    rollout so empty rollouts still count).
    """
    R = len(weight_off) - 1
    if n_chunks is None:
        n_chunks = CHUNKS_PER_THREAD * numba.get_num_threads()
    n_chunks = max(1, min(n_chunks, R))
    targets = np.linspace(0, weight_off[-1], n_chunks + 1)[1:-1]
    inner = np.searchsorted(weight_off, targets, side="left").astype(np.int64)
    bounds = np.concatenate(([0], inner, [R])).astype(np.int64)
    return np.unique(bounds)  # sorted, no empty chunks


def even_chunks(n: int) -> np.ndarray:
    """Chunk bounds over ``n`` items of equal weight: int64[k+1] from 0 to n, ``CHUNKS_PER_THREAD``
    chunks per thread (at most n), none empty."""
    k = max(1, min(n, CHUNKS_PER_THREAD * numba.get_num_threads()))
    return np.unique(np.linspace(0, n, k + 1).astype(np.int64))
