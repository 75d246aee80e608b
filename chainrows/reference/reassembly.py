"""The reference: a slow, obviously correct pure-Python reading of SPEC §3–§5.

This module is the oracle the fast engine is tested against. It works on plain dicts (the
SPEC §2 column names, as ``pyarrow.Table.to_pylist()`` gives them) and follows the SPEC line by
line: one small function per §3 check, named after it, raising :class:`Masked` on the first
failure. Tie-breaks the SPEC leaves open follow ``docs/decisions.md`` (and
``docs/decisions-reference.md`` for the few choices made here).

Clarity beats speed, but everything is linear per rollout except selection (output positions ×
calls), so a few thousand rollouts take well under a second or two.
"""

from __future__ import annotations

import math
import sys
from array import array
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import xxhash

from chainrows import reasons as R
from chainrows.options import Options
from chainrows.reasons import DETAILS, format_detail

__all__ = ["Masked", "Rollout", "Decision", "chain_hash", "decide", "advantages", "reassemble"]

ROWS_COLUMNS = (
    "row_id", "rollout_id", "group_id", "segment", "num_segments", "input_ids", "loss_mask",
    "logprobs", "prompt_len", "call_ids", "reward", "advantage", "weight",
)
REPORT_COLUMNS = (
    "rollout_id", "group_id", "status", "reason", "detail", "num_rows", "num_calls",
    "num_selected", "num_roots", "loss_tokens", "reward", "advantage",
)
EPSILON = 1e-6
ADVANTAGE_LIMIT = 3.4028234663852886e38  # the largest float32: an advantage beyond it is written as it


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------

def chain_hash(tokens, seed: int = 0) -> int:
    """XXH3-64 of the tokens as little-endian int32 bytes, seeded (SPEC §2, ledger.chain_hash)."""
    data = array("i", tokens)
    assert data.itemsize == 4
    if sys.byteorder != "little":
        data.byteswap()
    return xxhash.xxh3_64_intdigest(data.tobytes(), seed)


def f32(x: float | None) -> float | None:
    """Round a Python float to float32 precision (None stays None)."""
    return None if x is None else float(np.float32(x))


def is_finite(x) -> bool:
    return x is not None and math.isfinite(float(x))


def item_keys(call: dict) -> list:
    """A call's item_keys; a null list reads as empty."""
    return list(call.get("item_keys") or [])


def item_ids(call: dict) -> list:
    """A call's item ids; a null list means every id is null (valid once step 4b passed)."""
    ids = call.get("item_ids")
    return list(ids) if ids is not None else [None] * len(item_keys(call))


def output_keys(record: dict) -> list:
    return list(record.get("output_keys") or [])


def output_ids(record: dict) -> list:
    ids = record.get("output_ids")
    return list(ids) if ids is not None else [None] * len(output_keys(record))


class Masked(Exception):
    """A §3 check failed: the rollout is masked with this detail."""

    def __init__(self, detail_id: int, call: dict | None = None, position: int | None = None,
                 text: str | None = None):
        self.detail_id = detail_id
        self.call_id = call["call_id"] if call is not None else None
        self.position = position
        self.text = text
        super().__init__(self.detail)

    @property
    def reason(self) -> str:
        return DETAILS[self.detail_id][0]

    @property
    def detail(self) -> str:
        return format_detail(self.detail_id, call_id=self.call_id, position=self.position,
                             text=self.text)


@dataclass
class Rollout:
    """Everything the input tables hold about one rollout id."""

    rollout_id: str
    calls: list = field(default_factory=list)    # ledger rows, in capture order
    tokens: list = field(default_factory=list)   # token rows, in table order
    records: list = field(default_factory=list)  # rollouts rows, in read order
    has_logprobs: bool = False

    @property
    def record(self) -> dict | None:
        """The rollouts row that counts: the first one."""
        return self.records[0] if self.records else None

    def call_by_id(self) -> dict:
        """call_id -> ledger row (call_ids are unique once step 4 passed)."""
        return {c["call_id"]: c for c in self.calls}

    def token_rows_of(self, call: dict) -> list:
        return [t for t in self.tokens if t["call_id"] == call["call_id"]]


