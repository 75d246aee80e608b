"""Item key slots in call order (chainrows.engine.slots) against their plain-Python definitions."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chainrows.arrays import offsets_from_lengths
from chainrows.engine.batch import readonly
from chainrows.engine.chunks import balanced_chunks, even_chunks
from chainrows.engine.slots import (
    any_served,
    any_served_py,
    fill_slots,
    fill_slots_py,
    slot_counts,
    slot_counts_py,
)
from chainrows.engine.threads import run
from chainrows.errors import InputError
from chainrows.lowering.joins import _ledger_lists
from tests.support.profiles import examples

KEYS = st.one_of(st.none(), st.lists(st.sampled_from([0, 1, 7, 2**63, 2**64 - 1]), max_size=4))
IDS = st.one_of(st.none(), st.lists(st.one_of(st.none(), st.sampled_from(["a", "b", ""])), max_size=4))


@st.composite
def ledgers(draw):
    """A ledger's item_keys and item_ids lists (None: a null list), some rows sliced off the
    front (offsets that do not start at 0), and the calls' rows (any order)."""
    n = draw(st.integers(0, 12))
    head = draw(st.integers(0, 3))
    keys = draw(st.lists(KEYS, min_size=n + head, max_size=n + head))
    ids = []
    for k in keys:  # mostly as long as the keys, so most rows align
        ids.append(draw(st.one_of(IDS, st.lists(st.sampled_from(["a", "b", "c"]), min_size=len(k or []),
                                                  max_size=len(k or [])))))
    rows = draw(st.permutations(list(range(n))))
    lists = pa.large_list if draw(st.booleans()) else pa.list_
    table = pa.table({"item_keys": pa.array(keys, lists(pa.uint64())),
                      "item_ids": pa.array(ids, lists(pa.string()))}).slice(head)
    cut = draw(st.integers(0, n))  # columns of two chunks (joined before the kernels read them)
    table = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    return table, np.array(rows, dtype=np.int64)


def _slots(table, rows, threads_chunks=even_chunks):
    key_off, key_valid, key_values = _ledger_lists(table, "item_keys")
    id_off, id_valid, _ = _ledger_lists(table, "item_ids")
    C = len(rows)
    key_len = np.full(C, -7, dtype=np.int64)
    run(slot_counts, threads_chunks(C), readonly(rows), key_off, key_valid, key_len)
    slot_off = offsets_from_lengths(key_len)
    S = int(slot_off[-1])
    item_keys = np.full(S, 12345, dtype=np.uint64)
    item_pos = np.full(S, -7, dtype=np.int64)
    bad = np.zeros(C, dtype=bool)
    run(fill_slots, balanced_chunks(slot_off + np.arange(C + 1)), readonly(rows), key_off,
        readonly(key_values.to_numpy(zero_copy_only=False).astype(np.uint64)), id_off, id_valid, readonly(slot_off),
        item_keys, item_pos, bad)
    return key_len, slot_off, item_keys, item_pos, bad


@settings(max_examples=examples(2))
@given(ledgers())
def test_kernels_match_definitions(ledger):
    table, rows = ledger
    key_lists = table["item_keys"].to_pylist()
    id_lists = table["item_ids"].to_pylist()
    id_off = _ledger_lists(table, "item_ids")[0]  # a slice's offsets index the whole values
    key_len, slot_off, item_keys, item_pos, bad = _slots(table, rows)
    assert key_len.tolist() == slot_counts_py(rows, key_lists)
    want_keys, want_pos, want_bad = fill_slots_py(rows, key_lists, id_lists, id_off[:-1].tolist())
    assert item_keys.tolist() == want_keys
    assert item_pos.tolist() == want_pos
    assert bad.tolist() == want_bad
    # independent of the offsets: the id each position names is the row's own id for its slot
    id_values = _ledger_lists(table, "item_ids")[2].to_pylist()
    named = [None if q < 0 else id_values[q] for q in item_pos]
    want_named = [ids[d] if ids is not None and len(ids) == len(k or []) else None
                  for r in rows for k, ids in [(key_lists[r], id_lists[r])] for d in range(len(k or []))]
    assert named == want_named
    # any_served over codes drawn from the positions (a position >= 0 stands for a served id)
    codes = np.where(item_pos % 3 == 0, item_pos, -1)
    identified = np.ones(len(rows), dtype=bool)  # join_items starts it empty: every call is written
    run(any_served, even_chunks(len(rows)), readonly(slot_off), readonly(codes), identified)
    assert identified.tolist() == any_served_py(slot_off, codes.tolist())


