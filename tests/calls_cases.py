"""Hand-written cases of SPEC §8 (full-sequence call logs -> a §2 dataset).

Every expected value here is derived by hand from SPEC §8 (the arithmetic in comments: F = a
call's full sequence prompt + completion, |F| its length, lcp as in §8.2), never pasted from a
run. The readings of §8 that the SPEC leaves open are listed in the docstring of
``chainrows.reference.calls``; the cases pin them. Run a case with any function that has the
signature of ``chainrows.reference.calls.import_calls``:

    result = fn(case.inputs(), on_drift=case.on_drift)
    check_calls_case(case, result)

``result`` needs ``ledger``, ``tokens``, ``report`` (lists of dicts, or anything with
``to_pylist()``) and ``has_logprobs``. ``check_calls_case`` checks what the case expects plus the
invariants every output must satisfy (``check_calls_invariants``, which the property test runs
on random inputs too). The tokens table may come in any order across calls, but the token rows of
one (rollout_id, call_id) must follow capture order.

Token ids in the comments: records are written ``c [prompt | completion]``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

from chainrows.formats.items import model_item_keys
from chainrows.reference.reassembly import chain_hash

RELATIONS = ("first_root", "child", "retry", "rewrite", "drift", "declared", "declared_mismatch",
             "failed")
ROOT_RELATIONS = ("first_root", "retry", "rewrite", "drift", "declared", "declared_mismatch")
LEDGER_COLUMNS = ("rollout_id", "call_id", "parent_id", "response_id", "prev_len", "delta_len",
                  "gen_len", "chain_hash", "item_keys", "item_ids", "failed", "integrity_error")
REPORT_COLUMNS = ("rollout_id", "call_id", "parent_id", "relation", "against_call", "diverge_at",
                  "prompt_len", "completion_len", "diverge_token", "against_token")
UNSET = object()  # an expectation not checked


# --------------------------------------------------------------------------------------------
# Records and expectations
# --------------------------------------------------------------------------------------------

def call(call_id: str, prompt: list, completion: list, rollout: str = "r", **fields) -> dict:
    """A non-failed record. ``parent=...`` declares a parent (None declares a root)."""
    rec = {"rollout_id": rollout, "call_id": call_id, "prompt_ids": list(prompt),
           "completion_ids": list(completion), "output_items": None}
    if "parent" in fields:
        rec["parent_id"] = fields.pop("parent")
    rec.update(fields)
    return rec


def failed(call_id: str, rollout: str = "r", **fields) -> dict:
    """A failed (poison) record; other fields only as given. ``parent=...`` declares."""
    rec = {"rollout_id": rollout, "call_id": call_id, "failed": True}
    if "parent" in fields:
        rec["parent_id"] = fields.pop("parent")
    rec.update(fields)
    return rec


def assistant(text: str, id: str | None = None) -> dict:
    """A Responses-API style model-authored message item."""
    return {"type": "message", "role": "assistant", "id": id, "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


@dataclass
class Exp:
    """The expected outcome of one record. ``delta`` None for a failed record. ``extra``: more
    fields to check, looked up in the ledger row, else the report row, else (``logprobs``) the
    tokens row."""

    call_id: str
    relation: str
    parent_id: str | None = None
    against_call: str | None = None
    diverge_at: int | None = None
    prev_len: int = 0
    delta: list | None = None
    integrity_error: str | None = None
    rollout_id: str = "r"
    extra: dict = field(default_factory=dict)


def first_root(cid, delta, **extra) -> Exp:
    return Exp(cid, "first_root", delta=delta, extra=extra)


def child(cid, parent, prev_len, delta, **extra) -> Exp:
    return Exp(cid, "child", parent, prev_len=prev_len, delta=delta, extra=extra)


def retry(cid, against, delta, **extra) -> Exp:
    return Exp(cid, "retry", against_call=against, delta=delta, extra=extra)


def rewrite(cid, against, at, delta, **extra) -> Exp:
    return Exp(cid, "rewrite", against_call=against, diverge_at=at, delta=delta, extra=extra)


def drift(cid, against, at, delta, error=None, **extra) -> Exp:
    return Exp(cid, "drift", against_call=against, diverge_at=at, delta=delta,
               integrity_error=error, extra=extra)


def declared(cid, parent, prev_len, delta, **extra) -> Exp:
    return Exp(cid, "declared", parent, prev_len=prev_len, delta=delta, extra=extra)


def mismatch(cid, error, delta, against=None, at=None, **extra) -> Exp:
    return Exp(cid, "declared_mismatch", against_call=against, diverge_at=at, delta=delta,
               integrity_error=error, extra=extra)


def poison(cid, parent_id=None, **extra) -> Exp:
    return Exp(cid, "failed", parent_id, delta=None, extra=extra)


def in_rollout(rollout_id: str, e: Exp) -> Exp:
    e.rollout_id = rollout_id
    return e


@dataclass
class CallsCase:
    name: str
    records: list
    expect: list  # one Exp per record, in record order
    on_drift: str = "root"
    has_logprobs: bool = False

    def inputs(self) -> list:
        """A fresh deep copy of the records."""
        return copy.deepcopy(self.records)


CALLS_CASES: list = []


def calls_case(on_drift: str = "root"):
    """Decorator: the function returns (records, expectations); the case is named after it."""

    def register(fn):
        records, expect = fn()
        assert fn.__name__ not in {c.name for c in CALLS_CASES}, fn.__name__
        assert len(records) == len(expect), fn.__name__
        lp = any(r.get("completion_logprobs") is not None for r in records)
        CALLS_CASES.append(CallsCase(fn.__name__, records, expect, on_drift, lp))
        return fn

    return register


# --------------------------------------------------------------------------------------------
# The worked example: a compaction, a re-tokenized turn and a rejected retry
# --------------------------------------------------------------------------------------------
# Token ids: 1 system prompt, 2 3 user task, 4 5 6 tool results, 7 a compaction summary, 8 the
# user task restated, 9 a tool result after compaction, 10 and up generated tokens; 30 is the
# harness's re-tokenization of the generated 13.

def worked_records(rollout: str = "wx") -> list:
    def turn(cid, prompt, completion, text):
        return call(cid, prompt, completion, rollout,
                    output_items=[{"type": "function_call_output", "call_id": "t", "output": "x"},
                                  assistant(text, f"msg_{cid}")],
                    response_id=f"resp_{cid}")

    return [
        turn("c1", [1, 2, 3], [10, 11], "a1"),
        turn("c2", [1, 2, 3, 10, 11, 4], [12, 13], "a2"),
        turn("c3", [1, 2, 3, 10, 11, 4, 12, 30, 5], [14], "a3"),
        turn("c4", [1, 7, 8], [15], "a4"),
        turn("c5", [1, 7, 8, 15, 9], [16, 17], "a5"),
        turn("c6", [1, 7, 8, 15, 9], [18, 19], "a6"),
        turn("c7", [1, 7, 8, 15, 9, 18, 19, 6], [20], "a7"),
    ]


def worked_expect(rollout: str = "wx", drift_error: str | None = None) -> list:
    return [in_rollout(rollout, e) for e in [
        # c1: nothing earlier.  F1 = [1,2,3,10,11], |F1| = 5
        first_root("c1", [1, 2, 3, 10, 11], response_id="resp_c1", gen_len=2),
        # c2: F1 is a prefix of its prompt -> child of c1, prev_len 5, carry [4].
        #     F2 = [1,2,3,10,11,4,12,13], |F2| = 8
        child("c2", "c1", 5, [4, 12, 13]),
        # c3: candidates: c1 only (prompt[7] = 30 != F2[7] = 13), so P = c1, |F(P)| = 5.
        #     lcp(c3, c2) = 7: 7 < |prompt c3| = 9 and |prompt c2| = 6 <= 7 < |F2| = 8, and
        #     7 > 5 -> D = {c2}: a drift root against c2 at 7 (the harness re-rendered c2's
        #     generated [12, 13] as [12, 30]); the whole prompt is carried.
        drift("c3", "c2", 7, [1, 2, 3, 10, 11, 4, 12, 30, 5, 14], drift_error,
              diverge_token=30, against_token=13),
        # c4: the compaction. lcp with c1, c2, c3 = 1 each (7 != 2); no candidate, no departure
        #     (every earlier prompt is longer than 1), prompt new -> rewrite; ties: the latest,
        #     c3, at 1. against_token = F3[1] = 2.  F4 = [1,7,8,15], |F4| = 4
        rewrite("c4", "c3", 1, [1, 7, 8, 15], diverge_token=7, against_token=2),
        # c5: F4 is a prefix -> child of c4, prev_len 4.  F5 = [1,7,8,15,9,16,17]
        child("c5", "c4", 4, [9, 16, 17]),
        # c6: the retry the agent kept: same prompt as c5. Candidates: c4 only. lcp(c6, c5) = 5
        #     = |prompt c6|: c6 does not depart inside c5 -> child of c4, a sibling of c5.
        #     F6 = [1,7,8,15,9,18,19], |F6| = 7
        child("c6", "c4", 4, [9, 18, 19]),
        # c7: candidates c4 (|F| 4) and c6 (|F| 7) -> P = c6. lcp(c7, c5) = 5 (18 != 16) is
        #     inside c5's generation but not beyond |F(P)| = 7: no drift -> child of c6.
        child("c7", "c6", 7, [6, 20]),
    ]]


@calls_case()
def worked_example():
    return worked_records(), worked_expect()


@calls_case(on_drift="mask")
def worked_example_on_drift_mask():
    # Only the drift root gets the text; <p> = against_call, <k> = diverge_at.
    return worked_records(), worked_expect(
        drift_error="token drift: differs from call c2's generated tokens at token 7")


# --------------------------------------------------------------------------------------------
# Children, first roots, the shape of ordinary capture
# --------------------------------------------------------------------------------------------

@calls_case()
def ordinary_chain():
    # The ordinary-capture chain of tests/support/builders.single_chain: deltas [1,2|3,4], [5|6], [7,8|9].
    return [
        call("c1", [1, 2], [3, 4]),
        call("c2", [1, 2, 3, 4, 5], [6]),
        call("c3", [1, 2, 3, 4, 5, 6, 7, 8], [9]),
    ], [
        first_root("c1", [1, 2, 3, 4], gen_len=2, response_id="c1", prompt_len=2,
                   completion_len=2),
        child("c2", "c1", 4, [5, 6], gen_len=1),               # |F1| = 4
        child("c3", "c2", 6, [7, 8, 9], delta_len=3, gen_len=1),  # candidates c1 (4), c2 (6)
    ]


@calls_case()
def one_token_completion_single_call():
    return [call("c1", [5, 6], [7])], [first_root("c1", [5, 6, 7], gen_len=1, delta_len=3)]


@calls_case()
def prompt_exactly_equal_to_parent_full_sequence():
    return [
        call("c1", [5, 6], [7]),
        call("c2", [5, 6, 7], [8]),         # prompt == F1: child, prev_len 3, no carry
        call("c3", [5, 6, 7, 8], [9, 10]),  # prompt == F2: candidates c1 (3), c2 (4) -> c2
    ], [
        first_root("c1", [5, 6, 7]),
        child("c2", "c1", 3, [8], gen_len=1, delta_len=1),
        child("c3", "c2", 4, [9, 10], gen_len=2, delta_len=2),
    ]


@calls_case()
def empty_prompts():
    return [
        call("c1", [], [5]),
        call("c2", [], [6]),
        call("c3", [5, 7], [8]),
        call("c4", [9], [1]),
    ], [
        first_root("c1", [5], prompt_len=0),
        # F1 = [5] is no prefix of []; lcp 0 = |prompt|: no departure; same prompt as c1.
        retry("c2", "c1", [6]),
        # candidates: c1 (F1 = [5]); lcp(c3, c2) = 0, not > |F1| = 1 -> child of c1
        child("c3", "c1", 1, [7, 8]),
        # lcp 0 with c1, c2, c3; no departure at 0 (not > 0) -> rewrite at 0, latest c3.
        # against_token = F3[0] = 5
        rewrite("c4", "c3", 0, [9, 1], diverge_token=9, against_token=5),
    ]


@calls_case()
def equal_length_candidates_latest():
    return [
        call("c1", [1], [2]),
        call("c2", [1], [2]),
        call("c3", [1, 2, 3], [4]),
    ], [
        first_root("c1", [1, 2]),
        retry("c2", "c1", [1, 2]),  # |F1| = 2 > |prompt| = 1: no candidate; same prompt
        child("c3", "c2", 2, [3, 4]),  # candidates c1 and c2, both |F| = 2 -> the latest
    ]


# --------------------------------------------------------------------------------------------
# Retries and rewrites
# --------------------------------------------------------------------------------------------

@calls_case()
def retry_against_latest_identical_prompt():
    return [
        call("c1", [1, 2], [3]),
        call("c2", [1, 2], [4]),
        call("c3", [1, 2], [5]),
        call("c4", [1, 2, 3, 6], [7]),
    ], [
        first_root("c1", [1, 2, 3]),
        # lcp(c2, c1) = 2 = |prompt c2|: no departure; F1 not a prefix; same prompt as c1
        retry("c2", "c1", [1, 2, 4], diverge_token=None, against_token=None),
        retry("c3", "c2", [1, 2, 5]),  # same prompt as c1 and c2: the latest
        # candidates: c1 (F1 = [1,2,3]). lcp with c2, c3 = 2, inside their generation but
        # not > |F1| = 3: the sibling retries are no drift -> child of c1
        child("c4", "c1", 3, [6, 7]),
    ]


@calls_case()
def rewrite_lcp_zero():
    return [call("c1", [1, 2], [3]), call("c2", [7, 8], [9])], [
        first_root("c1", [1, 2, 3]),
        rewrite("c2", "c1", 0, [7, 8, 9], diverge_token=7, against_token=1),
    ]


@calls_case()
def rewrite_lcp_positive_and_ties():
    return [
        call("c1", [1, 2, 3, 4], [5]),
        call("c2", [1, 9], [6]),
        call("c3", [1, 2, 3, 7], [8]),
        call("c4", [1, 2, 6], [6]),
        call("c5", [2, 1], [1]),
    ], [
        first_root("c1", [1, 2, 3, 4, 5]),
        # lcp(c2, c1) = 1 < |prompt c1| = 4: not inside c1's generation -> rewrite at 1
        rewrite("c2", "c1", 1, [1, 9, 6], diverge_token=9, against_token=2),
        # lcp c1 = 3 (7 != 4), c2 = 1: the largest is c1, not the latest; 3 < |prompt c1| = 4
        rewrite("c3", "c1", 3, [1, 2, 3, 7, 8], diverge_token=7, against_token=4),
        # lcp c1 = 2, c2 = 1, c3 = 2 (F3 = [1,2,3,7,8]): tie c1/c3 -> the latest, c3
        rewrite("c4", "c3", 2, [1, 2, 6, 6], diverge_token=6, against_token=3),
        # lcp 0 with all -> the latest, c4; against_token = F4[0] = 1
        rewrite("c5", "c4", 0, [2, 1, 1], diverge_token=2, against_token=1),
    ]


@calls_case()
def prompt_ends_inside_generation_is_a_rewrite():
    # c2's prompt is a proper prefix of F1 reaching into c1's generation: lcp 3 is not
    # < |prompt c2| = 3, so c2 does not depart (§8.2); no candidate (|F1| = 4 > 3).
    return [call("c1", [1, 2], [3, 4]), call("c2", [1, 2, 3], [5])], [
        first_root("c1", [1, 2, 3, 4]),
        rewrite("c2", "c1", 3, [1, 2, 3, 5], diverge_token=None, against_token=4),
    ]


# --------------------------------------------------------------------------------------------
# Drift
# --------------------------------------------------------------------------------------------

@calls_case()
def drift_exactly_at_end_of_parent_is_a_branch():
    return [
        call("c1", [1, 2], [3, 4]),
        call("c2", [1, 2, 3, 4], [5, 6]),
        call("c3", [1, 2, 3, 4, 7], [8]),
        call("c4", [1, 2, 3, 4, 5, 9], [10]),
    ], [
        first_root("c1", [1, 2, 3, 4]),
        child("c2", "c1", 4, [5, 6]),  # no carry: prompt == F1
        # P = c1, |F1| = 4. lcp(c3, c2) = 4: inside c2's generation (4 <= 4 < 6) but not > 4:
        # a branch from c1, not a drift against c2.
        child("c3", "c1", 4, [7, 8]),
        # One token later: lcp(c4, c2) = 5 > 4, 4 <= 5 < 6, 5 < 6 -> drift against c2 at 5.
        # (lcp(c4, c3) = 4 < |prompt c3| = 5: not inside c3's generation.)
        drift("c4", "c2", 5, [1, 2, 3, 4, 5, 9, 10], diverge_token=9, against_token=6),
    ]


@calls_case()
def drift_inside_direct_parent_not_hung_under_ancestor():
    return [
        call("c1", [1, 2], [3]),
        call("c2", [1, 2, 3, 4], [5, 6]),
        call("c3", [1, 2, 3, 4, 5, 7, 8], [9]),
    ], [
        first_root("c1", [1, 2, 3]),
        child("c2", "c1", 3, [4, 5, 6]),
        # c2 generated [5, 6]; c3's prompt renders it [5, 7]. Candidates: c1 (|F1| = 3).
        # lcp(c3, c2) = 5: 4 <= 5 < 6, 5 < 7, 5 > 3 -> drift against c2 at 5, not a child of c1
        drift("c3", "c2", 5, [1, 2, 3, 4, 5, 7, 8, 9], diverge_token=7, against_token=6),
    ]


@calls_case()
def drift_deeper_than_the_longest_candidate():
    return [
        call("c1", [1, 2], [3]),
        call("c2", [1, 2, 3, 4], [5, 6]),
        call("c3", [1, 2, 3, 4, 5, 6, 7], [8, 9]),
        call("c4", [1, 2, 3, 4, 5, 6, 7, 8, 20, 10], [11]),
    ], [
        first_root("c1", [1, 2, 3]),
        child("c2", "c1", 3, [4, 5, 6]),
        child("c3", "c2", 6, [7, 8, 9]),
        # candidates c1 (3), c2 (6) -> P = c2; c3 is not one (F3[8] = 9 != 20).
        # lcp(c4, c3) = 8: 7 <= 8 < 9, 8 < 10, 8 > 6 -> drift against c3 at 8
        drift("c4", "c3", 8, [1, 2, 3, 4, 5, 6, 7, 8, 20, 10, 11], diverge_token=20,
              against_token=9),
    ]


@calls_case()
def drift_inside_a_longer_call_that_is_not_a_descendant():
    return [
        call("c1", [1, 2], [3]),
        call("c2", [5, 6, 7, 8], [9, 10]),
        call("c3", [5, 6], [7]),
        call("c4", [5, 6, 7, 8, 9, 12], [13]),
    ], [
        first_root("c1", [1, 2, 3]),
        rewrite("c2", "c1", 0, [5, 6, 7, 8, 9, 10], diverge_token=5, against_token=1),
        # lcp c1 = 0, c2 = 2 = |prompt c3| (no departure): rewrite against c2 at 2, which is
        # past the end of c3's prompt (diverge_token None); against_token = F2[2] = 7
        rewrite("c3", "c2", 2, [5, 6, 7], diverge_token=None, against_token=7),
        # candidates: c3 (F3 = [5,6,7], 3) -> P = c3. c2 (|F2| = 6, captured before P):
        # lcp(c4, c2) = 5 (12 != 10): 4 <= 5 < 6, 5 < 6, 5 > 3 -> drift against c2 at 5
        drift("c4", "c2", 5, [5, 6, 7, 8, 9, 12, 13], diverge_token=12, against_token=10),
    ]


@calls_case()
def drift_largest_lcp_of_several_without_candidate():
    return [
        call("c1", [1, 2], [3]),
        call("c2", [1, 2, 5, 6], [7, 8]),
        call("c3", [1, 2, 5, 6, 7, 9], [10]),
    ], [
        first_root("c1", [1, 2, 3]),
        # no candidate; lcp(c2, c1) = 2: 2 <= 2 < 3, 2 < 4, 2 > 0 -> drift against c1 at 2
        drift("c2", "c1", 2, [1, 2, 5, 6, 7, 8], diverge_token=5, against_token=3),
        # no candidate. D = {c1 (lcp 2), c2 (lcp 5: 4 <= 5 < 6)} -> the largest lcp: c2 at 5
        drift("c3", "c2", 5, [1, 2, 5, 6, 7, 9, 10], diverge_token=9, against_token=8),
    ]


@calls_case()
def drift_ties_latest():
    return [
        call("c1", [1], [2, 3]),
        call("c2", [1], [2, 3]),
        call("c3", [1, 2, 4], [5]),
    ], [
        first_root("c1", [1, 2, 3]),
        retry("c2", "c1", [1, 2, 3]),
        # lcp with c1 and c2 = 2 (4 != 3): 1 <= 2 < 3, 2 < 3, 2 > 0 -> both in D, tie: c2
        drift("c3", "c2", 2, [1, 2, 4, 5], diverge_token=4, against_token=3),
    ]


@calls_case(on_drift="mask")
def on_drift_mask_touches_only_drift_roots():
    # The same calls as drift_largest_lcp_of_several_without_candidate, plus a retry, a rewrite
    # and a child: only the two drift roots get an integrity_error.
    return [
        call("c1", [1, 2], [3]),
        call("c2", [1, 2, 5, 6], [7, 8]),
        call("c3", [1, 2, 5, 6, 7, 9], [10]),
        call("c4", [1, 2], [4]),
        call("c5", [9], [9]),
        call("c6", [1, 2, 3, 4], [5]),
    ], [
        first_root("c1", [1, 2, 3]),
        drift("c2", "c1", 2, [1, 2, 5, 6, 7, 8],
              "token drift: differs from call c1's generated tokens at token 2"),
        drift("c3", "c2", 5, [1, 2, 5, 6, 7, 9, 10],
              "token drift: differs from call c2's generated tokens at token 5"),
        retry("c4", "c1", [1, 2, 4]),  # lcp with c1, c2, c3 = 2 = |prompt|; same as c1
        rewrite("c5", "c4", 0, [9, 9]),  # lcp 0 with all: the latest
        # candidates: c1 (F1 = [1,2,3]). c4: lcp 2 <= |F1|. -> child of c1
        child("c6", "c1", 3, [4, 5]),
    ]


# --------------------------------------------------------------------------------------------
# Declared parents (§8.4)
# --------------------------------------------------------------------------------------------

@calls_case()
def declared_parents_kept():
    return [
        call("c1", [1, 2], [3], parent=None),
        call("c2", [1, 2, 3, 4], [5], parent="c1"),
        call("c3", [1, 2, 3, 4, 5, 6], [7], parent="c1"),
        call("c4", [1, 2, 3, 4, 5, 6, 7, 8], [9]),
        call("c5", [1, 2, 3], [9], parent=None),
    ], [
        declared("c1", None, 0, [1, 2, 3]),  # a declared null root
        declared("c2", "c1", 3, [4, 5]),     # F1 = [1,2,3] is a prefix
        # F1 is a prefix; the longer candidate c2 (F2 = [1,2,3,4,5]) does not matter
        declared("c3", "c1", 3, [4, 5, 6, 7]),
        # inferred: candidates c1 (3), c2 (5), c3 (7) -> c3
        child("c4", "c3", 7, [8, 9]),
        # a declared null stays a root even though F1 is a prefix of its prompt
        declared("c5", None, 0, [1, 2, 3, 9], against_call=None, diverge_at=None),
    ]


@calls_case(on_drift="mask")
def declared_parent_is_not_checked_for_drift():
    return [
        call("c1", [1, 2], [3]),
        call("c2", [1, 2, 3, 4], [5, 6]),
        call("c3", [1, 2, 3, 4, 5, 7], [8], parent="c1"),
    ], [
        first_root("c1", [1, 2, 3]),
        child("c2", "c1", 3, [4, 5, 6]),
        # inferred, c3 would drift against c2 at 5 (5 > |F1| = 3); declared c1 is a prefix
        declared("c3", "c1", 3, [4, 5, 7, 8], integrity_error=None),
    ]


@calls_case()
def declared_parent_wrong():
    return [
        call("c1", [1, 2], [3]),
        call("c2", [1, 2, 4, 5], [6], parent="c1"),
        call("c3", [1, 2], [7], parent="c1"),
        call("c4", [1, 2, 4, 5, 6, 8], [9], parent="c2"),
        call("c5", [9], [9], parent="c1"),
    ], [
        first_root("c1", [1, 2, 3]),
        # lcp(c2, c1) = 2 (4 != 3): a root, the whole prompt carried
        mismatch("c2", "prompt does not extend call c1: first difference at token 2",
                 [1, 2, 4, 5, 6], "c1", 2, diverge_token=4, against_token=3, prev_len=0),
        # c3's prompt is a proper prefix of F1: k = lcp = 2 = |prompt c3|
        mismatch("c3", "prompt does not extend call c1: first difference at token 2",
                 [1, 2, 7], "c1", 2, diverge_token=None, against_token=3),
        # c2 (a declared_mismatch root) is an earlier call; F2 = [1,2,4,5,6] is a prefix
        declared("c4", "c2", 5, [8, 9]),
        mismatch("c5", "prompt does not extend call c1: first difference at token 0",
                 [9, 9], "c1", 0, diverge_token=9, against_token=1),
    ]


@calls_case()
def declared_parent_not_an_earlier_call():
    def not_earlier(p):
        return f"declared parent {p} is not an earlier, non-failed call of the rollout"

    return [
        call("x1", [1, 2], [3], rollout="o"),
        failed("c1"),
        call("c2", [1, 2], [3], parent="zz"),           # names no call
        call("c3", [1, 2, 3, 4], [5], parent="c1"),     # names only a failed call
        call("c4", [1], [2], parent="c5"),              # names a later call
        call("c5", [1, 2, 3], [4], parent="c5"),        # names itself
        call("c6", [1, 2, 3], [4], parent="x1"),        # names a call of another rollout
        call("c7", [1, 2, 3, 4, 5, 6], [7]),
    ], [
        in_rollout("o", first_root("x1", [1, 2, 3])),
        poison("c1", prompt_len=None, completion_len=None),
        mismatch("c2", not_earlier("zz"), [1, 2, 3], diverge_token=None, against_token=None),
        mismatch("c3", not_earlier("c1"), [1, 2, 3, 4, 5]),
        mismatch("c4", not_earlier("c5"), [1, 2]),
        mismatch("c5", not_earlier("c5"), [1, 2, 3, 4]),
        mismatch("c6", not_earlier("x1"), [1, 2, 3, 4]),
        # mismatch roots are earlier calls: candidates c2 ([1,2,3]), c3 ([1,2,3,4,5]),
        # c4 ([1,2]), c5 and c6 ([1,2,3,4]) -> the longest, c3, prev_len 5
        child("c7", "c3", 5, [6, 7]),
    ]


@calls_case()
def repeated_call_id_written_as_is():
    return [
        call("c1", [1, 2], [3]),
        call("c1", [1, 2], [4]),
        call("c2", [1, 2, 4, 5], [6]),
        call("c3", [1, 2, 3, 7], [8], parent="c1"),
        call("c1", [1, 2, 4, 9], [1], parent="c1"),
    ], [
        first_root("c1", [1, 2, 3]),
        retry("c1", "c1", [1, 2, 4]),  # against the first record named c1
        # candidates: the second c1 (F = [1,2,4]); the first: lcp 2 <= 3 -> child of the second
        # c1 (its chain_hash seeds this one: checked by the invariants)
        child("c2", "c1", 3, [5, 6]),
        # the latest earlier call named c1 is the second (F = [1,2,4]): lcp 2 -> mismatch,
        # even though the first c1 (F = [1,2,3]) would have fitted
        mismatch("c3", "prompt does not extend call c1: first difference at token 2",
                 [1, 2, 3, 7, 8], "c1", 2, diverge_token=3, against_token=4),
        # a third c1 declaring "c1": its own name, but an earlier record is named c1 (the
        # second, F = [1,2,4], a prefix) -> declared, prev_len 3
        declared("c1", "c1", 3, [9, 1]),
    ]


# --------------------------------------------------------------------------------------------
# Failed records (§8.5)
# --------------------------------------------------------------------------------------------

@calls_case()
def failed_records_never_parents_nor_compared():
    return [
        failed("c0"),
        call("c1", [1, 2], [3]),
        failed("c2", prompt_ids=[1, 2, 3, 4], completion_ids=[5], parent="c1",
               output_items=[assistant("lost", "msg_2")]),
        call("c3", [1, 2, 3, 4, 5, 6], [7]),
        failed("c4", prompt_ids=[1], parent=None),
        failed("c5", parent="nope", response_id="resp5"),
        call("c6", [1, 2, 3, 4], [9]),
    ], [
        poison("c0", prompt_len=None, completion_len=None, response_id="c0", item_keys=[],
               delta_len=0, gen_len=0, chain_hash=0, failed=True),
        first_root("c1", [1, 2, 3]),  # the only earlier record is failed: nothing earlier
        # written with its declared parent, unchecked; its items are keyed
        poison("c2", "c1", prompt_len=4, completion_len=1, item_ids=["msg_2"]),
        # c2 is not compared: candidates c1 only -> child of c1
        child("c3", "c1", 3, [4, 5, 6, 7]),
        poison("c4", None, prompt_len=1, completion_len=None),
        poison("c5", "nope", response_id="resp5", integrity_error=None),
        # same prompt as failed c2: no retry. lcp(c6, c3) = 4 = |prompt c6|. -> child of c1
        child("c6", "c1", 3, [4, 9]),
    ]


@calls_case()
def failed_record_alone_gives_the_logprobs_column():
    # "The logprobs column exists iff any record has completion_logprobs": a failed one too.
    return [
        call("c1", [1], [2]),
        failed("c2", prompt_ids=[1], completion_ids=[3], completion_logprobs=[-0.5]),
    ], [
        first_root("c1", [1, 2], logprobs=None),
        poison("c2"),
    ]


# --------------------------------------------------------------------------------------------
# Logprobs, rollouts
# --------------------------------------------------------------------------------------------

@calls_case()
def logprobs_on_some_records_only():
    return [
        call("c1", [1, 2], [3, 4], completion_logprobs=[-0.5, -1.0]),
        call("c2", [1, 2, 3, 4, 5], [6]),
        call("c3", [1, 2, 3, 4, 5, 6, 7], [8], completion_logprobs=None),
        call("c4", [1, 2, 3, 4, 5, 6, 7, 8, 9], [10, 11], completion_logprobs=[-0.25, -2.0]),
    ], [
        first_root("c1", [1, 2, 3, 4], logprobs=[0.0, 0.0, -0.5, -1.0]),
        child("c2", "c1", 4, [5, 6], logprobs=None),
        child("c3", "c2", 6, [7, 8], logprobs=None),
        child("c4", "c3", 8, [9, 10, 11], logprobs=[0.0, -0.25, -2.0]),  # carry 9 - 8 = 1
    ]


@calls_case()
def interleaved_rollouts():
    return [
        call("c1", [1, 2], [3], rollout="a"),
        call("c1", [1, 2], [3], rollout="b"),
        call("c2", [1, 2, 3, 4], [5], rollout="a"),
        call("c2", [1, 2, 3, 4, 6], [7], rollout="b"),
        call("c3", [1, 2, 3, 4, 5, 8], [9], rollout="a"),
    ], [
        in_rollout("a", first_root("c1", [1, 2, 3])),
        # a's c1 is not an earlier call of b: a first root, not a retry
        in_rollout("b", first_root("c1", [1, 2, 3])),
        in_rollout("a", child("c2", "c1", 3, [4, 5])),
        # within b: child of b's c1. (Compared with a's c2, F = [1,2,3,4,5], it would be a
        # drift at 4 > 3.)
        in_rollout("b", child("c2", "c1", 3, [4, 6, 7])),
        in_rollout("a", child("c3", "c2", 5, [8, 9])),
    ]


# --------------------------------------------------------------------------------------------
# Invariants and the checker
# --------------------------------------------------------------------------------------------

def _rows(x) -> list:
    return x.to_pylist() if hasattr(x, "to_pylist") else list(x)


def _F(rec: dict) -> list:
    return list(rec["prompt_ids"]) + list(rec["completion_ids"])


def _common_prefix(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _lcp(c: dict, p: dict) -> int:
    return _common_prefix(list(c["prompt_ids"]), _F(p))


def _is_failed(rec: dict) -> bool:
    return bool(rec.get("failed") or False)


def _same_f32(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return len(a) == len(b) and bool(np.all(np.asarray(a, np.float32) == np.asarray(b, np.float32)))


def token_rows_by_record(records: list, tokens: list) -> list:
    """The tokens row of each record (None for failed ones): per (rollout_id, call_id), the
    token rows in order go to that key's non-failed records in capture order."""
    queues: dict = {}
    for t in tokens:
        assert set(t) in ({"rollout_id", "call_id", "tokens"},
                          {"rollout_id", "call_id", "tokens", "logprobs"}), sorted(t)
        queues.setdefault((t["rollout_id"], t["call_id"]), []).append(t)
    out = []
    for rec in records:
        if _is_failed(rec):
            out.append(None)
            continue
        q = queues.get((rec["rollout_id"], rec["call_id"]))
        assert q, f"no tokens row for {rec['rollout_id']}/{rec['call_id']}"
        out.append(q.pop(0))
    assert not any(queues.values()), "tokens rows beyond one per non-failed record"
    return out


