"""The streaming plan: which GRPO groups can be decided after how much of each table was read.

A first pass reads the id columns alone (no tokens): the rollouts table maps every rollout to
its group (first row of an id counts; a rollout without a rollouts row or with a null group is
a group of its own), the ledger gives each call's ``delta_len`` (an estimate of its token
row's bytes). The three tables are then read side by side in ``steps`` steps: at step ``k``
each table is read up to the same fraction ``(k + 1) / steps`` of its estimated bytes. A group
is decided at the first step by which every one of its rows, in every table, has been read;
rows of groups not yet complete are held until then.

Input in capture order completes groups soon after they start, so little is held; token rows
shuffled over the file complete almost every group at the last step, and the plan's estimated
peak says so before any token is read. A plan can instead hold some tables ``resident``: read
whole at the first step and kept until their rows are all decided, so groups complete as soon
as the other tables' rows are read (token rows shuffled, when the tokens table fits the budget).
The scan itself can read a resident ledger or rollouts table whole, all its columns, and hand
its batches to the stream (:class:`Kept`; the planner keeps tables in many small files, which
are then read once, not twice: each file's fixed cost paid once, docs/decisions-io.md "Many
small files").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chainrows.arrays import coalesced
from chainrows.engine.dense import dense_codes
from chainrows.formats.native.dataset import iter_table_batches
from chainrows.lowering.joins import MIN_BUFFER_BYTES
from chainrows.lowering.take import take_rows
from chainrows.runners.bulk.partition import collision_error, string_hashes

LEDGER_ROW_BYTES = 160   # a ledger row in Arrow, ids and item lists included (order of magnitude)
ROLLOUT_ROW_BYTES = 200
TOKEN_ROW_BYTES = 64     # a token row in Arrow without its lists' values: ids, offsets
SCAN_BATCH_ROWS = 1 << 16
KEPT_TABLES = ("ledger", "rollouts")  # the resident tables a scan can read whole (not tokens: its ids alone)
SLICE_SPARE = 4  # sliced rows may leave at most a quarter of their piece's rows unused (kept alive)


@dataclass(frozen=True)
class TableScan:
    """Per row of one table, in read order: its group (dense code) and estimated Arrow bytes."""

    group: np.ndarray   # int64[rows]
    nbytes: np.ndarray  # float64[rows]


class Kept:
    """Record batches of the tables a scan read whole (all their columns), for the stream to
    take once: a batch the stream has decided is freed, which a reference kept here would
    prevent."""

    def __init__(self, batches: dict[str, list[pa.RecordBatch]]):
        self._batches = batches
        self.names = tuple(batches)

    def hand_over(self, name: str) -> list[pa.RecordBatch] | None:
        """Table ``name``'s batches, in read order, the first time it is asked for; else None."""
        return self._batches.pop(name, None)


@dataclass(frozen=True)
class Scan:
    tables: dict[str, TableScan]
    n_groups: int
    kept: Kept | None = None  # tables read whole (``scan``'s ``keep``)

    @property
    def total_bytes(self) -> float:
        return float(sum(t.nbytes.sum() for t in self.tables.values()))


@dataclass(frozen=True)
class WindowPlan:
    """``steps`` reads. ``cuts[name][k]``: rows of table ``name`` read after step ``k - 1``
    (``cuts[name][0] == 0``). ``done[name]``: per row, the step that decides its group.
    ``held[k]`` / ``decided[k]`` / ``read[k]``: estimated bytes in memory at step ``k`` / of the
    groups decided then / read then. ``resident``: tables read whole at step 0 and counted as
    held until the last step (their record batches are freed only once fully decided);
    ``copied[k]``: bytes of their rows decided at step ``k``, copied into that window on top of
    what is held (an upper bound: runs of them that fill a record batch are sliced, ``take``).
    ``kept``: resident tables the scan already read (``Scan.kept``)."""

    steps: int
    cuts: dict[str, np.ndarray]
    done: dict[str, np.ndarray]
    held: np.ndarray
    decided: np.ndarray
    read: np.ndarray
    resident: tuple[str, ...] = ()
    copied: np.ndarray | None = None
    kept: Kept | None = None


def _batches(dataset_dir, name: str, columns: list[str]):
    """The columns' record batches, files of few rows joined (``arrays.coalesced``)."""
    return coalesced(iter_table_batches(dataset_dir, name, columns, SCAN_BATCH_ROWS), SCAN_BATCH_ROWS)


