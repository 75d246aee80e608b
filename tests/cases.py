"""Hand-written cases of SPEC §3–§5, shared by the reference and the engine tests.

Every expected value here is derived by hand from the SPEC and docs/decisions.md (advantage
arithmetic in comments), never pasted from a run. Run a case with any function that has the
signature of ``chainrows.reference.reassemble``:

    rows, report = fn(*case.inputs(), **case.options)
    check_case(case, rows, report)

``check_case`` checks what the case expects plus the invariants every output must satisfy.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

from chainrows import reasons as R
from chainrows.reasons import DETAILS, REASONS, format_detail
from tests.support.builders import (
    LAST,
    RolloutBuilder,
    combine,
    delta_hash,
    message,
    one_call,
    single_chain,
    worked_example,
)

ROWS_COLUMNS = (
    "row_id", "rollout_id", "group_id", "segment", "num_segments", "input_ids", "loss_mask",
    "logprobs", "prompt_len", "call_ids", "reward", "advantage", "weight",
)
REPORT_COLUMNS = (
    "rollout_id", "group_id", "status", "reason", "detail", "num_rows", "num_calls",
    "num_selected", "num_roots", "loss_tokens", "reward", "advantage",
)

S = math.sqrt(0.5)  # std (ddof=1) of the rewards {1.0, 0.0}: sqrt((0.5² + 0.5²) / 1)
EPS = 1e-6
NAN = float("nan")
INF = float("inf")


# --------------------------------------------------------------------------------------------
# Case and expectation objects
# --------------------------------------------------------------------------------------------

@dataclass
class Expect:
    """What one rollout must come out as. ``rows``: when given, exactly that many rows for the
    rollout, each checked on the keys listed (placeholder rows for a masked rollout).
    ``report``: further report fields to check."""

    status: str
    reason: str | None = None
    detail: str | None = None
    detail_id: int = R.OK
    rows: list | None = None
    report: dict = field(default_factory=dict)


def ok(rows=None, **report) -> Expect:
    return Expect("ok", rows=rows, report=report)


def masked(detail_id: int, call: str | None = None, position: int | None = None, *, rows=None,
           text: str | None = None, **report) -> Expect:
    return Expect("masked", DETAILS[detail_id][0],
                  format_detail(detail_id, call_id=call, position=position, text=text), detail_id,
                  rows=rows, report=report)


@dataclass
class Case:
    name: str
    ledger: list
    tokens: list
    rollouts: list
    expect: dict  # rollout_id -> Expect, for every rollout id seen in any table
    options: dict = field(default_factory=dict)

    def inputs(self):
        """Fresh deep copies of (ledger, tokens, rollouts)."""
        return copy.deepcopy((self.ledger, self.tokens, self.rollouts))

    @property
    def has_logprobs(self) -> bool:
        lp = self.options.get("logprobs")
        if lp is None:
            lp = bool(self.tokens) and "logprobs" in self.tokens[0]
        return bool(lp)


CASES: list = []


def case(**options):
    """Decorator: the function returns (data, expect); data is a builder, a list of builders
    or a (ledger, tokens, rollouts) triple; the case is named after the function."""

    def register(fn):
        data, expect = fn()
        if isinstance(data, RolloutBuilder):
            data = [data]
        if isinstance(data, list):
            data = combine(*data)
        ledger, tokens, rollouts = data
        assert fn.__name__ not in {c.name for c in CASES}, fn.__name__
        CASES.append(Case(fn.__name__, ledger, tokens, rollouts, expect, dict(options)))
        return fn

    return register


def without_record(b: RolloutBuilder):
    """The builder's ledger and tokens, with no rollouts row."""
    ledger, tokens, _ = b.build()
    return ledger, tokens, []


# Rows of the worked example (rollout "wx"), spelled out from builders.WX_TOKENS.
WX_S0 = dict(row_id="wx_s0", segment=0, num_segments=2, call_ids=["c1", "c2"],
             input_ids=[1, 2, 3, 10, 11, 4, 12, 13], loss_mask=[0, 0, 0, 1, 1, 0, 1, 1],
             prompt_len=3, weight=0.5)
WX_S1 = dict(row_id="wx_s1", segment=1, num_segments=2, call_ids=["c3", "c5"],
             input_ids=[5, 6, 14, 8, 9, 17, 18, 19], loss_mask=[0, 0, 1, 0, 0, 1, 1, 1],
             prompt_len=2, weight=0.5)
WX_S1_C4 = dict(row_id="wx_s1", segment=1, num_segments=2, call_ids=["c3", "c4"],
                input_ids=[5, 6, 14, 8, 9, 15, 16], loss_mask=[0, 0, 1, 0, 0, 1, 1],
                prompt_len=2, weight=0.5)
# single_chain(): c1 [1,2|3,4], c2 [5|6], c3 [7,8|9]  (carry|generated)
SC_ROW = dict(row_id="sc_s0", segment=0, num_segments=1, call_ids=["c1", "c2", "c3"],
              input_ids=[1, 2, 3, 4, 5, 6, 7, 8, 9], loss_mask=[0, 0, 1, 1, 0, 1, 0, 0, 1],
              prompt_len=2, weight=1.0)


# --------------------------------------------------------------------------------------------
# The worked example and plain ok rollouts
# --------------------------------------------------------------------------------------------

@case()
def worked_example_cc():
    # Selection [c1, c2, c3, c5]; cut -> [c1, c2], [c3, c5]; c4 never trained.
    # Alone in its group: population of one -> advantage 0.
    return worked_example(), {"wx": ok(
        [dict(WX_S0, rollout_id="wx", group_id="g", reward=1.0, advantage=0.0),
         dict(WX_S1, rollout_id="wx", group_id="g", reward=1.0, advantage=0.0)],
        num_rows=2, num_calls=5, num_selected=4, num_roots=2, loss_tokens=2 + 2 + 1 + 3,
        reward=1.0, advantage=0.0, group_id="g", reason=None, detail=None)}


@case(mode="ordinary")
def worked_example_ordinary():
    e = masked(R.D_MULTIPLE_ROOTS, num_selected=0, num_roots=2, num_calls=5, num_rows=0,
               loss_tokens=0)
    assert e.reason == "multiple_roots" and e.detail == "ledger holds more than one root"
    return worked_example(), {"wx": e}


@case()
def worked_example_logprobs():
    # Carry logprobs 0.0, generated -0.5, -1.0, -1.5, ... per call (builders.gen_logprobs).
    return worked_example(logprobs=True), {"wx": ok([
        dict(WX_S0, logprobs=[0.0, 0.0, 0.0, -0.5, -1.0, 0.0, -0.5, -1.0]),
        dict(WX_S1, logprobs=[0.0, 0.0, -0.5, 0.0, 0.0, -0.5, -1.0, -1.5]),
    ], loss_tokens=8)}


@case(logprobs=False)
def worked_example_logprobs_option_off():
    # logprobs=False: the column is treated as absent (no rows.logprobs, no checks 13/15 on it).
    b = worked_example(logprobs=True)
    b.token_row("c2")["logprobs"] = None
    return b, {"wx": ok([WX_S0, WX_S1])}


@case(row_weight="row")
def worked_example_row_weight_row():
    return worked_example(), {"wx": ok([dict(WX_S0, weight=1.0), dict(WX_S1, weight=1.0)])}


