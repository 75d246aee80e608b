"""The engine's output against the reference's (dict lists), field by field: exact where the
SPEC is exact, floats to within 1e-5, placeholder tokens left out."""

from __future__ import annotations

import math

import numpy as np

EXACT_REPORT = ("rollout_id", "group_id", "status", "reason", "detail", "num_rows", "num_calls",
                "num_selected", "num_roots", "loss_tokens")
EXACT_ROWS = ("row_id", "rollout_id", "group_id", "segment", "num_segments", "input_ids",
              "loss_mask", "logprobs", "prompt_len", "call_ids", "weight")


def _same_float(a, b):
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5)


def _same_list(a, b):
    if a is None or b is None:
        return a is None and b is None
    if any(isinstance(x, float) for x in a + b):  # logprobs travel as float32 through Arrow
        a, b = np.float32(a).tolist(), np.float32(b).tolist()
    return len(a) == len(b) and all(x == y or (x != x and y != y) for x, y in zip(a, b))


def compare_outputs(ctx, got_rows, got_report, want_rows, want_report):
    """Engine output (dict lists) against the reference's, field by field."""
    assert [r["rollout_id"] for r in got_report] == [r["rollout_id"] for r in want_report], ctx
    for g, w in zip(got_report, want_report):
        for key in EXACT_REPORT:
            assert g[key] == w[key], f"{ctx} {w['rollout_id']} report.{key}: engine {g[key]!r} reference {w[key]!r}"
        for key in ("reward", "advantage"):
            assert _same_float(g[key], w[key]), f"{ctx} {w['rollout_id']} report.{key}: {g[key]!r} vs {w[key]!r}"
    assert len(got_rows) == len(want_rows), ctx
    for g, w in zip(got_rows, want_rows):
        placeholder = w["weight"] == 0.0
        for key in EXACT_ROWS:
            if key not in w or (placeholder and key in ("input_ids", "loss_mask", "logprobs", "prompt_len", "call_ids")):
                continue  # placeholder tokens are unspecified by the SPEC
            if key in ("input_ids", "loss_mask", "logprobs", "call_ids"):
                assert _same_list(g[key], w[key]), f"{ctx} {w['row_id']}.{key}"
            else:
                assert g[key] == w[key], f"{ctx} {w['row_id']}.{key}: {g[key]!r} vs {w[key]!r}"
        for key in ("reward", "advantage"):
            assert _same_float(g[key], w[key]), f"{ctx} {w['row_id']}.{key}"
        assert set(g) == set(w), ctx