def test_worked_example():
    """Row 0: two keys, ids that align; row 1: a null key list beside ids (flagged); row 2:
    keys with a null id list (ids all null, not flagged); row 3: ids one short (flagged).
    The calls take the rows in the order 3, 0, 2, 1."""
    table = pa.table({"item_keys": pa.array([[5, 6], None, [7], [8, 9]], pa.list_(pa.uint64())),
                      "item_ids": pa.array([["a", "b"], ["x"], None, ["c"]], pa.list_(pa.string()))})
    key_len, slot_off, item_keys, item_pos, bad = _slots(table, np.array([3, 0, 2, 1], dtype=np.int64))
    assert key_len.tolist() == [2, 2, 1, 0]
    assert item_keys.tolist() == [8, 9, 5, 6, 7]
    assert item_pos.tolist() == [-1, -1, 0, 1, -1]
    assert bad.tolist() == [True, False, False, True]


def test_list_offsets_outside_their_values_are_refused_before_any_kernel():
    """A hand-built list column whose middle offset passes its values (Arrow's quick validation
    checks only the first and last): an InputError naming the column, not a read outside the
    buffer."""
    values = pa.array([1, 2, 3], pa.uint64())
    offsets = pa.py_buffer(np.array([0, 9, 3], np.int32).tobytes())
    broken = pa.ListArray.from_buffers(pa.list_(pa.uint64()), 2, [None, offsets], children=[values])
    with pytest.raises(InputError, match="ledger: column 'item_keys': list offsets outside its values"):
        _ledger_lists(pa.table({"item_keys": broken}), "item_keys")


def test_a_null_list_that_spans_values_has_no_slots_and_no_ids():
    """Arrow lets a null list's offsets span values (hand-built, or a writer that left them):
    a null key list still has no slots, a null id list still means every id is null."""
    validity = pa.py_buffer(np.packbits([0, 1, 1], bitorder="little").tobytes())  # row 0 null
    offsets = pa.py_buffer(np.array([0, 2, 3, 5], np.int32).tobytes())
    keys = pa.ListArray.from_buffers(pa.list_(pa.uint64()), 3, [validity, offsets],
                                     children=[pa.array([1, 2, 3, 4, 5], pa.uint64())])
    ids = pa.ListArray.from_buffers(pa.list_(pa.string()), 3, [validity, offsets],
                                    children=[pa.array(["a", "b", "c", "d", "e"])])
    assert keys.to_pylist() == [None, [3], [4, 5]] and ids.to_pylist() == [None, ["c"], ["d", "e"]]
    rows = np.array([0, 1, 2], dtype=np.int64)
    key_len, _, item_keys, item_pos, bad = _slots(pa.table({"item_keys": keys, "item_ids": ids}), rows)
    assert key_len.tolist() == [0, 1, 2] and item_keys.tolist() == [3, 4, 5]
    assert item_pos.tolist() == [2, 3, 4] and bad.tolist() == [False, False, False]
    table = pa.table({"item_keys": pa.array([[9, 9], [3], [4, 5]], pa.list_(pa.uint64())), "item_ids": ids})
    key_len, _, _, item_pos, bad = _slots(table, rows)  # a null id list beside two keys: ids null, not flagged
    assert key_len.tolist() == [2, 1, 2] and item_pos.tolist() == [-1, -1, 2, 3, 4]
    assert bad.tolist() == [False, False, False]
