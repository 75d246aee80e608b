"""Kernels: exact joins on string ids within groups (a rollout's calls, responses, outputs).

The ids are never encoded globally. :func:`index_groups` builds one small open-addressing table
per group over the group's build strings (a hash places an entry, its bytes decide equality),
and :func:`probe_groups` looks probe strings up in their group's table. A hash collision costs a
byte comparison, never a wrong answer. Strings are Arrow-style: int64 offsets + uint8 bytes; an
entry's ``pos`` is its string's index there, -1 for a null (which matches nothing).

Plain-Python definitions (used by the tests): :func:`index_groups_py`, :func:`probe_groups_py`.
"""

from __future__ import annotations

import numpy as np

from chainrows.engine._jit import jit
from chainrows.engine.strhash import FNV_OFFSET, fnv1a


def table_offsets(build_off: np.ndarray) -> np.ndarray:
    """Offsets of each group's slots in the shared tables: a power of two of at least twice
    its build entries (load factor <= 1/2), none for an empty group."""
    n = np.diff(build_off)
    size = np.where(n > 0, np.left_shift(1, np.ceil(np.log2(np.maximum(2 * n, 2))).astype(np.int64)), 0)
    off = np.zeros(len(n) + 1, dtype=np.int64)
    np.cumsum(size, out=off[1:])
    return off


def new_tables(tab_off: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Empty tables for :func:`index_groups`: (slot, slot_hash)."""
    n = int(tab_off[-1])
    return np.full(n, -1, dtype=np.int32), np.zeros(n, dtype=np.uint32)


@jit(inline="always")
def _same(a_off, a_data, a, b_off, b_data, b):
    n = a_off[a + 1] - a_off[a]
    if b_off[b + 1] - b_off[b] != n:
        return False
    sa, sb = a_off[a], b_off[b]
    for j in range(n):
        if a_data[sa + j] != b_data[sb + j]:
            return False
    return True


@jit(inline="always")
def _slot_of(tb, mask, h, tag, slot, slot_hash, b0, build_pos, soff, data, psoff, pdata, v):
    """The slot of group table ``tb`` holding string v of (psoff, pdata), or the empty slot
    where it would go: linear probing from ``h``; a tag match is confirmed on the bytes."""
    s = h & mask
    while True:
        at = tb + np.int64(s)
        e = slot[at]
        if e < 0 or (slot_hash[at] == tag and _same(soff, data, build_pos[b0 + e], psoff, pdata, v)):
            return at
        s = (s + np.uint64(1)) & mask


@jit
def index_groups(chunks, build_off, build_pos, soff, data, tab_off, slot, slot_hash, first):
    """first[i] = the first build entry of i's group whose string equals i's (i itself when
    none before it), -1 where build_pos[i] < 0; for the groups chunks[0]:chunks[-1].

    build_off int64[G+1]: group g's build entries are build_off[g]:build_off[g+1].
    build_pos int64[B]: each entry's string in (soff int64[n+1], data uint8[...]), -1 null.
    tab_off int64[G+1]: :func:`table_offsets` of build_off; slot int32 / slot_hash uint32
    [tab_off[-1]]: from :func:`new_tables`, filled here (slot: entry - build_off[g]).
    first int64[B]: out.
    """
    for g in range(chunks[0], chunks[-1]):
        b0 = build_off[g]
        tb = tab_off[g]
        mask = np.uint64(tab_off[g + 1] - tb - 1)
        for i in range(b0, build_off[g + 1]):
            v = build_pos[i]
            if v < 0:
                first[i] = -1
                continue
            h = fnv1a(soff, data, v, FNV_OFFSET)
            tag = np.uint32(h >> np.uint64(32))
            at = _slot_of(tb, mask, h, tag, slot, slot_hash, b0, build_pos, soff, data, soff, data, v)
            if slot[at] < 0:
                slot[at] = np.int32(i - b0)
                slot_hash[at] = tag
                first[i] = i
            else:
                first[i] = b0 + slot[at]


@jit
def probe_groups(chunks, build_off, build_pos, soff, data, tab_off, slot, slot_hash, probe_group,
                 probe_pos, psoff, pdata, found):
    """found[j] = the first build entry of group probe_group[j] whose string equals probe j's
    (probe_pos[j] in psoff/pdata); -1 when there is none, the probe is null (pos < 0) or its
    group is < 0; for the probes chunks[0]:chunks[-1]. The build arguments are those given to
    :func:`index_groups`."""
    for j in range(chunks[0], chunks[-1]):
        g = probe_group[j]
        v = probe_pos[j]
        found[j] = -1
        if g < 0 or v < 0:
            continue
        tb = tab_off[g]
        size = tab_off[g + 1] - tb
        if size == 0:
            continue
        b0 = build_off[g]
        mask = np.uint64(size - 1)
        h = fnv1a(psoff, pdata, v, FNV_OFFSET)
        at = _slot_of(tb, mask, h, np.uint32(h >> np.uint64(32)), slot, slot_hash, b0, build_pos, soff, data,
                      psoff, pdata, v)
        if slot[at] >= 0:
            found[j] = b0 + slot[at]


def index_groups_py(build_off, build_ids) -> list:
    """Plain-Python :func:`index_groups` over a list of ids (None: null)."""
    first = []
    for g in range(len(build_off) - 1):
        seen: dict = {}
        for i in range(build_off[g], build_off[g + 1]):
            first.append(-1 if build_ids[i] is None else seen.setdefault(build_ids[i], i))
    return first


def probe_groups_py(build_off, build_ids, probe_group, probe_ids) -> list:
    """Plain-Python :func:`probe_groups`."""
    found = []
    for g, x in zip(probe_group, probe_ids):
        hit = -1
        if g >= 0 and x is not None:
            hit = next((i for i in range(build_off[g], build_off[g + 1]) if build_ids[i] == x), -1)
        found.append(hit)
    return found
