"""Call and token checks: each trained row is the concatenation of its calls' deltas, its
calls form one chain root -> leaf of distinct ledger calls of the rollout, the tokens,
loss_mask and logprobs are the stored ones and (optionally) every chain hash holds. A call
several rows share (the forest plan, SPEC §3.1) has loss_mask 1 only in the first of them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from chainrows.arrays import range_index
from chainrows.formats.native.hashing import chain_hash
from chainrows.testing.reconcile.arrays import first_index, list_parts, lookup, to_np
from chainrows.testing.reconcile.ids import Ids
from chainrows.testing.reconcile.problems import Problems
from chainrows.testing.reconcile.report import Reported
from chainrows.testing.reconcile.rows import RowShape


def check_row_calls(ids: Ids, rep: Reported, shape: RowShape, ledger: pa.Table, tokens: pa.Table,
                    p: Problems, verify_hashes: bool) -> None:
    """Add the problems of the rows' calls and tokens to ``p``."""
    c = _RowCalls(ids, shape, p)
    c.check_ledger_calls(rep)
    if not c.check_chains():
        return
    c.check_lengths(ledger)
    c.check_token_rows(tokens)
    calls = np.flatnonzero(c.row_good[c.owner])
    if not len(calls):
        return
    c.check_contents(tokens, calls)
    if verify_hashes:
        _verify_hashes(ids, ledger, p, calls, c.owner, c.li, c.ti, c.d, c.tok_off, c.tok_val, shape.name)