def _earlier(records: list, i: int) -> list:
    """Indices of the non-failed records of record i's rollout before it."""
    rid = records[i]["rollout_id"]
    return [j for j in range(i) if records[j]["rollout_id"] == rid and not _is_failed(records[j])]


def _departs(c: dict, p: dict) -> bool:
    n = _lcp(c, p)
    return n < len(c["prompt_ids"]) and len(p["prompt_ids"]) <= n < len(_F(p))


def _check_inference(records: list, i: int, rep: dict, parent: int | None, against: int | None):
    """§8.3 restated as properties of the outcome (a second, declarative reading)."""
    c, earlier = records[i], _earlier(records, i)
    cands = [j for j in earlier if _lcp(c, records[j]) == len(_F(records[j]))]
    best = max((len(_F(records[j])) for j in cands), default=None)
    floor = best if best is not None else 0
    D = [j for j in earlier if _departs(c, records[j]) and _lcp(c, records[j]) > floor]
    rel = rep["relation"]
    if D:
        top = max(_lcp(c, records[j]) for j in D)
        assert rel == "drift" and against == max(j for j in D if _lcp(c, records[j]) == top)
    elif cands:
        assert rel == "child"
        assert parent == max(j for j in cands if len(_F(records[j])) == best)
    elif not earlier:
        assert rel == "first_root"
    elif any(records[j]["prompt_ids"] == c["prompt_ids"] for j in earlier):
        assert rel == "retry"
        assert against == max(j for j in earlier if records[j]["prompt_ids"] == c["prompt_ids"])
    else:
        top = max(_lcp(c, records[j]) for j in earlier)
        assert rel == "rewrite" and against == max(j for j in earlier if _lcp(c, records[j]) == top)


