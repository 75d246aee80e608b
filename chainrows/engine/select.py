"""Kernel: select the accepted calls from the agent's output, SPEC §3 steps 5–9 (cc mode).

Plain-Python definition (what the kernel computes for one rollout): walk the output keys left
to right; at position p the candidates are the calls whose item keys equal the next
len(item_keys) output keys. Keep candidates that pass the id filter and the accepted filter;
if several remain and exactly one is an ancestor-or-self of an identified call, keep that
one. Zero → unmatched_output, several → ambiguous_output, else select and advance. Then check
capture order, terminal and accepted records.

Candidates are found through a per-rollout index of calls sorted by (item count, hash of their
whole key sequence): at a position, each distinct item count L costs one window hash and one
binary search, then only calls whose whole keys hash alike are compared. (An index on the first
key alone went quadratic on 100,000 calls sharing their first item.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chainrows.engine.batch import readonly
from chainrows.engine.chunks import balanced_chunks, even_chunks
from chainrows.engine.jit import jit
from chainrows.engine.threads import run
from chainrows.reasons import (
    D_ACCEPTED,
    D_AMBIGUOUS,
    D_NO_OUTPUT,
    D_OUT_OF_ORDER,
    D_TERMINAL_NOT_LAST,
    D_UNMATCHED,
)

# Up to this many candidate calls, a position tries each one (first key, then _survives) rather
# than hashing a window per item count and searching the index, which is faster for few calls
# (docs/decisions-engine.md). Read at call time (run.decide passes it), so tests can force either path.
LINEAR_MAX = 16

_MIX = np.uint64(0x9E3779B97F4A7C15)
_MUL = np.uint64(0xBF58476D1CE4E5B9)


@jit(inline="always")
def window_hash(keys, start, n):
    """Order-sensitive hash of keys[start:start+n] (an index key, verified by exact compare)."""
    h = np.uint64(n)
    for i in range(n):
        h = (h ^ keys[start + i]) * _MUL + _MIX
        h ^= h >> np.uint64(31)
    return h


@jit
def call_key_hashes(chunks, key_off, item_keys, out):
    """out[c] = window_hash of call c's item keys, for c in chunks[0]:chunks[-1]."""
    for c in range(chunks[0], chunks[-1]):
        out[c] = window_hash(item_keys, key_off[c], key_off[c + 1] - key_off[c])


@jit(inline="always")
def _before(a, b, key_len, whole):
    """Call a sorts before call b in the candidate index: by (item count, key hash, call)."""
    if key_len[a] != key_len[b]:
        return key_len[a] < key_len[b]
    if whole[a] != whole[b]:
        return whole[a] < whole[b]
    return a < b


@jit
def count_candidates(chunks, call_off, key_len, counts):
    """counts[r] = the calls of rollout r that have item keys, for the rollouts
    chunks[0]:chunks[-1] (the sizes :func:`candidate_index` lays out)."""
    for r in range(chunks[0], chunks[-1]):
        n = 0
        for c in range(call_off[r], call_off[r + 1]):
            if key_len[c] > 0:
                n += 1
        counts[r] = n


@jit
def candidate_index(chunks, call_off, key_len, whole, cand_off, cand_call, cand_len, cand_hash):
    """cand_call[cand_off[r]:cand_off[r+1]] = the calls of rollout r that have item keys, sorted
    by (item count, hash of all their keys, call index), for the rollouts chunks[0]:chunks[-1];
    cand_off counts them per rollout (:func:`count_candidates`). ``cand_len`` / ``cand_hash``
    (out, like cand_call) get each listed call's ``key_len`` and ``whole``.

    Plain-Python definition: ``np.lexsort((whole, key_len, rollout))`` over the calls with keys.
    A Shell sort per rollout (gaps 1, 4, 13, ...): an insertion sort on the few calls a rollout
    usually has, and no quadratic time on a 100,000-call one. No np.argsort and no prange:
    both add seconds to the cold compile (docs/decisions-engine.md).
    """
    for r in range(chunks[0], chunks[-1]):
        a = cand_off[r]
        n = 0
        for c in range(call_off[r], call_off[r + 1]):
            if key_len[c] > 0:
                cand_call[a + n] = c
                n += 1
        gap = 1
        while gap < n // 3:
            gap = 3 * gap + 1
        while gap >= 1:
            for i in range(gap, n):
                c = cand_call[a + i]
                j = i
                while j >= gap and _before(c, cand_call[a + j - gap], key_len, whole):
                    cand_call[a + j] = cand_call[a + j - gap]
                    j -= gap
                cand_call[a + j] = c
            gap //= 3
        for i in range(a, a + n):
            cand_len[i] = key_len[cand_call[i]]
            cand_hash[i] = whole[cand_call[i]]


