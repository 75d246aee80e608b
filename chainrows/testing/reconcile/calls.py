"""Call and token checks: each trained row is the concatenation of its calls' deltas, its
calls form one chain root -> leaf of distinct ledger calls of the rollout, the tokens,
loss_mask and logprobs are the stored ones and (optionally) every chain hash holds. A call
several rows share (the forest plan, SPEC §3.1) has loss_mask 1 only in the first of them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from chainrows.testing.reconcile.arrays import first_index, list_parts, lookup, to_np
from chainrows.testing.reconcile.ids import Ids
from chainrows.testing.reconcile.problems import Problems
from chainrows.testing.reconcile.report import Reported
from chainrows.testing.reconcile.rows import RowShape
from chainrows.arrays import range_index
from chainrows.formats.native.hashing import chain_hash


def check_row_calls(ids: Ids, rep: Reported, shape: RowShape, ledger: pa.Table, tokens: pa.Table,
                    p: Problems, verify_hashes: bool) -> None:
    """Add the problems of the rows' calls and tokens to ``p``."""
    NR, NC = ids.NR, ids.NC
    ok_row, row_len, lengths_ok, prompt, name = (shape.ok_row, shape.row_len, shape.lengths_ok,
                                                 shape.prompt, shape.name)
    N = len(ok_row)
    c_off = ids.row_call_off
    n_calls = np.diff(c_off)
    owner = np.repeat(np.arange(N, dtype=np.int64), n_calls)
    pos = np.arange(len(owner), dtype=np.int64) - c_off[owner] if len(owner) else owner
    row_r, row_c = ids.row_r, ids.row_c
    # placeholder rows may hold no calls; a trained row must hold at least one
    p.each(ok_row & (n_calls == 0), lambda j: f"{name(j)}: a trained row with no call_ids")
    sel = ok_row[owner] & (row_c >= 0)
    key = np.where(sel, row_r[owner] * NC + row_c, -1)

    l_uniq, l_first, l_count = first_index(ids.ledger_keys())
    li = lookup(l_uniq, l_first, key)
    lcount = lookup(l_uniq, l_count, key)
    li[~ok_row[owner]] = -1
    bad = ok_row[owner] & (li < 0)
    p.each(bad, lambda k: f"{name(int(owner[k]))}: call {ids.cid(k)} is not a ledger call of "
                          f"rollout {ids.rid(int(row_r[owner[k]]))}")
    p.each(ok_row[owner] & (lcount > 1),
           lambda k: f"{name(int(owner[k]))}: call {ids.cid(k)} repeats in the ledger")
    # a call is in a row at most once; several chains of the forest plan (SPEC §3.1) share a
    # call, so it may be in several rows of its rollout, trained only in the first (below)
    in_row = np.flatnonzero(ok_row[owner] & (key >= 0))
    u, c = np.unique(owner[in_row] * NC + row_c[in_row], return_counts=True)
    for k in u[c > 1][:5]:
        p.add(f"{name(int(k // NC))}: call {ids.cdict[int(k % NC)].as_py()!r} is twice in one row")
    used, first_at = np.unique(key[in_row], return_index=True)
    first_row = np.zeros(len(key), dtype=bool)  # the call's first row (lowest segment) trains it
    first_row[in_row[first_at]] = True
    # num_selected of an ok rollout = distinct calls in its rows
    per_r = np.bincount(used // NC, minlength=NR) if len(used) else np.zeros(NR, dtype=np.int64)
    oks = np.flatnonzero(rep.ok)
    p.each(oks[per_r[oks] != rep.num_sel[oks]],
           lambda r: f"rollout {ids.rid(r)}: num_selected {rep.num_sel[r]} but its rows hold "
                     f"{per_r[r]} call(s)")

    good_call = li >= 0
    row_good = ok_row & lengths_ok & (np.bincount(owner[~good_call & ok_row[owner]], minlength=N) == 0)
    if not row_good.any():
        return
    # chain structure: root first, then each call's parent is the call before it
    parent = np.where(good_call, ids.l_parent[np.maximum(li, 0)], -2)
    prev_c = np.empty_like(row_c)
    if len(prev_c):
        prev_c[1:] = row_c[:-1]
        prev_c[0] = -3
    chained = np.where(pos == 0, parent == -1, parent == prev_c)
    p.each(row_good[owner] & ~chained,
           lambda k: f"{name(int(owner[k]))}: call {ids.cid(k)} at position {pos[k]} "
                     f"{'is not a root' if pos[k] == 0 else 'is not a child of the call before it'}")
    # lengths: tokens, carry/gen, prompt_len
    delta = to_np(ledger["delta_len"], np.int64)
    gen = to_np(ledger["gen_len"], np.int64)
    lis = np.maximum(li, 0)
    d = np.where(good_call, delta[lis] if len(delta) else 0, 0)
    g = np.where(good_call, gen[lis] if len(gen) else 0, 0)
    in_range = (d >= 1) & (g >= 1) & (g <= d) & (d <= max(len(shape.ids_val), 1))
    p.each(row_good[owner] & ~in_range,
           lambda k: f"{name(int(owner[k]))}: call {ids.cid(k)} has delta_len {d[k]}, "
                     f"gen_len {g[k]}")
    row_good &= np.bincount(owner[~in_range], minlength=N) == 0
    total = np.bincount(owner, weights=np.where(in_range, d, 0), minlength=N).astype(np.int64)
    p.each(row_good & (total != row_len),
           lambda j: f"{name(j)}: {row_len[j]} tokens but its calls' delta_len sum to {total[j]}")
    row_good &= total == row_len
    first_call = c_off[:-1]
    has_calls = n_calls > 0
    want_prompt = np.zeros(N, dtype=np.int64)
    want_prompt[has_calls] = (d - g)[first_call[has_calls]]
    p.each(row_good & (prompt != want_prompt),
           lambda j: f"{name(j)}: prompt_len {prompt[j]}, expected {want_prompt[j]}")
    # token rows of the calls
    t_key = np.where((ids.t_r >= 0) & (ids.t_c >= 0), ids.t_r * NC + ids.t_c, -1)
    t_uniq, t_first, t_count = first_index(t_key)
    ti = lookup(t_uniq, t_first, key)
    tcount = lookup(t_uniq, t_count, key)
    chk = row_good[owner]
    p.each(chk & (ti < 0), lambda k: f"{name(int(owner[k]))}: call {ids.cid(k)} has no token row")
    p.each(chk & (tcount > 1), lambda k: f"{name(int(owner[k]))}: call {ids.cid(k)} has several token rows")
    tok_off, tok_val = list_parts(tokens["tokens"])
    tis = np.maximum(ti, 0)
    t_len = np.where(ti >= 0, (tok_off[1:] - tok_off[:-1])[tis] if len(tok_off) > 1 else 0, -1)
    p.each(chk & (ti >= 0) & (t_len != d),
           lambda k: f"{name(int(owner[k]))}: call {ids.cid(k)} has {t_len[k]} stored tokens, "
                     f"delta_len {d[k]}")
    bad_call = ~((ti >= 0) & (tcount == 1) & (t_len == d))
    row_good &= np.bincount(owner[bad_call], minlength=N) == 0
    calls = np.flatnonzero(row_good[owner])
    if not len(calls):
        return

    def rows_differ(bad, what):
        p.each(np.unique(tok_owner[bad]), lambda j: f"{name(j)}: {what}")

    start = _call_start(c_off, owner, d)
    src = range_index(tok_off[ti[calls]], d[calls])
    dst = range_index(shape.ids_off[owner[calls]] + start[calls], d[calls])
    tok_owner = np.repeat(owner[calls], d[calls])
    want_ids = to_np(tok_val, np.int32)[src] if len(src) else np.zeros(0, np.int32)
    got_ids = to_np(shape.ids_val, np.int32)[dst] if len(dst) else np.zeros(0, np.int32)
    rows_differ(want_ids != got_ids, "input_ids differ from its calls' stored tokens")
    carry = np.repeat((d - g)[calls], d[calls])
    in_call = range_index(np.zeros(len(calls), np.int64), d[calls])
    trains = np.repeat(first_row[calls], d[calls])  # a later row's copy of a call: loss 0
    want_mask = ((in_call >= carry) & trains).astype(np.int64)
    rows_differ(want_mask != shape.mask_np[dst],
                "loss_mask is not 0 on each delta's carry and 1 on its generated tokens")
    if shape.lp_col is not None and "logprobs" in tokens.column_names:
        lp_in_off, lp_in_val = list_parts(tokens["logprobs"])
        lp_out_off, lp_out_val = list_parts(shape.lp_col)
        lp_ok = (lp_in_off[1:] - lp_in_off[:-1])[ti[calls]] == d[calls]
        if lp_ok.all():
            src_lp = range_index(lp_in_off[ti[calls]], d[calls])
            dst_lp = range_index(lp_out_off[owner[calls]] + start[calls], d[calls])
            a = to_np(lp_in_val, np.float32)[src_lp].view(np.uint32)
            b = to_np(lp_out_val, np.float32)[dst_lp].view(np.uint32)
            rows_differ(a != b, "logprobs differ from the stored ones")
        else:
            p.add("logprobs: a trained call's stored logprobs are not delta_len long")
    if verify_hashes:
        _verify_hashes(ids, ledger, p, calls, owner, li, ti, d, tok_off, tok_val, name)


def _call_start(c_off: np.ndarray, owner: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Offset of each call's delta within its row (cumulative delta_len of earlier calls)."""
    cum = np.cumsum(d) - d
    base = np.zeros(len(owner), dtype=np.int64)
    if len(owner):
        base = cum[c_off[:-1][owner]] if len(cum) else base
    return cum - base


def _verify_hashes(ids: Ids, ledger: pa.Table, p: Problems, calls, owner, li, ti, d, tok_off,
                   tok_val, name) -> None:
    hashes = to_np(ledger["chain_hash"], np.uint64)
    tok = to_np(tok_val, np.int32)
    parent_row = _parent_rows(ids)
    for k in calls:
        c = int(li[k])
        parent = int(parent_row[c])
        seed = 0 if parent < 0 else int(hashes[parent])
        s = int(tok_off[ti[k]])
        if chain_hash(tok[s:s + int(d[k])].tolist(), seed) != int(hashes[c]):
            p.add(f"{name(int(owner[k]))}: call {ids.cid(k)} fails its chain hash")


def _parent_rows(ids: Ids) -> np.ndarray:
    """Per ledger row: the ledger row of its parent (first row with that id in the rollout),
    -1 for a root or an unknown parent."""
    uniq, first, _ = first_index(ids.ledger_keys())
    pk = np.where(ids.l_parent >= 0, ids.l_r * ids.NC + ids.l_parent, -1)
    return np.where(ids.l_parent >= 0, lookup(uniq, first, pk), -1)