@dataclass
class Decision:
    """The per-rollout result of §3."""

    rollout_id: str
    status: str = "ok"
    detail_id: int = R.OK
    reason: str | None = None
    detail: str | None = None
    chains: list = field(default_factory=list)  # per chain, its ledger rows root first (ok only)
    num_selected: int = 0


# --------------------------------------------------------------------------------------------
# §3 rollout level, steps 1–4b
# --------------------------------------------------------------------------------------------

def check_1_rollout_record(ro: Rollout) -> None:
    if ro.record is None:
        raise Masked(R.D_NO_ROLLOUT_RECORD)
    if not ro.calls:
        raise Masked(R.D_NO_CALLS)


def check_2_capture_failed(ro: Rollout) -> None:
    for call in ro.calls:
        if call["failed"]:
            raise Masked(R.D_CAPTURE_FAILED, call)


def check_3_reward(ro: Rollout) -> None:
    reward = ro.record["reward"]
    if reward is None:
        raise Masked(R.D_REWARD_NULL)
    if math.isnan(reward):
        raise Masked(R.D_REWARD_NAN)
    if math.isinf(reward):
        raise Masked(R.D_REWARD_INF)


def check_4_duplicates(ro: Rollout) -> None:
    if len(ro.records) > 1:
        raise Masked(R.D_DUP_ROLLOUT)
    seen = set()
    for call in ro.calls:
        if call["call_id"] in seen:
            raise Masked(R.D_DUP_CALL_ID, call)
        seen.add(call["call_id"])
    seen = set()
    for call in ro.calls:
        if call["response_id"] in seen:
            raise Masked(R.D_DUP_RESPONSE_ID, call)
        seen.add(call["response_id"])
    for call in ro.calls:
        if len(ro.token_rows_of(call)) > 1:
            raise Masked(R.D_DUP_TOKEN_ROW, call)


def check_4b_id_lengths(ro: Rollout) -> None:
    ids = ro.record.get("output_ids")
    if ids is not None and len(ids) != len(output_keys(ro.record)):
        raise Masked(R.D_LEN_OUTPUT_IDS)
    for call in ro.calls:
        ids = call.get("item_ids")
        if ids is not None and len(ids) != len(item_keys(call)):
            raise Masked(R.D_LEN_ITEM_IDS, call)


# --------------------------------------------------------------------------------------------
# §3 selection (cc mode), steps 5–9
# --------------------------------------------------------------------------------------------

def check_5_no_output(ro: Rollout) -> None:
    if not output_keys(ro.record):
        raise Masked(R.D_NO_OUTPUT)


def identified_calls(ro: Rollout) -> list:
    """The call whose response_id is terminal_response_id, and every call that served an id
    appearing anywhere in output_ids (null ids never identify)."""
    terminal = ro.record.get("terminal_response_id")
    out_ids = {i for i in output_ids(ro.record) if i is not None}
    return [
        c for c in ro.calls
        if (terminal is not None and c["response_id"] == terminal)
        or any(i is not None and i in out_ids for i in item_ids(c))
    ]


def ancestors_or_self(ro: Rollout, calls: list) -> set:
    """call_ids of the given calls and of all their ancestors. A walk stops at a root, at a
    parent_id that names no call, or at a call it already visited."""
    by_id = ro.call_by_id()
    found = set()
    for call in calls:
        visited = set()
        while call is not None and call["call_id"] not in visited:
            visited.add(call["call_id"])
            parent_id = call["parent_id"]
            call = by_id.get(parent_id) if parent_id is not None else None
        found |= visited
    return found


def matches_window(call: dict, keys: list, p: int) -> bool:
    """The call's item_keys equal output_keys[p : p+len(item_keys)] exactly (non-empty)."""
    mine = item_keys(call)
    return len(mine) > 0 and keys[p:p + len(mine)] == mine


