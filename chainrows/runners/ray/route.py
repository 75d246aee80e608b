"""Routing every input row to the decide task of its GRPO group in one shuffle, and cutting a
sorted output into the key ranges of the output parts.

The group of a rollout is named by its *first* rollouts row in read order (SPEC §3 step 4: only
the first row counts): that row's group_id, or the rollout itself when the group_id is null or
the rollout has no rollouts row (its own group, SPEC §5). The rollouts table is small, so the
driver builds a :class:`GroupMap` from it first (hash of each rollout id -> bucket) and every
read task routes its rows with it, without seeing any other table.

Keys are 64-bit hashes (:func:`chainrows.runners.bulk.partition.string_hashes`), never strings.
The kernels are imported where they run (in the tasks): the driver, which builds the map from
arrays the tasks hash, loads no engine.
Two distinct rollout ids with one hash read as one rollout here, so their buckets are merged
(:func:`merge_buckets`); merging buckets only puts more whole groups in one task, so the routing
stays exact whatever collides. A later rollouts row naming another group merges the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

OWN_GROUP_SALT = np.uint64(0x9E3779B97F4A7C15)  # a rollout alone in its group: key = hash(id) ^ salt


def spread(keys: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer: every bit of ``keys`` moves the low bits a modulus reads."""
    with np.errstate(over="ignore"):
        x = keys.astype(np.uint64, copy=True)
        x ^= x >> np.uint64(33)
        x *= np.uint64(0xFF51AFD7ED558CCD)
        x ^= x >> np.uint64(33)
        x *= np.uint64(0xC4CEB93FE53E94CD)
        x ^= x >> np.uint64(33)
    return x


def bucket_of(keys: np.ndarray, buckets: int) -> np.ndarray:
    """The bucket (0 <= b < ``buckets``) of each group key."""
    return (spread(keys) % np.uint64(buckets)).astype(np.int64)


def group_keys(rollout_ids, group_ids) -> tuple[np.ndarray, np.ndarray]:
    """Per rollouts row: (hash of the rollout id, key of the group the row names). The key is
    the group id's hash, or for a null group id the rollout's own key (see :func:`own_keys`)."""
    from chainrows.runners.bulk.partition import string_hashes

    rid = string_hashes(rollout_ids)
    gid = string_hashes(group_ids)
    valid = np.asarray(pc.is_valid(group_ids).to_numpy(zero_copy_only=False), dtype=bool) \
        if len(rid) else np.zeros(0, dtype=bool)
    return rid, np.where(valid, gid, own_keys(rid))


def own_keys(rollout_hashes: np.ndarray) -> np.ndarray:
    """The group key of a rollout that is its own group."""
    return rollout_hashes ^ OWN_GROUP_SALT


