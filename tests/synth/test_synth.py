"""chainrows.synth: deterministic, batch-independent, schema-exact, realistic, and every
corruption kind triggers the SPEC §3 reason it is named after."""

from __future__ import annotations

import os
import random
from collections import Counter, defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash

from chainrows import synth
from chainrows.formats.items import fingerprint
from chainrows.formats.native.schema import (
    ACCEPTED_FIELD,
    LEDGER_SCHEMA,
    LOGPROBS_FIELD,
    ROLLOUTS_SCHEMA,
    TOKENS_SCHEMA,
)
from chainrows.reasons import REASONS
from chainrows.synth import CORRUPT_KINDS, CORRUPT_TARGETS, iter_synth_batches, synth_tables, write_synth_dataset


def _concat(parts):
    return tuple(pa.concat_tables([p[k] for p in parts]) for k in range(3))


def _bits(table: pa.Table) -> pa.Table:
    """Floats viewed as integers, so that NaN (corrupt rewards and logprobs) compares equal."""
    table = table.combine_chunks()
    cols = []
    for col in table.columns:
        arr = col.combine_chunks()
        if pa.types.is_float64(arr.type):
            arr = arr.view(pa.int64())
        elif pa.types.is_list(arr.type) and pa.types.is_float32(arr.type.value_type):
            arr = pa.ListArray.from_arrays(arr.offsets, arr.values.view(pa.int32()), mask=arr.is_null())
        cols.append(arr)
    return pa.Table.from_arrays(cols, names=table.column_names)


def _assert_tables_equal(a, b):
    for x, y in zip(a, b):
        assert x.schema == y.schema
        assert _bits(x).equals(_bits(y))


def _by_rollout(table):
    out = defaultdict(list)
    for row in table.to_pylist():
        out[row["rollout_id"]].append(row)
    return out


def _reassemble(tables, mode):
    reference = pytest.importorskip("chainrows.reference")
    ledger, tokens, rollouts = tables
    _, report = reference.reassemble(ledger.to_pylist(), tokens.to_pylist(), rollouts.to_pylist(), mode=mode)
    return report


# ---------------------------------------------------------------------------------------------
# Determinism and batching


def test_deterministic_for_a_seed():
    a = synth_tables(48, seed=7)
    b = synth_tables(48, seed=7)
    _assert_tables_equal(a, b)
    c = synth_tables(48, seed=8)
    assert not a[1].equals(c[1])


