"""Reason codes (SPEC §3) and the detail messages shared by the engine and the reference.

Every masked rollout carries one reason code (a stable string) and one detail. The engine
and the reference pick the detail from ``DETAILS`` by a small integer, then add the
offending call or output position, so both produce the same text:

    "<message>: call <call_id>"        when the detail names a call
    "<message> output position <p>"    when it names an output position
    "<message>: call <call_id>: <text>" when it names a call and quotes its ledger
                                       integrity_error (SPEC §3 check 14)
    "<message>"                        otherwise
"""

from __future__ import annotations

# Reason codes, indexed by their integer id. 0 means ok.
OK = 0
REASONS = (
    None,  # 0: ok
    "no_rollout_record",
    "no_calls",
    "capture_failed",
    "reward_invalid",
    "duplicate_call",
    "length_mismatch",
    "no_output",
    "unmatched_output",
    "ambiguous_output",
    "out_of_order",
    "terminal_mismatch",
    "accepted_mismatch",
    "broken_chain",
    "multiple_roots",
    "ambiguous_terminal",
    "walk_mismatch",
    "missing_tokens",
    "hash_mismatch",
    "logprob_invalid",
)
REASON_ID = {name: i for i, name in enumerate(REASONS) if name}

# What a detail points at.
NONE, CALL, POSITION, CALL_TEXT = 0, 1, 2, 3

# Detail id -> (reason, message, what it points at). Order within a reason is the order in
# which the engine checks (first failure wins). Append only: ids are used by the kernels.
DETAILS = (
    (None, "", NONE),  # 0: ok
    ("no_rollout_record", "rollout id has no row in the rollouts table", NONE),
    ("no_calls", "rollouts row has no ledger calls", NONE),
    ("capture_failed", "capture failed (failed = true)", CALL),
    ("reward_invalid", "reward is null", NONE),
    ("reward_invalid", "reward is NaN", NONE),
    ("reward_invalid", "reward is infinite", NONE),
    ("duplicate_call", "rollout_id repeats in the rollouts table", NONE),
    ("duplicate_call", "call_id repeats", CALL),
    ("duplicate_call", "response_id repeats", CALL),
    ("duplicate_call", "call has several token rows", CALL),
    ("length_mismatch", "output_ids length differs from output_keys", NONE),
    ("length_mismatch", "item_ids length differs from item_keys", CALL),
    ("no_output", "output_keys is empty", NONE),
    ("unmatched_output", "no call matches the output items starting at", POSITION),
    ("ambiguous_output", "several calls match the output items starting at", POSITION),
    ("out_of_order", "selected call is not after the previous selected call in capture order", CALL),
    ("terminal_mismatch", "terminal_response_id is not the last selected call", NONE),
    ("terminal_mismatch", "terminal_response_id names no call", NONE),
    ("accepted_mismatch", "accepted_response_ids differ from the selection", NONE),
    ("broken_chain", "first selected call is not a root", CALL),
    ("broken_chain", "parent is not the selected call just before it", CALL),
    ("multiple_roots", "ledger holds more than one root", NONE),
    ("ambiguous_terminal", "several leaves and no terminal_response_id", NONE),
    ("ambiguous_terminal", "no leaf call (parent links form a cycle)", NONE),
    ("walk_mismatch", "parent_id names no call", CALL),
    ("walk_mismatch", "parent links form a cycle", CALL),
    ("walk_mismatch", "walk leaves the chain", CALL),
    ("missing_tokens", "call has no token row", CALL),
    ("length_mismatch", "len(tokens) differs from delta_len", CALL),
    ("length_mismatch", "gen_len outside [1, delta_len]", CALL),
    ("length_mismatch", "root with prev_len != 0", CALL),
    ("length_mismatch", "prev_len != parent prev_len + parent delta_len", CALL),
    ("length_mismatch", "logprobs null or of another length than tokens", CALL),
    ("hash_mismatch", "recomputed chain hash differs from chain_hash", CALL),
    ("logprob_invalid", "logprob is NaN or infinite", CALL),
    ("logprob_invalid", "logprob is non-zero on a carry token", CALL),
    ("broken_chain", "parent is not a call selected before it", CALL),  # forest plan, SPEC §3.1 10f
    ("hash_mismatch", "integrity_error is set", CALL_TEXT),  # SPEC §3 check 14, an importer's own check
)

