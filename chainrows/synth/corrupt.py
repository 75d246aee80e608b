"""The corruptions: exactly one per corrupt rollout; each kind is named after the SPEC §3 reason
it triggers (``params.CORRUPT_KINDS``, ``params.CORRUPT_TARGETS``). ``KINDS`` holds, per kind,
the structure the clean rollout must have for it to apply (``needed_structure``) and the edit
that corrupts it (``corrupt_rollout`` applies it in place)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from chainrows.synth.calls import CID, DELTA, FAILED, GEN, HASH, IDS, KEYS, PARENT, PREV, RID, Rollout, hex_id

if TYPE_CHECKING:
    from chainrows.synth.harness import Cfg


class _Target:
    """The rollout being corrupted and what every edit reads: its calls, token rows and
    rollouts row, ``acc`` (its accepted calls), ``rejected`` (the others), ``sel`` (a random
    accepted call, drawn for every kind), ``spans`` (its token spans), the generator and cfg."""

    def __init__(self, ro: Rollout, r: random.Random, acc: list[int], spans, cfg: Cfg):
        self.ro, self.r, self.acc, self.spans, self.cfg = ro, r, acc, spans, cfg
        self.calls, self.tok_rows, self.row = ro.calls, ro.tok_rows, ro.ro_rows[0]
        self.rejected = [k for k in range(len(self.calls)) if k not in set(acc)]
        self.sel = acc[r.randrange(len(acc))]  # a random selected call (capture position)

    def bogus(self, prefix: str) -> str:
        return prefix + "missing_" + hex_id(self.r, 8)


def _no_rollout_record(t: _Target) -> None:
    t.ro.ro_rows = []


def _no_calls(t: _Target) -> None:
    t.ro.calls, t.ro.tok_rows = [], []


def _capture_failed(t: _Target) -> None:
    t.calls[t.r.randrange(len(t.calls))][FAILED] = True


def _reward_invalid(t: _Target) -> None:
    t.row[2] = t.r.choice((None, math.nan, math.inf, -math.inf))


def _duplicate_call(t: _Target) -> None:
    calls, r = t.calls, t.r
    v = r.choice(["call_id", "token_row", "rollouts_row"] + (["response_id"] if len(calls) > 1 else []))
    if v == "call_id":  # the same call captured twice
        k = r.randrange(len(calls))
        calls.insert(k + 1, list(calls[k]))
    elif v == "response_id":
        a, b = sorted(r.sample(range(len(calls)), 2))
        calls[b][RID] = calls[a][RID]
    elif v == "token_row":
        t.tok_rows.append(list(t.tok_rows[r.randrange(len(t.tok_rows))]))
    else:  # the rollouts row written twice, the second with another reward
        dup = list(t.row)
        dup[2] = 1.0 - (t.row[2] or 0.0)
        t.ro.ro_rows.append(dup)


def _length_mismatch(t: _Target) -> None:
    calls, row, r = t.calls, t.row, t.r
    v = r.choice(["item_ids", "output_ids", "delta_len", "prev_len", "gen_len"]
                 + (["logprobs"] if t.cfg.logprobs else []))
    c = calls[t.sel]
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
        t.tok_rows[t.sel][4] -= 1


def _no_output(t: _Target) -> None:
    t.row[3], t.row[4] = [], ([] if t.r.random() < 0.5 else None)


def _unmatched_output(t: _Target) -> None:
    row = t.row
    p = t.r.randrange(len(row[3]))
    row[3] = list(row[3])
    row[3][p] = t.r.getrandbits(64)


def _ambiguous_output(t: _Target) -> None:
    """The last accepted call served twice, identically (temperature 0), with no ids, no
    terminal and no accepted list to tell the two apart."""
    calls, row, last = t.calls, t.row, t.acc[-1]
    c = calls[last]
    n = len(c[KEYS])
    c[IDS] = None
    if row[4] is not None:
        row[4] = row[4][: len(row[3]) - n] + [None] * n
    row[5] = row[6] = None
    twin = list(c)
    twin[CID] = c[CID] + "a"
    twin[RID] = "resp_" + hex_id(t.r)
    calls.insert(last, twin)
    t.tok_rows.insert(last, [twin[CID]] + t.tok_rows[last][1:])


def _out_of_order(t: _Target) -> None:
    k = t.r.randrange(len(t.acc) - 1)
    a, b = t.acc[k], t.acc[k + 1]
    t.calls[a], t.calls[b] = t.calls[b], t.calls[a]


def _terminal_mismatch(t: _Target) -> None:
    calls, acc, r = t.calls, t.acc, t.r
    options = [t.bogus("resp_")]
    if len(acc) > 1:
        options.append(calls[acc[r.randrange(len(acc) - 1)]][RID])
    if t.rejected:
        options.append(calls[r.choice(t.rejected)][RID])
    t.row[5] = r.choice(options)


def _accepted_mismatch(t: _Target) -> None:
    extra = t.calls[t.r.choice(t.rejected)][RID] if t.rejected and t.r.random() < 0.5 else t.bogus("resp_")
    t.row[6] = list(t.row[6]) + [extra]


def _broken_chain(t: _Target) -> None:
    """The output skips an accepted call whose child is the next accepted call."""
    calls, acc, row = t.calls, t.acc, t.row
    links = [k for k in range(len(acc) - 1) if calls[acc[k + 1]][PARENT] == calls[acc[k]][CID]]
    k = t.r.choice(links)
    skip = calls[acc[k]]
    start = sum(len(calls[a][KEYS]) for a in acc[:k])
    n = len(skip[KEYS])
    row[3] = row[3][:start] + row[3][start + n :]
    if row[4] is not None:
        row[4] = row[4][:start] + row[4][start + n :]
    if row[6] is not None:
        row[6] = [x for x in row[6] if x != skip[RID]]


def _walk_mismatch(t: _Target) -> None:
    k = t.r.randrange(1, len(t.acc))
    t.calls[t.acc[k]][PARENT] = t.bogus("c")


def _structural(t: _Target) -> None:
    """Nothing to edit: the structure the kind needs is the corruption (clean in cc mode)."""


def _missing_tokens(t: _Target) -> None:
    del t.tok_rows[t.sel]


def _hash_mismatch(t: _Target) -> None:
    r, sel = t.r, t.sel
    if r.random() < 0.75:  # a token flipped after capture
        k = r.randrange(t.tok_rows[sel][1], t.tok_rows[sel][2])
        t.ro.tok[k] = (int(t.ro.tok[k]) + 1 + r.randrange(t.cfg.vocab - 1)) % t.cfg.vocab
    else:  # a bit flipped in the recorded hash
        t.calls[sel][HASH] ^= 1 << r.randrange(64)


def _logprob_invalid(t: _Target) -> None:
    r = t.r
    start, carry, gen = t.spans[t.sel][0], t.spans[t.sel][1], t.spans[t.sel][2]
    if r.random() < 0.5:
        t.ro.lp[start + carry + r.randrange(gen)] = r.choice((math.nan, math.inf, -math.inf))
    else:
        t.ro.lp[start + r.randrange(carry)] = -round(r.uniform(0.01, 3.0), 3)


@dataclass(frozen=True)
class Kind:
    """A corruption kind: its edit, and the structure it needs of the clean rollout (read by
    the harness: ``min_acc`` accepted calls at least, ``link``: a parent -> child pair of
    accepted calls, ``compaction`` / ``retry`` / ``terminal`` / ``accepted``: forced or ruled
    out)."""

    apply: Callable[[_Target], None]
    needs: dict = field(default_factory=dict)


KINDS: dict[str, Kind] = {
    "no_rollout_record": Kind(_no_rollout_record),
    "no_calls": Kind(_no_calls),
    "capture_failed": Kind(_capture_failed),
    "reward_invalid": Kind(_reward_invalid),
    "duplicate_call": Kind(_duplicate_call),
    "length_mismatch": Kind(_length_mismatch),
    "no_output": Kind(_no_output),
    "unmatched_output": Kind(_unmatched_output),
    "ambiguous_output": Kind(_ambiguous_output, {"terminal": "null", "accepted": "null"}),
    "out_of_order": Kind(_out_of_order, {"min_acc": 2}),
    "terminal_mismatch": Kind(_terminal_mismatch),
    "accepted_mismatch": Kind(_accepted_mismatch, {"accepted": "set"}),
    "broken_chain": Kind(_broken_chain, {"min_acc": 2, "link": True}),
    "walk_mismatch": Kind(_walk_mismatch, {"min_acc": 2, "compaction": "never", "retry": "never", "terminal": "set"}),
    "multiple_roots": Kind(_structural, {"min_acc": 2, "compaction": "force"}),
    "ambiguous_terminal": Kind(_structural, {"min_acc": 2, "compaction": "never", "retry": "force_nonroot",
                                             "terminal": "null"}),
    "missing_tokens": Kind(_missing_tokens),
    "hash_mismatch": Kind(_hash_mismatch),
    "logprob_invalid": Kind(_logprob_invalid),
}


def needed_structure(kind: str | None) -> dict:
    """Structure a corruption kind needs from the clean rollout it corrupts ({} for None)."""
    return dict(KINDS[kind].needs) if kind in KINDS else {}


def corrupt_rollout(ro: Rollout, kind: str, r: random.Random, acc: list[int], spans, cfg: Cfg) -> None:
    """Apply the corruption ``kind`` to the clean rollout ``ro`` in place (``acc``: its accepted
    calls, ``spans``: its token spans), so that the engine masks it with the reason ``kind``
    names."""
    target = _Target(ro, r, acc, spans, cfg)
    if kind not in KINDS:  # pragma: no cover
        raise AssertionError(kind)
    KINDS[kind].apply(target)
