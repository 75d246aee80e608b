"""chainrows.engine.tokrows: each call's token row, against its plain-Python definition."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chainrows.engine.batch import NO_TOKENS
from chainrows.engine.tokrows import token_rows, token_rows_py
from tests.support.profiles import examples


def _as_lists(rows) -> dict:
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in dataclasses.asdict(rows).items()}


@st.composite
def cases(draw):
    n_calls = draw(st.integers(0, 8))
    calls = st.integers(-3, n_calls - 1) if n_calls else st.integers(-3, -1)
    of_token = draw(st.lists(calls, max_size=20))
    T = len(of_token)
    per_row = [draw(st.lists(st.integers(-1, 50), min_size=T, max_size=T)) for _ in range(5)]
    return n_calls, of_token, per_row, draw(st.booleans())


@settings(max_examples=examples(3))
@given(cases())
def test_kernel_matches_definition(case):
    n_calls, of_token, (chunk, start, stop, lp_start, lp_stop), has_lp = case
    lp = (lp_start, lp_stop) if has_lp else (None, None)
    got = token_rows(np.array(of_token, dtype=np.int64), n_calls, *map(np.array, (chunk, start, stop)),
                     *(None if a is None else np.array(a) for a in lp))
    assert _as_lists(got) == token_rows_py(of_token, n_calls, chunk, start, stop, *lp)


def test_duplicates_keep_the_last_row_and_orphans_are_counted():
    # call 1 named by rows 0 and 3 (row 3 kept), call 0 by row 2, call 2 by none, row 1 by no call
    got = token_rows(np.array([1, -5, 0, 1]), 3, np.array([0, 0, 1, 1]), np.array([0, 5, 0, 7]),
                     np.array([5, 9, 4, 8]))
    assert got.duplicated.tolist() == [False, True, False]
    assert got.chunk.tolist() == [1, 1, 0]
    assert got.start.tolist() == [0, 7, NO_TOKENS] and got.stop.tolist() == [4, 8, NO_TOKENS]
    assert got.lp_start.tolist() == [NO_TOKENS] * 3 and got.lp_stop.tolist() == [NO_TOKENS] * 3
    assert got.order.tolist() == [0, 1]  # in the order of the kept rows: 2, then 3
    assert got.orphan_rows == 1


def test_rows_naming_a_call_past_the_calls_are_refused_before_the_kernel():
    with pytest.raises(AssertionError, match="name no call"):
        token_rows(np.array([0, 3]), 3, np.zeros(2, np.int64), np.zeros(2, np.int64), np.zeros(2, np.int64))
    with pytest.raises(AssertionError, match="disagree"):
        token_rows(np.array([0, 1]), 3, np.zeros(1, np.int64), np.zeros(2, np.int64), np.zeros(2, np.int64))
