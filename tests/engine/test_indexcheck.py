"""The index-check kernels of Batch.validate against their plain-Python definitions, on random
arrays within each kernel's contract, good and bad alike."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from chainrows.engine import validate as ic
from tests.support.profiles import examples

SENTINELS = (-1, -2)


def _offsets(draw, owners: int, max_each: int) -> np.ndarray:
    off = np.zeros(owners + 1, dtype=np.int64)
    np.cumsum(draw(st.lists(st.integers(0, max_each), min_size=owners, max_size=owners)), out=off[1:])
    return off


@settings(max_examples=examples(3))
@given(st.data())
def test_first_outside_owner_matches_its_definition(data):
    draw = data.draw
    R = draw(st.integers(0, 6))
    call_off = _offsets(draw, R, 4)
    idx_off = _offsets(draw, R, 3)
    C = int(call_off[-1])
    n = int(idx_off[-1])
    owner = np.repeat(np.arange(R), np.diff(idx_off))
    # mostly calls of the owner's rollout, now and then anything
    idx = np.array([draw(st.one_of(
        st.integers(int(call_off[r]), max(int(call_off[r]), int(call_off[r + 1]) - 1)),
        st.sampled_from((-3, -2, -1, 0, C, C + 5)))) for r in owner], dtype=np.int64).reshape(n)
    allow = np.array(draw(st.sampled_from([(), (-2,), (-1, -2)])), dtype=np.int64)
    assert ic.first_outside_owner(idx, idx_off, call_off, allow) == ic.first_outside_owner_py(idx, idx_off, call_off, allow)


@settings(max_examples=examples(3))
@given(st.data())
def test_first_bad_range_matches_its_definition(data):
    draw = data.draw
    sizes = np.array(draw(st.lists(st.integers(0, 9), min_size=1, max_size=3)), dtype=np.int64)
    C = draw(st.integers(0, 8))
    chunk = np.array(draw(st.lists(st.integers(0, len(sizes) - 1), min_size=C, max_size=C)), dtype=np.int64)
    start = np.array(draw(st.lists(st.integers(-3, 11), min_size=C, max_size=C)), dtype=np.int64)
    stop = start + np.array(draw(st.lists(st.integers(-2, 5), min_size=C, max_size=C)), dtype=np.int64)
    assert ic.first_bad_range(start, stop, chunk, sizes, -1) == ic.first_bad_range_py(start, stop, chunk, sizes, -1)


@settings(max_examples=examples(3))
@given(st.data())
def test_order_problem_matches_its_definition(data):
    draw = data.draw
    C = draw(st.integers(0, 8))
    tok_start = np.array(draw(st.lists(st.sampled_from((-1, 0, 3)), min_size=C, max_size=C)), dtype=np.int64)
    tok_chunk = np.array(draw(st.lists(st.integers(0, 2), min_size=C, max_size=C)), dtype=np.int64)
    with_row = np.flatnonzero(tok_start != -1)
    good = with_row[np.argsort(tok_chunk[with_row], kind="stable")]
    edit = draw(st.sampled_from(["none", "drop", "repeat", "swap", "outside", "extra", "shuffle"]))
    order = list(good)
    if edit == "drop" and order:
        order.pop(draw(st.integers(0, len(order) - 1)))
    elif edit == "repeat" and order:
        order.insert(draw(st.integers(0, len(order))), order[0])
    elif edit == "swap" and len(order) >= 2:
        order[0], order[-1] = order[-1], order[0]
    elif edit == "outside":
        order.insert(draw(st.integers(0, len(order))), draw(st.sampled_from((-1, C, C + 9))))
    elif edit == "extra" and C:  # a call without a token row listed too: allowed once
        order.append(draw(st.integers(0, C - 1)))
    elif edit == "shuffle":
        order = draw(st.permutations(order))
    order = np.array(order, dtype=np.int64)
    assert ic.order_problem(order, tok_start, tok_chunk, -1) == ic.order_problem_py(order, tok_start, tok_chunk, -1)


@settings(max_examples=examples(2))
@given(st.data())
def test_lengths_match_matches_its_definition(data):
    draw = data.draw
    C = draw(st.integers(1, 6))
    key_off = _offsets(draw, C, 3)
    call = np.array(draw(st.lists(st.integers(0, C - 1), max_size=8)), dtype=np.int64)
    length = key_off[call + 1] - key_off[call]
    if len(call) and draw(st.booleans()):
        length[draw(st.integers(0, len(call) - 1))] += draw(st.sampled_from((-1, 1)))
    assert ic.lengths_match(length, call, key_off) == ic.lengths_match_py(length, call, key_off)


def test_each_order_problem_is_reported():
    """The hand-made case of each answer, so a kernel that always says OK cannot pass."""
    tok_start = np.array([0, -1, 4], dtype=np.int64)
    tok_chunk = np.array([0, 0, 1], dtype=np.int64)
    cases = {ic.ORDER_OK: [0, 2], ic.ORDER_OUTSIDE: [0, 3], ic.ORDER_NOT_BY_BUFFER: [2, 0],
             ic.ORDER_NOT_ONCE: [0, 0, 2]}
    for want, order in cases.items():
        assert ic.order_problem(np.array(order, dtype=np.int64), tok_start, tok_chunk, -1) == want
    assert ic.order_problem(np.array([2], dtype=np.int64), tok_start, tok_chunk, -1) == ic.ORDER_NOT_ONCE
