"""Kernels: a radix trie of every call's full sequence F = prompt + completion, per rollout.

SPEC §8 infers a call's parent by exact token prefix: among the earlier calls p of its rollout,
the one whose F(p) is the longest prefix of the call's prompt, unless the prompt departs inside
some earlier call's generation (drift). Comparing the prompt with every earlier call is
quadratic in calls per rollout. Instead every non-failed call's F is inserted, in capture
order, into a radix trie of its rollout; a new call walks its prompt down the trie once, and
what SPEC §8.3 asks for is read off the nodes it passes:

- a node sits at every depth where some F or some prompt ends (and where two sequences part),
  so no sequence ends or starts its generation in the middle of an edge;
- ``FEND`` / ``PEND``: the latest call whose F / prompt ends exactly at the node;
- ``LATEST``: the latest call whose F runs through the edge into the node;
- ``GEN``: the latest such call whose prompt had ended at or above the edge's start, i.e. for
  which the edge lies inside its generation; ``GENB``: the largest GEN of the node's children
  (the latest call that leaves the node inside its generation).

Since calls are inserted in capture order, "latest" is a plain overwrite at insertion. A walk
costs one comparison per prompt token (each edge holds at least one token), which is the
least an exact prefix check can cost; the trie holds each distinct token once, about the
size of the deltas the import writes.

Nodes are rows of one int64 array ``nodes[n, NF]`` (columns below); edge tokens live in one
int32 ``arena``: the edge into node x holds ``arena[START[x] : START[x] + DEPTH[x] - DEPTH[PARENT[x]]]``.
Arrays grow by doubling inside the kernels, which return them. Plain-Python definitions of
what each function reads: chainrows/reference/calls.py (the oracle the kernels are tested
against).
"""

from __future__ import annotations

import numpy as np

from chainrows.engine.grow import grow
from chainrows.engine.jit import jit

DEPTH, START, PARENT, CHILD, SIB, LATEST, GEN, FEND, PEND, STAMP, GENB = range(11)
NF = 11


def new_nodes(capacity: int = 1024) -> np.ndarray:
    """An empty node array (every field -1) of ``capacity`` rows."""
    return np.full((max(capacity, 16), NF), -1, dtype=np.int64)


@jit
def grow_rows(a, n):
    """``a`` (2-D) with room for at least ``n`` rows, doubled, contents kept, new rows -1."""
    if n <= a.shape[0]:
        return a
    b = np.full((max(n, 2 * a.shape[0]), a.shape[1]), -1, a.dtype)
    b[:a.shape[0]] = a
    return b


@jit
def add_node(nodes, n_nodes, depth, start, parent):
    """Append a node (fields -1 but depth, start, parent) as ``parent``'s first child; returns
    ``(nodes, index)``. ``parent`` < 0 makes a rollout's root."""
    nodes = grow_rows(nodes, n_nodes + 1)
    x = n_nodes
    nodes[x, :] = -1
    nodes[x, DEPTH] = depth
    nodes[x, START] = start
    nodes[x, PARENT] = parent
    if parent >= 0:
        nodes[x, SIB] = nodes[parent, CHILD]
        nodes[parent, CHILD] = x
    return nodes, x


@jit(inline="always")
def token_at(prompt, p0, lp, completion, c0, i):
    """Token i of the sequence prompt[p0:p0+lp] + completion[c0:]."""
    if i < lp:
        return prompt[p0 + i]
    return completion[c0 + i - lp]


@jit
def find_child(nodes, arena, x, t):
    """The child of ``x`` whose edge starts with token ``t``, or -1. A child found is moved to the
    front of ``x``'s children: the walks of a conversation pass the same child again and again
    (its rejected retries, inserted later, would otherwise sit in front of it)."""
    y = nodes[x, CHILD]
    before = -1
    while y >= 0 and arena[nodes[y, START]] != t:
        before = y
        y = nodes[y, SIB]
    if y >= 0 and before >= 0:
        nodes[before, SIB] = nodes[y, SIB]
        nodes[y, SIB] = nodes[x, CHILD]
        nodes[x, CHILD] = y
    return y


BLOCK = 16  # tokens compared at a time, without an exit inside: a loop LLVM vectorizes


@jit(inline="always")
def same_run(a, a_base, b, b_base, pos, stop):
    """The first position in [pos, stop) where a[a_base + i] != b[b_base + i], or ``stop``: the
    token comparison every walk spends its time in, a block at a time."""
    while pos + BLOCK <= stop:
        diff = np.int32(0)
        for j in range(BLOCK):
            diff |= a[a_base + pos + j] ^ b[b_base + pos + j]
        if diff != 0:
            break
        pos += BLOCK
    while pos < stop and a[a_base + pos] == b[b_base + pos]:
        pos += 1
    return pos