class _RowCalls:
    """The calls of the rows, flat (call k belongs to row ``owner[k]`` at ``pos[k]``), and the
    checks on them in order; each narrows ``row_good``, the rows the next checks look at."""

    def __init__(self, ids: Ids, shape: RowShape, p: Problems):
        self.ids, self.shape, self.p, self.name = ids, shape, p, shape.name
        self.N = len(shape.ok_row)
        self.c_off = ids.row_call_off
        self.n_calls = np.diff(self.c_off)
        self.owner = owner = np.repeat(np.arange(self.N, dtype=np.int64), self.n_calls)
        self.pos = np.arange(len(owner), dtype=np.int64) - self.c_off[owner] if len(owner) else owner
        sel = shape.ok_row[owner] & (ids.row_c >= 0)
        self.key = np.where(sel, ids.row_r[owner] * ids.NC + ids.row_c, -1)

    def where(self, k) -> str:
        """'row j (...): call c' of call k."""
        return f"{self.name(int(self.owner[k]))}: call {self.ids.cid(k)}"

    def check_ledger_calls(self, rep: Reported) -> None:
        """Each call of a trained row is one ledger call of its rollout, once in the row; the
        rollout's num_selected counts them. Sets ``li`` (ledger row per call, -1: none) and
        ``first_row`` (the call's first row, the one that trains it)."""
        ids, p, name, owner, key = self.ids, self.p, self.name, self.owner, self.key
        NR, NC, ok_row = ids.NR, ids.NC, self.shape.ok_row
        # placeholder rows may hold no calls; a trained row must hold at least one
        p.each(ok_row & (self.n_calls == 0), lambda j: f"{name(j)}: a trained row with no call_ids")
        l_uniq, l_first, l_count = first_index(ids.ledger_keys())
        self.li = li = lookup(l_uniq, l_first, key)
        lcount = lookup(l_uniq, l_count, key)
        li[~ok_row[owner]] = -1
        p.each(ok_row[owner] & (li < 0),
               lambda k: f"{self.where(k)} is not a ledger call of rollout {ids.rid(int(ids.row_r[owner[k]]))}")
        p.each(ok_row[owner] & (lcount > 1), lambda k: f"{self.where(k)} repeats in the ledger")
        # a call is in a row at most once; several chains of the forest plan (SPEC §3.1) share a
        # call, so it may be in several rows of its rollout, trained only in the first (below)
        in_row = np.flatnonzero(ok_row[owner] & (key >= 0))
        u, c = np.unique(owner[in_row] * NC + ids.row_c[in_row], return_counts=True)
        for k in u[c > 1][:5]:
            p.add(f"{name(int(k // NC))}: call {ids.cdict[int(k % NC)].as_py()!r} is twice in one row")
        used, first_at = np.unique(key[in_row], return_index=True)
        self.first_row = np.zeros(len(key), dtype=bool)  # the call's first row (lowest segment) trains it
        self.first_row[in_row[first_at]] = True
        # num_selected of an ok rollout = distinct calls in its rows
        per_r = np.bincount(used // NC, minlength=NR) if len(used) else np.zeros(NR, dtype=np.int64)
        oks = np.flatnonzero(rep.ok)
        p.each(oks[per_r[oks] != rep.num_sel[oks]],
               lambda r: f"rollout {ids.rid(r)}: num_selected {rep.num_sel[r]} but its rows hold "
                         f"{per_r[r]} call(s)")

    def check_chains(self) -> bool:
        """Each row's calls form a chain: root first, then each call's parent is the call
        before it. False when no row is left to check."""
        ids, owner, pos, li, shape = self.ids, self.owner, self.pos, self.li, self.shape
        self.good_call = li >= 0
        bad_calls = np.bincount(owner[~self.good_call & shape.ok_row[owner]], minlength=self.N)
        self.row_good = shape.ok_row & shape.lengths_ok & (bad_calls == 0)
        if not self.row_good.any():
            return False
        parent = np.where(self.good_call, ids.l_parent[np.maximum(li, 0)], -2)
        row_c = ids.row_c
        prev_c = np.empty_like(row_c)
        if len(prev_c):
            prev_c[1:] = row_c[:-1]
            prev_c[0] = -3
        chained = np.where(pos == 0, parent == -1, parent == prev_c)
        self.p.each(self.row_good[owner] & ~chained,
                    lambda k: f"{self.where(k)} at position {pos[k]} "
                              f"{'is not a root' if pos[k] == 0 else 'is not a child of the call before it'}")
        return True

    def check_lengths(self, ledger: pa.Table) -> None:
        """delta_len and gen_len in range, summing to the row's tokens, the first call's carry
        the row's prompt_len. Sets ``d`` and ``g`` (per call; 0 where not a ledger call)."""
        p, name, owner, N, shape = self.p, self.name, self.owner, self.N, self.shape
        delta = to_np(ledger["delta_len"], np.int64)
        gen = to_np(ledger["gen_len"], np.int64)
        lis = np.maximum(self.li, 0)
        self.d = d = np.where(self.good_call, delta[lis] if len(delta) else 0, 0)
        self.g = g = np.where(self.good_call, gen[lis] if len(gen) else 0, 0)
        in_range = (d >= 1) & (g >= 1) & (g <= d) & (d <= max(len(shape.ids_val), 1))
        p.each(self.row_good[owner] & ~in_range, lambda k: f"{self.where(k)} has delta_len {d[k]}, gen_len {g[k]}")
        self.row_good &= np.bincount(owner[~in_range], minlength=N) == 0
        total = np.bincount(owner, weights=np.where(in_range, d, 0), minlength=N).astype(np.int64)
        row_len, prompt = shape.row_len, shape.prompt
        p.each(self.row_good & (total != row_len),
               lambda j: f"{name(j)}: {row_len[j]} tokens but its calls' delta_len sum to {total[j]}")
        self.row_good &= total == row_len
        first_call = self.c_off[:-1]
        has_calls = self.n_calls > 0
        want_prompt = np.zeros(N, dtype=np.int64)
        want_prompt[has_calls] = (d - g)[first_call[has_calls]]
        p.each(self.row_good & (prompt != want_prompt),
               lambda j: f"{name(j)}: prompt_len {prompt[j]}, expected {want_prompt[j]}")

    def check_token_rows(self, tokens: pa.Table) -> None:
        """Each call has one token row, delta_len long. Sets ``ti`` (its tokens row) and the
        tokens column's parts."""
        ids, p, d = self.ids, self.p, self.d
        t_key = np.where((ids.t_r >= 0) & (ids.t_c >= 0), ids.t_r * ids.NC + ids.t_c, -1)
        t_uniq, t_first, t_count = first_index(t_key)
        self.ti = ti = lookup(t_uniq, t_first, self.key)
        tcount = lookup(t_uniq, t_count, self.key)
        chk = self.row_good[self.owner]
        p.each(chk & (ti < 0), lambda k: f"{self.where(k)} has no token row")
        p.each(chk & (tcount > 1), lambda k: f"{self.where(k)} has several token rows")
        tok_off, self.tok_val = list_parts(tokens["tokens"])
        self.tok_off = tok_off
        tis = np.maximum(ti, 0)
        t_len = np.where(ti >= 0, (tok_off[1:] - tok_off[:-1])[tis] if len(tok_off) > 1 else 0, -1)
        p.each(chk & (ti >= 0) & (t_len != d),
               lambda k: f"{self.where(k)} has {t_len[k]} stored tokens, delta_len {d[k]}")
        bad_call = ~((ti >= 0) & (tcount == 1) & (t_len == d))
        self.row_good &= np.bincount(self.owner[bad_call], minlength=self.N) == 0

    def check_contents(self, tokens: pa.Table, calls: np.ndarray) -> None:
        """The rows' input_ids, loss_mask and logprobs against the ``calls``' stored deltas."""
        shape, owner, d, ti = self.shape, self.owner, self.d, self.ti
        tok_owner = np.repeat(owner[calls], d[calls])

        def rows_differ(bad, what):
            self.p.each(np.unique(tok_owner[bad]), lambda j: f"{self.name(j)}: {what}")

        start = _call_start(self.c_off, owner, d)
        src = range_index(self.tok_off[ti[calls]], d[calls])
        dst = range_index(shape.ids_off[owner[calls]] + start[calls], d[calls])
        want_ids = to_np(self.tok_val, np.int32)[src] if len(src) else np.zeros(0, np.int32)
        got_ids = to_np(shape.ids_val, np.int32)[dst] if len(dst) else np.zeros(0, np.int32)
        rows_differ(want_ids != got_ids, "input_ids differ from its calls' stored tokens")
        carry = np.repeat((d - self.g)[calls], d[calls])
        in_call = range_index(np.zeros(len(calls), np.int64), d[calls])
        trains = np.repeat(self.first_row[calls], d[calls])  # a later row's copy of a call: loss 0
        want_mask = ((in_call >= carry) & trains).astype(np.int64)
        rows_differ(want_mask != shape.mask_np[dst],
                    "loss_mask is not 0 on each delta's carry and 1 on its generated tokens")
        if shape.lp_col is None or "logprobs" not in tokens.column_names:
            return
        lp_in_off, lp_in_val = list_parts(tokens["logprobs"])
        lp_out_off, lp_out_val = list_parts(shape.lp_col)
        if not ((lp_in_off[1:] - lp_in_off[:-1])[ti[calls]] == d[calls]).all():
            self.p.add("logprobs: a trained call's stored logprobs are not delta_len long")
            return
        src_lp = range_index(lp_in_off[ti[calls]], d[calls])
        dst_lp = range_index(lp_out_off[owner[calls]] + start[calls], d[calls])
        a = to_np(lp_in_val, np.float32)[src_lp].view(np.uint32)
        b = to_np(lp_out_val, np.float32)[dst_lp].view(np.uint32)
        rows_differ(a != b, "logprobs differ from the stored ones")


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
