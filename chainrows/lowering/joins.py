"""The named joins that turn three SPEC §2 Arrow tables into the engine's arrays.

Each join takes what earlier joins produced and returns a small frozen record of arrays:
rollouts (ids -> dense indices, ledger in rollout order), calls (call and parent ids), tokens
(token rows -> calls, buffer ranges), records (the first rollouts row of each id), responses
(terminal and accepted ids -> calls), items (item keys and ids, output keys and ids) and rewards
(reward and group per rollout). Rollout ids become dense codes in byte order with one
``pc.dictionary_encode`` (the output is sorted by them); group ids another. Every join on an
id within a rollout (call, parent, response, item and output ids) is exact on the strings'
bytes, per rollout, without encoding them (:class:`GroupIndex`; :func:`grouped_lookup` for item
ids against output ids, whose probes come in rollout order; chainrows.engine.strjoin).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chainrows.arrays import (
    list_offsets,
    offsets_from_lengths,
    offsets_rise_within,
    one_chunk,
    range_index,
    string_parts,
)
from chainrows.engine.align import aligned_positions
from chainrows.engine.batch import MISSING, NO_OUTPUT, NO_TOKENS, ROOT, readonly
from chainrows.engine.chunks import balanced_chunks, even_chunks
from chainrows.engine.dense import group_order
from chainrows.engine.slots import any_served, fill_slots, slot_counts
from chainrows.engine.strjoin import index_groups, join_groups, new_tables, probe_groups, table_offsets
from chainrows.engine.threads import run
from chainrows.engine.tokrows import token_rows
from chainrows.errors import InputError
from chainrows.lowering.take import take_rows


@dataclass(frozen=True)
class RolloutJoin:
    """``ids``: every rollout id of the three tables, sorted (rollout r is ``ids[r]``);
    ``ledger``: the ledger as given; calls are its rows stably sorted by rollout, call c being
    ledger row ``call_row[c]`` (None: the ledger is already in that order, call c is row c);
    ``of_call`` / ``of_token`` / ``of_record``: the rollout of each call, tokens row and
    rollouts row; ``call_off``: calls per rollout. The ledger itself is never permuted: each
    join reads its columns through ``call_row`` (a permuted copy of a 4 M-row ledger cost ~1 s)."""

    ids: pa.Array
    ledger: pa.Table
    call_row: np.ndarray | None
    of_call: np.ndarray
    of_token: np.ndarray
    of_record: np.ndarray
    call_off: np.ndarray

    @property
    def n(self) -> int:
        return len(self.ids)

    def per_call(self, values: np.ndarray) -> np.ndarray:
        """A per-ledger-row array in call order."""
        return values if self.call_row is None else values[self.call_row]

    def strings(self, column: str) -> pa.Array:
        """A ledger string column in call order (one take when the ledger is not)."""
        col = one_chunk(self.ledger[column])
        return col if self.call_row is None else col.take(pa.array(self.call_row))


def join_rollouts(ledger: pa.Table, tokens: pa.Table, rollouts: pa.Table) -> RolloutJoin:
    ids, (l_r, t_r, ro_r) = _encode_sorted([ledger["rollout_id"], tokens["rollout_id"], rollouts["rollout_id"]])
    order, call_off = group_order(l_r, len(ids))
    call_row = None
    if np.any(l_r[1:] < l_r[:-1]):
        call_row = order
        l_r = np.repeat(np.arange(len(ids), dtype=np.int64), np.diff(call_off))
    return RolloutJoin(ids, ledger, call_row, l_r, t_r, ro_r, call_off)


@dataclass(frozen=True)
class CallJoin:
    """``parent``: each call's parent call (ROOT for a null parent_id, MISSING when it names
    no call of the rollout); ``dup_call_id``: an earlier call of the rollout has this id;
    ``of_token``: the call each token row names (MISSING: none)."""

    parent: np.ndarray
    dup_call_id: np.ndarray
    of_token: np.ndarray


def join_calls(ro: RolloutJoin, tokens: pa.Table) -> CallJoin:
    index = GroupIndex(ro.call_off, ro.ledger["call_id"], "ledger", "call_id", pos=ro.call_row)
    parent = index.lookup(ro.of_call, ro.ledger["parent_id"], "ledger", "parent_id", MISSING, pos=ro.call_row,
                          null=ROOT)
    of_token = index.lookup(ro.of_token, tokens["call_id"], "tokens", "call_id", MISSING)
    return CallJoin(parent, index.later_duplicates(), of_token)


@dataclass(frozen=True)
class TokenBuffers:
    """The tokens table's list columns as buffers, its chunks not concatenated: token row i is
    in buffer ``row_chunk[i]`` of ``tokens`` at ``tok_start[i]:tok_stop[i]``, of ``logprobs``
    at ``lp_start[i]:lp_stop[i]`` (NO_TOKENS: a null logprobs list). Without the logprobs
    column, ``logprobs`` is None. See :func:`buffer_groups` for which chunks are merged."""

    row_chunk: np.ndarray
    tok_start: np.ndarray
    tok_stop: np.ndarray
    tokens: tuple
    lp_start: np.ndarray | None
    lp_stop: np.ndarray | None
    logprobs: tuple | None


MIN_BUFFER_BYTES = 8 << 20  # chunks smaller than this are merged with their neighbours


def buffer_groups(tok_col: pa.ChunkedArray, lp_col: pa.ChunkedArray | None) -> list[tuple[int, int]]:
    """Ranges [a, b) of chunks that become one buffer each: a chunk of at least MIN_BUFFER_BYTES
    alone (no copy), runs of smaller ones merged until they reach it (one copy of small data, so
    the buffer count stays under total / MIN_BUFFER_BYTES + chunks). When the logprobs column is
    chunked differently from the tokens column, everything is one buffer."""
    n = tok_col.num_chunks
    if n == 0:
        return []
    if lp_col is not None and [len(c) for c in tok_col.chunks] != [len(c) for c in lp_col.chunks]:
        return [(0, n)]
    size = [c.nbytes + (lp_col.chunk(i).nbytes if lp_col is not None else 0) for i, c in enumerate(tok_col.chunks)]
    groups, start, acc = [], 0, 0
    for i, nbytes in enumerate(size):
        if nbytes >= MIN_BUFFER_BYTES and acc:
            groups.append((start, i))
            start, acc = i, 0
        acc += nbytes
        if acc >= MIN_BUFFER_BYTES:
            groups.append((start, i + 1))
            start, acc = i + 1, 0
    if start < n:
        groups.append((start, n))
    return groups


def token_buffers(tokens: pa.Table) -> TokenBuffers:
    """The tokens and logprobs columns as :class:`TokenBuffers` (always at least one buffer)."""
    tok_col = tokens["tokens"]
    lp_col = tokens["logprobs"] if "logprobs" in tokens.column_names else None
    groups = buffer_groups(tok_col, lp_col) or [(0, 0)]
    tok_start, tok_stop, tok_bufs = _column_buffers(tok_col, groups, np.int32, "tokens", True)
    rows = [sum(len(c) for c in tok_col.chunks[a:b]) for a, b in groups]
    row_chunk = np.repeat(np.arange(len(groups), dtype=np.int64), rows)
    if lp_col is None:
        return TokenBuffers(row_chunk, tok_start, tok_stop, tok_bufs, None, None, None)
    lp_groups = groups if len(groups) > 1 else [(0, lp_col.num_chunks)]  # one buffer: all of its chunks
    return TokenBuffers(row_chunk, tok_start, tok_stop, tok_bufs,
                        *_column_buffers(lp_col, lp_groups, np.float32, "logprobs", False))


def _column_buffers(col: pa.ChunkedArray, groups, dtype, name: str, null_is_empty: bool):
    """(starts, stops, buffers) of a list column, one buffer per group of chunks; starts and
    stops per row, into that row's buffer."""
    parts = [_used_values(*_list_parts(_merged(col, a, b), null_is_empty=null_is_empty)) for a, b in groups]
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            tuple(column_values(p[2], dtype, "tokens", name) for p in parts))


