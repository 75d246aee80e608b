"""The named joins that turn three SPEC §2 Arrow tables into the engine's arrays.

Each join takes what earlier joins produced and returns a small frozen record of arrays:
rollouts (ids -> dense indices, ledger in rollout order), calls (call and parent ids), tokens
(token rows -> calls, buffer ranges), records (the first rollouts row of each id), responses
(terminal and accepted ids -> calls), items (item keys and ids, output keys and ids) and rewards
(reward and group per rollout). Rollout, call and response ids become dense integer codes with
one ``pc.dictionary_encode`` per id family; joins on (rollout, id) pairs are composite int64
keys, sorted once and probed (chainrows.io.arrays). Item and output ids, the most numerous, are
never encoded: a kernel matches them per rollout on their bytes (chainrows.engine.idmatch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chainrows.engine.batch import MISSING, NO_TOKENS, ROOT, readonly
from chainrows.engine.idmatch import match_ids, table_offsets
from chainrows.io.arrays import (
    KeyIndex, list_offsets, offsets_from_lengths, offsets_from_owner, one_chunk, range_index, string_parts,
)
from chainrows.io.errors import InputError
from chainrows.io.take import take_rows


@dataclass(frozen=True)
class RolloutJoin:
    """``ids``: every rollout id of the three tables, sorted (rollout r is ``ids[r]``);
    ``ledger``: the ledger stably sorted by rollout; ``of_call`` / ``of_token`` / ``of_record``:
    the rollout of each ledger, tokens and rollouts row; ``call_off``: calls per rollout."""

    ids: pa.Array
    ledger: pa.Table
    of_call: np.ndarray
    of_token: np.ndarray
    of_record: np.ndarray
    call_off: np.ndarray

    @property
    def n(self) -> int:
        return len(self.ids)


def join_rollouts(ledger: pa.Table, tokens: pa.Table, rollouts: pa.Table) -> RolloutJoin:
    ids, (l_r, t_r, ro_r) = _encode_sorted([ledger["rollout_id"], tokens["rollout_id"], rollouts["rollout_id"]])
    order = np.argsort(l_r, kind="stable")
    if np.any(order != np.arange(len(order))):
        ledger = take_rows(ledger, order)
        l_r = l_r[order]
    return RolloutJoin(ids, ledger, l_r, t_r, ro_r, offsets_from_owner(l_r, len(ids)))


@dataclass(frozen=True)
class CallJoin:
    """``parent``: each call's parent call (ROOT for a null parent_id, MISSING when it names
    no call of the rollout); ``dup_call_id``: an earlier call of the rollout has this id;
    ``of_token``: the call each token row names (MISSING: none)."""

    parent: np.ndarray
    dup_call_id: np.ndarray
    of_token: np.ndarray


def join_calls(ro: RolloutJoin, tokens: pa.Table) -> CallJoin:
    n_cid, (l_c, t_c, p_c) = _encode([ro.ledger["call_id"], tokens["call_id"], ro.ledger["parent_id"]])
    index = KeyIndex(_pair_keys(ro.of_call, l_c, n_cid))
    parent = index.lookup(_pair_keys(ro.of_call, p_c, n_cid), MISSING)
    parent[p_c < 0] = ROOT  # p_c is -1 exactly where parent_id is null
    return CallJoin(parent, index.later_duplicates(), index.lookup(_pair_keys(ro.of_token, t_c, n_cid), MISSING))


@dataclass(frozen=True)
class TokenJoin:
    """Per call: ``start``/``stop`` of its delta in ``buffer`` (NO_TOKENS: no token row),
    ``duplicated`` (several token rows); the same for logprobs when ``has_logprobs``;
    ``order``: the calls in token-row order (the buffer's order); ``orphan_rows``: token rows
    naming no call."""

    start: np.ndarray
    stop: np.ndarray
    buffer: np.ndarray
    duplicated: np.ndarray
    order: np.ndarray
    has_logprobs: bool
    lp_start: np.ndarray
    lp_stop: np.ndarray
    lp_buffer: np.ndarray
    orphan_rows: int


def token_buffers(tokens: pa.Table):
    """(starts, stops, int32 values) of the tokens column; the same for logprobs (float32), or None."""
    starts, stops, values = _list_parts(tokens["tokens"])
    tok = (starts, stops, column_values(values, np.int32, "tokens", "tokens"))
    if "logprobs" not in tokens.column_names:
        return tok, None
    starts, stops, values = _list_parts(tokens["logprobs"], null_is_empty=False)
    return tok, (starts, stops, column_values(values, np.float32, "tokens", "logprobs"))


def join_tokens(calls: CallJoin, n_calls: int, buffers) -> TokenJoin:
    """``buffers``: a future of :func:`token_buffers` (made while the ids were joined)."""
    t_call = calls.of_token
    matched = t_call >= 0
    duplicated = np.bincount(t_call[matched], minlength=n_calls) > 1
    tok_row = np.full(n_calls, -1, dtype=np.int64)
    tok_row[t_call[matched]] = np.flatnonzero(matched)
    # a call with several rows at the row it kept
    kept = np.zeros(len(t_call), dtype=bool)
    kept[tok_row[tok_row >= 0]] = True
    (starts, stops, buffer), lp_parts = buffers.result()
    start, stop = _gather_ranges(tok_row, starts, stops)
    if lp_parts is not None:
        lp_start, lp_stop = _gather_ranges(tok_row, lp_parts[0], lp_parts[1])
        lp_buffer = lp_parts[2]
    else:
        lp_start = np.full(n_calls, NO_TOKENS, dtype=np.int64)
        lp_stop = lp_start.copy()
        lp_buffer = np.zeros(0, dtype=np.float32)
    return TokenJoin(start, stop, buffer, duplicated, t_call[kept], lp_parts is not None,
                     lp_start, lp_stop, lp_buffer, int((~matched).sum()))


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
    cols = [ro.ledger["response_id"], rec.table["terminal_response_id"]]
    if acc_present:
        cols.append(pc.list_flatten(rec.table["accepted_response_ids"]))
    n_resp, codes = _encode(cols)
    index = KeyIndex(_pair_keys(ro.of_call, codes[0], n_resp))
    terminal = np.full(R, ROOT, dtype=np.int64)
    given = codes[1] >= 0  # null terminal_response_id: not given
    terminal[rec.rollout[given]] = index.lookup(_pair_keys(rec.rollout[given], codes[1][given], n_resp), MISSING)
    has_acc = np.zeros(R, dtype=bool)
    acc_len = np.zeros(R, dtype=np.int64)
    acc_call = np.zeros(0, dtype=np.int64)
    if acc_present:
        acc_col = rec.table["accepted_response_ids"]
        has_acc[rec.rollout] = bools(pc.is_valid(acc_col))
        lens = _list_lengths(acc_col)
        acc_len[rec.rollout] = lens
        owner = np.repeat(rec.rollout, lens)  # list_flatten: null lists contribute nothing
        acc_call = index.lookup(_pair_keys(owner, codes[2], n_resp), MISSING)
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
    key_starts, key_stops, key_values = _list_parts(ro.ledger["item_keys"])
    key_len = key_stops - key_starts
    key_off = offsets_from_lengths(key_len)
    item_keys = _take_ranges(column_values(key_values, np.uint64, "ledger", "item_keys"), key_starts, key_len)
    out_len = np.zeros(R, dtype=np.int64)
    o_starts, o_stops, o_values = _list_parts(rec.table["output_keys"])
    out_len[rec.rollout] = o_stops - o_starts
    out_off = offsets_from_lengths(out_len)
    out_keys = _take_ranges(column_values(o_values, np.uint64, "rollouts", "output_keys"), o_starts, o_stops - o_starts)

    item_parts = _list_parts(ro.ledger["item_ids"], null_is_empty=False)
    out_parts = _list_parts(rec.table["output_ids"], null_is_empty=False)
    item_pos, item_ids_bad_len = _aligned_positions(item_parts, key_off, np.arange(C))
    out_pos, out_bad = _aligned_positions(out_parts, out_off, rec.rollout)
    out_ids_bad_len = np.zeros(R, dtype=bool)
    out_ids_bad_len[rec.rollout] = out_bad
    item_soff, item_data = _id_strings(item_parts[2], item_pos, "ledger", "item_ids")
    out_soff, out_data = _id_strings(out_parts[2], out_pos, "rollouts", "output_ids")

    tab_off = table_offsets(out_off)
    slot_out = np.full(int(tab_off[-1]), -1, dtype=np.int64)
    slot_hash = np.empty(int(tab_off[-1]), dtype=np.uint64)
    item_ids = np.empty(len(item_pos), dtype=np.int64)
    out_ids = np.empty(len(out_pos), dtype=np.int64)
    out_served = np.zeros(len(out_pos), dtype=bool)
    identified = np.zeros(C, dtype=bool)
    match_ids(readonly(ro.call_off), readonly(key_off), readonly(out_off), readonly(item_pos),
              readonly(out_pos), readonly(item_soff), readonly(item_data), readonly(out_soff),
              readonly(out_data), readonly(tab_off), slot_out, slot_hash, item_ids, out_ids,
              out_served, identified)
    return ItemJoin(key_off, item_keys, item_ids, item_ids_bad_len, out_off, out_keys, out_ids,
                    out_ids_bad_len, out_served, identified)


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

def _aligned_positions(parts, dest_off, owners):
    """For each key slot, the position of its id in the id column's values (-1: null), and a
    bad-length flag per owner.

    ``parts`` = _list_parts of a column holding one id list per owner (a null list means every
    id is null; a list of the wrong length gives its owner nulls and the flag).
    """
    out = np.full(int(dest_off[-1]), -1, dtype=np.int64)
    starts, stops, _ = parts
    present = starts >= 0
    lens = np.where(present, stops - starts, 0)
    want = dest_off[owners + 1] - dest_off[owners]
    bad = present & (lens != want)
    good = present & ~bad
    out[range_index(dest_off[owners[good]], lens[good])] = range_index(starts[good], lens[good])
    return out, bad


def _id_strings(values, pos, table, column):
    """(offsets, bytes) of an id column's string values; ``pos`` set to -1 where a value is null."""
    try:
        soff, data, valid = string_parts(values)
    except ValueError as err:
        raise InputError(f"{table}: column '{column}': {err}") from None
    if len(pos) and int(pos.max()) >= len(soff) - 1:
        raise InputError(f"{table}: column '{column}': list offsets outside its values")
    if valid is not None:
        at = np.flatnonzero(pos >= 0)
        pos[at[~valid[pos[at]]]] = -1
    return soff, data


def _encode(cols) -> tuple[int, list[np.ndarray]]:
    """Dense int64 codes for several string columns at once, -1 for null: (number of codes,
    codes per column). One dictionary_encode over all the columns' chunks (one hash pass;
    Arrow shares the dictionary across the chunks of one array)."""
    enc, dictionary = _dictionary_encode(cols)
    return len(dictionary), enc


def _encode_sorted(cols) -> tuple[pa.Array, list[np.ndarray]]:
    """_encode with the codes renumbered in byte order of the strings: (sorted strings, codes)."""
    codes, dictionary = _dictionary_encode(cols)
    order = pc.sort_indices(dictionary).to_numpy().astype(np.int64)
    rank = np.empty(len(order) + 1, dtype=np.int64)
    rank[order] = np.arange(len(order), dtype=np.int64)
    rank[-1] = -1  # code -1 (null) stays -1
    return dictionary.take(pa.array(order)).cast(pa.string()), [rank[c] for c in codes]


def _dictionary_encode(cols):
    chunks = [col.chunks if isinstance(col, pa.ChunkedArray) else [col] for col in cols]
    lengths = [len(col) for col in cols]
    flat = [c for parts in chunks for c in parts if len(c)]
    target = pa.string() if all(c.type == pa.string() for c in flat) else pa.large_string()
    if not flat:
        return [np.zeros(n, dtype=np.int64) for n in lengths], pa.array([], target)
    enc = pc.dictionary_encode(pa.chunked_array([c if c.type == target else c.cast(target) for c in flat], target))
    dictionary = enc.chunk(enc.num_chunks - 1).dictionary
    idx = np.concatenate([pc.fill_null(c.indices, -1).to_numpy(zero_copy_only=False) for c in enc.chunks])
    idx = idx.astype(np.int64)
    bounds = np.cumsum([0] + lengths)
    return [idx[bounds[i]:bounds[i + 1]] for i in range(len(cols))], dictionary


def _pair_keys(owner, code, n_codes) -> np.ndarray:
    """owner * n_codes + code as int64; a negative code gives -1 (matches nothing)."""
    n_codes = max(int(n_codes), 1)
    if len(owner) and int(owner.max()) >= (2**62) // n_codes:
        raise InputError("too many distinct ids in one batch to index (reduce the batch size)")
    key = owner.astype(np.int64) * n_codes + code
    return np.where(code >= 0, key, -1)


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


def _gather_ranges(row, starts, stops):
    has = row >= 0
    s = np.full(len(row), NO_TOKENS, dtype=np.int64)
    e = np.full(len(row), NO_TOKENS, dtype=np.int64)
    s[has] = starts[row[has]]
    e[has] = stops[row[has]]
    return s, e


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