def _scan_batches(dataset_dir, name: str, columns: list[str], kept: dict[str, list]):
    """The batches the scan reads of table ``name``: ``columns`` alone, or, for a table in
    ``kept``, every column, each batch also appended to ``kept[name]``."""
    if name not in kept:
        yield from _batches(dataset_dir, name, columns)
        return
    for batch in iter_table_batches(dataset_dir, name, None, SCAN_BATCH_ROWS):  # small files come joined
        kept[name].append(batch)
        yield batch


def _row_bytes(batches: list[pa.RecordBatch], rows: int, estimate: int) -> np.ndarray:
    """Bytes per row of a table: measured per batch when the scan kept its ``batches``, else
    ``estimate``."""
    if not batches:
        return np.full(rows, float(estimate))
    return np.concatenate([np.full(b.num_rows, b.nbytes / max(b.num_rows, 1)) for b in batches])


def scan(dataset_dir, has_logprobs: bool, keep: tuple[str, ...] = ()) -> Scan:
    """Read the id columns of the three tables (and ledger delta_len) once; the tables of
    ``keep`` among KEPT_TABLES whole, kept for the stream (``Scan.kept``)."""
    kept = {n: [] for n in KEPT_TABLES if n in keep}
    rid_parts, grp_parts, second = [], [], []
    for batch in _scan_batches(dataset_dir, "rollouts", ["rollout_id", "group_id"], kept):
        rid = string_hashes(batch.column("rollout_id"))
        valid = pc.is_valid(batch.column("group_id")).to_numpy(zero_copy_only=False)
        grp = np.where(valid, string_hashes(batch.column("group_id")) ^ np.uint64(0x9E3779B97F4A7C15), rid)
        rid_parts.append(rid)
        grp_parts.append(grp)
        second.append(string_hashes(batch.column("rollout_id"), second=True))
    ro_rid = np.concatenate(rid_parts) if rid_parts else np.zeros(0, np.uint64)
    ro_grp = np.concatenate(grp_parts) if grp_parts else np.zeros(0, np.uint64)

    led_rid, led_delta = [], []
    for batch in _scan_batches(dataset_dir, "ledger", ["rollout_id", "delta_len"], kept):
        led_rid.append(string_hashes(batch.column("rollout_id")))
        second.append(string_hashes(batch.column("rollout_id"), second=True))
        led_delta.append(batch.column("delta_len").to_numpy(zero_copy_only=False))
    led_rid = np.concatenate(led_rid) if led_rid else np.zeros(0, np.uint64)
    led_delta = np.concatenate(led_delta).astype(np.float64) if led_delta else np.zeros(0)
    tok_rid = []
    for batch in _batches(dataset_dir, "tokens", ["rollout_id"]):
        tok_rid.append(string_hashes(batch.column("rollout_id")))
        second.append(string_hashes(batch.column("rollout_id"), second=True))
    tok_rid = np.concatenate(tok_rid) if tok_rid else np.zeros(0, np.uint64)
    # One pass numbers the rollout ids of every row (rollouts, ledger, tokens, in that order, as
    # ``second`` holds them) and checks that no routing hash stands for two ids.
    all_rid = np.concatenate([ro_rid, led_rid, tok_rid])
    rid_code, rid_first, clash = dense_codes(all_rid, np.concatenate(second) if second else None)
    del second
    if clash >= 0:
        raise collision_error(all_rid[clash])
    n_ro, n_led = len(ro_rid), len(led_rid)
    led_code, tok_code = rid_code[n_ro:n_ro + n_led], rid_code[n_ro + n_led:]

    # token row bytes: the rollout's ledger tokens spread evenly over its token rows
    per_token = 4 + (4 if has_logprobs else 0)  # int32 token, float32 logprob
    n_rid = len(rid_first)
    tokens_of = np.bincount(led_code, weights=np.clip(led_delta, 0, 1 << 31), minlength=n_rid)
    rows_of = np.bincount(tok_code, minlength=n_rid)
    tok_bytes = TOKEN_ROW_BYTES + per_token * tokens_of[tok_code] / np.maximum(rows_of[tok_code], 1)

    # every row of a rollout follows the group of its first rollouts row (SPEC §3 step 4: only
    # the first row counts; rollouts rows come first in all_rid, so a rollout's first index is
    # that row), a repeated rollouts row included; a rollout without one is a group of its own
    has_row = rid_first < n_ro
    group_key = all_rid[rid_first]
    group_key[has_row] = ro_grp[rid_first[has_row]]
    group_of_rid, group_first, _ = dense_codes(group_key)
    codes = group_of_rid[rid_code]
    bounds = (0, n_ro, n_ro + n_led, len(all_rid))
    return Scan(
        tables={
            "ledger": TableScan(codes[bounds[1]:bounds[2]], _row_bytes(kept.get("ledger"), n_led, LEDGER_ROW_BYTES)),
            "tokens": TableScan(codes[bounds[2]:bounds[3]], tok_bytes),
            "rollouts": TableScan(codes[bounds[0]:bounds[1]],
                                  _row_bytes(kept.get("rollouts"), n_ro, ROLLOUT_ROW_BYTES)),
        },
        n_groups=len(group_first),
        kept=Kept(kept) if kept else None,
    )


