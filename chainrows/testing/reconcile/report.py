"""Report checks: every input rollout in ``report`` exactly once and sorted, and each report
row agreeing with what the ledger and rollouts tables say about its rollout."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chainrows.reasons import REASONS
from chainrows.testing.reconcile.arrays import finite, same_float, to_np
from chainrows.testing.reconcile.ids import TABLES, Ids
from chainrows.testing.reconcile.problems import Problems

_REASON_CODES = frozenset(r for r in REASONS if r)


@dataclass
class Reported:
    """What the report says per rollout code (from its first report row, ``row[r]``; -1 and
    zeros / None where it has none), for the row checks."""

    row: np.ndarray
    ok: np.ndarray
    num_rows: np.ndarray
    num_sel: np.ndarray
    loss: np.ndarray
    group: list
    reward: list
    adv: list


def check_report(ids: Ids, ledger: pa.Table, rollouts: pa.Table, report: pa.Table,
                 p: Problems) -> Reported:
    """Add the report's problems to ``p``; returns the report's view of each rollout."""
    _check_report_ids(ids, p)
    return _check_report_rows(ids, ledger, rollouts, report, p)


def _check_report_ids(ids: Ids, p: Problems) -> None:
    NR, rep_r = ids.NR, ids.rep_r
    p.each(rep_r < 0, lambda i: f"report row {i}: rollout_id is null")
    count = np.bincount(rep_r[rep_r >= 0], minlength=NR)

    def where(r):
        return "/".join(n for n in TABLES if ids.seen[n][r])

    p.each(ids.in_input & (count == 0),
           lambda r: f"rollout {ids.rid(r)} (in {where(r)}) is missing from report")
    p.each(count > 1, lambda r: f"rollout {ids.rid(r)} appears {count[r]} times in report")
    p.each(~ids.in_input & (count > 0),
           lambda r: f"report rollout {ids.rid(r)} is in no input table")
    valid = rep_r[rep_r >= 0]
    bad = np.flatnonzero(np.diff(valid) <= 0)
    if len(bad):
        p.add(f"report is not sorted by rollout_id (row {int(bad[0]) + 1}: "
              f"{ids.rid(int(valid[bad[0] + 1]))} after {ids.rid(int(valid[bad[0]]))})")


def _first_row(codes: np.ndarray, n: int) -> np.ndarray:
    """Per code: the first row holding it (-1 when none)."""
    out = np.full(n, -1, dtype=np.int64)
    valid = np.flatnonzero(codes >= 0)
    out[codes[valid][::-1]] = valid[::-1]
    return out


def _check_report_rows(ids: Ids, ledger: pa.Table, rollouts: pa.Table, rep: pa.Table,
                       p: Problems) -> Reported:
    NR = ids.NR
    rep_row = _first_row(ids.rep_r, NR)
    status = rep["status"].to_pylist()
    reason = rep["reason"].to_pylist()
    detail = rep["detail"].to_pylist()
    group = rep["group_id"].to_pylist()
    reward = rep["reward"].to_pylist()
    adv = rep["advantage"].to_pylist()
    num_rows = to_np(rep["num_rows"], np.int64, fill=-1)
    num_calls = to_np(rep["num_calls"], np.int64, fill=-1)
    num_sel = to_np(rep["num_selected"], np.int64, fill=-1)
    num_roots = to_np(rep["num_roots"], np.int64, fill=-1)
    loss = to_np(rep["loss_tokens"], np.int64, fill=-1)

    l_r = ids.l_r
    calls = np.bincount(l_r[l_r >= 0], minlength=NR)
    root_mask = to_np(pc.is_null(ledger["parent_id"]), bool)
    roots = np.bincount(l_r[root_mask & (l_r >= 0)], minlength=NR)
    failed = to_np(ledger["failed"], bool, fill=False) if ledger.num_rows else np.zeros(0, bool)
    any_failed = np.bincount(l_r[failed & (l_r >= 0)], minlength=NR) > 0
    records = np.bincount(ids.ro_r[ids.ro_r >= 0], minlength=NR)
    rec_row = _first_row(ids.ro_r, NR)
    rec_group = rollouts["group_id"].to_pylist()
    rec_reward = rollouts["reward"].to_pylist()

    out = Reported(row=rep_row, ok=np.zeros(NR, dtype=bool), num_rows=np.zeros(NR, dtype=np.int64),
                   num_sel=np.zeros(NR, dtype=np.int64), loss=np.zeros(NR, dtype=np.int64),
                   group=[None] * NR, reward=[None] * NR, adv=[None] * NR)
    for r in np.flatnonzero(rep_row >= 0):
        r = int(r)
        i = int(rep_row[r])
        name = f"report {ids.rid(r)}"
        st, rs, dt = status[i], reason[i], detail[i]
        ok = st == "ok"
        out.ok[r] = ok
        out.num_rows[r], out.num_sel[r], out.loss[r] = num_rows[i], num_sel[i], loss[i]
        out.group[r], out.reward[r], out.adv[r] = group[i], reward[i], adv[i]
        if st not in ("ok", "masked"):
            p.add(f"{name}: status {st!r} is neither 'ok' nor 'masked'")
        elif ok and (rs is not None or dt is not None):
            p.add(f"{name}: ok with reason {rs!r} / detail {dt!r}")
        elif not ok and (rs not in _REASON_CODES or not dt):
            p.add(f"{name}: masked with reason {rs!r} and detail {dt!r}")
        if num_calls[i] != calls[r]:
            p.add(f"{name}: num_calls {num_calls[i]} but the ledger holds {calls[r]} call(s)")
        if num_roots[i] != roots[r]:
            p.add(f"{name}: num_roots {num_roots[i]} but the ledger holds {roots[r]} root(s)")
        # a masked rollout's selection may repeat a call (§3 step 7 rejects it), so only
        # an ok rollout's num_selected is bounded by num_calls
        if num_sel[i] < 0 or (ok and num_sel[i] > calls[r]):
            p.add(f"{name}: num_selected {num_sel[i]} outside [0, num_calls {calls[r]}]")
        if num_rows[i] < 0 or loss[i] < 0:
            p.add(f"{name}: negative or null num_rows/loss_tokens ({num_rows[i]}, {loss[i]})")
        has_rec = records[r] > 0
        want_group = rec_group[rec_row[r]] if has_rec else None
        want_reward = rec_reward[rec_row[r]] if has_rec else None
        if group[i] != want_group:
            p.add(f"{name}: group_id {group[i]!r} but the rollouts table says {want_group!r}")
        if not same_float(None if reward[i] is None else float(reward[i]),
                          None if want_reward is None else float(want_reward)):
            p.add(f"{name}: reward {reward[i]!r} but the rollouts table says {want_reward!r}")
        if (adv[i] is None) != (not finite(want_reward)):
            p.add(f"{name}: advantage {adv[i]!r} with reward {want_reward!r} "
                  f"(null exactly when the reward is not finite)")
        if adv[i] is not None and not math.isfinite(adv[i]):
            p.add(f"{name}: advantage {adv[i]!r} is not finite")
        if not has_rec and (ok or rs != "no_rollout_record"):
            p.add(f"{name}: no rollouts row, so it must be masked no_rollout_record, "
                  f"not {st}/{rs}")
        elif has_rec and calls[r] == 0 and (ok or rs != "no_calls"):
            p.add(f"{name}: no ledger calls, so it must be masked no_calls, not {st}/{rs}")
        if ok:
            if num_rows[i] < 1:
                p.add(f"{name}: ok with num_rows {num_rows[i]}")
            if any_failed[r]:
                p.add(f"{name}: ok although a ledger row has failed = true")
            if records[r] > 1:
                p.add(f"{name}: ok although the rollouts table holds it {records[r]} times")
            if not finite(want_reward):
                p.add(f"{name}: ok with reward {want_reward!r}")
        elif num_rows[i] != 0 or loss[i] != 0:
            p.add(f"{name}: masked with num_rows {num_rows[i]}, loss_tokens {loss[i]}")
    return out
