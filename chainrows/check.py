"""Reconcile a run's outputs with its input: nothing lost, nothing invented (SPEC §4).

    from chainrows.check import reconcile
    problems = reconcile("data/", "out/rows.parquet", "out/report.parquet")
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
- every row is the concatenation of its calls' deltas: each call in ``call_ids`` is a distinct
  ledger call of the rollout, the calls form one chain root -> leaf, ``input_ids`` are the
  token rows joined (so the token total is the sum of the calls' ``delta_len``), ``loss_mask``
  is 0 on each delta's carry and 1 on its generated tokens, ``logprobs`` are the stored ones,
  ``prompt_len`` is the root's carry and (``verify_hashes``) every call's chain hash holds;
- ``loss_tokens`` is the sum of the rollout's loss_mask; ``num_selected`` of an ok rollout is
  the number of calls in its rows, so every other call (``num_calls - num_selected``) is the
  unselected remainder, never trained.

Memory: everything is held at once (inputs and outputs); meant for tests, CI and audits of a
run's output, not for datasets beyond RAM.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from chainrows.io.columnar import range_index as _range_index
from chainrows.io.schema import REPORT_SCHEMA, ROWS_SCHEMA, tables_from_pylists
from chainrows.reasons import REASONS

__all__ = ["reconcile", "reconcile_output"]

_REASON_CODES = frozenset(r for r in REASONS if r)
_TABLES = ("ledger", "tokens", "rollouts")


class _Problems:
    """Collects problem lines; keeps the first ``limit`` and counts the rest."""

    def __init__(self, limit: int):
        self.limit = limit
        self.lines: list[str] = []
        self.dropped = 0

    def add(self, line: str) -> None:
        if len(self.lines) < self.limit:
            self.lines.append(line)
        else:
            self.dropped += 1

    def each(self, where: np.ndarray, fmt) -> None:
        """Add ``fmt(i)`` for each index in ``where`` (a bool mask or index array)."""
        idx = np.flatnonzero(where) if where.dtype == bool else where
        for n, i in enumerate(idx):
            if len(self.lines) >= self.limit:
                self.dropped += len(idx) - n
                return
            self.lines.append(fmt(int(i)))

    def result(self) -> list[str]:
        out = list(self.lines)
        if self.dropped:
            out.append(f"... and {self.dropped} more problem(s)")
        return out


def reconcile(dataset, rows, report, *, verify_hashes: bool = True,
              max_problems: int = 100) -> list[str]:
    """Check ``rows`` and ``report`` against the input ``dataset``; returns the problems found
    (one line each, at most ``max_problems`` plus a count of the rest), ``[]`` when consistent.

    ``dataset``: a dataset directory, a :class:`chainrows.io.dataset.Dataset`, or a
    ``(ledger, tokens, rollouts)`` triple of Arrow tables (or of dict lists). ``rows``/``report``:
    Arrow tables, or paths of Parquet files / directories of part files.
    """
    ledger, tokens, rollouts = _inputs(dataset)
    rows, report = _output(rows), _output(report)
    problems = _Problems(max_problems)
    if not _has_columns(problems, rows, report):
        return problems.result()
    _Reconciler(ledger, tokens, rollouts, rows, report, problems, verify_hashes).run()
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


# ----------------------------------------------------------------------------- loading

def _inputs(dataset) -> tuple[pa.Table, pa.Table, pa.Table]:
    if isinstance(dataset, (str, os.PathLike)):
        from chainrows.io.dataset import read_dataset

        dataset = read_dataset(dataset)
    if all(hasattr(dataset, n) for n in _TABLES):
        return dataset.ledger, dataset.tokens, dataset.rollouts
    ledger, tokens, rollouts = dataset
    if not isinstance(ledger, pa.Table):
        return tables_from_pylists(ledger, tokens, rollouts)
    return ledger, tokens, rollouts


def _output(x) -> pa.Table:
    if isinstance(x, pa.Table):
        return x
    path = Path(x)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if not p.name.startswith((".", "_")))
        tables = [pq.read_table(p) for p in files]
        return pa.concat_tables(tables) if tables else pa.table({})
    return pq.read_table(path)


def _has_columns(problems: _Problems, rows: pa.Table, report: pa.Table) -> bool:
    ok = True
    for name, table, schema in (("rows", rows, ROWS_SCHEMA), ("report", report, REPORT_SCHEMA)):
        for f in schema:
            if f.name == "logprobs":
                continue
            if f.name not in table.column_names:
                problems.add(f"{name}: missing column {f.name!r}")
                ok = False
    return ok


# ----------------------------------------------------------------------------- arrays

def _flat(col) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def _dictionary(cols: Iterable) -> pa.Array:
    """Sorted (byte order) distinct non-null strings of the given string columns."""
    chunks = []
    for col in cols:
        col = _flat(col)
        if pa.types.is_dictionary(col.type):
            col = col.dictionary_decode()
        chunks.append(col.cast(pa.large_string()))
    if not chunks:
        return pa.array([], pa.large_string())
    u = pc.unique(pa.chunked_array(chunks, pa.large_string()))
    u = u.filter(pc.is_valid(u))
    return u.take(pc.sort_indices(u))


def _codes(col, dictionary: pa.Array) -> np.ndarray:
    """Index of each value in ``dictionary``; -1 for nulls."""
    col = _flat(col)
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    idx = pc.index_in(col.cast(pa.large_string()), value_set=dictionary)
    return pc.fill_null(idx, -1).to_numpy(zero_copy_only=False).astype(np.int64)


def _list(col) -> tuple[np.ndarray, pa.Array]:
    """(offsets as int64 relative to values, values) of a list column; null lists are empty."""
    arr = _flat(col)
    if arr.null_count:
        arr = pc.fill_null(arr, pa.scalar([], arr.type))
        arr = _flat(arr)
    off = np.asarray(arr.offsets, dtype=np.int64)
    values = arr.values
    if off[0] != 0 or len(values) != off[-1]:  # a sliced array: re-base on the used values
        values = values.slice(int(off[0]), int(off[-1] - off[0]))
        off = off - off[0]
    return off, values


def _np(col, dtype=None, fill=None) -> np.ndarray:
    arr = _flat(col)
    if fill is not None:
        arr = pc.fill_null(arr, fill)
    out = arr.to_numpy(zero_copy_only=False)
    return out.astype(dtype) if dtype is not None else out


def _first_index(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sorted distinct keys, first position of each, count of each)."""
    uniq, first, counts = np.unique(keys, return_index=True, return_counts=True)
    return uniq, first, counts