@case()
def single_chain_cc():
    # Selection [c1, c2, c3], one chain: the same row as ordinary capture.
    return single_chain(), {"sc": ok([SC_ROW], num_selected=3, num_roots=1, loss_tokens=4)}


@case(mode="ordinary")
def single_chain_ordinary():
    return single_chain(), {"sc": ok([SC_ROW], num_selected=3, num_roots=1, loss_tokens=4)}


@case(mode="ordinary")
def single_chain_ordinary_no_terminal():
    # No terminal_response_id: the unique leaf c3.
    return single_chain(terminal=None), {"sc": ok([SC_ROW], num_selected=3)}


@case(mode="ordinary")
def ordinary_terminal_mid_chain():
    # The terminal is the call named by terminal_response_id, even with a child after it;
    # c3 is then not verified (its hash is broken) and not trained.
    b = single_chain(terminal="resp-c2")
    b.ledger_row("c3")["chain_hash"] ^= 1
    return b, {"sc": ok([dict(row_id="sc_s0", call_ids=["c1", "c2"], input_ids=[1, 2, 3, 4, 5, 6],
                              loss_mask=[0, 0, 1, 1, 0, 1], prompt_len=2, weight=1.0)],
                        num_selected=2, loss_tokens=3, num_calls=3)}


@case(mode="ordinary")
def ordinary_ignores_output():
    # Ordinary mode skips steps 5-10: an empty output is fine.
    b = single_chain()
    b.record["output_keys"], b.record["output_ids"] = [], []
    return b, {"sc": ok([SC_ROW])}


@case()
def interleaved_ledger():
    # Rows of different rollouts may interleave; capture order is per rollout.
    w1, w2 = worked_example("w1"), worked_example("w2")
    l1, t1, r1 = w1.build()
    l2, t2, r2 = w2.build()
    ledger = [row for pair in zip(l1, l2) for row in pair]
    return (ledger, t2 + t1, r2 + r1), {"w1": ok([dict(WX_S0, row_id="w1_s0"), dict(WX_S1, row_id="w1_s1")]),
                                        "w2": ok([dict(WX_S0, row_id="w2_s0"), dict(WX_S1, row_id="w2_s1")])}


@case()
def sort_order_utf8_bytes():
    # Report and rows sorted by the ids' UTF-8 bytes: "Z" < "a" < "a_1" < "b" < "é".
    ids = ["é", "b", "a_1", "Z", "a"]
    return [one_call(i, group_id=None) for i in ids], {i: ok(num_rows=1) for i in ids}


# --------------------------------------------------------------------------------------------
# Steps 1-4b: rollout level
# --------------------------------------------------------------------------------------------

@case()
def no_rollout_record_ledger_only():
    lost = RolloutBuilder("lost")
    lost.call("c1", None, [1], [2], [message("x")])
    return [without_record(lost), worked_example()], {
        "lost": masked(R.D_NO_ROLLOUT_RECORD, group_id=None, reward=None, advantage=None,
                       num_calls=1, num_roots=1, num_selected=0),
        "wx": ok(num_rows=2)}


@case()
def no_rollout_record_tokens_only():
    ghost = {"rollout_id": "ghost", "call_id": "c1", "tokens": [1, 2]}
    ledger, tokens, rollouts = worked_example().build()
    return (ledger, tokens + [ghost], rollouts), {
        "ghost": masked(R.D_NO_ROLLOUT_RECORD, group_id=None, reward=None, advantage=None,
                        num_calls=0, num_roots=0),
        "wx": ok(num_rows=2)}


@case()
def no_rollout_record_beats_capture_failed():
    lost = RolloutBuilder("lost")
    lost.call("c1", None, [1], [2], [message("x")], failed=True)
    return without_record(lost), {"lost": masked(R.D_NO_ROLLOUT_RECORD)}


@case()
def no_calls():
    # A rollouts row (and a stray token row) but no ledger call. Alone in group "g2": A = 0.
    empty = RolloutBuilder("empty", group_id="g2", reward=0.25)
    ledger, tokens, rollouts = empty.build()
    tokens.append({"rollout_id": "empty", "call_id": "c1", "tokens": [1]})
    return (ledger, tokens, rollouts), {
        "empty": masked(R.D_NO_CALLS, num_calls=0, group_id="g2", reward=0.25, advantage=0.0)}


@case()
def capture_failed_unselected_call():
    # Poison rows mask the rollout even when the call would not be selected.
    b = worked_example()
    b.ledger_row("c4")["failed"] = True
    return b, {"wx": masked(R.D_CAPTURE_FAILED, "c4", num_calls=5, num_selected=0)}


@case()
def capture_failed_first_in_capture_order():
    b = worked_example()
    b.ledger_row("c4")["failed"] = True
    b.ledger_row("c2")["failed"] = True
    return b, {"wx": masked(R.D_CAPTURE_FAILED, "c2")}


@case()
def capture_failed_beats_reward_invalid():
    b = worked_example(reward=NAN)
    b.ledger_row("c3")["failed"] = True
    return b, {"wx": masked(R.D_CAPTURE_FAILED, "c3", advantage=None)}


@case()
def reward_null():
    return worked_example(reward=None), {"wx": masked(R.D_REWARD_NULL, reward=None, advantage=None)}


@case()
def reward_nan():
    return worked_example(reward=NAN), {"wx": masked(R.D_REWARD_NAN, reward=NAN, advantage=None)}


@case()
def reward_inf():
    return worked_example(reward=INF), {"wx": masked(R.D_REWARD_INF, reward=INF, advantage=None)}


@case()
def reward_negative_inf():
    return worked_example(reward=-INF), {"wx": masked(R.D_REWARD_INF, reward=-INF, advantage=None)}


@case()
def reward_invalid_beats_duplicate_call():
    b = worked_example(reward=None)
    b.duplicate_record()
    b.ledger.append(dict(b.ledger_row("c2"), response_id="resp-c2-again"))
    return b, {"wx": masked(R.D_REWARD_NULL)}


@case()
def duplicate_rollouts_row():
    # Only the first rollouts row of "dup" counts, for the advantage too: its second row
    # (group "other", reward 5.0) is ignored. Group g, population {dup: 1.0, b: 0.0}:
    # mean 0.5, std S = sqrt(0.5); A(dup) = 0.5 / (S + 1e-6), A(b) = -0.5 / (S + 1e-6).
    dup = one_call("dup", "g", 1.0)
    dup.duplicate_record(group_id="other", reward=5.0)
    return [dup, one_call("b", "g", 0.0)], {
        "dup": masked(R.D_DUP_ROLLOUT, group_id="g", reward=1.0, advantage=0.5 / (S + EPS)),
        "b": ok(advantage=-0.5 / (S + EPS), reward=0.0)}


@case()
def duplicate_call_id():
    b = worked_example()
    b.ledger.append(dict(b.ledger_row("c2"), response_id="resp-c2-again"))
    return b, {"wx": masked(R.D_DUP_CALL_ID, "c2", num_calls=6)}


@case()
def duplicate_response_id():
    b = worked_example()
    b.ledger_row("c4")["response_id"] = "resp-c2"
    return b, {"wx": masked(R.D_DUP_RESPONSE_ID, "c4")}