def passes_id_filter(call: dict, keys: list, ids: list, p: int, served: set) -> bool:
    """Every non-null output id in the window that some call of the rollout served must be one
    of this candidate's item ids (at any position). Ids that name no call are ignored."""
    mine = set(item_ids(call))
    window = ids[p:p + len(item_keys(call))]
    return all(i in mine for i in window if i is not None and i in served)


def is_next_accepted(call: dict, accepted: list, k: int) -> bool:
    """With accepted_response_ids given: the candidate must be the k-th accepted call."""
    return k < len(accepted) and call["response_id"] == accepted[k]


def select_6(ro: Rollout) -> list:
    """Greedy left-to-right whole-call matching of the output items. No backtracking."""
    keys, ids = output_keys(ro.record), output_ids(ro.record)
    accepted = ro.record.get("accepted_response_ids")
    served = {i for c in ro.calls for i in item_ids(c) if i is not None}
    lineage = ancestors_or_self(ro, identified_calls(ro))
    selection = []
    p = 0
    while p < len(keys):
        survivors = [c for c in ro.calls if matches_window(c, keys, p)]
        survivors = [c for c in survivors if passes_id_filter(c, keys, ids, p, served)]
        if accepted is not None:
            survivors = [c for c in survivors if is_next_accepted(c, accepted, len(selection))]
        if len(survivors) > 1:
            in_lineage = [c for c in survivors if c["call_id"] in lineage]
            if len(in_lineage) == 1:
                survivors = in_lineage
        if not survivors:
            raise Masked(R.D_UNMATCHED, position=p)
        if len(survivors) > 1:
            raise Masked(R.D_AMBIGUOUS, position=p)
        selection.append(survivors[0])
        p += len(item_keys(survivors[0]))
    return selection


def check_7_out_of_order(ro: Rollout, selection: list) -> None:
    position_of = {c["call_id"]: i for i, c in enumerate(ro.calls)}  # call_ids are unique
    capture_index = [position_of[c["call_id"]] for c in selection]
    for k in range(1, len(selection)):
        if capture_index[k] <= capture_index[k - 1]:
            raise Masked(R.D_OUT_OF_ORDER, selection[k])


def check_8_terminal(ro: Rollout, selection: list) -> None:
    terminal = ro.record.get("terminal_response_id")
    if terminal is not None and selection[-1]["response_id"] != terminal:
        raise Masked(R.D_TERMINAL_NOT_LAST)


def check_9_accepted(ro: Rollout, selection: list) -> None:
    accepted = ro.record.get("accepted_response_ids")
    if accepted is not None and [c["response_id"] for c in selection] != list(accepted):
        raise Masked(R.D_ACCEPTED)


def cut_10(selection: list) -> list:
    """A root starts a new chain; a non-root must have the selected call just before it as
    parent."""
    chains = []
    for k, call in enumerate(selection):
        if call["parent_id"] is None:
            chains.append([call])
        elif k == 0:
            raise Masked(R.D_FIRST_NOT_ROOT, call)
        elif call["parent_id"] != selection[k - 1]["call_id"]:
            raise Masked(R.D_PARENT_NOT_PREVIOUS, call)
        else:
            chains[-1].append(call)
    return chains


# --------------------------------------------------------------------------------------------
# §3.1 the forest plan: 10f, endpoints and their chains, loss ownership
# --------------------------------------------------------------------------------------------

def check_10f_forest(selection: list) -> None:
    """Every selected non-root's parent is a call selected before it (not missing, unselected,
    selected later, or itself); a first selected call that is not a root fails too."""
    before = set()
    for k, call in enumerate(selection):
        if call["parent_id"] is not None and call["parent_id"] not in before:
            raise Masked(R.D_FIRST_NOT_ROOT if k == 0 else R.D_PARENT_NOT_SELECTED_BEFORE, call)
        before.add(call["call_id"])


def forest_endpoints(selection: list) -> list:
    """Selected calls that are no selected call's parent, in selection order."""
    parents = {c["parent_id"] for c in selection if c["parent_id"] is not None}
    return [c for c in selection if c["call_id"] not in parents]