def _resolve(records: list, ledger: list, i: int, call_id: str, *, prefix_len: int | None = None,
             lcp: int | None = None) -> list:
    """Earlier non-failed records of i's rollout named call_id, matching what is given."""
    c = records[i]
    out = []
    for j in _earlier(records, i):
        p = records[j]
        if p["call_id"] != call_id:
            continue
        if prefix_len is not None and not (len(_F(p)) == prefix_len
                                           and list(c["prompt_ids"][:prefix_len]) == _F(p)):
            continue
        if lcp is not None and _lcp(c, p) != lcp:
            continue
        out.append(j)
    return out


def check_calls_invariants(records: list, result, on_drift: str = "root") -> None:
    """What every output of §8 satisfies, whatever the records."""
    ledger, report, tokens = _rows(result.ledger), _rows(result.report), _rows(result.tokens)
    n = len(records)
    assert len(ledger) == n and len(report) == n, "one ledger and one report row per record"
    has_lp = any(r.get("completion_logprobs") is not None for r in records)
    assert result.has_logprobs == has_lp
    toks = token_rows_by_record(records, tokens)
    for i, (rec, led, rep, tok) in enumerate(zip(records, ledger, report, toks)):
        where = f"record {i} ({rec['rollout_id']}/{rec['call_id']})"
        assert tuple(sorted(led)) == tuple(sorted(LEDGER_COLUMNS)), f"{where}: {sorted(led)}"
        assert tuple(sorted(rep)) == tuple(sorted(REPORT_COLUMNS)), f"{where}: {sorted(rep)}"
        for row in (led, rep):
            assert (row["rollout_id"], row["call_id"]) == (rec["rollout_id"], rec["call_id"]), where
        assert rep["parent_id"] == led["parent_id"], where
        rel = rep["relation"]
        assert rel in RELATIONS, where
        assert led["failed"] is _is_failed(rec), where
        assert (rel == "failed") == _is_failed(rec), where
        rid = rec.get("response_id")
        assert led["response_id"] == (rec["call_id"] if rid is None else rid), where
        keys, ids = model_item_keys(rec.get("output_items") or [])
        assert (list(led["item_keys"]), list(led["item_ids"])) == (keys, ids), where
        prompt, completion = rec.get("prompt_ids"), rec.get("completion_ids")
        assert rep["prompt_len"] == (None if prompt is None else len(prompt)), where
        assert rep["completion_len"] == (None if completion is None else len(completion)), where

        if rel == "failed":
            assert tok is None
            assert led["parent_id"] == rec.get("parent_id"), where
            assert (led["prev_len"], led["delta_len"], led["gen_len"], led["chain_hash"]) == (0, 0, 0, 0)
            assert led["integrity_error"] is None, where
            assert (rep["against_call"], rep["diverge_at"], rep["diverge_token"],
                    rep["against_token"]) == (None, None, None, None), where
            continue

        # the row (§8.3 "Then, per §2")
        prompt, completion = list(prompt), list(completion)
        d = list(tok["tokens"])
        P = led["prev_len"]
        assert d == prompt[P:] + completion, f"{where}: delta != prompt[prev_len:] + completion"
        assert led["delta_len"] == len(d) and led["gen_len"] == len(completion), where
        if has_lp:
            lp = rec.get("completion_logprobs")
            want = None if lp is None else [0.0] * (len(prompt) - P) + list(lp)
            assert _same_f32(tok["logprobs"], want), f"{where}: logprobs {tok['logprobs']}"
        else:
            assert "logprobs" not in tok, where
        declares = "parent_id" in rec
        assert (rel in ("declared", "declared_mismatch")) == declares, where
        parent = None
        if led["parent_id"] is None:
            assert rel in ROOT_RELATIONS, where
            assert P == 0 and led["chain_hash"] == chain_hash(d, 0), where
        else:
            assert rel in ("child", "declared"), where
            # an earlier non-failed call of that name whose F is prompt[:prev_len] and whose
            # chain_hash seeds this one: the chain's deltas join to exactly prompt + completion
            found = [j for j in _resolve(records, ledger, i, led["parent_id"], prefix_len=P)
                     if led["chain_hash"] == chain_hash(d, ledger[j]["chain_hash"])]
            assert found, f"{where}: no earlier call {led['parent_id']} with F = prompt[:{P}]"
            parent = found[-1]
            if rel == "declared":
                assert led["parent_id"] == rec["parent_id"], where
                assert parent == _resolve(records, ledger, i, rec["parent_id"])[-1], where

        # against_call and diverge_at
        ac, k = rep["against_call"], rep["diverge_at"]
        if rel in ("first_root", "child", "declared"):
            assert ac is None and k is None, where
        elif rel == "retry":
            assert ac is not None and k is None, where
        elif rel in ("rewrite", "drift"):
            assert ac is not None and k is not None, where
        against = None
        if ac is not None:
            if k is None:  # retry: an earlier call with the same prompt
                named = [j for j in _resolve(records, ledger, i, ac)
                         if list(records[j]["prompt_ids"]) == prompt]
            else:
                named = _resolve(records, ledger, i, ac, lcp=k)
            if rel == "drift":
                named = [j for j in named if _departs(rec, records[j])]
            assert named, f"{where}: against_call {ac} is no earlier call with lcp {k}"
            against = named[-1]
            Fa = _F(records[against])
            assert rep["against_token"] == (Fa[k] if k is not None and k < len(Fa) else None), where
        else:
            assert rep["against_token"] is None, where
        assert rep["diverge_token"] == (prompt[k] if k is not None and k < len(prompt) else None), where

        # integrity_error
        err = led["integrity_error"]
        if rel == "drift" and on_drift == "mask":
            assert err == f"token drift: differs from call {ac}'s generated tokens at token {k}"
        elif rel == "declared_mismatch":
            p = rec["parent_id"]
            assert p is not None, where
            earlier_named = _resolve(records, ledger, i, p)
            if earlier_named:
                q = earlier_named[-1]
                assert ac == p and against == q and k == _lcp(rec, records[q]), where
                assert k < len(_F(records[q])), f"{where}: F({p}) is a prefix after all"
                assert err == f"prompt does not extend call {p}: first difference at token {k}"
            else:
                assert ac is None and k is None, where
                assert err == f"declared parent {p} is not an earlier, non-failed call of the rollout"
        else:
            assert err is None, f"{where}: integrity_error {err!r}"

        if not declares:
            _check_inference(records, i, rep, parent, against)


