"""The Python API: ``reassemble`` Arrow tables (or a dataset path) into rows and report tables."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pyarrow as pa

from chainrows.engine.advantage import advantages, row_weights
from chainrows.engine.run import decide_and_gather
from chainrows.lowering.columnar import build_batch
from chainrows.lowering.output import report_table, rows_table
from chainrows.options import Options


@dataclass(frozen=True)
class Result:
    """Rows and report of one reassembly; unpacks as ``rows, report``.

    ``orphan_token_rows``: token rows that named no ledger call (ignored, SPEC §3 step 4).
    """

    rows: pa.Table
    report: pa.Table
    orphan_token_rows: int = 0

    def __iter__(self):
        return iter((self.rows, self.report))


def reassemble(ledger, tokens=None, rollouts=None, options: Options | None = None,
               **option_values) -> Result:
    """Decide every rollout (SPEC §3) and build its rows (§4) with advantages and weights (§5).

    ``ledger, tokens, rollouts``: SPEC §2 Arrow tables; or pass a dataset directory as ``ledger``
    alone. ``options``: an :class:`~chainrows.options.Options`; keywords (``mode="ordinary"``,
    ``baseline="loo"``, ...) override its fields. Returns ``Result(rows, report)``, both sorted
    by rollout_id.
    """
    options = Options.of(options, **option_values)
    if isinstance(ledger, (str, os.PathLike)):
        if tokens is not None or rollouts is not None:
            raise TypeError("reassemble: a dataset directory comes alone (as ledger); pass either it "
                            "or the three tables")
        from chainrows.formats.native.dataset import read_dataset

        ds = read_dataset(ledger)
        ledger, tokens, rollouts = ds.ledger, ds.tokens, ds.rollouts
    return run_tables(ledger, tokens, rollouts, options)


def run_tables(ledger: pa.Table, tokens: pa.Table, rollouts: pa.Table, options: Options) -> Result:
    """``reassemble`` on three SPEC §2 Arrow tables with validated options."""
    batch, labels = build_batch(ledger, tokens, rollouts)
    dec, rows = decide_and_gather(batch, options)
    adv = advantages(batch.reward, batch.has_record, batch.group, dec.ok, options)
    weights = row_weights(rows.num_segments, dec.ok[rows.row_rollout], options)
    reward_null = ~batch.has_record | batch.reward_null
    return Result(
        rows=rows_table(rows, labels, batch.reward, reward_null, adv, weights),
        report=report_table(dec, rows, labels, batch.call_off, batch.roots_per_rollout(),
                            batch.reward, reward_null, adv),
        orphan_token_rows=labels.orphan_token_rows,
    )
