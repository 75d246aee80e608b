"""The Python API: ``reassemble`` Arrow tables (or a dataset path) into rows and report tables."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chainrows.engine.advantage import advantages, row_weights
from chainrows.engine.run import decide_and_gather
from chainrows.lowering.columnar import build_batch
from chainrows.lowering.output import report_table, rows_table
from chainrows.options import Options
from chainrows.outdir.provenance import make_provenance, with_provenance


@dataclass(frozen=True)
class Result:
    """Rows and report of one reassembly; unpacks as ``rows, report``.

    ``orphan_token_rows``: token rows that named no ledger call (ignored, SPEC §3 step 4).
    ``generated_tokens``: Σ gen_len over the non-failed calls of the ok rollouts;
    ``untrained_tokens``: those no row trains (``generated_tokens`` − their report
    ``loss_tokens``): the generations of calls the agent's final output does not contain.
    Both tables carry how they were made as schema metadata
    (``chainrows.outdir.provenance.PROVENANCE_KEY``).
    """

    rows: pa.Table
    report: pa.Table
    orphan_token_rows: int = 0
    generated_tokens: int = 0
    untrained_tokens: int = 0

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
        from chainrows.formats.native.footers import input_fingerprint

        ds = read_dataset(ledger)
        files = [f for name in ds.files for f in ds.files[name]]
        result = run_tables(ds.ledger, ds.tokens, ds.rollouts, options)
        prov = make_provenance(options, input_fingerprint(files, ledger))
        return dataclasses.replace(result, rows=with_provenance(result.rows, prov),
                                   report=with_provenance(result.report, prov))
    return run_tables(ledger, tokens, rollouts, options)


def run_tables(ledger: pa.Table, tokens: pa.Table, rollouts: pa.Table, options: Options) -> Result:
    """``reassemble`` on three SPEC §2 Arrow tables with validated options (provenance input
    None)."""
    batch, labels = build_batch(ledger, tokens, rollouts)
    dec, rows = decide_and_gather(batch, options)
    adv = advantages(batch.reward, batch.has_record, batch.group, dec.ok, options)
    weights = row_weights(rows.num_segments, dec.ok[rows.row_rollout], options)
    reward_null = ~batch.has_record | batch.reward_null
    prov = make_provenance(options)
    report = report_table(dec, rows, labels, batch.call_off, batch.roots_per_rollout(),
                          batch.reward, reward_null, adv)
    generated, untrained = untrained_tokens(batch.call_off, batch.gen_len, batch.failed, dec.ok, report)
    return Result(
        rows=with_provenance(rows_table(rows, labels, batch.reward, reward_null, adv, weights), prov),
        report=with_provenance(report, prov),
        orphan_token_rows=labels.orphan_token_rows,
        generated_tokens=generated,
        untrained_tokens=untrained,
    )


def untrained_tokens(call_off: np.ndarray, gen_len: np.ndarray, failed: np.ndarray, ok: np.ndarray,
                     report: pa.Table) -> tuple[int, int]:
    """(generated, untrained) tokens of the ok rollouts: Σ gen_len over their non-failed calls
    (rollout r's calls are ``call_off[r]:call_off[r + 1]``), and that minus the ``loss_tokens``
    the report gives the ok rollouts (what their rows train)."""
    per_call = np.concatenate([[0], np.cumsum(np.where(failed, 0, gen_len), dtype=np.int64)])
    generated = int((per_call[call_off[1:]] - per_call[call_off[:-1]])[ok].sum())
    trained = pc.sum(pc.filter(report["loss_tokens"], pc.equal(report["status"], "ok"))).as_py() or 0
    return generated, generated - trained