def check_calls_case(case: CallsCase, result) -> None:
    """Check an output of ``import_calls`` against the case and the invariants."""
    check_calls_invariants(case.records, result, case.on_drift)
    ledger, report = _rows(result.ledger), _rows(result.report)
    toks = token_rows_by_record(case.records, _rows(result.tokens))
    assert result.has_logprobs == case.has_logprobs, case.name
    for i, (e, led, rep, tok) in enumerate(zip(case.expect, ledger, report, toks)):
        where = f"{case.name}: record {i} ({e.rollout_id}/{e.call_id})"
        assert (led["rollout_id"], led["call_id"]) == (e.rollout_id, e.call_id), where
        got = (rep["relation"], led["parent_id"], rep["against_call"], rep["diverge_at"],
               led["integrity_error"])
        want = (e.relation, e.parent_id, e.against_call, e.diverge_at, e.integrity_error)
        assert got == want, f"{where}: (relation, parent_id, against_call, diverge_at, " \
                            f"integrity_error) = {got}, want {want}"
        if e.delta is None:
            assert tok is None, where
        else:
            assert led["prev_len"] == e.prev_len, f"{where}: prev_len {led['prev_len']}, want {e.prev_len}"
            assert list(tok["tokens"]) == e.delta, f"{where}: delta {tok['tokens']}, want {e.delta}"
        for key, value in e.extra.items():
            if key in LEDGER_COLUMNS:
                got_v = led[key]
            elif key in REPORT_COLUMNS:
                got_v = rep[key]
            else:
                assert key == "logprobs", key
                got_v = tok[key]
                assert _same_f32(got_v, value), f"{where}: logprobs {got_v}, want {value}"
                continue
            if isinstance(got_v, (list, tuple)):
                got_v = list(got_v)
            assert got_v == value, f"{where}: {key} = {got_v!r}, want {value!r}"


