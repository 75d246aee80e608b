"""Kernel: rollout-level checks, SPEC §3 steps 1–4b."""

from __future__ import annotations

import numpy as np

from chainrows.engine.jit import jit
from chainrows.reasons import (
    D_CAPTURE_FAILED,
    D_DUP_CALL_ID,
    D_DUP_RESPONSE_ID,
    D_DUP_ROLLOUT,
    D_DUP_TOKEN_ROW,
    D_LEN_ITEM_IDS,
    D_LEN_OUTPUT_IDS,
    D_NO_CALLS,
    D_NO_ROLLOUT_RECORD,
    D_REWARD_INF,
    D_REWARD_NAN,
    D_REWARD_NULL,
)


@jit(inline="always")
def _first_set(flags, a, b):
    for c in range(a, b):
        if flags[c]:
            return c
    return -1


@jit
def rollout_checks(chunks, call_off, has_record, dup_record, reward, reward_null, out_ids_bad_len,
                   failed, dup_call_id, dup_response_id, dup_tokens, item_ids_bad_len,
                   detail, bad_call):
    """Write the first failing detail id of steps 1–4b (and its call) for every rollout."""
    for k in range(len(chunks) - 1):
        for r in range(chunks[k], chunks[k + 1]):
            a = call_off[r]
            b = call_off[r + 1]
            if not has_record[r]:
                detail[r] = D_NO_ROLLOUT_RECORD
                continue
            if a == b:
                detail[r] = D_NO_CALLS
                continue
            c = _first_set(failed, a, b)
            if c >= 0:
                detail[r] = D_CAPTURE_FAILED
                bad_call[r] = c
                continue
            if reward_null[r]:
                detail[r] = D_REWARD_NULL
                continue
            if np.isnan(reward[r]):
                detail[r] = D_REWARD_NAN
                continue
            if np.isinf(reward[r]):
                detail[r] = D_REWARD_INF
                continue
            if dup_record[r]:
                detail[r] = D_DUP_ROLLOUT
                continue
            c = _first_set(dup_call_id, a, b)
            if c >= 0:
                detail[r] = D_DUP_CALL_ID
                bad_call[r] = c
                continue
            c = _first_set(dup_response_id, a, b)
            if c >= 0:
                detail[r] = D_DUP_RESPONSE_ID
                bad_call[r] = c
                continue
            c = _first_set(dup_tokens, a, b)
            if c >= 0:
                detail[r] = D_DUP_TOKEN_ROW
                bad_call[r] = c
                continue
            if out_ids_bad_len[r]:
                detail[r] = D_LEN_OUTPUT_IDS
                continue
            c = _first_set(item_ids_bad_len, a, b)
            if c >= 0:
                detail[r] = D_LEN_ITEM_IDS
                bad_call[r] = c
