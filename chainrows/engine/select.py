"""Kernel: select the accepted calls from the agent's output, SPEC §3 steps 5–9 (cc mode).

Plain-Python definition (what the kernel computes for one rollout): walk the output keys left
to right; at position p the candidates are the calls whose item keys equal the next
len(item_keys) output keys. Keep candidates that pass the id filter and the accepted filter;
if several remain and exactly one is an ancestor-or-self of an identified call, keep that
one. Zero → unmatched_output, several → ambiguous_output, else select and advance. Then check
capture order, terminal and accepted records.

Candidates are found through ``fk_key``: each rollout's calls sorted by their first item key,
so a position costs a binary search plus the calls that share its first key.
"""

from __future__ import annotations

from numba import prange

from chainrows.engine._jit import jit, pjit
from chainrows.reasons import (
    D_ACCEPTED, D_AMBIGUOUS, D_NO_OUTPUT, D_OUT_OF_ORDER, D_TERMINAL_NOT_LAST, D_UNMATCHED,
)


@jit
def _lower_bound(keys, lo, hi, key):
    while lo < hi:
        mid = (lo + hi) >> 1
        if keys[mid] < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


@jit
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


@jit
def _mark_ancestors(r, call_off, parent, identified, terminal, anc):
    """anc[c] = 1 for every ancestor-or-self of an identified call of rollout r."""
    for c0 in range(call_off[r], call_off[r + 1]):
        if identified[c0] or c0 == terminal[r]:
            c = c0
            while c >= 0 and anc[c] == 0:
                anc[c] = 1
                c = parent[c]


@pjit
def select_calls(chunks, detail, bad_pos, bad_call, out_off, out_keys, out_ids, out_served,
                 terminal, has_acc, acc_off, acc_call, fk_off, fk_key, fk_call,
                 call_off, parent, identified, key_off, item_keys, item_ids,
                 sel, sel_len, anc):
    """Steps 5–9 for every rollout still ok; selection goes to sel[out_off[r]:], its length to sel_len[r].

    ``anc`` is uint8[C] scratch, zero on entry (each rollout only touches its own calls).
    """
    for kk in prange(len(chunks) - 1):
        for r in range(chunks[kk], chunks[kk + 1]):
            if detail[r] != 0:
                continue
            ob = out_off[r]
            n_out = out_off[r + 1] - ob
            if n_out == 0:
                detail[r] = D_NO_OUTPUT
                continue
            fa = fk_off[r]
            fb = fk_off[r + 1]
            anc_ready = False
            p = 0
            k = 0
            while p < n_out:
                key0 = out_keys[ob + p]
                lo = _lower_bound(fk_key, fa, fb, key0)
                n_surv = 0
                chosen = -1
                j = lo
                while j < fb and fk_key[j] == key0:
                    c = fk_call[j]
                    if _survives(c, p, n_out, ob, k, r, out_keys, out_ids, out_served, key_off,
                                 item_keys, item_ids, has_acc, acc_off, acc_call):
                        n_surv += 1
                        chosen = c
                    j += 1
                if n_surv > 1:
                    if not anc_ready:
                        _mark_ancestors(r, call_off, parent, identified, terminal, anc)
                        anc_ready = True
                    n_anc = 0
                    j = lo
                    while j < fb and fk_key[j] == key0:
                        c = fk_call[j]
                        if anc[c] != 0 and _survives(c, p, n_out, ob, k, r, out_keys, out_ids,
                                                     out_served, key_off, item_keys, item_ids,
                                                     has_acc, acc_off, acc_call):
                            n_anc += 1
                            chosen = c
                        j += 1
                    if n_anc == 1:
                        n_surv = 1
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
