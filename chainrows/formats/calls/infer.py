"""Kernel: SPEC §8.3-§8.5 for a chunk of call records, in capture order, against the tries of
their rollouts (chainrows.formats.calls.trie), which persist from chunk to chunk.

For each record the kernel decides the relation, the parent (a global record index), the call
it is reported against and where it diverged, and the carry length ``prev_len``; then inserts
the record's full sequence into its rollout's trie. Records are numbered globally in input
order (``base`` + position in the chunk); per-record state (where each F ends in the trie) is
indexed by that number, per-call-id state (the latest earlier non-failed call with an id) by
the call's interned code.
"""

from __future__ import annotations

import numpy as np

from chainrows.engine.jit import jit
from chainrows.formats.calls import trie as T
from chainrows.formats.calls.trie import add_node, descend, lcp_with, mark_path, node_at, same_run, token_of

# relation codes: index into RELATIONS (SPEC §8.6)
RELATIONS = ("first_root", "child", "retry", "rewrite", "drift", "declared", "declared_mismatch", "failed")
FIRST_ROOT, CHILD, RETRY, REWRITE, DRIFT, DECLARED, DECLARED_MISMATCH, FAILED = range(8)
NO_TOKEN = np.int64(-(1 << 62))  # tok_here / tok_there: the position is past that sequence's end


@jit
def deepest_fend(nodes, path, n_path):
    """(call, depth) of the deepest node of the walk where some F ends: the longest candidate
    parent P of SPEC §8.3 (FEND holds the latest of equal ones); (-1, 0) when there is none."""
    for j in range(n_path - 1, -1, -1):
        if nodes[path[j], T.FEND] >= 0:
            return nodes[path[j], T.FEND], nodes[path[j], T.DEPTH]
    return -1, 0


@jit
def latest_gen_below(nodes, u, skip):
    """The latest call that leaves node ``u`` into a child other than ``skip`` inside its
    generation (its prompt ended at or above ``u``), or -1. GENB holds it unless the latest of
    all went into ``skip``; only then are the children looked at one by one."""
    best = nodes[u, T.GENB]
    if best < 0 or skip < 0 or nodes[skip, T.GEN] != best:
        return best
    best = -1
    y = nodes[u, T.CHILD]
    while y >= 0:
        if y != skip and nodes[y, T.GEN] > best:
            best = nodes[y, T.GEN]
        y = nodes[y, T.SIB]
    return best


@jit
def departure(nodes, path, n_path, stop_child, matched, prompt_len, lower):
    """D of SPEC §8.3 for the walk just made: ``(call, lcp)`` of the earlier call the prompt
    departs inside the generation of at the largest lcp > ``lower`` (ties: the latest), or
    (-1, -1). Calls leaving the walk's path at depth d have lcp d; at the point where the walk
    stopped (``matched`` < prompt_len), every call running on has lcp ``matched``."""
    if matched < prompt_len and matched > lower:
        if stop_child >= 0:
            cand = nodes[stop_child, T.GEN]
        else:
            cand = latest_gen_below(nodes, path[n_path - 1], -1)
        if cand >= 0:
            return cand, matched
    for j in range(n_path - 1, -1, -1):
        u = path[j]
        d = nodes[u, T.DEPTH]
        if d <= lower:
            break
        if d >= matched:
            continue
        on_path = path[j + 1] if j + 1 < n_path else stop_child
        cand = latest_gen_below(nodes, u, on_path)
        if cand >= 0:
            return cand, d
    return -1, -1


@jit
def infer_root(nodes, root, node, child, matched, prompt_len, path, n_path):
    """SPEC §8.3 for a prompt without a declared parent, after its walk: ``(relation, parent,
    against, lcp)``."""
    parent, lower = deepest_fend(nodes, path, n_path)
    against, lcp = departure(nodes, path, n_path, child, matched, prompt_len, lower)
    if against >= 0:
        return DRIFT, -1, against, lcp
    if parent >= 0:
        return CHILD, parent, -1, -1
    if nodes[root, T.LATEST] < 0:
        return FIRST_ROOT, -1, -1, -1
    if matched == prompt_len and child < 0 and nodes[node, T.PEND] >= 0:
        return RETRY, -1, nodes[node, T.PEND], -1
    return REWRITE, -1, nodes[child if child >= 0 else node, T.LATEST], matched


@jit
def declared(nodes, g, pc, latest_call, rec_fend, child, matched):
    """SPEC §8.4 for a declared parent: ``pc`` its id's code (-1: a declared null, a root);
    the parent is the latest earlier non-failed call with that id. ``(relation, parent,
    against, lcp)``."""
    if pc < 0:
        return DECLARED, -1, -1, -1
    p = latest_call[pc]
    if p < 0:
        return DECLARED_MISMATCH, -1, -1, -1
    fend = rec_fend[p]
    if nodes[fend, T.STAMP] == g:  # F(p) lies on the prompt's walk: a prefix of it
        return DECLARED, p, -1, -1
    return DECLARED_MISMATCH, -1, p, lcp_with(nodes, fend, g, child, matched)


@jit(inline="always")
def extends(i, j, p_off, p_val, c_off, c_val):
    """Record i's prompt starts with record j's full sequence (both in this chunk)."""
    a, n_prompt = p_off[j], p_off[j + 1] - p_off[j]
    n_full = n_prompt + c_off[j + 1] - c_off[j]
    b = p_off[i]
    if p_off[i + 1] - b < n_full:
        return False
    if same_run(p_val, b, p_val, a, 0, n_prompt) < n_prompt:
        return False
    return same_run(p_val, b + n_prompt, c_val, c_off[j], 0, n_full - n_prompt) == n_full - n_prompt


