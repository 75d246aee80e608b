"""The table builder: consecutive rollouts, simulated, into one batch of (ledger, tokens,
rollouts) Arrow tables of the SPEC §2 schemas.

Rollouts come in blocks of ``BLOCK``: within a block, ledger rows of different rollouts
interleave a little (capture order kept within a rollout) and token rows are shuffled, with a
generator seeded by ``(2, block)``, so a batch of whole blocks does not depend on where the
other batches start."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from chainrows.arrays import offsets_from_lengths, range_index
from chainrows.formats.native.schema import (
    ACCEPTED_FIELD,
    LEDGER_SCHEMA,
    LOGPROBS_FIELD,
    ROLLOUTS_SCHEMA,
    TOKENS_SCHEMA,
)
from chainrows.synth.calls import CID, DELTA, FAILED, GEN, HASH, IDS, KEYS, PARENT, PREV, RID
from chainrows.synth.harness import Cfg, rng_for, simulate
from chainrows.synth.params import BLOCK


def _list_array(offsets: list[int] | np.ndarray, values: pa.Array, nulls: list[bool] | None = None) -> pa.Array:
    offs = pa.array(np.asarray(offsets, dtype=np.int32))
    mask = pa.array(nulls, type=pa.bool_()) if nulls is not None and any(nulls) else None
    return pa.ListArray.from_arrays(offs, values, mask=mask)


def _gather(buf: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate buf[starts[k] : starts[k] + lens[k]] for every k; returns (values, offsets)."""
    return buf[range_index(starts, lens)], offsets_from_lengths(lens)


class _Lists:
    """A list column as it is built: the values back to back, the offsets, a null flag per list."""

    def __init__(self):
        self.offsets, self.values, self.nulls = [0], [], []

    def add(self, values: list | None) -> None:
        self.nulls.append(values is None)
        if values is not None:
            self.values.extend(values)
        self.offsets.append(len(self.values))

    def array(self, values: pa.Array) -> pa.Array:
        """The column, over ``values`` (this column's values, converted)."""
        return _list_array(self.offsets, values, self.nulls)


class _Ledger:
    """The ledger's columns, a row per call, and each row's interleave sort key."""

    def __init__(self):
        self.ro, self.cid, self.par, self.rid = [], [], [], []
        self.prev, self.delta, self.gen, self.hash, self.failed = [], [], [], [], []
        self.keys, self.ids = _Lists(), _Lists()
        self.sort_key = []

    def add(self, rid: str, calls: list, local: int, step: float) -> None:
        """A rollout's calls, in capture order; call ``pos`` sorts at ``local + pos * step``."""
        for pos, c in enumerate(calls):
            self.ro.append(rid)
            self.cid.append(c[CID])
            self.par.append(c[PARENT])
            self.rid.append(c[RID])
            self.prev.append(c[PREV])
            self.delta.append(c[DELTA])
            self.gen.append(c[GEN])
            self.hash.append(c[HASH])
            self.failed.append(c[FAILED])
            self.keys.add(c[KEYS])
            self.ids.add(c[IDS])
            self.sort_key.append(local + pos * step)

    def table(self) -> pa.Table:
        ledger = pa.Table.from_arrays(
            [
                pa.array(self.ro, pa.string()),
                pa.array(self.cid, pa.string()),
                pa.array(self.par, pa.string()),
                pa.array(self.rid, pa.string()),
                pa.array(np.array(self.prev, dtype=np.int64)),
                pa.array(np.array(self.delta, dtype=np.int64)),
                pa.array(np.array(self.gen, dtype=np.int64)),
                pa.array(np.array(self.hash, dtype=np.uint64)),
                self.keys.array(pa.array(np.array(self.keys.values, dtype=np.uint64))),
                self.ids.array(pa.array(self.ids.values, pa.string())),
                pa.array(np.array(self.failed, dtype=bool)),
            ],
            schema=LEDGER_SCHEMA,
        )
        if len(self.sort_key):
            ledger = ledger.take(pa.array(np.argsort(np.array(self.sort_key), kind="stable")))
        return ledger


