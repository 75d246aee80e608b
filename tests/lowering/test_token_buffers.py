"""Token and logprob columns used chunk by chunk (chainrows.lowering.joins.token_buffers): the same
result whatever the chunking, and the buffers are the chunks themselves where they can be."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import chainrows
from chainrows.lowering import joins
from chainrows.lowering.columnar import build_batch
from chainrows.synth.batches import synth_tables


@pytest.fixture(scope="module")
def tables():
    ledger, tokens, rollouts = synth_tables(60, seed=5)
    rng = np.random.default_rng(3)
    tokens = tokens.take(pa.array(rng.permutation(tokens.num_rows)))  # rows in any order
    # some null logprobs lists, so lp ranges differ from token ranges somewhere
    lp = tokens["logprobs"].combine_chunks()
    null = rng.random(len(lp)) < 0.05
    lp = pa.array([None if n else v for n, v in zip(null, lp.to_pylist())], lp.type)
    tokens = tokens.set_column(tokens.column_names.index("logprobs"), "logprobs", lp)
    return ledger, tokens.combine_chunks(), rollouts


def _rechunk(table: pa.Table, rows: int) -> pa.Table:
    return pa.Table.from_batches(table.to_batches(max_chunksize=rows))


def _bytes(result):
    return [t.to_pylist() for t in result]


def _lp_rechunked(tokens: pa.Table, rows: int) -> pa.Table:
    lp = tokens["logprobs"].combine_chunks()
    chunks = [lp.slice(i, rows) for i in range(0, len(lp), rows)]
    return tokens.set_column(tokens.column_names.index("logprobs"), "logprobs", pa.chunked_array(chunks, lp.type))


@pytest.mark.slow
@pytest.mark.parametrize("min_bytes", [1, 4096, joins.MIN_BUFFER_BYTES])
@pytest.mark.parametrize("rows", [1, 7, 50])
def test_same_result_whatever_the_chunking(tables, monkeypatch, rows, min_bytes):
    ledger, tokens, rollouts = tables
    want = _bytes(chainrows.reassemble(ledger, tokens, rollouts))
    monkeypatch.setattr(joins, "MIN_BUFFER_BYTES", min_bytes)
    chunked = _rechunk(tokens, rows)
    assert _bytes(chainrows.reassemble(ledger, chunked, rollouts)) == want
    assert _bytes(chainrows.reassemble(ledger, chunked.drop_columns(["logprobs"]), rollouts)) == \
        _bytes(chainrows.reassemble(ledger, tokens.drop_columns(["logprobs"]), rollouts))
    # logprobs chunked unlike tokens: one buffer for both
    odd = _lp_rechunked(chunked, rows + 3)
    assert _bytes(chainrows.reassemble(ledger, odd, rollouts)) == want
    # more logprobs chunks than token chunks (the buffer takes every chunk of each column)
    more = _lp_rechunked(_rechunk(tokens, 3 * rows + 5), rows)
    assert more["logprobs"].num_chunks > more["tokens"].num_chunks
    assert _bytes(chainrows.reassemble(ledger, more, rollouts)) == want


def test_chunks_used_in_place_when_large(tables, monkeypatch):
    ledger, tokens, rollouts = tables
    monkeypatch.setattr(joins, "MIN_BUFFER_BYTES", 1)
    chunked = _rechunk(tokens, 40)
    batch, _ = build_batch(ledger, chunked, rollouts)
    assert len(batch.tokens) == chunked["tokens"].num_chunks > 1
    for k, chunk in enumerate(chunked["tokens"].chunks):
        off = chunk.offsets.to_numpy()
        values = chunk.values.buffers()[1]  # a slice's values are its parent's, whole
        # zero copy, and only the range this chunk's lists use
        assert batch.tokens[k].ctypes.data == values.address + 4 * (chunk.values.offset + int(off[0]))
        assert len(batch.tokens[k]) == off[-1] - off[0]
    batch.validate()


def test_buffer_groups_merge_small_chunks_only():
    def col(sizes):
        return pa.chunked_array([pa.array([[0] * n], pa.list_(pa.int32())) for n in sizes])

    big = joins.MIN_BUFFER_BYTES // 4 + 1  # int32 values: one chunk of `big` tokens is over the limit
    small = 1000
    assert joins.buffer_groups(col([big, big]), None) == [(0, 1), (1, 2)]
    assert joins.buffer_groups(col([small, small, big, small]), None) == [(0, 2), (2, 3), (3, 4)]
    assert joins.buffer_groups(col([small] * 3), None) == [(0, 3)]
    lp = pa.chunked_array([pa.array([[0.0] * big, [0.0]], pa.list_(pa.float32()))])
    assert joins.buffer_groups(col([big, 1]), lp) == [(0, 2)]  # chunked unlike tokens
    assert joins.buffer_groups(pa.chunked_array([], pa.list_(pa.int32())), None) == []


def test_validate_names_bad_buffer_indices(tables):
    ledger, tokens, rollouts = tables
    batch, _ = build_batch(ledger, tokens, rollouts)
    batch.tok_chunk[np.flatnonzero(batch.tok_start >= 0)[0]] = 1
    with pytest.raises(ValueError, match="tok_chunk"):
        batch.validate()


def test_null_entry_inside_an_id_list_is_null_not_unmatched(tables):
    ledger, tokens, rollouts = tables
    ids = ledger["item_ids"].combine_chunks()
    rows = ids.to_pylist()
    i = next(n for n, r in enumerate(rows) if r)
    rows[i] = [None] + rows[i][1:]
    ledger = ledger.set_column(ledger.column_names.index("item_ids"), "item_ids", pa.array(rows, ids.type))
    batch, _ = build_batch(ledger, tokens, rollouts)
    assert (batch.item_ids >= -2).all()
    keys = [k or [] for k in ledger["item_keys"].to_pylist()]
    # a null list, or one of the wrong length, reads as all nulls; else its null entries
    nulls = sum(len(k) if r is None or len(r) != len(k) else sum(v is None for v in r) for r, k in zip(rows, keys))
    assert (batch.item_ids == -1).sum() == nulls


def test_empty_string_arrays_without_offsets_are_accepted(tables):
    ledger, tokens, rollouts = tables
    empty = pa.StringArray.from_buffers(0, pa.py_buffer(b""), pa.py_buffer(b""))
    empty.validate(full=True)
    t0 = tokens.slice(0, 0)
    for c in ("call_id", "rollout_id"):
        t0 = t0.set_column(t0.column_names.index(c), c, pa.chunked_array([empty]))
    rows, report = chainrows.reassemble(ledger, t0, rollouts)
    assert rows.num_rows == 0 and report.num_rows == len(set(ledger["rollout_id"].to_pylist()))
