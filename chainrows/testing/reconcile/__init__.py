"""Reconcile a run's outputs with its input: nothing lost, nothing invented (SPEC §4).

    from chainrows.testing.reconcile import reconcile
    problems = reconcile("data/", "out/rows", "out/report.parquet")
    assert not problems, "\\n".join(problems)

``reconcile`` re-derives what the input tables alone say about ``rows`` and ``report`` and lists
every inconsistency as one line of text (an empty list means consistent). It does not re-decide
the §3 checks (that is ``chainrows.reference``); it checks the bookkeeping around them:

- every rollout id seen in any input table is in ``report`` exactly once, and no other id is;
  ``report`` and ``rows`` are sorted by rollout_id (rows then by segment);
- each report row agrees with the input: ``num_calls``, ``num_roots``, ``group_id``, ``reward``,
  a null advantage exactly when the reward is not finite, ``status``/``reason``/``detail``
  well formed, ``no_rollout_record``/``no_calls`` where the tables say so, and no ``ok``
  rollout with a failed call, a repeated rollouts row or a non-finite reward;
- rows exist only for ``ok`` rollouts (a masked rollout may only have zero-weight placeholder
  rows with an all-zero loss_mask, and then every masked rollout has one), ``num_rows`` is their
  count, segments run 0..n-1 with ``num_segments`` n and ``row_id`` ``<rollout_id>_s<k>``; a
  row's group_id, reward and advantage are its rollout's;
- every row is the concatenation of its calls' deltas: each call in ``call_ids`` is a ledger
  call of the rollout, at most once in the row, the calls form one chain root -> leaf,
  ``input_ids`` are the token rows joined (so the token total is the sum of the calls'
  ``delta_len``), ``loss_mask`` is 0 on each delta's carry and 1 on its generated tokens (a call
  several rows share, the forest plan of SPEC §3.1, is trained only in the first of them: 0
  throughout in the later ones), ``logprobs`` are the stored ones, ``prompt_len`` is the root's
  carry and (``verify_hashes``) every call's chain hash holds;
- ``loss_tokens`` is the sum of the rollout's loss_mask; ``num_selected`` of an ok rollout is
  the number of distinct calls in its rows, so every other call (``num_calls - num_selected``)
  is the unselected remainder, never trained.

Memory: everything is held at once (inputs and outputs); meant for tests, CI and audits of a
run's output, not for datasets beyond RAM.
"""

from __future__ import annotations

from pathlib import Path

from chainrows.testing.reconcile.calls import check_row_calls
from chainrows.testing.reconcile.ids import Ids
from chainrows.testing.reconcile.load import has_columns, inputs, output
from chainrows.testing.reconcile.problems import Problems
from chainrows.testing.reconcile.report import check_report
from chainrows.testing.reconcile.rows import check_rows

__all__ = ["reconcile", "reconcile_output"]


def reconcile(dataset, rows, report, *, verify_hashes: bool = True,
              max_problems: int = 100) -> list[str]:
    """Check ``rows`` and ``report`` against the input ``dataset``; returns the problems found
    (one line each, at most ``max_problems`` plus a count of the rest), ``[]`` when consistent.

    ``dataset``: a dataset directory, a :class:`chainrows.formats.native.dataset.Dataset`, or a
    ``(ledger, tokens, rollouts)`` triple of Arrow tables (or of dict lists). ``rows``/``report``:
    Arrow tables, or paths of Parquet files / directories of part files.
    """
    ledger, tokens, rollouts = inputs(dataset)
    rows, report = output(rows), output(report)
    problems = Problems(max_problems)
    if not has_columns(problems, rows, report):
        return problems.result()
    ids = Ids(ledger, tokens, rollouts, rows, report)
    reported = check_report(ids, ledger, rollouts, report, problems)
    shape = check_rows(ids, reported, tokens, rows, problems)
    check_row_calls(ids, reported, shape, ledger, tokens, problems, verify_hashes)
    return problems.result()


def reconcile_output(dataset, out_dir, **kwargs) -> list[str]:
    """:func:`reconcile` on ``OUT/rows`` and ``OUT/report`` (each ``.parquet`` or a directory)."""
    out = Path(out_dir)
    found = {}
    for name in ("rows", "report"):
        for form in (out / f"{name}.parquet", out / name):
            if form.exists():
                found[name] = form
                break
        else:
            return [f"{name}: neither {name}.parquet nor {name}/ in {out}"]
    return reconcile(dataset, found["rows"], found["report"], **kwargs)