def _lookup(uniq: np.ndarray, payload: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """payload of each key in the sorted ``uniq`` (-1 where absent)."""
    out = np.full(len(keys), -1, dtype=np.int64)
    if len(uniq) == 0 or len(keys) == 0:
        return out
    pos = np.searchsorted(uniq, keys)
    pos_c = np.minimum(pos, len(uniq) - 1)
    hit = (pos < len(uniq)) & (uniq[pos_c] == keys)
    out[hit] = payload[pos_c[hit]]
    return out


def _same_float(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b


def _finite(x) -> bool:
    return x is not None and math.isfinite(x)


# ----------------------------------------------------------------------------- the checks

class _Reconciler:
    def __init__(self, ledger, tokens, rollouts, rows, report, problems, verify_hashes):
        self.ledger, self.tokens, self.rollouts = ledger, tokens, rollouts
        self.rows, self.report = rows, report
        self.p = problems
        self.verify_hashes = verify_hashes

    def run(self) -> None:
        self._index_ids()
        self._check_report_ids()
        self._check_report_rows()
        self._check_rows()

    # -- ids
    def _index_ids(self) -> None:
        L, T, RO, rows, rep = self.ledger, self.tokens, self.rollouts, self.rows, self.report
        self.rdict = _dictionary([L["rollout_id"], T["rollout_id"], RO["rollout_id"],
                                  rep["rollout_id"], rows["rollout_id"]])
        self.NR = NR = len(self.rdict)
        self.l_r = _codes(L["rollout_id"], self.rdict)
        self.t_r = _codes(T["rollout_id"], self.rdict)
        self.ro_r = _codes(RO["rollout_id"], self.rdict)
        self.rep_r = _codes(rep["rollout_id"], self.rdict)
        self.row_r = _codes(rows["rollout_id"], self.rdict)
        self.seen = {name: np.bincount(codes[codes >= 0], minlength=NR) > 0
                     for name, codes in (("ledger", self.l_r), ("tokens", self.t_r),
                                         ("rollouts", self.ro_r))}
        self.in_input = self.seen["ledger"] | self.seen["tokens"] | self.seen["rollouts"]
        # calls: ledger call_id / parent_id, token call_id, row call_ids
        self.row_call_off, row_call_vals = _list(rows["call_ids"])
        self.cdict = _dictionary([L["call_id"], L["parent_id"], T["call_id"], row_call_vals])
        self.NC = max(len(self.cdict), 1)
        self.l_c = _codes(L["call_id"], self.cdict)
        self.l_parent = _codes(L["parent_id"], self.cdict)
        self.t_c = _codes(T["call_id"], self.cdict)
        self.row_c = _codes(row_call_vals, self.cdict)

    def rid(self, r: int) -> str:
        return repr(self.rdict[r].as_py()) if r >= 0 else "null"

    def _check_report_ids(self) -> None:
        p, NR, rep_r = self.p, self.NR, self.rep_r
        p.each(rep_r < 0, lambda i: f"report row {i}: rollout_id is null")
        count = np.bincount(rep_r[rep_r >= 0], minlength=NR)
        self.rep_count = count

        def where(r):
            return "/".join(n for n in _TABLES if self.seen[n][r])

        p.each(self.in_input & (count == 0),
               lambda r: f"rollout {self.rid(r)} (in {where(r)}) is missing from report")
        p.each(count > 1, lambda r: f"rollout {self.rid(r)} appears {count[r]} times in report")
        p.each(~self.in_input & (count > 0),
               lambda r: f"report rollout {self.rid(r)} is in no input table")
        valid = rep_r[rep_r >= 0]
        bad = np.flatnonzero(np.diff(valid) <= 0)
        if len(bad):
            p.add(f"report is not sorted by rollout_id (row {int(bad[0]) + 1}: "
                  f"{self.rid(int(valid[bad[0] + 1]))} after {self.rid(int(valid[bad[0]]))})")

    # -- report rows
    def _check_report_rows(self) -> None:
        p, NR = self.p, self.NR
        rep = self.report
        # per rollout: the first report row (-1 when none)
        self.rep_row = np.full(NR, -1, dtype=np.int64)
        valid = np.flatnonzero(self.rep_r >= 0)
        self.rep_row[self.rep_r[valid][::-1]] = valid[::-1]
        status = rep["status"].to_pylist()
        reason = rep["reason"].to_pylist()
        detail = rep["detail"].to_pylist()
        group = rep["group_id"].to_pylist()
        reward = rep["reward"].to_pylist()
        adv = rep["advantage"].to_pylist()
        num_rows = _np(rep["num_rows"], np.int64, fill=-1)
        num_calls = _np(rep["num_calls"], np.int64, fill=-1)
        num_sel = _np(rep["num_selected"], np.int64, fill=-1)
        num_roots = _np(rep["num_roots"], np.int64, fill=-1)
        loss = _np(rep["loss_tokens"], np.int64, fill=-1)

        calls = np.bincount(self.l_r[self.l_r >= 0], minlength=NR)
        root_mask = _np(pc.is_null(self.ledger["parent_id"]), bool)
        roots = np.bincount(self.l_r[root_mask & (self.l_r >= 0)], minlength=NR)
        failed = _np(self.ledger["failed"], bool, fill=False) if self.ledger.num_rows else np.zeros(0, bool)
        any_failed = np.bincount(self.l_r[failed & (self.l_r >= 0)], minlength=NR) > 0
        records = np.bincount(self.ro_r[self.ro_r >= 0], minlength=NR)
        rec_row = np.full(NR, -1, dtype=np.int64)
        v = np.flatnonzero(self.ro_r >= 0)
        rec_row[self.ro_r[v][::-1]] = v[::-1]
        rec_group = self.rollouts["group_id"].to_pylist()
        rec_reward = self.rollouts["reward"].to_pylist()

        self.ok = np.zeros(NR, dtype=bool)
        self.num_rows = np.zeros(NR, dtype=np.int64)
        self.num_sel = np.zeros(NR, dtype=np.int64)
        self.loss = np.zeros(NR, dtype=np.int64)
        self.group = [None] * NR
        self.reward = [None] * NR
        self.adv = [None] * NR
        for r in np.flatnonzero(self.rep_row >= 0):
            r = int(r)
            i = int(self.rep_row[r])
            name = f"report {self.rid(r)}"
            st, rs, dt = status[i], reason[i], detail[i]
            ok = st == "ok"
            self.ok[r] = ok
            self.num_rows[r], self.num_sel[r], self.loss[r] = num_rows[i], num_sel[i], loss[i]
            self.group[r], self.reward[r], self.adv[r] = group[i], reward[i], adv[i]
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
            if not _same_float(None if reward[i] is None else float(reward[i]),
                               None if want_reward is None else float(want_reward)):
                p.add(f"{name}: reward {reward[i]!r} but the rollouts table says {want_reward!r}")
            if (adv[i] is None) != (not _finite(want_reward)):
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
                if not _finite(want_reward):
                    p.add(f"{name}: ok with reward {want_reward!r}")
            elif num_rows[i] != 0 or loss[i] != 0:
                p.add(f"{name}: masked with num_rows {num_rows[i]}, loss_tokens {loss[i]}")

    # -- rows
    def _check_rows(self) -> None:
        p, NR, rows = self.p, self.NR, self.rows
        N = rows.num_rows
        row_r = self.row_r
        row_id = rows["row_id"].to_pylist()

        def name(j):
            return f"row {j} ({row_id[j]!r})"

        p.each(row_r < 0, lambda j: f"{name(j)}: rollout_id is null")
        known = (row_r >= 0)
        known[known] &= self.rep_row[row_r[known]] >= 0
        p.each((row_r >= 0) & ~known, lambda j: f"{name(j)}: rollout {self.rid(int(row_r[j]))} is not in report")
        rr = np.where(row_r >= 0, row_r, 0)
        ok_row = known & self.ok[rr]
        weight = _np(rows["weight"], np.float64, fill=np.nan)
        segment = _np(rows["segment"], np.int64, fill=-1)
        nseg = _np(rows["num_segments"], np.int64, fill=-1)
        prompt = _np(rows["prompt_len"], np.int64, fill=-1)
        ids_off, ids_val = _list(rows["input_ids"])
        mask_off, mask_val = _list(rows["loss_mask"])
        row_len = np.diff(ids_off)
        mask_np = _np(mask_val, np.int64) if len(mask_val) else np.zeros(0, np.int64)
        has_lp = "logprobs" in rows.column_names
        if has_lp != ("logprobs" in self.tokens.column_names):
            p.add(f"rows {'has' if has_lp else 'lacks'} a logprobs column but the tokens table "
                  f"{'lacks' if has_lp else 'has'} one")
        if has_lp:
            lp_off, lp_val = _list(rows["logprobs"])
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

        # masked rollouts: placeholders only (weight 0, no loss tokens)
        masked_row = known & ~self.ok[rr]
        p.each(masked_row & ~((weight == 0) & (mask_sum == 0)),
               lambda j: f"{name(j)}: rollout {self.rid(int(row_r[j]))} is masked but the row is "
                         f"not a placeholder (weight {weight[j]}, {mask_sum[j]} loss tokens)")
        masked_ids = np.flatnonzero((self.rep_row >= 0) & ~self.ok)
        with_rows = np.bincount(row_r[masked_row], minlength=NR) > 0
        if with_rows.any() and not with_rows[masked_ids].all():
            miss = masked_ids[~with_rows[masked_ids]]
            p.add(f"placeholders: {len(miss)} masked rollout(s) have none although others do "
                  f"(first {self.rid(int(miss[0]))})")

        # order, segments, ids, per-rollout fields
        order_key = np.where(row_r >= 0, row_r, -1)
        bad = np.flatnonzero((np.diff(order_key) < 0) |
                             ((np.diff(order_key) == 0) & (np.diff(segment) <= 0)))
        if len(bad):
            p.add(f"rows are not sorted by (rollout_id, segment) at {name(int(bad[0]) + 1)}")
        count = np.bincount(row_r[ok_row], minlength=NR)
        oks = np.flatnonzero(self.ok)
        p.each(oks[count[oks] != self.num_rows[oks]],
               lambda r: f"rollout {self.rid(r)}: report num_rows {self.num_rows[r]} but rows "
                         f"holds {count[r]}")
        first = np.full(NR, N, dtype=np.int64)
        np.minimum.at(first, row_r[ok_row], np.flatnonzero(ok_row))
        rank = np.arange(N) - first[rr]
        p.each(ok_row & ((segment != rank) | (nseg != count[rr])),
               lambda j: f"{name(j)}: segment {segment[j]} of {nseg[j]}, expected {rank[j]} of {count[rr[j]]}")
        want_id = pc.binary_join_element_wise(rows["rollout_id"],
                                              pc.cast(rows["segment"], pa.string()), "_s")
        same_id = _np(pc.equal(rows["row_id"], want_id), bool, fill=False)
        p.each(~same_id, lambda j: f"{name(j)}: row_id is not <rollout_id>_s<segment>")
        p.each(ok_row & ~(weight > 0), lambda j: f"{name(j)}: weight {weight[j]} of a trained row")
        group = rows["group_id"].to_pylist()
        reward = rows["reward"].to_pylist()
        adv = rows["advantage"].to_pylist()
        for j in np.flatnonzero(known):
            r = int(row_r[j])
            if group[j] != self.group[r] or not _same_float(reward[j], self.reward[r]) or \
                    not _same_float(adv[j], self.adv[r]):
                p.add(f"{name(j)}: group_id/reward/advantage ({group[j]!r}, {reward[j]!r}, "
                      f"{adv[j]!r}) differ from the report's ({self.group[r]!r}, "
                      f"{self.reward[r]!r}, {self.adv[r]!r})")

        # loss_tokens
        loss = np.bincount(row_r[ok_row], weights=mask_sum[ok_row], minlength=NR).astype(np.int64)
        p.each(oks[loss[oks] != self.loss[oks]],
               lambda r: f"rollout {self.rid(r)}: report loss_tokens {self.loss[r]} but its rows' "
                         f"loss_mask sums to {loss[r]}")

        self._check_row_calls(ok_row, row_len, lengths_ok, prompt, name, mask_np, ids_val,
                              rows["logprobs"] if has_lp else None)

    def _check_row_calls(self, ok_row, row_len, lengths_ok, prompt, name, mask_np, ids_val, lp_col):
        p, NR, NC = self.p, self.NR, self.NC
        N = len(ok_row)
        c_off = self.row_call_off
        n_calls = np.diff(c_off)
        owner = np.repeat(np.arange(N, dtype=np.int64), n_calls)
        pos = np.arange(len(owner), dtype=np.int64) - c_off[owner] if len(owner) else owner
        row_r = self.row_r
        # placeholder rows may hold no calls; a trained row must hold at least one
        p.each(ok_row & (n_calls == 0), lambda j: f"{name(j)}: a trained row with no call_ids")
        sel = ok_row[owner] & (self.row_c >= 0)
        key = np.where(sel, row_r[owner] * NC + self.row_c, -1)

        l_key = np.where((self.l_r >= 0) & (self.l_c >= 0), self.l_r * NC + self.l_c, -1)
        l_uniq, l_first, l_count = _first_index(l_key)
        li = _lookup(l_uniq, l_first, key)
        lcount = _lookup(l_uniq, l_count, key)
        li[~ok_row[owner]] = -1
        bad = ok_row[owner] & (li < 0)
        p.each(bad, lambda k: f"{name(int(owner[k]))}: call {self._cid(k)} is not a ledger call of "
                              f"rollout {self.rid(int(row_r[owner[k]]))}")
        p.each(ok_row[owner] & (lcount > 1),
               lambda k: f"{name(int(owner[k]))}: call {self._cid(k)} repeats in the ledger")
        # each call trained at most once per rollout
        used = key[ok_row[owner] & (key >= 0)]
        u, c = np.unique(used, return_counts=True)
        for k in u[c > 1][:5]:
            p.add(f"rollout {self.rid(int(k // NC))}: call {self.cdict[int(k % NC)].as_py()!r} "
                  f"is in several rows (or twice in one)")
        # num_selected of an ok rollout = calls in its rows
        per_r = np.bincount(row_r[owner[ok_row[owner]]], minlength=NR)
        oks = np.flatnonzero(self.ok)
        p.each(oks[per_r[oks] != self.num_sel[oks]],
               lambda r: f"rollout {self.rid(r)}: num_selected {self.num_sel[r]} but its rows hold "
                         f"{per_r[r]} call(s)")

        good_call = li >= 0
        row_good = ok_row & lengths_ok & (np.bincount(owner[~good_call & ok_row[owner]], minlength=N) == 0)
        if not row_good.any():
            return
        # chain structure: root first, then each call's parent is the call before it
        parent = np.where(good_call, self.l_parent[np.maximum(li, 0)], -2)
        prev_c = np.empty_like(self.row_c)
        if len(prev_c):
            prev_c[1:] = self.row_c[:-1]
            prev_c[0] = -3
        chained = np.where(pos == 0, parent == -1, parent == prev_c)
        p.each(row_good[owner] & ~chained,
               lambda k: f"{name(int(owner[k]))}: call {self._cid(k)} at position {pos[k]} "
                         f"{'is not a root' if pos[k] == 0 else 'is not a child of the call before it'}")
        # lengths: tokens, carry/gen, prompt_len
        delta = _np(self.ledger["delta_len"], np.int64)
        gen = _np(self.ledger["gen_len"], np.int64)
        lis = np.maximum(li, 0)
        d = np.where(good_call, delta[lis] if len(delta) else 0, 0)
        g = np.where(good_call, gen[lis] if len(gen) else 0, 0)
        in_range = (d >= 1) & (g >= 1) & (g <= d) & (d <= max(len(ids_val), 1))
        p.each(row_good[owner] & ~in_range,
               lambda k: f"{name(int(owner[k]))}: call {self._cid(k)} has delta_len {d[k]}, "
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
        t_key = np.where((self.t_r >= 0) & (self.t_c >= 0), self.t_r * NC + self.t_c, -1)
        t_uniq, t_first, t_count = _first_index(t_key)
        ti = _lookup(t_uniq, t_first, key)
        tcount = _lookup(t_uniq, t_count, key)
        chk = row_good[owner]
        p.each(chk & (ti < 0), lambda k: f"{name(int(owner[k]))}: call {self._cid(k)} has no token row")
        p.each(chk & (tcount > 1), lambda k: f"{name(int(owner[k]))}: call {self._cid(k)} has several token rows")
        tok_off, tok_val = _list(self.tokens["tokens"])
        tis = np.maximum(ti, 0)
        t_len = np.where(ti >= 0, (tok_off[1:] - tok_off[:-1])[tis] if len(tok_off) > 1 else 0, -1)
        p.each(chk & (ti >= 0) & (t_len != d),
               lambda k: f"{name(int(owner[k]))}: call {self._cid(k)} has {t_len[k]} stored tokens, "
                         f"delta_len {d[k]}")
        bad_call = ~((ti >= 0) & (tcount == 1) & (t_len == d))
        row_good &= np.bincount(owner[bad_call], minlength=N) == 0
        calls = np.flatnonzero(row_good[owner])
        if not len(calls):
            return
        src = _range_index(tok_off[ti[calls]], d[calls])
        dst = _range_index(self._ids_off_rows()[owner[calls]] + self._call_start(owner, d)[calls], d[calls])
        tok_owner = np.repeat(owner[calls], d[calls])
        want_ids = _np(tok_val, np.int32)[src] if len(src) else np.zeros(0, np.int32)
        got_ids = _np(ids_val, np.int32)[dst] if len(dst) else np.zeros(0, np.int32)
        self._report_rows(tok_owner, want_ids != got_ids, name, "input_ids differ from its calls' stored tokens")
        carry = np.repeat((d - g)[calls], d[calls])
        in_call = _range_index(np.zeros(len(calls), np.int64), d[calls])
        want_mask = (in_call >= carry).astype(np.int64)
        self._report_rows(tok_owner, want_mask != mask_np[dst], name,
                          "loss_mask is not 0 on each delta's carry and 1 on its generated tokens")
        if lp_col is not None and "logprobs" in self.tokens.column_names:
            lp_in_off, lp_in_val = _list(self.tokens["logprobs"])
            lp_out_off, lp_out_val = _list(lp_col)
            lp_ok = (lp_in_off[1:] - lp_in_off[:-1])[ti[calls]] == d[calls]
            if lp_ok.all():
                src_lp = _range_index(lp_in_off[ti[calls]], d[calls])
                dst_lp = _range_index(lp_out_off[owner[calls]] + self._call_start(owner, d)[calls], d[calls])
                a = _np(lp_in_val, np.float32)[src_lp].view(np.uint32)
                b = _np(lp_out_val, np.float32)[dst_lp].view(np.uint32)
                self._report_rows(tok_owner, a != b, name, "logprobs differ from the stored ones")
            else:
                p.add("logprobs: a trained call's stored logprobs are not delta_len long")
        if self.verify_hashes:
            self._verify_hashes(calls, owner, li, ti, d, tok_off, tok_val, name)

    def _ids_off_rows(self) -> np.ndarray:
        return _list(self.rows["input_ids"])[0]

    def _call_start(self, owner, d) -> np.ndarray:
        """Offset of each call's delta within its row (cumulative delta_len of earlier calls)."""
        if not hasattr(self, "_cs"):
            cum = np.cumsum(d) - d
            row_first = self.row_call_off[:-1]
            base = np.zeros(len(owner), dtype=np.int64)
            if len(owner):
                base = cum[row_first[owner]] if len(cum) else base
            self._cs = cum - base
        return self._cs

    def _report_rows(self, tok_owner, bad, name, what) -> None:
        rows_bad = np.unique(tok_owner[bad])
        self.p.each(rows_bad, lambda j: f"{name(j)}: {what}")

    def _verify_hashes(self, calls, owner, li, ti, d, tok_off, tok_val, name) -> None:
        hashes = _np(self.ledger["chain_hash"], np.uint64)
        tok = _np(tok_val, np.int32).astype("<i4", copy=False)
        for k in calls:
            c = int(li[k])
            parent = self._parent_of(c)
            seed = 0 if parent < 0 else int(hashes[parent])
            s = int(tok_off[ti[k]])
            got = xxhash.xxh3_64_intdigest(tok[s:s + int(d[k])].tobytes(), seed)
            if got != int(hashes[c]):
                self.p.add(f"{name(int(owner[k]))}: call {self._cid(k)} fails its chain hash")

    def _parent_of(self, c: int) -> int:
        """Ledger index of call c's parent (first ledger row with that id in the rollout), -1 if root."""
        if not hasattr(self, "_pindex"):
            NC = self.NC
            l_key = np.where((self.l_r >= 0) & (self.l_c >= 0), self.l_r * NC + self.l_c, -1)
            uniq, first, _ = _first_index(l_key)
            pk = np.where(self.l_parent >= 0, self.l_r * NC + self.l_parent, -1)
            self._pindex = np.where(self.l_parent >= 0, _lookup(uniq, first, pk), -1)
        return int(self._pindex[c])

    def _cid(self, k: int) -> str:
        c = int(self.row_c[k])
        return repr(self.cdict[c].as_py()) if c >= 0 else "null"
