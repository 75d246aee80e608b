"""The batch model: a batch of rollouts as flat numpy arrays, and its validation.

Ragged data is offsets + content (awkward style): ``x_off`` has one more entry than there
are owners, and owner ``i`` holds ``x[x_off[i]:x_off[i + 1]]``. Calls are ordered by rollout,
then capture order, so a call's global index orders capture within its rollout. Index
sentinels: ``ROOT`` (-1) for no parent / not given, ``MISSING`` (-2) for an id that names no
call of the rollout.

Every kernel assumes ``Batch.validate()`` passed: Numba does no bounds checks. Its checks that
pass over every call are kernels too (``chainrows.engine.validate``), each run only on what
the checks before it made safe to read.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from chainrows.engine.threads import run_jobs
from chainrows.engine.validate import (
    ORDER_NOT_BY_BUFFER,
    ORDER_NOT_ONCE,
    ORDER_OK,
    ORDER_OUTSIDE,
    first_bad_range,
    first_outside_owner,
    lengths_match,
    order_problem,
)

ROOT = -1  # parent_id null; terminal_response_id null
MISSING = -2  # an id that names no call of the rollout
NO_OUTPUT = -2  # item_ids code of an id no output of its rollout has
NO_TOKENS = -1  # tok_start / lp_start of a call without a token row (or a null logprobs list)


def readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view. Kernels take inputs read-only so each compiles for one array type
    (Numba types writable and read-only arrays apart; a cache warmed on one misses the other)."""
    v = a.view()
    v.flags.writeable = False
    return v


