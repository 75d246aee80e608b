"""What the failing check of a masked rollout compared: expected against found.

The engine reports which check failed and where (a detail id, a call or an output position);
this module reads that call's values from the Batch again and states the comparison in words a
person can act on. It never decides anything: the decision is the engine's.
"""

from __future__ import annotations

import math

import numpy as np

from chainrows import reasons as R
from chainrows.engine.batch import MISSING, ROOT, Batch
from chainrows.explanation.calls import occurrences
from chainrows.explanation.facts import RolloutFacts
from chainrows.formats.native.hashing import chain_hash


def _tokens(b: Batch, c: int) -> np.ndarray:
    return b.tokens[b.tok_chunk[c]][b.tok_start[c]:b.tok_stop[c]]


def _logprobs(b: Batch, c: int) -> np.ndarray | None:
    if not b.has_logprobs or b.lp_start[c] < 0:
        return None
    return b.logprobs[b.tok_chunk[c]][b.lp_start[c]:b.lp_stop[c]]


def _call_values(b: Batch, f: RolloutFacts, d: int, c: int, c0: int) -> tuple[object, object]:
    g = c0 + c  # the call's index in the batch
    p = f.parent[c]
    if d == R.D_LEN_TOKENS:
        return f"{f.delta_len[c]} tokens (delta_len)", f"{len(_tokens(b, g))} tokens in its token row"
    if d == R.D_LEN_GEN:
        return f"1 <= gen_len <= delta_len = {f.delta_len[c]}", f"gen_len = {f.gen_len[c]}"
    if d == R.D_LEN_ROOT_PREV:
        return "prev_len = 0 (a root)", f"prev_len = {int(b.prev_len[g])}"
    if d == R.D_LEN_CHILD_PREV and p >= 0:
        want = int(b.prev_len[c0 + p] + b.delta_len[c0 + p])
        return f"prev_len = {want} (parent {f.calls[p]}: prev_len + delta_len)", f"prev_len = {int(b.prev_len[g])}"
    if d == R.D_LEN_LOGPROBS:
        lp = _logprobs(b, g)
        return f"{len(_tokens(b, g))} logprobs", "null logprobs" if lp is None else f"{len(lp)} logprobs"
    if d == R.D_HASH:
        seed = int(b.chain_hash[c0 + p]) if p >= 0 else 0
        return f"chain_hash {chain_hash(_tokens(b, g), seed):#018x} (recomputed)", f"{int(b.chain_hash[g]):#018x} (recorded)"
    if d in (R.D_LOGPROB_NONFINITE, R.D_LOGPROB_CARRY):
        return _logprob_values(b, f, g, c)
    if d == R.D_MISSING_TOKENS:
        return "a token row for the call", "none"
    if d == R.D_OUT_OF_ORDER and c in f.selection and f.selection.index(c) > 0:
        prev = f.selection[f.selection.index(c) - 1]
        return (f"a call captured after {f.calls[prev]} (capture position {prev})",
                f"capture position {c}")
    if d in (R.D_PARENT_NOT_PREVIOUS, R.D_FIRST_NOT_ROOT, R.D_PARENT_NOT_SELECTED_BEFORE):
        return _cut_values(f, d, c)
    return None, None


def _logprob_values(b: Batch, f: RolloutFacts, g: int, c: int) -> tuple[object, object]:
    lp = _logprobs(b, g)
    carry = f.delta_len[c] - f.gen_len[c]
    for t, v in enumerate([] if lp is None else lp.tolist()):
        if not math.isfinite(v):
            return "a finite logprob", f"{v} at token {t} of the delta"
        if t < carry and v != 0.0:
            return "0.0 on carry token", f"{v} at token {t} of the delta (carry: tokens 0..{carry - 1})"
    return None, None


def _cut_values(f: RolloutFacts, d: int, c: int) -> tuple[object, object]:
    p = f.parent[c]
    found = "null (a root)" if p == ROOT else "a call not in the ledger" if p == MISSING else f.calls[p]
    if d == R.D_FIRST_NOT_ROOT:
        return "a root (the first selected call)", f"parent {found}"
    i = f.selection.index(c) if c in f.selection else -1
    before = f.calls[f.selection[i - 1]] if i > 0 else None
    if d == R.D_PARENT_NOT_PREVIOUS:
        return f"parent {before} (the selected call before it) or a root", f"parent {found}"
    return "a parent selected before it, or a root", f"parent {found}"


def _position_values(f: RolloutFacts, d: int, p: int) -> tuple[object, object]:
    cands = [f.calls[c] for c, keys in enumerate(f.item_keys) if keys and p in occurrences(keys, f.output_keys)]
    want = "exactly one call whose items equal the output from this position"
    return want, ("candidates by items: " + ", ".join(cands)) if cands else "no call's items match there"


def compare(b: Batch, f: RolloutFacts, r: int) -> dict | None:
    """The failed check of rollout ``r`` (None when ok): ``{"check", "call_id", "call_position",
    "position", "expected", "found", "fix"}``: the call it names (id and capture position) or the
    output position; expected/found are None when the detail says it all."""
    d = f.detail
    if d == 0:
        return None
    reason = R.REASONS[R.DETAIL_REASON[d]]
    expected = found = None
    c0 = int(b.call_off[r])
    if f.bad_call >= 0:
        expected, found = _call_values(b, f, d, f.bad_call, c0)
    elif f.bad_pos >= 0:
        expected, found = _position_values(f, d, f.bad_pos)
    elif d in (R.D_REWARD_NAN, R.D_REWARD_INF, R.D_REWARD_NULL):
        expected, found = "a finite reward", "null" if b.reward_null[r] else repr(float(b.reward[r]))
    elif d == R.D_MULTIPLE_ROOTS:
        roots = [f.calls[c] for c, p in enumerate(f.parent) if p == ROOT]
        expected, found = "one root", f"{len(roots)} roots: " + ", ".join(roots)
    return {
        "check": reason,
        "call_id": f.calls[f.bad_call] if f.bad_call >= 0 else None,
        "call_position": f.bad_call if f.bad_call >= 0 else None,
        "position": f.bad_pos if f.bad_pos >= 0 else None,
        "expected": expected, "found": found,
        "fix": R.FIXES.get(reason),
    }