CALLS_CASE_BY_NAME = {c.name: c for c in CALLS_CASES}


# --------------------------------------------------------------------------------------------
# Random call logs (hypothesis), for the property tests
# --------------------------------------------------------------------------------------------



@st.composite
def call_logs(draw, max_records: int = 9, vocabulary: int = 3, max_new: int = 3):
    records: list = []
    for _ in range(draw(st.integers(0, max_records))):
        rollout = draw(st.sampled_from(["a", "b"]))
        mine = [r for r in records if r["rollout_id"] == rollout and "prompt_ids" in r]
        source = draw(st.sampled_from(["fresh", "full", "prompt"]) if mine else st.just("fresh"))
        if source == "fresh":
            base = []
        else:
            r = draw(st.sampled_from(mine))
            base = r["prompt_ids"] + (r["completion_ids"] if source == "full" else [])
            base = base[:draw(st.integers(0, len(base)))] if draw(st.booleans()) else base
        prompt = base + draw(st.lists(st.integers(0, vocabulary - 1), max_size=max_new))
        completion = draw(st.lists(st.integers(0, vocabulary - 1), min_size=1, max_size=max_new))
        call_id = f"c{draw(st.integers(0, 6))}"
        kind = draw(st.sampled_from(["plain"] * 6 + ["declared", "failed", "failed_bare"]))
        if kind == "failed_bare":
            records.append(failed(call_id, rollout))
            continue
        rec = call(call_id, prompt, completion, rollout)
        if kind == "failed":
            rec["failed"] = True
        if draw(st.integers(0, 3)) == 0:
            rec["completion_logprobs"] = [-0.5] * len(completion)
        if kind == "declared" or (kind == "failed" and draw(st.booleans())):
            rec["parent_id"] = draw(st.sampled_from([None, "zz"] + [f"c{k}" for k in range(7)]))
        records.append(rec)
    return records