@jit
def walk_start(nodes, root, last, base, i, declares, rec_fend, p_off, p_val, c_off, c_val):
    """Where record i's walk may start: the end of its rollout's last call's full sequence when
    that call is in this chunk and its full sequence begins i's prompt (compared in place, a
    token run against a token run: a conversation's next call, the common case), else the root.
    Every node above that point lies on the prompt's path, and what SPEC §8.3 reads there (the
    longest candidate, the departures beyond it) is no shallower than it. A declared parent is
    checked against the whole path: its walk starts at the root. Returns (node, depth)."""
    if not declares[i] and last >= base and extends(i, last - base, p_off, p_val, c_off, c_val):
        x = rec_fend[last]
        return x, nodes[x, T.DEPTH]
    return root, 0


@jit
def infer_chunk(roll, call, declares, parent_code, failed, p_off, p_val, c_off, c_val, base,
                nodes, n_nodes, arena, arena_len, roots, last_rec, rec_fend, latest_call, path,
                parent_rec, relation, against, diverge, prev_len, tok_here, tok_there):
    """Decide every record of the chunk (SPEC §8.3-§8.5) and insert it into its trie.

    Per record i (global number g = base + i): ``roll[i]`` rollout code, ``call[i]`` its call
    id's code, ``declares[i]`` whether it declares a parent, ``parent_code[i]`` the declared
    parent id's code (-1: a declared null), ``failed[i]``; its prompt ``p_val[p_off[i]:p_off[i+1]]``
    and completion ``c_val[c_off[i]:c_off[i+1]]`` (>= 1 token unless failed). State: ``roots``
    (per rollout code, -1 until first seen), ``last_rec`` (per rollout code, its latest
    non-failed record), ``rec_fend`` (per record, where its F ends; -1 for failed),
    ``latest_call`` (per call code, the latest non-failed record with it). Outputs per
    i: parent record (-1 for a root), relation code, the record it is reported against (-1),
    the lcp reported (-1), prev_len, and the tokens of the record and of ``against`` at that
    lcp (NO_TOKEN past the sequence's end). Returns the grown ``(nodes, n_nodes, arena,
    arena_len, path)``. Offsets and codes are validated by the caller."""
    for i in range(len(roll)):
        parent_rec[i] = -1
        against[i] = -1
        diverge[i] = -1
        prev_len[i] = 0
        tok_here[i] = NO_TOKEN
        tok_there[i] = NO_TOKEN
        if failed[i]:
            relation[i] = FAILED
            continue
        g = base + i
        r = roll[i]
        if roots[r] < 0:
            nodes, x = add_node(nodes, n_nodes, 0, 0, -1)
            roots[r] = x
            n_nodes += 1
        root = roots[r]
        p0, lp = p_off[i], p_off[i + 1] - p_off[i]
        c0, lc = c_off[i], c_off[i + 1] - c_off[i]
        start, depth = walk_start(nodes, root, last_rec[r], base, i, declares, rec_fend, p_off, p_val,
                                  c_off, c_val)
        nodes[start, T.STAMP] = g
        path[0] = start
        node, child, matched, path, n_path = descend(nodes, arena, start, -1, depth, lp, p_val, p0, lp,
                                                     c_val, c0, g, path, 1)
        if declares[i]:
            rel, parent, ag, lcp = declared(nodes, g, parent_code[i], latest_call, rec_fend, child, matched)
        else:
            rel, parent, ag, lcp = infer_root(nodes, root, node, child, matched, lp, path, n_path)
        relation[i], parent_rec[i], against[i], diverge[i] = rel, parent, ag, lcp
        if parent >= 0:
            prev_len[i] = nodes[rec_fend[parent], T.DEPTH]
        if lcp >= 0:
            if lcp < lp:
                tok_here[i] = p_val[p0 + lcp]
            if lcp < nodes[rec_fend[ag], T.DEPTH]:
                tok_there[i] = token_of(nodes, arena, rec_fend[ag], lcp)
        nodes, n_nodes, arena, arena_len, path, fend = insert(
            nodes, n_nodes, arena, arena_len, path, node, child, matched, g, p_val, p0, lp, c_val, c0, lc)
        rec_fend[g] = fend
        latest_call[call[i]] = g
        last_rec[r] = g
    return nodes, n_nodes, arena, arena_len, path


@jit
def insert(nodes, n_nodes, arena, arena_len, path, node, child, matched, g, p_val, p0, lp, c_val, c0, lc):
    """Insert F(g) = prompt + completion, whose prompt's walk stopped at ``(node, child,
    matched)``: a node at the prompt's end (PEND) and one at F's end (FEND), the path marked.
    Returns the grown arrays and F's end node."""
    nodes, n_nodes, arena, arena_len, pnode = node_at(nodes, n_nodes, arena, arena_len, node, child,
                                                      matched, lp, p_val, p0, lp, c_val, c0)
    nodes[pnode, T.PEND] = g
    node, child, pos, path, _ = descend(nodes, arena, pnode, -1, lp, lp + lc, p_val, p0, lp, c_val,
                                        c0, -1, path, 0)
    nodes, n_nodes, arena, arena_len, fend = node_at(nodes, n_nodes, arena, arena_len, node, child,
                                                     pos, lp + lc, p_val, p0, lp, c_val, c0)
    nodes[fend, T.FEND] = g
    mark_path(nodes, fend, lp, g)
    return nodes, n_nodes, arena, arena_len, path, fend