@case()
def duplicate_call_id_checked_before_response_id():
    # The response_id repeat (at c4) comes earlier in capture order than the call_id repeat
    # (the second c5), but call_ids are checked first.
    b = worked_example()
    b.ledger_row("c4")["response_id"] = "resp-c1"
    b.ledger.append(dict(b.ledger_row("c5"), response_id="resp-c5-again"))
    return b, {"wx": masked(R.D_DUP_CALL_ID, "c5")}


@case()
def duplicate_rollouts_row_beats_call_id():
    b = worked_example()
    b.duplicate_record()
    b.ledger.append(dict(b.ledger_row("c2"), response_id="resp-c2-again"))
    return b, {"wx": masked(R.D_DUP_ROLLOUT)}


@case()
def duplicate_token_rows():
    b = worked_example()
    b.duplicate_tokens("c3")
    return b, {"wx": masked(R.D_DUP_TOKEN_ROW, "c3")}


@case()
def duplicate_token_rows_unselected_call():
    b = worked_example()
    b.duplicate_tokens("c4")
    return b, {"wx": masked(R.D_DUP_TOKEN_ROW, "c4")}


@case()
def duplicate_token_rows_first_in_capture_order():
    b = worked_example()
    b.duplicate_tokens("c5")  # appended to the tokens table first...
    b.duplicate_tokens("c2")  # ...but c2 is earlier in capture order
    return b, {"wx": masked(R.D_DUP_TOKEN_ROW, "c2")}


@case()
def orphan_token_rows_ignored():
    b = worked_example()
    b.tokens.append({"rollout_id": "wx", "call_id": "zz", "tokens": [1, 2, 3]})
    b.tokens.append({"rollout_id": "wx", "call_id": "zz", "tokens": [4]})
    return b, {"wx": ok([WX_S0, WX_S1])}


@case()
def output_ids_length():
    b = worked_example()
    b.record["output_ids"] = b.record["output_ids"][:-1]
    return b, {"wx": masked(R.D_LEN_OUTPUT_IDS)}


@case()
def item_ids_length():
    b = worked_example()
    b.ledger_row("c3")["item_ids"] = ["rs_3"]
    return b, {"wx": masked(R.D_LEN_ITEM_IDS, "c3")}


@case()
def item_ids_length_unselected_call():
    b = worked_example()
    b.ledger_row("c4")["item_ids"] = ["rs_4", "msg_4", "extra"]
    return b, {"wx": masked(R.D_LEN_ITEM_IDS, "c4")}


@case()
def output_ids_checked_before_item_ids():
    b = worked_example()
    b.ledger_row("c1")["item_ids"] = ["rs_1"]
    b.record["output_ids"] = b.record["output_ids"] + ["x"]
    return b, {"wx": masked(R.D_LEN_OUTPUT_IDS)}


@case()
def duplicate_call_beats_length_mismatch_4b():
    b = worked_example()
    b.ledger_row("c4")["response_id"] = "resp-c1"
    b.record["output_ids"] = b.record["output_ids"][:-1]
    return b, {"wx": masked(R.D_DUP_RESPONSE_ID, "c4")}


@case()
def length_mismatch_4b_beats_no_output():
    b = worked_example()
    b.record["output_keys"], b.record["output_ids"] = [], ["msg_1"]
    return b, {"wx": masked(R.D_LEN_OUTPUT_IDS)}


@case()
def null_id_lists():
    # Null item_ids / output_ids lists: every id null; distinct contents still select uniquely.
    b = worked_example()
    b.null_ids()
    return b, {"wx": ok([WX_S0, WX_S1])}


# --------------------------------------------------------------------------------------------
# Steps 5-9: selection
# --------------------------------------------------------------------------------------------

@case()
def no_output():
    b = worked_example()
    b.record["output_keys"], b.record["output_ids"] = [], []
    return b, {"wx": masked(R.D_NO_OUTPUT, num_selected=0)}


@case()
def no_output_null_lists():
    b = worked_example()
    b.record["output_keys"], b.record["output_ids"] = None, None
    return b, {"wx": masked(R.D_NO_OUTPUT)}


@case()
def unmatched_foreign_item():
    # Output positions: c1 0-1, c2 2-3, c3 4-5, c5 6-7. Item 7 is no call's.
    b = worked_example()
    b.record["output_keys"][7] = 12345
    return b, {"wx": masked(R.D_UNMATCHED, position=6, num_selected=0)}


@case()
def unmatched_partial_call():
    # The output ends after c5's reasoning item: a whole call must match.
    b = worked_example()
    b.record["output_keys"] = b.record["output_keys"][:7]
    b.record["output_ids"] = b.record["output_ids"][:7]
    return b, {"wx": masked(R.D_UNMATCHED, position=6)}


@case()
def unmatched_trailing_item():
    b = worked_example()
    b.output(["c1", "c2", "c3", "c5"], extra=[(777, None)])
    return b, {"wx": masked(R.D_UNMATCHED, position=8)}


@case()
def unmatched_by_id_filter():
    # c5's keys match at 6, but output id 7 is "msg_4", served by c4 and not by c5.
    b = worked_example()
    b.record["output_ids"][7] = "msg_4"
    return b, {"wx": masked(R.D_UNMATCHED, position=6)}


@case()
def unknown_output_id_ignored():
    b = worked_example()
    b.record["output_ids"][7] = "msg_nobody_served"
    return b, {"wx": ok([WX_S0, WX_S1])}


@case()
def output_id_matches_at_any_position():
    b = worked_example()
    b.record["output_ids"][6:8] = ["msg_5", "rs_5"]
    return b, {"wx": ok([WX_S0, WX_S1])}


@case()
def empty_item_calls_are_not_candidates():
    # c2 produced no keyed item, so it can never be selected: selection [c1, c3] and c3's
    # parent c2 is not the selected call before it.
    b = RolloutBuilder("e")
    b.call("c1", None, [1], [2], [message("one", "msg_1")])
    b.call("c2", "c1", [3], [4], [])
    b.call("c3", "c2", [5], [6], [message("three", "msg_3")])
    b.output(["c1", "c3"])
    b.ledger_row("c2")["item_keys"], b.ledger_row("c2")["item_ids"] = None, None
    return b, {"e": masked(R.D_PARENT_NOT_PREVIOUS, "c3", num_selected=2)}


@case(mode="ordinary")
def empty_item_call_ordinary_ok():
    b = RolloutBuilder("e")
    b.call("c1", None, [1], [2], [message("one", "msg_1")])
    b.call("c2", "c1", [3], [4], [])
    b.call("c3", "c2", [5], [6], [message("three", "msg_3")])
    b.output(["c1", "c3"])
    return b, {"e": ok([dict(call_ids=["c1", "c2", "c3"], input_ids=[1, 2, 3, 4, 5, 6],
                             loss_mask=[0, 1, 0, 1, 0, 1], prompt_len=1)], num_selected=3)}


@case()
def ambiguous_twins_without_ids():
    # c4 and c5 produced the same items; no ids, no terminal: two survivors at 6, no
    # identified call to disambiguate.
    b = worked_example(twin=True, terminal=None)
    b.null_ids()
    return b, {"wx": masked(R.D_AMBIGUOUS, position=6, num_selected=0)}


