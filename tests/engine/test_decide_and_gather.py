"""decide_and_gather (checks 14-15 run inside the row copy, failed rollouts dropped in place)
against decide + gather_rows (checks first, then the copy): the same decisions, the same rows,
the same rows table and Parquet bytes."""

import io
import random

import numba
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chainrows.engine import run as engine_run
from chainrows.engine.run import decide, decide_and_gather, gather_rows
from chainrows.formats.native.schema import rows_schema, tables_from_pylists
from chainrows.lowering.columnar import build_batch
from chainrows.lowering.output import _token_lists, rows_table
from chainrows.lowering.rowgroups import RowGroupWriter
from chainrows.options import Options
from tests.support.profiles import examples
from tests.support.randomized import random_dataset

DECISION_FIELDS = ("detail", "bad_call", "bad_pos", "sel_off", "sel", "sel_len", "chain_start", "n_chains",
                   "num_selected")
ROW_FIELDS = ("row_off", "row_rollout", "segment", "num_segments", "prompt_len", "tok_off", "call_off",
              "row_calls", "loss_tokens")


def _batch(seed, n_rollouts, plan, token_chunk_rows=None):
    """A random corrupt batch; with ``token_chunk_rows``, the tokens table in chunks of that many
    rows, each its own token buffer."""
    ledger, tokens, rollouts, opts = random_dataset(seed, n_rollouts=n_rollouts)
    accepted = any("accepted_response_ids" in r for r in rollouts)
    tables = tables_from_pylists(ledger, tokens, rollouts, logprobs=opts["logprobs"], accepted=accepted)
    if token_chunk_rows:
        tables = (tables[0], pa.Table.from_batches(tables[1].to_batches(max_chunksize=token_chunk_rows),
                                                   tables[1].schema), tables[2])
    batch, labels = build_batch(*tables)
    options = Options(mode=opts["mode"], plan=plan if opts["mode"] == "cc" else "linear",
                      placeholders=opts["placeholders"])
    return batch, labels, options


def _token_rows(rows, values):
    pos, lens = rows.row_pos(), np.diff(rows.tok_off)
    return [values[p:p + n].tobytes() for p, n in zip(pos.tolist(), lens.tolist())]


def _table(rows, labels, batch, dec):
    R = batch.num_rollouts
    return rows_table(rows, labels, np.zeros(R), ~batch.has_record, np.zeros(R),  # no NaN: Table.equals
                      np.ones(len(rows.row_rollout)))


def _parquet(table):
    sink = io.BytesIO()
    with RowGroupWriter(sink, rows_schema("logprobs" in table.column_names), unit_column="input_ids") as w:
        w.write(table)
    return sink.getvalue()


def check_same(batch, labels, options):
    """decide_and_gather against decide + gather_rows; returns the fused rows."""
    want_dec = decide(batch, options)
    want = gather_rows(batch, want_dec, options)
    got_dec, got = decide_and_gather(batch, options)
    for name in DECISION_FIELDS:
        np.testing.assert_array_equal(getattr(got_dec, name), getattr(want_dec, name), err_msg=name)
    for name in ROW_FIELDS:
        np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
    assert _token_rows(got, got.input_ids) == _token_rows(want, want.input_ids)
    assert _token_rows(got, got.loss_mask) == _token_rows(want, want.loss_mask)
    assert (got.logprobs is None) == (want.logprobs is None)
    if want.logprobs is not None:
        assert _token_rows(got, got.logprobs) == _token_rows(want, want.logprobs)
    got_table, want_table = _table(got, labels, batch, got_dec), _table(want, labels, batch, want_dec)
    assert got_table.schema == want_table.schema
    assert got_table.equals(want_table)
    assert _parquet(got_table) == _parquet(want_table)
    return got


@settings(max_examples=examples(1.5), suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), plan=st.sampled_from(("linear", "forest")),
       threads=st.sampled_from((1, 2)), token_chunk_rows=st.sampled_from((None, 1, 5)))
def test_decide_and_gather_equals_decide_then_gather(seed, plan, threads, token_chunk_rows, monkeypatch_buffers):
    """Any plan, 1 or 2 threads, one token buffer or one per few token rows."""
    batch, labels, options = _batch(seed, 30, plan, token_chunk_rows)
    if token_chunk_rows:
        assert len(batch.tokens) > 1 or len(batch.tok_order) <= token_chunk_rows
    saved = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        check_same(batch, labels, options)
    finally:
        numba.set_num_threads(saved)


