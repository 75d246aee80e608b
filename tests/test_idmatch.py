"""The id-matching kernel (chainrows.engine.idmatch) against its plain-Python definition."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from chainrows.engine.batch import readonly
from chainrows.engine.idmatch import NO_OUTPUT, match_ids, match_ids_py, table_offsets
from chainrows.io.arrays import offsets_from_lengths, string_parts

# few distinct ids (many equal ones), some sharing a prefix or differing only in length
IDS = st.one_of(st.none(), st.sampled_from(["", "a", "b", "ab", "ba", "aa", "é", "x" * 40, "x" * 41]))


def run_kernel(call_off, key_off, out_off, item_ids, out_ids, string_type=pa.string()):
    def strings(ids):
        # a sliced array with a non-zero offset, and every value stored once in order
        arr = pa.array(["pad"] + list(ids), string_type).slice(1)
        soff, data, valid = string_parts(arr)
        pos = np.arange(len(ids), dtype=np.int64)
        if valid is not None:
            pos[~valid] = -1
        return pos, soff, data

    item_pos, item_soff, item_data = strings(item_ids)
    out_pos, out_soff, out_data = strings(out_ids)
    tab_off = table_offsets(np.asarray(out_off, dtype=np.int64))
    item_code = np.empty(len(item_ids), dtype=np.int64)
    out_code = np.empty(len(out_ids), dtype=np.int64)
    served = np.zeros(len(out_ids), dtype=bool)
    identified = np.zeros(len(key_off) - 1, dtype=bool)
    args = [np.asarray(a, dtype=np.int64) for a in (call_off, key_off, out_off)]
    match_ids(*map(readonly, args), readonly(item_pos), readonly(out_pos), readonly(item_soff),
              readonly(item_data), readonly(out_soff), readonly(out_data), readonly(tab_off),
              np.full(int(tab_off[-1]), -1, dtype=np.int64), np.empty(int(tab_off[-1]), dtype=np.uint64),
              item_code, out_code, served, identified)
    return item_code.tolist(), out_code.tolist(), served.tolist(), identified.tolist()


@st.composite
def rollouts(draw):
    calls_per = draw(st.lists(st.integers(0, 4), min_size=1, max_size=6))
    items_per = [draw(st.integers(0, 5)) for _ in range(sum(calls_per))]
    outs_per = [draw(st.integers(0, 9)) for _ in calls_per]
    item_ids = draw(st.lists(IDS, min_size=sum(items_per), max_size=sum(items_per)))
    out_ids = draw(st.lists(IDS, min_size=sum(outs_per), max_size=sum(outs_per)))
    return (offsets_from_lengths(calls_per), offsets_from_lengths(items_per), offsets_from_lengths(outs_per),
            item_ids, out_ids)


@settings(max_examples=300, deadline=None)
@given(rollouts(), st.sampled_from([pa.string(), pa.large_string()]))
def test_kernel_matches_definition(case, string_type):
    call_off, key_off, out_off, item_ids, out_ids = case
    got = run_kernel(call_off, key_off, out_off, item_ids, out_ids, string_type)
    assert got == match_ids_py(call_off.tolist(), key_off.tolist(), out_off.tolist(), item_ids, out_ids)


def test_worked_codes():
    # rollout 0: outputs a, b, a; call 0 has a, z; call 1 has None. Rollout 1: output a, call 2 has b.
    got = run_kernel([0, 2, 3], [0, 2, 3, 4], [0, 3, 4], ["a", "z", None, "b"], ["a", "b", "a", "a"])
    item_code, out_code, served, identified = got
    assert out_code == [0, 1, 0, 3]
    assert item_code == [0, NO_OUTPUT, -1, NO_OUTPUT]  # rollout 1's "b" is no output of rollout 1
    assert served == [True, False, True, False]
    assert identified == [True, False, False]


def test_many_outputs_in_one_rollout_probe_past_occupied_slots():
    outs = [f"id{i}" for i in range(5000)] + [f"id{i}" for i in range(10)]
    items = outs[:5000:7] + ["nope", "id5000"]
    got = run_kernel([0, 1], [0, len(items)], [0, len(outs)], items, outs)
    want = match_ids_py([0, 1], [0, len(items)], [0, len(outs)], items, outs)
    assert got == want
    assert got[0][-2:] == [NO_OUTPUT, NO_OUTPUT]


def test_table_offsets_power_of_two_at_least_twice():
    off = table_offsets(np.array([0, 0, 1, 4, 9], dtype=np.int64))
    assert np.diff(off).tolist() == [0, 2, 8, 16]