def forest_chain_of(selection: list, endpoint: dict) -> list:
    """The endpoint's ancestors from the root down to the endpoint (all selected, by 10f)."""
    by_id = {c["call_id"]: c for c in selection}
    chain = [endpoint]
    while chain[-1]["parent_id"] is not None:
        chain.append(by_id[chain[-1]["parent_id"]])
    return chain[::-1]


def cut_10f(ro: Rollout, selection: list) -> list:
    """10f, then one chain per endpoint, ordered by (capture position of the root, capture
    position of the endpoint)."""
    check_10f_forest(selection)
    position_of = {c["call_id"]: i for i, c in enumerate(ro.calls)}
    chains = [forest_chain_of(selection, e) for e in forest_endpoints(selection)]
    return sorted(chains, key=lambda ch: (position_of[ch[0]["call_id"]], position_of[ch[-1]["call_id"]]))


def loss_owners(chains: list) -> list:
    """Per chain, the call_ids whose generated tokens it trains: those no earlier chain holds."""
    seen, owners = set(), []
    for chain in chains:
        ids = [c["call_id"] for c in chain]
        owners.append({i for i in ids if i not in seen})
        seen |= set(ids)
    return owners


# --------------------------------------------------------------------------------------------
# §3 step 11: the walk
# --------------------------------------------------------------------------------------------

def check_11_walk(ro: Rollout, chain: list) -> None:
    """cc mode: from the leaf, the k-th step must land on the chain's k-th call from the end,
    and the chain's root must have a null parent (docs/decisions.md, "Walk in cc mode")."""
    by_id = ro.call_by_id()
    expected = chain[::-1]
    call = expected[0]
    for k in range(1, len(expected)):
        parent_id = call["parent_id"]
        if parent_id is None or by_id.get(parent_id) is not expected[k]:
            raise Masked(R.D_WALK_LEAVES_CHAIN, call)
        call = expected[k]
    if call["parent_id"] is not None:
        raise Masked(R.D_WALK_LEAVES_CHAIN, call)


def walk_11_ordinary(ro: Rollout, terminal: dict) -> list:
    """Ordinary mode: walk parent links from the terminal to the root; returns the chain,
    root first."""
    by_id = ro.call_by_id()
    chain = [terminal]
    visited = {terminal["call_id"]}
    call = terminal
    while call["parent_id"] is not None:
        parent_id = call["parent_id"]
        if parent_id not in by_id:
            raise Masked(R.D_WALK_MISSING_PARENT, call)
        if parent_id in visited:
            raise Masked(R.D_WALK_CYCLE, call)
        call = by_id[parent_id]
        visited.add(parent_id)
        chain.append(call)
    return chain[::-1]


# --------------------------------------------------------------------------------------------
# §3 ordinary mode (instead of 5–10)
# --------------------------------------------------------------------------------------------

def check_multiple_roots(ro: Rollout) -> None:
    if sum(c["parent_id"] is None for c in ro.calls) > 1:
        raise Masked(R.D_MULTIPLE_ROOTS)


def find_terminal(ro: Rollout) -> dict:
    terminal = ro.record.get("terminal_response_id")
    if terminal is not None:
        for call in ro.calls:
            if call["response_id"] == terminal:
                return call
        raise Masked(R.D_TERMINAL_NO_CALL)
    parents = {c["parent_id"] for c in ro.calls if c["parent_id"] is not None}
    leaves = [c for c in ro.calls if c["call_id"] not in parents]
    if len(leaves) > 1:
        raise Masked(R.D_SEVERAL_LEAVES)
    if not leaves:
        raise Masked(R.D_NO_LEAF)
    return leaves[0]


# --------------------------------------------------------------------------------------------
# §3 steps 12–15, per call of a chain (parent = the chain's previous call, None for its root)
# --------------------------------------------------------------------------------------------