@jit
def descend(nodes, arena, node, child, pos, limit, prompt, p0, lp, completion, c0, stamp, path, n_path):
    """Walk the sequence S = prompt[p0:p0+lp] + completion[c0:] down the trie from a point
    reached before, until ``limit`` tokens of S match or S leaves the trie.

    The point is ``(node, child, pos)``: ``pos`` tokens of S match; ``node`` is the deepest
    node fully matched (DEPTH[node] <= pos) and ``child`` the edge pos runs into (-1 when pos ==
    DEPTH[node]). Every node fully matched on the way gets STAMP = ``stamp`` and is appended to
    ``path`` (grown as needed). Returns ``(node, child, pos, path, n_path)``."""
    while pos < limit:
        if child < 0:
            child = find_child(nodes, arena, node, token_at(prompt, p0, lp, completion, c0, pos))
            if child < 0:
                break
        d0 = nodes[node, DEPTH]
        end = nodes[child, DEPTH]
        s = nodes[child, START] - d0
        stop = min(end, limit)
        if pos < lp:
            pos = same_run(arena, s, prompt, p0, pos, min(stop, lp))
        if pos >= lp:
            pos = same_run(arena, s, completion, c0 - lp, pos, stop)
        if pos < end:
            break
        node = child
        child = -1
        nodes[node, STAMP] = stamp
        path = grow(path, n_path + 1)
        path[n_path] = node
        n_path += 1
    return node, child, pos, path, n_path


@jit
def split(nodes, n_nodes, node, child, pos):
    """Put a node at depth ``pos`` inside the edge node -> child (DEPTH[node] < pos <
    DEPTH[child]); it takes child's place among node's children and inherits what runs through
    the edge (LATEST, GEN: no prompt or F ends inside an edge, so the upper part is run through
    by the same calls, with the same prompt ends). Returns ``(nodes, n_nodes, mid)``."""
    nodes = grow_rows(nodes, n_nodes + 1)
    m = n_nodes
    nodes[m, :] = -1
    nodes[m, DEPTH] = pos
    nodes[m, START] = nodes[child, START]
    nodes[m, PARENT] = node
    nodes[m, CHILD] = child
    nodes[m, SIB] = nodes[child, SIB]
    nodes[m, LATEST] = nodes[child, LATEST]
    nodes[m, GEN] = nodes[child, GEN]
    nodes[m, GENB] = nodes[child, GEN]
    if nodes[node, CHILD] == child:
        nodes[node, CHILD] = m
    else:
        y = nodes[node, CHILD]
        while nodes[y, SIB] != child:
            y = nodes[y, SIB]
        nodes[y, SIB] = m
    nodes[child, START] += pos - nodes[node, DEPTH]
    nodes[child, PARENT] = m
    nodes[child, SIB] = -1
    return nodes, n_nodes + 1, m


@jit
def append_edge(nodes, n_nodes, arena, arena_len, node, pos, end, prompt, p0, lp, completion, c0):
    """A new edge below ``node`` (DEPTH[node] == pos) holding tokens S[pos:end], copied to the
    arena. Returns ``(nodes, n_nodes, arena, arena_len, leaf)``."""
    n = end - pos
    arena = grow(arena, arena_len + n)
    for i in range(n):
        arena[arena_len + i] = token_at(prompt, p0, lp, completion, c0, pos + i)
    nodes, leaf = add_node(nodes, n_nodes, end, arena_len, node)
    return nodes, n_nodes + 1, arena, arena_len + n, leaf


@jit
def node_at(nodes, n_nodes, arena, arena_len, node, child, pos, end, prompt, p0, lp, completion, c0):
    """A node at depth ``end`` for the sequence S whose first ``pos`` tokens reached the point
    ``(node, child, pos)``, pos <= end: split the edge when S ends inside it, else append S[pos:end]
    as a new edge. Returns ``(nodes, n_nodes, arena, arena_len, x)``."""
    if child >= 0:
        if pos == end:
            nodes, n_nodes, m = split(nodes, n_nodes, node, child, pos)
            return nodes, n_nodes, arena, arena_len, m
        nodes, n_nodes, node = split(nodes, n_nodes, node, child, pos)
    if pos == end:
        return nodes, n_nodes, arena, arena_len, node
    return append_edge(nodes, n_nodes, arena, arena_len, node, pos, end, prompt, p0, lp, completion, c0)


@jit
def mark_path(nodes, leaf, prompt_len, g):
    """Call ``g`` runs from the root down to ``leaf``: LATEST on every node of the path, GEN
    on those whose edge starts at or below depth ``prompt_len`` (inside g's generation), and
    GENB on the nodes above those."""
    x = leaf
    while x >= 0:
        nodes[x, LATEST] = g
        p = nodes[x, PARENT]
        if p >= 0 and nodes[p, DEPTH] >= prompt_len:
            nodes[x, GEN] = g
            nodes[p, GENB] = g
        x = p


@jit
def token_of(nodes, arena, leaf, k):
    """Token k of the sequence that ends at ``leaf`` (0 <= k < DEPTH[leaf])."""
    x = leaf
    while nodes[nodes[x, PARENT], DEPTH] > k:
        x = nodes[x, PARENT]
    return arena[nodes[x, START] + k - nodes[nodes[x, PARENT], DEPTH]]


@jit
def lcp_with(nodes, leaf, stamp, stop_child, matched):
    """lcp of the walk just made (its nodes carry STAMP ``stamp``; it stopped ``matched`` tokens
    deep, inside the edge into ``stop_child`` or at a node when -1) with the sequence ending at
    ``leaf``: the depth where that sequence leaves the walk's path."""
    x = leaf
    below = -1
    while nodes[x, STAMP] != stamp:
        below = x
        x = nodes[x, PARENT]
    if below >= 0 and below == stop_child:
        return matched
    return nodes[x, DEPTH]
