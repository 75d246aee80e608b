"""Kernels: every call's item key slots, in call order, from the ledger's list columns.

Call c is ledger row ``rows[c]`` (calls are the ledger rows grouped by rollout). Its
``item_keys`` list holds its key slots (a null list: none); its ``item_ids`` list names the
slots' ids position by position (a null list: every id null; a list of another length: every
id null and the call flagged, SPEC §2). Lists are Arrow-style: int64 offsets per row into a
values array, and a validity array per row (bool, zero-length when no row is null).

In numpy this took a gather of each list's starts and stops through ``rows``, a range index and
a gather of the keys, the id alignment, and a ``reduceat`` for the calls that serve an output,
each a serial pass over every call or slot; here it is three passes that split the calls across
threads (docs/decisions-engine.md "Per-call passes around the joins").

Plain-Python definitions (used by the tests): :func:`slot_counts_py`, :func:`fill_slots_py`,
:func:`any_served_py`.
"""

from __future__ import annotations

from chainrows.engine.jit import jit


@jit(inline="always")
def _is_null(valid, r):
    return len(valid) > 0 and not valid[r]


@jit
def slot_counts(chunks, rows, key_off, key_valid, key_len):
    """key_len[c] = the length of call c's item_keys list (0 for a null list), for the calls
    chunks[0]:chunks[-1].

    rows int64[C]: each call's ledger row. key_off int64[n+1]: the list offsets per ledger row;
    key_valid bool[n] or bool[0]: False for a null list. key_len int64[C]: out.
    """
    for c in range(chunks[0], chunks[-1]):
        r = rows[c]
        key_len[c] = 0 if _is_null(key_valid, r) else key_off[r + 1] - key_off[r]


@jit
def fill_slots(chunks, rows, key_off, key_values, id_off, id_valid, slot_off, item_keys, item_pos, bad):
    """For the calls chunks[0]:chunks[-1], each call c's slots slot_off[c]:slot_off[c+1]:
    item_keys = its item_keys list; item_pos = the position in the ids' values of each slot's
    id, -1 for all of them when its item_ids list is null or of another length than its keys;
    bad[c] = True when that list is not null and of another length (else untouched).

    rows, key_off: as for :func:`slot_counts` (whose key_len gave slot_off, int64[C+1], so a
    null key list has no slots). key_values uint64[...]: the keys' values. id_off
    int64[n+1], id_valid bool[n] or bool[0]: the item_ids lists. item_keys uint64[S], item_pos
    int64[S], bad bool[C]: out.
    """
    for c in range(chunks[0], chunks[-1]):
        r = rows[c]
        a = slot_off[c]
        n = slot_off[c + 1] - a
        k = key_off[r]
        for d in range(n):
            item_keys[a + d] = key_values[k + d]
        s = id_off[r]
        ids_null = _is_null(id_valid, r)
        if not ids_null and id_off[r + 1] - s == n:
            for d in range(n):
                item_pos[a + d] = s + d
        else:
            if not ids_null:
                bad[c] = True
            for d in range(n):
                item_pos[a + d] = -1


@jit
def any_served(chunks, slot_off, item_ids, identified):
    """identified[c] = some slot of call c has an id that serves an output (item_ids >= 0), for
    the calls chunks[0]:chunks[-1]. slot_off int64[C+1], item_ids int64[S], identified bool[C]: out."""
    for c in range(chunks[0], chunks[-1]):
        hit = False
        for s in range(slot_off[c], slot_off[c + 1]):
            if item_ids[s] >= 0:
                hit = True
                break
        identified[c] = hit


def slot_counts_py(rows, key_lists) -> list:
    """Plain-Python :func:`slot_counts`: ``key_lists`` a list per ledger row, None for null."""
    return [len(key_lists[r] or []) for r in rows]


def fill_slots_py(rows, key_lists, id_lists, id_starts) -> tuple[list, list, list]:
    """Plain-Python :func:`fill_slots`: (item_keys, item_pos, bad) over lists per ledger row
    (None: null), ``id_starts[r]`` the position of row r's first id in the ids' values."""
    keys, pos, bad = [], [], []
    for r in rows:
        k = key_lists[r] or []
        keys += k
        ids = id_lists[r]
        ok = ids is not None and len(ids) == len(k)
        pos += [id_starts[r] + d for d in range(len(k))] if ok else [-1] * len(k)
        bad.append(ids is not None and len(ids) != len(k))
    return keys, pos, bad


def any_served_py(slot_off, item_ids) -> list:
    """Plain-Python :func:`any_served`."""
    return [any(v >= 0 for v in item_ids[slot_off[c]:slot_off[c + 1]]) for c in range(len(slot_off) - 1)]