def check_12_missing_tokens(ro: Rollout, call: dict) -> dict:
    rows = ro.token_rows_of(call)
    if not rows:
        raise Masked(R.D_MISSING_TOKENS, call)
    return rows[0]  # exactly one: several token rows failed step 4


def check_13_lengths(ro: Rollout, call: dict, parent: dict | None, token_row: dict) -> None:
    tokens = token_row.get("tokens") or []
    if len(tokens) != call["delta_len"]:
        raise Masked(R.D_LEN_TOKENS, call)
    if not 1 <= call["gen_len"] <= call["delta_len"]:
        raise Masked(R.D_LEN_GEN, call)
    if parent is None and call["prev_len"] != 0:
        raise Masked(R.D_LEN_ROOT_PREV, call)
    # Python ints do not overflow; a sum beyond int64 can never equal an int64 prev_len.
    if parent is not None and call["prev_len"] != parent["prev_len"] + parent["delta_len"]:
        raise Masked(R.D_LEN_CHILD_PREV, call)
    if ro.has_logprobs:
        logprobs = token_row.get("logprobs")
        if logprobs is None or len(logprobs) != len(tokens):
            raise Masked(R.D_LEN_LOGPROBS, call)


def check_14_hash(call: dict, parent: dict | None, token_row: dict) -> None:
    """An importer's failed integrity check (the optional ``integrity_error`` column) first, then
    the recomputed chain hash (docs/format.md: the importer's text names the failed check)."""
    if call.get("integrity_error") is not None:
        raise Masked(R.D_INTEGRITY, call, text=call["integrity_error"])
    seed = 0 if parent is None else parent["chain_hash"]  # the parent's *recorded* hash
    if chain_hash(token_row.get("tokens") or [], seed) != call["chain_hash"]:
        raise Masked(R.D_HASH, call)


def check_15_logprobs(ro: Rollout, call: dict, token_row: dict) -> None:
    if not ro.has_logprobs:
        return
    logprobs = token_row["logprobs"]
    if not all(math.isfinite(x) for x in logprobs):
        raise Masked(R.D_LOGPROB_NONFINITE, call)
    carry = call["delta_len"] - call["gen_len"]
    if any(x != 0.0 for x in logprobs[:carry]):  # -0.0 == 0.0
        raise Masked(R.D_LOGPROB_CARRY, call)


def check_chain_calls(ro: Rollout, chain: list) -> None:
    """For each call, root first: checks 12, 13, 14, 15."""
    for k, call in enumerate(chain):
        parent = chain[k - 1] if k > 0 else None
        token_row = check_12_missing_tokens(ro, call)
        check_13_lengths(ro, call, parent, token_row)
        check_14_hash(call, parent, token_row)
        check_15_logprobs(ro, call, token_row)


# --------------------------------------------------------------------------------------------
# One rollout
# --------------------------------------------------------------------------------------------

def decide(ro: Rollout, mode: str = "cc", plan: str = "linear") -> Decision:
    """Run §3 on one rollout, in check order; the first failure wins. ``plan``: the cc cut,
    ``linear`` (step 10) or ``forest`` (§3.1 step 10f)."""
    decision = Decision(ro.rollout_id)
    try:
        check_1_rollout_record(ro)
        check_2_capture_failed(ro)
        check_3_reward(ro)
        check_4_duplicates(ro)
        check_4b_id_lengths(ro)
        if mode == "cc":
            check_5_no_output(ro)
            selection = select_6(ro)
            decision.num_selected = len(selection)
            check_7_out_of_order(ro, selection)
            check_8_terminal(ro, selection)
            check_9_accepted(ro, selection)
            chains = cut_10f(ro, selection) if plan == "forest" else cut_10(selection)
            for chain in chains:
                check_11_walk(ro, chain)
                check_chain_calls(ro, chain)
        else:
            check_multiple_roots(ro)
            chain = walk_11_ordinary(ro, find_terminal(ro))
            decision.num_selected = len(chain)
            chains = [chain]
            check_chain_calls(ro, chain)
    except Masked as m:
        decision.status = "masked"
        decision.detail_id = m.detail_id
        decision.reason = m.reason
        decision.detail = m.detail
        return decision
    decision.chains = chains
    return decision


