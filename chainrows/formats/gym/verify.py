"""Verify staged calls against their CallRecords (docs/gym.md, "Integrity failures"): the checks, then the SHA-256s.

Per call, in this order, the first failure is the call's integrity error (its text is what
ledger.integrity_error holds, docs/gym.md lists them): the record and the staged call agree;
versions are supported; lengths add up; root ⇔ no parent ⇔ prev_len 0 ⇔ mode ``text``; token
ids fit u64 and int32; the mask is carry (0.0) then generation (1.0); logprobs are finite
float32 and 0.0 on the carry; hash fields are 64 hex; then the recomputed extras digest, chain
hash (seeded with the parent's *recorded* chain hash), cumulative hash and staging digest.

The array checks (ids, mask, logprobs) run over a whole batch of calls in a few numpy passes;
the scalar ones per call. The batch's ids() bodies are serialized once, and each call's body is
a memoryview of them shared by its chain hash, its staging digest and every descendant's
cumulative hash. The SHA-256s of a batch run on a thread pool (hashlib releases the GIL on
buffers over 2 KiB).
The cumulative hash's input starts with the length of the *whole* sequence, so it cannot
extend the parent's SHA-256 state: each call hashes its full prefix again from the shared
bodies (docs/gym.md, "Memory and speed").
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from chainrows.formats.gym import wire as W
from chainrows.formats.gym.records import SHARED, CallRecord, StagedCall

INT32_MAX = (1 << 31) - 1
CHUNK_BYTES = 4 << 20  # hashing work handed to a thread at a time
POOL_MIN_BYTES = 64 << 10  # smaller inputs are hashed on the calling thread

# Check texts (ledger.integrity_error); docs/gym.md lists them, tests name them.
DISAGREE = "record and staged call disagree on {}"
STAGING_KEY = "staging_key is not <rollout_id>/<model_call_id>"
VERSION = "unsupported schema, digest or extras digest version"
LENGTHS = "token, mask and logprob counts differ from delta_len"
CUM_LEN = "cum_len != prev_len + delta_len"
ROOT_SHAPE = "root, parent, prev_len and mode disagree"
RANGE = "a length or weight_version is negative"
TOKEN_U64 = "token id outside the u64 range"
TOKEN_INT32 = "token id beyond int32"
MASK = "mask is not carry then generation"
LOGPROB_FINITE = "logprob is not a finite float32"
LOGPROB_CARRY = "non-zero logprob on a carry token"
HEX = "a digest or hash is not 64 lowercase hex"
EXTRAS_ENC = "extras cannot be encoded"
NO_PARENT = "parent call not in the manifest"
NO_PARENT_CHAIN = "parent's recorded chain_hash is null"
PARENT_HEX = "parent's recorded chain_hash is not 64 lowercase hex"
NO_PREFIX = "cumulative hash unverifiable: an ancestor has no staged call"
EXTRAS = "extras digest mismatch"
CHAIN = "chain hash mismatch"
CUMULATIVE = "cumulative hash mismatch"
DIGEST = "staging digest mismatch"
CHECKS = (DISAGREE.format("<field>"), STAGING_KEY, VERSION, LENGTHS, CUM_LEN, ROOT_SHAPE, RANGE,
          TOKEN_U64, TOKEN_INT32, MASK, LOGPROB_FINITE, LOGPROB_CARRY, HEX, EXTRAS_ENC, NO_PARENT,
          NO_PARENT_CHAIN, NO_PREFIX, EXTRAS, CHAIN, CUMULATIVE, DIGEST)


@dataclass
class Checked:
    """What the importer writes for one staged call: ``error`` None when verified."""

    error: str | None
    tokens: np.ndarray  # int32, ids wrapped
    logprobs: np.ndarray  # float32
    gen_len: int
    chain_hash: int = 0  # SPEC §2 XXH3-64, seeded with the parent's (filled by the importer)


def _segment_counts(x: np.ndarray, off: np.ndarray) -> np.ndarray:
    """Per segment ``x[off[i]:off[i+1]]`` (bool) its number of True (empty segments give 0)."""
    cs = np.zeros(len(x) + 1, dtype=np.int64)
    np.cumsum(x.view(np.uint8), dtype=np.int64, out=cs[1:])  # a bool cumsum casts 3x slower
    return cs[off[1:]] - cs[off[:-1]]


def _segment_any(bad: np.ndarray, off: np.ndarray) -> np.ndarray:
    """Per segment: some entry of ``bad`` is True. Fast when bad is sparse (clean data)."""
    out = np.zeros(len(off) - 1, dtype=bool)
    pos = np.flatnonzero(bad)
    if len(pos):
        out[np.searchsorted(off, pos, side="right") - 1] = True  # empty segments share a start
    return out


def _offsets(lengths) -> np.ndarray:
    off = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    return off


def _concat(parts: list, dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


class _Arrays:
    """The staged calls of a batch concatenated: the array checks for all of them in a few
    numpy passes, and per call views (int32 tokens, float32 logprobs) and serialized bodies."""

    def __init__(self, calls: list):
        self.tok_off = _offsets([len(c.tokens) for c in calls])
        self.mask_off = _offsets([len(c.mask) for c in calls])
        self.lp_off = _offsets([len(c.logprobs) for c in calls])
        tokens = _concat([c.tokens for c in calls], np.uint64)
        mask = _concat([c.mask for c in calls], np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            self.lp32 = _concat([c.logprobs for c in calls], np.float64).astype(np.float32)
        gen = mask == 1.0
        self.gen_len = _segment_counts(gen, self.mask_off)
        # carry then generation: only 0.0 and 1.0, no 0.0 right after a 1.0 inside a call, a 1.0
        drop = np.flatnonzero(gen[:-1] & ~gen[1:]) + 1
        inside = drop[self.mask_off[np.searchsorted(self.mask_off, drop, side="right") - 1] != drop]
        self.mask_bad = (self.gen_len == 0) | _segment_any(~(gen | (mask == 0.0)), self.mask_off)
        self.mask_bad[np.searchsorted(self.mask_off, inside, side="right") - 1] = True
        if np.array_equal(self.mask_off, self.lp_off):
            lp_gen = gen
        else:  # some call's counts differ (it fails the length check first): align by position
            lp_gen = _expected_generation(self.lp_off, np.minimum(np.diff(self.mask_off) - self.gen_len,
                                                                  np.diff(self.lp_off)))
        self.lp_nonfinite = _segment_any(~np.isfinite(self.lp32), self.lp_off)
        self.lp_carry = _segment_any((self.lp32 != 0.0) & ~lp_gen, self.lp_off)
        self.beyond_int32 = _segment_any(tokens > INT32_MAX, self.tok_off)
        self.tokens32 = tokens.astype(np.uint32).view(np.int32)
        self._ids = memoryview(W.ids_body(tokens))
        self._mask = memoryview(W.f32_body(mask.astype(np.float32)))
        self._lp = memoryview(W.f32_body(self.lp32))

    def body(self, i: int):
        return self._ids[8 * self.tok_off[i]:8 * self.tok_off[i + 1]]

    def digest_bodies(self, i: int) -> tuple:
        return (self.body(i), self._mask[4 * self.mask_off[i]:4 * self.mask_off[i + 1]],
                self._lp[4 * self.lp_off[i]:4 * self.lp_off[i + 1]])

    def checked(self, i: int, error: str | None) -> Checked:
        return Checked(error, self.tokens32[self.tok_off[i]:self.tok_off[i + 1]],
                       self.lp32[self.lp_off[i]:self.lp_off[i + 1]], int(self.gen_len[i]))


def _expected_generation(off: np.ndarray, carry: np.ndarray) -> np.ndarray:
    """Per position: True where it lies at or after its segment's carry (a generated token)."""
    n = np.diff(off)
    pos = np.arange(off[-1], dtype=np.int64) - np.repeat(off[:-1], n)
    return pos >= np.repeat(carry, n)