@pytest.fixture(scope="module")
def monkeypatch_buffers():
    """Every tokens chunk its own buffer (joins.MIN_BUFFER_BYTES: chunks smaller are joined)."""
    from chainrows.lowering import joins

    saved = joins.MIN_BUFFER_BYTES
    joins.MIN_BUFFER_BYTES = 1
    yield
    joins.MIN_BUFFER_BYTES = saved


@pytest.mark.slow
def test_rollouts_failing_in_the_copy_are_dropped_in_place():
    """Seeds whose data checks fail on rollouts that passed 11-13: the rows left keep their place
    (gaps in the buffers, list columns in several chunks), with and without placeholders."""
    seen = {True: 0, False: 0}
    for seed in range(400):
        batch, labels, options = _batch(seed, 30, random.Random(seed).choice(("linear", "forest")))
        rows = check_same(batch, labels, options)
        if rows.tok_pos is not None:
            seen[options.placeholders] += 1
            assert not np.array_equal(rows.tok_pos, rows.tok_off[:-1])  # else tok_pos is None
            chunks = _table(rows, labels, batch, None).column("input_ids").num_chunks
            assert chunks > 1 or rows.tok_pos[0] > 0  # a gap between rows, or before the first
    assert seen[True] >= 3 and seen[False] >= 3, seen


@pytest.mark.slow
def test_past_the_gap_limit_the_rows_are_gathered_again(monkeypatch):
    monkeypatch.setattr(engine_run, "MIN_GAPS", 0)
    regathered = 0
    for seed in range(200):
        batch, labels, options = _batch(seed, 30, "linear")
        rows = check_same(batch, labels, options)
        assert rows.tok_pos is None
        dec = decide(batch, options)
        regathered += int(np.any(dec.detail >= 34))  # hash, logprob or integrity reasons
    assert regathered >= 3


def test_a_placeholder_overwrites_the_first_token_of_a_dropped_rollout():
    """drop_rollouts alone, on rows built by hand: rollout 1 of three is dropped."""
    from chainrows.engine.run import RowArrays, drop_rollouts

    ids = np.arange(1, 10, dtype=np.int32)  # rollout 0: rows [1,2] [3]; 1: [4,5,6]; 2: [7,8,9]
    rows = RowArrays(row_off=np.array([0, 2, 3, 4]), row_rollout=np.array([0, 0, 1, 2]),
                     segment=np.array([0, 1, 0, 0], np.int32), num_segments=np.array([2, 2, 1, 1], np.int32),
                     prompt_len=np.array([1, 1, 2, 1], np.int32), tok_off=np.array([0, 2, 3, 6, 9]),
                     input_ids=ids.copy(), loss_mask=np.ones(9, np.uint8), logprobs=np.full(9, -1.0, np.float32),
                     call_off=np.array([0, 1, 2, 4, 5]), row_calls=np.array([0, 1, 2, 3, 4]),
                     loss_tokens=np.array([2, 3, 2]))
    lost = np.array([False, True, False])
    kept = drop_rollouts(rows, lost, placeholders=False)
    assert kept.row_rollout.tolist() == [0, 0, 2] and kept.tok_pos.tolist() == [0, 2, 6]
    assert kept.tok_off.tolist() == [0, 2, 3, 6] and kept.row_calls.tolist() == [0, 1, 4]
    assert kept.loss_tokens.tolist() == [2, 0, 2] and kept.row_off.tolist() == [0, 2, 2, 3]
    assert kept.input_ids.tolist() == ids.tolist()  # no token moved
    ph = drop_rollouts(rows, lost, placeholders=True)
    assert ph.row_rollout.tolist() == [0, 0, 1, 2] and ph.tok_pos.tolist() == [0, 2, 3, 6]
    assert ph.tok_off.tolist() == [0, 2, 3, 4, 7] and ph.call_off.tolist() == [0, 1, 2, 2, 3]
    assert ph.segment.tolist() == [0, 1, 0, 0] and ph.prompt_len.tolist() == [1, 1, 0, 1]
    assert ph.num_segments.tolist() == [2, 2, 1, 1]
    assert (rows.input_ids[3], rows.loss_mask[3], rows.logprobs[3]) == (0, 0, 0.0)
    column = _token_lists(ph, ph.input_ids, pa.int32())  # runs of rows back to back: one chunk each
    assert column.num_chunks == 2 and column.to_pylist() == [[1, 2], [3], [0], [7, 8, 9]]
    # every chunk a slice of one array over the whole buffer: Arrow counts what the column keeps alive
    assert {c.values.buffers()[1].address for c in column.chunks} == {ph.input_ids.ctypes.data}
    assert column.chunk(0).values.buffers()[1].size == ph.input_ids.nbytes
    assert pa.table({"x": column}).get_total_buffer_size() >= ph.input_ids.nbytes


