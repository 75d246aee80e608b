"""chainrows.engine.xxh3 against the xxhash package, bit for bit.

Two kernel signatures in total, so a cold CI run compiles little: xxh3_64_tokens(int32[::1], int64,
int64, uint64) from Python, and hash_deltas's kernel _hash_runs(int64[::1], int32[::1], int64[::1], int64[::1], uint64[::1],
uint64[::1]), which does the bulk of the comparisons. Seeds are always passed as np.uint64 (a Python int would type as int64
below 2**63 and compile a second signature).
"""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from numba.core.errors import TypingError

from chainrows.engine.xxh3 import hash_deltas, xxh3_64_tokens
from tests.support.profiles import examples

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
FIXED_SEEDS = [0, 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1]
RANDOM_SEEDS = [int(x) for x in np.random.default_rng(20240611).integers(0, 2**64, 4, dtype=np.uint64)]
SEEDS = FIXED_SEEDS + RANDOM_SEEDS
OFFSETS = range(8)
BIG_LENGTHS = [1000, 1023, 1024, 4096, 65537, 1_000_003]
# Block / stripe edges of the long path (tokens): 256 tokens = one 1 KiB block, 16 tokens = a stripe.
EDGE_LENGTHS = [
    255, 256, 257, 271, 272, 273, 511, 512, 513, 767, 768, 769, 1279, 1280, 1281, 2047, 2048, 2049,
]


def reference(tokens, start, stop, seed):
    """The definition: xxhash over the little-endian int32 bytes of tokens[start:stop]."""
    return xxhash.xxh3_64_intdigest(tokens[start:stop].astype("<i4").tobytes(), seed)


@pytest.fixture(scope="module")
def buf():
    """Random tokens over the whole int32 range, long enough for the largest case at offset 7."""
    rng = np.random.default_rng(7)
    return rng.integers(I32_MIN, I32_MAX + 1, 1_000_003 + 64, dtype=np.int64).astype(np.int32)


def check_many(tokens, starts, stops, seeds):
    """hash_deltas on every (start, stop, seed) vs the reference; report the first few mismatches."""
    starts = np.asarray(starts, dtype=np.int64)
    stops = np.asarray(stops, dtype=np.int64)
    seeds_u = np.array(seeds, dtype=np.uint64)
    got = hash_deltas(tokens, starts, stops, seeds_u)
    assert got.dtype == np.uint64 and got.shape == starts.shape
    data = memoryview(tokens.astype("<i4", copy=False).tobytes())
    digest = xxhash.xxh3_64_intdigest
    runs = zip(starts.tolist(), stops.tolist(), seeds_u.tolist())
    want = np.array([digest(data[4 * a : 4 * b], s) for a, b, s in runs], dtype=np.uint64)
    bad = np.flatnonzero(got != want)
    first = [
        (int(starts[i]), int(stops[i] - starts[i]), int(seeds_u[i]), int(got[i]), int(want[i]))
        for i in bad[:5]
    ]
    assert bad.size == 0, f"{bad.size} mismatches of {want.size}, first (start, n, seed, got, want): {first}"


def grid(lengths, seeds=SEEDS, offsets=OFFSETS):
    starts, stops, ss = [], [], []
    for n in lengths:
        for seed in seeds:
            for off in offsets:
                starts.append(off)
                stops.append(off + n)
                ss.append(seed)
    return starts, stops, ss


def test_every_length_0_to_300(buf):
    """Every length class and boundary (0, 1..2, 3..4, 5..32, 33..60, 61+ tokens), every seed, offset."""
    check_many(buf, *grid(range(301)))


def test_block_edges(buf):
    check_many(buf, *grid(EDGE_LENGTHS))


def test_big_lengths(buf):
    check_many(buf, *grid(BIG_LENGTHS))


@pytest.mark.parametrize(
    "fill",
    [0, -1, I32_MIN, I32_MAX, "alternating", "small_negative"],
    ids=["zeros", "minus_one", "int32_min", "int32_max", "alternating", "small_negative"],
)
def test_extreme_token_values(fill):
    size = 5000
    if fill == "alternating":
        tokens = np.where(np.arange(size) % 2 == 0, I32_MIN, I32_MAX).astype(np.int32)
    elif fill == "small_negative":
        tokens = -(np.arange(size, dtype=np.int32) % 7) - 1
    else:
        tokens = np.full(size, fill, dtype=np.int32)
    lengths = list(range(0, 70)) + [120, 256, 257, 1000, 4096]
    check_many(tokens, *grid(lengths, seeds=[0, 1, 2**63, 2**64 - 1], offsets=[0, 1, 5]))


def test_scalar_entry_point(buf):
    """xxh3_64_tokens called directly, checked against the literal definition (astype + tobytes)."""
    for n in [0, 1, 2, 3, 4, 5, 8, 32, 33, 60, 61, 64, 100, 256, 257, 1000, 65537]:
        for seed in SEEDS:
            for off in (0, 3):
                got = xxh3_64_tokens(buf, off, off + n, np.uint64(seed))
                assert isinstance(got, (int, np.integer))
                assert int(got) == reference(buf, off, off + n, seed), (n, seed, off)


def test_whole_array_and_tail(buf):
    """A run ending exactly at the end of the array (the last stripe reads the final 64 bytes)."""
    tail = buf[-3000:].copy()
    check_many(tail, [0, 1, 2999, 3000, 2000], [3000, 3000, 3000, 3000, 3000], [0, 2**64 - 1, 5, 6, 2**63])


def test_hash_deltas_empty(buf):
    out = hash_deltas(buf, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint64))
    assert out.shape == (0,) and out.dtype == np.uint64


def test_rejects_non_contiguous_tokens(buf):
    # Fails at typing time: nothing is compiled.
    with pytest.raises(TypingError, match="C-contiguous"):
        xxh3_64_tokens(buf[:100:2], 0, 10, np.uint64(0))


@settings(max_examples=examples(3))
@given(
    n=st.one_of(st.integers(0, 70), st.integers(0, 3000)),
    off=st.integers(0, 15),
    seed=st.one_of(st.sampled_from(FIXED_SEEDS), st.integers(0, 2**64 - 1)),
    data_seed=st.integers(0, 2**32 - 1),
    lo=st.sampled_from([I32_MIN, -5, 0]),
    hi=st.sampled_from([I32_MAX, 5, 100_000]),
)
def test_property_matches_xxhash(n, off, seed, data_seed, lo, hi):
    rng = np.random.default_rng(data_seed)
    tokens = rng.integers(lo, hi + 1, off + n + 3, dtype=np.int64).astype(np.int32)
    assert int(xxh3_64_tokens(tokens, off, off + n, np.uint64(seed))) == reference(tokens, off, off + n, seed)