# --------------------------------------------------------------------------------------------
# §5 advantages
# --------------------------------------------------------------------------------------------

def advantages(rollouts: list, statuses: dict, options: Options) -> dict:
    """rollout_id -> advantage (float64, or None when the reward is not finite), for every
    rollout that has a rollouts row. ``statuses``: rollout_id -> "ok" | "masked". An advantage
    beyond the largest float32 is that value, with its sign (the output column is float32)."""
    groups: dict = {}
    for ro in rollouts:
        if ro.record is None:
            continue
        gid = ro.record["group_id"]
        key = ("group", gid) if gid is not None else ("alone", ro.rollout_id)
        groups.setdefault(key, []).append(ro)

    result = {}
    for members in groups.values():
        finite = [ro for ro in members if is_finite(ro.record["reward"])]
        if options.baseline_population == "all":
            pop = finite
        else:
            pop = [ro for ro in finite if statuses[ro.rollout_id] == "ok"]
        n = len(pop)
        # Exact rational arithmetic (fractions.Fraction) throughout, no scaling: the mean, the
        # variance and each deviation are exact; the std is the square root rounded once at the
        # variance's own scale (sqrt_fraction); each advantage is rounded once, at the end.
        exact = {id(ro): Fraction(float(ro.record["reward"])) for ro in finite}
        if n >= 2:
            mean = sum(exact[id(ro)] for ro in pop) / n
            std = sqrt_fraction(sum((exact[id(ro)] - mean) ** 2 for ro in pop) / (n - 1))
        for ro in members:
            if not is_finite(ro.record["reward"]):
                result[ro.rollout_id] = None
                continue
            if n < 2:
                result[ro.rollout_id] = 0.0
                continue
            r = exact[id(ro)]
            if options.baseline == "loo" and any(m is ro for m in pop):
                base = sum(exact[id(m)] for m in pop if m is not ro) / (n - 1)
            else:
                base = mean
            a = r - base if options.no_std else (r - base) / (std + Fraction(EPSILON))
            result[ro.rollout_id] = float(max(Fraction(-ADVANTAGE_LIMIT), min(Fraction(ADVANTAGE_LIMIT), a)))
    return result


def sqrt_fraction(v: Fraction) -> Fraction:
    """The square root of a non-negative rational, rounded once to a float at ``v``'s own
    scale (``v / 4**k`` is near 1, so the conversion neither overflows nor underflows)."""
    if v == 0:
        return Fraction(0)
    k = (v.numerator.bit_length() - v.denominator.bit_length()) // 2
    return Fraction(math.sqrt(float(v / Fraction(4) ** k))) * Fraction(2) ** k


# --------------------------------------------------------------------------------------------
# The whole dataset
# --------------------------------------------------------------------------------------------

def group_by_rollout(ledger, tokens, rollouts, has_logprobs: bool) -> list:
    """One Rollout per rollout id seen in any table, sorted by the ids' UTF-8 bytes."""
    by_id: dict = {}

    def get(rid):
        if rid not in by_id:
            by_id[rid] = Rollout(rid, has_logprobs=has_logprobs)
        return by_id[rid]

    for row in ledger:
        get(row["rollout_id"]).calls.append(row)
    for row in tokens:
        get(row["rollout_id"]).tokens.append(row)
    for row in rollouts:
        get(row["rollout_id"]).records.append(row)
    return [by_id[rid] for rid in sorted(by_id, key=lambda s: s.encode("utf-8"))]


