"""Kernel: exact dense codes for strings within groups (a rollout's call ids), kept from chunk
to chunk.

The import reads its log a chunk at a time, and a call's parent may sit in any earlier chunk,
so ids are numbered once, for the whole import: :class:`Interner` maps each distinct
``(group, string)`` to a code (0, 1, ... in order of first appearance) through an
open-addressing table whose every hit is confirmed byte for byte, and keeps a copy of each
distinct string so that codes can be written back as names (a parent's call_id). Equal
strings in different groups get different codes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from chainrows.arrays import grown
from chainrows.engine.jit import jit
from chainrows.engine.strhash import FNV_OFFSET, fnv1a

_MIX = np.uint64(0x9E3779B97F4A7C15)


@jit(inline="always")
def _same(offsets, data, i, arena, start, length):
    if offsets[i + 1] - offsets[i] != length:
        return False
    a = offsets[i]
    for j in range(length):
        if data[a + j] != arena[start + j]:
            return False
    return True


@jit
def _intern(groups, offsets, data, insert, slots, code_hash, code_group, code_off, arena, n_codes,
            arena_len, out):
    """out[i] = the code of (groups[i], string i of offsets/data); a new string gets the next
    code when ``insert``, else -1. The caller sized the table (at most half full after the
    call), the per-code arrays and the arena. Returns ``(n_codes, arena_len)``."""
    mask = np.uint64(len(slots) - 1)
    for i in range(len(groups)):
        h = fnv1a(offsets, data, i, FNV_OFFSET ^ (np.uint64(groups[i]) * _MIX))
        s = h & mask
        while True:
            c = slots[s]
            if c < 0:
                if not insert:
                    out[i] = -1
                    break
                n = offsets[i + 1] - offsets[i]
                arena[arena_len:arena_len + n] = data[offsets[i]:offsets[i + 1]]
                code_hash[n_codes] = h
                code_group[n_codes] = groups[i]
                code_off[n_codes] = arena_len
                code_off[n_codes + 1] = arena_len + n
                arena_len += n
                slots[s] = n_codes
                out[i] = n_codes
                n_codes += 1
                break
            if code_hash[c] == h and code_group[c] == groups[i] and \
                    _same(offsets, data, i, arena, code_off[c], code_off[c + 1] - code_off[c]):
                out[i] = c
                break
            s = (s + np.uint64(1)) & mask
    return n_codes, arena_len


@jit
def _rehash(code_hash, n_codes, slots):
    mask = np.uint64(len(slots) - 1)
    for c in range(n_codes):
        s = code_hash[c] & mask
        while slots[s] >= 0:
            s = (s + np.uint64(1)) & mask
        slots[s] = c


@jit
def _gather_names(codes, code_off, arena):
    """Offsets (int32) and bytes of the names of ``codes`` (an empty string where code < 0)."""
    offsets = np.zeros(len(codes) + 1, np.int32)
    for i in range(len(codes)):
        c = codes[i]
        n = code_off[c + 1] - code_off[c] if c >= 0 else 0
        offsets[i + 1] = offsets[i] + n
    data = np.empty(offsets[-1], np.uint8)
    for i in range(len(codes)):
        c = codes[i]
        if c >= 0:
            data[offsets[i]:offsets[i + 1]] = arena[code_off[c]:code_off[c + 1]]
    return offsets, data


class Interner:
    """Codes for ``(group, string)`` pairs, numbered in order of first appearance, exact."""

    def __init__(self):
        self.slots = np.full(1 << 10, -1, np.int64)
        self.code_hash = np.zeros(256, np.uint64)
        self.code_group = np.zeros(256, np.int64)
        self.code_off = np.zeros(257, np.int64)
        self.arena = np.zeros(1 << 12, np.uint8)
        self.n_codes = 0
        self.arena_len = 0

    def codes(self, groups: np.ndarray, offsets: np.ndarray, data: np.ndarray, insert: bool = True) -> np.ndarray:
        """int64 code per string i of ``offsets`` (int64[n+1], validated by the caller) and
        ``data`` (uint8) in group ``groups[i]``; -1 for a string never seen when not ``insert``."""
        n = len(groups)
        need = self.n_codes + n
        if 2 * need > len(self.slots):
            size = 1 << max(10, int(4 * need - 1).bit_length())
            self.slots = np.full(size, -1, np.int64)
            _rehash(self.code_hash, self.n_codes, self.slots)
        self.code_hash = grown(self.code_hash, need)
        self.code_group = grown(self.code_group, need)
        self.code_off = grown(self.code_off, need + 1)
        self.arena = grown(self.arena, self.arena_len + int(offsets[-1] - offsets[0]))
        out = np.empty(n, np.int64)
        self.n_codes, self.arena_len = _intern(
            np.ascontiguousarray(groups, np.int64), offsets, data, insert, self.slots, self.code_hash,
            self.code_group, self.code_off, self.arena, self.n_codes, self.arena_len, out)
        return out

    def names(self, codes: np.ndarray) -> pa.Array:
        """The strings of ``codes`` as an Arrow string array, null where a code is < 0."""
        codes = np.ascontiguousarray(codes, np.int64)
        offsets, data = _gather_names(codes, self.code_off, self.arena)
        valid = codes >= 0
        bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
        return pa.StringArray.from_buffers(len(codes), pa.py_buffer(offsets), pa.py_buffer(data), bitmap,
                                           null_count=int(len(codes) - valid.sum()))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.slots, self.code_hash, self.code_group, self.code_off, self.arena))
