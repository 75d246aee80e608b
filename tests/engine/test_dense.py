"""Dense codes of uint64 keys (chainrows.engine.dense) against their plain-Python definition,
and the bulk scan built on them against a sort-based recount."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chainrows.engine.dense import dense_codes, dense_codes_py, group_order, group_order_py, table_bits
from tests.support.profiles import examples

# few distinct keys (long runs of equal ones), extremes of the range, and keys that share
# their table slot (multiples of a large power of two land together after the mix's shift)
KEYS = st.lists(st.one_of(st.integers(0, 5), st.sampled_from([2**64 - 1, 2**63, 1 << 40, 2 << 40, 3 << 40])),
                max_size=300)


@settings(max_examples=examples(2))
@given(KEYS, st.data())
def test_dense_codes_are_their_plain_definition(keys, data):
    second = [k * 7 % 2**64 for k in keys]
    if keys and data.draw(st.booleans()):  # an id clash somewhere
        i = data.draw(st.integers(0, len(keys) - 1))
        second[i] = (second[i] + 1) % 2**64
    codes, first, clash = dense_codes(np.array(keys, dtype=np.uint64), np.array(second, dtype=np.uint64))
    want_codes, want_first, want_clash = dense_codes_py(keys, second)
    assert codes.tolist() == want_codes and first.tolist() == want_first and clash == want_clash


def test_dense_codes_without_a_second_hash_and_on_no_keys():
    codes, first, clash = dense_codes(np.array([9, 3, 9, 9, 3, 1], dtype=np.uint64))
    assert codes.tolist() == [0, 1, 0, 0, 1, 2] and first.tolist() == [0, 1, 5] and clash == -1
    codes, first, clash = dense_codes(np.zeros(0, dtype=np.uint64))
    assert len(codes) == len(first) == 0 and clash == -1
    with pytest.raises(ValueError):
        dense_codes(np.zeros(3, dtype=np.uint64), np.zeros(2, dtype=np.uint64))


def test_the_table_is_at_least_twice_the_keys():
    for n in (0, 1, 7, 8, 9, 1000, 1 << 20):
        assert (1 << table_bits(n)) >= 2 * n


def test_many_random_keys_match_numpys_unique():
    keys = np.random.default_rng(0).integers(0, 50_000, 400_000).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    codes, first, clash = dense_codes(keys)
    uniq, inverse = np.unique(keys, return_inverse=True)
    assert len(first) == len(uniq) and clash == -1
    assert np.array_equal(keys[first][codes], keys)  # each code stands for its key
    # the same partition as np.unique's, numbered in order of first appearance
    assert len(np.unique(codes * len(uniq) + inverse.ravel())) == len(uniq)
    assert np.all(np.diff(first) > 0)


def test_the_scan_groups_rows_as_a_sort_based_recount(tmp_path):
    """Every row's group in the bulk scan is its rollout's first rollouts row's group_id (its
    own group when it has none), whatever the numbering."""
    import pyarrow.parquet as pq

    from chainrows.runners.bulk.windows import scan
    from chainrows.synth import write_synth_dataset

    write_synth_dataset(tmp_path, 60, seed=3, corrupt_rate=0.3)
    sc = scan(tmp_path, True)
    ro = pq.read_table(tmp_path / "rollouts.parquet").to_pylist()
    group_of = {}
    for r in ro:
        group_of.setdefault(r["rollout_id"], ("g", r["group_id"]) if r["group_id"] is not None else ("r", r["rollout_id"]))
    labels = {}
    for name in ("ledger", "tokens", "rollouts"):
        rids = pq.read_table(tmp_path / f"{name}.parquet", columns=["rollout_id"])["rollout_id"].to_pylist()
        assert len(rids) == len(sc.tables[name].group)
        for rid, code in zip(rids, sc.tables[name].group.tolist()):
            want = group_of.get(rid, ("r", rid))
            assert labels.setdefault(code, want) == want  # one code, one group
    assert len(labels) == sc.n_groups == len(set(labels.values()))


@settings(max_examples=examples(2))
@given(st.integers(1, 12).flatmap(lambda n: st.tuples(st.just(n), st.lists(st.integers(0, n - 1), max_size=60))))
def test_group_order_is_its_plain_definition(case):
    n, codes = case
    order, off = group_order(np.array(codes, dtype=np.int64), n)
    want_order, want_off = group_order_py(codes, n)
    assert order.tolist() == want_order and off.tolist() == want_off


def test_group_order_is_numpys_stable_argsort_on_many_codes():
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 5000, 200_000)
    order, off = group_order(codes, 5000)
    assert np.array_equal(order, np.argsort(codes, kind="stable"))
    assert np.array_equal(off, np.searchsorted(np.sort(codes), np.arange(5001)))
    assert group_order(np.zeros(0, dtype=np.int64), 3)[1].tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("bad", [[0, 3], [-1, 0]])
def test_group_order_refuses_codes_outside_the_range(bad):
    with pytest.raises(ValueError, match="outside"):
        group_order(np.array(bad, dtype=np.int64), 3)