@pytest.mark.parametrize("placeholders", [False, True])
def test_every_rollout_dropped(placeholders):
    from chainrows.engine.run import RowArrays, drop_rollouts

    rows = RowArrays(row_off=np.array([0, 1]), row_rollout=np.array([0]), segment=np.zeros(1, np.int32),
                     num_segments=np.ones(1, np.int32), prompt_len=np.ones(1, np.int32),
                     tok_off=np.array([0, 3]), input_ids=np.array([5, 6, 7], np.int32),
                     loss_mask=np.ones(3, np.uint8), logprobs=None, call_off=np.array([0, 1]),
                     row_calls=np.array([0]), loss_tokens=np.array([2]))
    out = drop_rollouts(rows, np.array([True]), placeholders)
    assert len(out.row_rollout) == int(placeholders) and out.tok_off[-1] == int(placeholders)
    assert _token_lists(out, out.input_ids, pa.int32()).to_pylist() == ([[0]] if placeholders else [])


def test_write_parquet_bytes_do_not_depend_on_chunks(tmp_path):
    """outdir.parquet.write_parquet (AtomicOutput.write_table) on an API rows table with gaps: the
    bytes of the same rows in one chunk. pyarrow alone cuts data pages at chunk boundaries once
    a column chunk holds more than write_batch_size values, hence the larger synthetic batch."""
    import chainrows
    from chainrows.outdir import atomic as write
    from chainrows.synth.batches import synth_tables

    rows = chainrows.reassemble(*synth_tables(600, seed=1, corrupt_rate=0.2)).rows
    assert rows.column("input_ids").num_chunks > 1
    a = write.write_parquet(tmp_path / "a.parquet", rows)
    b = write.write_parquet(tmp_path / "b.parquet", rows.combine_chunks())
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.slow
def test_the_run_warm_up_loads_the_regather_kernels():
    """bulk.plan.measure_footprint loads every kernel before the run measures its baseline,
    including the plain copies decide_and_gather falls back to past its gap limit."""
    import subprocess
    import sys

    code = (
        "from chainrows.runners.bulk.plan import measure_footprint\n"
        "from chainrows.engine import gather, verify\n"
        "from chainrows.options import Options\n"
        "measure_footprint(Options(), True)\n"
        "print(len(gather.copy_deltas.signatures), len(gather.copy_hash_deltas.signatures),\n"
        "      len(gather.copy_check_logprobs.signatures), len(verify.data_checks.signatures))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    copy, copy_hash, copy_lp, checks = map(int, out.split())
    assert copy == 2 and copy_hash == 1 and copy_lp == 1 and checks == 1, out


@settings(max_examples=examples(2))
@given(st.data())
def test_copy_order_matches_its_definition(data):
    """The counting sort that orders the copies by buffer: stable, with each buffer's bounds
    and the running copy cost, as its plain-Python definition has them."""
    from chainrows.engine.gather import copy_order, copy_order_py

    draw = data.draw
    n_buffers = draw(st.integers(1, 4))
    C = draw(st.integers(1, 8))
    tok_chunk = np.array(draw(st.lists(st.integers(0, n_buffers - 1), min_size=C, max_size=C)), dtype=np.int64)
    delta_len = np.array(draw(st.lists(st.integers(0, 50), min_size=C, max_size=C)), dtype=np.int64)
    row_calls = np.array(draw(st.lists(st.integers(0, C - 1), max_size=12)), dtype=np.int64)  # a call may repeat
    entries = np.empty(len(row_calls), dtype=np.int64)
    weight_off = np.empty(len(row_calls) + 1, dtype=np.int64)
    bounds = np.zeros(n_buffers + 1, dtype=np.int64)
    copy_order(row_calls, tok_chunk, delta_len, entries, weight_off, bounds)
    want = copy_order_py(row_calls, tok_chunk, delta_len, n_buffers)
    assert (entries.tolist(), weight_off.tolist(), bounds.tolist()) == want
