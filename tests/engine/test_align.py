"""The id/key slot alignment kernel (chainrows.engine.align) against its plain-Python definition."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chainrows.engine.align import aligned_positions, aligned_positions_py
from tests.support.profiles import examples


@st.composite
def columns(draw):
    """Key slots per owner, and id-list rows naming owners (some twice, some never), each a
    null list, a list of the right length or one of another length, laid out in any order."""
    key_lens = draw(st.lists(st.integers(0, 4), min_size=1, max_size=12))
    dest_off = np.concatenate(([0], np.cumsum(key_lens))).astype(np.int64)
    owners = draw(st.lists(st.integers(0, len(key_lens) - 1), max_size=15))
    starts, stops, at = [], [], 0
    for o in owners:
        kind = draw(st.sampled_from(["null", "right", "right", "wrong"]))
        if kind == "null":
            starts.append(-1)
            stops.append(-1)
            continue
        n = key_lens[o] if kind == "right" else key_lens[o] + draw(st.sampled_from([-1, 1, 2]))
        n = max(n, 0)
        at += draw(st.integers(0, 3))  # gaps: the rows need not tile the values
        starts.append(at)
        stops.append(at + n)
        at += n
    return starts, stops, dest_off, owners


@settings(max_examples=examples(3))
@given(columns())
def test_aligned_positions_are_their_plain_definition(col):
    starts, stops, dest_off, owners = col
    out, bad = aligned_positions(np.array(starts, dtype=np.int64), np.array(stops, dtype=np.int64),
                                 dest_off, np.array(owners, dtype=np.int64))
    want_out, want_bad = aligned_positions_py(starts, stops, dest_off.tolist(), owners)
    assert out.tolist() == want_out and bad.tolist() == want_bad


def test_a_wrong_length_or_null_list_leaves_its_slots_null():
    dest_off = np.array([0, 2, 5, 5])
    out, bad = aligned_positions(np.array([10, -1, 20]), np.array([12, -1, 21]), dest_off, np.array([0, 1, 2]))
    assert out.tolist() == [10, 11, -1, -1, -1] and bad.tolist() == [False, False, True]


def test_owners_and_offsets_are_checked_before_the_kernel():
    one = np.array([0])
    with pytest.raises(ValueError, match="owner outside"):
        aligned_positions(one, one, np.array([0, 1]), np.array([1]))
    with pytest.raises(ValueError, match="owner outside"):
        aligned_positions(one, one, np.array([0, 1]), np.array([-1]))
    with pytest.raises(ValueError, match="out of order"):
        aligned_positions(one, one, np.array([0, 3, 2]), np.array([0]))
    with pytest.raises(ValueError, match="differ in length"):
        aligned_positions(one, np.array([0, 1]), np.array([0, 1]), np.array([0]))