def merge_buckets(buckets: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Union of buckets: ``rep[x]`` is the smallest bucket joined to ``x`` through the pairs
    (``a[i]``, ``b[i]``). Minimum-label propagation with pointer jumping (numpy only; the pairs
    are rare, their count is not bounded)."""
    rep = np.arange(buckets, dtype=np.int64)
    if len(a) == 0:
        return rep
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    while True:
        ra, rb = rep[a], rep[b]
        low = np.minimum(ra, rb)
        new = rep.copy()
        np.minimum.at(new, ra, low)
        np.minimum.at(new, rb, low)
        while True:  # pointer jumping: every label to its label's label
            jumped = new[new]
            if np.array_equal(jumped, new):
                break
            new = jumped
        if np.array_equal(new, rep):
            return rep
        rep = new


@dataclass(frozen=True)
class GroupMap:
    """Bucket of each rollout that has a rollouts row, by rollout-id hash (``hashes`` sorted,
    distinct; ``targets`` the buckets), for ``buckets`` decide tasks."""

    hashes: np.ndarray
    targets: np.ndarray
    buckets: int

    @classmethod
    def build(cls, rollout_hashes: np.ndarray, keys: np.ndarray, buckets: int) -> GroupMap:
        """From every rollouts row in read order: its rollout-id hash and the key of the group
        it names (:func:`group_keys`). The first row of each hash decides; any other row of that
        hash whose bucket differs merges the two buckets."""
        hashes, first, inverse = np.unique(rollout_hashes, return_index=True, return_inverse=True)
        row_bucket = bucket_of(keys, buckets)
        first_bucket = row_bucket[first]
        differs = row_bucket != first_bucket[inverse]
        rep = merge_buckets(buckets, row_bucket[differs], first_bucket[inverse][differs])
        return cls(hashes, rep[first_bucket], buckets)

    def buckets_of(self, rollout_ids) -> np.ndarray:
        """The decide task (bucket) of each row with these rollout ids."""
        from chainrows.runners.bulk.partition import string_hashes

        h = string_hashes(rollout_ids)
        out = bucket_of(own_keys(h), self.buckets)
        if len(self.hashes) and len(h):
            i = np.minimum(np.searchsorted(self.hashes, h), len(self.hashes) - 1)
            hit = self.hashes[i] == h
            out[hit] = self.targets[i[hit]]
        return out


def split_by_bucket(table: pa.Table, bucket: np.ndarray, buckets: int) -> list[pa.Table | None]:
    """``table``'s rows per bucket (None for a bucket with none), each in ``table``'s order:
    slices of one copy of the rows in bucket order (Ray ships a slice without the rest of its
    buffers)."""
    order = np.argsort(bucket, kind="stable")
    bounds = np.searchsorted(bucket[order], np.arange(buckets + 1))
    if np.count_nonzero(np.diff(bounds)) == 1:  # one bucket: no copy
        return [table if hi > lo else None for lo, hi in zip(bounds[:-1], bounds[1:])]
    from chainrows.lowering.take import take_rows

    grouped = take_rows(table, order)
    return [grouped.slice(lo, hi - lo) if hi > lo else None for lo, hi in zip(bounds[:-1], bounds[1:])]


def range_bounds(samples: list[pa.Array], ranges: int) -> pa.Array:
    """Up to ``ranges - 1`` increasing rollout ids cutting the id space into ranges of about
    equal share of ``samples`` (sorted samples of the ids; any ids work, these balance)."""
    ids = pa.concat_arrays([s.cast(pa.string()) for s in samples]) if samples else pa.array([], pa.string())
    ids = _sorted_distinct(ids)
    if ranges <= 1 or len(ids) == 0:
        return pa.array([], pa.string())
    picks = np.unique(np.arange(1, ranges) * len(ids) // ranges)
    return pc.unique(ids.take(pa.array(picks[picks > 0])))


def sample_ids(rollout_ids, size: int) -> pa.Array:
    """At most ``size`` evenly spaced ids of the sorted distinct ``rollout_ids``."""
    ids = _sorted_distinct(rollout_ids)
    if len(ids) <= size:
        return ids
    return ids.take(pa.array(np.arange(size) * len(ids) // size))


def _sorted_distinct(ids) -> pa.Array:
    """The distinct non-null ``ids``, in Arrow's (UTF-8 byte) order."""
    ids = pc.unique(ids).drop_null()
    return ids.take(pc.sort_indices(ids))


def cut_sorted(ids, bounds: pa.Array) -> np.ndarray:
    """Row offsets cutting ``ids`` (sorted) at each bound: range r is rows
    ``cuts[r]:cuts[r + 1]`` (ids < bounds[0], then bounds[0] <= id < bounds[1], ...). A binary
    search per bound, comparing UTF-8 bytes as Arrow sorts them."""
    n = len(ids)
    cuts = [0]
    for b in bounds.to_pylist():
        key = b.encode()
        lo, hi = cuts[-1], n
        while lo < hi:
            mid = (lo + hi) // 2
            if ids[mid].as_py().encode() < key:
                lo = mid + 1
            else:
                hi = mid
        cuts.append(lo)
    cuts.append(n)
    return np.array(cuts, dtype=np.int64)