DETAIL_ID = {}
for _i, (_reason, _message, _kind) in enumerate(DETAILS):
    DETAIL_ID[(_reason, _message)] = _i

# Named detail ids, for kernels (numba sees them as compile-time constants).
D_NO_ROLLOUT_RECORD = 1
D_NO_CALLS = 2
D_CAPTURE_FAILED = 3
D_REWARD_NULL = 4
D_REWARD_NAN = 5
D_REWARD_INF = 6
D_DUP_ROLLOUT = 7
D_DUP_CALL_ID = 8
D_DUP_RESPONSE_ID = 9
D_DUP_TOKEN_ROW = 10
D_LEN_OUTPUT_IDS = 11
D_LEN_ITEM_IDS = 12
D_NO_OUTPUT = 13
D_UNMATCHED = 14
D_AMBIGUOUS = 15
D_OUT_OF_ORDER = 16
D_TERMINAL_NOT_LAST = 17
D_TERMINAL_NO_CALL = 18
D_ACCEPTED = 19
D_FIRST_NOT_ROOT = 20
D_PARENT_NOT_PREVIOUS = 21
D_MULTIPLE_ROOTS = 22
D_SEVERAL_LEAVES = 23
D_NO_LEAF = 24
D_WALK_MISSING_PARENT = 25
D_WALK_CYCLE = 26
D_WALK_LEAVES_CHAIN = 27
D_MISSING_TOKENS = 28
D_LEN_TOKENS = 29
D_LEN_GEN = 30
D_LEN_ROOT_PREV = 31
D_LEN_CHILD_PREV = 32
D_LEN_LOGPROBS = 33
D_HASH = 34
D_LOGPROB_NONFINITE = 35
D_LOGPROB_CARRY = 36
D_PARENT_NOT_SELECTED_BEFORE = 37
D_INTEGRITY = 38

# Reason id of each detail id, for vectorised lookup.
DETAIL_REASON = tuple(REASON_ID[r] if r else OK for r, _, _ in DETAILS)


def format_detail(detail_id: int, call_id: str | None = None, position: int | None = None,
                  text: str | None = None) -> str | None:
    """The human detail of a masked rollout; None for ok. ``text``: the call's integrity_error
    (details of kind CALL_TEXT)."""
    if detail_id == 0:
        return None
    _, message, kind = DETAILS[detail_id]
    if kind == CALL_TEXT:
        return f"{message}: call {call_id}: {text}"
    if kind == CALL:
        return f"{message}: call {call_id}"
    if kind == POSITION:
        return f"{message} output position {position}"
    return message


