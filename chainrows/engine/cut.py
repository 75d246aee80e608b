"""Kernels that turn a rollout into chains: the cc cut (SPEC §3 step 10) and the ordinary terminal walk.

Both leave the same shape behind: the rollout's chain calls in ``sel[sel_off[r]:][:sel_len[r]]``,
root first, and ``chain_start[i] = 1`` where a chain begins, plus ``n_chains[r]``.
"""

from __future__ import annotations

from numba import prange

from chainrows.engine._jit import pjit
from chainrows.reasons import (
    D_FIRST_NOT_ROOT, D_MULTIPLE_ROOTS, D_NO_LEAF, D_PARENT_NOT_PREVIOUS, D_SEVERAL_LEAVES,
    D_TERMINAL_NO_CALL, D_WALK_CYCLE, D_WALK_MISSING_PARENT,
)


@pjit
def cut_chains(chunks, detail, bad_call, sel_off, sel, sel_len, parent, chain_start, n_chains):
    """cc mode: a root starts a chain; a non-root must continue the selected call just before it."""
    for kk in prange(len(chunks) - 1):
        for r in range(chunks[kk], chunks[kk + 1]):
            if detail[r] != 0:
                continue
            s = sel_off[r]
            n = 0
            for i in range(sel_len[r]):
                c = sel[s + i]
                p = parent[c]
                if p == -1:
                    chain_start[s + i] = 1
                    n += 1
                elif i == 0:
                    detail[r] = D_FIRST_NOT_ROOT
                    bad_call[r] = c
                    break
                elif p != sel[s + i - 1]:
                    detail[r] = D_PARENT_NOT_PREVIOUS
                    bad_call[r] = c
                    break
            if detail[r] == 0:
                n_chains[r] = n


@pjit
def terminal_chain(chunks, detail, bad_call, call_off, parent, terminal, marks,
                   sel, sel_len, chain_start, n_chains):
    """Ordinary mode: one chain from the terminal (or the unique leaf) up to the root.

    The chain goes to sel[call_off[r]:] root first. ``marks`` is uint8[C] scratch, zero on entry:
    bit 1 = is some call's parent, bit 2 = visited by the walk.
    """
    for kk in prange(len(chunks) - 1):
        for r in range(chunks[kk], chunks[kk + 1]):
            if detail[r] != 0:
                continue
            a = call_off[r]
            b = call_off[r + 1]
            roots = 0
            for c in range(a, b):
                if parent[c] == -1:
                    roots += 1
            if roots > 1:
                detail[r] = D_MULTIPLE_ROOTS
                continue
            t = terminal[r]
            if t == -2:
                detail[r] = D_TERMINAL_NO_CALL
                continue
            if t == -1:
                for c in range(a, b):
                    if parent[c] >= 0:
                        marks[parent[c]] |= 1
                leaves = 0
                for c in range(a, b):
                    if marks[c] & 1 == 0:
                        leaves += 1
                        t = c
                if leaves > 1:
                    detail[r] = D_SEVERAL_LEAVES
                    continue
                if leaves == 0:
                    detail[r] = D_NO_LEAF
                    continue
            # walk leaf -> root, writing the chain backwards from the end of the rollout's slot
            n = 0
            x = t
            while True:
                marks[x] |= 2
                sel[b - 1 - n] = x
                n += 1
                p = parent[x]
                if p == -1:
                    break
                if p == -2:
                    detail[r] = D_WALK_MISSING_PARENT
                    bad_call[r] = x
                    break
                if marks[p] & 2:
                    detail[r] = D_WALK_CYCLE
                    bad_call[r] = x
                    break
                x = p
            if detail[r] != 0:
                continue
            # move the chain to the front of the slot, root first
            for i in range(n):
                sel[a + i] = sel[b - n + i]
            sel_len[r] = n
            chain_start[a] = 1
            n_chains[r] = 1