def _structural(rollout_id: str, rec: CallRecord, st: StagedCall, parent: CallRecord | None,
                arrays: _Arrays, i: int) -> str | None:
    """The checks before the hashes, in the documented order (array checks read from ``arrays``)."""
    for name in SHARED:
        if getattr(rec, name) != getattr(st, name):
            return DISAGREE.format(name)
    if rec.staging_key is not None and rec.staging_key != f"{rollout_id}/{rec.model_call_id}":
        return STAGING_KEY
    if (st.schema_version not in W.SCHEMA_VERSIONS or st.digest_version != W.DIGEST_VERSION
            or st.extras_digest_version != W.EXTRAS_DIGEST_VERSION):
        return VERSION
    if not (len(st.tokens) == st.delta_len == len(st.mask) == len(st.logprobs)):
        return LENGTHS
    if min(st.prev_len, st.delta_len, st.cum_len, st.weight_version) < 0:
        return RANGE
    if st.cum_len != st.prev_len + st.delta_len:
        return CUM_LEN
    root = st.parent_call_id is None
    if root != (st.prev_len == 0) or root != (st.mode == "text") or (not root and st.mode != "token_in"):
        return ROOT_SHAPE
    if not st.ids_in_u64:
        return TOKEN_U64
    if arrays.beyond_int32[i]:
        return TOKEN_INT32
    if arrays.mask_bad[i]:
        return MASK
    if arrays.lp_nonfinite[i]:
        return LOGPROB_FINITE
    if arrays.lp_carry[i]:
        return LOGPROB_CARRY
    nullable = st.schema_version == 2
    if not (W.is_hex64(st.digest) and W.is_hex64(st.extras_digest)
            and all(W.is_hex64(h) or (h is None and nullable) for h in (st.chain_hash, st.cumulative_hash))):
        return HEX
    if not root and parent is None:
        return NO_PARENT
    if not root and parent.chain_hash is None and st.chain_hash is not None:
        return NO_PARENT_CHAIN
    if not root and st.chain_hash is not None and not W.is_hex64(parent.chain_hash):  # the seed
        return PARENT_HEX
    return None


