"""Kernel: match each rollout's item ids against its output ids (SPEC §3 steps 4-6), exactly.

The ids are strings; this kernel never encodes them globally. Per rollout it builds a small
open-addressing table of the output ids (hash to place, bytes to decide) and probes it with the
item ids of the rollout's calls. A hash collision costs one byte comparison, never a wrong
answer.

Codes it gives (the contract of Batch.out_ids / Batch.item_ids): an output id's code is the
position (in the output arrays) of the first output of its rollout with the same id; an item
id's code is the code of the output of its rollout with the same id, or ``NO_OUTPUT`` when no
output of its rollout has it. ``-1`` is a null (or an id list of the wrong length). So within a
rollout, an item code equals an output code exactly when the ids are equal.

Plain-Python definition (chainrows.engine.idmatch.match_ids_py, used by the tests): for each
rollout, ``first = {}`` over its outputs in order; ``out_code[q] = first.setdefault(id, q)``;
an item's code is ``first.get(id, NO_OUTPUT)``; served outputs are those whose id some item of
the rollout has; a call is identified when one of its item ids has a code >= 0.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from chainrows.engine._jit import jit, pjit

NO_OUTPUT = -2  # an item id no output of its rollout has

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


def table_offsets(out_off: np.ndarray) -> np.ndarray:
    """Offsets of each rollout's slot range in the shared tables: a power of two of at least
    twice its output count (load factor <= 1/2), 0 for a rollout without outputs."""
    n = np.diff(out_off)
    size = np.where(n > 0, np.left_shift(1, np.ceil(np.log2(np.maximum(2 * n, 2))).astype(np.int64)), 0)
    off = np.zeros(len(n) + 1, dtype=np.int64)
    np.cumsum(size, out=off[1:])
    return off


@jit(inline="always")
def _hash(soff, data, v):
    h = _FNV_OFFSET
    for j in range(soff[v], soff[v + 1]):
        h = (h ^ np.uint64(data[j])) * _FNV_PRIME
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(29)
    return h


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


@pjit
def match_ids(call_off, key_off, out_off, item_pos, out_pos, item_soff, item_data, out_soff, out_data,
              tab_off, slot_out, slot_hash, item_code, out_code, out_served, identified):
    """Fill the codes, ``out_served`` and ``identified`` (see the module docstring).

    Parameters (R rollouts, C calls, K item slots, O output slots):
    call_off int64[R+1]: the calls of rollout r are call_off[r]:call_off[r+1].
    key_off int64[C+1]: the item slots of call c are key_off[c]:key_off[c+1].
    out_off int64[R+1]: the output slots of rollout r.
    item_pos int64[K] / out_pos int64[O]: each slot's string in item_* / out_* (-1: null).
    item_soff int64[n+1], item_data uint8[...]: the item id strings (Arrow offsets + bytes);
    out_soff, out_data: the output id strings.
    tab_off int64[R+1]: :func:`table_offsets` of out_off; slot_out int64[tab_off[-1]] (filled
    with -1 by the caller) and slot_hash uint64[tab_off[-1]]: scratch tables.
    Out: item_code int64[K], out_code int64[O], out_served bool[O] (False on entry),
    identified bool[C] (False on entry).
    """
    for r in prange(len(out_off) - 1):
        ob, oe = out_off[r], out_off[r + 1]
        tb = tab_off[r]
        mask = np.uint64(tab_off[r + 1] - tb - 1)
        for q in range(ob, oe):
            v = out_pos[q]
            if v < 0:
                out_code[q] = -1
                continue
            h = _hash(out_soff, out_data, v)
            s = h & mask
            while True:
                at = tb + np.int64(s)
                first = slot_out[at]
                if first < 0:
                    slot_out[at] = q
                    slot_hash[at] = h
                    out_code[q] = q
                    break
                if slot_hash[at] == h and _same(out_soff, out_data, out_pos[first], out_soff, out_data, v):
                    out_code[q] = first
                    break
                s = (s + np.uint64(1)) & mask
        for c in range(call_off[r], call_off[r + 1]):
            for k in range(key_off[c], key_off[c + 1]):
                v = item_pos[k]
                if v < 0:
                    item_code[k] = -1
                    continue
                if oe == ob:
                    item_code[k] = NO_OUTPUT
                    continue
                h = _hash(item_soff, item_data, v)
                s = h & mask
                while True:
                    at = tb + np.int64(s)
                    first = slot_out[at]
                    if first < 0:
                        item_code[k] = NO_OUTPUT
                        break
                    if slot_hash[at] == h and _same(out_soff, out_data, out_pos[first], item_soff, item_data, v):
                        item_code[k] = first
                        out_served[first] = True
                        identified[c] = True
                        break
                    s = (s + np.uint64(1)) & mask
        for q in range(ob, oe):
            if out_code[q] >= 0:
                out_served[q] = out_served[out_code[q]]


def match_ids_py(call_off, key_off, out_off, item_ids, out_ids):
    """Plain-Python definition of :func:`match_ids` over lists of ids (None: null):
    (item_code, out_code, out_served, identified) as lists."""
    item_code, out_code = [0] * len(item_ids), [0] * len(out_ids)
    out_served, identified = [False] * len(out_ids), [False] * (len(key_off) - 1)
    for r in range(len(out_off) - 1):
        first: dict = {}
        for q in range(out_off[r], out_off[r + 1]):
            out_code[q] = -1 if out_ids[q] is None else first.setdefault(out_ids[q], q)
        served = set()
        for c in range(call_off[r], call_off[r + 1]):
            for k in range(key_off[c], key_off[c + 1]):
                if item_ids[k] is None:
                    item_code[k] = -1
                    continue
                item_code[k] = first.get(item_ids[k], NO_OUTPUT)
                if item_code[k] >= 0:
                    served.add(item_ids[k])
                    identified[c] = True
        for q in range(out_off[r], out_off[r + 1]):
            out_served[q] = out_ids[q] is not None and out_ids[q] in served
    return item_code, out_code, out_served, identified