@case()
def twins_resolved_by_terminal():
    # Identified: c5 (terminal). Ancestor-or-self of c5: {c5, c3}; of the survivors {c4, c5}
    # exactly c5.
    b = worked_example(twin=True)
    b.null_ids()
    return b, {"wx": ok([WX_S0, WX_S1])}


@case()
def twins_terminal_names_the_retry():
    # The harness declares c4 final: c4 is kept (and is then the last selected call).
    b = worked_example(twin=True, terminal="resp-c4")
    b.null_ids()
    return b, {"wx": ok([WX_S0, WX_S1_C4], loss_tokens=2 + 2 + 1 + 2)}


@case()
def twins_resolved_by_id_filter():
    # With served ids, output ids rs_5/msg_5 exclude c4 (filter 1).
    b = worked_example(twin=True, terminal=None)
    return b, {"wx": ok([WX_S0, WX_S1])}


@case()
def twins_neither_in_lineage():
    # Identified: c2 (terminal) -> lineage {c2, c1}: neither twin, so still ambiguous
    # (step 6 fails before the terminal check of step 8).
    b = worked_example(twin=True, terminal="resp-c2")
    b.null_ids()
    return b, {"wx": masked(R.D_AMBIGUOUS, position=6)}


def _later_id_example(with_later_id: bool) -> RolloutBuilder:
    # c1 root; c2a and c2b children of c1 with the same item; c3 child of c2b. No ids except
    # c3's served id msg_3.
    b = RolloutBuilder("li")
    b.call("c1", None, [1], [2], [message("one")], item_ids=None)
    b.call("c2a", "c1", [3], [4], [message("same")], item_ids=None)
    b.call("c2b", "c1", [3], [5], [message("same")], item_ids=None)
    b.call("c3", "c2b", [6], [7], [message("three", "msg_3")])
    b.output(["c1", "c2b", "c3"], terminal=None, ids=with_later_id)
    return b


@case()
def twins_resolved_by_later_output_id():
    # Output ids [None, None, "msg_3"]: the window at 1 has no id, so filter 1 keeps c2a and
    # c2b; msg_3 identifies c3, whose ancestors-or-self {c3, c2b, c1} contain only c2b.
    return _later_id_example(True), {"li": ok(
        [dict(row_id="li_s0", call_ids=["c1", "c2b", "c3"], input_ids=[1, 2, 3, 5, 6, 7],
              loss_mask=[0, 1, 0, 1, 0, 1], prompt_len=1, weight=1.0, num_segments=1)],
        num_selected=3, num_roots=1, num_calls=4)}


@case()
def twins_unresolved_without_later_output_id():
    return _later_id_example(False), {"li": masked(R.D_AMBIGUOUS, position=1)}


@case()
def ambiguous_both_survivors_in_lineage():
    # c1 and its child c2 produced the same item. Terminal c2 -> lineage {c2, c1}: both
    # survivors at 0 are ancestors-or-self of it.
    b = RolloutBuilder("rep")
    b.call("c1", None, [1], [2], [message("again")], item_ids=None)
    b.call("c2", "c1", [3], [4], [message("again")], item_ids=None)
    b.output(["c1", "c2"])
    return b, {"rep": masked(R.D_AMBIGUOUS, position=0)}


@case()
def accepted_matches_selection():
    b = worked_example()
    b.output(["c1", "c2", "c3", "c5"], accepted_calls=["c1", "c2", "c3", "c5"])
    return b, {"wx": ok([WX_S0, WX_S1])}


@case()
def accepted_resolves_twins():
    b = worked_example(twin=True)
    b.null_ids()
    b.output(["c1", "c2", "c3", "c5"], ids=False, terminal=None,
             accepted_calls=["c1", "c2", "c3", "c5"])
    return b, {"wx": ok([WX_S0, WX_S1])}


@case()
def accepted_picks_the_retry_twin():
    b = worked_example(twin=True)
    b.null_ids()
    b.output(["c1", "c2", "c3", "c5"], ids=False, terminal=None,
             accepted_calls=["c1", "c2", "c3", "c4"])
    return b, {"wx": ok([WX_S0, WX_S1_C4])}


@case()
def accepted_filter_leaves_no_survivor():
    # At 6 only c5's keys match, but the next accepted call is c4.
    b = worked_example()
    b.output(["c1", "c2", "c3", "c5"], accepted_calls=["c1", "c2", "c3", "c4"])
    return b, {"wx": masked(R.D_UNMATCHED, position=6)}


@case()
def accepted_consumed_early():
    b = worked_example()
    b.output(["c1", "c2", "c3", "c5"], accepted_calls=["c1", "c2"])
    return b, {"wx": masked(R.D_UNMATCHED, position=4)}


@case()
def accepted_names_no_call():
    b = worked_example()
    b.output(["c1", "c2", "c3", "c5"], accepted=["resp-c1", "resp-nope", "resp-c3", "resp-c5"])
    return b, {"wx": masked(R.D_UNMATCHED, position=2)}


@case()
def accepted_empty_list():
    b = worked_example()
    b.output(["c1", "c2", "c3", "c5"], accepted=[])
    return b, {"wx": masked(R.D_UNMATCHED, position=0)}


@case()
def accepted_longer_than_selection():
    b = worked_example()
    b.output(["c1", "c2", "c3", "c5"], accepted_calls=["c1", "c2", "c3", "c5", "c4"])
    return b, {"wx": masked(R.D_ACCEPTED, num_selected=4)}


@case()
def accepted_null_means_not_given():
    a = worked_example("a")
    a.output(["c1", "c2", "c3", "c5"], accepted_calls=["c1", "c2", "c3", "c5"])
    n = worked_example("n")
    n.record["accepted_response_ids"] = None
    return [a, n], {"a": ok(num_rows=2), "n": ok(num_rows=2)}


@case()
def out_of_order_swapped_chains():
    # Selection [c3, c5, c1, c2], capture indices 2, 4, 0, 1: c1 is the first not after its
    # predecessor. Selection completed, so num_selected = 4.
    b = worked_example()
    b.output(["c3", "c5", "c1", "c2"])
    return b, {"wx": masked(R.D_OUT_OF_ORDER, "c1", num_selected=4)}


@case()
def out_of_order_repeated_selection():
    b = worked_example()
    b.output(["c1", "c1"])
    return b, {"wx": masked(R.D_OUT_OF_ORDER, "c1", num_selected=2)}


@case()
def capture_order_is_table_order():
    # c2's ledger row comes before c1's: capture order c2, c1, c3, c4, c5.
    b = worked_example()
    b.ledger[0], b.ledger[1] = b.ledger[1], b.ledger[0]
    return b, {"wx": masked(R.D_OUT_OF_ORDER, "c2")}


@case()
def unmatched_beats_out_of_order():
    b = worked_example()
    b.output(["c3", "c5", "c1"], extra=[(777, None)])
    return b, {"wx": masked(R.D_UNMATCHED, position=6, num_selected=0)}


@case()
def out_of_order_beats_terminal_mismatch():
    b = worked_example()
    b.output(["c3", "c5", "c1", "c2"], terminal="resp-c5")
    return b, {"wx": masked(R.D_OUT_OF_ORDER, "c1")}


@case()
def terminal_not_last_selected():
    b = worked_example(terminal="resp-c2")
    return b, {"wx": masked(R.D_TERMINAL_NOT_LAST, num_selected=4)}