def chain_row(ro: Rollout, chain: list, k: int, num_segments: int, *, reward, advantage,
              weight: float, trains: set | None = None) -> dict:
    """``trains``: call_ids whose generated tokens get loss 1 here (default: every call); the
    other calls' tokens all get 0 (§3.1 loss ownership)."""
    input_ids, loss_mask, logprobs = [], [], []
    for call in chain:
        token_row = ro.token_rows_of(call)[0]
        carry = call["delta_len"] - call["gen_len"]
        input_ids += list(token_row["tokens"])
        trained = trains is None or call["call_id"] in trains
        loss_mask += [0] * carry + [1 if trained else 0] * call["gen_len"]
        if ro.has_logprobs:
            logprobs += list(token_row["logprobs"])
    row = {
        "row_id": f"{ro.rollout_id}_s{k}",
        "rollout_id": ro.rollout_id,
        "group_id": ro.record["group_id"],
        "segment": k,
        "num_segments": num_segments,
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "logprobs": logprobs,
        "prompt_len": chain[0]["delta_len"] - chain[0]["gen_len"],
        "call_ids": [c["call_id"] for c in chain],
        "reward": reward,
        "advantage": advantage,
        "weight": weight,
    }
    if not ro.has_logprobs:
        del row["logprobs"]
    return row


def placeholder_row(ro: Rollout, *, reward, advantage) -> dict:
    """docs/decisions.md: exactly one row per masked rollout, loss_mask all 0, weight 0."""
    row = {
        "row_id": f"{ro.rollout_id}_s0",
        "rollout_id": ro.rollout_id,
        "group_id": ro.record["group_id"] if ro.record is not None else None,
        "segment": 0,
        "num_segments": 1,
        "input_ids": [0],
        "loss_mask": [0],
        "logprobs": [0.0],
        "prompt_len": 0,
        "call_ids": [],
        "reward": reward,
        "advantage": advantage,
        "weight": 0.0,
    }
    if not ro.has_logprobs:
        del row["logprobs"]
    return row


def reassemble(ledger, tokens, rollouts, options: Options | None = None, *,
               logprobs: bool | None = None, **option_values):
    """SPEC §3–§5 on lists of dicts. Returns ``(rows, report)``, both lists of dicts with the
    SPEC §4 columns in order, sorted by rollout_id (UTF-8 byte order), rows then by segment.

    ``options``: a :class:`~chainrows.options.Options`; keywords override its fields.
    ``logprobs``: whether the rows carry logprobs (default: whether the token rows do)."""
    options = Options.of(options, **option_values)
    ledger, tokens, rollouts = list(ledger), list(tokens), list(rollouts)
    if logprobs is None:
        logprobs = bool(tokens) and "logprobs" in tokens[0]

    all_rollouts = group_by_rollout(ledger, tokens, rollouts, bool(logprobs))
    decisions = {ro.rollout_id: decide(ro, options.mode, options.plan) for ro in all_rollouts}
    statuses = {rid: d.status for rid, d in decisions.items()}
    advantage_of = advantages(all_rollouts, statuses, options)

    rows, report = [], []
    for ro in all_rollouts:
        d = decisions[ro.rollout_id]
        reward = ro.record["reward"] if ro.record is not None else None
        reward = float(reward) if reward is not None else None
        advantage = f32(advantage_of.get(ro.rollout_id))
        mine = []
        if d.status == "ok":
            n = len(d.chains)
            weight = f32(1.0 / n) if options.row_weight == "rollout" else 1.0
            owners = loss_owners(d.chains)
            mine = [chain_row(ro, chain, k, n, reward=reward, advantage=advantage, weight=weight,
                              trains=owners[k])
                    for k, chain in enumerate(d.chains)]
            rows += mine
        elif options.placeholders:
            rows.append(placeholder_row(ro, reward=reward, advantage=advantage))
        report.append({
            "rollout_id": ro.rollout_id,
            "group_id": ro.record["group_id"] if ro.record is not None else None,
            "status": d.status,
            "reason": d.reason,
            "detail": d.detail,
            "num_rows": len(mine),
            "num_calls": len(ro.calls),
            "num_selected": d.num_selected,
            "num_roots": sum(c["parent_id"] is None for c in ro.calls),
            "loss_tokens": sum(sum(r["loss_mask"]) for r in mine),
            "reward": reward,
            "advantage": advantage,
        })
    return rows, report
