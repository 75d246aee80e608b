"""GRPO advantages and row weights, SPEC §5 (vectorised numpy: one pass of bincounts per batch)."""

from __future__ import annotations

import numpy as np

from chainrows.engine.jit import jit
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

    As exact as float64 allows at any magnitude (docs/format.md §5): each group's rewards are
    scaled by a power of two above half its largest |reward| (exact, and no sum can overflow);
    the mean is a compensated sum divided in double-double (:func:`group_means`), so each
    deviation r - mean is within an ulp or two of the exact one even where the rewards dwarf
    their spread (2^53, 2^53 + 2, 2^53); a leave-one-out baseline gives n / (n - 1) times it.
    """
    finite = has_record & np.isfinite(reward)
    member = finite & ok if options.baseline_population == "ok" else finite
    G = int(group.max()) + 1 if len(group) else 0
    top = np.zeros(G)
    np.maximum.at(top, group[finite], np.abs(reward[finite]))
    scale = np.ldexp(1.0, np.frexp(top)[1] - 1)  # 2**e > top / 2, so |r| < 2 (2**1024 is inf)
    sg = scale[group]
    r = np.where(finite, reward, 0.0) / sg
    n, hi, lo = group_means(r, member, group.astype(np.int64), G)
    ng = n[group].astype(np.float64)
    dev = np.where(finite, (r - hi[group]) - lo[group], 0.0)
    var = np.bincount(group, weights=np.where(member, dev * dev, 0.0), minlength=G) / np.maximum(n - 1.0, 1.0)
    a = dev
    if options.baseline == "loo":  # r - (sum - r) / (n - 1) = n / (n - 1) * (r - mean)
        a = np.where(member, dev * (ng / np.maximum(ng - 1.0, 1.0)), dev)
    with np.errstate(over="ignore"):  # eps / a subnormal scale is inf: A is then ~0, correctly
        if options.no_std:
            a = a * sg
        else:
            a = a / (np.sqrt(var[group]) + EPS / sg)
    a = np.clip(np.where(ng < 2, 0.0, a), -ADVANTAGE_LIMIT, ADVANTAGE_LIMIT)
    return np.where(finite, a, np.nan)


@jit
def group_means(r, member, group, G):
    """Per group: members, and the mean of the members' ``r`` as a double-double ``hi + lo``.
    The sum is Neumaier's compensated sum (``1e-30 + 1 - 1`` is ``1e-30``); the division by the
    count keeps its remainder (Dekker's exact product), so ``hi + lo`` is the mean to about
    2^-100 relative, where ``hi`` alone may be off by half an ulp."""
    s = np.zeros(G)
    c = np.zeros(G)
    n = np.zeros(G, np.int64)
    for i in range(len(r)):
        if member[i]:
            g = group[i]
            x = r[i]
            t = s[g] + x
            if abs(s[g]) >= abs(x):
                c[g] += (s[g] - t) + x
            else:
                c[g] += (x - t) + s[g]
            s[g] = t
            n[g] += 1
    hi = np.zeros(G)
    lo = np.zeros(G)
    for g in range(G):
        if n[g] == 0:
            continue
        k = float(n[g])
        q1 = s[g] / k
        p, pe = _two_product(q1, k)
        q2 = (((s[g] - p) - pe) + c[g]) / k
        hi[g] = q1 + q2
        lo[g] = q2 - (hi[g] - q1)
    return n, hi, lo


@jit(inline="always")
def _split(a):
    t = 134217729.0 * a  # 2^27 + 1
    h = t - (t - a)
    return h, a - h


@jit(inline="always")
def _two_product(a, b):
    """a * b = p + e exactly (Dekker; no fused multiply-add needed)."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def row_weights(num_segments, row_ok, options: Options):
    """float32 weight per row: 1 / num_segments (``row_weight="rollout"``) or 1 (``"row"``);
    0 on the placeholder rows of masked rollouts (``row_ok`` False)."""
    if options.row_weight == "rollout":
        weights = (1.0 / np.maximum(num_segments, 1)).astype(np.float32)
    else:
        weights = np.ones(len(num_segments), dtype=np.float32)
    weights[~row_ok] = 0.0
    return weights