@case()
def terminal_names_no_call_cc():
    b = worked_example(terminal="resp-nope")
    return b, {"wx": masked(R.D_TERMINAL_NOT_LAST)}


@case()
def terminal_mismatch_beats_accepted_mismatch():
    b = worked_example()
    b.output(["c1", "c2", "c3", "c5"], terminal="resp-c2",
             accepted_calls=["c1", "c2", "c3", "c5", "c4"])
    return b, {"wx": masked(R.D_TERMINAL_NOT_LAST)}


@case()
def accepted_mismatch_beats_broken_chain():
    b = worked_example()
    b.output(["c2"], terminal=None, accepted_calls=["c2", "c3"])
    return b, {"wx": masked(R.D_ACCEPTED, num_selected=1)}


# --------------------------------------------------------------------------------------------
# Step 10: cut
# --------------------------------------------------------------------------------------------

@case()
def broken_chain_first_not_root():
    b = worked_example()
    b.output(["c2"])
    return b, {"wx": masked(R.D_FIRST_NOT_ROOT, "c2", num_selected=1)}


@case()
def broken_chain_parent_not_previous():
    b = worked_example()
    b.output(["c1", "c5"])
    return b, {"wx": masked(R.D_PARENT_NOT_PREVIOUS, "c5", num_selected=2)}


@case()
def broken_chain_beats_missing_tokens():
    b = worked_example()
    b.output(["c1", "c5"])
    b.drop_tokens("c1")
    return b, {"wx": masked(R.D_PARENT_NOT_PREVIOUS, "c5")}


# Step 10f: the forest cut (SPEC §3.1). Forks and shared calls are in tests/engine/test_forest.py: their
# rows break this file's invariants (a shared root's prompt tokens carry no loss in later rows).

@case(plan="forest")
def forest_worked_example():
    # The linear plan accepts it, so the forest plan gives the same rows and report.
    return worked_example(), {"wx": ok(
        [dict(WX_S0, rollout_id="wx", group_id="g", reward=1.0, advantage=0.0),
         dict(WX_S1, rollout_id="wx", group_id="g", reward=1.0, advantage=0.0)],
        num_rows=2, num_calls=5, num_selected=4, num_roots=2, loss_tokens=2 + 2 + 1 + 3,
        reward=1.0, advantage=0.0, group_id="g", reason=None, detail=None)}


@case(plan="forest")
def forest_broken_chain_first_not_root():
    b = worked_example()
    b.output(["c2"])
    return b, {"wx": masked(R.D_FIRST_NOT_ROOT, "c2", num_selected=1)}


@case(plan="forest")
def forest_broken_chain_parent_not_selected():
    b = worked_example()
    b.output(["c1", "c5"])  # c5's parent c3 is not selected
    return b, {"wx": masked(R.D_PARENT_NOT_SELECTED_BEFORE, "c5", num_selected=2)}


@case(plan="forest")
def forest_broken_chain_beats_missing_tokens():
    b = worked_example()
    b.output(["c1", "c5"])
    b.drop_tokens("c1")
    return b, {"wx": masked(R.D_PARENT_NOT_SELECTED_BEFORE, "c5")}


# --------------------------------------------------------------------------------------------
# Ordinary mode
# --------------------------------------------------------------------------------------------

@case(mode="ordinary")
def multiple_roots_beats_terminal_no_call():
    return worked_example(terminal="resp-nope"), {"wx": masked(R.D_MULTIPLE_ROOTS)}


@case(mode="ordinary")
def ordinary_terminal_names_no_call():
    return single_chain(terminal="resp-nope"), {"sc": masked(R.D_TERMINAL_NO_CALL, num_selected=0)}


def _fork(terminal) -> RolloutBuilder:
    b = RolloutBuilder("fork")
    b.call("c1", None, [1], [2], [message("one")])
    b.call("c2", "c1", [3], [4], [message("two")])
    b.call("c3", "c1", [3], [5], [message("three")])
    b.output(["c1", "c3"], terminal=terminal)
    return b


@case(mode="ordinary")
def ordinary_several_leaves():
    return _fork(None), {"fork": masked(R.D_SEVERAL_LEAVES, num_roots=1, num_selected=0)}


@case(mode="ordinary")
def ordinary_several_leaves_with_terminal():
    # Terminal c3: chain [c1, c3]; c2 is not verified (broken hash) and not trained.
    b = _fork(LAST)
    b.ledger_row("c2")["chain_hash"] ^= 1
    return b, {"fork": ok([dict(call_ids=["c1", "c3"], input_ids=[1, 2, 3, 5],
                                loss_mask=[0, 1, 0, 1], prompt_len=1, weight=1.0)],
                          num_selected=2, num_calls=3, loss_tokens=2)}


@case(mode="ordinary")
def ordinary_no_leaf():
    # c1 -> c2 -> c1: zero roots (not multiple_roots), every call is a parent.
    b = RolloutBuilder("cyc")
    b.call("c1", "c2", [1], [2], [message("one")])
    b.call("c2", "c1", [3], [4], [message("two")])
    b.output(["c1", "c2"], terminal=None)
    return b, {"cyc": masked(R.D_NO_LEAF, num_roots=0, num_selected=0)}


@case(mode="ordinary")
def ordinary_walk_missing_parent():
    b = RolloutBuilder("orph")
    b.call("c1", "c0", [1], [2], [message("one")])
    b.output(["c1"], terminal=None)
    return b, {"orph": masked(R.D_WALK_MISSING_PARENT, "c1", num_roots=0, num_selected=0)}


@case(mode="ordinary")
def ordinary_walk_cycle():
    # Leaf c3 -> c2 -> c1 -> c2 (already visited): named call c1, whose parent was visited.
    b = RolloutBuilder("cyc")
    b.call("c1", "c2", [1], [2], [message("one")])
    b.call("c2", "c1", [3], [4], [message("two")])
    b.call("c3", "c2", [5], [6], [message("three")])
    b.output(["c3"], terminal=None)
    return b, {"cyc": masked(R.D_WALK_CYCLE, "c1", num_selected=0)}


@case(mode="ordinary")
def ordinary_missing_tokens():
    # The walk reached the root, so num_selected = 3.
    b = single_chain()
    b.drop_tokens("c2")
    return b, {"sc": masked(R.D_MISSING_TOKENS, "c2", num_selected=3)}


# --------------------------------------------------------------------------------------------
# Steps 12-15, per call
# --------------------------------------------------------------------------------------------

@case()
def missing_tokens():
    b = worked_example()
    b.drop_tokens("c2")
    return b, {"wx": masked(R.D_MISSING_TOKENS, "c2", num_selected=4)}


@case()
def missing_tokens_of_unselected_call_ok():
    b = worked_example()
    b.drop_tokens("c4")
    return b, {"wx": ok([WX_S0, WX_S1])}


@case()
def broken_unselected_call_ok():
    # Only selected calls are verified: c4's hash, lengths and logprobs are all broken.
    b = worked_example(logprobs=True)
    b.ledger_row("c4")["chain_hash"] ^= 1
    b.ledger_row("c4")["gen_len"] = 0
    b.token_row("c4")["logprobs"] = [NAN]
    return b, {"wx": ok(num_rows=2, num_calls=5, num_selected=4)}


