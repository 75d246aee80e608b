"""Property tests: the Numba engine agrees with the pure-Python reference on random inputs."""


import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chainrows import reference
from tests.support.compare import compare_outputs
from tests.support.engine_adapter import engine_reassemble
from tests.support.profiles import examples
from tests.support.randomized import random_dataset


def compare(seed, ledger, tokens, rollouts, options):
    want_rows, want_report = reference.reassemble(ledger, tokens, rollouts, **options)
    got_rows, got_report = engine_reassemble(ledger, tokens, rollouts, **options)
    compare_outputs(f"seed={seed} options={options}", got_rows, got_report, want_rows, want_report)


@settings(max_examples=examples(15), suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_engine_matches_reference(seed):
    ledger, tokens, rollouts, options = random_dataset(seed)
    compare(seed, ledger, tokens, rollouts, options)


@settings(max_examples=examples(0.4))
@given(seed=st.integers(0, 2**32 - 1))
def test_engine_matches_reference_large_batches(seed):
    """Many rollouts per batch: parallel chunks, cross-rollout joins and groups."""
    ledger, tokens, rollouts, options = random_dataset(seed, n_rollouts=120, corrupt=0.3)
    compare(seed, ledger, tokens, rollouts, options)


@settings(max_examples=examples(3), suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_engine_matches_reference_through_the_candidate_index(seed):
    """The same with select's direct scan of small candidate sets turned off, so every position
    goes through the (item count, key hash) index that large rollouts use."""
    from chainrows.engine import select

    ledger, tokens, rollouts, options = random_dataset(seed)
    saved = select.LINEAR_MAX
    select.LINEAR_MAX = 0
    try:
        compare(seed, ledger, tokens, rollouts, options)
    finally:
        select.LINEAR_MAX = saved


@settings(max_examples=examples(2), suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), threads=st.sampled_from((1, 2)))
def test_engine_matches_reference_with_every_delta_streamed(seed, threads):
    """The same with the row copies streaming every delta (chainrows.engine.streamcopy), where
    a run streams only deltas of 512 bytes and more into outputs of 32 MiB and more: these
    deltas of up to 73 tokens then cover the head, whole-line and tail parts of the copy."""
    import numba

    from chainrows.engine import run as engine_run

    ledger, tokens, rollouts, options = random_dataset(seed, n_rollouts=40)
    saved_threads, saved_from = numba.get_num_threads(), engine_run.stream_from
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    engine_run.stream_from = lambda output_bytes: 1
    try:
        compare(seed, ledger, tokens, rollouts, options)
    finally:
        engine_run.stream_from = saved_from
        numba.set_num_threads(saved_threads)


def test_corruptions_reach_every_reason_code():
    """The random inputs above do exercise every reason code (else the property is weak)."""
    from chainrows.reasons import REASONS

    seen = set()
    for seed in range(600):
        ledger, tokens, rollouts, options = random_dataset(seed)
        for mode in ("cc", "ordinary"):
            _, report = reference.reassemble(ledger, tokens, rollouts, **dict(options, mode=mode))
            seen |= {r["reason"] for r in report}
    missing = {r for r in REASONS if r} - seen
    assert not missing, f"never produced: {sorted(missing)}"


@settings(max_examples=examples(2))
@given(sizes=st.lists(st.integers(0, 80), min_size=0, max_size=12),
       n_lens=st.integers(1, 4), n_hashes=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_candidate_index_kernel_matches_lexsort(sizes, n_lens, n_hashes, seed):
    """candidate_index against its plain definition, np.lexsort over the calls with keys: groups
    of 0-80 calls (Shell sort gaps up to 40), many ties in length and hash; count_candidates
    against a bincount of the calls with keys, and build_candidates, which runs both, against
    the two."""
    from chainrows.engine.batch import readonly
    from chainrows.engine.select import build_candidates, call_key_hashes, candidate_index, count_candidates

    rng = np.random.default_rng(seed)
    R = len(sizes)
    call_off = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    C = int(call_off[-1])
    rollout = np.repeat(np.arange(R, dtype=np.int64), sizes)
    key_len = rng.integers(0, n_lens, C).astype(np.int64)  # 0: a call without keys
    whole = rng.integers(0, n_hashes, C).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    with_keys = np.flatnonzero(key_len > 0)
    expected = with_keys[np.lexsort((whole[with_keys], key_len[with_keys], rollout[with_keys]))]
    cand_off = np.concatenate(([0], np.cumsum(np.bincount(rollout[with_keys], minlength=R)))).astype(np.int64)
    got = np.full(len(with_keys), -1, dtype=np.int64)
    got_len = np.full(len(with_keys), -1, dtype=np.int64)
    got_hash = np.zeros(len(with_keys), dtype=np.uint64)
    counts = np.full(R, -1, dtype=np.int64)
    # read-only inputs, as build_batch passes them (one compiled signature); the rollouts in
    # three parts, as threads get them
    cuts = np.sort(rng.integers(0, R + 1, 2))
    for part in ([0, cuts[0]], [cuts[0], cuts[1]], [cuts[1], R]):
        part = np.array(part, dtype=np.int64)
        count_candidates(part, readonly(call_off), readonly(key_len), counts)
        candidate_index(part, readonly(call_off), readonly(key_len), readonly(whole),
                        readonly(cand_off), got, got_len, got_hash)
    assert np.array_equal(got, expected)
    assert np.array_equal(got_len, key_len[expected]) and np.array_equal(got_hash, whole[expected])
    assert np.array_equal(counts, np.diff(cand_off))

    # the whole index from keys: item counts as drawn, keys from a small alphabet (equal hashes)
    key_off = np.concatenate(([0], np.cumsum(key_len))).astype(np.int64)
    item_keys = rng.integers(0, 3, int(key_off[-1])).astype(np.uint64)
    hashes = np.empty(C, dtype=np.uint64)
    call_key_hashes(np.array([0, C], dtype=np.int64), readonly(key_off), readonly(item_keys), hashes)
    cand = build_candidates(call_off, key_off, item_keys)
    want = with_keys[np.lexsort((hashes[with_keys], key_len[with_keys], rollout[with_keys]))]
    assert np.array_equal(cand.off, cand_off) and np.array_equal(cand.call, want)
    assert np.array_equal(cand.length, key_len[want]) and np.array_equal(cand.hash, hashes[want])


@given(slots=st.lists(st.lists(st.integers(-2, 6), max_size=4), max_size=30))
def test_serving_index_matches_its_plain_definition(slots):
    """select.serving_index against its definition: per id code k, the calls (ascending, once
    per slot) whose item slots hold k; -1 (null) and NO_OUTPUT (-2) codes serve nothing."""
    from chainrows.engine.select import serving_index

    key_off = np.concatenate(([0], np.cumsum([len(s) for s in slots]))).astype(np.int64)
    item_ids = np.array([k for s in slots for k in s], dtype=np.int64)
    off, calls = serving_index(key_off, item_ids, 7)
    want = [[c for c, s in enumerate(slots) for k in s if k == code] for code in range(7)]
    assert [calls[off[k]:off[k + 1]].tolist() for k in range(7)] == want


def test_serving_index_refuses_a_code_past_the_outputs():
    """A code at or past n_out is refused before anything is written at it (the kernel has no
    bounds checks); Batch.validate refuses such a batch first, this is the kernel's own guard."""
    from chainrows.engine.select import serving_index

    key_off = np.array([0, 2, 3], dtype=np.int64)
    with pytest.raises(AssertionError, match="outside the outputs"):
        serving_index(key_off, np.array([0, 1, 7], dtype=np.int64), 7)
    off, calls = serving_index(key_off, np.array([0, 1, 6], dtype=np.int64), 7)
    assert calls.tolist() == [0, 0, 1] and off.tolist() == [0, 1, 2, 2, 2, 2, 2, 3]
