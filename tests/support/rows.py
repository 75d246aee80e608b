"""Rows tables (SPEC §4 ``rows``) written directly, for the trainer-side tests and benchmarks:
lengths drawn from a realistic agent mix, token values from a seed, no reassembly needed."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def agent_lengths(n: int, seed: int, *, median: int = 2000, spread: float = 0.9,
                  longest: int = 32_000) -> np.ndarray:
    """``n`` row lengths, log-normal around ``median`` (agent rows: many short, a long tail),
    at least 8 and at most ``longest`` tokens."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(median), spread, n), 8, longest).astype(np.int64)


def rows_table(lengths, seed: int = 0, *, logprobs: bool = True, group: int = 4, start: int = 0) -> pa.Table:
    """A rows table with one row per length: ids and logprobs from ``seed``; the first
    ``prompt_len`` tokens (a quarter) masked 0, later tokens 1 or 0 at random; one advantage and
    reward per rollout, rollouts in groups of ``group``, each rollout one row of weight 1 or
    two rows of weight 0.5; row ids ``r<k>_s<segment>`` counted from ``start``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    rng = np.random.default_rng(seed)
    n, total = len(lengths), int(lengths.sum())
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    prompt = np.maximum(lengths // 4, 1)
    pos = np.arange(total) - np.repeat(offsets[:-1].astype(np.int64), lengths)
    mask = ((pos >= np.repeat(prompt, lengths)) & (rng.random(total) < 0.7)).astype(np.uint8)
    rollout = np.cumsum(np.r_[0, rng.random(n - 1) < 0.7]) if n else np.zeros(0, np.int64)
    segments = np.bincount(rollout)[rollout] if n else np.zeros(0, np.int64)
    segment = np.arange(n) - np.searchsorted(rollout, rollout)
    adv = rng.normal(size=int(rollout.max()) + 1 if n else 0).astype(np.float32)
    cols = {
        "row_id": pa.array([f"r{start + r}_s{s}" for r, s in zip(rollout.tolist(), segment.tolist())]),
        "rollout_id": pa.array([f"r{start + r}" for r in rollout.tolist()]),
        "group_id": pa.array([f"g{(start + r) // group}" for r in rollout.tolist()]),
        "segment": pa.array(segment, type=pa.int32()),
        "num_segments": pa.array(segments, type=pa.int32()),
        "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(
            rng.integers(0, 50_000, total, dtype=np.int32))),
        "loss_mask": pa.ListArray.from_arrays(pa.array(offsets), pa.array(mask)),
    }
    if logprobs:
        lp = np.where(mask == 1, -rng.exponential(1.0, total), 0.0).astype(np.float32)
        cols["logprobs"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(lp))
    cols["prompt_len"] = pa.array(prompt, type=pa.int32())
    cols["reward"] = pa.array(adv[rollout].astype(np.float64) if n else [], type=pa.float64())
    cols["advantage"] = pa.array(adv[rollout] if n else [], type=pa.float32())
    cols["weight"] = pa.array((1.0 / np.maximum(segments, 1)).astype(np.float32), type=pa.float32())
    return pa.table(cols)
