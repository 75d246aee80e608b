"""Kernels that turn a rollout into chains: the cc cuts (SPEC §3 step 10, linear; §3.1 10f, forest)
and the ordinary terminal walk.

All leave the same shape behind: the rollout's chain calls in ``sel[sel_off[r]:][:sel_len[r]]``,
root first, and ``chain_start[i] & CHAIN_START`` where a chain begins, plus ``n_chains[r]``.
The forest cut writes a new ``sel`` (a call shared by several chains appears in each) and flags
``SHARED`` the calls whose generation an earlier chain trains.
"""

from __future__ import annotations

from chainrows.engine.jit import jit
from chainrows.reasons import (
    D_FIRST_NOT_ROOT,
    D_MULTIPLE_ROOTS,
    D_NO_LEAF,
    D_PARENT_NOT_PREVIOUS,
    D_PARENT_NOT_SELECTED_BEFORE,
    D_SEVERAL_LEAVES,
    D_TERMINAL_NO_CALL,
    D_WALK_CYCLE,
    D_WALK_MISSING_PARENT,
)


@jit
def cut_chains(chunks, detail, bad_call, sel_off, sel, sel_len, parent, chain_start, n_chains):
    """cc mode: a root starts a chain; a non-root must continue the selected call just before it."""
    for kk in range(len(chunks) - 1):
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


@jit
def terminal_chain(chunks, detail, bad_call, call_off, parent, terminal, marks,
                   sel, sel_len, chain_start, n_chains):
    """Ordinary mode: one chain from the terminal (or the unique leaf) up to the root.

    The chain goes to sel[call_off[r]:] root first. ``marks`` is uint8[C] scratch, zero on entry:
    bit 1 = is some call's parent, bit 2 = visited by the walk.
    """
    for kk in range(len(chunks) - 1):
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


# chain_start flags (one byte per chain slot): bit 0 starts a chain; bit 1 marks a call an
# earlier chain of the rollout already holds (forest plan, SPEC §3.1): its tokens carry loss 0
# in this chain. The linear cut and the terminal walk only ever write bit 0.
CHAIN_START = 1
SHARED = 2


@jit
def forest_chains(chunks, detail, bad_call, sel_off, sel, sel_len, parent, marks, pos, rootof,
                  depth, head, nxt, out_off, out, out_flags, out_len, n_chains, write):
    """cc mode, forest plan (SPEC §3.1): check 10f, then one chain per endpoint.

    Plain-Python definition, per rollout still ok, selection ``S = sel[s:s+n]``:

        for i, c in enumerate(S):                       # 10f
            if parent[c] != -1 and parent[c] not in S[:i]:
                fail(first_not_root if i == 0 else parent_not_selected_before, c)
        ends = [c for c in S if c not in {parent[x] for x in S}]
        chain(e) = [root, ..., e]                       # parent links, all selected by 10f
        chains = sorted((chain(e) for e in ends), key=lambda ch: (ch[0], ch[-1]))
        n_chains = len(chains); out_len = sum(map(len, chains))
        write: the chains concatenated at out[out_off[r]:], root first; out_flags CHAIN_START on
        each chain's first call, SHARED on every call an earlier chain already holds.

    Call indices order capture within a rollout, and a selection that passed check 7 is in
    capture order, so S is sorted: "selected before" is "selected, at a lower index", the walk
    from an endpoint strictly descends, and (root, endpoint) order is (root slot, endpoint slot).

    Run twice: ``write`` False computes out_len and n_chains (and the 10f detail); True, on the
    offsets from the first pass, writes ``out`` / ``out_flags`` (and repeats the checks, with the
    same results). Scratch, per selection slot (like ``sel``): ``rootof`` slot of the call's root,
    ``depth`` calls from the root, ``head`` first endpoint of a root's list, ``nxt`` next endpoint
    in that list. Per call: ``pos`` its selection slot; ``marks`` uint8 zero on entry: bit 1
    selected so far, bit 2 parent of a selected call, bit 4 written to a chain already.

    Called on one thread (not through chainrows.engine.threads): ~1.5 ms per 4,096 synth
    rollouts, under 3% of decide+gather; handing parts to other threads on a busy 2-core machine
    cost more than that (7 ms per parallel launch measured under load with Numba's threads).
    """
    for kk in range(len(chunks) - 1):
        for r in range(chunks[kk], chunks[kk + 1]):
            if detail[r] != 0:
                continue
            s = sel_off[r]
            n = sel_len[r]
            for i in range(n):  # 10f, and each slot's root and depth
                c = sel[s + i]
                p = parent[c]
                if p == -1:
                    rootof[s + i] = i
                    depth[s + i] = 1
                elif p < 0 or (marks[p] & 1) == 0:
                    detail[r] = D_FIRST_NOT_ROOT if i == 0 else D_PARENT_NOT_SELECTED_BEFORE
                    bad_call[r] = c
                    break
                else:
                    j = pos[p]
                    rootof[s + i] = rootof[s + j]
                    depth[s + i] = depth[s + j] + 1
                    marks[p] |= 2
                marks[c] |= 1
                pos[c] = i
                head[s + i] = -1
            if detail[r] != 0:
                continue
            # endpoint lists per root, built backwards so each lists its endpoints ascending
            for i in range(n - 1, -1, -1):
                if marks[sel[s + i]] & 2 == 0:
                    h = s + rootof[s + i]
                    nxt[s + i] = head[h]
                    head[h] = i
            k = 0
            w = out_off[r] if write else 0
            end = out_off[r + 1] if write else 0
            for i in range(n):
                if parent[sel[s + i]] != -1:
                    continue
                e = head[s + i]
                while e != -1:
                    d = depth[s + e]
                    if write and w + d <= end:
                        x = sel[s + e]
                        for q in range(w + d - 1, w - 1, -1):
                            out[q] = x
                            out_flags[q] = SHARED if marks[x] & 4 else 0
                            marks[x] |= 4
                            x = parent[x]
                        out_flags[w] |= CHAIN_START
                    w += d
                    k += 1
                    e = nxt[s + e]
            n_chains[r] = k
            out_len[r] = w - out_off[r] if write else w
