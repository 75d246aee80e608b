"""Round trips (SPEC §8): a consistent §2 dataset written as a full-sequence call log
(chainrows.formats.calls.export_calls), imported back and reassembled, gives the original rows
and report, in both modes, both plans and every advantage option.

With the harness's parents declared the trip is exact on any consistent dataset (random ones
here, tiny token and key alphabets included). With parents inferred it is exact where the
tokens tell the parents apart: the synthetic datasets of tests/runners/calls/test_calls_job.py."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chainrows
from chainrows.formats.calls import export_calls, import_calls, write_results_jsonl
from chainrows.formats.native.schema import tables_from_pylists
from tests.support.profiles import examples
from tests.support.randomized import random_dataset

OPTION_KEYS = ("mode", "placeholders", "baseline", "no_std", "baseline_population", "row_weight")


def _round_trip(seed: int, plan: str, tmp_path) -> None:
    ledger, tokens, rollouts, options = random_dataset(seed, corrupt=0.0)
    tables = tables_from_pylists(ledger, tokens, rollouts, logprobs=options["logprobs"],
                                 accepted="accepted_response_ids" in (rollouts[0] if rollouts else {}))
    opts = {k: options[k] for k in OPTION_KEYS}
    if opts["mode"] == "cc":
        opts["plan"] = plan
    want = chainrows.reassemble(*tables, **opts)
    log = export_calls(tables[0], tables[1], declare_parents=True)
    results = tmp_path / f"results-{seed}.jsonl"
    write_results_jsonl(results, tables[2])
    got = import_calls(log, results)
    assert got.summary.relation("declared") + got.summary.relation("failed") == tables[0].num_rows
    again = chainrows.reassemble(got.ledger, got.tokens, got.rollouts, **opts)
    assert again.rows.equals(want.rows), seed
    assert again.report.equals(want.report), seed


@settings(max_examples=examples(1.5), suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                              HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.sampled_from(["linear", "forest"]))
def test_declared_round_trip_on_random_consistent_datasets(tmp_path, seed, plan):
    _round_trip(seed, plan, tmp_path)


def test_the_log_holds_what_the_model_saw(tmp_path):
    """Each exported call: its prompt is its parent's full sequence and its carry, its
    completion its last gen_len tokens."""
    ledger, tokens, rollouts, _ = random_dataset(7, corrupt=0.0)
    tables = tables_from_pylists(ledger, tokens, rollouts)
    log = export_calls(tables[0], tables[1]).to_pylist()
    by_call = {(t["rollout_id"], t["call_id"]): t["tokens"] for t in tokens}
    full = {}
    for row, call in zip(log, ledger):
        delta = by_call[(call["rollout_id"], call["call_id"])]
        parent = full.get((call["rollout_id"], call["parent_id"]), []) if call["parent_id"] else []
        full[(call["rollout_id"], call["call_id"])] = parent + delta
        assert row["prompt_ids"] + row["completion_ids"] == parent + delta
        assert len(row["completion_ids"]) == call["gen_len"]
    assert isinstance(export_calls(tables[0], tables[1]), pa.Table)
