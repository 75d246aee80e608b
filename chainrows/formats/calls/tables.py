"""A decided chunk as Arrow: its ledger rows, token rows and import_report rows (SPEC §8.6).

Schemas: the ledger of SPEC §2 with ``integrity_error`` (always written, null where fine), the
tokens of SPEC §2 with ``logprobs`` (dropped at the end of an import whose records had none),
and :data:`REPORT` (SPEC §8.6, then the token ids on both sides of the first difference).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chainrows.formats.calls.infer import DECLARED_MISMATCH, DRIFT, NO_TOKEN, RELATIONS
from chainrows.formats.calls.records import Lowered
from chainrows.formats.calls.state import Decided, ImportState
from chainrows.formats.native.schema import INTEGRITY_FIELD, LEDGER_SCHEMA, LOGPROBS_FIELD, TOKENS_SCHEMA

LEDGER = LEDGER_SCHEMA.append(INTEGRITY_FIELD)
TOKENS = TOKENS_SCHEMA.append(LOGPROBS_FIELD)
REPORT = pa.schema([
    ("rollout_id", pa.string()),
    ("call_id", pa.string()),
    ("parent_id", pa.string()),
    ("relation", pa.string()),
    ("against_call", pa.string()),
    ("diverge_at", pa.int64()),
    ("prompt_len", pa.int64()),
    ("completion_len", pa.int64()),
    ("diverge_token", pa.int32()),     # the record's prompt token at diverge_at
    ("against_token", pa.int32()),     # against_call's token at diverge_at (of its prompt + completion)
])
ON_DRIFT = ("root", "mask")


def _masked(values: np.ndarray, valid: np.ndarray, arrow_type) -> pa.Array:
    return pa.array(values, arrow_type, mask=~valid)


def integrity_errors(batch: pa.RecordBatch, dec: Decided, names: pa.Array, on_drift: str) -> pa.Array:
    """ledger.integrity_error: SPEC §8.4's texts for a declared parent the prompt does not
    extend, and §8.3's for a drift under ``--on-drift mask``; null elsewhere."""
    rel = dec.relation
    hit = (rel == DECLARED_MISMATCH) | ((rel == DRIFT) if on_drift == "mask" else False)
    out = [None] * len(rel)
    if hit.any():
        declared = batch.column("parent_id")
        for i in np.flatnonzero(hit).tolist():
            k = int(dec.diverge[i])
            if rel[i] == DRIFT:
                out[i] = f"token drift: differs from call {names[i].as_py()}'s generated tokens at token {k}"
            elif dec.against_rec[i] >= 0:
                out[i] = f"prompt does not extend call {names[i].as_py()}: first difference at token {k}"
            else:
                out[i] = (f"declared parent {declared[i].as_py()} is not an earlier, non-failed call "
                          f"of the rollout")
    return pa.array(out, pa.string())


def chunk_tables(batch: pa.RecordBatch, low: Lowered, dec: Decided, state: ImportState,
                 on_drift: str) -> tuple[pa.Table, pa.Table, pa.Table]:
    """(ledger, tokens, import_report) rows of one decided records batch, in its order."""
    failed = low.failed
    against = state.calls.names(dec.against_call)
    parent = pc.if_else(pa.array(failed), batch.column("parent_id"), state.calls.names(dec.parent_call))
    ledger = pa.table({
        "rollout_id": batch.column("rollout_id"),
        "call_id": batch.column("call_id"),
        "parent_id": parent,
        "response_id": pc.coalesce(batch.column("response_id"), batch.column("call_id")),
        "prev_len": pa.array(dec.prev_len, pa.int64()),
        "delta_len": pa.array(dec.delta_len, pa.int64()),
        "gen_len": pa.array(dec.gen_len, pa.int64()),
        "chain_hash": pa.array(dec.chain_hash, pa.uint64()),
        "item_keys": batch.column("item_keys"),
        "item_ids": batch.column("item_ids"),
        "failed": pa.array(failed),
        "integrity_error": integrity_errors(batch, dec, against, on_drift),
    }, schema=LEDGER)
    tokens = _token_rows(batch, low, dec)
    report = _report_rows(batch, low, dec, parent, against)
    return ledger, tokens, report


def _token_rows(batch: pa.RecordBatch, low: Lowered, dec: Decided) -> pa.Table:
    keep = np.flatnonzero(~low.failed)
    offsets = np.append(dec.delta_off[keep], dec.delta_off[-1]).astype(np.int32)
    off = pa.array(offsets)
    lp = pa.ListArray.from_arrays(off, pa.array(dec.delta_logprobs, pa.float32()))
    if not low.has_logprobs[keep].all():  # a record without logprobs: a null list
        lp = pa.ListArray.from_arrays(off, lp.values, mask=pa.array(~low.has_logprobs[keep]))
    take = pa.array(keep)
    return pa.table({
        "rollout_id": batch.column("rollout_id").take(take),
        "call_id": batch.column("call_id").take(take),
        "tokens": pa.ListArray.from_arrays(off, pa.array(dec.delta, pa.int32())),
        "logprobs": lp,
    }, schema=TOKENS)


def _report_rows(batch: pa.RecordBatch, low: Lowered, dec: Decided, parent: pa.Array,
                 against: pa.Array) -> pa.Table:
    relation = pa.DictionaryArray.from_arrays(pa.array(dec.relation.astype(np.int8)),
                                              pa.array(RELATIONS)).cast(pa.string())
    prompt_len = np.diff(low.prompt_off)
    completion_len = np.diff(low.completion_off)
    return pa.table({
        "rollout_id": batch.column("rollout_id"),
        "call_id": batch.column("call_id"),
        "parent_id": parent,
        "relation": relation,
        "against_call": against,
        "diverge_at": _masked(dec.diverge, dec.diverge >= 0, pa.int64()),
        "prompt_len": _masked(prompt_len, low.has_prompt, pa.int64()),
        "completion_len": _masked(completion_len, low.has_completion, pa.int64()),
        "diverge_token": _masked(dec.tok_here.astype(np.int32), dec.tok_here != NO_TOKEN, pa.int32()),
        "against_token": _masked(dec.tok_there.astype(np.int32), dec.tok_there != NO_TOKEN, pa.int32()),
    }, schema=REPORT)


__all__ = ["LEDGER", "TOKENS", "REPORT", "ON_DRIFT", "chunk_tables", "integrity_errors"]