def _used_values(starts, stops, values):
    """(starts, stops, values) with ``values`` cut to the range the lists use (a sliced chunk's
    values are its parent's, whole), zero copy; NO_TOKENS ranges stay as they are."""
    used = starts != NO_TOKENS
    if not used.any():
        return starts, stops, values.slice(0, 0)
    first, last = int(starts[used].min()), int(stops[used].max())
    if first == 0 and last == len(values):
        return starts, stops, values
    starts, stops = starts.copy(), stops.copy()
    starts[used] -= first
    stops[used] -= first
    return starts, stops, values.slice(first, last - first)


def _merged(col: pa.ChunkedArray, a: int, b: int) -> pa.Array:
    """Chunks a..b-1 of ``col`` as one Array (the chunk itself when b == a + 1)."""
    if b - a == 1:
        return col.chunk(a)
    if b == a:
        return pa.array([], col.type)
    return pa.concat_arrays(col.chunks[a:b])


@dataclass(frozen=True)
class TokenJoin:
    """Per call: the buffer of its token row (``chunk``, 0 without one), ``start``/``stop`` of
    its delta in that buffer of ``buffers.tokens`` (NO_TOKENS: no token row), ``duplicated``
    (several token rows); the same for logprobs when ``has_logprobs``; ``order``: the calls in
    token-row order (the buffers' order); ``orphan_rows``: token rows naming no call."""

    chunk: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    tokens: tuple
    duplicated: np.ndarray
    order: np.ndarray
    has_logprobs: bool
    lp_start: np.ndarray
    lp_stop: np.ndarray
    logprobs: tuple
    orphan_rows: int


