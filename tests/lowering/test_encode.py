"""Rollout ids as dense codes in byte order (chainrows.lowering.joins._encode_sorted) against the plain
definition."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from chainrows.lowering.joins import _encode_sorted
from tests.support.profiles import examples

IDS = st.one_of(st.none(), st.sampled_from(["", "a", "b", "ab", "B", "é", "a\x00", "\U0001F642", "x" * 30]))
CHUNK = st.tuples(st.lists(IDS, max_size=6), st.sampled_from([pa.string(), pa.large_string()]))
# a column: an Array, or a ChunkedArray of zero or more chunks of one type
COLUMN = st.tuples(st.lists(CHUNK, max_size=3), st.booleans())


def _column(chunks, chunked):
    kind = chunks[0][1] if chunks else pa.string()
    arrays = [pa.array(values, kind) for values, _ in chunks]
    if chunked or not arrays:
        return pa.chunked_array(arrays, kind)
    return pa.concat_arrays(arrays)


def encode_sorted_py(columns: list[list]) -> tuple[list[str], list[list[int]]]:
    """Plain definition: the distinct non-null strings sorted by their UTF-8 bytes; each value's
    code its index there, -1 for a null."""
    distinct = sorted({v for col in columns for v in col if v is not None}, key=lambda v: v.encode())
    code = {v: i for i, v in enumerate(distinct)}
    return distinct, [[-1 if v is None else code[v] for v in col] for col in columns]


@settings(max_examples=examples(2))
@given(columns=st.lists(COLUMN, min_size=1, max_size=3))
def test_codes_in_byte_order_match_the_definition(columns):
    arrays = [_column(chunks, chunked) for chunks, chunked in columns]
    distinct, codes = _encode_sorted(arrays)
    want_distinct, want_codes = encode_sorted_py([a.to_pylist() for a in arrays])
    assert distinct.type == pa.string() and distinct.to_pylist() == want_distinct
    assert [c.dtype for c in codes] == [np.dtype(np.int64)] * len(arrays)
    assert [c.tolist() for c in codes] == want_codes


def test_ids_shared_by_some_tables_with_nulls_across_chunks():
    """The worked shape of the rollout join: the ledger's ids and the other tables' share some
    ids and not others, nulls in both, columns of several chunks (codes cross chunk bounds)."""
    ledger = pa.chunked_array([["r3", "r1", None], ["r2", "r3"]])
    tokens = pa.chunked_array([["r1", "r4"], [None, "r0"]])
    rollouts = pa.chunked_array([["r9", "r2"]])
    distinct, (led, tok, ro) = _encode_sorted([ledger, tokens, rollouts])
    assert distinct.to_pylist() == ["r0", "r1", "r2", "r3", "r4", "r9"]
    assert led.tolist() == [3, 1, -1, 2, 3]
    assert tok.tolist() == [1, 4, -1, 0]
    assert ro.tolist() == [5, 2]
