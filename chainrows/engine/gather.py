"""Kernels: build rows from the token buffers, in passes: count, fill, copy (per buffer).

Plain-Python definition: for each ok rollout and each of its chains k, one row whose tokens
are the chain's deltas root first, loss_mask 0 on each delta's carry and 1 on its generated
tokens, except a call flagged SHARED (``chain_start & 2``, forest plan: an earlier chain of the
rollout holds it, SPEC §3.1 loss ownership), whose whole delta has mask 0; loss_tokens per
rollout = the mask's sum. For a masked rollout with placeholders, one row of a single 0 token
with mask 0. A chain starts where ``chain_start & 1``.

``copy_hash_deltas`` and ``copy_check_logprobs`` are ``copy_deltas`` plus checks 14 and 15 of
each copied call (verify.py), run on the delta while the copy has it in cache.
"""

from __future__ import annotations

import numpy as np

from chainrows.engine.jit import jit
from chainrows.engine.streamcopy import copy_run, store_fence
from chainrows.engine.verify import check_hash, check_logprobs


@jit(inline="always")
def _fill(dst, value):
    for i in range(len(dst)):
        dst[i] = value


@jit
def row_sizes(chunks, ok, placeholders, row_off, sel_off, sel, sel_len, chain_start, delta_len,
              gen_len, row_len, row_ncalls, row_prompt, row_segment, loss_tokens):
    """Pass 1: per row its token count, call count, prompt_len and segment; per rollout loss tokens."""
    for kk in range(len(chunks) - 1):
        for r in range(chunks[kk], chunks[kk + 1]):
            w = row_off[r]
            if not ok[r]:
                if placeholders:
                    row_len[w] = 1
                    row_ncalls[w] = 0
                    row_prompt[w] = 0
                    row_segment[w] = 0
                continue
            s = sel_off[r]
            w -= 1
            loss = 0
            for i in range(sel_len[r]):
                c = sel[s + i]
                f = chain_start[s + i]
                if f & 1:
                    w += 1
                    row_len[w] = 0
                    row_ncalls[w] = 0
                    row_prompt[w] = delta_len[c] - gen_len[c]
                    row_segment[w] = w - row_off[r]
                row_len[w] += delta_len[c]
                row_ncalls[w] += 1
                if f & 2 == 0:
                    loss += gen_len[c]
            loss_tokens[r] = loss


@jit
def fill_rows(chunks, ok, placeholders, row_off, tok_off, call_row_off, sel_off, sel, sel_len,
              chain_start, delta_len, gen_len, has_logprobs, input_ids, loss_mask, out_logprobs,
              row_calls, call_dst):
    """Pass 2: loss_mask, the call lists (``row_calls``) and where each listed call's delta goes
    (``call_dst``, aligned with row_calls); placeholder rows whole. The deltas themselves are
    copied by :func:`copy_deltas`, one buffer at a time."""
    for kk in range(len(chunks) - 1):
        for r in range(chunks[kk], chunks[kk + 1]):
            w = row_off[r]
            if not ok[r]:
                if placeholders:
                    t = tok_off[w]
                    input_ids[t] = 0
                    loss_mask[t] = 0
                    if has_logprobs:
                        out_logprobs[t] = 0.0
                continue
            s = sel_off[r]
            w -= 1
            t = 0
            m = 0
            for i in range(sel_len[r]):
                c = sel[s + i]
                f = chain_start[s + i]
                if f & 1:
                    w += 1
                    t = tok_off[w]
                    m = call_row_off[w]
                row_calls[m] = c
                call_dst[m] = t
                m += 1
                d = delta_len[c]
                carry = d if f & 2 else d - gen_len[c]  # a shared call is trained in its first chain only
                _fill(loss_mask[t:t + carry], 0)
                _fill(loss_mask[t + carry:t + d], 1)
                t += d


@jit
def copy_order(row_calls, tok_chunk, delta_len, entries, weight_off, bounds):
    """The order the copies visit the listed calls in: ``entries`` the positions m of
    ``row_calls`` sorted by the buffer of their delta (``tok_chunk[row_calls[m]]``), stably;
    ``bounds[k]:bounds[k + 1]`` the entries of buffer k; ``weight_off`` = [0] + the running sum
    of ``delta_len[row_calls[entries[j]]] + 1`` (a copy's cost, +1 so none weighs 0).

    ``entries`` int64[E], ``weight_off`` int64[E + 1], ``bounds`` int64[n_buffers + 1], zero on
    entry. Every ``row_calls[m]`` is a call, every ``tok_chunk[c]`` in ``[0, n_buffers)``.
    A counting sort, on the main thread before the copies start (docs/decisions-engine.md
    "Gather")."""
    for m in range(len(row_calls)):
        bounds[tok_chunk[row_calls[m]] + 1] += 1
    for k in range(1, len(bounds)):
        bounds[k] += bounds[k - 1]
    fill = bounds[:-1].copy()
    for m in range(len(row_calls)):
        k = tok_chunk[row_calls[m]]
        entries[fill[k]] = m
        fill[k] += 1
    weight_off[0] = 0
    for j in range(len(entries)):
        weight_off[j + 1] = weight_off[j] + delta_len[row_calls[entries[j]]] + 1