def join_tokens(calls: CallJoin, n_calls: int, buffers) -> TokenJoin:
    """``buffers``: a future of :func:`token_buffers` (made while the ids were joined)."""
    buf: TokenBuffers = buffers.result()
    rows = token_rows(calls.of_token, n_calls, buf.row_chunk, buf.tok_start, buf.tok_stop, buf.lp_start,
                      buf.lp_stop)
    has_logprobs = buf.logprobs is not None
    logprobs = buf.logprobs if has_logprobs else tuple(np.zeros(0, dtype=np.float32) for _ in buf.tokens)
    return TokenJoin(rows.chunk, rows.start, rows.stop, buf.tokens, rows.duplicated, rows.order, has_logprobs,
                     rows.lp_start, rows.lp_stop, logprobs, rows.orphan_rows)


class Records:
    """The first rollouts row of each rollout id, in rollout index order: ``table`` those
    rows, ``rollout`` their rollout indices; per rollout ``has_record``, ``dup_record``."""

    def __init__(self, rollouts: pa.Table, of_record: np.ndarray, n_rollouts: int):
        uniq, first, counts = np.unique(of_record, return_index=True, return_counts=True)
        self.rollout = uniq.astype(np.int64)
        self.table = take_rows(rollouts, first)
        self.has_record = np.zeros(n_rollouts, dtype=bool)
        self.has_record[self.rollout] = True
        self.dup_record = np.zeros(n_rollouts, dtype=bool)
        self.dup_record[self.rollout] = counts > 1


@dataclass(frozen=True)
class ResponseJoin:
    """``dup_response_id`` per call; per rollout ``terminal`` (the call terminal_response_id
    names: ROOT when not given, MISSING when it names none) and ``has_acc``; ``acc_call[
    acc_off[r]:acc_off[r+1]]`` the calls its accepted_response_ids name (MISSING: none)."""

    dup_response_id: np.ndarray
    terminal: np.ndarray
    has_acc: np.ndarray
    acc_off: np.ndarray
    acc_call: np.ndarray


def join_responses(ro: RolloutJoin, rec: Records) -> ResponseJoin:
    R = ro.n
    acc_present = "accepted_response_ids" in rec.table.column_names
    index = GroupIndex(ro.call_off, ro.ledger["response_id"], "ledger", "response_id", pos=ro.call_row)
    terminal = np.full(R, ROOT, dtype=np.int64)
    terminal[rec.rollout] = index.lookup(rec.rollout, rec.table["terminal_response_id"], "rollouts",
                                         "terminal_response_id", MISSING, null=ROOT)  # null: not given
    has_acc = np.zeros(R, dtype=bool)
    acc_len = np.zeros(R, dtype=np.int64)
    acc_call = np.zeros(0, dtype=np.int64)
    if acc_present:
        acc_col = rec.table["accepted_response_ids"]
        has_acc[rec.rollout] = bools(pc.is_valid(acc_col))
        lens = _list_lengths(acc_col)
        acc_len[rec.rollout] = lens
        owner = np.repeat(rec.rollout, lens)  # list_flatten: null lists contribute nothing
        acc_call = index.lookup(owner, pc.list_flatten(acc_col), "rollouts", "accepted_response_ids", MISSING)
    return ResponseJoin(index.later_duplicates(), terminal, has_acc, offsets_from_lengths(acc_len), acc_call)


