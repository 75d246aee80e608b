"""Verify staged calls against their CallRecords (NEMO_GYM §4): the checks, then the SHA-256s.

Per call, in this order, the first failure is the call's integrity error (its text is what
ledger.integrity_error holds, docs/gym.md lists them): the record and the staged call agree;
versions are supported; lengths add up; root ⇔ no parent ⇔ prev_len 0 ⇔ mode ``text``; token
ids fit u64 and int32; the mask is carry (0.0) then generation (1.0); logprobs are finite
float32 and 0.0 on the carry; hash fields are 64 hex; then the recomputed extras digest, chain
hash (seeded with the parent's *recorded* chain hash), cumulative hash and staging digest.

The structural checks are numpy per call. The SHA-256s of a batch of rollouts run on a thread
pool (hashlib releases the GIL on buffers over 2 KiB); each call's ids() body is serialized
once and shared by its chain hash, its staging digest and every descendant's cumulative hash.
The cumulative hash's input starts with the length of the *whole* sequence, so it cannot
extend the parent's SHA-256 state: each call hashes its full prefix again from the shared
bodies (docs/gym.md, "Cost").
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import xxhash

from chainrows.io.gym import wire as W
from chainrows.io.gym.records import SHARED, CallRecord, StagedCall

INT32_MAX = (1 << 31) - 1
CHUNK_BYTES = 8 << 20  # hashing work handed to a thread at a time

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


def _structural(rollout_id: str, rec: CallRecord, st: StagedCall, parent: CallRecord | None,
                has_parent_record: bool, lp32: np.ndarray) -> str | None:
    for name in SHARED:
        if getattr(rec, name) != getattr(st, name):
            return DISAGREE.format(name)
    if rec.staging_key is not None and rec.staging_key != f"{rollout_id}/{rec.model_call_id}":
        return STAGING_KEY
    if (st.schema_version not in W.SCHEMA_VERSIONS or st.digest_version != W.DIGEST_VERSION
            or st.extras_digest_version != W.EXTRAS_DIGEST_VERSION):
        return VERSION
    n = len(st.tokens)
    if not (n == st.delta_len == len(st.mask) == len(st.logprobs)):
        return LENGTHS
    if not all(0 <= v < W.U64_LIMIT for v in (st.prev_len, st.delta_len, st.cum_len, st.weight_version)):
        return RANGE
    if st.cum_len != st.prev_len + st.delta_len:
        return CUM_LEN
    root = st.parent_call_id is None
    if root != (st.prev_len == 0) or root != (st.mode == "text") or (not root and st.mode != "token_in"):
        return ROOT_SHAPE
    if not st.ids_in_u64:
        return TOKEN_U64
    if n and int(st.tokens.max()) > INT32_MAX:
        return TOKEN_INT32
    gen = st.mask == 1.0
    carry = int(n - np.count_nonzero(gen))
    if not gen.any() or not (st.mask[:carry] == 0.0).all() or not gen[carry:].all():
        return MASK
    if not np.isfinite(lp32).all():
        return LOGPROB_FINITE
    if (lp32[:carry] != 0.0).any():
        return LOGPROB_CARRY
    hashes = (st.digest, st.extras_digest, st.chain_hash, st.cumulative_hash)
    nullable = st.schema_version == 2
    if not (W.is_hex64(hashes[0]) and W.is_hex64(hashes[1])
            and all(W.is_hex64(h) or (h is None and nullable) for h in hashes[2:])):
        return HEX
    if not root and not has_parent_record:
        return NO_PARENT
    if not root and parent.chain_hash is None and st.chain_hash is not None:
        return NO_PARENT_CHAIN
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
        a staged call."""
        jobs: list = []  # (Checked, check text, expected hex, tag, parts)
        results = []
        for rollout_id, records, staged in rollouts:
            results.append(self._prepare(rollout_id, records, staged, jobs))
        self._run(jobs)
        return results

    def _prepare(self, rollout_id: str, records: list, staged: dict, jobs: list) -> dict:
        by_id = {}
        for rec in records:
            by_id.setdefault(rec.model_call_id, rec)
        bodies = {cid: W.ids_body(st.tokens) for cid, st in staged.items() if cid in by_id}
        out = {}
        for rec in records:
            st = staged.get(rec.model_call_id)
            if st is None or rec.model_call_id in out:
                continue
            with np.errstate(over="ignore", invalid="ignore"):
                lp32 = st.logprobs.astype(np.float32)
            mask = st.mask.astype(np.float32)
            parent = by_id.get(rec.parent_call_id) if rec.parent_call_id is not None else None
            error = _structural(rollout_id, rec, st, parent, parent is not None, lp32)
            tokens32 = st.tokens.astype(np.uint32).view(np.int32)
            item = Checked(error, tokens32, lp32, int(np.count_nonzero(st.mask == 1.0)))
            out[rec.model_call_id] = item
            if error is not None:
                continue
            try:
                extras_payload = b"\x01" + W.enc(st.extras)
            except W.ExtrasError:
                item.error = EXTRAS_ENC
                continue
            chain_of = _ancestors(rec, by_id)
            if chain_of is None or any(a.model_call_id not in bodies for a in chain_of):
                item.error = NO_PARENT if chain_of is None else NO_PREFIX
                continue
            body = bodies[rec.model_call_id]
            n = len(st.tokens)
            total = n + sum(len(staged[a.model_call_id].tokens) for a in chain_of)
            prefix = [W.u64(total)] + [bodies[a.model_call_id] for a in chain_of] + [body]
            jobs.append((item, EXTRAS, st.extras_digest, W.EXTRAS_TAG, [extras_payload]))
            if st.chain_hash is not None:
                seed = parent.chain_hash if parent is not None else None
                jobs.append((item, CHAIN, st.chain_hash, W.CHAIN_TAG, W.chain_payload(seed, body, n)))
            if st.cumulative_hash is not None:
                jobs.append((item, CUMULATIVE, st.cumulative_hash, W.PREFIX_TAG, prefix))
            jobs.append((item, DIGEST, st.digest, W.CALL_TAG, W.digest_payload(st, body, mask, lp32)))
        return out

    def _run(self, jobs: list) -> None:
        """Hash every job, then record each call's first failing hash check (jobs of a call are
        queued in check order)."""
        chunks, size, current = [], 0, []
        for job in jobs:
            current.append(job)
            size += sum(len(p) for p in job[4])
            if size >= CHUNK_BYTES:
                chunks.append(current)
                current, size = [], 0
        if current:
            chunks.append(current)
        digests = self._pool.map(_hash_chunk, chunks) if self._pool and len(chunks) > 1 else map(_hash_chunk, chunks)
        for chunk, got in zip(chunks, digests):
            for (item, check, want, _, _), value in zip(chunk, got):
                if item.error is None and value != want:
                    item.error = check


def _hash_chunk(chunk: list) -> list:
    return [W.hash_parts(tag, parts) for _, _, _, tag, parts in chunk]


def xxh3_chain(tokens32: np.ndarray, seed: int) -> int:
    """SPEC §2 ledger.chain_hash of a delta: XXH3-64 over little-endian int32, seeded."""
    return xxhash.xxh3_64_intdigest(tokens32.astype("<i4", copy=False).tobytes(), seed)
