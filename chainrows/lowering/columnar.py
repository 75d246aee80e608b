"""Arrow tables (SPEC §2) -> the engine's Batch, in bulk: no Python loop per rollout or call.

``build_batch`` runs the named joins of chainrows.lowering.joins in order and packs their arrays
into a Batch. Rollouts get indices in byte order of their ids, so the engine's output is
already sorted by rollout_id. With more than one thread (Numba's and Arrow's), a helper thread
checks the tables' strings (UTF-8), makes the token and logprob buffers, takes the rollouts
rows and lays out the per-call ledger columns while the ids are joined, then joins the token
rows, the responses and the rewards beside the item join.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numba
import numpy as np
import pyarrow as pa

from chainrows.arrays import one_chunk
from chainrows.engine.batch import Batch
from chainrows.engine.select import build_candidates
from chainrows.engine.threads import wait_out
from chainrows.lowering.joins import (
    Records,
    bools,
    column_values,
    int64s,
    join_calls,
    join_items,
    join_responses,
    join_rewards,
    join_rollouts,
    join_tokens,
    token_buffers,
)


@dataclass
class Labels:
    """The strings that belong to a Batch, for building output tables."""

    rollout_ids: pa.Array  # string[R], sorted
    group_ids: pa.Array  # string[R], null when no rollouts row or a null group_id
    call_ids: pa.Array  # string[C], in batch call order
    orphan_token_rows: int  # token rows that name no ledger call
    integrity_errors: pa.Array | None = None  # string[C] ledger integrity_error, None without the column


def build_batch(ledger: pa.Table, tokens: pa.Table, rollouts: pa.Table) -> tuple[Batch, Labels]:
    """Join the three tables into one Batch.

    The tables go through the reader's SPEC §2 checks (types, nulls, UTF-8; an InputError
    without a file name on unusable input), so Arrow tables handed to the API directly get the
    same treatment as files, and the first failing check's error, as if each table were
    checked wholly before the next and before any join. The UTF-8 checks run on the helper
    thread meanwhile (:class:`_Utf8Checks`); everything else before any join. For tables that
    already come from the reader this is a cheap no-op pass (no casts; one scan of the id
    strings and the null bitmaps).
    """
    handed = _Handed()
    utf8 = _Utf8Checks(handed)
    try:
        try:
            batch, labels = _build(ledger, tokens, rollouts, utf8, handed)
        except Exception:
            first = utf8.first_error()  # checked first when run serially, so its error wins
            if first is None:
                raise
        else:
            first = utf8.first_error()
            if first is None:
                return batch, labels
    finally:
        handed.settle()  # an error or interrupt leaves nothing of this call on the helper thread
    raise first  # outside the handler: the error it replaces (and its frames) is not kept as context


def _build(ledger, tokens, rollouts, utf8: _Utf8Checks, handed: _Handed) -> tuple[Batch, Labels]:
    ledger = _canonical("ledger", ledger, utf8)
    tokens = _canonical("tokens", tokens, utf8)
    rollouts = _canonical("rollouts", rollouts, utf8)
    buffers = handed.submit(token_buffers, tokens)  # depends on nothing else
    ro = join_rollouts(ledger, tokens, rollouts)
    records = handed.submit(Records, rollouts, ro.of_record, ro.n)  # takes (copies) the rollouts rows
    per_call = handed.submit(_call_columns, ro)
    calls = join_calls(ro, tokens)
    tok_join = handed.submit(join_tokens, calls, len(ro.of_call), buffers)  # beside the item join
    answers = failed = None
    try:
        rec = records.result()
        answers = handed.submit(_responses_and_rewards, ro, rec)
        items = join_items(ro, rec)
        cand = build_candidates(ro.call_off, items.key_off, items.item_keys)
    except Exception as exc:
        failed = exc
    if failed is not None:  # run in order, the token rows' error, then the responses', came first
        raise _first_error([tok_join, answers], failed)  # outside the handler: nothing chained
    toks = tok_join.result()
    resp, rew = answers.result()
    col = per_call.result()
    batch = Batch(
        call_off=ro.call_off, has_record=rec.has_record, dup_record=rec.dup_record,
        reward=rew.reward, reward_null=rew.reward_null, group=rew.group,
        out_off=items.out_off, out_keys=items.out_keys, out_ids=items.out_ids,
        out_served=items.out_served, out_ids_bad_len=items.out_ids_bad_len,
        terminal=resp.terminal, has_acc=resp.has_acc, acc_off=resp.acc_off, acc_call=resp.acc_call,
        cand_off=cand.off, cand_len=cand.length, cand_hash=cand.hash, cand_call=cand.call,
        parent=calls.parent, prev_len=col["prev_len"], delta_len=col["delta_len"], gen_len=col["gen_len"],
        chain_hash=col["chain_hash"], failed=col["failed"], integrity_bad=col["integrity_bad"],
        dup_call_id=calls.dup_call_id,
        dup_response_id=resp.dup_response_id, dup_tokens=toks.duplicated,
        item_ids_bad_len=items.item_ids_bad_len, identified=items.identified,
        key_off=items.key_off, item_keys=items.item_keys, item_ids=items.item_ids,
        tok_chunk=toks.chunk, tok_start=toks.start, tok_stop=toks.stop, tokens=toks.tokens,
        tok_order=toks.order, has_logprobs=toks.has_logprobs, lp_start=toks.lp_start,
        lp_stop=toks.lp_stop, logprobs=toks.logprobs,
    )
    labels = Labels(rollout_ids=ro.ids, group_ids=rew.group_ids, call_ids=col["call_ids"],
                    orphan_token_rows=toks.orphan_rows, integrity_errors=col["integrity_errors"])
    return batch, labels


def _responses_and_rewards(ro, rec):
    return join_responses(ro, rec), join_rewards(rec, ro.n)


def _call_columns(ro) -> dict:
    """The ledger's per-call columns in batch call order (no join needed beyond the rollouts')."""
    led = ro.ledger
    has_errors = "integrity_error" in led.column_names
    return dict(
        prev_len=ro.per_call(int64s(led["prev_len"])), delta_len=ro.per_call(int64s(led["delta_len"])),
        gen_len=ro.per_call(int64s(led["gen_len"])),
        chain_hash=ro.per_call(column_values(one_chunk(led["chain_hash"]), np.uint64, "ledger", "chain_hash")),
        failed=ro.per_call(bools(led["failed"])), integrity_bad=ro.per_call(_integrity_bad(led)),
        call_ids=ro.strings("call_id"),
        integrity_errors=ro.strings("integrity_error") if has_errors else None,
    )


def _integrity_bad(ledger: pa.Table) -> np.ndarray:
    """bool per call: the optional integrity_error column is present and not null there."""
    if "integrity_error" not in ledger.column_names:
        return np.zeros(ledger.num_rows, dtype=bool)
    return np.ascontiguousarray(one_chunk(ledger["integrity_error"]).is_valid()
                                .to_numpy(zero_copy_only=False), dtype=bool)


def _first_error(tasks: list, error: Exception | None) -> Exception | None:
    """The error of the first of ``tasks`` (steps before ``error``'s in serial order, None
    skipped) that fails, each waited for, or run when deferred, in turn; else ``error``."""
    for task in tasks:
        if task is None:
            continue
        try:
            task.result()
        except Exception as exc:  # noqa: BLE001 - returned for the caller to raise
            return exc
    return error


class _Handed:
    """What one ``build_batch`` call hands to the helper thread (:func:`_submit`), so that none
    of it is left running when the call returns or raises (it would hold the call's arrays and
    delay the next call's tasks behind it)."""

    def __init__(self):
        self._tasks = []

    def submit(self, fn, *args):
        task = _submit(fn, *args)
        self._tasks.append(task)
        return task

    def settle(self) -> None:
        """Wait until every task started on the helper thread is done, whatever interrupts come
        meanwhile (a deferred task that was never asked for is never run)."""
        for task in self._tasks:
            if isinstance(task, Future):
                wait_out(task)


class _Deferred:
    """The one-thread path of _submit: fn(*args) runs when its result is asked for, so its
    errors come at the same point in build_batch as from the helper thread."""

    def __init__(self, fn, *args):
        self._fn, self._args = fn, args

    def result(self):
        return self._fn(*self._args)


_POOL: ThreadPoolExecutor | None = None


def _forget_pool() -> None:
    """In a forked child the parent's helper thread does not exist: a task submitted to its
    pool would never run."""
    global _POOL
    _POOL = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _submit(fn, *args):
    """fn(*args) on a helper thread when Numba and Arrow may both use more than one (numpy and
    Arrow release the GIL while they copy), else when its result is asked for. ``.result()``
    (once) gives the value or raises the error.

    Arrow at one thread is how a partitioned bulk run bounds the memory Arrow's allocator keeps
    per allocating thread (``bulk.one_arrow_thread``); a helper thread would undo that.
    """
    global _POOL
    threads = numba.get_num_threads()
    if threads <= 1 or pa.cpu_count() <= 1:
        return _Deferred(fn, *args)
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chainrows-build")
    return _POOL.submit(_with_threads, threads, fn, *args)


def _with_threads(threads: int, fn, *args):
    """fn(*args) with the submitter's Numba thread count (a kernel it calls splits its work by
    it; the setting is per thread, and the helper thread serves callers of any count)."""
    numba.set_num_threads(threads)
    return fn(*args)


class _Utf8Checks:
    """The tables' UTF-8 checks, on the helper thread (:func:`_submit`) while the joins run.

    Run serially, a table's UTF-8 check comes before its null check and every join, so an
    error raised meanwhile gives way to the first failing check submitted before it. The
    joins compare ids as bytes and never decode them, so they may run on strings not yet
    checked (an error message that decodes one, a null check's, is replaced anyway); what
    they do need, offsets that stay inside their buffers, ``normalize`` checks before the
    table is used (``validate_offsets``: Arrow's full validation was the only check of it). With
    one thread the checks run when :meth:`first_error` asks for them, after the joins."""

    def __init__(self, handed: _Handed):
        self._handed = handed
        self._pending = []

    def __call__(self, name, file, table, row0):
        from chainrows.formats.native.dataset import validate_utf8

        self._pending.append(self._handed.submit(validate_utf8, name, file, table, row0))

    def first_error(self) -> Exception | None:
        """The error of the first submitted check that fails, in submission order, or None
        (checks still running after it are waited out by ``_Handed.settle``)."""
        pending, self._pending = self._pending, []
        return _first_error(pending, None)


def _canonical(name: str, table, utf8_check=None) -> pa.Table:
    from chainrows.formats.native.dataset import normalize, validate_schema

    if not isinstance(table, pa.Table):
        raise TypeError(f"{name}: expected a pyarrow.Table, got {type(table).__name__}")
    return normalize(name, table, validate_schema(name, table.schema), utf8_check=utf8_check)
