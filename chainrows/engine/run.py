"""The engine's entry points: decide every rollout of a Batch and gather its rows.

A handful of kernel calls per batch, whatever the number of rollouts: checks, select + cut
(cc) or terminal walk (ordinary), the data checks (hashes, logprobs), the chain walk that reads
them in SPEC order, and the gather passes. ``decide`` then ``gather_rows`` runs the data checks
in a pass of their own, in token-buffer order; ``decide_and_gather`` (the API's) runs them in
the copy of the rows.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from chainrows.engine import select
from chainrows.engine.batch import Batch, readonly
from chainrows.engine.buffers import empty
from chainrows.engine.chunks import balanced_chunks
from chainrows.engine.cut import cut_chains, forest_chains, terminal_chain
from chainrows.engine.gather import (
    copy_check_logprobs,
    copy_deltas,
    copy_hash_deltas,
    copy_order,
    fill_rows,
    row_sizes,
)
from chainrows.engine.rollout_checks import rollout_checks
from chainrows.engine.select import select_calls, serving_index
from chainrows.engine.streamcopy import stream_from
from chainrows.engine.threads import Step, run, run_steps
from chainrows.engine.verify import data_checks, mark_chain_calls, verify_chains
from chainrows.options import Options


@dataclass
class Decisions:
    """Per rollout: detail id (0 = ok), offending call/position; the chains of each rollout."""

    detail: np.ndarray  # int32[R]
    bad_call: np.ndarray  # int64[R] -1 when the detail names no call
    bad_pos: np.ndarray  # int64[R] -1 when the detail names no output position
    sel_off: np.ndarray  # int64[R+1] slot of each rollout in sel
    sel: np.ndarray  # int64 chain calls, root first, chains in order
    sel_len: np.ndarray  # int64[R] calls used in the slot
    chain_start: np.ndarray  # uint8 1 where a chain starts
    n_chains: np.ndarray  # int64[R]
    num_selected: np.ndarray  # int64[R] as the report defines it

    @property
    def ok(self) -> np.ndarray:
        return self.detail == 0


@dataclass
class RowArrays:
    """Rows as flat arrays: ``row_off[r]`` first row of rollout r; ragged columns by offsets.

    Row i has ``tok_off[i + 1] - tok_off[i]`` tokens; they start at ``tok_off[i]`` in the
    token buffers (input_ids, loss_mask, logprobs), or at ``tok_pos[i]`` when rows of dropped
    rollouts left gaps there (:func:`drop_rollouts`)."""

    row_off: np.ndarray  # int64[R+1]
    row_rollout: np.ndarray  # int64[N]
    segment: np.ndarray  # int32[N]
    num_segments: np.ndarray  # int32[N]
    prompt_len: np.ndarray  # int32[N]
    tok_off: np.ndarray  # int64[N+1]
    input_ids: np.ndarray  # int32
    loss_mask: np.ndarray  # uint8
    logprobs: np.ndarray | None  # float32, None when the input has none
    call_off: np.ndarray  # int64[N+1]
    row_calls: np.ndarray  # int64 call indices
    loss_tokens: np.ndarray  # int64[R] generated tokens written per rollout
    tok_pos: np.ndarray | None = None  # int64[N] where each row starts in the token buffers; None: back to back

    def row_pos(self) -> np.ndarray:
        """int64[N]: where each row's tokens start in input_ids / loss_mask / logprobs (row i
        holds ``tok_off[i + 1] - tok_off[i]`` of them from there)."""
        return self.tok_off[:-1] if self.tok_pos is None else self.tok_pos


def _readonly(batch: Batch) -> Batch:
    """A copy of the batch holding read-only views, so each kernel compiles for one array type."""
    def ro(v):
        if isinstance(v, np.ndarray):
            return readonly(v)
        return tuple(readonly(a) for a in v) if isinstance(v, tuple) else v

    return Batch(**{f.name: ro(getattr(batch, f.name)) for f in fields(batch)})


def _chunks(batch: Batch) -> np.ndarray:
    tok = np.where(batch.tok_start >= 0, batch.tok_stop - batch.tok_start, 0)
    per_call = np.concatenate(([0], np.cumsum(tok + 1)))
    return balanced_chunks(per_call[batch.call_off] + np.arange(batch.num_rollouts + 1))


def _order_chunks(batch: Batch, o: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`_buffer_chunks` over the positions of ``o`` (calls with token rows, buffer by
    buffer as tok_order lists them: tok_order or a subsequence of it), weighed by token count."""
    per = np.concatenate(([0], np.cumsum(batch.tok_stop[o] - batch.tok_start[o] + 1)))
    bounds = np.searchsorted(batch.tok_chunk[o], np.arange(len(batch.tokens) + 1), side="left")
    return _buffer_chunks(per, bounds)


