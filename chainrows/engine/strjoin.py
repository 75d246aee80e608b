"""Kernels: exact joins on string ids within groups (a rollout's calls, responses, outputs).

The ids are never encoded globally. :func:`index_groups` builds one small open-addressing table
per group over the group's build strings (a hash places an entry, its bytes decide equality),
and :func:`probe_groups` looks probe strings up in their group's table. A hash collision costs a
byte comparison, never a wrong answer. Strings are Arrow-style: int64 offsets + uint8 bytes + a
validity array (``valid``: bool per string, False for a null string; zero-length when the column
has no nulls); an entry's ``pos`` is its string's index there, -1 for a null entry. A null entry
or null string matches nothing. The kernels read validity themselves, so callers never build a
masked copy of ``pos`` (a few passes over millions of ids, each a fresh temporary).

:func:`join_groups` does both in one pass, group by group, when the probes come grouped the
same way (a rollout's item ids against its output ids): its one small table stays in cache.

Plain-Python definitions (used by the tests): :func:`index_groups_py`, :func:`probe_groups_py`
(and the two together for :func:`join_groups`).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba.core import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from chainrows.engine.jit import jit


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


@intrinsic
def _load8(typingctx, data, j):
    """data[j:j + 8] as one uint64 (an unaligned load, in the host's byte order); data is a
    C-contiguous uint8 array and j + 8 <= len(data) the caller's contract (not checked)."""
    if not (isinstance(data, types.Array) and data.ndim == 1 and data.dtype == types.uint8
            and data.layout == "C" and isinstance(j, types.Integer)):
        raise TypingError("strjoin: _load8(C-contiguous uint8[:], integer), got %s, %s" % (data, j))

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        at = builder.gep(ary.data, [context.cast(builder, args[1], signature.args[1], types.int64)])
        return builder.load(builder.bitcast(at, ir.IntType(64).as_pointer()), align=1)

    return types.uint64(data, j), codegen


@jit(inline="always")
def _word(data, j, n):
    """Bytes data[j:j+n] (n < 8) as a little-endian uint64."""
    w = np.uint64(0)
    for k in range(n):
        w |= np.uint64(data[j + k]) << np.uint64(8 * k)
    return w


@jit(inline="always")
def _same(a_off, a_data, a, b_off, b_data, b):
    """String a of (a_off, a_data) equals string b of (b_off, b_data): 8 bytes at a time, the
    last 8 overlapping the word before when the length is not a multiple of 8; never a byte
    outside the two strings."""
    n = a_off[a + 1] - a_off[a]
    if b_off[b + 1] - b_off[b] != n:
        return False
    sa, sb = a_off[a], b_off[b]
    if n < 8:
        for j in range(n):
            if a_data[sa + j] != b_data[sb + j]:
                return False
        return True
    j = 0
    while j + 8 < n:
        if _load8(a_data, sa + j) != _load8(b_data, sb + j):
            return False
        j += 8
    return _load8(a_data, sa + n - 8) == _load8(b_data, sb + n - 8)


@jit(inline="always")
def _hash(offsets, data, i):
    """A 64-bit hash of string i taken 8 bytes at a time as :func:`_same` reads them (per word
    an FNV-style xor and multiply and a shift; the length as seed; the first half of
    MurmurHash3's fmix64 as final mix), a string under 8 bytes as one word. Only places entries
    in these transient tables; routing keeps chainrows.engine.strhash.fnv1a, whose values must
    not change. Byte-at-a-time FNV-1a is one multiply per byte in a dependent chain, which the
    joins waited on once their tables stayed in cache (docs/decisions-engine.md "String joins")."""
    a = offsets[i]
    b = offsets[i + 1]
    h = np.uint64(b - a) * np.uint64(0x9E3779B97F4A7C15)
    if b - a < 8:
        h = (h ^ _word(data, a, b - a)) * np.uint64(0x100000001B3)
    else:
        j = a
        while j + 8 < b:
            h = (h ^ _load8(data, j)) * np.uint64(0x100000001B3)
            h ^= h >> np.uint64(29)
            j += 8
        h = (h ^ _load8(data, b - 8)) * np.uint64(0x100000001B3)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    return h


@jit(inline="always")
def _is_null(pos, valid, i):
    """Entry i is null: no string (pos -1) or a null string."""
    v = pos[i]
    return v < 0 or (len(valid) > 0 and not valid[v])


@jit(inline="always")
def _slot_of(tb, mask, h, tag, slot, slot_hash, b0, build_pos, soff, data, psoff, pdata, v):
    """The slot of group table ``tb`` holding string v of (psoff, pdata), or the empty slot
    where it would go: linear probing from ``h``; a tag match is confirmed on the bytes.
    At most one round of the table: a table with no empty slot (a bug, the load is <= 1/2)
    gives an occupied slot of another string, a wrong answer instead of an endless loop."""
    s = h & mask
    at = tb + np.int64(s)
    for _ in range(np.int64(mask) + 1):
        at = tb + np.int64(s)
        e = slot[at]
        if e < 0 or (slot_hash[at] == tag and _same(soff, data, build_pos[b0 + e], psoff, pdata, v)):
            return at
        s = (s + np.uint64(1)) & mask
    return at


@jit(inline="always")
def _enter(i, b0, tb, mask, build_pos, soff, data, valid, slot, slot_hash):
    """Enter build entry i of the group whose entries start at b0 into that group's table
    (slots tb:tb + mask + 1); returns :func:`index_groups`' ``first[i]``."""
    if _is_null(build_pos, valid, i):
        return -1
    v = build_pos[i]
    h = _hash(soff, data, v)
    tag = np.uint32(h >> np.uint64(32))
    at = _slot_of(tb, mask, h, tag, slot, slot_hash, b0, build_pos, soff, data, soff, data, v)
    if slot[at] < 0:
        slot[at] = np.int32(i - b0)
        slot_hash[at] = tag
        return i
    return b0 + slot[at]


@jit(inline="always")
def _find(j, b0, tb, mask, build_pos, soff, data, slot, slot_hash, probe_pos, psoff, pdata, missing):
    """The build entry of the group's table (as for :func:`_enter`) whose string equals the
    string of probe j (not null), else ``missing``."""
    v = probe_pos[j]
    h = _hash(psoff, pdata, v)
    at = _slot_of(tb, mask, h, np.uint32(h >> np.uint64(32)), slot, slot_hash, b0, build_pos, soff, data,
                  psoff, pdata, v)
    return b0 + slot[at] if slot[at] >= 0 else missing


@jit
def index_groups(chunks, build_off, build_pos, soff, data, valid, tab_off, slot, slot_hash, first):
    """first[i] = the first build entry of i's group whose string equals i's (i itself when
    none before it), -1 where entry i is null; for the groups chunks[0]:chunks[-1].

    build_off int64[G+1]: group g's build entries are build_off[g]:build_off[g+1].
    build_pos int64[B]: each entry's string in (soff int64[n+1], data uint8[...]), -1 null.
    valid bool[n] or bool[0]: False for a null string (zero-length: none is null).
    tab_off int64[G+1]: :func:`table_offsets` of build_off; slot int32 / slot_hash uint32
    [tab_off[-1]]: from :func:`new_tables`, filled here (slot: entry - build_off[g]).
    first int64[B]: out.
    """
    for g in range(chunks[0], chunks[-1]):
        b0 = build_off[g]
        tb = tab_off[g]
        mask = np.uint64(tab_off[g + 1] - tb - 1)
        for i in range(b0, build_off[g + 1]):
            first[i] = _enter(i, b0, tb, mask, build_pos, soff, data, valid, slot, slot_hash)


@jit
def probe_groups(chunks, build_off, build_pos, soff, data, tab_off, slot, slot_hash, probe_group,
                 probe_pos, psoff, pdata, pvalid, missing, null, found):
    """found[j] = the first build entry of group probe_group[j] whose string equals probe j's
    (probe_pos[j] in psoff/pdata, pvalid as ``valid`` of :func:`index_groups`); ``null`` when
    the probe is null, else ``missing`` when there is no such entry or the group is < 0; for
    the probes chunks[0]:chunks[-1]. The build arguments are those given to
    :func:`index_groups` (its ``valid`` is not needed: null entries never enter the tables)."""
    for j in range(chunks[0], chunks[-1]):
        if _is_null(probe_pos, pvalid, j):
            found[j] = null
            continue
        g = probe_group[j]
        found[j] = missing
        if g < 0:
            continue
        tb = tab_off[g]
        size = tab_off[g + 1] - tb
        if size == 0:
            continue
        found[j] = _find(j, build_off[g], tb, np.uint64(size - 1), build_pos, soff, data, slot, slot_hash,
                         probe_pos, psoff, pdata, missing)


@jit(inline="always")
def _table_size(n):
    """Slots for a group of n entries: the power of two of at least 2n, at least 2 (the size
    :func:`table_offsets` gives a non-empty group)."""
    size = 2
    while size < 2 * n:
        size *= 2
    return size


@jit
def join_groups(chunks, build_off, build_pos, soff, data, valid, probe_off, probe_pos, psoff, pdata,
                pvalid, missing, null, first, found):
    """:func:`index_groups` and :func:`probe_groups` in one pass, for probes that come grouped:
    group g's probes are probe_off[g]:probe_off[g+1] (int64[G+1]). For the groups
    chunks[0]:chunks[-1], ``first`` of their build entries and ``found`` of their probes are what
    those two kernels give (with probe_group[j] = g), through one table at a time: the group's
    own, in a scratch array reused by the next group, probed while the group's strings are still
    in cache. No shared tables are allocated. Other arguments as for those kernels."""
    size_max = 2
    for g in range(chunks[0], chunks[-1]):
        size_max = max(size_max, _table_size(build_off[g + 1] - build_off[g]))
    slot = np.empty(size_max, dtype=np.int32)
    slot_hash = np.empty(size_max, dtype=np.uint32)
    for g in range(chunks[0], chunks[-1]):
        b0 = build_off[g]
        n = build_off[g + 1] - b0
        size = _table_size(n)
        for s in range(size):
            slot[s] = -1
        mask = np.uint64(size - 1)
        tb = np.int64(0)
        for i in range(b0, b0 + n):
            first[i] = _enter(i, b0, tb, mask, build_pos, soff, data, valid, slot, slot_hash)
        for j in range(probe_off[g], probe_off[g + 1]):
            if _is_null(probe_pos, pvalid, j):
                found[j] = null
            else:
                found[j] = _find(j, b0, tb, mask, build_pos, soff, data, slot, slot_hash, probe_pos, psoff,
                                 pdata, missing)


def index_groups_py(build_off, build_ids) -> list:
    """Plain-Python :func:`index_groups` over a list of ids (None: null)."""
    first = []
    for g in range(len(build_off) - 1):
        seen: dict = {}
        for i in range(build_off[g], build_off[g + 1]):
            first.append(-1 if build_ids[i] is None else seen.setdefault(build_ids[i], i))
    return first


def probe_groups_py(build_off, build_ids, probe_group, probe_ids, missing=-1, null=-1) -> list:
    """Plain-Python :func:`probe_groups` over lists of ids (None: null)."""
    found = []
    for g, x in zip(probe_group, probe_ids):
        hit = missing
        if x is None:
            hit = null
        elif g >= 0:
            hit = next((i for i in range(build_off[g], build_off[g + 1]) if build_ids[i] == x), missing)
        found.append(hit)
    return found
