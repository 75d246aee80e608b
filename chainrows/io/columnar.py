"""Arrow tables (SPEC §2) -> the engine's Batch, in bulk: no Python loop per rollout or call.

String ids become dense integer codes with one ``pc.dictionary_encode`` per id family; joins
on (rollout, id) pairs are composite int64 keys, sorted once and probed with
``np.searchsorted``. Rollouts get indices in byte order of their ids, so the engine's output is
already sorted by rollout_id. With more than one thread (Numba's and Arrow's), the token and
logprob buffers are made on a helper thread meanwhile.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chainrows.engine.batch import MISSING, NO_TOKENS, ROOT, Batch, readonly
from chainrows.engine.select import call_key_hashes, candidate_index
from chainrows.io.errors import InputError


@dataclass
class Labels:
    """The strings that belong to a Batch, for building output tables."""

    rollout_ids: pa.Array  # string[R], sorted
    group_ids: pa.Array  # string[R], null when no rollouts row or a null group_id
    call_ids: pa.Array  # string[C], in batch call order
    orphan_token_rows: int  # token rows that name no ledger call


def build_batch(ledger: pa.Table, tokens: pa.Table, rollouts: pa.Table) -> tuple[Batch, Labels]:
    """Join the three tables into one Batch.

    The tables go through the reader's SPEC §2 checks first (types, nulls, UTF-8; an InputError
    without a file name on unusable input), so Arrow tables handed to the API directly get the
    same treatment as files. For tables that already come from the reader this is a cheap
    no-op pass (no casts; one scan of the id strings and the null bitmaps).
    """
    ledger = _canonical("ledger", ledger)
    tokens = _canonical("tokens", tokens)
    rollouts = _canonical("rollouts", rollouts)
    # the token and logprob buffers (a concatenation when the columns have several chunks)
    # depend on nothing else: with more than one thread they are made while the ids are joined
    buffers = _submit(_token_buffers, tokens)
    rid, (l_r, t_r, ro_r) = _encode_sorted([ledger["rollout_id"], tokens["rollout_id"], rollouts["rollout_id"]])
    R = len(rid)
    order = np.argsort(l_r, kind="stable")
    if np.any(order != np.arange(len(order))):
        ledger = ledger.take(pa.array(order))
        l_r = l_r[order]
    C = len(l_r)
    call_off = _offsets_from_owner(l_r, R)

    # calls: ids -> (rollout, code) keys
    n_cid, (l_c, t_c, p_c) = _encode([ledger["call_id"], tokens["call_id"], ledger["parent_id"]])
    call_index = _KeyIndex(_pair_keys(l_r, l_c, n_cid))
    dup_call_id = call_index.later_duplicates()
    parent = call_index.lookup(_pair_keys(l_r, p_c, n_cid))
    parent[p_c < 0] = ROOT  # p_c is -1 exactly where parent_id is null

    # tokens join
    t_call = call_index.lookup(_pair_keys(t_r, t_c, n_cid))
    matched = t_call >= 0
    counts = np.bincount(t_call[matched], minlength=C)
    dup_tokens = counts > 1
    tok_row = np.full(C, -1, dtype=np.int64)
    tok_row[t_call[matched]] = np.flatnonzero(matched)
    # calls in token-row order (a call with several rows at the row it kept): the token buffer's
    # order, so the data checks read it front to back
    kept = np.zeros(len(t_call), dtype=bool)
    kept[tok_row[tok_row >= 0]] = True
    tok_order = t_call[kept]
    (tok_starts, tok_stops, token_buf), lp_parts = buffers.result()
    tok_start, tok_stop = _gather_ranges(tok_row, tok_starts, tok_stops)
    has_logprobs = lp_parts is not None
    if has_logprobs:
        lp_starts, lp_stops, lp_buf = lp_parts
        lp_start, lp_stop = _gather_ranges(tok_row, lp_starts, lp_stops)
    else:
        lp_start = np.full(C, NO_TOKENS, dtype=np.int64)
        lp_stop = lp_start.copy()
        lp_buf = np.zeros(0, dtype=np.float32)

    # responses
    acc_present = "accepted_response_ids" in rollouts.column_names
    rec = _Records(rollouts, ro_r, R)
    resp_cols = [ledger["response_id"], rec.table["terminal_response_id"]]
    if acc_present:
        resp_cols.append(pc.list_flatten(rec.table["accepted_response_ids"]))
    n_resp, resp_codes = _encode(resp_cols)
    resp_index = _KeyIndex(_pair_keys(l_r, resp_codes[0], n_resp))
    dup_response_id = resp_index.later_duplicates()

    terminal = np.full(R, ROOT, dtype=np.int64)
    term_given = resp_codes[1] >= 0  # null terminal_response_id: not given
    rr = rec.rollout[term_given]
    terminal[rr] = _lookup_or_missing(resp_index, rr, resp_codes[1][term_given], n_resp)

    has_acc = np.zeros(R, dtype=bool)
    acc_len = np.zeros(R, dtype=np.int64)
    acc_call = np.zeros(0, dtype=np.int64)
    if acc_present:
        acc_col = rec.table["accepted_response_ids"]
        has_acc[rec.rollout] = _np_bool(pc.is_valid(acc_col))
        lens = _list_lengths(acc_col)
        acc_len[rec.rollout] = lens
        owner = np.repeat(rec.rollout, lens)  # list_flatten: null lists contribute nothing
        acc_call = _lookup_or_missing(resp_index, owner, resp_codes[2], n_resp)
    acc_off = _offsets_from_lengths(acc_len)

    # item keys and ids
    key_starts, key_stops, key_values = _list_parts(ledger["item_keys"], "ledger", "item_keys")
    key_len = key_stops - key_starts
    key_off = _offsets_from_lengths(key_len)
    item_keys = _take_ranges(_values(key_values, np.uint64, "ledger", "item_keys"), key_starts, key_len)
    out_len = np.zeros(R, dtype=np.int64)
    o_starts, o_stops, o_values = _list_parts(rec.table["output_keys"], "rollouts", "output_keys")
    out_len[rec.rollout] = o_stops - o_starts
    out_off = _offsets_from_lengths(out_len)
    out_keys = _take_ranges(_values(o_values, np.uint64, "rollouts", "output_keys"), o_starts, o_stops - o_starts)

    item_parts = _list_parts(ledger["item_ids"], "", "", null_is_empty=False)
    out_parts = _list_parts(rec.table["output_ids"], "", "", null_is_empty=False)
    n_iid, (item_codes, out_codes) = _encode([item_parts[2], out_parts[2]])
    item_ids, item_ids_bad_len = _aligned_ids(item_parts, item_codes, key_off, np.arange(C))
    out_ids_r, out_bad_r = _aligned_ids(out_parts, out_codes, out_off, rec.rollout)
    out_ids = out_ids_r
    out_ids_bad_len = np.zeros(R, dtype=bool)
    out_ids_bad_len[rec.rollout] = out_bad_r

    # which output ids are served by some call, which calls serve an output id
    call_of_item = np.repeat(np.arange(C, dtype=np.int64), key_len)
    rollout_of_out = np.repeat(np.arange(R, dtype=np.int64), out_len)
    Q = max(n_iid, 1)
    item_pair = _pair_keys(l_r[call_of_item], item_ids, Q)
    out_pair = _pair_keys(rollout_of_out, out_ids, Q)
    out_served = (out_ids >= 0) & _member(out_pair, item_pair[item_ids >= 0])
    serving = (item_ids >= 0) & _member(item_pair, out_pair[out_ids >= 0])
    identified = np.zeros(C, dtype=bool)
    identified[call_of_item[serving]] = True

    # candidate index: calls with keys, sorted by (rollout, item count, hash of all their keys)
    with_keys = np.flatnonzero(key_len > 0)
    whole = np.empty(C, dtype=np.uint64)
    call_key_hashes(readonly(key_off), readonly(item_keys), whole)
    cand_off = _offsets_from_owner(l_r[with_keys], R)
    cand_call = np.empty(len(with_keys), dtype=np.int64)
    candidate_index(readonly(call_off), readonly(key_len), readonly(whole), readonly(cand_off), cand_call)

    reward = np.full(R, np.nan)
    reward_null = np.zeros(R, dtype=bool)
    reward_col = rec.table["reward"]
    reward[rec.rollout] = _values(pc.fill_null(reward_col, np.nan).combine_chunks(), np.float64, "rollouts", "reward")
    reward_null[rec.rollout] = _np_bool(pc.is_null(reward_col))
    group, group_ids = _groups(rec, R)

    batch = Batch(
        call_off=call_off, has_record=rec.has_record, dup_record=rec.dup_record, reward=reward,
        reward_null=reward_null, group=group, out_off=out_off, out_keys=out_keys, out_ids=out_ids,
        out_served=out_served, out_ids_bad_len=out_ids_bad_len, terminal=terminal, has_acc=has_acc,
        acc_off=acc_off, acc_call=acc_call, cand_off=cand_off,
        cand_len=np.ascontiguousarray(key_len[cand_call]), cand_hash=np.ascontiguousarray(whole[cand_call]),
        cand_call=cand_call,
        parent=parent, prev_len=_int64(ledger["prev_len"]), delta_len=_int64(ledger["delta_len"]),
        gen_len=_int64(ledger["gen_len"]), chain_hash=_values(ledger["chain_hash"].combine_chunks(), np.uint64, "ledger", "chain_hash"),
        failed=_np_bool(ledger["failed"]), dup_call_id=dup_call_id, dup_response_id=dup_response_id,
        dup_tokens=dup_tokens, item_ids_bad_len=item_ids_bad_len, identified=identified,
        key_off=key_off, item_keys=item_keys, item_ids=item_ids, tok_start=tok_start,
        tok_stop=tok_stop, tokens=token_buf, tok_order=tok_order, has_logprobs=has_logprobs, lp_start=lp_start,
        lp_stop=lp_stop, logprobs=lp_buf,
    )
    labels = Labels(
        rollout_ids=rid, group_ids=group_ids, call_ids=ledger["call_id"].combine_chunks(),
        orphan_token_rows=int((~matched).sum()),
    )
    return batch, labels


def _token_buffers(tokens: pa.Table):
    """(starts, stops, int32 values) of the tokens column; the same for logprobs (float32), or None."""
    starts, stops, values = _list_parts(tokens["tokens"], "tokens", "tokens")
    tok = (starts, stops, _values(values, np.int32, "tokens", "tokens"))
    if "logprobs" not in tokens.column_names:
        return tok, None
    starts, stops, values = _list_parts(tokens["logprobs"], "tokens", "logprobs", null_is_empty=False)
    return tok, (starts, stops, _values(values, np.float32, "tokens", "logprobs"))


class _Deferred:
    """The one-thread path of _submit: fn(*args) runs when its result is asked for, so its
    errors come at the same point in build_batch as from the helper thread."""

    def __init__(self, fn, *args):
        self._fn, self._args = fn, args

    def result(self):
        return self._fn(*self._args)


_POOL: ThreadPoolExecutor | None = None


def _submit(fn, *args):
    """fn(*args) on a helper thread when Numba and Arrow may both use more than one (numpy and
    Arrow release the GIL while they copy), else when its result is asked for. ``.result()``
    (once) gives the value or raises the error.

    Arrow at one thread is how a partitioned bulk run bounds the memory Arrow's allocator keeps
    per allocating thread (``bulk.one_arrow_thread``); a helper thread would undo that.
    """
    global _POOL
    if numba.get_num_threads() <= 1 or pa.cpu_count() <= 1:
        return _Deferred(fn, *args)
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chainrows-build")
    return _POOL.submit(fn, *args)


def _canonical(name: str, table) -> pa.Table:
    from chainrows.io.dataset import check_schema, normalize

    if not isinstance(table, pa.Table):
        raise TypeError(f"{name}: expected a pyarrow.Table, got {type(table).__name__}")
    return normalize(name, table, check_schema(name, table.schema))


class _KeyIndex:
    """Sorted int64 keys for exact-match probes; remembers each key's original position."""

    def __init__(self, keys: np.ndarray):
        self.order = np.argsort(keys, kind="stable")
        self.sorted = keys[self.order]

    def later_duplicates(self) -> np.ndarray:
        """bool per original position: an earlier position holds the same key."""
        dup = np.zeros(len(self.sorted), dtype=bool)
        same = self.sorted[1:] == self.sorted[:-1]
        dup[self.order[1:][same]] = True
        return dup

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Original position of the first occurrence of each key, MISSING when absent or negative."""
        pos = np.searchsorted(self.sorted, keys, side="left")
        pos_c = np.minimum(pos, max(len(self.sorted) - 1, 0))
        hit = (pos < len(self.sorted)) & (keys >= 0)
        if len(self.sorted):
            hit &= self.sorted[pos_c] == keys
        out = np.full(len(keys), MISSING, dtype=np.int64)
        out[hit] = self.order[pos_c[hit]]
        return out


class _Records:
    """The first rollouts row of each rollout id, in rollout index order."""

    def __init__(self, rollouts: pa.Table, ro_r: np.ndarray, R: int):
        uniq, first, counts = np.unique(ro_r, return_index=True, return_counts=True)
        self.rollout = uniq.astype(np.int64)  # rollout index of each kept record
        self.table = rollouts.take(pa.array(first.astype(np.int64)))
        self.has_record = np.zeros(R, dtype=bool)
        self.has_record[self.rollout] = True
        self.dup_record = np.zeros(R, dtype=bool)
        self.dup_record[self.rollout] = counts > 1


def _groups(rec: _Records, R: int) -> tuple[np.ndarray, pa.Array]:
    """Dense group index per rollout; a null group_id (or no record) is a group of its own."""
    gcol = rec.table["group_id"].combine_chunks()
    enc = pc.dictionary_encode(gcol)
    codes = pc.fill_null(enc.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    G = len(enc.dictionary)
    raw = G + np.arange(R, dtype=np.int64)
    valid = codes >= 0
    raw[rec.rollout[valid]] = codes[valid]
    _, group = np.unique(raw, return_inverse=True)
    pos = np.full(R, -1, dtype=np.int64)
    pos[rec.rollout] = np.arange(len(rec.rollout))
    group_ids = pc.take(gcol, pa.array(pos, mask=pos < 0))
    return group.astype(np.int64).reshape(-1), group_ids


def _aligned_ids(parts, codes, dest_off, owners):
    """Id codes aligned with the keys' offsets (-1 null) and a bad-length flag per owner.

    ``parts`` = _list_parts of a column holding one id list per owner (a null list means every
    id is null); ``codes`` = the codes of its values.
    """
    total = int(dest_off[-1])
    out = np.full(total, -1, dtype=np.int64)
    starts, stops, _ = parts
    present = starts >= 0
    lens = np.where(present, stops - starts, 0)
    want = dest_off[owners + 1] - dest_off[owners]
    bad = present & (lens != want)
    good = present & ~bad
    src = range_index(starts[good], lens[good])
    dst = range_index(dest_off[owners[good]], lens[good])
    out[dst] = codes[src]
    return out, bad


# ---- small Arrow/numpy helpers ----

def _encode(cols) -> tuple[int, list[np.ndarray]]:
    """Dense int64 codes for several string columns at once, -1 for null: (number of codes, codes per column).

    One dictionary_encode over all the columns' chunks (one hash pass; Arrow shares the
    dictionary across the chunks of one array), instead of a unique and then an index_in per
    column.
    """
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
    chunks = []
    lengths = []
    for col in cols:
        parts = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
        chunks.append(parts)
        lengths.append(len(col))
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


def _member(keys: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """keys[i] in pool, by sort + binary search (np.isin measured ~1 s per GB batch)."""
    if len(pool) == 0 or len(keys) == 0:
        return np.zeros(len(keys), dtype=bool)
    pool = np.sort(pool)
    pos = np.minimum(np.searchsorted(pool, keys), len(pool) - 1)
    return pool[pos] == keys


def _offsets_from_lengths(lengths) -> np.ndarray:
    off = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    return off


def _offsets_from_owner(owner, n) -> np.ndarray:
    return _offsets_from_lengths(np.bincount(owner, minlength=n).astype(np.int64))


def range_index(starts, lengths) -> np.ndarray:
    """Concatenation of arange(s, s + n) for each (s, n), vectorised."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    shift = np.repeat(np.asarray(starts, dtype=np.int64) - (np.cumsum(lengths) - lengths), lengths)
    return shift + np.arange(total, dtype=np.int64)