@case()
def length_tokens_vs_delta_len():
    b = worked_example()
    b.ledger_row("c5")["delta_len"] = 6
    return b, {"wx": masked(R.D_LEN_TOKENS, "c5")}


@case()
def null_tokens_read_as_empty():
    b = worked_example()
    b.token_row("c2")["tokens"] = None
    return b, {"wx": masked(R.D_LEN_TOKENS, "c2")}


@case()
def length_beats_hash():
    # An extra token breaks both the length and the hash of c2: length (13) first.
    b = worked_example()
    b.token_row("c2")["tokens"].append(99)
    return b, {"wx": masked(R.D_LEN_TOKENS, "c2")}


@case()
def gen_len_zero():
    b = worked_example()
    b.ledger_row("c3")["gen_len"] = 0
    return b, {"wx": masked(R.D_LEN_GEN, "c3")}


@case()
def gen_len_beyond_delta_len():
    b = worked_example()
    b.ledger_row("c3")["gen_len"] = 4  # delta_len 3
    return b, {"wx": masked(R.D_LEN_GEN, "c3")}


@case()
def root_prev_len_nonzero():
    b = worked_example()
    b.ledger_row("c3")["prev_len"] = 7
    return b, {"wx": masked(R.D_LEN_ROOT_PREV, "c3")}


@case()
def child_prev_len_wrong():
    b = worked_example()
    b.ledger_row("c2")["prev_len"] = 4  # c1: prev_len 0 + delta_len 5
    return b, {"wx": masked(R.D_LEN_CHILD_PREV, "c2")}


@case()
def length_subchecks_in_spec_order():
    b = worked_example()
    b.ledger_row("c2")["prev_len"] = 4
    b.ledger_row("c2")["gen_len"] = 0
    return b, {"wx": masked(R.D_LEN_GEN, "c2")}


@case()
def logprobs_null():
    b = worked_example(logprobs=True)
    b.token_row("c2")["logprobs"] = None
    return b, {"wx": masked(R.D_LEN_LOGPROBS, "c2")}


@case()
def logprobs_short():
    b = worked_example(logprobs=True)
    b.token_row("c2")["logprobs"].pop()
    return b, {"wx": masked(R.D_LEN_LOGPROBS, "c2")}


@case()
def hash_recorded_wrong():
    b = worked_example()
    b.ledger_row("c5")["chain_hash"] ^= 1
    return b, {"wx": masked(R.D_HASH, "c5")}


@case()
def hash_token_changed():
    b = worked_example()
    b.token_row("c1")["tokens"][0] = 99
    return b, {"wx": masked(R.D_HASH, "c1")}


@case()
def hash_not_seeded_with_parent():
    b = worked_example()
    b.ledger_row("c2")["chain_hash"] = delta_hash(b.delta("c2"), 0)
    return b, {"wx": masked(R.D_HASH, "c2")}


@case()
def logprob_nan():
    b = worked_example(logprobs=True)
    b.token_row("c5")["logprobs"][4] = NAN
    return b, {"wx": masked(R.D_LOGPROB_NONFINITE, "c5")}


@case()
def logprob_inf():
    b = worked_example(logprobs=True)
    b.token_row("c5")["logprobs"][2] = -INF
    return b, {"wx": masked(R.D_LOGPROB_NONFINITE, "c5")}


@case()
def logprob_nonzero_on_carry():
    b = worked_example(logprobs=True)
    b.token_row("c3")["logprobs"][0] = -0.25
    return b, {"wx": masked(R.D_LOGPROB_CARRY, "c3")}


@case()
def logprob_nan_on_carry_is_nonfinite():
    b = worked_example(logprobs=True)
    b.token_row("c3")["logprobs"][1] = NAN
    return b, {"wx": masked(R.D_LOGPROB_NONFINITE, "c3")}


@case()
def logprob_negative_zero_on_carry_ok():
    b = worked_example(logprobs=True)
    b.token_row("c3")["logprobs"][0] = -0.0
    return b, {"wx": ok(num_rows=2)}


@case()
def hash_beats_logprob():
    b = worked_example(logprobs=True)
    b.ledger_row("c2")["chain_hash"] ^= 1
    b.token_row("c2")["logprobs"][0] = NAN
    return b, {"wx": masked(R.D_HASH, "c2")}


@case()
def earlier_call_beats_later_check():
    # Per call all of 12-15, root first: c1's logprob fault beats c2's missing tokens.
    b = worked_example(logprobs=True)
    b.token_row("c1")["logprobs"][3] = NAN
    b.drop_tokens("c2")
    return b, {"wx": masked(R.D_LOGPROB_NONFINITE, "c1")}


@case()
def chain0_hash_beats_chain1_missing_tokens():
    b = worked_example()
    b.ledger_row("c2")["chain_hash"] ^= 1
    b.drop_tokens("c3")
    return b, {"wx": masked(R.D_HASH, "c2")}


# Check 14, the optional ledger.integrity_error column (an importer's own failed check).

@case()
def integrity_error_on_a_selected_call():
    b = worked_example()
    b.ledger_row("c5")["integrity_error"] = "staging digest mismatch"
    assert "integrity_error" not in b.ledger_row("c1")  # the others read as null
    return b, {"wx": masked(R.D_INTEGRITY, "c5", text="staging digest mismatch")}


@case()
def integrity_error_on_the_rejected_retry_masks_nothing():
    b = worked_example()
    b.ledger_row("c4")["integrity_error"] = "chain hash mismatch"
    return b, {"wx": ok([WX_S0, WX_S1], num_rows=2)}


@case()
def integrity_error_first_call_of_the_chains_wins():
    b = worked_example()
    b.ledger_row("c3")["integrity_error"] = "cumulative hash mismatch"
    b.ledger_row("c2")["integrity_error"] = "extras digest mismatch"
    return b, {"wx": masked(R.D_INTEGRITY, "c2", text="extras digest mismatch")}


@case()
def integrity_error_comes_before_the_chain_hash_and_after_lengths():
    b = worked_example()
    b.ledger_row("c2")["integrity_error"] = "staging digest mismatch"
    b.ledger_row("c2")["chain_hash"] ^= 1
    b.ledger_row("c1")["integrity_error"] = None
    other = worked_example("wy")
    other.ledger_row("c3")["integrity_error"] = "staging digest mismatch"
    other.ledger_row("c3")["delta_len"] += 1
    return [b, other], {"wx": masked(R.D_INTEGRITY, "c2", text="staging digest mismatch"),
                        "wy": masked(R.D_LEN_TOKENS, "c3")}


# --------------------------------------------------------------------------------------------
# Placeholders
# --------------------------------------------------------------------------------------------

def _placeholder(rid, group_id, reward, advantage, logprobs=False):
    row = dict(row_id=f"{rid}_s0", rollout_id=rid, group_id=group_id, segment=0,
               num_segments=1, input_ids=[0], loss_mask=[0], prompt_len=0, call_ids=[],
               reward=reward, advantage=advantage, weight=0.0)
    if logprobs:
        row["logprobs"] = [0.0]
    return row