def plan_windows(sc: Scan, steps: int, resident: tuple[str, ...] = ()) -> WindowPlan:
    """Read the three tables in ``steps`` equal fractions of their bytes (``resident`` ones
    whole at step 0, each table the scan kept among them); decide each group at the first step
    by which all its rows are read."""
    steps = max(1, int(steps))
    resident = tuple(n for n in sc.tables if n in resident)
    if sc.kept is not None and not set(sc.kept.names) <= set(resident):
        raise ValueError(f"plan_windows: tables the scan kept ({', '.join(sc.kept.names)}) must be resident")
    read_at = {}
    for name, t in sc.tables.items():
        if name in resident:
            read_at[name] = np.zeros(len(t.nbytes), dtype=np.int64)
            continue
        cum = np.cumsum(t.nbytes)
        total = cum[-1] if len(cum) else 0.0
        frac = cum / total if total > 0 else np.ones(len(cum))
        read_at[name] = np.clip(np.ceil(frac * steps).astype(np.int64) - 1, 0, steps - 1)
    done_of_group = np.zeros(sc.n_groups, dtype=np.int64)
    for name, t in sc.tables.items():
        np.maximum.at(done_of_group, t.group, read_at[name])
    held_diff = np.zeros(steps + 1)
    decided = np.zeros(steps)
    read = np.zeros(steps)
    copied = np.zeros(steps)
    done, cuts = {}, {}
    for name, t in sc.tables.items():
        d = done_of_group[t.group]
        done[name] = d
        cuts[name] = np.searchsorted(read_at[name], np.arange(steps), side="left").astype(np.int64)
        cuts[name] = np.append(cuts[name], len(d))
        arrived = np.bincount(read_at[name], weights=t.nbytes, minlength=steps + 1)
        decided_here = np.bincount(d, weights=t.nbytes, minlength=steps)
        freed = np.full(len(d), steps) if name in resident else d + 1
        held_diff += arrived - np.bincount(freed, weights=t.nbytes, minlength=steps + 1)
        read += arrived[:steps]
        decided += decided_here
        if name in resident:
            copied += decided_here
    return WindowPlan(steps, cuts, done, np.cumsum(held_diff)[:steps], decided, read, resident, copied, sc.kept)


def take(table: pa.Table, idx: np.ndarray, *, slices: bool = False) -> pa.Table:
    """Rows ``idx`` (increasing) of ``table``: a slice when they are contiguous, else a block
    copy per row (chainrows.lowering.take). With ``slices``, rows that are nearly all of ``table``
    (all but at most 1 / SLICE_SPARE of its rows) and form runs of at least MIN_BUFFER_BYTES on
    average (estimated from ``table``'s bytes per row; the engine uses chunks that size in
    place and merges smaller ones, chainrows.lowering.joins) are instead zero-copy slices, one chunk
    per run: they keep all of ``table``'s buffers alive as long as they are, which the first
    condition keeps to little more than the rows taken."""
    if len(idx) == table.num_rows:
        return table
    if len(idx) and idx[-1] - idx[0] + 1 == len(idx):
        return table.slice(int(idx[0]), len(idx))
    if slices and len(idx) and (table.num_rows - len(idx)) * SLICE_SPARE <= table.num_rows:
        breaks = np.flatnonzero(np.diff(idx) != 1) + 1
        if len(idx) * (table.nbytes / table.num_rows) >= MIN_BUFFER_BYTES * (len(breaks) + 1):
            return _runs_as_slices(table, idx, breaks)
    return take_rows(table, idx)


def _runs_as_slices(table: pa.Table, idx: np.ndarray, breaks: np.ndarray) -> pa.Table:
    """Rows ``idx`` of ``table``, whose runs of consecutive rows start at ``breaks``, as one
    slice of ``table`` per run."""
    starts = np.concatenate(([0], breaks))
    stops = np.concatenate((breaks, [len(idx)]))
    return pa.concat_tables([table.slice(int(idx[a]), int(b - a)) for a, b in zip(starts, stops)])