def _ancestors(rec: CallRecord, by_id: dict) -> list | None:
    """Ancestor records root first; None on a missing parent or a cycle."""
    out, seen = [], {rec.model_call_id}
    while rec.parent_call_id is not None:
        rec = by_id.get(rec.parent_call_id)
        if rec is None or rec.model_call_id in seen:
            return None
        seen.add(rec.model_call_id)
        out.append(rec)
    return out[::-1]


class Verifier:
    """Verifies rollouts batch by batch; ``threads`` hash in parallel (default: all cores)."""

    def __init__(self, threads: int | None = None):
        self.threads = max(1, threads or os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="chainrows-gym") if self.threads > 1 else None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def verify(self, rollouts: list) -> list[dict]:
        """``rollouts``: (rollout_id, records, staged) with ``staged``: model_call_id ->
        StagedCall. Returns per rollout a dict model_call_id -> Checked for every record with
        a staged call (the first record of a repeated call id)."""
        pairs = []  # (rollout index, record, staged call), the calls of the batch
        index = []  # per rollout: its records by id, and call id -> position in pairs
        for r, (_, records, staged) in enumerate(rollouts):
            by_id, mine = {}, {}
            for rec in records:
                by_id.setdefault(rec.model_call_id, rec)
            for rec in by_id.values():
                if rec.model_call_id in staged:
                    mine[rec.model_call_id] = len(pairs)
                    pairs.append((r, rec, staged[rec.model_call_id]))
            index.append((by_id, mine))
        arrays = _Arrays([st for _, _, st in pairs])
        jobs = _Jobs(self._pool)
        results = [{} for _ in rollouts]
        for i, (r, rec, st) in enumerate(pairs):
            rollout_id = rollouts[r][0]
            by_id, mine = index[r]
            parent = by_id.get(rec.parent_call_id) if rec.parent_call_id is not None else None
            item = arrays.checked(i, _structural(rollout_id, rec, st, parent, arrays, i))
            results[r][rec.model_call_id] = item
            if item.error is None:
                item.error = self._queue(item, rec, st, parent, by_id, mine, arrays, i, jobs)
        jobs.finish()
        return results

    @staticmethod
    def _queue(item, rec, st, parent, by_id, mine, arrays: _Arrays, i: int, jobs: _Jobs) -> str | None:
        """Queue the call's hash checks (in check order); or return the check that already fails."""
        try:
            extras_payload = b"\x01" + W.enc(st.extras)
        except W.ExtrasError:
            return EXTRAS_ENC
        chain_of = _ancestors(rec, by_id)
        if chain_of is None:
            return NO_PARENT
        if any(a.model_call_id not in mine for a in chain_of):
            return NO_PREFIX
        body, mask_body, lp_body = arrays.digest_bodies(i)
        ancestors = [arrays.body(mine[a.model_call_id]) for a in chain_of]
        n = len(body)
        prefix = n + sum(len(b) for b in ancestors)
        jobs.add(item, EXTRAS, st.extras_digest, W.EXTRAS_TAG, [extras_payload], len(extras_payload))
        if st.chain_hash is not None:
            seed = parent.chain_hash if parent is not None else None
            jobs.add(item, CHAIN, st.chain_hash, W.CHAIN_TAG, W.chain_payload(seed, body, n // 8), n)
        if st.cumulative_hash is not None:
            jobs.add(item, CUMULATIVE, st.cumulative_hash, W.PREFIX_TAG, [W.u64(prefix // 8), *ancestors, body],
                     prefix)
        jobs.add(item, DIGEST, st.digest, W.CALL_TAG, W.digest_payload(st, body, mask_body, lp_body),
                 n + len(mask_body) + len(lp_body))
        return None


class _Jobs:
    """Hash checks in queue order. Large inputs go to the pool a chunk at a time while more are
    queued (hashlib releases the GIL on them, so hashing overlaps the Python that prepares the
    rest); small ones are hashed at once (they hold the GIL anyway: a thread only adds
    hand-offs). ``finish`` then records each call's first failing hash check, in queue order
    (a call's checks are queued in check order)."""

    def __init__(self, pool):
        self.pool, self.checks, self.values, self.pending = pool, [], [], []
        self.current, self.size = [], 0

    def add(self, item, check: str, want: str, tag: bytes, parts: list, size: int) -> None:
        self.checks.append((item, check, want))
        if self.pool is None or size < POOL_MIN_BYTES:
            self.values.append(W.hash_parts(tag, parts))
            return
        self.values.append(None)
        self.current.append((len(self.values) - 1, tag, parts))
        self.size += size
        if self.size >= CHUNK_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self.current:
            self.pending.append((self.current, self.pool.submit(_hash_chunk, self.current)))
            self.current, self.size = [], 0

    def finish(self) -> None:
        self._flush()
        for chunk, future in self.pending:
            for (slot, _, _), value in zip(chunk, future.result()):
                self.values[slot] = value
        for (item, check, want), value in zip(self.checks, self.values):
            if item.error is None and value != want:
                item.error = check


def _hash_chunk(chunk: list) -> list:
    return [W.hash_parts(tag, parts) for _, tag, parts in chunk]