def _copy_chunks(batch: Batch, row_calls: np.ndarray) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """(entries: the positions of row_calls sorted by the buffer of their call's delta,
    :func:`_buffer_chunks` over entries weighed by delta length): ``gather.copy_order``."""
    entries = np.empty(len(row_calls), dtype=np.int64)
    weight_off = np.empty(len(row_calls) + 1, dtype=np.int64)
    bounds = np.zeros(len(batch.tokens) + 1, dtype=np.int64)
    copy_order(readonly(row_calls), batch.tok_chunk, batch.delta_len, entries, weight_off, bounds)
    return entries, _buffer_chunks(weight_off, bounds)


def _buffer_chunks(weight_off: np.ndarray, bounds: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per buffer k, whose items are bounds[k]:bounds[k + 1]: chunks over its items of about
    equal weight (``weight_off``: cumulative weight per item, +1 each so none weighs 0) and the
    cumulative weight at each chunk bound, what :class:`threads.Step` takes."""
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        chunks = balanced_chunks(weight_off[a:b + 1] - weight_off[a]) + a
        out.append((chunks, weight_off[chunks]))
    return out


def _forest(chunks, detail, bad_call, sel_off, sel, sel_len, parent, n_chains):
    """The forest cut (SPEC §3.1): 10f on the selection, then its chains as a new (sel_off, sel,
    sel_len, chain_start), one chain per endpoint, (root, endpoint) order; see forest_chains.
    Two runs of one kernel: count the chains' calls, then write them at those offsets."""
    C, S = len(parent), len(sel)
    scratch = [np.empty(S, dtype=np.int64) for _ in range(4)]  # rootof, depth, head, nxt
    pos = np.empty(C, dtype=np.int64)
    counts = np.zeros(len(sel_len), dtype=np.int64)
    out_off = np.zeros(len(sel_len) + 1, dtype=np.int64)
    no_out = np.zeros(0, dtype=np.int64)
    no_flags = np.zeros(0, dtype=np.uint8)
    forest_chains(chunks, detail, bad_call, sel_off, sel, sel_len, parent, np.zeros(C, dtype=np.uint8),
                  pos, *scratch, out_off, no_out, no_flags, counts, n_chains, False)
    np.cumsum(counts, out=out_off[1:])
    out = np.full(int(out_off[-1]), -1, dtype=np.int64)
    flags = np.zeros(len(out), dtype=np.uint8)
    forest_chains(chunks, detail, bad_call, sel_off, sel, sel_len, parent, np.zeros(C, dtype=np.uint8),
                  pos, *scratch, out_off, out, flags, counts, n_chains, True)
    if not np.array_equal(counts, np.diff(out_off)):  # the write run sized every chain as the count run did
        raise AssertionError("forest_chains: write pass disagrees with count pass")
    return readonly(out_off), out, counts, flags  # out_off read-only like out_off of the linear plan: one signature per kernel


def _plan(b: Batch, chunks: np.ndarray, options: Options) -> Decisions:
    """SPEC §3 steps 1–10 on every rollout (checks, select + cut, or the terminal walk): the
    chains of each rollout still ok, before any of them is walked and verified."""
    R, C = b.num_rollouts, b.num_calls
    detail = np.zeros(R, dtype=np.int32)
    bad_call = np.full(R, -1, dtype=np.int64)
    bad_pos = np.full(R, -1, dtype=np.int64)
    run(rollout_checks, chunks, b.call_off, b.has_record, b.dup_record, b.reward, b.reward_null,
        b.out_ids_bad_len, b.failed, b.dup_call_id, b.dup_response_id, b.dup_tokens, b.item_ids_bad_len,
        detail, bad_call)
    n_chains = np.zeros(R, dtype=np.int64)
    sel_len = np.zeros(R, dtype=np.int64)
    if options.mode == "cc":
        sel_off = b.out_off
        sel = np.full(len(b.out_keys), -1, dtype=np.int64)
        chain_start = np.zeros(len(b.out_keys), dtype=np.uint8)
        run(select_calls, chunks, detail, bad_pos, bad_call, b.out_off, b.out_keys, b.out_ids, b.out_served,
            b.terminal, b.has_acc, b.acc_off, b.acc_call, b.cand_off, b.cand_len, b.cand_hash, b.cand_call,
            b.call_off, b.parent, b.identified, b.key_off, b.item_keys, b.item_ids, sel, sel_len,
            np.zeros(C, dtype=np.uint8), select.LINEAR_MAX, *serving_index(b.key_off, b.item_ids, len(b.out_keys)))
        num_selected = sel_len.copy()
        if options.plan == "forest":
            sel_off, sel, sel_len, chain_start = _forest(chunks, detail, bad_call, sel_off, sel,
                                                         sel_len, b.parent, n_chains)
        else:
            run(cut_chains, chunks, detail, bad_call, sel_off, sel, sel_len, b.parent, chain_start,
                n_chains)
    else:
        sel_off = b.call_off
        sel = np.full(C, -1, dtype=np.int64)
        chain_start = np.zeros(C, dtype=np.uint8)
        run(terminal_chain, chunks, detail, bad_call, b.call_off, b.parent, b.terminal,
            np.zeros(C, dtype=np.uint8), sel, sel_len, chain_start, n_chains)
        num_selected = sel_len.copy()
    return Decisions(detail, bad_call, bad_pos, sel_off, sel, sel_len, chain_start, n_chains, num_selected)


def _check_chain_data(b: Batch, chunks: np.ndarray, detail: np.ndarray, dec: Decisions,
                      status: np.ndarray) -> None:
    """Checks 14–15 (``data_checks``) of every call in a chain of a rollout whose ``detail`` is 0,
    into ``status``."""
    need = np.zeros(b.num_calls, dtype=np.uint8)
    run(mark_chain_calls, chunks, detail, dec.sel_off, dec.sel, dec.sel_len, need)
    order = readonly(b.tok_order[need[b.tok_order] != 0])  # the needed calls, buffer by buffer
    run_steps([Step(order_chunks, weight_off, ((data_checks, (
        order, need, b.parent, b.chain_hash, b.integrity_bad, b.gen_len, b.tok_start, b.tok_stop,
        b.tokens[k], b.has_logprobs, b.lp_start, b.lp_stop, b.logprobs[k], status)),))
        for k, (order_chunks, weight_off) in enumerate(_order_chunks(b, order))])


def _verify(b: Batch, chunks: np.ndarray, dec: Decisions, status: np.ndarray) -> None:
    """Steps 11–15 on every chain of every rollout still ok, 14–15 read from ``status`` (0 for
    a call not checked: then only 11–13 can fail)."""
    run(verify_chains, chunks, dec.detail, dec.bad_call, dec.sel_off, dec.sel, dec.sel_len, dec.chain_start,
        b.parent, b.prev_len, b.delta_len, b.gen_len, b.tok_start, b.tok_stop, b.has_logprobs, b.lp_start,
        b.lp_stop, status)


def decide(batch: Batch, options: Options = Options()) -> Decisions:
    """Status of every rollout of the batch per SPEC §3, and its chains (``options.mode``,
    ``options.plan``: the linear cut of step 10 or the forest cut of §3.1)."""
    batch.validate()
    b = _readonly(batch)
    chunks = _chunks(b)
    dec = _plan(b, chunks, options)
    status = np.zeros(b.num_calls, dtype=np.int32)
    _check_chain_data(b, chunks, dec.detail, dec, status)
    _verify(b, chunks, dec, status)
    dec.n_chains[dec.detail != 0] = 0
    return dec


def decide_and_gather(batch: Batch, options: Options = Options()) -> tuple[Decisions, RowArrays]:
    """``decide`` and ``gather_rows`` with one read of the token data: the same decisions, and
    rows equal to ``gather_rows(batch, decide(batch, options), options)`` row for row.

    Checks 14–15 read every token and logprob of the chains, and so does the copy into rows:
    done apart, each streams the buffers from memory (1.73 GB on the 2.1 GB capture shape:
    0.34 vs 0.24 s done together, docs/decisions-engine.md "Checks in the copy"). So the rows
    of every rollout that passes checks 1–13 are gathered first, each call hashed and its
    logprobs checked as it is copied; the rollouts that fail 11–13 have the data of their
    chains checked the plain way (a failure earlier in the chain comes first). Then every
    chain is verified in SPEC order. A rollout whose data failed loses its rows where they
    lie: the rows left keep their place in the buffers (``RowArrays.tok_pos``) and no byte
    moves; past ``max(MIN_GAPS, tokens // TOKENS_PER_GAP)`` such rollouts, or in buffers past
    int32 offsets, the rows are gathered again instead.
    """
    batch.validate()
    b = _readonly(batch)
    chunks = _chunks(b)
    dec = _plan(b, chunks, options)
    planned, planned_bad_call = dec.detail.copy(), dec.bad_call.copy()
    status = np.zeros(b.num_calls, dtype=np.int32)
    _verify(b, chunks, dec, status)  # every status 0: checks 11-13 alone
    copied = dec.ok
    _check_chain_data(b, chunks, np.where(copied, np.int32(1), planned), dec, status)
    rows = _gather(b, chunks, dec, options, status)
    dec.detail, dec.bad_call = planned, planned_bad_call
    _verify(b, chunks, dec, status)
    dec.n_chains[dec.detail != 0] = 0
    lost = copied & ~dec.ok
    n_lost = int(np.count_nonzero(lost))
    if n_lost > max(MIN_GAPS, len(rows.input_ids) // TOKENS_PER_GAP) or (n_lost and len(rows.input_ids) >= 2**31):
        rows = None  # its buffers go before the new ones come: one set of rows at a time
        rows = _gather(b, chunks, dec, options)
    elif n_lost:
        rows = drop_rollouts(rows, lost, options.placeholders)
    return dec, rows


# Rollouts dropped in place, at most: each gap is a chunk more in each list column of the rows
# table, built in Python; past one per TOKENS_PER_GAP tokens, gathering the rows again costs
# less (docs/decisions-engine.md "Checks in the copy").
MIN_GAPS = 64
TOKENS_PER_GAP = 1 << 16


def drop_rollouts(rows: RowArrays, lost: np.ndarray, placeholders: bool) -> RowArrays:
    """``rows`` without the rows of the rollouts in ``lost`` (bool[R]; each has at least one
    row), which stay where they lie in the buffers: the rows left keep their place
    (``tok_pos``). With ``placeholders`` a lost rollout keeps one row instead, a placeholder
    written over the first token of its first row. Per row and per call arrays only: no token
    is moved."""
    n_rows = np.diff(rows.row_off)
    row_len = np.diff(rows.tok_off)
    row_ncalls = np.diff(rows.call_off)
    if np.any(n_rows[lost] == 0):  # a lost rollout was copied: its chains' calls are in rows
        raise AssertionError("drop_rollouts: a lost rollout has no rows")
    lost_row = np.repeat(lost, n_rows)
    place = np.zeros(len(lost_row), dtype=bool)
    if placeholders:
        place[rows.row_off[:-1][lost]] = True
    keep = np.flatnonzero(~lost_row | place)
    pos = rows.row_pos()
    if placeholders:
        p = pos[place]
        rows.input_ids[p] = 0
        rows.loss_mask[p] = 0
        if rows.logprobs is not None:
            rows.logprobs[p] = 0.0
    rows_per = np.where(lost, 1 if placeholders else 0, n_rows).astype(np.int64)
    row_rollout = rows.row_rollout[keep]
    tok_off = np.concatenate(([0], np.cumsum(np.where(place, 1, row_len)[keep])))
    tok_pos = pos[keep]
    return RowArrays(
        row_off=np.concatenate(([0], np.cumsum(rows_per))),
        row_rollout=row_rollout,
        segment=np.where(place, 0, rows.segment)[keep].astype(np.int32),
        num_segments=rows_per[row_rollout].astype(np.int32),
        prompt_len=np.where(place, 0, rows.prompt_len)[keep].astype(np.int32),
        tok_off=tok_off,
        input_ids=rows.input_ids, loss_mask=rows.loss_mask, logprobs=rows.logprobs,
        call_off=np.concatenate(([0], np.cumsum(np.where(place, 0, row_ncalls)[keep]))),
        row_calls=rows.row_calls[np.repeat(~lost_row, row_ncalls)],
        loss_tokens=np.where(lost, 0, rows.loss_tokens),
        tok_pos=None if np.array_equal(tok_pos, tok_off[:-1]) else tok_pos,  # placeholders filled every gap
    )


def gather_rows(batch: Batch, dec: Decisions, options: Options = Options()) -> RowArrays:
    """Rows of every ok rollout (and one placeholder per masked rollout with
    ``options.placeholders``)."""
    b = _readonly(batch)
    return _gather(b, _chunks(b), dec, options)


def _gather(b: Batch, chunks: np.ndarray, dec: Decisions, options: Options,
            status: np.ndarray | None = None) -> RowArrays:
    """Rows of every rollout ok in ``dec``; with ``status``, checks 14–15 of every copied call
    written to it as the call is copied (copy_hash_deltas, copy_check_logprobs)."""
    placeholders = options.placeholders
    R = b.num_rollouts
    ok = dec.ok
    rows_per = np.where(ok, dec.n_chains, 1 if placeholders else 0).astype(np.int64)
    row_off = np.zeros(R + 1, dtype=np.int64)
    np.cumsum(rows_per, out=row_off[1:])
    N = int(row_off[-1])
    row_len = np.zeros(N, dtype=np.int64)
    row_ncalls = np.zeros(N, dtype=np.int64)
    prompt = np.zeros(N, dtype=np.int32)
    segment = np.zeros(N, dtype=np.int32)
    loss_tokens = np.zeros(R, dtype=np.int64)
    run(row_sizes, chunks, ok, placeholders, row_off, dec.sel_off, dec.sel, dec.sel_len, dec.chain_start,
        b.delta_len, b.gen_len, row_len, row_ncalls, prompt, segment, loss_tokens)
    tok_off = np.zeros(N + 1, dtype=np.int64)
    np.cumsum(row_len, out=tok_off[1:])
    call_off = np.zeros(N + 1, dtype=np.int64)
    np.cumsum(row_ncalls, out=call_off[1:])
    T = int(tok_off[-1])
    input_ids = empty(T, np.int32)
    loss_mask = empty(T, np.uint8)
    logprobs = empty(T if b.has_logprobs else 0, np.float32)
    row_calls = empty(int(call_off[-1]), np.int64)
    call_dst = np.empty(len(row_calls), dtype=np.int64)
    run(fill_rows, chunks, ok, placeholders, row_off, tok_off, call_off, dec.sel_off, dec.sel, dec.sel_len,
        dec.chain_start, b.delta_len, b.gen_len, b.has_logprobs, input_ids, loss_mask, logprobs, row_calls,
        call_dst)
    ro_calls, ro_dst = readonly(row_calls), readonly(call_dst)
    stream_bytes = stream_from(input_ids.nbytes)  # logprobs: as many bytes
    steps = []
    entries, buffer_chunks = _copy_chunks(b, row_calls)
    entries = readonly(entries)
    for k, (copy_chunks, weight_off) in enumerate(buffer_chunks):
        if status is None:
            calls = [(copy_deltas, (entries, ro_calls, ro_dst, b.tok_start, b.delta_len, b.tokens[k], input_ids,
                                    stream_bytes))]
            if b.has_logprobs:
                calls.append((copy_deltas, (entries, ro_calls, ro_dst, b.lp_start, b.delta_len, b.logprobs[k],
                                            logprobs, stream_bytes)))
        else:
            calls = [(copy_hash_deltas, (entries, ro_calls, ro_dst, b.delta_len, b.parent, b.chain_hash,
                                         b.integrity_bad, b.tok_start, b.tok_stop, b.tokens[k], input_ids, status,
                                         stream_bytes))]
            if b.has_logprobs:  # after the hashes of the same entries: it reads their status
                calls.append((copy_check_logprobs, (entries, ro_calls, ro_dst, b.delta_len, b.gen_len, b.lp_start,
                                                    b.lp_stop, b.logprobs[k], logprobs, status, stream_bytes)))
        steps.append(Step(copy_chunks, weight_off, tuple(calls)))
    run_steps(steps)  # one wait for all buffers
    row_rollout = np.repeat(np.arange(R, dtype=np.int64), rows_per)
    return RowArrays(row_off, row_rollout, segment, rows_per[row_rollout].astype(np.int32), prompt,
                     tok_off, input_ids, loss_mask, logprobs if b.has_logprobs else None, call_off,
                     row_calls, loss_tokens)