@dataclass
class Batch:
    # per rollout (R)
    call_off: np.ndarray  # int64[R+1] calls of each rollout
    has_record: np.ndarray  # bool[R] rollout has a rollouts row
    dup_record: np.ndarray  # bool[R] rollout_id repeats in the rollouts table
    reward: np.ndarray  # float64[R] NaN when null or no record
    reward_null: np.ndarray  # bool[R]
    group: np.ndarray  # int64[R] dense group index (a null group_id is a group of its own)
    out_off: np.ndarray  # int64[R+1] into out_keys / out_ids / out_served
    out_keys: np.ndarray  # uint64[O]
    out_ids: np.ndarray  # int64[O] id code: the first output of the rollout with this id; -1 null
    out_served: np.ndarray  # bool[O] id non-null and served as an item id by some call of the rollout
    out_ids_bad_len: np.ndarray  # bool[R] output_ids length differs from output_keys
    terminal: np.ndarray  # int64[R] call index, ROOT when not given, MISSING when it names no call
    has_acc: np.ndarray  # bool[R] accepted_response_ids given
    acc_off: np.ndarray  # int64[R+1] into acc_call
    acc_call: np.ndarray  # int64[A] call index or MISSING
    cand_off: np.ndarray  # int64[R+1] into the candidate index (cand_len / cand_hash / cand_call)
    cand_len: np.ndarray  # int64[F] item count of each call with keys; sorted by (len, hash) per rollout
    cand_hash: np.ndarray  # uint64[F] hash of the call's whole item-key sequence (window_hash)
    cand_call: np.ndarray  # int64[F] the call
    # per call (C)
    parent: np.ndarray  # int64[C] call index, ROOT or MISSING
    prev_len: np.ndarray  # int64[C]
    delta_len: np.ndarray  # int64[C]
    gen_len: np.ndarray  # int64[C]
    chain_hash: np.ndarray  # uint64[C]
    failed: np.ndarray  # bool[C]
    integrity_bad: np.ndarray  # bool[C] ledger integrity_error is not null (SPEC §3 check 14)
    dup_call_id: np.ndarray  # bool[C] a later occurrence of a call_id
    dup_response_id: np.ndarray  # bool[C] a later occurrence of a response_id
    dup_tokens: np.ndarray  # bool[C] the call has several token rows
    item_ids_bad_len: np.ndarray  # bool[C]
    identified: np.ndarray  # bool[C] served an id that appears in output_ids, or is the terminal
    key_off: np.ndarray  # int64[C+1] into item_keys / item_ids
    item_keys: np.ndarray  # uint64[K]
    item_ids: np.ndarray  # int64[K] the out_ids code of this id in the rollout, NO_OUTPUT when none, -1 null
    tok_chunk: np.ndarray  # int64[C] the buffer (of tokens and logprobs) holding the call's token row; 0 without one
    tok_start: np.ndarray  # int64[C] into tokens[tok_chunk[c]], NO_TOKENS when the call has no token row
    tok_stop: np.ndarray  # int64[C]
    tokens: tuple  # of int32 buffers, at least one: the values each chunk of the tokens column uses, in place
    tok_order: np.ndarray  # int64[K] every call with a token row once, in buffer order (by tok_chunk)
    has_logprobs: bool
    lp_start: np.ndarray  # int64[C] into logprobs[tok_chunk[c]], NO_TOKENS when null or no token row
    lp_stop: np.ndarray  # int64[C]
    logprobs: tuple  # of float32 buffers, one per tokens buffer (empty ones when has_logprobs is False)

    @property
    def num_rollouts(self) -> int:
        return len(self.call_off) - 1

    @property
    def num_calls(self) -> int:
        return len(self.parent)

    def roots_per_rollout(self) -> np.ndarray:
        """int64 per rollout: its ledger calls with a null parent_id (SPEC §4 ``num_roots``,
        rejected roots included)."""
        owner = np.repeat(np.arange(self.num_rollouts, dtype=np.int64), np.diff(self.call_off))
        return np.bincount(owner[self.parent == ROOT], minlength=self.num_rollouts).astype(np.int64)

    def validate(self) -> None:
        """Raise ValueError naming the array when an offset or index could leave its buffer.

        After the dtypes and lengths, two halves that need nothing from each other (the
        rollouts' offsets and indices; the token rows' buffers, ranges and order) run side by
        side with more than one thread (``threads.run_jobs``); the first half's error wins, as
        when they run in order."""
        R, C = self.num_rollouts, self.num_calls
        _check_dtypes(self)
        for name, n in (("has_record", R), ("dup_record", R), ("reward", R), ("reward_null", R),
                        ("group", R), ("out_ids_bad_len", R), ("terminal", R), ("has_acc", R)):
            _check_len(name, getattr(self, name), n)
        for name in ("prev_len", "delta_len", "gen_len", "chain_hash", "failed", "integrity_bad", "dup_call_id",
                     "dup_response_id", "dup_tokens", "item_ids_bad_len", "identified",
                     "tok_chunk", "tok_start", "tok_stop", "lp_start", "lp_stop"):
            _check_len(name, getattr(self, name), C)
        run_jobs([self._check_indices, self._check_token_rows])
        if len(self.group) and (self.group.min() < 0 or self.group.max() >= R):
            raise ValueError("group: index outside [0, num_rollouts)")

    def _check_indices(self) -> None:
        """The offsets, id codes and call indices (dtypes and lengths checked)."""
        R, C = self.num_rollouts, self.num_calls
        _check_offsets("call_off", self.call_off, C)
        _check_offsets("out_off", self.out_off, len(self.out_keys), R)
        _check_len("out_ids", self.out_ids, len(self.out_keys))
        _check_len("out_served", self.out_served, len(self.out_keys))
        _check_offsets("acc_off", self.acc_off, len(self.acc_call), R)
        _check_offsets("cand_off", self.cand_off, len(self.cand_call), R)
        _check_len("cand_len", self.cand_len, len(self.cand_call))
        _check_len("cand_hash", self.cand_hash, len(self.cand_call))
        _check_offsets("key_off", self.key_off, len(self.item_keys), C)
        _check_len("item_ids", self.item_ids, len(self.item_keys))
        # id codes index the outputs (select.serving_index, its lookup of a window's served id)
        _check_codes("out_ids", self.out_ids, -1, len(self.out_keys))
        _check_codes("item_ids", self.item_ids, NO_OUTPUT, len(self.out_keys))
        _check_same_rollout("parent", self.parent, self.call_off, self.call_off, allow=(ROOT, MISSING))
        _check_same_rollout("terminal", self.terminal, np.arange(R + 1, dtype=np.int64), self.call_off,
                            allow=(ROOT, MISSING))
        _check_same_rollout("acc_call", self.acc_call, self.acc_off, self.call_off, allow=(MISSING,))
        _check_same_rollout("cand_call", self.cand_call, self.cand_off, self.call_off, allow=())
        if not lengths_match(readonly(self.cand_len), readonly(self.cand_call), readonly(self.key_off)):
            raise ValueError("cand_len: differs from the call's item count")

    def _check_token_rows(self) -> None:
        """The token and logprob buffers, each call's ranges in them and ``tok_order`` (dtypes
        and lengths checked)."""
        _check_buffers(self)
        _check_ranges("tok", self.tok_start, self.tok_stop, self.tok_chunk, [len(t) for t in self.tokens])
        _check_ranges("lp", self.lp_start, self.lp_stop, self.tok_chunk, [len(t) for t in self.logprobs])
        _check_order(self.tok_order, self.tok_start, self.tok_chunk)


