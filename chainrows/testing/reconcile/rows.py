"""Row checks: rows only for ok rollouts (placeholders aside), sorted, segments and row ids
well formed, per-rollout fields copied from the report, ``loss_tokens`` the loss_mask sum."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chainrows.testing.reconcile.arrays import list_parts, same_float, to_np
from chainrows.testing.reconcile.ids import Ids
from chainrows.testing.reconcile.problems import Problems
from chainrows.testing.reconcile.report import Reported


@dataclass
class RowShape:
    """What the call/token checks need of the rows: which rows are trained (``ok_row``), their
    token counts, whether loss_mask has their length, prompt_len, the flat input_ids / loss_mask
    values with input_ids' offsets, the logprobs column (None when absent) and ``name(j)``."""

    ok_row: np.ndarray
    row_len: np.ndarray
    lengths_ok: np.ndarray
    prompt: np.ndarray
    ids_off: np.ndarray
    ids_val: pa.Array
    mask_np: np.ndarray
    lp_col: object
    name: Callable[[int], str]


def check_rows(ids: Ids, rep: Reported, tokens: pa.Table, rows: pa.Table, p: Problems) -> RowShape:
    """Add the rows' own problems to ``p`` (not those of their calls and tokens)."""
    row_r = ids.row_r
    row_id = rows["row_id"].to_pylist()

    def name(j):
        return f"row {j} ({row_id[j]!r})"

    p.each(row_r < 0, lambda j: f"{name(j)}: rollout_id is null")
    known = (row_r >= 0)
    known[known] &= rep.row[row_r[known]] >= 0
    p.each((row_r >= 0) & ~known, lambda j: f"{name(j)}: rollout {ids.rid(int(row_r[j]))} is not in report")
    ok_row = known & rep.ok[np.where(row_r >= 0, row_r, 0)]
    shape, mask_sum = _check_lengths(tokens, rows, ok_row, p, name)
    _check_placeholders(ids, rep, rows, known, mask_sum, p, name)
    _check_order_and_fields(ids, rep, rows, known, ok_row, p, name)
    # loss_tokens
    oks = np.flatnonzero(rep.ok)
    loss = np.bincount(row_r[ok_row], weights=mask_sum[ok_row], minlength=ids.NR).astype(np.int64)
    p.each(oks[loss[oks] != rep.loss[oks]],
           lambda r: f"rollout {ids.rid(r)}: report loss_tokens {rep.loss[r]} but its rows' "
                     f"loss_mask sums to {loss[r]}")
    return shape


def _check_lengths(tokens: pa.Table, rows: pa.Table, ok_row: np.ndarray, p: Problems,
                   name) -> tuple[RowShape, np.ndarray]:
    """loss_mask and logprobs as long as input_ids, loss_mask of 0 and 1: the rows' shape and
    each row's loss_mask sum (0 while the lengths disagree)."""
    N = rows.num_rows
    ids_off, ids_val = list_parts(rows["input_ids"])
    mask_off, mask_val = list_parts(rows["loss_mask"])
    row_len = np.diff(ids_off)
    mask_np = to_np(mask_val, np.int64) if len(mask_val) else np.zeros(0, np.int64)
    has_lp = "logprobs" in rows.column_names
    if has_lp != ("logprobs" in tokens.column_names):
        p.add(f"rows {'has' if has_lp else 'lacks'} a logprobs column but the tokens table "
              f"{'lacks' if has_lp else 'has'} one")
    if has_lp:
        lp_off, lp_val = list_parts(rows["logprobs"])
        p.each(np.diff(lp_off) != row_len, lambda j: f"{name(j)}: logprobs length differs from input_ids")
    p.each(np.diff(mask_off) != row_len, lambda j: f"{name(j)}: loss_mask length differs from input_ids")
    lengths_ok = np.diff(mask_off) == row_len
    mask_sum = np.zeros(N, dtype=np.int64)
    if lengths_ok.all():
        if len(mask_np):
            p.each(np.flatnonzero((mask_np != 0) & (mask_np != 1))[:1],
                   lambda t: f"loss_mask holds the value {mask_np[t]} (only 0 and 1 allowed)")
        owner_tok = np.repeat(np.arange(N, dtype=np.int64), row_len)
        mask_sum = np.bincount(owner_tok, weights=mask_np, minlength=N).astype(np.int64)
    shape = RowShape(ok_row=ok_row, row_len=row_len, lengths_ok=lengths_ok,
                     prompt=to_np(rows["prompt_len"], np.int64, fill=-1), ids_off=ids_off, ids_val=ids_val,
                     mask_np=mask_np, lp_col=rows["logprobs"] if has_lp else None, name=name)
    return shape, mask_sum


