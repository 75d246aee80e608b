"""GRPO advantages and row weights, SPEC §5 (vectorised numpy: one pass of bincounts per batch)."""

from __future__ import annotations

import numpy as np

from chainrows.options import Options

EPS = 1e-6
# The largest float32: advantages are written as float32 and saturate here instead of
# becoming ±inf (SPEC §5 has no rule for an advantage float32 cannot hold; docs/limits.md).
ADVANTAGE_LIMIT = float(np.finfo(np.float32).max)


def advantages(reward, has_record, group, ok, options: Options):
    """float64[R] advantage per rollout, NaN where the reward is not finite (reported as null).

    Population: rollouts of the group with a finite reward (``baseline_population="ok"``: ok
    ones only). Fewer than two members: A = 0. ``baseline="loo"``: members use the mean of the
    others. ``no_std``: A = r - baseline. Clipped to ±``ADVANTAGE_LIMIT``, so that every
    finite advantage stays finite as float32.
    """
    finite = has_record & np.isfinite(reward)
    member = finite & ok if options.baseline_population == "ok" else finite
    G = int(group.max()) + 1 if len(group) else 0
    # Work on rewards scaled by the group's largest |reward|: A is scale-invariant (eps scales
    # with them), and huge finite rewards (1e308) then cannot overflow the sums.
    scale = np.zeros(G)
    np.maximum.at(scale, group[finite], np.abs(reward[finite]))
    scale = np.where(scale > 0, scale, 1.0)
    sg = scale[group]
    r = np.where(finite, reward, 0.0) / sg
    n = np.bincount(group, weights=member.astype(np.float64), minlength=G)
    s = np.bincount(group, weights=np.where(member, r, 0.0), minlength=G)
    mean = s / np.maximum(n, 1.0)
    dev = np.where(member, r - mean[group], 0.0)
    var = np.bincount(group, weights=dev * dev, minlength=G) / np.maximum(n - 1.0, 1.0)
    ng = n[group]
    base = mean[group]
    if options.baseline == "loo":
        base = np.where(member, (s[group] - r) / np.maximum(ng - 1.0, 1.0), base)
    a = r - base
    with np.errstate(over="ignore"):  # eps / a subnormal scale is inf: A is then ~0, correctly
        if options.no_std:
            a = a * sg
        else:
            a = a / (np.sqrt(var[group]) + EPS / sg)
    a = np.clip(np.where(ng < 2, 0.0, a), -ADVANTAGE_LIMIT, ADVANTAGE_LIMIT)
    return np.where(finite, a, np.nan)


def row_weights(num_segments, row_ok, options: Options):
    """float32 weight per row: 1 / num_segments (``row_weight="rollout"``) or 1 (``"row"``);
    0 on the placeholder rows of masked rollouts (``row_ok`` False)."""
    if options.row_weight == "rollout":
        weights = (1.0 / np.maximum(num_segments, 1)).astype(np.float32)
    else:
        weights = np.ones(len(num_segments), dtype=np.float32)
    weights[~row_ok] = 0.0
    return weights
