"""Kernel: walk and verify every chain, SPEC §3 steps 11–15.

Plain-Python definition, per rollout, chains in order: walk from the chain's leaf to its root
and require exactly the chain's calls (11); then for each call, root first: a token row (12),
lengths (13), the XXH3-64 chain hash seeded with the parent's recorded hash (14), logprobs
(15). The first failure is the rollout's reason.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from chainrows.engine._jit import jit, pjit
from chainrows.engine.xxh3 import xxh3_64_tokens
from chainrows.reasons import (
    D_HASH, D_LEN_CHILD_PREV, D_LEN_GEN, D_LEN_LOGPROBS, D_LEN_ROOT_PREV, D_LEN_TOKENS,
    D_LOGPROB_CARRY, D_LOGPROB_NONFINITE, D_MISSING_TOKENS, D_WALK_LEAVES_CHAIN,
)

INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


@jit
def _sum_overflows(x, y):
    return (y > 0 and x > INT64_MAX - y) or (y < 0 and x < INT64_MIN - y)


@jit
def _walk(s, i0, i1, sel, parent):
    """Check 11 on chain sel[s+i0 : s+i1]: the call where the walk leaves the chain (and the detail id).

    The cut (cc) and the terminal walk (ordinary) already built chains that pass; this is the
    safety check the SPEC asks for, reported as docs/decisions-reference.md says.
    """
    for i in range(i1 - 1, i0 - 1, -1):
        c = sel[s + i]
        p = parent[c]
        expected = sel[s + i - 1] if i > i0 else -1
        if p != expected:
            return c, D_WALK_LEAVES_CHAIN
    return -1, 0


@jit
def _check_call(c, is_root, parent, prev_len, delta_len, gen_len, chain_hash, tok_start, tok_stop,
                tokens, has_logprobs, lp_start, lp_stop, logprobs):
    """Checks 12–15 on one call; returns the detail id of the first failure, 0 when fine."""
    ts = tok_start[c]
    if ts < 0:
        return D_MISSING_TOKENS
    n = tok_stop[c] - ts
    d = delta_len[c]
    if n != d:
        return D_LEN_TOKENS
    g = gen_len[c]
    if g < 1 or g > d:
        return D_LEN_GEN
    if is_root:
        if prev_len[c] != 0:
            return D_LEN_ROOT_PREV
    else:
        p = parent[c]
        if _sum_overflows(prev_len[p], delta_len[p]) or prev_len[c] != prev_len[p] + delta_len[p]:
            return D_LEN_CHILD_PREV
    if has_logprobs:
        if lp_start[c] < 0 or lp_stop[c] - lp_start[c] != n:
            return D_LEN_LOGPROBS
    seed = np.uint64(0) if is_root else chain_hash[parent[c]]
    if xxh3_64_tokens(tokens, ts, tok_stop[c], seed) != chain_hash[c]:
        return D_HASH
    if has_logprobs:
        # branch-free scans (they vectorise); the flags say which check failed first
        ls = lp_start[c]
        nonfinite = False
        for i in range(n):
            x = logprobs[ls + i]
            nonfinite |= (x - x) != 0.0  # NaN and ±inf give NaN
        if nonfinite:
            return D_LOGPROB_NONFINITE
        carry_nonzero = False
        for i in range(n - g):
            carry_nonzero |= logprobs[ls + i] != 0.0
        if carry_nonzero:
            return D_LOGPROB_CARRY
    return 0


@pjit
def verify_chains(chunks, detail, bad_call, sel_off, sel, sel_len, chain_start, parent, prev_len,
                  delta_len, gen_len, chain_hash, tok_start, tok_stop, tokens, has_logprobs,
                  lp_start, lp_stop, logprobs):
    """Steps 11–15 on every chain of every rollout still ok."""
    for kk in prange(len(chunks) - 1):
        for r in range(chunks[kk], chunks[kk + 1]):
            if detail[r] != 0:
                continue
            s = sel_off[r]
            n = sel_len[r]
            i0 = 0
            while i0 < n and detail[r] == 0:
                i1 = i0 + 1
                while i1 < n and chain_start[s + i1] == 0:
                    i1 += 1
                c, d = _walk(s, i0, i1, sel, parent)
                if d != 0:
                    detail[r] = d
                    bad_call[r] = c
                    break
                for i in range(i0, i1):
                    c = sel[s + i]
                    d = _check_call(c, i == i0, parent, prev_len, delta_len, gen_len, chain_hash,
                                    tok_start, tok_stop, tokens, has_logprobs, lp_start, lp_stop,
                                    logprobs)
                    if d != 0:
                        detail[r] = d
                        bad_call[r] = c
                        break
                i0 = i1
