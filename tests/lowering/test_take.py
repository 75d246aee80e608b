"""take_ragged / take_rows against their plain definitions."""

from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chainrows.engine import ragged
from chainrows.engine.ragged import take_ragged, take_ragged_chunks
from chainrows.engine.streamcopy import STREAM_MIN_BYTES
from chainrows.lowering import take as take_module
from chainrows.lowering.take import take_rows
from tests.support.profiles import examples

# rows of a few values, and rows past streamcopy.STREAM_MIN_BYTES in every dtype, which
# stream_rows streams
ROW_LENGTH = st.one_of(st.integers(0, 9), st.integers(500, 700))


@pytest.fixture(autouse=True, scope="module")
def stream_rows():
    """Rows of STREAM_MIN_BYTES and more streamed, whatever the output's size (a run streams
    only into outputs of STREAM_MIN_OUTPUT_BYTES and more: these are small)."""
    saved = ragged.stream_from
    ragged.stream_from = lambda output_bytes: STREAM_MIN_BYTES
    yield
    ragged.stream_from = saved


def naive_take_ragged(offsets, content, idx):
    parts = [content[offsets[i]:offsets[i + 1]] for i in idx]
    out_off = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    return out_off, (np.concatenate(parts) if parts else content[:0])


@settings(max_examples=examples(1.5))
@given(lengths=st.lists(ROW_LENGTH, max_size=40), data=st.data(),
       dtype=st.sampled_from([np.int32, np.float32, np.uint8, np.uint64]))
def test_take_ragged_is_the_plain_gather(lengths, data, dtype):
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    content = np.arange(offsets[-1], dtype=np.int64).astype(dtype)
    idx = np.array(data.draw(st.lists(st.integers(0, max(len(lengths) - 1, 0)),
                                      max_size=60 if lengths else 0)), dtype=np.int64)
    got_off, got = take_ragged(offsets, content, idx)
    want_off, want = naive_take_ragged(offsets, content, idx)
    assert np.array_equal(got_off, want_off)
    assert got.dtype == content.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("copy_on", ["calling thread", "all threads"])
@settings(max_examples=examples(1.5))
@given(lengths=st.lists(ROW_LENGTH, min_size=1, max_size=40), data=st.data(),
       dtype=st.sampled_from([np.int32, np.float32, np.uint8]))
def test_take_ragged_chunks_is_the_plain_gather_over_the_concatenation(copy_on, lengths, data, dtype):
    # small copies run serially; the threshold at 0 sends every chunk through the parallel kernel
    with mock.patch.object(ragged, "PARALLEL_MIN_BYTES", 0 if copy_on == "all threads" else 1 << 62):
        _check_chunks_gather(lengths, data, dtype)


def _check_chunks_gather(lengths, data, dtype):
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    content = np.arange(offsets[-1], dtype=np.int64).astype(dtype)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(lengths)), max_size=4)))
    bounds = [0, *cuts, len(lengths)]
    chunk_offsets, chunk_contents = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):  # each chunk's offsets start where its rows do
        pad = data.draw(st.integers(0, 3))  # values before the chunk's first row, as in a slice
        lo, hi = offsets[a], offsets[b]
        chunk_contents.append(np.concatenate([np.full(pad, 77, dtype), content[lo:hi]]).astype(dtype))
        chunk_offsets.append(offsets[a:b + 1] - lo + pad)
    idx = np.array(data.draw(st.lists(st.integers(0, len(lengths) - 1), max_size=60)), dtype=np.int64)
    got_off, got = take_ragged_chunks(chunk_offsets, chunk_contents, idx)
    want_off, want = naive_take_ragged(offsets, content, idx)
    assert np.array_equal(got_off, want_off)
    assert got.dtype == content.dtype and np.array_equal(got, want)


@pytest.mark.parametrize("copy_on", ["calling thread", "all threads"])
def test_take_ragged_chunks_over_many_chunks_and_strided_content(copy_on):
    # a merge's row group takes rows from dozens of chunks, one kernel call for all of them;
    # a strided chunk (a view of every other value) is copied contiguous before its address is
    # taken, and chunks with no rows sit between the others
    rng = np.random.default_rng(7)
    lengths = rng.integers(0, 12, size=300)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    content = rng.standard_normal(int(offsets[-1])).astype(np.float32)
    bounds = np.unique(np.concatenate([[0, 300], rng.integers(0, 300, size=60)]))
    chunk_offsets, chunk_contents = [], []
    for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        lo, hi = offsets[a], offsets[b]
        values = content[lo:hi]
        if k % 3 == 0:
            spread = np.zeros(2 * len(values), np.float32)
            spread[::2] = values
            values = spread[::2]  # not contiguous
        chunk_offsets.append(offsets[a:b + 1] - lo)
        chunk_contents.append(values)
        if k % 7 == 0:
            chunk_offsets.append(np.zeros(1, np.int64))
            chunk_contents.append(np.zeros(0, np.float32))
    idx = rng.integers(0, 300, size=500)
    with mock.patch.object(ragged, "PARALLEL_MIN_BYTES", 0 if copy_on == "all threads" else 1 << 62):
        got_off, got = take_ragged_chunks(chunk_offsets, chunk_contents, idx)
    want_off, want = naive_take_ragged(offsets, content, idx)
    assert np.array_equal(got_off, want_off)
    assert np.array_equal(got, want)