class _Tokens:
    """The token rows (spans into the rollouts' token and logprob buffers laid end to end) and
    their output order, shuffled within each block."""

    def __init__(self):
        self.ro, self.cid, self.start, self.stop, self.lstart, self.lstop = [], [], [], [], [], []
        self.order = []  # order[j] = source row of output row j
        self.toks, self.lps, self.base = [], [], 0

    def add(self, rid: str, ro) -> None:
        base = self.base
        for tr in ro.tok_rows:
            self.ro.append(rid)
            self.cid.append(tr[0])
            self.start.append(base + tr[1])
            self.stop.append(base + tr[2])
            self.lstart.append(base + tr[3])
            self.lstop.append(base + tr[4])
        self.toks.append(ro.tok)
        if ro.lp is not None:
            self.lps.append(ro.lp)
        self.base += len(ro.tok)

    def shuffle(self, brng: np.random.Generator, block_first: int) -> None:
        """Rows ``block_first`` on (one block's) come out in a random order."""
        n = len(self.ro) - block_first
        self.order.extend((brng.permutation(n) + block_first).tolist())

    def table(self, logprobs: bool) -> tuple[pa.Table, int]:
        """The table and its number of tokens."""
        order = np.array(self.order, dtype=np.int64)
        tok_buf = np.concatenate(self.toks) if self.toks else np.zeros(0, np.int32)
        starts = np.array(self.start, dtype=np.int64)[order] if len(order) else np.zeros(0, np.int64)
        lens = ((np.array(self.stop, dtype=np.int64) - np.array(self.start, dtype=np.int64))[order]
                if len(order) else starts)
        tvals, toffs = _gather(tok_buf, starts, lens)
        if len(toffs) and toffs[-1] >= 2**31:
            raise ValueError("a batch holds 2**31 tokens or more: pass a smaller batch_rollouts")
        cols = [pa.array(self.ro, pa.string()).take(pa.array(order)),
                pa.array(self.cid, pa.string()).take(pa.array(order)),
                _list_array(toffs, pa.array(tvals))]
        schema = TOKENS_SCHEMA
        if logprobs:
            lp_buf = np.concatenate(self.lps) if self.lps else np.zeros(0, np.float32)
            lstarts = np.array(self.lstart, dtype=np.int64)[order] if len(order) else starts
            llens = ((np.array(self.lstop, dtype=np.int64) - np.array(self.lstart, dtype=np.int64))[order]
                     if len(order) else lens)
            lvals, loffs = _gather(lp_buf, lstarts, llens)
            cols.append(_list_array(loffs, pa.array(lvals)))
            schema = schema.append(LOGPROBS_FIELD)
        return pa.Table.from_arrays(cols, schema=schema), int(len(tvals))


class _Rollouts:
    """The rollouts table's columns, a row per rollouts row."""

    def __init__(self):
        self.ro, self.gid, self.reward, self.terminal = [], [], [], []
        self.out_keys, self.out_ids, self.accepted = _Lists(), _Lists(), _Lists()

    def add(self, rows: list) -> None:
        for row in rows:
            self.ro.append(row[0])
            self.gid.append(row[1])
            self.reward.append(row[2])
            self.out_keys.add(row[3])
            self.out_ids.add(row[4])
            self.terminal.append(row[5])
            self.accepted.add(row[6])

    def table(self) -> pa.Table:
        return pa.Table.from_arrays(
            [
                pa.array(self.ro, pa.string()),
                pa.array(self.gid, pa.string()),
                pa.array(self.reward, pa.float64()),
                self.out_keys.array(pa.array(np.array(self.out_keys.values, dtype=np.uint64))),
                self.out_ids.array(pa.array(self.out_ids.values, pa.string())),
                pa.array(self.terminal, pa.string()),
                self.accepted.array(pa.array(self.accepted.values, pa.string())),
            ],
            schema=ROLLOUTS_SCHEMA.append(ACCEPTED_FIELD),
        )


def build_batch(cfg: Cfg, first: int, stop: int) -> tuple[tuple[pa.Table, pa.Table, pa.Table], dict]:
    """Rollouts ``first`` to ``stop`` (exclusive) of the run as (ledger, tokens, rollouts) tables,
    and their counts (rollouts, corrupt, calls, tokens)."""
    ledger, tokens, rollouts = _Ledger(), _Tokens(), _Rollouts()
    n_corrupt = 0
    kinds: dict[str, int] = {}  # corruption kind -> rollouts
    for b0 in range(first, stop, BLOCK):
        brng = rng_for(cfg.seed, 2, b0 // BLOCK)
        overlap = brng.uniform(0.0, 2.5, BLOCK)
        block_first = len(tokens.ro)
        for i in range(b0, min(b0 + BLOCK, stop)):
            ro = simulate(cfg, i)
            if ro.kind is not None:
                n_corrupt += 1
                kinds[ro.kind] = kinds.get(ro.kind, 0) + 1
            rid = f"r{i:08d}"
            local = (i - b0) + (b0 // BLOCK) * (BLOCK + 8)
            ledger.add(rid, ro.calls, local, overlap[i - b0] / max(len(ro.calls), 1))
            tokens.add(rid, ro)
            rollouts.add(ro.ro_rows)
        tokens.shuffle(brng, block_first)
    ledger_table, (tokens_table, n_tokens) = ledger.table(), tokens.table(cfg.logprobs)
    stats = {"rollouts": stop - first, "corrupt": n_corrupt, "calls": ledger_table.num_rows, "tokens": n_tokens,
             "kinds": kinds}
    return (ledger_table, tokens_table, rollouts.table()), stats


def tables_schemas(logprobs: bool = True) -> tuple[pa.Schema, pa.Schema, pa.Schema]:
    """The (ledger, tokens, rollouts) schemas synth produces."""
    tok = TOKENS_SCHEMA.append(LOGPROBS_FIELD) if logprobs else TOKENS_SCHEMA
    return LEDGER_SCHEMA, tok, ROLLOUTS_SCHEMA.append(ACCEPTED_FIELD)