def _placeholder_data(logprobs: bool):
    # Group g: wx (ok, 1.0) and m (masked, 0.0), population all: mean 0.5, std S:
    # A(wx) = 0.5 / (S + 1e-6), A(m) = -0.5 / (S + 1e-6). "lost" has no rollouts row.
    wx = worked_example(reward=1.0, logprobs=logprobs)
    m = one_call("m", "g", 0.0, logprobs=logprobs)
    m.ledger_row("c1")["chain_hash"] ^= 1
    lost = RolloutBuilder("lost", logprobs=logprobs)
    lost.call("c1", None, [1], [2], [message("x")])
    expect = {
        "wx": ok([dict(WX_S0, advantage=0.5 / (S + EPS)), dict(WX_S1, advantage=0.5 / (S + EPS))]),
        "m": masked(R.D_HASH, "c1", num_rows=0, loss_tokens=0,
                    rows=[_placeholder("m", "g", 0.0, -0.5 / (S + EPS), logprobs)]),
        "lost": masked(R.D_NO_ROLLOUT_RECORD, num_rows=0,
                       rows=[_placeholder("lost", None, None, None, logprobs)]),
    }
    return [wx, m, without_record(lost)], expect


@case(placeholders=True)
def placeholders():
    return _placeholder_data(False)


@case(placeholders=True)
def placeholders_with_logprobs():
    return _placeholder_data(True)


@case()
def no_placeholders_by_default():
    data, expect = _placeholder_data(False)
    expect["m"].rows = []
    expect["lost"].rows = []
    return data, expect


# --------------------------------------------------------------------------------------------
# §5 advantages
# --------------------------------------------------------------------------------------------
# Group g: a (ok, 1.0), b (ok, 0.0), c (masked: capture_failed, 2.0), d (masked: NaN).
# Group h: e (ok, 0.7) alone.
# population all = {a, b, c}: rewards 1, 0, 2 -> mean 1, std sqrt((0 + 1 + 1) / 2) = 1
# population ok  = {a, b}:    rewards 1, 0    -> mean 0.5, std S = sqrt(0.5)

def _group_g():
    c = one_call("c", "g", 2.0)
    c.ledger_row("c1")["failed"] = True
    return [one_call("a", "g", 1.0), one_call("b", "g", 0.0), c, one_call("d", "g", NAN),
            one_call("e", "h", 0.7)]


def _adv_expect(a, b, c):
    return {"a": ok(advantage=a, reward=1.0), "b": ok(advantage=b, reward=0.0),
            "c": masked(R.D_CAPTURE_FAILED, "c1", advantage=c, reward=2.0),
            "d": masked(R.D_REWARD_NAN, advantage=None, reward=NAN),
            "e": ok(advantage=0.0, reward=0.7)}


@case()
def advantage_mean_population_all():
    # (r - 1) / (1 + 1e-6)
    return _group_g(), _adv_expect(0.0, -1 / (1 + EPS), 1 / (1 + EPS))


@case(baseline_population="ok")
def advantage_mean_population_ok():
    # (r - 0.5) / (S + 1e-6); c is outside the population but uses its statistics.
    return _group_g(), _adv_expect(0.5 / (S + EPS), -0.5 / (S + EPS), 1.5 / (S + EPS))


@case(baseline="loo")
def advantage_loo_population_all():
    # baselines: a: mean(0, 2) = 1; b: mean(1, 2) = 1.5; c: mean(1, 0) = 0.5; std 1.
    return _group_g(), _adv_expect(0.0, -1.5 / (1 + EPS), 1.5 / (1 + EPS))


@case(baseline="loo", baseline_population="ok")
def advantage_loo_population_ok():
    # baselines: a: 0; b: 1; c (outside): population mean 0.5; std S.
    return _group_g(), _adv_expect(1 / (S + EPS), -1 / (S + EPS), 1.5 / (S + EPS))


@case(no_std=True)
def advantage_mean_no_std():
    return _group_g(), _adv_expect(0.0, -1.0, 1.0)


@case(no_std=True, baseline_population="ok")
def advantage_mean_no_std_population_ok():
    return _group_g(), _adv_expect(0.5, -0.5, 1.5)


@case(baseline="loo", no_std=True)
def advantage_loo_no_std():
    return _group_g(), _adv_expect(0.0, -1.5, 1.5)


@case(baseline="loo", no_std=True, baseline_population="ok")
def advantage_loo_no_std_population_ok():
    return _group_g(), _adv_expect(1.0, -1.0, 1.5)


def _ok_and_masked():
    c = one_call("c", "g", 2.0)
    c.ledger_row("c1")["failed"] = True
    return [one_call("a", "g", 1.0), c]


@case(baseline_population="ok")
def advantage_population_ok_of_one():
    # Only a is ok: a population of one gives A = 0 to every finite-reward rollout.
    return _ok_and_masked(), {"a": ok(advantage=0.0), "c": masked(R.D_CAPTURE_FAILED, "c1", advantage=0.0)}


@case(baseline_population="ok", baseline="loo", no_std=True)
def advantage_population_of_one_any_options():
    return _ok_and_masked(), {"a": ok(advantage=0.0), "c": masked(R.D_CAPTURE_FAILED, "c1", advantage=0.0)}


@case()
def advantage_population_all_keeps_masked():
    # Rewards 1, 2: mean 1.5, std sqrt(0.25 + 0.25) = S. A = (r - 1.5) / (S + 1e-6).
    return _ok_and_masked(), {"a": ok(advantage=-0.5 / (S + EPS)),
                              "c": masked(R.D_CAPTURE_FAILED, "c1", advantage=0.5 / (S + EPS))}


@case()
def advantage_finite_population_of_one():
    # d's NaN reward leaves a population of one.
    return [one_call("a", "g", 1.0), one_call("d", "g", NAN)], {
        "a": ok(advantage=0.0), "d": masked(R.D_REWARD_NAN, advantage=None)}


@case()
def advantage_infinite_reward_excluded():
    # Population {a: 1, b: 0}: A = (r - 0.5) / (S + 1e-6); i gets null.
    return [one_call("a", "g", 1.0), one_call("b", "g", 0.0), one_call("i", "g", INF)], {
        "a": ok(advantage=0.5 / (S + EPS)), "b": ok(advantage=-0.5 / (S + EPS)),
        "i": masked(R.D_REWARD_INF, advantage=None, reward=INF)}


@case()
def advantage_null_group_is_alone():
    # Each null-group rollout is a group of one: A = 0; the named group is unaffected:
    # {a: 1, b: 0} -> ±0.5 / (S + 1e-6).
    return [one_call("n1", None, 1.0), one_call("n2", None, 0.0),
            one_call("a", "g", 1.0), one_call("b", "g", 0.0)], {
        "n1": ok(advantage=0.0, group_id=None), "n2": ok(advantage=0.0, group_id=None),
        "a": ok(advantage=0.5 / (S + EPS)), "b": ok(advantage=-0.5 / (S + EPS))}


@case()
def advantage_equal_rewards():
    # std 0: A = 0 / (0 + 1e-6) = 0.
    return [one_call(i, "g", 1.0) for i in ("x", "y", "z")], {
        i: ok(advantage=0.0) for i in ("x", "y", "z")}


@case()
def advantage_split_rollout_counts_once():
    # wx (2 rows, reward 1) and sc (1 row, reward 0): population {1, 0}, one member each.
    a = 0.5 / (S + EPS)
    return [worked_example("wx", "g", 1.0), single_chain("sc", "g", 0.0)], {
        "wx": ok([dict(WX_S0, advantage=a), dict(WX_S1, advantage=a)], advantage=a),
        "sc": ok([dict(SC_ROW, advantage=-a)], advantage=-a)}


