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


def build_batch(cfg: Cfg, first: int, stop: int) -> tuple[tuple[pa.Table, pa.Table, pa.Table], dict]:
    """Rollouts ``first`` to ``stop`` (exclusive) of the run as (ledger, tokens, rollouts) tables,
    and their counts (rollouts, corrupt, calls, tokens)."""
    # ledger columns
    l_ro, l_cid, l_par, l_rid = [], [], [], []
    l_prev, l_delta, l_gen, l_hash, l_failed = [], [], [], [], []
    k_offs, k_vals, i_offs, i_vals, i_null = [0], [], [0], [], []
    l_key = []  # interleave sort key
    # tokens rows
    t_ro, t_cid, t_start, t_stop, t_lstart, t_lstop, t_key = [], [], [], [], [], [], []
    toks, lps = [], []
    base = 0
    # rollouts columns
    r_ro, r_gid, r_rew, r_term = [], [], [], []
    ok_offs, ok_vals, oi_offs, oi_vals, oi_null = [0], [], [0], [], []
    a_offs, a_vals, a_null = [0], [], []
    n_corrupt = 0
    kinds: dict[str, int] = {}  # corruption kind -> rollouts

    for b0 in range(first, stop, BLOCK):
        b1 = min(b0 + BLOCK, stop)
        brng = rng_for(cfg.seed, 2, b0 // BLOCK)
        overlap = brng.uniform(0.0, 2.5, BLOCK)
        n_tok_rows_before = len(t_ro)
        for i in range(b0, b1):
            ro = simulate(cfg, i)
            n_corrupt += ro.kind is not None
            if ro.kind is not None:
                kinds[ro.kind] = kinds.get(ro.kind, 0) + 1
            rid = f"r{i:08d}"
            local = (i - b0) + (b0 // BLOCK) * (BLOCK + 8)
            n = len(ro.calls)
            ov = overlap[i - b0] / max(n, 1)
            for pos, c in enumerate(ro.calls):
                l_ro.append(rid)
                l_cid.append(c[CID])
                l_par.append(c[PARENT])
                l_rid.append(c[RID])
                l_prev.append(c[PREV])
                l_delta.append(c[DELTA])
                l_gen.append(c[GEN])
                l_hash.append(c[HASH])
                l_failed.append(c[FAILED])
                keys = c[KEYS]
                k_vals.extend(keys)
                k_offs.append(len(k_vals))
                ids = c[IDS]
                if ids is None:
                    i_null.append(True)
                else:
                    i_null.append(False)
                    i_vals.extend(ids)
                i_offs.append(len(i_vals))
                l_key.append(local + pos * ov)
            for tr in ro.tok_rows:
                t_ro.append(rid)
                t_cid.append(tr[0])
                t_start.append(base + tr[1])
                t_stop.append(base + tr[2])
                t_lstart.append(base + tr[3])
                t_lstop.append(base + tr[4])
            toks.append(ro.tok)
            if ro.lp is not None:
                lps.append(ro.lp)
            base += len(ro.tok)
            for row in ro.ro_rows:
                r_ro.append(row[0])
                r_gid.append(row[1])
                r_rew.append(row[2])
                ok_vals.extend(row[3])
                ok_offs.append(len(ok_vals))
                if row[4] is None:
                    oi_null.append(True)
                else:
                    oi_null.append(False)
                    oi_vals.extend(row[4])
                oi_offs.append(len(oi_vals))
                r_term.append(row[5])
                if row[6] is None:
                    a_null.append(True)
                else:
                    a_null.append(False)
                    a_vals.extend(row[6])
                a_offs.append(len(a_vals))
        # token rows: shuffled within the block
        nt = len(t_ro) - n_tok_rows_before
        t_key.extend((brng.permutation(nt) + n_tok_rows_before).tolist())

    ledger = pa.Table.from_arrays(
        [
            pa.array(l_ro, pa.string()),
            pa.array(l_cid, pa.string()),
            pa.array(l_par, pa.string()),
            pa.array(l_rid, pa.string()),
            pa.array(np.array(l_prev, dtype=np.int64)),
            pa.array(np.array(l_delta, dtype=np.int64)),
            pa.array(np.array(l_gen, dtype=np.int64)),
            pa.array(np.array(l_hash, dtype=np.uint64)),
            _list_array(k_offs, pa.array(np.array(k_vals, dtype=np.uint64))),
            _list_array(i_offs, pa.array(i_vals, pa.string()), i_null),
            pa.array(np.array(l_failed, dtype=bool)),
        ],
        schema=LEDGER_SCHEMA,
    )
    if len(l_key):
        ledger = ledger.take(pa.array(np.argsort(np.array(l_key), kind="stable")))

    order = np.array(t_key, dtype=np.int64)  # t_key[j] = source row of output row j
    tok_buf = np.concatenate(toks) if toks else np.zeros(0, np.int32)
    starts = np.array(t_start, dtype=np.int64)[order] if len(order) else np.zeros(0, np.int64)
    lens = (np.array(t_stop, dtype=np.int64) - np.array(t_start, dtype=np.int64))[order] if len(order) else starts
    tvals, toffs = _gather(tok_buf, starts, lens)
    if len(toffs) and toffs[-1] >= 2**31:
        raise ValueError("a batch holds 2**31 tokens or more: pass a smaller batch_rollouts")
    t_ro_arr = pa.array(t_ro, pa.string()).take(pa.array(order))
    t_cid_arr = pa.array(t_cid, pa.string()).take(pa.array(order))
    cols = [t_ro_arr, t_cid_arr, _list_array(toffs, pa.array(tvals))]
    schema = TOKENS_SCHEMA
    if cfg.logprobs:
        lp_buf = np.concatenate(lps) if lps else np.zeros(0, np.float32)
        lstarts = np.array(t_lstart, dtype=np.int64)[order] if len(order) else starts
        llens = (np.array(t_lstop, dtype=np.int64) - np.array(t_lstart, dtype=np.int64))[order] if len(order) else lens
        lvals, loffs = _gather(lp_buf, lstarts, llens)
        cols.append(_list_array(loffs, pa.array(lvals)))
        schema = schema.append(LOGPROBS_FIELD)
    tokens = pa.Table.from_arrays(cols, schema=schema)

    rollouts = pa.Table.from_arrays(
        [
            pa.array(r_ro, pa.string()),
            pa.array(r_gid, pa.string()),
            pa.array(r_rew, pa.float64()),
            _list_array(ok_offs, pa.array(np.array(ok_vals, dtype=np.uint64))),
            _list_array(oi_offs, pa.array(oi_vals, pa.string()), oi_null),
            pa.array(r_term, pa.string()),
            _list_array(a_offs, pa.array(a_vals, pa.string()), a_null),
        ],
        schema=ROLLOUTS_SCHEMA.append(ACCEPTED_FIELD),
    )
    stats = {"rollouts": stop - first, "corrupt": n_corrupt, "calls": ledger.num_rows, "tokens": int(len(tvals)),
             "kinds": kinds}
    return (ledger, tokens, rollouts), stats


def tables_schemas(logprobs: bool = True) -> tuple[pa.Schema, pa.Schema, pa.Schema]:
    """The (ledger, tokens, rollouts) schemas synth produces."""
    tok = TOKENS_SCHEMA.append(LOGPROBS_FIELD) if logprobs else TOKENS_SCHEMA
    return LEDGER_SCHEMA, tok, ROLLOUTS_SCHEMA.append(ACCEPTED_FIELD)