def _check_placeholders(ids: Ids, rep: Reported, rows: pa.Table, known: np.ndarray, mask_sum: np.ndarray,
                        p: Problems, name) -> None:
    """A masked rollout's rows are placeholders only (weight 0, no loss tokens), and either
    every masked rollout has one or none has."""
    row_r = ids.row_r
    weight = to_np(rows["weight"], np.float64, fill=np.nan)
    masked_row = known & ~rep.ok[np.where(row_r >= 0, row_r, 0)]
    p.each(masked_row & ~((weight == 0) & (mask_sum == 0)),
           lambda j: f"{name(j)}: rollout {ids.rid(int(row_r[j]))} is masked but the row is "
                     f"not a placeholder (weight {weight[j]}, {mask_sum[j]} loss tokens)")
    masked_ids = np.flatnonzero((rep.row >= 0) & ~rep.ok)
    with_rows = np.bincount(row_r[masked_row], minlength=ids.NR) > 0
    if with_rows.any() and not with_rows[masked_ids].all():
        miss = masked_ids[~with_rows[masked_ids]]
        p.add(f"placeholders: {len(miss)} masked rollout(s) have none although others do "
              f"(first {ids.rid(int(miss[0]))})")


def _check_order_and_fields(ids: Ids, rep: Reported, rows: pa.Table, known: np.ndarray, ok_row: np.ndarray,
                            p: Problems, name) -> None:
    """Rows sorted by (rollout_id, segment); as many as the report says; segments 0..n-1 of n;
    row_id <rollout_id>_s<segment>; a trained row's weight > 0; group_id, reward and advantage
    those of the report."""
    NR, N, row_r = ids.NR, rows.num_rows, ids.row_r
    rr = np.where(row_r >= 0, row_r, 0)
    segment = to_np(rows["segment"], np.int64, fill=-1)
    nseg = to_np(rows["num_segments"], np.int64, fill=-1)
    order_key = np.where(row_r >= 0, row_r, -1)
    bad = np.flatnonzero((np.diff(order_key) < 0) |
                         ((np.diff(order_key) == 0) & (np.diff(segment) <= 0)))
    if len(bad):
        p.add(f"rows are not sorted by (rollout_id, segment) at {name(int(bad[0]) + 1)}")
    count = np.bincount(row_r[ok_row], minlength=NR)
    oks = np.flatnonzero(rep.ok)
    p.each(oks[count[oks] != rep.num_rows[oks]],
           lambda r: f"rollout {ids.rid(r)}: report num_rows {rep.num_rows[r]} but rows "
                     f"holds {count[r]}")
    first = np.full(NR, N, dtype=np.int64)
    np.minimum.at(first, row_r[ok_row], np.flatnonzero(ok_row))
    rank = np.arange(N) - first[rr]
    p.each(ok_row & ((segment != rank) | (nseg != count[rr])),
           lambda j: f"{name(j)}: segment {segment[j]} of {nseg[j]}, expected {rank[j]} of {count[rr[j]]}")
    want_id = pc.binary_join_element_wise(rows["rollout_id"],
                                          pc.cast(rows["segment"], pa.string()), "_s")
    same_id = to_np(pc.equal(rows["row_id"], want_id), bool, fill=False)
    p.each(~same_id, lambda j: f"{name(j)}: row_id is not <rollout_id>_s<segment>")
    weight = to_np(rows["weight"], np.float64, fill=np.nan)
    p.each(ok_row & ~(weight > 0), lambda j: f"{name(j)}: weight {weight[j]} of a trained row")
    group = rows["group_id"].to_pylist()
    reward = rows["reward"].to_pylist()
    adv = rows["advantage"].to_pylist()
    for j in np.flatnonzero(known):
        r = int(row_r[j])
        if group[j] != rep.group[r] or not same_float(reward[j], rep.reward[r]) or \
                not same_float(adv[j], rep.adv[r]):
            p.add(f"{name(j)}: group_id/reward/advantage ({group[j]!r}, {reward[j]!r}, "
                  f"{adv[j]!r}) differ from the report's ({rep.group[r]!r}, "
                  f"{rep.reward[r]!r}, {rep.adv[r]!r})")