@dataclass(frozen=True)
class ItemJoin:
    """Item keys of every call (``key_off``/``item_keys``) and of every rollout's output
    (``out_off``/``out_keys``), with their id codes aligned (-1: null) and bad-length flags;
    ``out_served``: an output id some call of the rollout served; ``identified``: a call that
    served an output id (SPEC §3 step 6)."""

    key_off: np.ndarray
    item_keys: np.ndarray
    item_ids: np.ndarray
    item_ids_bad_len: np.ndarray
    out_off: np.ndarray
    out_keys: np.ndarray
    out_ids: np.ndarray
    out_ids_bad_len: np.ndarray
    out_served: np.ndarray
    identified: np.ndarray


def join_items(ro: RolloutJoin, rec: Records) -> ItemJoin:
    R, C = ro.n, len(ro.of_call)
    rows = readonly(ro.call_row if ro.call_row is not None else np.arange(C, dtype=np.int64))
    # the lists' offsets per ledger row; key_off below: each call's slots, in call order
    key_list_off, key_valid, key_values = _ledger_lists(ro.ledger, "item_keys")
    id_list_off, id_valid, id_values = _ledger_lists(ro.ledger, "item_ids")
    keys = column_values(key_values, np.uint64, "ledger", "item_keys")
    key_len = np.empty(C, dtype=np.int64)
    run(slot_counts, even_chunks(C), rows, key_list_off, key_valid, key_len)
    key_off = offsets_from_lengths(key_len)
    S = int(key_off[-1])
    item_keys = np.empty(S, dtype=np.uint64)
    item_pos = np.empty(S, dtype=np.int64)
    item_ids_bad_len = np.zeros(C, dtype=bool)
    by_slots = balanced_chunks(key_off + np.arange(C + 1))  # a call costs 1 + its slots
    run(fill_slots, by_slots, rows, key_list_off, readonly(keys), id_list_off, id_valid, readonly(key_off),
        item_keys, item_pos, item_ids_bad_len)

    out_len = np.zeros(R, dtype=np.int64)
    o_starts, o_stops, o_values = _list_parts(rec.table["output_keys"])
    out_len[rec.rollout] = o_stops - o_starts
    out_off = offsets_from_lengths(out_len)
    out_keys = _take_ranges(column_values(o_values, np.uint64, "rollouts", "output_keys"), o_starts, o_stops - o_starts)
    out_parts = _list_parts(rec.table["output_ids"], null_is_empty=False)
    # per key slot, the position of its id (-1: null list, wrong length, no row); bad lengths
    out_pos, out_bad = aligned_positions(out_parts[0], out_parts[1], out_off, rec.rollout)
    out_ids_bad_len = np.zeros(R, dtype=bool)
    out_ids_bad_len[rec.rollout] = out_bad
    # a rollout's item slots are key_off[call_off[r]]:key_off[call_off[r + 1]] (calls in rollout order)
    out_ids, item_ids = grouped_lookup(out_off, (out_parts[2], out_pos, "rollouts", "output_ids"),
                                       key_off[ro.call_off], (id_values, item_pos, "ledger", "item_ids"),
                                       NO_OUTPUT, -1)
    identified = np.empty(C, dtype=bool)  # a call served an output id iff one of its slots did
    run(any_served, by_slots, readonly(key_off), readonly(item_ids), identified)
    served = np.zeros(len(out_ids), dtype=bool)
    served[item_ids[item_ids >= 0]] = True
    out_served = (out_ids >= 0) & served[np.maximum(out_ids, 0)]
    return ItemJoin(key_off, item_keys, item_ids, item_ids_bad_len, out_off, out_keys, out_ids,
                    out_ids_bad_len, out_served, identified)


def _ledger_lists(ledger: pa.Table, column: str) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """(int64 offsets per ledger row, bool validity per row or zero-length when none is null,
    the values) of a ledger list column, read-only, the offsets checked to stay inside the
    values before any kernel reads through them."""
    arr = one_chunk(ledger[column])
    off = list_offsets(arr)
    if not offsets_rise_within(off, len(arr.values)):
        raise InputError(f"ledger: column '{column}': list offsets outside its values")
    valid = bools(arr.is_valid()) if arr.null_count else _NO_NULLS
    return readonly(off), readonly(valid), arr.values


@dataclass(frozen=True)
class RewardJoin:
    """Per rollout: ``reward`` (NaN when null or no record), ``reward_null``, dense ``group``
    (a null group_id or no record is a group of its own) and its ``group_ids`` string."""

    reward: np.ndarray
    reward_null: np.ndarray
    group: np.ndarray
    group_ids: pa.Array


