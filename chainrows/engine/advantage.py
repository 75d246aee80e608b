"""GRPO advantages and row weights, SPEC §5 (vectorised numpy: one pass of bincounts per batch)."""

from __future__ import annotations

import numpy as np

from chainrows.engine.jit import jit
from chainrows.options import Options

EPS = 1e-6
# The largest float32: advantages are written as float32 and saturate here instead of
# becoming ±inf (SPEC §5 has no rule for an advantage float32 cannot hold; docs/limits.md).
ADVANTAGE_LIMIT = float(np.finfo(np.float32).max)


# Rewards are scaled (by a power of two: exact) only in a group whose largest |reward| passes
# this, so that no sum of the group can overflow; below it nothing is scaled and no tiny reward
# can underflow.
SCALE_ABOVE = 2.0**960


def advantages(reward, has_record, group, ok, options: Options):
    """float64[R] advantage per rollout, NaN where the reward is not finite (reported as null).

    Population: rollouts of the group with a finite reward (``baseline_population="ok"``: ok
    ones only). Fewer than two members: A = 0. ``baseline="loo"``: members use the mean of the
    others. ``no_std``: A = r - baseline. Clipped to ±``ADVANTAGE_LIMIT``, so that every
    finite advantage stays finite as float32.

    As exact as float64 allows at any magnitude (docs/decisions.md "Advantages"): each
    deviation r - mean is ``(n r - sum) / n`` with ``n r - sum`` summed exactly and rounded once
    (:func:`group_partials`, :func:`deviations`, Shewchuk's partials as in ``math.fsum``), so it
    is within an ulp of the exact one even where the rewards dwarf their spread (2^53, 2^53 + 2,
    2^53) or span the whole float range (1 beside 1e300); a leave-one-out baseline gives
    n / (n - 1) times it. A group whose largest |reward| is above SCALE_ABOVE is first scaled by
    a power of two, so no sum overflows.
    """
    finite = has_record & np.isfinite(reward)
    member = finite & ok if options.baseline_population == "ok" else finite
    G = int(group.max()) + 1 if len(group) else 0
    top = np.zeros(G)
    np.maximum.at(top, group[finite], np.abs(reward[finite]))
    scale = np.where(top > SCALE_ABOVE, np.ldexp(1.0, np.frexp(top)[1] - 1), 1.0)  # 2**e > top / 2
    sg = scale[group]
    r = np.where(finite, reward, 0.0) / sg
    group64 = group.astype(np.int64)
    order = np.flatnonzero(member)
    order = order[np.argsort(group64[order], kind="stable")]
    n = np.bincount(group64[order], minlength=G).astype(np.int64)
    off = np.zeros(G + 1, np.int64)
    np.cumsum(n, out=off[1:])
    partials, parts_off = group_partials(r, order, off)
    dev = np.zeros(len(r))
    deviations(r, finite, group64, n, parts_off, partials, dev)
    ng = n[group].astype(np.float64)
    spread = np.zeros(G)  # the std from deviations scaled to below 1 (a power of two): no square overflows
    np.maximum.at(spread, group[member], np.abs(dev[member]))
    ds = np.ldexp(1.0, np.frexp(spread)[1])
    dv = np.where(member, dev / ds[group], 0.0)
    std = np.sqrt(np.bincount(group, weights=dv * dv, minlength=G) / np.maximum(n - 1.0, 1.0)) * ds
    a = dev
    if options.baseline == "loo":  # r - (sum - r) / (n - 1) = n / (n - 1) * (r - mean)
        a = np.where(member, dev * (ng / np.maximum(ng - 1.0, 1.0)), dev)
    with np.errstate(over="ignore"):  # eps / a subnormal scale is inf: A is then ~0, correctly
        if options.no_std:
            a = a * sg
        else:
            a = a / (std[group] + EPS / sg)
    a = np.clip(np.where(ng < 2, 0.0, a), -ADVANTAGE_LIMIT, ADVANTAGE_LIMIT)
    return np.where(finite, a, np.nan)


@jit(inline="always")
def _grow(p, start, m, x):
    """Add ``x`` to the exact sum held as non-overlapping partials ``p[start:start + m]``
    (smallest first; Shewchuk's algorithm, as ``math.fsum``); returns the new count, at most
    m + 1."""
    i = 0
    for j in range(m):
        y = p[start + j]
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo != 0.0:
            p[start + i] = lo
            i += 1
        x = hi
    p[start + i] = x
    return i + 1


@jit(inline="always")
def _rounded(p, m):
    """The exact sum of the partials ``p[:m]`` rounded once to float64 (``math.fsum``'s last
    step, half-even correction included)."""
    if m == 0:
        return 0.0
    m -= 1
    hi = p[m]
    lo = 0.0
    while m > 0:
        x = hi
        m -= 1
        y = p[m]
        hi = x + y
        lo = y - (hi - x)
        if lo != 0.0:
            break
    if m > 0 and ((lo < 0.0 and p[m - 1] < 0.0) or (lo > 0.0 and p[m - 1] > 0.0)):
        y = lo * 2.0
        x = hi + y
        if y == x - hi:
            hi = x
    return hi


@jit
def group_partials(r, order, off):
    """Per group g (its members ``order[off[g]:off[g + 1]]``): the exact sum of their ``r`` as
    non-overlapping partials, ``partials[parts_off[g]:parts_off[g + 1]]``. A group never has more
    partials than members."""
    G = len(off) - 1
    buf = np.empty(max(len(order), 1))
    count = np.zeros(G, np.int64)
    for g in range(G):
        m = 0
        for k in range(off[g], off[g + 1]):
            m = _grow(buf, off[g], m, r[order[k]])
        count[g] = m
    parts_off = np.zeros(G + 1, np.int64)
    for g in range(G):
        parts_off[g + 1] = parts_off[g] + count[g]
    partials = np.empty(max(parts_off[G], 1))
    for g in range(G):
        for j in range(count[g]):
            partials[parts_off[g] + j] = buf[off[g] + j]
    return partials, parts_off


@jit
def deviations(r, finite, group, n, parts_off, partials, out):
    """``out[i] = r[i] - mean`` of rollout i's group population (0 where not finite or the
    population is empty), as ``(n r[i] - sum) / n`` with the numerator exact before its one
    rounding (``n r[i]`` split exactly by Dekker's product)."""
    widest = 0
    for g in range(len(n)):
        widest = max(widest, parts_off[g + 1] - parts_off[g])
    tmp = np.empty(widest + 3)
    for i in range(len(r)):
        g = group[i]
        k = n[g]
        if not finite[i] or k == 0:
            out[i] = 0.0
            continue
        m = 0
        for j in range(parts_off[g], parts_off[g + 1]):
            m = _grow(tmp, 0, m, -partials[j])
        p, e = _two_product(r[i], float(k))
        m = _grow(tmp, 0, m, p)
        m = _grow(tmp, 0, m, e)
        out[i] = _rounded(tmp, m) / k


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
