"""Engine arrays -> the ``rows`` and ``report`` Arrow tables of SPEC §4 (vectorised Arrow compute)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chainrows import reasons
from chainrows.engine.run import Decisions, RowArrays
from chainrows.formats.native.schema import REPORT_SCHEMA, rows_schema
from chainrows.lowering.columnar import Labels

_MESSAGES = pa.array([m for _, m, _ in reasons.DETAILS], pa.string())
_KINDS = np.array([k for _, _, k in reasons.DETAILS], dtype=np.int8)
_REASON_OF = np.array(reasons.DETAIL_REASON, dtype=np.int64)
_REASON_NAMES = pa.array([r for r in reasons.REASONS], pa.string())


def _list_array(offsets: np.ndarray, values: pa.Array, large: bool | None = None) -> pa.Array:
    """A list array; 64-bit offsets when ``large`` (None: when ``values`` needs them)."""
    if len(values) >= 2**31 if large is None else large:
        return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values)
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)


def _token_lists(rows: RowArrays, values: np.ndarray, value_type: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """A token-sized list column of the rows, zero copy: one list array over ``values``, or,
    where rows of dropped rollouts left gaps in the buffers (``rows.tok_pos``), one chunk per
    run of rows that lie back to back, each over its own slice of one Arrow array of all of
    ``values``: the column references the whole buffer it keeps alive, so its
    ``get_total_buffer_size`` counts the gaps too (what holding it costs). List type by the
    rows' token total, so it does not depend on the gaps."""
    if rows.tok_pos is None:
        return _list_array(rows.tok_off, pa.array(values, value_type))
    pos, off = rows.tok_pos, rows.tok_off
    if not len(pos):
        return _list_array(off, pa.array(values[:0], value_type))
    starts = np.concatenate(([0], np.flatnonzero(pos[1:] != pos[:-1] + np.diff(off)[:-1]) + 1, [len(pos)]))
    large = off[-1] >= 2**31
    whole = pa.array(values, value_type)
    chunks = []
    for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()):
        piece = off[a:b + 1] - off[a]
        chunks.append(_list_array(piece, whole.slice(int(pos[a]), int(piece[-1])), large))
    return pa.chunked_array(chunks, (pa.large_list if large else pa.list_)(value_type))


def _nullable_float(values: np.ndarray, dtype) -> pa.Array:
    """NaN as null; a value beyond ``dtype``'s range becomes ±inf, without numpy's warning
    (advantages arrive clipped to float32's range: ``engine.advantage.ADVANTAGE_LIMIT``)."""
    mask = np.isnan(values)
    with np.errstate(over="ignore"):
        narrow = values.astype(dtype)
    return pa.array(narrow, mask=mask if mask.any() else None)


def rows_table(rows: RowArrays, labels: Labels, reward: np.ndarray, reward_null: np.ndarray,
               advantage: np.ndarray, weights: np.ndarray) -> pa.Table:
    """The rows table; per rollout ``reward`` (null where ``reward_null``) and ``advantage`` (NaN = null)."""
    rr = pa.array(rows.row_rollout)
    rid = pc.take(labels.rollout_ids, rr)
    row_id = pc.binary_join_element_wise(rid, pc.cast(pa.array(rows.segment), pa.string()), "_s")
    reward_rows = reward[rows.row_rollout]
    reward_arr = pa.array(reward_rows, mask=reward_null[rows.row_rollout])
    columns = {
        "row_id": row_id,
        "rollout_id": rid,
        "group_id": pc.take(labels.group_ids, rr),
        "segment": pa.array(rows.segment, pa.int32()),
        "num_segments": pa.array(rows.num_segments, pa.int32()),
        "input_ids": _token_lists(rows, rows.input_ids, pa.int32()),
        "loss_mask": _token_lists(rows, rows.loss_mask, pa.uint8()),
        "prompt_len": pa.array(rows.prompt_len, pa.int32()),
        "call_ids": _list_array(rows.call_off, pc.take(labels.call_ids, pa.array(rows.row_calls)).cast(pa.string())),
        "reward": reward_arr,
        "advantage": _nullable_float(advantage[rows.row_rollout], np.float32),
        "weight": pa.array(weights, pa.float32()),
    }
    schema = rows_schema(rows.logprobs is not None)
    if rows.logprobs is not None:
        columns["logprobs"] = _token_lists(rows, rows.logprobs, pa.float32())
    return pa.Table.from_arrays([columns[f.name] for f in schema], schema=_schema_for(schema, columns))


def _schema_for(schema: pa.Schema, columns) -> pa.Schema:
    """The SPEC schema, with large_list where a batch needed 64-bit offsets."""
    out = []
    for f in schema:
        out.append(pa.field(f.name, columns[f.name].type))
    return pa.schema(out)


def detail_strings(detail: np.ndarray, bad_call: np.ndarray, bad_pos: np.ndarray, call_ids: pa.Array,
                   integrity_errors: pa.Array | None = None) -> pa.Array:
    """The human detail of every rollout (null when ok), built column-wise.
    ``integrity_errors``: the ledger's integrity_error per call (details of kind CALL_TEXT)."""
    kinds = _KINDS[detail]
    msg = pc.take(_MESSAGES, pa.array(detail.astype(np.int64)))
    names_call = (kinds == reasons.CALL) | (kinds == reasons.CALL_TEXT)
    call_idx = pa.array(np.where(names_call, bad_call, 0), mask=~names_call)
    calls = pc.take(call_ids.cast(pa.string()), call_idx)
    with_call = pc.binary_join_element_wise(msg, calls, ": call ")
    with_text = kinds == reasons.CALL_TEXT
    if integrity_errors is not None and with_text.any():
        text = pc.take(integrity_errors.cast(pa.string()), call_idx)
        with_call = pc.if_else(pa.array(with_text), pc.binary_join_element_wise(with_call, text, ": "),
                               with_call)
    pos = pc.cast(pa.array(bad_pos), pa.string())
    with_pos = pc.binary_join_element_wise(msg, pos, " output position ")
    out = pc.if_else(pa.array(names_call), with_call,
                     pc.if_else(pa.array(kinds == reasons.POSITION), with_pos, msg))
    return pc.if_else(pa.array(detail == 0), pa.scalar(None, pa.string()), out)


def report_table(dec: Decisions, rows: RowArrays, labels: Labels, call_off: np.ndarray,
                 num_roots: np.ndarray, reward: np.ndarray, reward_null: np.ndarray,
                 advantage: np.ndarray) -> pa.Table:
    """One row per rollout of the batch, sorted by rollout_id."""
    ok = dec.ok
    num_rows = np.where(ok, np.diff(rows.row_off), 0).astype(np.int64)
    reason = pc.take(_REASON_NAMES, pa.array(_REASON_OF[dec.detail]))
    cols = [
        labels.rollout_ids,
        labels.group_ids.cast(pa.string()),
        pa.array(np.where(ok, "ok", "masked")).cast(pa.string()),
        reason,
        detail_strings(dec.detail, dec.bad_call, dec.bad_pos, labels.call_ids, labels.integrity_errors),
        pa.array(num_rows),
        pa.array(np.diff(call_off).astype(np.int64)),
        pa.array(dec.num_selected.astype(np.int64)),
        pa.array(num_roots),
        pa.array(np.where(ok, rows.loss_tokens, 0).astype(np.int64)),
        pa.array(reward, mask=reward_null),
        _nullable_float(advantage, np.float32),
    ]
    return pa.Table.from_arrays(cols, schema=REPORT_SCHEMA)