def join_rewards(rec: Records, n_rollouts: int) -> RewardJoin:
    R = n_rollouts
    reward = np.full(R, np.nan)
    reward_null = np.zeros(R, dtype=bool)
    col = rec.table["reward"]
    reward[rec.rollout] = column_values(one_chunk(pc.fill_null(col, np.nan)), np.float64, "rollouts", "reward")
    reward_null[rec.rollout] = bools(pc.is_null(col))
    gcol = one_chunk(rec.table["group_id"])
    enc = pc.dictionary_encode(gcol)
    codes = pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    raw = len(enc.dictionary) + np.arange(R, dtype=np.int64)
    valid = codes >= 0
    raw[rec.rollout[valid]] = codes[valid]
    _, group = np.unique(raw, return_inverse=True)
    pos = np.full(R, -1, dtype=np.int64)
    pos[rec.rollout] = np.arange(len(rec.rollout))
    group_ids = pc.take(gcol, pa.array(pos, mask=pos < 0))
    return RewardJoin(reward, reward_null, group.astype(np.int64).reshape(-1), group_ids)


# ---- helpers of the joins ----

class GroupIndex:
    """Exact lookup of string ids within groups (chainrows.engine.strjoin): the build strings
    ``values`` (a string column; ``pos`` picks each entry's string, -1 null; default: entry i is
    string i), grouped by ``build_off``; ``first``: per entry, the first entry of its group with
    the same string (-1 null)."""

    def __init__(self, build_off, values, table, column, pos=None):
        self.build_off = build_off
        (soff, data, valid), self.pos = _id_strings(values, pos, table, column)
        self.strings = (soff, data)
        self.tab_off = table_offsets(build_off)
        self.slot, self.slot_hash = new_tables(self.tab_off)
        self.first = np.empty(len(self.pos), dtype=np.int64)
        groups = balanced_chunks(build_off + np.arange(len(build_off)))  # a group costs 1 + its entries
        run(index_groups, groups, readonly(build_off), readonly(self.pos), readonly(soff), readonly(data),
            readonly(valid), readonly(self.tab_off), self.slot, self.slot_hash, self.first)

    def later_duplicates(self) -> np.ndarray:
        """bool per entry: an earlier entry of its group has the same string."""
        return (self.first >= 0) & (self.first != np.arange(len(self.first)))

    def lookup(self, group, values, table, column, missing, pos=None, null=None) -> np.ndarray:
        """Per probe (its group, its string in ``values``, ``pos`` as for the build side): the
        first build entry of that group with the same string, else ``missing``; a null probe
        never matches and gives ``null`` (default: ``missing``)."""
        strings, probe_pos = _id_strings(values, pos, table, column)
        found = np.empty(len(probe_pos), dtype=np.int64)
        run(probe_groups, even_chunks(len(found)), readonly(self.build_off), readonly(self.pos),
            *map(readonly, self.strings), readonly(self.tab_off), readonly(self.slot),
            readonly(self.slot_hash), readonly(np.ascontiguousarray(group, dtype=np.int64)),
            readonly(probe_pos), *map(readonly, strings), int(missing), int(missing if null is None else null),
            found)
        return found


_NO_NULLS = np.zeros(0, dtype=bool)


def grouped_lookup(build_off, build, probe_off, probe, missing, null) -> tuple[np.ndarray, np.ndarray]:
    """What :class:`GroupIndex` gives as ``first`` and as ``lookup(...)`` of the probes with
    ``missing`` and ``null``, for probes that come grouped like the build entries (group g's
    probes are ``probe_off[g]:probe_off[g+1]``), in one kernel pass without shared tables
    (chainrows.engine.strjoin.join_groups). ``build`` and ``probe``: (string column, pos or
    None, table name, column name), the arguments of :func:`_id_strings`. Returns (first, found)."""
    (bsoff, bdata, bvalid), bpos = _id_strings(*build)
    (psoff, pdata, pvalid), ppos = _id_strings(*probe)
    if build_off[-1] != len(bpos) or probe_off[-1] != len(ppos) or len(probe_off) != len(build_off):
        raise AssertionError("grouped_lookup: group offsets disagree with the entries")
    first = np.empty(len(bpos), dtype=np.int64)
    found = np.empty(len(ppos), dtype=np.int64)
    groups = balanced_chunks(build_off + probe_off + np.arange(len(build_off)))  # 1 + entries + probes
    run(join_groups, groups, readonly(build_off), readonly(bpos), readonly(bsoff), readonly(bdata),
        readonly(bvalid), readonly(probe_off), readonly(ppos), readonly(psoff), readonly(pdata), readonly(pvalid),
        int(missing), int(null), first, found)
    return first, found


