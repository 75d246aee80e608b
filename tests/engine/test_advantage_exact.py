"""Advantages as exact as float64 allows at any magnitude (SPEC §5, docs/format.md): the kernel
(chainrows.engine.advantage) and the reference (chainrows.reference.reassembly.advantages)
against §5 computed in exact rational arithmetic (fractions.Fraction), on rewards whose
magnitude dwarfs their spread."""

import math
from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from chainrows.engine.advantage import ADVANTAGE_LIMIT, EPS, advantages
from chainrows.options import Options
from chainrows.reference.reassembly import Rollout
from chainrows.reference.reassembly import advantages as reference_advantages
from tests.support.profiles import examples

OPTIONS = [Options(baseline=b, no_std=s) for b in ("mean", "loo") for s in (False, True)]


def exact(rewards, options):
    """§5 in rationals: A_i = (r_i - baseline_i) / (std + eps), or r_i - baseline_i."""
    x = [Fraction(r) for r in rewards]
    n = len(x)
    mean = sum(x) / n
    scale = Fraction(2) ** math.frexp(max(abs(r) for r in rewards))[1]  # var / scale^2 fits a float
    std = Fraction(math.sqrt(sum((v - mean) ** 2 for v in x) / (n - 1) / scale**2)) * scale
    out = []
    for v in x:
        base = (sum(x) - v) / (n - 1) if options.baseline == "loo" else mean
        d = v - base
        a = d if options.no_std else d / (std + Fraction(EPS))
        out.append(float(max(-ADVANTAGE_LIMIT, min(ADVANTAGE_LIMIT, a))))
    return out


def kernel(rewards, options):
    n = len(rewards)
    return advantages(np.array(rewards, np.float64), np.ones(n, bool), np.zeros(n, np.int64),
                      np.ones(n, bool), options).tolist()


def reference(rewards, options):
    rollouts = []
    for i, r in enumerate(rewards):
        ro = Rollout(f"r{i}")
        ro.records.append({"group_id": "g", "reward": r})
        rollouts.append(ro)
    got = reference_advantages(rollouts, {ro.rollout_id: "ok" for ro in rollouts}, options)
    return [got[ro.rollout_id] for ro in rollouts]


def close(got, want):
    # std's square root and the final division round; eps is exact in both
    return all(math.isclose(g, w, rel_tol=1e-12, abs_tol=0.0) or abs(g - w) <= 1e-12 * max(1.0, abs(w))
               for g, w in zip(got, want))


def test_rewards_that_dwarf_their_spread():
    """2^53, 2^53 + 2, 2^53: §5 gives -0.577, +1.155, -0.577 (the kernel gave ±0.816 when it
    scaled by the largest |reward| before subtracting the mean)."""
    rewards = [2.0**53, 2.0**53 + 2, 2.0**53]
    want = exact(rewards, Options())
    assert np.allclose(np.float32(want), [-0.57735, 1.1547, -0.57735], atol=1e-5)
    for compute in (kernel, reference):
        assert np.float32(compute(rewards, Options())).tolist() == np.float32(want).tolist(), compute


def test_tiny_reward_beside_huge_opposites():
    """1.0 beside 1e30 and -1e30 with --no-std: 1 - 1/3 exactly, not 1.0 (a plain float64 sum
    loses the 1.0)."""
    rewards = [1.0, 1e30, -1e30]
    for compute in (kernel, reference):
        assert close(compute(rewards, Options(no_std=True)), exact(rewards, Options(no_std=True))), compute


OFFSETS = st.sampled_from([0.0, 1.0, 1e6, 2.0**52, 2.0**53, -(2.0**60), 1e15, 1e300, -1e300, 1.7e308, 1e-300, 5e-324])
SPREADS = st.sampled_from([0.0, 1e-300, 1.0, 2.0, 1e3, 1e15, 1e30, 1e300])


@settings(max_examples=examples(2), deadline=None)
@given(offset=OFFSETS, spread=SPREADS, steps=st.lists(st.integers(-4, 4), min_size=2, max_size=7),
       which=st.integers(0, len(OPTIONS) - 1))
def test_kernel_and_reference_are_exact_at_large_offsets(offset, spread, steps, which):
    rewards = [offset + spread * k for k in steps]
    if not all(math.isfinite(r) for r in rewards):
        return
    options = OPTIONS[which]
    want = exact(rewards, options)
    assert close(kernel(rewards, options), want), (rewards, options)
    assert close(reference(rewards, options), want), (rewards, options)
