"""One integer code per rollout id and per call id, over every input and output table, so
that the checks compare ids as numpy arrays."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from chainrows.testing.reconcile.arrays import codes, dictionary, list_parts

TABLES = ("ledger", "tokens", "rollouts")


class Ids:
    """Rollout codes (``*_r``: index into ``rdict``, -1 for null) and call codes (``*_c``,
    ``l_parent``: index into ``cdict``) of each table's rows; ``row_c`` has one code per entry of
    the rows' ``call_ids`` (offsets ``row_call_off``). ``seen[table][r]``: rollout r has a row
    in that input table; ``in_input``: in any of them."""

    def __init__(self, ledger: pa.Table, tokens: pa.Table, rollouts: pa.Table, rows: pa.Table,
                 report: pa.Table):
        L, T, RO, rep = ledger, tokens, rollouts, report
        self.rdict = dictionary([L["rollout_id"], T["rollout_id"], RO["rollout_id"],
                                 rep["rollout_id"], rows["rollout_id"]])
        self.NR = NR = len(self.rdict)
        self.l_r = codes(L["rollout_id"], self.rdict)
        self.t_r = codes(T["rollout_id"], self.rdict)
        self.ro_r = codes(RO["rollout_id"], self.rdict)
        self.rep_r = codes(rep["rollout_id"], self.rdict)
        self.row_r = codes(rows["rollout_id"], self.rdict)
        self.seen = {name: np.bincount(c[c >= 0], minlength=NR) > 0
                     for name, c in (("ledger", self.l_r), ("tokens", self.t_r),
                                     ("rollouts", self.ro_r))}
        self.in_input = self.seen["ledger"] | self.seen["tokens"] | self.seen["rollouts"]
        # calls: ledger call_id / parent_id, token call_id, row call_ids
        self.row_call_off, row_call_vals = list_parts(rows["call_ids"])
        self.cdict = dictionary([L["call_id"], L["parent_id"], T["call_id"], row_call_vals])
        self.NC = max(len(self.cdict), 1)
        self.l_c = codes(L["call_id"], self.cdict)
        self.l_parent = codes(L["parent_id"], self.cdict)
        self.t_c = codes(T["call_id"], self.cdict)
        self.row_c = codes(row_call_vals, self.cdict)

    def rid(self, r: int) -> str:
        """Rollout code r as text for a problem line."""
        return repr(self.rdict[r].as_py()) if r >= 0 else "null"

    def cid(self, k: int) -> str:
        """The k-th entry of the rows' call_ids as text for a problem line."""
        c = int(self.row_c[k])
        return repr(self.cdict[c].as_py()) if c >= 0 else "null"

    def ledger_keys(self) -> np.ndarray:
        """(rollout, call) of each ledger row as one int64 key; -1 where either is null."""
        return np.where((self.l_r >= 0) & (self.l_c >= 0), self.l_r * self.NC + self.l_c, -1)
