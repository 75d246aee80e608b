"""The corruptions: exactly one per corrupt rollout; each kind is named after the SPEC §3 reason
it triggers (``params.CORRUPT_KINDS``, ``params.CORRUPT_TARGETS``). ``needed_structure`` says what
structure the clean rollout must have for the kind to apply; ``corrupt_rollout`` applies it in place."""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

from chainrows.synth.calls import CID, DELTA, FAILED, GEN, HASH, IDS, KEYS, PARENT, PREV, RID, Rollout, hex_id

if TYPE_CHECKING:
    from chainrows.synth.harness import Cfg


def needed_structure(kind: str | None) -> dict:
    """Structure a corruption kind needs from the clean rollout it corrupts."""
    if kind in ("out_of_order",):
        return {"min_acc": 2}
    if kind == "broken_chain":
        return {"min_acc": 2, "link": True}
    if kind == "multiple_roots":
        return {"min_acc": 2, "compaction": "force"}
    if kind == "ambiguous_terminal":
        return {"min_acc": 2, "compaction": "never", "retry": "force_nonroot", "terminal": "null"}
    if kind == "walk_mismatch":
        return {"min_acc": 2, "compaction": "never", "retry": "never", "terminal": "set"}
    if kind == "ambiguous_output":
        return {"terminal": "null", "accepted": "null"}
    if kind == "accepted_mismatch":
        return {"accepted": "set"}
    return {}


def corrupt_rollout(ro: Rollout, kind: str, r: random.Random, acc: list[int], spans, cfg: "Cfg") -> None:
    """Apply the corruption ``kind`` to the clean rollout ``ro`` in place (``acc``: its accepted
    calls, ``spans``: its token spans), so that the engine masks it with the reason ``kind``
    names."""
    calls, tok_rows, row = ro.calls, ro.tok_rows, ro.ro_rows[0]
    rejected = [k for k in range(len(calls)) if k not in set(acc)]
    sel = acc[r.randrange(len(acc))]  # a random selected call (capture position)

    def bogus(prefix: str) -> str:
        return prefix + "missing_" + hex_id(r, 8)

    if kind == "no_rollout_record":
        ro.ro_rows = []
    elif kind == "no_calls":
        ro.calls, ro.tok_rows = [], []
    elif kind == "capture_failed":
        calls[r.randrange(len(calls))][FAILED] = True
    elif kind == "reward_invalid":
        row[2] = r.choice((None, math.nan, math.inf, -math.inf))
    elif kind == "duplicate_call":
        variants = ["call_id", "token_row", "rollouts_row"] + (["response_id"] if len(calls) > 1 else [])
        v = r.choice(variants)
        if v == "call_id":  # the same call captured twice
            k = r.randrange(len(calls))
            calls.insert(k + 1, list(calls[k]))
        elif v == "response_id":
            a, b = sorted(r.sample(range(len(calls)), 2))
            calls[b][RID] = calls[a][RID]
        elif v == "token_row":
            tok_rows.append(list(tok_rows[r.randrange(len(tok_rows))]))
        else:  # the rollouts row written twice, the second with another reward
            dup = list(row)
            dup[2] = 1.0 - (row[2] or 0.0)
            ro.ro_rows.append(dup)
    elif kind == "length_mismatch":
        variants = ["item_ids", "output_ids", "delta_len", "prev_len", "gen_len"]
        if cfg.logprobs:
            variants.append("logprobs")
        v = r.choice(variants)
        c = calls[sel]
        if v == "item_ids":
            c = calls[r.randrange(len(calls))]
            ids = c[IDS] if c[IDS] is not None else [None] * len(c[KEYS])
            c[IDS] = ids[:-1] if r.random() < 0.5 else ids + ["rs_" + hex_id(r)]
        elif v == "output_ids":
            ids = row[4] if row[4] is not None else [None] * len(row[3])
            row[4] = ids[:-1] if r.random() < 0.5 else ids + [None]
        elif v == "delta_len":
            c[DELTA] += 1
        elif v == "prev_len":
            c[PREV] += r.choice((1, -1)) if c[PREV] > 0 else 1
        elif v == "gen_len":
            c[GEN] = r.choice((0, c[DELTA] + 1))
        else:  # one logprob short
            tok_rows[sel][4] -= 1
    elif kind == "no_output":
        row[3], row[4] = [], ([] if r.random() < 0.5 else None)
    elif kind == "unmatched_output":
        p = r.randrange(len(row[3]))
        row[3] = list(row[3])
        row[3][p] = r.getrandbits(64)
    elif kind == "ambiguous_output":
        # The last accepted call served twice, identically (temperature 0), with no ids, no
        # terminal and no accepted list to tell the two apart.
        last = acc[-1]
        c = calls[last]
        n = len(c[KEYS])
        c[IDS] = None
        if row[4] is not None:
            row[4] = row[4][: len(row[3]) - n] + [None] * n
        row[5] = row[6] = None
        twin = list(c)
        twin[CID] = c[CID] + "a"
        twin[RID] = "resp_" + hex_id(r)
        calls.insert(last, twin)
        tok_rows.insert(last, [twin[CID]] + tok_rows[last][1:])
    elif kind == "out_of_order":
        k = r.randrange(len(acc) - 1)
        a, b = acc[k], acc[k + 1]
        calls[a], calls[b] = calls[b], calls[a]
    elif kind == "terminal_mismatch":
        options = [bogus("resp_")]
        if len(acc) > 1:
            options.append(calls[acc[r.randrange(len(acc) - 1)]][RID])
        if rejected:
            options.append(calls[r.choice(rejected)][RID])
        row[5] = r.choice(options)
    elif kind == "accepted_mismatch":
        extra = calls[r.choice(rejected)][RID] if rejected and r.random() < 0.5 else bogus("resp_")
        row[6] = list(row[6]) + [extra]
    elif kind == "broken_chain":
        # The output skips an accepted call whose child is the next accepted call.
        links = [k for k in range(len(acc) - 1) if calls[acc[k + 1]][PARENT] == calls[acc[k]][CID]]
        k = r.choice(links)
        skip = calls[acc[k]]
        start = sum(len(calls[a][KEYS]) for a in acc[:k])
        n = len(skip[KEYS])
        row[3] = row[3][:start] + row[3][start + n :]
        if row[4] is not None:
            row[4] = row[4][:start] + row[4][start + n :]
        if row[6] is not None:
            row[6] = [x for x in row[6] if x != skip[RID]]
    elif kind == "walk_mismatch":
        k = r.randrange(1, len(acc))
        calls[acc[k]][PARENT] = bogus("c")
    elif kind in ("multiple_roots", "ambiguous_terminal"):
        pass  # structural only (see needed_structure): clean in cc mode
    elif kind == "missing_tokens":
        del tok_rows[sel]
    elif kind == "hash_mismatch":
        if r.random() < 0.75:  # a token flipped after capture
            t = r.randrange(tok_rows[sel][1], tok_rows[sel][2])
            ro.tok[t] = (int(ro.tok[t]) + 1 + r.randrange(cfg.vocab - 1)) % cfg.vocab
        else:  # a bit flipped in the recorded hash
            calls[sel][HASH] ^= 1 << r.randrange(64)
    elif kind == "logprob_invalid":
        start, carry, gen = spans[sel][0], spans[sel][1], spans[sel][2]
        if r.random() < 0.5:
            ro.lp[start + carry + r.randrange(gen)] = r.choice((math.nan, math.inf, -math.inf))
        else:
            ro.lp[start + r.randrange(carry)] = -round(r.uniform(0.01, 3.0), 3)
    else:  # pragma: no cover
        raise AssertionError(kind)
