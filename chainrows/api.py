"""The Python API: ``reassemble`` Arrow tables (or a dataset path) into rows and report tables."""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from chainrows.engine.advantage import advantages, row_weights
from chainrows.engine.run import MODES, decide, gather_rows
from chainrows.io.columnar import build_batch
from chainrows.io.output import report_table, rows_table


class Result(NamedTuple):
    rows: pa.Table
    report: pa.Table


def _check_options(mode, baseline, population, row_weight):
    for name, value, allowed in (("mode", mode, MODES), ("baseline", baseline, ("mean", "loo")),
                                 ("baseline_population", population, ("all", "ok")),
                                 ("row_weight", row_weight, ("rollout", "row"))):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def reassemble(ledger, tokens=None, rollouts=None, *, mode: str = "cc", placeholders: bool = False,
               baseline: str = "mean", no_std: bool = False, baseline_population: str = "all",
               row_weight: str = "rollout") -> Result:
    """Decide every rollout (SPEC §3) and build its rows (§4) with advantages and weights (§5).

    ``ledger, tokens, rollouts``: SPEC §2 Arrow tables; or pass a dataset directory as ``ledger``
    alone. Returns ``Result(rows, report)``, both sorted by rollout_id.
    """
    _check_options(mode, baseline, baseline_population, row_weight)
    if isinstance(ledger, (str, os.PathLike)):
        from chainrows.io.dataset import read_dataset

        ds = read_dataset(ledger)
        ledger, tokens, rollouts = ds.ledger, ds.tokens, ds.rollouts
    return run_tables(ledger, tokens, rollouts, mode=mode, placeholders=placeholders,
                      baseline=baseline, no_std=no_std, baseline_population=baseline_population,
                      row_weight=row_weight)[0]


def run_tables(ledger, tokens, rollouts, *, mode, placeholders, baseline, no_std,
               baseline_population, row_weight) -> tuple[Result, int]:
    """``reassemble`` on Arrow tables; also returns the count of orphan token rows."""
    batch, labels = build_batch(ledger, tokens, rollouts)
    dec = decide(batch, mode)
    rows = gather_rows(batch, dec, placeholders)
    adv = advantages(batch.reward, batch.has_record, batch.group, dec.ok, baseline=baseline,
                     no_std=no_std, population=baseline_population)
    weights = row_weights(rows.num_segments, row_weight)
    weights[~dec.ok[rows.row_rollout]] = 0.0
    reward_null = ~batch.has_record | batch.reward_null
    result = Result(
        rows=rows_table(rows, labels, batch.reward, reward_null, adv, weights),
        report=report_table(dec, rows, labels, batch.call_off, batch.parent, batch.reward,
                            reward_null, adv),
    )
    return result, labels.orphan_token_rows
