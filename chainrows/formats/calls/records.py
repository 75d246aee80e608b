"""Call records in one columnar form, whatever file they came from (SPEC §8.1).

Both readers (JSON Lines, Parquet) turn their input into record batches of :data:`RECORDS`,
already form-checked: ids, token lists (int32), logprobs (float32, null = none), the item keys
and ids of ``output_items``, whether the record declares its parent, ``failed``. ``record`` is
the record's number in the whole input (input order = capture order within a rollout). The
import works on these batches only; the bucketed path writes them to disk as they are.

:func:`lower` gives the kernels their numpy views (offsets into flat buffers), checked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chainrows.arrays import list_offsets, offsets_rise_within, string_parts

RECORDS = pa.schema([
    ("record", pa.int64()),
    ("rollout_id", pa.string()),
    ("call_id", pa.string()),
    ("response_id", pa.string()),        # null: the record gave none (the call_id is written)
    ("declares", pa.bool_()),            # the record declares its parent (SPEC §8.1 "present")
    ("parent_id", pa.string()),          # the declared parent; null: a declared root, or none
    ("failed", pa.bool_()),
    ("prompt_ids", pa.list_(pa.int32())),       # null only for a failed record without it
    ("completion_ids", pa.list_(pa.int32())),   # null only for a failed record without it
    ("completion_logprobs", pa.list_(pa.float32())),  # null: the record has none
    ("item_keys", pa.list_(pa.uint64())),
    ("item_ids", pa.list_(pa.string())),
])


@dataclass
class Lowered:
    """The numpy views of a records batch the kernels read. Offsets are int64 into the flat
    value buffers; a null token list has length 0 (``has_prompt``/``has_completion`` say
    whether the record gave it); ``logprobs`` runs alongside ``completion``."""

    record: np.ndarray
    rollout_off: np.ndarray
    rollout_data: np.ndarray
    call_off: np.ndarray
    call_data: np.ndarray
    parent_off: np.ndarray
    parent_data: np.ndarray
    parent_valid: np.ndarray
    declares: np.ndarray
    failed: np.ndarray
    prompt_off: np.ndarray
    prompt: np.ndarray
    has_prompt: np.ndarray
    completion_off: np.ndarray
    completion: np.ndarray
    has_completion: np.ndarray
    logprobs: np.ndarray
    has_logprobs: np.ndarray


def _valid(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _tokens(arr: pa.Array, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(int64 offsets into the values, values, validity) of a list column; a null entry reads
    as an empty list whatever its offsets say."""
    valid = _valid(arr)
    if not valid.all():
        arr = pc.if_else(pa.array(valid), arr, pa.scalar([], arr.type))
    offsets = list_offsets(arr)
    values = arr.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    if len(offsets) == 0 or not offsets_rise_within(offsets, len(values)):
        raise ValueError("list offsets outside the values buffer")
    return offsets, values, valid


def lower(batch: pa.RecordBatch) -> Lowered:
    """The kernels' views of a :data:`RECORDS` batch (no copy where Arrow's layout allows)."""
    roll_off, roll_data, _ = string_parts(batch.column("rollout_id"))
    call_off, call_data, _ = string_parts(batch.column("call_id"))
    parent_off, parent_data, parent_valid = string_parts(batch.column("parent_id"))
    p_off, p_val, has_p = _tokens(batch.column("prompt_ids"), np.int32)
    c_off, c_val, has_c = _tokens(batch.column("completion_ids"), np.int32)
    lp_off, lp_val, has_lp = _tokens(batch.column("completion_logprobs"), np.float32)
    logprobs = np.zeros(len(c_val), np.float32)
    if has_lp.any():  # laid out alongside the completion tokens
        lengths = np.diff(lp_off)
        if np.any((lengths != np.diff(c_off)) & has_lp):
            raise ValueError("completion_logprobs of another length than completion_ids")
        _scatter_runs(logprobs, c_off, lp_val, lp_off, has_lp)
    n = batch.num_rows
    return Lowered(
        record=batch.column("record").to_numpy().astype(np.int64, copy=False),
        rollout_off=roll_off, rollout_data=roll_data, call_off=call_off, call_data=call_data,
        parent_off=parent_off, parent_data=parent_data,
        parent_valid=np.ones(n, bool) if parent_valid is None else parent_valid,
        declares=_bools(batch.column("declares")), failed=_bools(batch.column("failed")),
        prompt_off=p_off, prompt=p_val, has_prompt=has_p,
        completion_off=c_off, completion=c_val, has_completion=has_c,
        logprobs=logprobs, has_logprobs=has_lp,
    )


def _bools(arr: pa.Array) -> np.ndarray:
    return np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


def _scatter_runs(out: np.ndarray, out_off: np.ndarray, values: np.ndarray, off: np.ndarray,
                  which: np.ndarray) -> None:
    """out[out_off[i]:out_off[i+1]] = values[off[i]:off[i+1]] for every i with ``which[i]``
    (the runs have equal lengths)."""
    idx = np.flatnonzero(which)
    lengths = (off[idx + 1] - off[idx]).astype(np.int64)
    total = int(lengths.sum())
    if total == 0:
        return
    run_of = np.repeat(np.arange(len(idx)), lengths)
    within = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[out_off[idx][run_of] + within] = values[off[idx][run_of] + within]