# The **Fix.** paragraph of each reason in docs/reasons.md (links written as their target), for
# ``chainrows explain``; tests/explanation keeps the two equal.
FIXES = {
    'no_rollout_record': (
        'Write a rollouts row for every episode that started, even a failed one (a null reward '
        'masks it as `reward_invalid`, which says more), export the three tables from the same run, '
        'and build the rollout id in one place.'
    ),
    'no_calls': (
        'Flush and ship the ledger of every worker; check the ids match byte for byte. If the '
        'episode really made no call, there is nothing to train: dropping the rollouts row is fine.'
    ),
    'capture_failed': (
        'Nothing to repair in the data: the rollout cannot be trained token-exactly. Fix the '
        'capture error itself; the detail names the call. Keep writing poison rows: silently '
        'dropping a failed call would make the rollout look complete and train on wrong tokens.'
    ),
    'reward_invalid': (
        'Make the verifier return a finite number for every finished rollout (decide what a '
        'verifier failure is worth, e.g. 0, or re-run it), or leave the rollout masked on purpose.'
    ),
    'duplicate_call': (
        'Deduplicate on the writer side (idempotent writes keyed by (rollout_id, call_id)), make '
        'call ids unique per rollout (e.g. a UUID or worker-prefixed counter), and give every '
        'served response its own id.'
    ),
    'length_mismatch': (
        'Build `item_keys`/`item_ids` (and `output_keys`/`output_ids`) together from one item list '
        '(`chainrows.formats.items.model_item_keys` returns both). Store the exact token ids the '
        'model saw and produced, and set `delta_len = len(tokens)`, `gen_len = len(generated)`, '
        '`prev_len = 0` for a root and `parent.prev_len + parent.delta_len` otherwise. Write one '
        'logprob per token, 0.0 on carry tokens (see the example in docs/format.md); if some calls '
        'have no logprobs, drop the column for the whole dataset rather than leave gaps.'
    ),
    'no_output': (
        "Store the agent's final returned history and key its model-authored items "
        '(`model_item_keys`). If the harness cannot, run `--mode ordinary` (one chain from the '
        'terminal call); rollouts that compacted are then masked `multiple_roots`.'
    ),
    'unmatched_output': (
        'Key the items exactly as the model returned them, in both places, with the same function; '
        "keep the harness's own items out of model-authored roles (a compaction summary written by "
        'the harness is context: give it a user/system role or leave it unkeyed); record for each '
        'call every model-authored item it produced, in order. Compare `canonical_json(item)` of '
        'the output item at position `p` with the items of the call you expected to match.'
    ),
    'ambiguous_output': (
        'Record the served item ids (`item_ids`, and `output_ids` in the final history): ids are '
        'dropped from the fingerprint but constrain the match. Or record `accepted_response_ids` '
        '(the calls the harness accepted, in order), or at least `terminal_response_id`.'
    ),
    'out_of_order': (
        "Write each rollout's ledger rows in capture order (sort by a monotonic per-rollout "
        'sequence number before writing, not by call id). If the agent repeats itself, record item '
        'ids so each occurrence matches its own call.'
    ),
    'terminal_mismatch': (
        'Set `terminal_response_id` to the `response_id` of the call that produced the last '
        'model-authored item of the returned history, as stored in the ledger; or leave it null if '
        'the harness does not know.'
    ),
    'accepted_mismatch': (
        'Record `accepted_response_ids` at the point where the history is committed, from the same '
        'data; or leave the column null for rollouts where it is not reliable (null = no record).'
    ),
    'broken_chain': (
        'Set `parent_id` to the call whose full sequence (prompt + generation) is a prefix of this '
        'request; null when the request is not such an extension (a compaction, a fresh sub-agent). '
        'Interleaved workers and forks (two branches continuing one call) are not supported by the '
        'default linear cut: reassemble with `--plan forest`, which keeps them as long as every '
        "kept call's parent was kept before it (detail `parent is not a call selected before it` "
        'otherwise).'
    ),
    'multiple_roots': (
        'Use cc mode (the default): it selects the calls of the final output and gives one row per '
        'chain instead of masking. `chainrows stats DATA` shows how many rollouts cc recovers.'
    ),
    'ambiguous_terminal': (
        'Record `terminal_response_id`, or use cc mode. For a cycle, fix how parent ids are '
        'assigned.'
    ),
    'walk_mismatch': (
        "Make `parent_id` hold the parent's `call_id` (same rollout) and make sure every call "
        'reaches the ledger.'
    ),
    'missing_tokens': (
        'Write the tokens row in the same step as the ledger row (or mark the call `failed` when '
        'the tokens cannot be stored), and build ids in one place. Token rows that name no ledger '
        'call are counted as orphans in the summary: many orphans next to `missing_tokens` usually '
        'means the ids differ between the tables.'
    ),
    'hash_mismatch': (
        'Compute the hash at capture over the delta exactly as stored, as little-endian int32 '
        "bytes, seeded with the parent's `chain_hash` (0 for a root): "
        '`xxhash.xxh3_64_intdigest(np.asarray(delta, "<i4").tobytes(), parent_hash)` (see '
        'docs/format.md). If it still differs, the stored tokens are wrong: that is what the hash '
        'is there to catch. For `integrity_error`, fix the capture the text names (a Gym dump: the '
        'staged call and its record must come from the same capture, untouched).'
    ),
    'logprob_invalid': (
        'Store the sampling logprob of each generated token, and 0.0 on every carry token. For '
        'tokens the server cannot score, clamp to a finite floor at capture, or mark the call '
        '`failed`; do not store prompt logprobs in this column.'
    ),
}


def _check_named_ids() -> None:
    for name, value in globals().items():
        if name.startswith("D_") and not name.startswith("D__"):
            assert 0 < value < len(DETAILS), name


_check_named_ids()
