"""Arrow schemas of SPEC §2 (input) and §4 (output), and dict-list <-> table helpers."""

from __future__ import annotations

import pyarrow as pa

LEDGER_SCHEMA = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("call_id", pa.string()),
        ("parent_id", pa.string()),
        ("response_id", pa.string()),
        ("prev_len", pa.int64()),
        ("delta_len", pa.int64()),
        ("gen_len", pa.int64()),
        ("chain_hash", pa.uint64()),
        ("item_keys", pa.list_(pa.uint64())),
        ("item_ids", pa.list_(pa.string())),
        ("failed", pa.bool_()),
    ]
)

INTEGRITY_FIELD = pa.field("integrity_error", pa.string())  # optional ledger column (SPEC §2)

TOKENS_SCHEMA = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("call_id", pa.string()),
        ("tokens", pa.list_(pa.int32())),
    ]
)
LOGPROBS_FIELD = pa.field("logprobs", pa.list_(pa.float32()))

ROLLOUTS_SCHEMA = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("group_id", pa.string()),
        ("reward", pa.float64()),
        ("output_keys", pa.list_(pa.uint64())),
        ("output_ids", pa.list_(pa.string())),
        ("terminal_response_id", pa.string()),
    ]
)
ACCEPTED_FIELD = pa.field("accepted_response_ids", pa.list_(pa.string()))

ROWS_SCHEMA = pa.schema(
    [
        ("row_id", pa.string()),
        ("rollout_id", pa.string()),
        ("group_id", pa.string()),
        ("segment", pa.int32()),
        ("num_segments", pa.int32()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.uint8())),
        ("logprobs", pa.list_(pa.float32())),
        ("prompt_len", pa.int32()),
        ("call_ids", pa.list_(pa.string())),
        ("reward", pa.float64()),
        ("advantage", pa.float32()),
        ("weight", pa.float32()),
    ]
)

REPORT_SCHEMA = pa.schema(
    [
        ("rollout_id", pa.string()),
        ("group_id", pa.string()),
        ("status", pa.string()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("num_rows", pa.int64()),
        ("num_calls", pa.int64()),
        ("num_selected", pa.int64()),
        ("num_roots", pa.int64()),
        ("loss_tokens", pa.int64()),
        ("reward", pa.float64()),
        ("advantage", pa.float32()),
    ]
)


def rows_schema(with_logprobs: bool) -> pa.Schema:
    """The rows schema; the logprobs column only when the input has logprobs."""
    if with_logprobs:
        return ROWS_SCHEMA
    return ROWS_SCHEMA.remove(ROWS_SCHEMA.get_field_index("logprobs"))


def tables_from_pylists(ledger, tokens, rollouts, *, logprobs=None, accepted=None, integrity=None):
    """Build SPEC §2 Arrow tables from lists of dicts (tests, notebooks, the reference).

    ``logprobs``/``accepted``: include the optional column; None infers it from the first dict.
    ``integrity``: include ledger.integrity_error; None: iff some ledger dict has that key.
    """
    ledger = list(ledger)
    if integrity is None:
        integrity = any("integrity_error" in row for row in ledger)
    if logprobs is None:
        logprobs = bool(tokens) and "logprobs" in tokens[0]
    if accepted is None:
        accepted = bool(rollouts) and "accepted_response_ids" in rollouts[0]
    tok_schema = TOKENS_SCHEMA.append(LOGPROBS_FIELD) if logprobs else TOKENS_SCHEMA
    ro_schema = ROLLOUTS_SCHEMA.append(ACCEPTED_FIELD) if accepted else ROLLOUTS_SCHEMA
    led_schema = LEDGER_SCHEMA.append(INTEGRITY_FIELD) if integrity else LEDGER_SCHEMA
    return (
        pa.Table.from_pylist(ledger, schema=led_schema),
        pa.Table.from_pylist(list(tokens), schema=tok_schema),
        pa.Table.from_pylist(list(rollouts), schema=ro_schema),
    )