@pytest.mark.parametrize("batch", [1, 16, 20, 48, 1000])
def test_independent_of_batch_size(batch):
    whole = synth_tables(70, seed=3, corrupt_rate=0.3)
    parts = list(iter_synth_batches(70, 3, batch_rollouts=batch, corrupt_rate=0.3))
    step = max(synth.BLOCK, -(-batch // synth.BLOCK) * synth.BLOCK)
    assert len(parts) == -(-70 // step)
    _assert_tables_equal(_concat(parts), whole)


def test_batches_hold_whole_rollouts():
    for ledger, tokens, rollouts in iter_synth_batches(50, 1, batch_rollouts=16, corrupt_rate=0):
        ids = set(rollouts["rollout_id"].to_pylist())
        assert set(ledger["rollout_id"].to_pylist()) == ids
        assert set(tokens["rollout_id"].to_pylist()) == ids


def test_rollouts_do_not_depend_on_n():
    small = synth_tables(2 * synth.BLOCK, seed=5)
    big = synth_tables(5 * synth.BLOCK, seed=5)
    for s, b in zip(small, big):
        assert b.slice(0, s.num_rows).equals(s)


# ---------------------------------------------------------------------------------------------
# Schemas and argument checks


def test_schemas():
    ledger, tokens, rollouts = synth_tables(20, seed=0)
    assert ledger.schema == LEDGER_SCHEMA
    assert tokens.schema == TOKENS_SCHEMA.append(LOGPROBS_FIELD)
    assert rollouts.schema == ROLLOUTS_SCHEMA.append(ACCEPTED_FIELD)
    _, tokens, _ = synth_tables(20, seed=0, logprobs=False)
    assert tokens.schema == TOKENS_SCHEMA
    empty = synth_tables(0)
    assert [t.num_rows for t in empty] == [0, 0, 0]
    assert empty[0].schema == LEDGER_SCHEMA


def test_argument_checks():
    with pytest.raises(ValueError):
        synth_tables(4, logprobs=False, corrupt_kinds=("logprob_invalid",))
    with pytest.raises(ValueError):
        synth_tables(4, corrupt_kinds=("no_such_kind",))
    with pytest.raises(ValueError):
        synth_tables(4, corrupt_rate=1.5)
    with pytest.raises(TypeError):
        list(iter_synth_batches(4, 0, no_such_option=1))


def test_corrupt_kinds_cover_every_reason():
    assert set(CORRUPT_KINDS) == {r for r in REASONS if r}
    assert set(CORRUPT_TARGETS) == set(CORRUPT_KINDS)


# ---------------------------------------------------------------------------------------------
# Content


def test_fast_fingerprints_match_fingerprint():
    r = random.Random(11)
    for _ in range(200):
        text = synth._text(r, 1 + r.getrandbits(3))
        item_id = r.choice([None, "x_" + synth.hex_id(r)])
        assert synth._key(synth._reasoning_canonical(text)) == fingerprint(synth._item_dict("reasoning", item_id, text))
        assert synth._key(synth._message_canonical(text)) == fingerprint(synth._item_dict("message", item_id, text))
        name, arg = synth._TOOLS[r.randrange(len(synth._TOOLS))]
        arguments = '{"' + arg + '":"' + text + '"}'
        call_id = "call_" + synth.hex_id(r, 12)
        assert synth._key(synth._function_call_canonical(call_id, name, arguments)) == fingerprint(
            synth._item_dict("function_call", item_id, call_id, name, arguments)
        )


def _selected(calls, keys):
    """The calls whose items make up ``keys``, greedily in capture order (clean synth data has
    unique items); asserts the whole output is covered."""
    p, selected = 0, []
    for c in calls:
        n = len(c["item_keys"])
        if keys[p : p + n] == c["item_keys"]:
            selected.append(c)
            p += n
    assert p == len(keys)
    return selected


def _shape(selected) -> str:
    """'linear' (each selected non-root continues the selected call just before it), 'fork'
    (some selected call is the parent of two selected calls) or 'workers' (several roots and
    interleaved chains), from the ledger alone."""
    if all(c["parent_id"] is None or c["parent_id"] == p["call_id"] for p, c in zip(selected, selected[1:])):
        return "linear"
    parents = Counter(c["parent_id"] for c in selected if c["parent_id"] is not None)
    return "fork" if max(parents.values()) >= 2 else "workers"


FOREST_RATES = {"worker_rate": 0.35, "fork_rate": 0.35}


@pytest.mark.parametrize("rates", [{}, FOREST_RATES], ids=["linear", "forest"])
def test_clean_rollouts_are_consistent(rates):
    """Recompute hashes and lengths of every call of clean rollouts; the output is the items of
    the accepted calls in capture order: one chain-linked selection (linear harnesses) or a
    forest whose every selected non-root continues a call selected before it."""
    ledger, tokens, rollouts = synth_tables(120, seed=2, corrupt_rate=0, vocab=5000, **rates)
    tok = {(t["rollout_id"], t["call_id"]): t for t in tokens.to_pylist()}
    assert len(tok) == tokens.num_rows == ledger.num_rows
    records = {r["rollout_id"]: r for r in rollouts.to_pylist()}
    assert len(records) == 120
    for rid, calls in _by_rollout(ledger).items():
        by_id = {c["call_id"]: c for c in calls}
        assert len(by_id) == len(calls)
        assert len({c["response_id"] for c in calls}) == len(calls)
        for c in calls:
            t = tok[(rid, c["call_id"])]
            toks = np.array(t["tokens"], dtype="<i4")
            assert len(toks) == c["delta_len"] >= c["gen_len"] >= 1
            assert toks.min() >= 0 and toks.max() < 5000
            parent = by_id.get(c["parent_id"]) if c["parent_id"] is not None else None
            if c["parent_id"] is None:
                assert c["prev_len"] == 0
            else:
                assert parent is not None
                assert c["prev_len"] == parent["prev_len"] + parent["delta_len"]
            seed = parent["chain_hash"] if parent else 0
            assert xxhash.xxh3_64_intdigest(toks.tobytes(), seed) == c["chain_hash"]
            lp = np.array(t["logprobs"], dtype=np.float32)
            carry = c["delta_len"] - c["gen_len"]
            assert len(lp) == len(toks)
            assert carry >= 1
            assert np.all(lp[:carry] == 0.0) and np.all(lp[carry:] < 0.0)
            assert c["item_ids"] is None or len(c["item_ids"]) == len(c["item_keys"])
            assert not c["failed"]
        # the output is the items of some calls, in capture order, and ends with the terminal
        rec = records[rid]
        selected = _selected(calls, rec["output_keys"])
        if not rates:
            assert _shape(selected) == "linear"
        for k, c in enumerate(selected):
            assert c["parent_id"] is None or c["parent_id"] in {d["call_id"] for d in selected[:k]}
        assert selected[0]["parent_id"] is None
        if rec["terminal_response_id"] is not None:
            assert rec["terminal_response_id"] == selected[-1]["response_id"]
        if rec["accepted_response_ids"] is not None:
            assert rec["accepted_response_ids"] == [c["response_id"] for c in selected]


def test_clean_rollouts_have_compactions_retries_and_variety():
    ledger, tokens, rollouts = synth_tables(200, seed=4, corrupt_rate=0)
    by = _by_rollout(ledger)
    roots = Counter(sum(c["parent_id"] is None for c in calls) for calls in by.values())
    assert sum(v for k, v in roots.items() if k >= 2) > 10  # compactions (and root retries)
    assert any(k >= 3 for k in roots)  # several compactions in one rollout
    out = {r["rollout_id"]: set(r["output_keys"]) for r in rollouts.to_pylist()}
    rejected = [c for rid, calls in by.items() for c in calls if not set(c["item_keys"]) <= out[rid]]
    assert len(rejected) > 10  # rejected retries
    for c in rejected:  # a retry is a sibling captured before the accepted call
        siblings = [d for d in by[c["rollout_id"]] if d["parent_id"] == c["parent_id"] and d is not c]
        assert c["parent_id"] is None or siblings
    sizes = Counter(len(c["item_keys"]) for calls in by.values() for c in calls)
    assert set(sizes) == {1, 2, 3}
    ids = [i for calls in by.values() for c in calls for i in (c["item_ids"] or [None])]
    assert None in ids and any(i is not None for i in ids)
    recs = rollouts.to_pylist()
    assert any(r["terminal_response_id"] is None for r in recs)
    assert any(r["accepted_response_ids"] is not None for r in recs)
    assert any(r["accepted_response_ids"] is None for r in recs)
    assert {r["group_id"] for r in recs[:8]} == {"g0", "g1"}
    assert [r["rollout_id"] for r in recs[:2]] == ["r00000000", "r00000001"]
    rewards = np.array([r["reward"] for r in recs])
    assert np.all(np.isfinite(rewards)) and rewards.std() > 0.1
    # ledger rows of different rollouts interleave; token rows are shuffled
    seq = ledger["rollout_id"].to_pylist()
    assert seq != sorted(seq)
    tok_seq = list(zip(tokens["rollout_id"].to_pylist(), tokens["call_id"].to_pylist()))
    assert tok_seq != list(zip(seq, ledger["call_id"].to_pylist()))


def test_forest_shapes_come_at_their_rates():
    n = 400
    ledger, _, rollouts = synth_tables(n, seed=6, corrupt_rate=0, worker_rate=0.2, fork_rate=0.3)
    by = _by_rollout(ledger)
    shapes = Counter(_shape(_selected(by[r["rollout_id"]], r["output_keys"])) for r in rollouts.to_pylist())
    assert abs(shapes["workers"] - 0.2 * n) < 0.07 * n and abs(shapes["fork"] - 0.3 * n) < 0.07 * n
    for calls in by.values():
        roots = [c for c in calls if c["parent_id"] is None]
        assert len(roots) >= 1
    # none by default, and corrupt rollouts keep their linear shape (each kind its reason)
    ledger, _, rollouts = synth_tables(200, seed=6, corrupt_rate=0)
    by = _by_rollout(ledger)
    assert {_shape(_selected(by[r["rollout_id"]], r["output_keys"])) for r in rollouts.to_pylist()} == {"linear"}


def test_forest_rates_are_checked():
    for bad in ({"fork_rate": 1.5}, {"worker_rate": -0.1}, {"fork_rate": float("nan")},
                {"fork_rate": 0.6, "worker_rate": 0.5}):
        with pytest.raises(ValueError):
            synth_tables(4, **bad)
    synth_tables(4, fork_rate=0.5, worker_rate=0.5)


def test_zero_forest_rates_draw_nothing():
    """Rates of 0 leave every table as without the parameters; any rate > 0 changes them."""
    _assert_tables_equal(synth_tables(48, seed=3, worker_rate=0.0, fork_rate=0.0), synth_tables(48, seed=3))
    assert not synth_tables(48, seed=3, fork_rate=0.01)[0].equals(synth_tables(48, seed=3)[0])


def test_lengths_follow_the_means():
    ledger, _, _ = synth_tables(300, seed=9, corrupt_rate=0, mean_gen_tokens=50, mean_calls=3)
    gen = np.array(ledger["gen_len"].to_pylist())
    assert 35 < gen.mean() < 65 and gen.min() >= 1 and gen.max() > 150
    calls = Counter(ledger["rollout_id"].to_pylist())
    assert 2.5 < np.mean(list(calls.values())) < 5


# ---------------------------------------------------------------------------------------------
# Against the reference


def test_clean_rollouts_are_ok_in_cc_mode():
    tables = synth_tables(100, seed=12, corrupt_rate=0)
    report = _reassemble(tables, "cc")
    assert len(report) == 100
    assert {(r["status"], r["reason"]) for r in report} == {("ok", None)}
    # in ordinary mode, compactions (and root retries) are multiple_roots
    ordinary = Counter(r["reason"] for r in _reassemble(tables, "ordinary"))
    assert ordinary["multiple_roots"] > 0 and ordinary[None] > 0


def test_forest_plan_recovers_what_linear_masks_as_broken_chain():
    """Clean data with workers and forks: the linear plan masks exactly the forest-shaped
    rollouts, as broken_chain; the forest plan keeps every rollout, in as many rows as the
    selection has endpoints, training each selected generation once."""
    reference = pytest.importorskip("chainrows.reference")
    tables = synth_tables(160, seed=14, corrupt_rate=0, **FOREST_RATES)
    ledger, tokens, rollouts = (t.to_pylist() for t in tables)
    lin_rows, lin = reference.reassemble(ledger, tokens, rollouts, plan="linear")
    for_rows, fo = reference.reassemble(ledger, tokens, rollouts, plan="forest")
    by = _by_rollout(tables[0])
    assert [r["rollout_id"] for r in lin] == [r["rollout_id"] for r in fo] == [r["rollout_id"] for r in rollouts]
    shapes = Counter()
    for rec, a, b in zip(rollouts, lin, fo):
        selected = _selected(by[rec["rollout_id"]], rec["output_keys"])
        shape = _shape(selected)
        shapes[shape] += 1
        assert (b["status"], b["reason"]) == ("ok", None)
        if shape == "linear":
            assert b == a
        else:
            assert (a["status"], a["reason"]) == ("masked", "broken_chain")
            parents = {c["parent_id"] for c in selected}
            assert b["num_rows"] == sum(c["call_id"] not in parents for c in selected) >= 2
        assert b["loss_tokens"] == sum(c["gen_len"] for c in selected)
    assert shapes["workers"] > 20 and shapes["fork"] > 20 and shapes["linear"] > 20
    kept = {r["rollout_id"] for r in lin_rows}
    assert [r for r in for_rows if r["rollout_id"] in kept] == lin_rows
    assert len(for_rows) > len(lin_rows)


def test_forest_shapes_next_to_corruptions():
    """Corrupt rollouts stay linear: every reason but broken_chain is the same under both
    plans, and every rollout the linear plan keeps is kept alike by the forest plan."""
    reference = pytest.importorskip("chainrows.reference")
    tables = synth_tables(160, seed=16, corrupt_rate=0.2, **FOREST_RATES)
    ledger, tokens, rollouts = (t.to_pylist() for t in tables)
    lin_rows, lin = reference.reassemble(ledger, tokens, rollouts, plan="linear")
    for_rows, fo = reference.reassemble(ledger, tokens, rollouts, plan="forest")
    recovered = 0
    for a, b in zip(lin, fo):
        if a["status"] == "ok":
            assert b == a
        elif a["reason"] == "broken_chain" and b["status"] == "ok":
            recovered += 1
        else:
            assert (b["status"], b["reason"]) == (a["status"], a["reason"])
    assert recovered > 40
    assert len({r["reason"] for r in fo}) >= 6
    kept = {r["rollout_id"] for r in lin_rows}
    assert [r for r in for_rows if r["rollout_id"] in kept] == lin_rows


@pytest.mark.parametrize("plan", ["linear", "forest"])
def test_engine_matches_reference_on_forest_synth(plan):
    from tests.support.compare import compare_outputs
    from tests.support.engine_adapter import engine_reassemble

    reference = pytest.importorskip("chainrows.reference")
    tables = synth_tables(96, seed=15, corrupt_rate=0.15, **FOREST_RATES)
    ledger, tokens, rollouts = (t.to_pylist() for t in tables)
    want_rows, want_report = reference.reassemble(ledger, tokens, rollouts, plan=plan)
    got_rows, got_report = engine_reassemble(ledger, tokens, rollouts, plan=plan)
    compare_outputs(f"synth forest data, plan={plan}", got_rows, got_report, want_rows, want_report)
    assert {r["reason"] for r in want_report} >= ({None, "broken_chain"} if plan == "linear" else {None})


@pytest.mark.parametrize("kind", CORRUPT_KINDS)
def test_each_corrupt_kind_triggers_its_reason(kind):
    mode, reason = CORRUPT_TARGETS[kind]
    tables = synth_tables(40, seed=21, corrupt_rate=1.0, corrupt_kinds=(kind,))
    report = _reassemble(tables, mode)
    assert len(report) == 40
    assert Counter((r["status"], r["reason"]) for r in report) == {("masked", reason): 40}
    assert all(r["detail"] for r in report)


def test_default_mix_has_some_corruptions():
    tables = synth_tables(200, seed=1, corrupt_rate=0.4)
    reasons = Counter(r["reason"] for r in _reassemble(tables, "cc"))
    assert reasons[None] > 90
    assert len([r for r in reasons if r]) >= 8


def test_without_logprobs_every_default_kind_works():
    tables = synth_tables(60, seed=2, corrupt_rate=1.0, logprobs=False)
    reasons = {r["reason"] for r in _reassemble(tables, "cc")}
    assert "logprob_invalid" not in reasons and len(reasons) >= 8


# ---------------------------------------------------------------------------------------------
# Writing


def test_write_synth_dataset(tmp_path):
    out = tmp_path / "ds"
    summary = write_synth_dataset(out, 40, 6, batch_rollouts=16)
    assert sorted(os.listdir(out)) == ["ledger.parquet", "rollouts.parquet", "tokens.parquet"]
    assert sorted(os.listdir(tmp_path)) == ["ds"]  # no temporary directory left
    expected = synth_tables(40, 6)
    got = tuple(pq.read_table(out / f"{n}.parquet") for n in ("ledger", "tokens", "rollouts"))
    _assert_tables_equal(got, expected)
    assert summary["rollouts"] == 40
    assert summary["calls"] == expected[0].num_rows
    assert summary["tokens"] == len(pa.concat_arrays([c.flatten() for c in expected[1]["tokens"].chunks]))
    assert summary["bytes"] == sum(os.path.getsize(out / n) for n in os.listdir(out))
    assert pq.ParquetFile(out / "tokens.parquet").num_row_groups == 3

    with pytest.raises(FileExistsError):
        write_synth_dataset(out, 10, 0)
    write_synth_dataset(out, 10, 0, overwrite=True, logprobs=False)
    assert pq.read_table(out / "rollouts.parquet").num_rows == 10
    assert "logprobs" not in pq.read_schema(out / "tokens.parquet").names
    assert sorted(os.listdir(tmp_path)) == ["ds"]


def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    real = synth.batches.build_batch
    seen = []

    def failing(cfg, first, stop):
        seen.append(first)
        if len(seen) == 2:
            raise KeyboardInterrupt
        return real(cfg, first, stop)

    monkeypatch.setattr(synth.batches, "build_batch", failing)
    with pytest.raises(KeyboardInterrupt):
        write_synth_dataset(tmp_path / "ds", 64, 0, batch_rollouts=16)
    assert os.listdir(tmp_path) == []


def test_module_cli(tmp_path, capsys):
    assert synth.main([str(tmp_path / "ds"), "--rollouts", "20", "--seed", "3"]) == 0
    assert "20 rollouts" in capsys.readouterr().out
    assert pq.read_table(tmp_path / "ds" / "rollouts.parquet").num_rows == 20


@pytest.mark.slow
def test_workers_give_the_same_tables():
    one = _concat(list(iter_synth_batches(64, 5, batch_rollouts=16)))
    two = _concat(list(iter_synth_batches(64, 5, batch_rollouts=16, workers=2)))
    _assert_tables_equal(one, two)