@dataclass(frozen=True)
class Candidates:
    """The per-rollout candidate index of the selection: ``call[off[r]:off[r+1]]`` are the
    calls of rollout r with item keys, sorted by (``length``, ``hash``) = (item count, hash of
    all their keys), then call index."""

    off: np.ndarray     # int64[R + 1]
    length: np.ndarray  # int64[K]
    hash: np.ndarray    # uint64[K]
    call: np.ndarray    # int64[K]


def build_candidates(call_off: np.ndarray, key_off: np.ndarray, item_keys: np.ndarray) -> Candidates:
    """The candidate index of a batch: ``call_off`` per-rollout call offsets, ``key_off`` /
    ``item_keys`` every call's item keys (offsets + content). Offsets must be validated by the
    caller (kernels here do no bounds checks)."""
    key_len = readonly(np.diff(key_off))
    whole = np.empty(len(key_len), dtype=np.uint64)
    run(call_key_hashes, even_chunks(len(whole)), readonly(key_off), readonly(item_keys), whole)
    rollouts = balanced_chunks(call_off + np.arange(len(call_off)))  # a rollout costs 1 + its calls
    counts = np.empty(len(call_off) - 1, dtype=np.int64)
    run(count_candidates, rollouts, readonly(call_off), key_len, counts)
    off = np.zeros(len(call_off), dtype=np.int64)
    np.cumsum(counts, out=off[1:])
    K = int(off[-1])
    call, length, hashes = np.empty(K, dtype=np.int64), np.empty(K, dtype=np.int64), np.empty(K, dtype=np.uint64)
    run(candidate_index, rollouts, readonly(call_off), key_len, readonly(whole), readonly(off), call, length, hashes)
    return Candidates(off, length, hashes, call)


@jit
def count_serving(chunks, item_ids, counts):
    """counts[k] = the item slots whose id code is k, for the codes chunks[0]:chunks[-1]: one
    read of every slot, counting only the codes of this range, so threads given disjoint code
    ranges never write the same count. item_ids int64[S]; counts int64[n_out]: out."""
    lo, hi = chunks[0], chunks[-1]
    for k in range(lo, hi):
        counts[k] = 0
    for s in range(len(item_ids)):
        k = item_ids[s]
        if lo <= k < hi:
            counts[k] += 1


@jit
def fill_serving(chunks, key_off, item_ids, serve_off, serve_call):
    """serve_call[serve_off[k]:serve_off[k+1]] = the calls with an item slot whose id code is
    k, calls ascending (a call with two such slots appears twice, side by side), for the codes
    chunks[0]:chunks[-1] (one read of every slot, as :func:`count_serving`). key_off
    int64[C+1], item_ids int64[S], serve_off int64[n_out+1] (the counts' offsets); serve_call
    int64[serve_off[-1]]: out."""
    lo, hi = chunks[0], chunks[-1]
    pos = serve_off[lo:hi].copy()
    for c in range(len(key_off) - 1):
        for s in range(key_off[c], key_off[c + 1]):
            k = item_ids[s]
            if lo <= k < hi:
                serve_call[pos[k - lo]] = c
                pos[k - lo] += 1