_DTYPES = {
    "call_off": np.int64, "has_record": np.bool_, "dup_record": np.bool_, "reward": np.float64,
    "reward_null": np.bool_, "group": np.int64, "out_off": np.int64, "out_keys": np.uint64,
    "out_ids": np.int64, "out_served": np.bool_, "out_ids_bad_len": np.bool_, "terminal": np.int64,
    "has_acc": np.bool_, "acc_off": np.int64, "acc_call": np.int64, "cand_off": np.int64,
    "cand_len": np.int64, "cand_hash": np.uint64, "cand_call": np.int64, "parent": np.int64, "prev_len": np.int64,
    "delta_len": np.int64, "gen_len": np.int64, "chain_hash": np.uint64, "failed": np.bool_,
    "integrity_bad": np.bool_,
    "dup_call_id": np.bool_, "dup_response_id": np.bool_, "dup_tokens": np.bool_,
    "item_ids_bad_len": np.bool_, "identified": np.bool_, "key_off": np.int64,
    "item_keys": np.uint64, "item_ids": np.int64, "tok_chunk": np.int64,
    "tok_start": np.int64, "tok_stop": np.int64, "tok_order": np.int64, "lp_start": np.int64, "lp_stop": np.int64,
}
_BUFFERS = {"tokens": np.int32, "logprobs": np.float32}
assert set(_DTYPES) | set(_BUFFERS) | {"has_logprobs"} == {f.name for f in fields(Batch)}


def _check_dtypes(batch: Batch) -> None:
    for name, dtype in _DTYPES.items():
        arr = getattr(batch, name)
        if not isinstance(arr, np.ndarray) or arr.dtype != dtype or arr.ndim != 1:
            raise ValueError(f"{name}: expected a 1-D {np.dtype(dtype)} array")
        if not arr.flags.c_contiguous:
            raise ValueError(f"{name}: expected a contiguous array")


def _check_buffers(batch: Batch) -> None:
    for name, dtype in _BUFFERS.items():
        bufs = getattr(batch, name)
        if not isinstance(bufs, tuple) or not all(
                isinstance(a, np.ndarray) and a.dtype == dtype and a.ndim == 1 and a.flags.c_contiguous for a in bufs):
            raise ValueError(f"{name}: expected a tuple of contiguous 1-D {np.dtype(dtype)} arrays")
    if len(batch.tokens) == 0 or len(batch.logprobs) != len(batch.tokens):
        raise ValueError("tokens/logprobs: expected one or more buffers, as many of each")
    if len(batch.tok_chunk) and (batch.tok_chunk.min() < 0 or batch.tok_chunk.max() >= len(batch.tokens)):
        raise ValueError("tok_chunk: index outside the buffers")


def _check_len(name, arr, n) -> None:
    if len(arr) != n:
        raise ValueError(f"{name}: length {len(arr)}, expected {n}")


def _check_codes(name, codes, low, n) -> None:
    """Every code in [low, n): the sentinels from ``low`` up, else an index below ``n``."""
    if len(codes) and (codes.min() < low or codes.max() >= n):
        raise ValueError(f"{name}: a code outside [{low}, {n})")


def _check_offsets(name, off, total, owners=None) -> None:
    if owners is not None and len(off) != owners + 1:
        raise ValueError(f"{name}: length {len(off)}, expected {owners + 1}")
    if len(off) == 0 or off[0] != 0 or off[-1] != total:
        raise ValueError(f"{name}: must start at 0 and end at {total}")
    if np.any(off[1:] < off[:-1]):
        raise ValueError(f"{name}: offsets decrease")


def _check_same_rollout(name, idx, idx_off, call_off, allow) -> None:
    """Every index is an allowed sentinel or a call of its owner's rollout (owner r holds
    ``idx[idx_off[r]:idx_off[r + 1]]``; both offsets checked before)."""
    i = first_outside_owner(readonly(idx), readonly(idx_off), readonly(call_off),
                            readonly(np.array(allow, dtype=np.int64)))
    if i >= 0:
        raise ValueError(f"{name}: index outside its rollout's calls" if idx[i] >= 0
                         else f"{name}: invalid sentinel")


_ORDER_ERRORS = {
    ORDER_OUTSIDE: "tok_order: index outside [0, num_calls)",
    ORDER_NOT_BY_BUFFER: "tok_order: must list the calls buffer by buffer (tok_chunk non-decreasing)",
    ORDER_NOT_ONCE: "tok_order: must list every call with a token row exactly once",
}


def _check_order(order, tok_start, tok_chunk) -> None:
    """tok_order lists each call with a token row exactly once, by buffer (the order within a
    buffer is free: it only decides which memory the data checks read first)."""
    problem = order_problem(readonly(order), readonly(tok_start), readonly(tok_chunk), NO_TOKENS)
    if problem != ORDER_OK:
        raise ValueError(_ORDER_ERRORS[problem])


def _check_ranges(name, start, stop, chunk, sizes) -> None:
    if first_bad_range(readonly(start), readonly(stop), readonly(chunk), readonly(np.asarray(sizes, dtype=np.int64)),
                       NO_TOKENS) >= 0:
        raise ValueError(f"{name}_start/{name}_stop: range outside the buffer")
