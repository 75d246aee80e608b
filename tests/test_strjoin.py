"""Exact string joins within groups (chainrows.engine.strjoin) against their plain-Python definitions."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from chainrows.engine.batch import readonly
from chainrows.engine.strjoin import (
    index_groups, index_groups_py, new_tables, probe_groups, probe_groups_py, table_offsets,
)
from chainrows.engine.threads import run
from chainrows.io.arrays import offsets_from_lengths, string_parts

# few distinct ids (many equal ones), some sharing a prefix or differing only in length
IDS = st.one_of(st.none(), st.sampled_from(["", "a", "b", "ab", "ba", "aa", "é", "x" * 40, "x" * 41]))


def _strings(ids, string_type):
    arr = pa.array(["pad"] + list(ids), string_type).slice(1)  # a non-zero array offset
    soff, data, valid = string_parts(arr)
    pos = np.arange(len(ids), dtype=np.int64)
    if valid is not None:
        pos[~valid] = -1
    return pos, soff, data


def run_kernels(build_off, build_ids, probe_group, probe_ids, string_type=pa.string()):
    build_off = np.asarray(build_off, dtype=np.int64)
    pos, soff, data = _strings(build_ids, string_type)
    ppos, psoff, pdata = _strings(probe_ids, string_type)
    tab_off = table_offsets(build_off)
    slot, slot_hash = new_tables(tab_off)
    first = np.empty(len(build_ids), dtype=np.int64)
    # one item per chunk, split over the threads: a part that strayed outside its chunks shows
    run(index_groups, np.arange(len(build_off), dtype=np.int64), readonly(build_off), readonly(pos),
        readonly(soff), readonly(data), readonly(tab_off), slot, slot_hash, first)
    found = np.empty(len(probe_ids), dtype=np.int64)
    run(probe_groups, np.arange(len(probe_ids) + 1, dtype=np.int64), readonly(build_off), readonly(pos),
        readonly(soff), readonly(data), readonly(tab_off), readonly(slot), readonly(slot_hash),
        readonly(np.asarray(probe_group, dtype=np.int64)), readonly(ppos), readonly(psoff), readonly(pdata),
        found)
    return first.tolist(), found.tolist()


@st.composite
def groups(draw):
    sizes = draw(st.lists(st.integers(0, 9), min_size=1, max_size=6))
    build = draw(st.lists(IDS, min_size=sum(sizes), max_size=sum(sizes)))
    n_probe = draw(st.integers(0, 20))
    probe_group = draw(st.lists(st.integers(-1, len(sizes) - 1), min_size=n_probe, max_size=n_probe))
    probe = draw(st.lists(IDS, min_size=n_probe, max_size=n_probe))
    return offsets_from_lengths(sizes), build, probe_group, probe


@settings(max_examples=300, deadline=None)
@given(groups(), st.sampled_from([pa.string(), pa.large_string()]))
def test_kernels_match_definitions(case, string_type):
    build_off, build, probe_group, probe = case
    first, found = run_kernels(build_off, build, probe_group, probe, string_type)
    assert first == index_groups_py(build_off.tolist(), build)
    assert found == probe_groups_py(build_off.tolist(), build, probe_group, probe)


def test_worked_example():
    # group 0: a, b, a; group 1: a, None
    first, found = run_kernels([0, 3, 5], ["a", "b", "a", "a", None], [0, 1, 1, 0, -1, 1],
                               ["a", "a", "b", None, "a", ""])
    assert first == [0, 1, 0, 3, -1]
    assert found == [0, 3, -1, -1, -1, -1]  # "b" is in group 0 only; null and group -1 never match


def test_large_group_probes_past_occupied_slots():
    build = [f"id{i}" for i in range(5000)] + [f"id{i}" for i in range(10)]
    probe = build[:5000:7] + ["nope", "id5000"]
    first, found = run_kernels([0, len(build)], build, [0] * len(probe), probe)
    assert first == index_groups_py([0, len(build)], build)
    assert found == probe_groups_py([0, len(build)], build, [0] * len(probe), probe)
    assert found[-2:] == [-1, -1]


def test_table_offsets_power_of_two_at_least_twice():
    off = table_offsets(np.array([0, 0, 1, 4, 9], dtype=np.int64))
    assert np.diff(off).tolist() == [0, 2, 8, 16]