# --------------------------------------------------------------------------------------------
# Checking
# --------------------------------------------------------------------------------------------

def same(got, want) -> bool:
    """Equality for output values: floats within float32 rounding, NaN equals NaN, lists
    elementwise."""
    if want is None or got is None:
        return got is None and want is None
    if isinstance(want, (list, tuple)):
        return (isinstance(got, (list, tuple)) and len(got) == len(want)
                and all(same(g, w) for g, w in zip(got, want)))
    if isinstance(want, float) or isinstance(got, float):
        got, want = float(got), float(want)
        if math.isnan(want) or math.isnan(got):
            return math.isnan(want) and math.isnan(got)
        if math.isinf(want) or math.isinf(got):
            return got == want
        return abs(got - want) <= 1e-6 * max(1.0, abs(want))
    return got == want


def _key(rollout_id: str) -> bytes:
    return rollout_id.encode("utf-8")


def check_invariants(case: Case, rows: list, report: list) -> None:
    """What every output must satisfy, whatever the case."""
    name = case.name
    row_columns = ROWS_COLUMNS if case.has_logprobs else tuple(c for c in ROWS_COLUMNS if c != "logprobs")
    for r in rows:
        assert tuple(r) == row_columns, f"{name}: rows columns {tuple(r)}"
    for r in report:
        assert tuple(r) == REPORT_COLUMNS, f"{name}: report columns {tuple(r)}"

    ids = [r["rollout_id"] for r in report]
    seen = {r["rollout_id"] for table in (case.ledger, case.tokens, case.rollouts) for r in table}
    assert len(ids) == len(set(ids)), f"{name}: several report rows for one rollout"
    assert set(ids) == seen, f"{name}: report ids {sorted(ids)} != ids seen {sorted(seen)}"
    assert ids == sorted(ids, key=_key), f"{name}: report not sorted by rollout_id bytes"
    order = [(_key(r["rollout_id"]), r["segment"]) for r in rows]
    assert order == sorted(order), f"{name}: rows not sorted by (rollout_id, segment)"

    first_record = {}
    for rec in case.rollouts:
        first_record.setdefault(rec["rollout_id"], rec)
    rows_of = {}
    for r in rows:
        rows_of.setdefault(r["rollout_id"], []).append(r)
    assert set(rows_of) <= set(ids), f"{name}: rows for unknown rollouts"

    for rep in report:
        rid = rep["rollout_id"]
        where = f"{name}/{rid}"
        mine = rows_of.get(rid, [])
        rec = first_record.get(rid)
        want_reward = None if rec is None or rec["reward"] is None else float(rec["reward"])
        assert same(rep["reward"], want_reward), f"{where}: report reward"
        assert rep["group_id"] == (rec["group_id"] if rec is not None else None), f"{where}: group_id"
        finite = want_reward is not None and math.isfinite(want_reward)
        assert (rep["advantage"] is None) == (not finite), f"{where}: advantage null iff reward not finite"
        assert rep["num_calls"] == sum(c["rollout_id"] == rid for c in case.ledger), f"{where}: num_calls"
        assert rep["num_roots"] == sum(c["rollout_id"] == rid and c["parent_id"] is None
                                       for c in case.ledger), f"{where}: num_roots"
        for r in mine:
            assert r["group_id"] == rep["group_id"], f"{where}: row group_id"
            assert same(r["reward"], rep["reward"]), f"{where}: row reward"
            assert same(r["advantage"], rep["advantage"]), f"{where}: row advantage"
            assert len(r["input_ids"]) == len(r["loss_mask"]), f"{where}: input_ids/loss_mask length"
            if case.has_logprobs:
                assert len(r["logprobs"]) == len(r["input_ids"]), f"{where}: logprobs length"
        if rep["status"] == "ok":
            assert rep["reason"] is None and rep["detail"] is None, f"{where}: ok with a reason"
            n = len(mine)
            assert n >= 1 and rep["num_rows"] == n, f"{where}: num_rows {rep['num_rows']} vs {n} rows"
            assert rep["num_selected"] == sum(len(r["call_ids"]) for r in mine), f"{where}: num_selected"
            assert rep["loss_tokens"] == sum(sum(r["loss_mask"]) for r in mine), f"{where}: loss_tokens"
            for k, r in enumerate(mine):
                assert r["row_id"] == f"{rid}_s{k}" and r["segment"] == k, f"{where}: row ids"
                assert r["num_segments"] == n, f"{where}: num_segments"
                assert r["call_ids"], f"{where}: empty call_ids"
                p = r["prompt_len"]
                assert set(r["loss_mask"][:p]) <= {0} and r["loss_mask"][p] == 1, f"{where}: prompt_len"
            weights = [r["weight"] for r in mine]
            if case.options.get("row_weight", "rollout") == "rollout":
                assert same(math.fsum(weights), 1.0), f"{where}: weights sum {weights}"
                assert all(same(w, 1.0 / n) for w in weights), f"{where}: weights {weights}"
            else:
                assert all(w == 1.0 for w in weights), f"{where}: weights {weights}"
        else:
            assert rep["status"] == "masked", f"{where}: status {rep['status']!r}"
            assert rep["reason"] in REASONS[1:], f"{where}: reason {rep['reason']!r}"
            assert isinstance(rep["detail"], str) and rep["detail"], f"{where}: empty detail"
            assert rep["num_rows"] == 0 and rep["loss_tokens"] == 0, f"{where}: masked with rows"
            if case.options.get("placeholders"):
                assert len(mine) == 1, f"{where}: {len(mine)} placeholder rows"
                ph = mine[0]
                assert ph["weight"] == 0.0 and set(ph["loss_mask"]) == {0}, f"{where}: placeholder"
                assert ph["row_id"] == f"{rid}_s0" and ph["num_segments"] == 1, f"{where}: placeholder"
            else:
                assert not mine, f"{where}: rows for a masked rollout"


def check_case(case: Case, rows: list, report: list) -> None:
    """Check an output (rows, report as lists of dicts) against the case."""
    check_invariants(case, rows, report)
    by_id = {r["rollout_id"]: r for r in report}
    assert set(by_id) == set(case.expect), f"{case.name}: expectations do not cover every rollout"
    for rid, exp in case.expect.items():
        where = f"{case.name}/{rid}"
        rep = by_id[rid]
        got = (rep["status"], rep["reason"], rep["detail"])
        assert got == (exp.status, exp.reason, exp.detail), f"{where}: got {got}, want {(exp.status, exp.reason, exp.detail)}"
        for key, want in exp.report.items():
            assert same(rep[key], want), f"{where}: report {key} = {rep[key]!r}, want {want!r}"
        if exp.rows is not None:
            mine = [r for r in rows if r["rollout_id"] == rid]
            assert len(mine) == len(exp.rows), f"{where}: {len(mine)} rows, want {len(exp.rows)}"
            for k, (r, want_row) in enumerate(zip(mine, exp.rows)):
                for key, want in want_row.items():
                    assert same(r[key], want), f"{where}: row {k} {key} = {r[key]!r}, want {want!r}"


CASE_BY_NAME = {c.name: c for c in CASES}