def copy_order_py(row_calls, tok_chunk, delta_len, n_buffers):
    """Plain-Python :func:`copy_order`: (entries, weight_off, bounds) as lists."""
    entries = sorted(range(len(row_calls)), key=lambda m: tok_chunk[row_calls[m]])  # sorted() is stable
    weight_off = [0]
    for m in entries:
        weight_off.append(weight_off[-1] + int(delta_len[row_calls[m]]) + 1)
    bounds = [sum(1 for m in entries if tok_chunk[row_calls[m]] < k) for k in range(n_buffers + 1)]
    return entries, weight_off, bounds


@jit(inline="always")
def _copy_entry(m, row_calls, call_dst, src_start, delta_len, src, dst, stream_bytes):
    """Copy the delta of listed call m (c = row_calls[m]) to its place in the rows; returns c.
    A delta of at least ``stream_bytes`` is streamed (``streamcopy.copy_run``): the kernels
    that call this end with store_fence()."""
    c = row_calls[m]
    copy_run(dst, call_dst[m], src, src_start[c], delta_len[c], stream_bytes)
    return c


@jit
def copy_deltas(chunks, entries, row_calls, call_dst, src_start, delta_len, src, dst, stream_bytes):
    """For each m in ``entries`` (split by ``chunks``): c = row_calls[m], d = delta_len[c];
    dst[call_dst[m]:call_dst[m] + d] = src[src_start[c]:src_start[c] + d]; deltas of at least
    ``stream_bytes`` streamed (``streamcopy.stream_from`` of the output's size)."""
    for kk in range(len(chunks) - 1):
        for j in range(chunks[kk], chunks[kk + 1]):
            _copy_entry(entries[j], row_calls, call_dst, src_start, delta_len, src, dst, stream_bytes)
    store_fence()


@jit
def copy_hash_deltas(chunks, entries, row_calls, call_dst, delta_len, parent, chain_hash, integrity_bad,
                     tok_start, tok_stop, tokens, input_ids, status, stream_bytes):
    """:func:`copy_deltas` of the token buffer ``tokens`` into ``input_ids``, and for each copied
    call c: status[c] = check 14 (``verify.check_hash``: integrity_error, then the chain hash
    seeded with ``chain_hash[parent[c]]``), 0 when it passes.

    Every copied call must pass checks 12–13 (``tok_stop[c] - tok_start[c] == delta_len[c]``):
    the rows of rollouts that pass them. A call in several rows (forest plan) is checked once per
    row, each time writing the same value."""
    for kk in range(len(chunks) - 1):
        for j in range(chunks[kk], chunks[kk + 1]):
            c = _copy_entry(entries[j], row_calls, call_dst, tok_start, delta_len, tokens, input_ids, stream_bytes)
            status[c] = check_hash(c, parent, chain_hash, integrity_bad, tok_start, tok_stop, tokens)
    store_fence()


@jit
def copy_check_logprobs(chunks, entries, row_calls, call_dst, delta_len, gen_len, lp_start, lp_stop,
                        logprobs, out, status, stream_bytes):
    """:func:`copy_deltas` of the logprob buffer ``logprobs`` into ``out``, and for each copied
    call c whose ``status[c]`` is still 0 (check 14 passed): status[c] = check 15
    (``verify.check_logprobs``: finite, 0.0 on the carry), 0 when it passes. Run after
    :func:`copy_hash_deltas` on the same entries, on the same thread; every copied call has
    ``lp_stop[c] - lp_start[c] == delta_len[c]`` (checks 12–13).

    A call in several rows may have its entries on two threads at once. Every write of its
    status is the hash check's one value or, once that read 0, the logprob check's one value,
    and each thread writes the hash's before it reads: the last write is the logprob check's
    whenever the hash passed and the logprobs did not."""
    logprob_bits = logprobs.view(np.uint32)
    for kk in range(len(chunks) - 1):
        for j in range(chunks[kk], chunks[kk + 1]):
            c = _copy_entry(entries[j], row_calls, call_dst, lp_start, delta_len, logprobs, out, stream_bytes)
            if status[c] == 0:
                status[c] = check_logprobs(c, gen_len, lp_start, lp_stop, logprob_bits)
    store_fence()