GOOD = np.array([0, 1])


@pytest.mark.parametrize("bad", [np.array([0, 3]),              # past its own chunk's content
                                 np.array([2, 1]),              # decreasing
                                 np.array([0, 2, 1]),           # decreasing on its last step
                                 np.array([-1, 1]),             # before the content
                                 np.array([], np.int64)])       # not even the first offset
@pytest.mark.parametrize("at", [0, 1, 3])  # first, between the others, last
def test_take_ragged_chunks_checks_every_chunks_offsets(bad, at):
    # the checks run over all chunks end to end in one pass: a bad chunk anywhere is refused,
    # a chunk with no rows ([0]) beside it included, whichever row is asked for
    offsets = [GOOD, GOOD, np.array([0]), GOOD]
    offsets[at] = bad
    contents = [np.zeros(2, np.int32) for _ in offsets]
    with pytest.raises(ValueError):
        take_ragged_chunks(offsets, contents, np.array([0]))


def test_take_ragged_chunks_refuses_an_index_past_the_last_chunk():
    with pytest.raises(ValueError):
        take_ragged_chunks([np.array([0, 1]), np.array([0, 2])], [np.zeros(1, np.int32), np.zeros(2, np.int32)],
                           np.array([2]))


@pytest.mark.parametrize("offsets,idx", [([0, 2, 1], [0]), ([0, 2, 9], [1]), ([0, 2], [1]), ([0, 2], [-1])])
def test_take_ragged_refuses_what_the_kernel_cannot_check(offsets, idx):
    with pytest.raises(ValueError):
        take_ragged(np.array(offsets), np.zeros(4, np.int32), np.array(idx))


@pytest.mark.parametrize("list_type", [pa.list_(pa.int32()), pa.large_list(pa.int32()),
                                       pa.list_(pa.float32())])
def test_take_rows_equals_arrow_take(list_type):
    rng = np.random.default_rng(1)
    values = [list(rng.integers(0, 100, rng.integers(0, 6))) for _ in range(50)]
    table = pa.table({"id": pa.array([f"r{i}" for i in range(50)]),
                      "tokens": pa.array(values, list_type),
                      "maybe": pa.array([None if i % 7 == 0 else [i] for i in range(50)], pa.list_(pa.int64()))})
    chunked = pa.Table.from_batches(table.to_batches(max_chunksize=13))  # multi-chunk columns
    sliced = chunked.slice(5, 40)  # non-zero offsets into the values
    idx = rng.integers(0, 40, 70)
    want = sliced.take(pa.array(idx))
    got = take_rows(sliced, idx)
    assert got.schema == want.schema
    assert got.equals(want)
    assert got["maybe"].null_count == want["maybe"].null_count > 0  # the null lists kept


@pytest.mark.parametrize("value_type", [pa.int64(), pa.string()])
def test_null_lists_covering_values_take_the_block_copy(value_type):
    """A null list may cover values (Arrow allows it; slicing and filtering make such arrays):
    the block copy keeps them under the null and still equals pyarrow's take logically."""
    from chainrows.lowering import take

    values = pa.array([1, 2, 3, 4, 5, 6, 7]).cast(value_type)
    offsets = pa.array([0, 2, 5, 5, 7], pa.int32())
    col = pa.ListArray.from_arrays(offsets, values, mask=pa.array([False, True, False, True]))
    table = pa.Table.from_batches(pa.table({"v": pa.chunked_array([col, col.slice(1)])}).to_batches()).slice(1)
    idx = np.array([0, 3, 1, 0, 5, 4], dtype=np.int64)
    calls = []
    real = take.take_ragged_chunks
    with mock.patch.object(take, "take_ragged_chunks", lambda *a: calls.append(1) or real(*a)), \
            mock.patch.object(take, "STRING_BLOCK_MIN_ROWS", 0):  # two chunks, six rows: copy them anyway
        got = take_rows(table, idx)
    assert calls  # not pyarrow's take
    want = table.take(pa.array(idx))
    assert got.equals(want) and got.to_pylist() == want.to_pylist()
    got.validate(full=True)


