"""The §8 reference (chainrows.reference.calls) against the hand-written cases of
tests/calls_cases.py, its per-rule functions, and the invariants on random call logs."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chainrows.reference import calls as C
from chainrows.reference.calls import RELATIONS, import_calls
from tests.calls_cases import (
    CALLS_CASE_BY_NAME,
    CALLS_CASES,
    call,
    call_logs,
    check_calls_case,
    check_calls_invariants,
    failed,
    worked_records,
)
from tests.calls_cases import (
    RELATIONS as CASE_RELATIONS,
)
from tests.support.profiles import examples


@pytest.mark.parametrize("case", CALLS_CASES, ids=[c.name for c in CALLS_CASES])
def test_case(case):
    check_calls_case(case, import_calls(case.inputs(), on_drift=case.on_drift))


def test_cases_cover_every_relation_and_text():
    assert CASE_RELATIONS == RELATIONS
    seen = {e.relation for c in CALLS_CASES for e in c.expect}
    assert seen == set(RELATIONS)
    errors = {e.integrity_error.split(" ")[0] for c in CALLS_CASES for e in c.expect
              if e.integrity_error}
    assert errors == {"prompt", "declared", "token"}


def test_worked_example_is_one_rollout_of_seven_calls():
    case = CALLS_CASE_BY_NAME["worked_example"]
    assert [e.relation for e in case.expect] == [
        "first_root", "child", "drift", "rewrite", "child", "child", "child"]


# --------------------------------------------------------------------------------------------
# The per-rule functions
# --------------------------------------------------------------------------------------------

def test_terms_of_8_2():
    p = call("p", [1, 2], [3, 4])
    assert C.full_sequence(p) == [1, 2, 3, 4]
    assert C.lcp(call("c", [1, 2, 3, 4, 5], [9]), p) == 4
    assert C.lcp(call("c", [1, 2, 3], [9]), p) == 3       # prompt ends inside F(p)
    assert C.lcp(call("c", [], [9]), p) == 0
    assert C.is_candidate(call("c", [1, 2, 3, 4], [9]), p)  # prompt == F(p)
    assert not C.is_candidate(call("c", [1, 2, 3], [9]), p)
    # departs inside p's generation: |prompt p| <= lcp < |F(p)| and lcp < |prompt c|
    assert C.departs_inside_generation(call("c", [1, 2, 7], [9]), p)      # lcp 2
    assert C.departs_inside_generation(call("c", [1, 2, 3, 7], [9]), p)   # lcp 3
    assert not C.departs_inside_generation(call("c", [1, 7], [9]), p)     # inside the prompt
    assert not C.departs_inside_generation(call("c", [1, 2, 3], [9]), p)  # ends, no departure
    assert not C.departs_inside_generation(call("c", [1, 2, 3, 4, 5], [9]), p)  # candidate


def test_earlier_calls_skip_failed_and_later():
    recs = [call("a", [1], [2]), failed("b"), call("c", [1], [3]), call("d", [1], [4])]
    assert [p["call_id"] for p in C.earlier_calls(recs, 3)] == ["a", "c"]
    assert C.earlier_calls(recs, 0) == []


def test_latest_best_ties_the_latest():
    calls = [call(str(i), [], [1]) for i in range(4)]
    score = {"0": 1, "1": 3, "2": 3, "3": 2}
    assert C.latest_best(calls, lambda p: score[p["call_id"]])["call_id"] == "2"
    assert C.latest_best([], len) is None


def test_infer_parent_rule_order():
    c1 = call("c1", [1, 2], [3, 4])
    c2 = call("c2", [1, 2, 3, 4], [5, 6])
    # both a candidate (c1) and a departure beyond it (c2 at 5): drift comes first
    r = C.infer_parent(call("c", [1, 2, 3, 4, 5, 9], [1]), [c1, c2])
    assert (r.relation, r.against["call_id"], r.diverge_at) == ("drift", "c2", 5)
    r = C.infer_parent(call("c", [1, 2, 3, 4, 7], [1]), [c1, c2])
    assert (r.relation, r.parent["call_id"]) == ("child", "c1")
    assert C.infer_parent(call("c", [1], [1]), []).relation == "first_root"
    r = C.infer_parent(call("c", [1, 2], [1]), [c1, c2])
    assert (r.relation, r.against["call_id"], r.diverge_at) == ("retry", "c1", None)
    r = C.infer_parent(call("c", [1, 9], [1]), [c1, c2])
    assert (r.relation, r.against["call_id"], r.diverge_at) == ("rewrite", "c2", 1)


def test_declared_parent_texts():
    p = call("p", [1, 2], [3])
    r = C.check_declared_parent(call("c", [1, 2, 4], [5], parent="p"), [p])
    assert r.integrity_error == "prompt does not extend call p: first difference at token 2"
    r = C.check_declared_parent(call("c", [1, 2, 3], [5], parent="q"), [p])
    assert r.integrity_error == "declared parent q is not an earlier, non-failed call of the rollout"
    assert r.against is None and r.diverge_at is None
    r = C.check_declared_parent(call("c", [1, 2, 3], [5], parent="p"), [p])
    assert (r.relation, r.parent["call_id"], r.integrity_error) == ("declared", "p", None)
    assert C.check_declared_parent(call("c", [7], [5], parent=None), [p]).parent is None


def test_drift_text_and_on_drift_values():
    recs = [call("c1", [1, 2], [3]), call("c2", [1, 2, 5], [6])]
    out = import_calls(recs, on_drift="mask")
    assert out.ledger[1]["integrity_error"] == \
        "token drift: differs from call c1's generated tokens at token 2"
    assert import_calls(recs).ledger[1]["integrity_error"] is None
    with pytest.raises(ValueError):
        import_calls(recs, on_drift="drop")


def test_rows_of_a_child():
    parent = call("p", [1, 2], [3])
    c = call("c", [1, 2, 3, 4], [5, 6], completion_logprobs=[-1.0, -2.0])
    assert C.prev_len(parent) == 3 and C.prev_len(None) == 0
    assert C.delta(c, parent) == [4, 5, 6]
    assert C.delta_logprobs(c, parent) == [0.0, -1.0, -2.0]
    assert C.delta_logprobs(call("x", [1], [2]), None) is None
    row = C.ledger_row(c, C.Parentage("child", parent=parent), 77)
    assert row["chain_hash"] == C.chain_hash([4, 5, 6], 77)
    assert (row["prev_len"], row["delta_len"], row["gen_len"]) == (3, 3, 2)


def test_inputs_not_mutated_and_same_dict_twice():
    recs = worked_records()
    before = copy.deepcopy(recs)
    import_calls(recs, on_drift="mask")
    assert recs == before
    # the same dict object passed twice is two records (a repeated call_id)
    rec = call("c1", [1], [2])
    out = import_calls([rec, rec])
    assert [r["relation"] for r in out.report] == ["first_root", "retry"]


def test_no_records():
    out = import_calls([])
    assert (out.ledger, out.tokens, out.report, out.has_logprobs) == ([], [], [], False)


# --------------------------------------------------------------------------------------------
# Invariants on random call logs
# --------------------------------------------------------------------------------------------

@settings(max_examples=examples(2.5), suppress_health_check=[HealthCheck.too_slow])
@given(call_logs(), st.sampled_from(["root", "mask"]))
def test_invariants_on_random_call_logs(records, on_drift):
    before = copy.deepcopy(records)
    result = import_calls(records, on_drift=on_drift)
    assert records == before
    check_calls_invariants(records, result, on_drift)