def _take_ranges(values, starts, lengths) -> np.ndarray:
    """Contiguous copy of values[starts[i]:starts[i]+lengths[i]] for all i; no copy when already so."""
    if len(starts) and starts[0] == 0 and np.all(starts[1:] == starts[:-1] + lengths[:-1]) and \
            int(lengths.sum()) == len(values):
        return np.ascontiguousarray(values)
    return values[range_index(starts, lengths)]


def _list_parts(col, table, column, null_is_empty=True):
    """(starts, stops, values) of a list column; starts index into values.

    A null list gives an empty range, or start = NO_TOKENS when ``null_is_empty`` is False.
    """
    if isinstance(col, pa.ChunkedArray):
        # one chunk: use its buffers as they are (zero copy); several: one concatenation
        arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    else:
        arr = col
    off = np.asarray(arr.offsets).astype(np.int64)
    starts, stops = off[:-1].copy(), off[1:].copy()
    if arr.null_count:
        null = _np_bool(arr.is_null())
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


def _values(arr, dtype, table, column) -> np.ndarray:
    if arr.null_count:
        raise InputError(f"{table}: column '{column}' holds a null value inside a list")
    out = arr.to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(out, dtype=dtype)


def _list_lengths(col) -> np.ndarray:
    return pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64)


def _lookup_or_missing(index: _KeyIndex, owner, codes, n_codes) -> np.ndarray:
    return index.lookup(_pair_keys(owner, codes, n_codes))


def _int64(col) -> np.ndarray:
    return np.ascontiguousarray(col.to_numpy(), dtype=np.int64)


def _np_bool(col) -> np.ndarray:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=bool)
