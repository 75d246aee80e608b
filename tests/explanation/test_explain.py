"""`chainrows.explain` against the reference oracle: status, reason, detail, selection, chains,
rows and loss tokens agree for every hand case and for random datasets."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chainrows import explain, reference
from chainrows.formats.native.schema import tables_from_pylists
from chainrows.options import Options
from chainrows.reference.reassembly import Masked, group_by_rollout, select_6
from tests.cases import CASES
from tests.support.profiles import examples
from tests.support.randomized import random_dataset


def _tables(ledger, tokens, rollouts, logprobs):
    accepted = any("accepted_response_ids" in r for r in rollouts)
    if not logprobs:
        tokens = [{k: v for k, v in t.items() if k != "logprobs"} for t in tokens]
    return tables_from_pylists(ledger, tokens, rollouts, logprobs=logprobs, accepted=accepted)


def _reference_selection(ledger, tokens, rollouts, logprobs, rid) -> list[str] | None:
    """The oracle's step-6 selection of ``rid`` (call ids), None when step 6 does not complete."""
    ro = next(r for r in group_by_rollout(ledger, tokens, rollouts, logprobs) if r.rollout_id == rid)
    try:
        return [c["call_id"] for c in select_6(ro)]
    except (Masked, KeyError, IndexError, TypeError):
        return None


def check_agrees(ledger, tokens, rollouts, options: dict, where: str) -> None:
    """Every rollout of the input explained; each explanation agrees with the oracle."""
    options = dict(options)
    logprobs = options.pop("logprobs", bool(tokens) and "logprobs" in tokens[0])
    opts = Options(**options)
    want_rows, want_report = reference.reassemble(ledger, tokens, rollouts, opts, logprobs=logprobs)
    tables = _tables(ledger, tokens, rollouts, logprobs)
    ids = [r["rollout_id"] for r in want_report]
    for e, rep in zip(explain(tables, ids, opts), want_report):
        w = f"{where}/{rep['rollout_id']}"
        assert (e["status"], e["reason"], e["detail"]) == (rep["status"], rep["reason"], rep["detail"]), w
        assert e["num_selected"] == rep["num_selected"] and e["num_calls"] == len(e["calls"]), w
        written = [r for r in want_rows if r["rollout_id"] == rep["rollout_id"]]
        assert [(r["row_id"], r["call_ids"], r["weight"]) for r in e["rows"]] == \
            [(r["row_id"], r["call_ids"], r["weight"]) for r in written], w
        rows = [r for r in written if r["weight"] > 0 or rep["status"] == "ok"]  # placeholders' tokens are unspecified
        assert [r["num_tokens"] for r in e["rows"] if r["row_id"] in {x["row_id"] for x in rows}] == \
            [len(r["input_ids"]) for r in rows], w
        assert sum(c["loss_tokens"] for c in e["calls"]) == rep["loss_tokens"], w
        selected = [c["call_id"] for c in e["calls"] if c["selected"]]
        if rep["status"] == "ok":
            assert e["chains"] == [r["call_ids"] for r in rows], w
            assert sorted({c for r in rows for c in r["call_ids"]}) == sorted(selected), w
            assert e["failed_check"] is None
        else:
            assert e["failed_check"]["check"] == rep["reason"], w
            named = rep["detail"].split(": call ")[1].split(": ")[0] if ": call " in rep["detail"] else None
            assert e["failed_check"]["call_id"] == named, w
        if opts.mode == "cc" and e["num_selected"]:
            windows = sorted((c["output_positions"][i], c["call_id"]) for c in e["calls"] if c["selected"]
                             for i in range(0, len(c["output_positions"]), c["items"]))
            want = _reference_selection(ledger, tokens, rollouts, logprobs, rep["rollout_id"])
            assert [call for _, call in windows] == want, w
        for c in e["calls"]:
            assert (c["why_not"] is None) == c["selected"], w
            assert c["chain"] is None or c["selected"], w


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_explain_agrees_on_every_hand_case(case):
    ledger, tokens, rollouts = case.inputs()
    check_agrees(ledger, tokens, rollouts, dict(case.options, logprobs=case.has_logprobs), case.name)


@settings(max_examples=examples(5), suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), forest=st.booleans())
def test_explain_agrees_on_random_datasets(seed, forest):
    ledger, tokens, rollouts, options = random_dataset(seed, n_rollouts=12, corrupt=0.5)
    if forest and options["mode"] == "cc":
        options["plan"] = "forest"
    check_agrees(ledger, tokens, rollouts, options, f"seed={seed}")


def test_the_worked_example_call_by_call():
    case = next(c for c in CASES if c.name == "worked_example_cc")
    e = explain(_tables(*case.inputs(), False), "wx")
    calls = {c["call_id"]: c for c in e["calls"]}
    assert [calls[c]["output_positions"] for c in ("c1", "c2", "c3", "c5")] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert not calls["c4"]["selected"] and calls["c4"]["chain"] is None
    assert calls["c4"]["why_not"].startswith("its items are not in the agent's output")
    assert e["chains"] == [["c1", "c2"], ["c3", "c5"]]
    assert [calls[c]["root"] for c in ("c1", "c2", "c3", "c4", "c5")] == [True, False, True, False, False]
    text = str(e)
    assert "- #3 c4" in text and "chain 1: c3 -> c5" in text and "row wx_s1" in text
    html = e._repr_html_()
    assert html.count('<g class="call"') == 5 and 'data-call-id="c4" data-selected="0"' in html
