"""The UTF-8 check's quick way (sound offsets over ASCII bytes) answers as Arrow's full
validation does, on strings, large strings and lists of them, sliced or not, with bytes that
are ASCII, other UTF-8 or not UTF-8, and with offsets that fall or leave their bytes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chainrows.formats.native import dataset as dsmod
from tests.support.profiles import examples

PIECES = [b"a", b"call-7", b"", b"\xc3\xa9", b"\xe2\x82\xac", b"\xff", b"\xc3", b"\x80", b"\xed\xa0\x80"]


def _full(arr: pa.Array) -> bool:
    try:
        arr.validate(full=True)
    except (pa.ArrowInvalid, pa.ArrowIndexError):
        return False
    return True


def _validity(draw, n: int, lie: bool) -> tuple[pa.Buffer | None, int]:
    """A validity bitmap for ``n`` slots (None when none is null) and its null count; with
    ``lie``, a null count the bitmap disagrees with where there is a bitmap (without one, Arrow's
    quick validation refuses any but 0)."""
    valid = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    mask = None if all(valid) else pa.py_buffer(np.packbits(np.array(valid, bool), bitorder="little").tobytes())
    null_count = n - sum(valid)
    if lie and mask is not None:
        null_count = draw(st.sampled_from((0, min(null_count + 1, n), max(null_count - 1, 0))))
    return mask, null_count


def _strings(draw, n: int, large: bool) -> pa.Array:
    """``n`` strings (some null) built from buffers, so the bytes need not be UTF-8 and, now
    and then, the middle offsets fall or one leaves the bytes, the null count disagrees with the
    bitmap, or an empty array's lone offset is not 0."""
    values = [b"".join(draw(st.lists(st.sampled_from(PIECES), max_size=4))) for _ in range(n)]
    dtype = np.int64 if large else np.int32
    off = np.zeros(n + 1, dtype=dtype)
    np.cumsum([len(v) for v in values], out=off[1:])
    data = b"".join(values)
    fault = draw(st.sampled_from(["none"] * 6 + ["fall", "outside", "null_count", "lone_offset"]))
    if fault == "fall" and n >= 3:
        off[1:n] = off[1:n][::-1].copy()
    elif fault == "outside" and n >= 2:
        off[n // 2] = len(data) + 5  # Arrow's quick validation checks only the end offsets
    elif fault == "lone_offset" and n == 0:
        off[0] = draw(st.sampled_from((-3, 2)))
    mask, null_count = _validity(draw, n, lie=fault == "null_count")
    t = pa.large_string() if large else pa.string()
    return pa.Array.from_buffers(t, n, [mask, pa.py_buffer(off.tobytes()), pa.py_buffer(data)],
                                 null_count=null_count)


def _list_over(draw, values: pa.Array) -> pa.Array:
    """A list or large list over ``values``, built from buffers: now and then a middle offset
    past the values or falling, a null list, a null count the bitmap disagrees with."""
    n = draw(st.integers(1, 5))
    cuts = sorted(draw(st.lists(st.integers(0, len(values)), min_size=n + 1, max_size=n + 1)))
    cuts[0] = 0
    large = draw(st.booleans())
    off = np.array(cuts, dtype=np.int64 if large else np.int32)
    fault = draw(st.sampled_from(["none"] * 5 + ["outside", "fall", "null_count"]))
    if fault == "outside" and n >= 2:
        off[1] = len(values) + 2
    elif fault == "fall" and n >= 3:
        off[1:n] = off[1:n][::-1].copy()
    mask, null_count = _validity(draw, n, lie=fault == "null_count")
    t = (pa.large_list if large else pa.list_)(values.type)
    return pa.Array.from_buffers(t, n, [mask, pa.py_buffer(off.tobytes())], null_count=null_count,
                                 children=[values])


@st.composite
def string_arrays(draw):
    n = draw(st.integers(0, 12))
    arr = _strings(draw, n, large=draw(st.booleans()))
    if draw(st.booleans()):  # a list over the strings, sometimes a list of lists
        arr = _list_over(draw, arr)
        if draw(st.booleans()):
            arr = _list_over(draw, arr)
    if draw(st.booleans()) and len(arr):
        start = draw(st.integers(0, len(arr) - 1))
        arr = arr.slice(start, draw(st.integers(0, len(arr) - start)))
    return arr


@settings(max_examples=examples(4))
@given(string_arrays())
def test_quick_utf8_check_answers_as_full_validation(arr):
    try:
        arr.validate()  # normalize runs the quick validation before any UTF-8 check
    except (pa.ArrowInvalid, pa.ArrowIndexError):
        return
    assert dsmod._valid_utf8(arr) == _full(arr)


def test_quick_way_is_taken_for_ascii_and_only_for_it():
    """ASCII strings pass without Arrow's full validation; other UTF-8 goes on to it."""
    ascii_ids = pa.array(["call-1", "r-2", None])
    ascii_lists = pa.array([["a", "b"], None, []], pa.list_(pa.string()))
    assert dsmod._ascii_strings(ascii_ids) and dsmod._ascii_strings(ascii_lists)
    assert dsmod._ascii_strings(pa.array(["caf\u00e9", "x"]).slice(1))  # the slice's bytes only
    accented = pa.array(["call-1", "caf\u00e9"])
    assert not dsmod._ascii_strings(accented) and dsmod._valid_utf8(accented)
    assert not dsmod._ascii_strings(pa.array([["x"], ["\u20ac"]]).slice(0, 1))  # a list's values whole


@pytest.mark.parametrize("large", [False, True])
def test_first_invalid_finds_the_string_among_ascii_ones(large):
    """The bisection that names the row runs the quick way on every half: an ASCII half passes,
    the half with the bad string does not."""
    vals = [b"id-%d" % i for i in range(37)]
    vals[23] = b"id-\xff"
    b = pa.array(vals, pa.large_binary() if large else pa.binary())
    arr = pa.Array.from_buffers(pa.large_string() if large else pa.string(), len(b), b.buffers())
    assert not dsmod._valid_utf8(arr)
    assert dsmod._first_invalid(arr) == 23


def test_an_empty_chunk_arrow_refuses_is_an_input_error_not_a_crash():
    """An empty string chunk whose lone offset is negative passes Arrow's quick validation and
    fails its full one; with no row to name, the error names the column (it was an IndexError)."""
    from chainrows.errors import InputError

    good = pa.array(["r1", "r2"])
    empty = pa.Array.from_buffers(pa.string(), 0, [None, pa.py_buffer(np.array([-3], np.int32).tobytes()),
                                                   pa.py_buffer(b"")])
    table = pa.table({"rollout_id": pa.chunked_array([good, empty])})
    with pytest.raises(InputError, match="'rollout_id' has an empty chunk that is not a valid array"):
        dsmod.validate_utf8("rollouts", None, table)


def test_quick_way_refuses_what_full_validation_refuses_beyond_the_bytes():
    """ASCII bytes are not enough: a null count the bitmap disagrees with (strings, lists) and an
    empty array's negative lone offset go to Arrow, which refuses them."""
    two_nulls = pa.array(["a", None, "b", None])
    liar = pa.Array.from_buffers(pa.string(), 4, two_nulls.buffers(), null_count=1)
    lists = pa.array([["a"], None, None], pa.list_(pa.string()))
    list_liar = pa.Array.from_buffers(lists.type, 3, lists.buffers()[:2], null_count=1, children=[lists.values])
    empty = pa.Array.from_buffers(pa.string(), 0, [None, pa.py_buffer(np.array([-3], np.int32).tobytes()),
                                                   pa.py_buffer(b"")])
    for arr in (liar, list_liar, empty):
        arr.validate()
        assert not dsmod._ascii_strings(arr)
        assert dsmod._valid_utf8(arr) is False and _full(arr) is False
    assert dsmod._ascii_strings(two_nulls) and dsmod._ascii_strings(lists)
    views = pa.array(["a", "b"], pa.string_view())  # another string type: Arrow decides
    assert not dsmod._ascii_strings(views) and dsmod._valid_utf8(views)
