"""Exact string joins within groups (chainrows.engine.strjoin) against their plain-Python definitions."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chainrows.arrays import offsets_from_lengths, string_parts
from chainrows.engine.batch import readonly
from chainrows.engine.jit import jit
from chainrows.engine.strjoin import (
    _hash,
    _same,
    index_groups,
    index_groups_py,
    join_groups,
    new_tables,
    probe_groups,
    probe_groups_py,
    table_offsets,
)
from chainrows.engine.threads import run
from tests.support.profiles import examples

# few distinct ids (many equal ones), some sharing a prefix or differing only in length
IDS = st.one_of(st.none(), st.sampled_from(["", "a", "b", "ab", "ba", "aa", "é", "x" * 40, "x" * 41]))


def _near_misses() -> list[str]:
    """Strings of 0-25 bytes, each with variants one byte off at its first, middle and last
    byte and at bytes 7-8 (the kernels compare 8 bytes at a time, the last word overlapping)."""
    out = []
    for n in range(26):
        base = "0123456789abcdefghijklmnop"[:n]
        out.append(base)
        for i in sorted({0, n // 2, n - 1, 7, 8} & set(range(n))):
            out.append(base[:i] + "#" + base[i + 1:])
    return out


NEAR_MISSES = _near_misses()
IDS = st.one_of(IDS, st.sampled_from(NEAR_MISSES[::3]), st.sampled_from(NEAR_MISSES[40:60]))


MISSING, NULL = -5, -9  # distinct from each other and from every entry index


def _strings(ids, string_type, null_as):
    """(pos, offsets, bytes, validity) of ``ids`` as the kernels take them. A null id is a null
    string (``null_as == "string"``, validity False) or an entry without one (``"pos"``, -1
    and an empty string there, so only pos can say it is null); strings in reverse order, so
    pos is not the identity."""
    n = len(ids)
    stored = [None if (x is None and null_as == "string") else ("" if x is None else x) for x in reversed(ids)]
    arr = pa.array(["pad"] + stored, string_type).slice(1)  # a non-zero array offset
    soff, data, valid = string_parts(arr)
    pos = np.arange(n - 1, -1, -1, dtype=np.int64)
    if null_as == "pos":
        pos[[x is None for x in ids]] = -1
    return pos, soff, data, np.zeros(0, dtype=bool) if valid is None else valid


def run_kernels(build_off, build_ids, probe_group, probe_ids, string_type=pa.string(), null_as="string"):
    build_off = np.asarray(build_off, dtype=np.int64)
    pos, soff, data, valid = _strings(build_ids, string_type, null_as)
    ppos, psoff, pdata, pvalid = _strings(probe_ids, string_type, null_as)
    tab_off = table_offsets(build_off)
    slot, slot_hash = new_tables(tab_off)
    first = np.empty(len(build_ids), dtype=np.int64)
    # one item per chunk, split over the threads: a part that strayed outside its chunks shows
    run(index_groups, np.arange(len(build_off), dtype=np.int64), readonly(build_off), readonly(pos),
        readonly(soff), readonly(data), readonly(valid), readonly(tab_off), slot, slot_hash, first)
    found = np.empty(len(probe_ids), dtype=np.int64)
    run(probe_groups, np.arange(len(probe_ids) + 1, dtype=np.int64), readonly(build_off), readonly(pos),
        readonly(soff), readonly(data), readonly(tab_off), readonly(slot), readonly(slot_hash),
        readonly(np.asarray(probe_group, dtype=np.int64)), readonly(ppos), readonly(psoff), readonly(pdata),
        readonly(pvalid), MISSING, NULL, found)
    return first.tolist(), found.tolist()


@st.composite
def groups(draw):
    sizes = draw(st.lists(st.integers(0, 9), min_size=1, max_size=6))
    build = draw(st.lists(IDS, min_size=sum(sizes), max_size=sum(sizes)))
    n_probe = draw(st.integers(0, 20))
    probe_group = draw(st.lists(st.integers(-1, len(sizes) - 1), min_size=n_probe, max_size=n_probe))
    probe = draw(st.lists(IDS, min_size=n_probe, max_size=n_probe))
    return offsets_from_lengths(sizes), build, probe_group, probe


@settings(max_examples=examples(3))
@given(groups(), st.sampled_from([pa.string(), pa.large_string()]), st.sampled_from(["string", "pos"]))
def test_kernels_match_definitions(case, string_type, null_as):
    build_off, build, probe_group, probe = case
    first, found = run_kernels(build_off, build, probe_group, probe, string_type, null_as)
    assert first == index_groups_py(build_off.tolist(), build)
    assert found == probe_groups_py(build_off.tolist(), build, probe_group, probe, MISSING, NULL)


@pytest.mark.parametrize("null_as", ["string", "pos"])
def test_worked_example(null_as):
    # group 0: a, b, a; group 1: a, None
    first, found = run_kernels([0, 3, 5], ["a", "b", "a", "a", None], [0, 1, 1, 0, -1, 1, -1],
                               ["a", "a", "b", None, "a", "", None], null_as=null_as)
    assert first == [0, 1, 0, 3, -1]
    # "b" is in group 0 only; group -1 never matches; a null probe is NULL whatever its group
    assert found == [0, 3, MISSING, NULL, MISSING, MISSING, NULL]


def test_large_group_probes_past_occupied_slots():
    build = [f"id{i}" for i in range(5000)] + [f"id{i}" for i in range(10)]
    probe = build[:5000:7] + ["nope", "id5000"]
    first, found = run_kernels([0, len(build)], build, [0] * len(probe), probe)
    assert first == index_groups_py([0, len(build)], build)
    assert found == probe_groups_py([0, len(build)], build, [0] * len(probe), probe, MISSING, NULL)
    assert found[-2:] == [MISSING, MISSING]


@jit
def _all_pairs_same(soff, data, out):
    for a in range(len(soff) - 1):
        for b in range(len(soff) - 1):
            out[a, b] = _same(soff, data, a, soff, data, b)


@jit
def _hashes(soff, data, out):
    for i in range(len(soff) - 1):
        out[i] = _hash(soff, data, i)


@pytest.mark.parametrize("string_type", [pa.string(), pa.large_string()])
def test_byte_comparison_and_hash_of_strings_one_byte_apart(string_type):
    # the tables compare bytes after a 32-bit tag match: equal strings always, different ones
    # (a tag collision) in no random case: the comparison itself on every pair, each string twice
    ids = NEAR_MISSES + NEAR_MISSES[::-1]
    soff, data, _ = string_parts(pa.array(["pad"] + ids, string_type).slice(1))
    same = np.zeros((len(ids), len(ids)), dtype=np.bool_)
    _all_pairs_same(soff, data, same)
    assert same.tolist() == [[x == y for y in ids] for x in ids]
    hashes = np.zeros(len(ids), dtype=np.uint64)
    _hashes(soff, data, hashes)
    by_id = {}
    for x, h in zip(ids, hashes.tolist()):
        assert by_id.setdefault(x, h) == h  # equal strings hash alike
    assert len(set(by_id.values())) == len(by_id)  # and these near misses all differ


def test_table_offsets_power_of_two_at_least_twice():
    off = table_offsets(np.array([0, 0, 1, 4, 9], dtype=np.int64))
    assert np.diff(off).tolist() == [0, 2, 8, 16]


def run_fused(build_off, build_ids, probe_sizes, probe_ids, string_type=pa.string(), null_as="string"):
    """join_groups on probes grouped like the build entries (group g has probe_sizes[g])."""
    build_off = np.asarray(build_off, dtype=np.int64)
    probe_off = offsets_from_lengths(probe_sizes)
    pos, soff, data, valid = _strings(build_ids, string_type, null_as)
    ppos, psoff, pdata, pvalid = _strings(probe_ids, string_type, null_as)
    first = np.full(len(build_ids), -77, dtype=np.int64)
    found = np.full(len(probe_ids), -77, dtype=np.int64)
    # one group per chunk, split over the threads: each part sizes its own scratch table
    run(join_groups, np.arange(len(build_off), dtype=np.int64), readonly(build_off), readonly(pos),
        readonly(soff), readonly(data), readonly(valid), readonly(probe_off), readonly(ppos), readonly(psoff),
        readonly(pdata), readonly(pvalid), MISSING, NULL, first, found)
    return first.tolist(), found.tolist()


@st.composite
def grouped(draw):
    sizes = draw(st.lists(st.integers(0, 9), min_size=1, max_size=6))
    build = draw(st.lists(IDS, min_size=sum(sizes), max_size=sum(sizes)))
    probe_sizes = draw(st.lists(st.integers(0, 6), min_size=len(sizes), max_size=len(sizes)))
    probe = draw(st.lists(IDS, min_size=sum(probe_sizes), max_size=sum(probe_sizes)))
    return offsets_from_lengths(sizes), build, probe_sizes, probe


@settings(max_examples=examples(3))
@given(grouped(), st.sampled_from([pa.string(), pa.large_string()]), st.sampled_from(["string", "pos"]))
def test_fused_kernel_matches_definitions(case, string_type, null_as):
    build_off, build, probe_sizes, probe = case
    first, found = run_fused(build_off, build, probe_sizes, probe, string_type, null_as)
    probe_group = np.repeat(np.arange(len(probe_sizes)), probe_sizes).tolist()
    assert first == index_groups_py(build_off.tolist(), build)
    assert found == probe_groups_py(build_off.tolist(), build, probe_group, probe, MISSING, NULL)


def test_fused_kernel_reuses_its_table_across_groups_of_different_sizes():
    # a big group, then small ones: stale slots of the big group's table must not answer for them
    big = [f"id{i}" for i in range(300)]
    build = big + ["id1", "id2"] + [] + ["id299"]
    build_off = [0, 300, 302, 302, 303]
    probe = ["id5", "id299", "nope"] + ["id1", "id5", "id299"] + ["id1"] + ["id299", "id1", None]
    probe_sizes = [3, 3, 1, 3]
    first, found = run_fused(build_off, build, probe_sizes, probe)
    assert first == index_groups_py(build_off, build)
    assert found == [5, 299, MISSING, 300, MISSING, MISSING, MISSING, 302, MISSING, NULL]


def test_item_join_codes_and_identified_calls():
    """join_items through build_batch (chainrows.lowering.joins.grouped_lookup): each item slot's code
    is the first output slot with its id, NO_OUTPUT when no output has it, -1 when null; a call
    is identified iff one of its slots names an output id; out_ids and out_served per output."""
    from chainrows.engine.batch import NO_OUTPUT
    from chainrows.formats.native.schema import tables_from_pylists
    from chainrows.lowering.columnar import build_batch
    from tests.support.builders import RolloutBuilder, combine, message

    first = RolloutBuilder("a-first")  # sorts first: the second rollout's slots start further on
    first.call("k1", None, carry=[1], gen=[2], items=[message("p", "a")])
    first.output(["k1"])
    b = RolloutBuilder("b-second")
    b.call("c1", None, carry=[1], gen=[2], items=[message("x", "a"), message("y")])  # "a", null
    b.call("c2", "c1", carry=[3], gen=[4], items=[])                                 # no items
    b.call("c3", "c2", carry=[5], gen=[6], items=[message("z", "zzz")])              # no output has it
    b.call("c4", "c3", carry=[7], gen=[8], items=[message("w", "b")])
    b.output(["c1", "c3", "c4"])
    b.record["output_ids"] = ["a", None, None, "b", "a"]
    b.record["output_keys"] = b.record["output_keys"] + [b.record["output_keys"][0]]
    batch, _ = build_batch(*tables_from_pylists(*combine(first, b), logprobs=False, accepted=False))
    assert batch.item_ids.tolist() == [0, 1, -1, NO_OUTPUT, 4]  # slots: k1 | c1 c1 | c3 | c4
    assert batch.identified.tolist() == [True, True, False, False, True]
    assert batch.out_ids.tolist() == [0, 1, -1, -1, 4, 1]  # the repeated "a" points at its first slot
    assert batch.out_served.tolist() == [True, True, False, False, True, True]