def _id_strings(values, pos, table, column):
    """((offsets, bytes, validity), pos) of a string column for the strjoin kernels: ``pos``
    (default: every string in order; -1 a null entry) checked against the strings; validity
    a bool per string, zero-length when none is null (the kernels read it, so ``pos`` is never
    rewritten here)."""
    try:
        soff, data, valid = string_parts(one_chunk(values))
    except ValueError as err:
        raise InputError(f"{table}: column '{column}': {err}") from None
    n = len(soff) - 1
    if pos is None:
        pos = np.arange(n, dtype=np.int64)
    elif len(pos) and int(pos.max()) >= n:
        raise InputError(f"{table}: column '{column}': list offsets outside its values")
    return (soff, data, _NO_NULLS if valid is None else valid), pos


def _encode_sorted(cols) -> tuple[pa.Array, list[np.ndarray]]:
    """Dense int64 codes (-1 null) for several string columns at once, numbered in byte order
    of the strings: (sorted distinct strings, codes per column). One dictionary_encode over all
    the columns' chunks (one hash pass; Arrow shares the dictionary across the chunks of one
    array); its int32 indices are looked up in the rank table (one ``np.take`` per column), and
    ``fill_null`` runs only on chunks that have nulls."""
    chunks = [col.chunks if isinstance(col, pa.ChunkedArray) else [col] for col in cols]
    lengths = [len(col) for col in cols]
    flat = [c for parts in chunks for c in parts if len(c)]
    target = pa.string() if all(c.type == pa.string() for c in flat) else pa.large_string()
    if not flat:
        return pa.array([], pa.string()), [np.zeros(n, dtype=np.int64) for n in lengths]
    enc = pc.dictionary_encode(pa.chunked_array([c if c.type == target else c.cast(target) for c in flat], target))
    dictionary = enc.chunk(enc.num_chunks - 1).dictionary
    idx = np.concatenate([(pc.fill_null(c.indices, -1) if c.null_count else c.indices).to_numpy(zero_copy_only=False)
                          for c in enc.chunks])
    order = pc.sort_indices(dictionary).to_numpy().astype(np.int64)
    rank = np.empty(len(order) + 1, dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    rank[-1] = -1  # index -1 (null) gives -1
    bounds = np.cumsum([0] + lengths)
    codes = [np.take(rank, idx[bounds[i]:bounds[i + 1]]) for i in range(len(cols))]
    return dictionary.take(pa.array(order)).cast(pa.string()), codes


def _take_ranges(values, starts, lengths) -> np.ndarray:
    """Contiguous copy of values[starts[i]:starts[i]+lengths[i]] for all i; no copy when already so."""
    if len(starts) and starts[0] == 0 and np.all(starts[1:] == starts[:-1] + lengths[:-1]) and \
            int(lengths.sum()) == len(values):
        return np.ascontiguousarray(values)
    return values[range_index(starts, lengths)]


def _list_parts(col, null_is_empty=True):
    """(starts, stops, values) of a list column (one chunk used as it is, several concatenated
    once); starts index into values. A null list gives an empty range, or start = stop =
    NO_TOKENS when ``null_is_empty`` is False."""
    arr = one_chunk(col)
    off = list_offsets(arr)
    starts, stops = off[:-1].copy(), off[1:].copy()
    if arr.null_count:
        null = bools(arr.is_null())
        stops[null] = starts[null]
        if not null_is_empty:
            starts[null] = NO_TOKENS
            stops[null] = NO_TOKENS
    return starts, stops, arr.values


def column_values(arr, dtype, table, column) -> np.ndarray:
    """An Array (a list column's values) as a contiguous ``dtype`` array; a null in it is
    unusable input."""
    if arr.null_count:
        raise InputError(f"{table}: column '{column}' holds a null value inside a list")
    return np.ascontiguousarray(arr.to_numpy(zero_copy_only=False), dtype=dtype)


def _list_lengths(col) -> np.ndarray:
    return pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def int64s(col) -> np.ndarray:
    """An integer column as a contiguous int64 array."""
    return np.ascontiguousarray(col.to_numpy(), dtype=np.int64)


def bools(col) -> np.ndarray:
    """A boolean Array or ChunkedArray as a numpy bool array."""
    return np.asarray(one_chunk(col).to_numpy(zero_copy_only=False), dtype=bool)

