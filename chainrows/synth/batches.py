"""Which batches, built where: rollout ranges of whole blocks, built in this process or in
``spawn``ed workers and consumed in order; ``iter_synth_batches`` and ``synth_tables``.

The concatenation of all batches is the same for any batch size or worker count: every rollout
is a pure function of (seed, index) and every batch is whole blocks (``BLOCK``)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pyarrow as pa

from chainrows.synth.harness import Cfg, make_cfg
from chainrows.synth.params import BLOCK, DEFAULT_BATCH_ROLLOUTS, DEFAULTS, SynthParams
from chainrows.synth.tables import build_batch, tables_schemas

_WORKER_CFG: dict = {}


def _batch_job(seed: int, params: SynthParams, first: int, stop: int):
    """One batch, in a worker process (the config is built once per worker)."""
    key = (seed, params)
    cfg = _WORKER_CFG.get(key)
    if cfg is None:
        _WORKER_CFG.clear()
        cfg = _WORKER_CFG[key] = Cfg(seed, params)
    return build_batch(cfg, first, stop)


def _resolve_workers(workers: int | None) -> int:
    if workers is None or workers <= 0:
        return max(1, os.cpu_count() or 1)
    return int(workers)


def iter_tables(n_rollouts: int, seed: int, batch_rollouts: int, kw: dict,
          workers: int | None = 1) -> Iterator[tuple[tuple, dict]]:
    """(tables, stats) per batch; the arguments are checked on the first ``next``."""
    if n_rollouts < 0:
        raise ValueError("n_rollouts must be >= 0")
    if batch_rollouts < 1:
        raise ValueError("batch_rollouts must be >= 1")
    cfg = make_cfg(seed, kw)  # validates the arguments here, in the caller's process
    step = max(BLOCK, -(-int(batch_rollouts) // BLOCK) * BLOCK)
    ranges = [(a, min(a + step, n_rollouts)) for a in range(0, n_rollouts, step)]
    workers = _resolve_workers(workers)
    if workers == 1 or len(ranges) < 2:
        for a, b in ranges:
            yield build_batch(cfg, a, b)
        return
    # Worker processes build batches (pure Python + numpy: threads would not help); the caller
    # consumes them in order. "spawn": safe whatever threads the caller runs (numba, Arrow).
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ex = ProcessPoolExecutor(max_workers=min(workers, len(ranges)), mp_context=multiprocessing.get_context("spawn"))
    try:
        pending = []
        todo = iter(ranges)
        for a, b in todo:
            pending.append(ex.submit(_batch_job, cfg.seed, cfg.params, a, b))
            if len(pending) >= 2 * workers:
                break
        while pending:
            result = pending.pop(0).result()
            for a, b in todo:
                pending.append(ex.submit(_batch_job, cfg.seed, cfg.params, a, b))
                break
            yield result
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def iter_synth_batches(
    n_rollouts: int,
    seed: int = 0,
    *,
    batch_rollouts: int = DEFAULT_BATCH_ROLLOUTS,
    workers: int | None = 1,
    **kw,
) -> Iterator[tuple[pa.Table, pa.Table, pa.Table]]:
    """Yield (ledger, tokens, rollouts) tables for consecutive chunks of rollouts.

    ``batch_rollouts`` is rounded up to a multiple of ``BLOCK``. The concatenation of all chunks
    is the same for every batch size and worker count and equals ``synth_tables(n_rollouts, seed,
    **kw)``. Each chunk holds every row of its rollouts. ``workers`` > 1 (None or 0: one per CPU)
    builds batches in that many ``spawn``ed processes. Other keyword arguments are the fields of
    :class:`SynthParams`.
    """
    for tables, _ in iter_tables(n_rollouts, seed, batch_rollouts, kw, workers):
        yield tables


def synth_tables(n_rollouts: int, seed: int = 0, **kw) -> tuple[pa.Table, pa.Table, pa.Table]:
    """A synthetic SPEC §2 dataset: (ledger, tokens, rollouts) Arrow tables.

    Keyword arguments are the fields of :class:`SynthParams` (their defaults there). The tokens
    table has the ``logprobs`` column when ``logprobs``; the rollouts table always has
    ``accepted_response_ids`` (null when the harness kept no record).
    """
    parts = [t for t, _ in iter_tables(n_rollouts, seed, DEFAULT_BATCH_ROLLOUTS, kw)]
    if not parts:
        schemas = tables_schemas(kw.get("logprobs", DEFAULTS.logprobs))
        return tuple(s.empty_table() for s in schemas)  # type: ignore[return-value]
    if len(parts) == 1:
        return parts[0]
    return tuple(pa.concat_tables([p[k] for p in parts]) for k in range(3))  # type: ignore[return-value]
