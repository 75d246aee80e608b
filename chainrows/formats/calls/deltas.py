"""Kernel: each call's delta, logprobs and chain hash (SPEC §8.3, "Then, per §2").

delta = prompt[prev_len:] + completion, logprobs 0.0 on the carry tokens and the sampler's on
the generated ones, ``chain_hash`` = XXH3-64 of the delta seeded with the parent's. A parent
comes before its child in input order, so one pass in that order finds every seed: in this
chunk's hashes, or in ``rec_hash`` for an earlier chunk's records.
"""

from __future__ import annotations

import numpy as np

from chainrows.engine.jit import jit
from chainrows.engine.xxh3 import xxh3_64_tokens


@jit
def build_deltas(failed, p_off, p_val, c_off, c_val, lp_val, prev_len, parent_rec, base, rec_hash,
                 out_off, out_tok, out_lp, chain_hash):
    """For every record i not failed: ``out_tok[out_off[i]:out_off[i+1]]`` = its delta,
    ``out_lp`` alongside (``lp_val`` runs alongside ``c_val``), ``chain_hash[i]`` and
    ``rec_hash[base + i]`` = its chain hash (0 for a failed record). ``out_off`` was sized by
    the caller from ``prev_len`` (validated: 0 <= prev_len[i] <= the prompt's length)."""
    for i in range(len(failed)):
        if failed[i]:
            chain_hash[i] = 0
            rec_hash[base + i] = 0
            continue
        o = out_off[i]
        a, b = p_off[i] + prev_len[i], p_off[i + 1]
        n_carry = b - a
        out_tok[o:o + n_carry] = p_val[a:b]
        out_lp[o:o + n_carry] = 0.0
        c0, c1 = c_off[i], c_off[i + 1]
        out_tok[o + n_carry:o + n_carry + c1 - c0] = c_val[c0:c1]
        out_lp[o + n_carry:o + n_carry + c1 - c0] = lp_val[c0:c1]
        p = parent_rec[i]
        seed = rec_hash[p] if p >= 0 else np.uint64(0)
        h = xxh3_64_tokens(out_tok, o, out_off[i + 1], seed)
        chain_hash[i] = h
        rec_hash[base + i] = h