def serving_index(key_off: np.ndarray, item_ids: np.ndarray, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """The calls that serve each output id: ``serve_call[serve_off[k]:serve_off[k+1]]`` for id
    code k (an index into the outputs, as ``item_ids`` and ``out_ids`` hold it). Plain-Python
    definition: for k, the calls c (ascending, once per slot) with k in item_ids[key_off[c]:key_off[c+1]].
    Threads split the codes (each reads every slot and writes only its codes' entries)."""
    if len(item_ids) and int(item_ids.max()) >= n_out:
        raise AssertionError("serving_index: an item id code outside the outputs")
    key_off, item_ids = readonly(key_off), readonly(item_ids)
    codes = even_chunks(n_out)
    counts = np.empty(n_out, dtype=np.int64)
    run(count_serving, codes, item_ids, counts)
    serve_off = np.zeros(n_out + 1, dtype=np.int64)
    np.cumsum(counts, out=serve_off[1:])
    serve_call = np.empty(int(serve_off[-1]), dtype=np.int64)
    run(fill_serving, codes, key_off, item_ids, readonly(serve_off), serve_call)
    return readonly(serve_off), readonly(serve_call)


@jit(inline="always")
def _lower_bound(lens, hashes, lo, hi, n, h):
    """First index in [lo, hi) whose (len, hash) >= (n, h)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if lens[mid] < n or (lens[mid] == n and hashes[mid] < h):
            lo = mid + 1
        else:
            hi = mid
    return lo


@jit(inline="always")
def _survives(c, p, n_out, ob, k, r, out_keys, out_ids, out_served, key_off, item_keys, item_ids,
              has_acc, acc_off, acc_call):
    """True when call c matches the output window at p and passes the id and accepted filters."""
    ka = key_off[c]
    n = key_off[c + 1] - ka
    if n == 0 or p + n > n_out:
        return False
    for i in range(n):
        if item_keys[ka + i] != out_keys[ob + p + i]:
            return False
    for i in range(n):
        q = ob + p + i
        if out_served[q]:
            found = False
            for j in range(n):
                if item_ids[ka + j] == out_ids[q]:
                    found = True
                    break
            if not found:
                return False
    if has_acc[r]:
        if k >= acc_off[r + 1] - acc_off[r] or acc_call[acc_off[r] + k] != c:
            return False
    return True


@jit(inline="always")
def _count(only_anc, anc, p, n_out, ob, k, r, fa, fb, cand_len, cand_hash, cand_call, out_keys,
           out_ids, out_served, key_off, item_keys, item_ids, has_acc, acc_off, acc_call, linear_max,
           serve_off, serve_call):
    """Survivors at output position p (only ancestors-or-self of identified calls if asked):
    their count and the last one. Each item count L in the index costs one window hash; a
    rollout with few candidates is scanned directly instead; and where the window of L items
    holds a served id, only the calls serving it can survive (the id filter), so only they are
    tried, which keeps many calls with the same keys, told apart by their ids, linear. All
    paths end in the exact compare of _survives, so they find the same survivors."""
    n_surv = 0
    chosen = -1
    if fb - fa <= linear_max:
        first = out_keys[ob + p]
        for j in range(fa, fb):
            c = cand_call[j]
            if (not only_anc or anc[c] != 0) and item_keys[key_off[c]] == first and _survives(
                    c, p, n_out, ob, k, r, out_keys, out_ids, out_served, key_off, item_keys,
                    item_ids, has_acc, acc_off, acc_call):
                n_surv += 1
                chosen = c
        return n_surv, chosen
    g = fa
    while g < fb:
        L = cand_len[g]
        g_end = _lower_bound(cand_len, cand_hash, g, fb, L + 1, np.uint64(0))
        served = -1
        if p + L <= n_out:
            for i in range(L):
                if out_served[ob + p + i]:
                    served = out_ids[ob + p + i]
                    break
        if served >= 0:
            prev = -1
            for j in range(serve_off[served], serve_off[served + 1]):
                c = serve_call[j]
                if c != prev and key_off[c + 1] - key_off[c] == L and (not only_anc or anc[c] != 0) and _survives(
                        c, p, n_out, ob, k, r, out_keys, out_ids, out_served, key_off, item_keys,
                        item_ids, has_acc, acc_off, acc_call):
                    n_surv += 1
                    chosen = c
                prev = c
        elif p + L <= n_out:
            h = window_hash(out_keys, ob + p, L)
            j = _lower_bound(cand_len, cand_hash, g, g_end, L, h)
            while j < g_end and cand_hash[j] == h:
                c = cand_call[j]
                if (not only_anc or anc[c] != 0) and _survives(
                        c, p, n_out, ob, k, r, out_keys, out_ids, out_served, key_off, item_keys,
                        item_ids, has_acc, acc_off, acc_call):
                    n_surv += 1
                    chosen = c
                j += 1
        g = g_end
    return n_surv, chosen


@jit(inline="always")
def _mark_ancestors(r, call_off, parent, identified, terminal, anc):
    """anc[c] = 1 for every ancestor-or-self of an identified call of rollout r."""
    for c0 in range(call_off[r], call_off[r + 1]):
        if identified[c0] or c0 == terminal[r]:
            c = c0
            while c >= 0 and anc[c] == 0:
                anc[c] = 1
                c = parent[c]


@jit
def select_calls(chunks, detail, bad_pos, bad_call, out_off, out_keys, out_ids, out_served,
                 terminal, has_acc, acc_off, acc_call, cand_off, cand_len, cand_hash, cand_call,
                 call_off, parent, identified, key_off, item_keys, item_ids,
                 sel, sel_len, anc, linear_max, serve_off, serve_call):
    """Steps 5–9 for every rollout still ok; selection goes to sel[out_off[r]:], its length to sel_len[r].

    ``anc`` is uint8[C] scratch, zero on entry (each rollout only touches its own calls).
    ``linear_max``: rollouts with at most this many candidates skip the index (see LINEAR_MAX).
    ``serve_off`` / ``serve_call``: :func:`serving_index` of the batch.
    """
    for kk in range(len(chunks) - 1):
        for r in range(chunks[kk], chunks[kk + 1]):
            if detail[r] != 0:
                continue
            ob = out_off[r]
            n_out = out_off[r + 1] - ob
            if n_out == 0:
                detail[r] = D_NO_OUTPUT
                continue
            fa = cand_off[r]
            fb = cand_off[r + 1]
            anc_ready = False
            p = 0
            k = 0
            while p < n_out:
                # first all survivors; when several, again with only ancestors-or-self of an
                # identified call (one call site: _count is inlined, so each copy costs compile time)
                n_surv = 0
                chosen = -1
                for only_anc in (False, True):
                    if only_anc:
                        if n_surv <= 1:
                            break
                        if not anc_ready:
                            _mark_ancestors(r, call_off, parent, identified, terminal, anc)
                            anc_ready = True
                    n, c = _count(only_anc, anc, p, n_out, ob, k, r, fa, fb, cand_len, cand_hash,
                                  cand_call, out_keys, out_ids, out_served, key_off, item_keys,
                                  item_ids, has_acc, acc_off, acc_call, linear_max, serve_off, serve_call)
                    if not only_anc or n == 1:
                        n_surv, chosen = n, c
                if n_surv == 0:
                    detail[r] = D_UNMATCHED
                    bad_pos[r] = p
                    break
                if n_surv > 1:
                    detail[r] = D_AMBIGUOUS
                    bad_pos[r] = p
                    break
                sel[ob + k] = chosen
                k += 1
                p += key_off[chosen + 1] - key_off[chosen]
            if detail[r] != 0:
                continue
            sel_len[r] = k
            for i in range(1, k):
                if sel[ob + i] <= sel[ob + i - 1]:
                    detail[r] = D_OUT_OF_ORDER
                    bad_call[r] = sel[ob + i]
                    break
            if detail[r] != 0:
                continue
            if terminal[r] != -1 and terminal[r] != sel[ob + k - 1]:
                detail[r] = D_TERMINAL_NOT_LAST
                continue
            if has_acc[r]:
                na = acc_off[r + 1] - acc_off[r]
                same = na == k
                if same:
                    for i in range(k):
                        if acc_call[acc_off[r] + i] != sel[ob + i]:
                            same = False
                            break
                if not same:
                    detail[r] = D_ACCEPTED