STRING_LISTS = st.lists(st.lists(st.sampled_from(["", "a", "bc", "é", "c001", "x" * 30]), max_size=5), max_size=30)


@settings(max_examples=examples(1.2))
@given(rows=STRING_LISTS, data=st.data(),
       list_type=st.sampled_from([pa.list_, pa.large_list]), string_type=st.sampled_from([pa.string(), pa.large_string()]),
       chunk=st.integers(1, 9), null_string=st.booleans(), null_list=st.booleans(), blocks=st.booleans())
def test_take_rows_on_string_lists_equals_arrow_take(rows, data, list_type, string_type, chunk, null_string,
                                                     null_list, blocks):
    """list<string> columns (call_ids, output_ids) in several chunks, sliced, with empty lists
    and empty strings, null strings inside and null lists (output_ids may hold both); block
    copies whatever the chunk count, or only where they pay (else pyarrow's take)."""
    with mock.patch.object(take_module, "STRING_BLOCK_MIN_ROWS", 0 if blocks else take_module.STRING_BLOCK_MIN_ROWS):
        _check_string_list_take(rows, data, list_type, string_type, chunk, null_string, null_list)


def _check_string_list_take(rows, data, list_type, string_type, chunk, null_string, null_list):
    if null_string:
        rows = [[None if (i + j) % 3 == 0 else x for j, x in enumerate(r)] for i, r in enumerate(rows)]
    if null_list:
        rows = [None if i % 4 == 1 else r for i, r in enumerate(rows)]
    table = pa.table({"ids": pa.array(rows, list_type(string_type)), "n": pa.array(range(len(rows)))})
    table = pa.Table.from_batches(table.to_batches(max_chunksize=chunk)) if rows else table
    start = data.draw(st.integers(0, len(rows)))
    table = table.slice(start)
    idx = np.array(data.draw(st.lists(st.integers(0, max(table.num_rows - 1, 0)),
                                      max_size=40 if table.num_rows else 0)), dtype=np.int64)
    want = table.take(pa.array(idx, pa.int64()))
    got = take_rows(table, idx)
    assert got.schema == want.schema
    assert got.to_pylist() == want.to_pylist()
    got.validate(full=True)


def test_string_lists_of_a_few_rows_from_many_chunks_take_pyarrows_take():
    # a merge's row group: ~100 rows of short call_ids lists from ~44 chunks; the block copy's
    # per-chunk cost is then most of the take
    from chainrows.lowering import take

    rows = [[f"c{i}", f"c{i + 1}"] for i in range(40 * 20)]
    table = pa.Table.from_batches(pa.table({"ids": pa.array(rows, pa.list_(pa.string()))}).to_batches(max_chunksize=20))
    idx = np.arange(0, 800, 7)[::-1]
    calls = []
    real = take.take_ragged_chunks
    with mock.patch.object(take, "take_ragged_chunks", lambda *a: calls.append(1) or real(*a)):
        assert take_rows(table, idx)["ids"].to_pylist() == [rows[i] for i in idx]
        assert not calls
        below = np.arange(64 * 40 - 1) % 800  # one row short of 64 per chunk on average
        assert take_rows(table, below)["ids"].to_pylist() == [rows[i] for i in below]
        assert not calls
        enough = np.arange(64 * 40) % 800  # 64 per chunk: the block copy pays
        assert take_rows(table, enough)["ids"].to_pylist() == [rows[i] for i in enough]
        assert len(calls) == 2


def test_string_lists_take_the_block_copy_with_or_without_nulls():
    from chainrows.lowering import take

    table = pa.table({"ids": pa.array([["a", "bc"], [], ["d"]] * 5, pa.list_(pa.string()))})
    calls = []
    real = take.take_ragged_chunks
    with mock.patch.object(take, "take_ragged_chunks", lambda *a: calls.append(1) or real(*a)):
        got = take_rows(table, np.array([2, 0, 0, 1]))
        assert got["ids"].to_pylist() == [["d"], ["a", "bc"], ["a", "bc"], []]
        assert len(calls) == 2  # lengths and bytes: not pyarrow's take
        with_null = pa.table({"ids": pa.array([["a", None], None], pa.list_(pa.string()))})
        assert take_rows(with_null, np.array([1, 0, 0]))["ids"].to_pylist() == [None, ["a", None], ["a", None]]
        assert len(calls) == 5  # and the strings' validity: still not pyarrow's take
