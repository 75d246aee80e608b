"""Packed batches: several rows concatenated into one sequence of at most ``max_tokens``, with
``cu_seqlens`` (int32, what flash-attention's varlen kernels take) and position ids that restart
at 0 on every row; each data-parallel rank its own bins.

    from chainrows.batches import iter_packed

    for b in iter_packed("OUT", max_tokens=65_536, seed=epoch, rank=rank, world_size=world):
        ids = torch.from_numpy(b["input_ids"])[None]     # (1, T) int64
        cu = torch.from_numpy(b["cu_seqlens"])           # (rows + 1,) int32
        ...

Rows are streamed a window at a time: the rows table's row groups, in a seeded random order,
are read into windows of about ``window`` rows (decided from the files' footers alone, so every
rank sees the same windows); each window is packed into bins (:func:`chainrows.batches.binpack.
plan_bins`), the bins dealt to the ranks (:func:`chainrows.batches.binpack.deal_bins`), and each
rank takes its own. numpy and pyarrow only; docs/trainers.md has the recipes per trainer.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from chainrows.batches.binpack import deal_bins, plan_bins
from chainrows.batches.padded import rows_files
from chainrows.errors import InputError

__all__ = ["iter_packed", "PackedBatches", "PackStats", "rows_source", "batches_table"]

_COLUMNS = ("row_id", "rollout_id", "input_ids", "loss_mask", "advantage", "weight")
_TABLE_UNIT = 1024  # rows per unit when the rows are an in-memory table


@dataclass
class PackStats:
    """What a pass has packed so far (the ranks it was asked for; dropped rows over every rank)."""

    max_tokens: int
    rows: int = 0
    tokens: int = 0
    bins: int = 0
    dropped_rows: int = 0
    dropped_tokens: int = 0
    tokens_per_rank: dict = field(default_factory=dict)
    bins_per_rank: dict = field(default_factory=dict)

    @property
    def fill(self) -> float:
        """Real tokens over ``bins * max_tokens``: the share of each step's budget used."""
        return self.tokens / (self.bins * self.max_tokens) if self.bins else 0.0


def rows_source(rows) -> list:
    """The units of a rows table: ``(ParquetFile, row_group)`` per row group of the Parquet
    files of ``rows`` (an output directory holding ``rows/`` or ``rows.parquet``, a rows
    directory, or a file), or slices of an Arrow table. Missing columns: InputError."""
    if isinstance(rows, pa.Table):
        _check_columns(rows.schema.names, "the rows table")
        return [rows.slice(i, _TABLE_UNIT) for i in range(0, rows.num_rows, _TABLE_UNIT)]
    p = Path(rows)
    if p.is_dir() and (p / "rows").exists():
        p = p / "rows"
    elif p.is_dir() and (p / "rows.parquet").is_file():
        p = p / "rows.parquet"
    try:
        files = [pq.ParquetFile(f) for f in rows_files(p)]
    except FileNotFoundError:
        raise InputError("no rows table there", table="rows", file=p) from None
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"not a readable Parquet file: {exc}", table="rows", directory=p) from None
    for f, path in zip(files, rows_files(p)):
        _check_columns(f.schema_arrow.names, str(path))
    return [(f, g) for f in files for g in range(f.num_row_groups) if f.metadata.row_group(g).num_rows]


def _check_columns(names, where: str) -> None:
    missing = [c for c in _COLUMNS if c not in names]
    if missing:
        raise InputError(f"no column {missing[0]!r} ({where} is not a rows table, SPEC §4)",
                         table="rows", column=missing[0])


def _unit_rows(unit) -> int:
    return unit.num_rows if isinstance(unit, pa.Table) else unit[0].metadata.row_group(unit[1]).num_rows


def _windows(units: list, window: int) -> list[list]:
    """Consecutive units grouped until each group holds ``window`` rows; a last group of fewer
    than ``window // 2`` rows joins the one before (a small last window packs badly)."""
    out, cur, n = [], [], 0
    for u in units:
        cur.append(u)
        n += _unit_rows(u)
        if n >= window:
            out.append(cur)
            cur, n = [], 0
    if cur:
        if out and n < window // 2:
            out[-1].extend(cur)
        else:
            out.append(cur)
    return out


def _read(units: list, columns: list[str]) -> pa.Table:
    """A window's rows: the row groups of each file read in one call (Arrow decodes them on its
    threads), files in the order they first appear in ``units``, groups in ``units`` order."""
    if isinstance(units[0], pa.Table):
        tables = [u.select(columns) for u in units]
    else:
        groups: dict[int, tuple] = {}
        for f, g in units:
            groups.setdefault(id(f), (f, []))[1].append(g)
        tables = [f.read_row_groups(gs, columns=columns) for f, gs in groups.values()]
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


class PackedBatches:
    """What :func:`iter_packed` returns: iterate it for the batches (of every rank in ``ranks``,
    in step order); :meth:`with_ranks` yields ``(rank, batch)``; :attr:`stats` is the pass's
    :class:`PackStats`, current while iterating. Each iteration is a new pass over the rows,
    the same batches in the same order."""

    def __init__(self, rows, *, max_tokens: int, ranks: Iterable[int] = (0,), world_size: int = 1,
                 seed: int = 0, shuffle: bool = True, window: int = 4096, long_rows: str = "error",
                 pad_to_max: bool = False, pad_to_multiple: int = 1, pad_id: int = 0,
                 ids_dtype=np.int64, logprobs: bool = True):
        if not isinstance(max_tokens, (int, np.integer)) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer; got {max_tokens!r}")
        if not isinstance(world_size, (int, np.integer)) or world_size < 1:
            raise ValueError(f"world_size must be a positive integer; got {world_size!r}")
        self.ranks = tuple(int(r) for r in ranks)
        if not self.ranks or any(not 0 <= r < world_size for r in self.ranks):
            raise ValueError(f"rank must be in [0, world_size={world_size}); got {list(ranks)!r}")
        if long_rows not in ("error", "drop"):
            raise ValueError(f"long_rows must be 'error' or 'drop'; got {long_rows!r}")
        if window < 1 or pad_to_multiple < 1 or max_tokens % pad_to_multiple:
            raise ValueError("window and pad_to_multiple must be positive, and pad_to_multiple "
                             "must divide max_tokens")
        self.max_tokens, self.world_size, self.seed, self.shuffle = int(max_tokens), int(world_size), seed, shuffle
        self.window, self.long_rows, self.pad_to_max = window, long_rows, pad_to_max
        self.pad_to_multiple, self.pad_id, self.ids_dtype = pad_to_multiple, pad_id, ids_dtype
        self.units = rows_source(rows)
        names = (rows.schema.names if isinstance(rows, pa.Table)
                 else [n for u in self.units[:1] for n in u[0].schema_arrow.names])
        with_lp = logprobs and "logprobs" in names and (
            isinstance(rows, pa.Table) or all("logprobs" in u[0].schema_arrow.names for u in self.units))
        self.columns = list(_COLUMNS) + (["logprobs"] if with_lp else [])
        self.total_rows = sum(_unit_rows(u) for u in self.units)
        self.stats = PackStats(self.max_tokens)
        self.on_window = None  # called with each window's row count once it is packed (progress)

    def __iter__(self) -> Iterator[dict]:
        for _, batch in self.with_ranks():
            yield batch

    def with_ranks(self) -> Iterator[tuple[int, dict]]:
        """``(rank, batch)`` for every step of every rank asked for, window by window; within a
        window, step by step, the ranks in the order given. The next window is read on a helper
        thread while this one is packed (so about two windows are held at once)."""
        self.stats = PackStats(self.max_tokens)
        rng = np.random.default_rng(self.seed)
        units = list(self.units)
        if self.shuffle and units:
            units = [units[k] for k in rng.permutation(len(units))]
        windows = _windows(units, self.window)
        with ThreadPoolExecutor(1, thread_name_prefix="chainrows-pack") as pool:
            ahead = pool.submit(_read, windows[0], self.columns) if windows else None
            carry = None
            for i in range(len(windows)):
                table = ahead.result()
                ahead = pool.submit(_read, windows[i + 1], self.columns) if i + 1 < len(windows) else None
                fresh = table.num_rows
                if carry is not None and carry.num_rows:
                    table = pa.concat_tables([carry, table])
                carry = yield from self._window(table, rng, last=i + 1 == len(windows))
                if self.on_window is not None:
                    self.on_window(fresh)

    def _window(self, table: pa.Table, rng, last: bool):
        """Pack one window; yields ``(rank, batch)`` and returns the rows carried to the next
        window: unless ``last``, the window's bins beyond a multiple of the world size (the
        least loaded ones) are not emitted but repacked with the next window's rows, so that
        no window pays for rounding its bin count up to the world size."""
        lengths = pc.list_value_length(table.column("input_ids")).to_numpy(zero_copy_only=False)
        lengths = np.nan_to_num(lengths.astype(np.float64)).astype(np.int64)  # null lists: 0
        keep = np.flatnonzero(lengths <= self.max_tokens)
        if len(keep) < len(lengths):
            long = np.flatnonzero(lengths > self.max_tokens)
            if self.long_rows == "error":
                r = int(long[0])
                raise InputError(f"row {table.column('row_id')[r].as_py()!r} has {int(lengths[r]):,} tokens, "
                                 f"more than max_tokens={self.max_tokens:,} (rows are never split; "
                                 f"drop such rows with long_rows='drop' / --drop-long-rows)",
                                 table="rows", column="input_ids")
            self.stats.dropped_rows += len(long)
            self.stats.dropped_tokens += int(lengths[long].sum())
        if self.shuffle:
            keep = keep[rng.permutation(len(keep))]
        bins = [keep[b] for b in plan_bins(lengths[keep], self.max_tokens, self.world_size if last else 1)]
        carried = np.zeros(0, np.int64)
        extra = len(bins) % self.world_size
        if extra:
            by_load = np.argsort([int(lengths[b].sum()) for b in bins], kind="stable")
            spare = set(by_load[:extra].tolist())
            carried = np.sort(np.concatenate([bins[i] for i in sorted(spare)]))
            bins = [b for i, b in enumerate(bins) if i not in spare]
        dealt = deal_bins(np.array([lengths[b].sum() for b in bins], dtype=np.int64), self.world_size)
        steps = len(bins) // self.world_size
        step_order = rng.permutation(steps) if self.shuffle else np.arange(steps)
        for rank in self.ranks:
            mine = [bins[dealt[rank][s]] for s in step_order.tolist()]
            batches = self._collate(table, mine, lengths)
            for batch in batches:
                self._count(rank, batch)
            yield from ((rank, b) for b in batches)
        return table.take(pa.array(carried, type=pa.int64())) if len(carried) else None

    def _count(self, rank: int, batch: dict) -> None:
        s = self.stats
        s.rows += len(batch["row_ids"])
        s.tokens += batch["num_tokens"]
        s.bins += 1
        s.tokens_per_rank[rank] = s.tokens_per_rank.get(rank, 0) + batch["num_tokens"]
        s.bins_per_rank[rank] = s.bins_per_rank.get(rank, 0) + 1

    def _collate(self, table: pa.Table, bins: list[np.ndarray], lengths: np.ndarray) -> list[dict]:
        """One batch per bin, from one ``take`` of this rank's rows (bin after bin)."""
        order = np.concatenate(bins) if bins else np.zeros(0, np.int64)
        sub = table.take(pa.array(order, type=pa.int64()))
        lens = lengths[order]
        flat = {"input_ids": _values(sub, "input_ids", self.ids_dtype),
                "loss_mask": _values(sub, "loss_mask", np.float32)}
        if "logprobs" in self.columns:
            flat["old_logprobs"] = _values(sub, "logprobs", np.float32)
            if len(flat["old_logprobs"]) != len(flat["input_ids"]):
                raise InputError("logprobs and input_ids lengths differ", table="rows", column="logprobs")
        if len(flat["loss_mask"]) != len(flat["input_ids"]):
            raise InputError("loss_mask and input_ids lengths differ", table="rows", column="loss_mask")
        starts = np.cumsum(lens) - lens
        n_tok = int(lens.sum())
        flat["position_ids"] = np.arange(n_tok, dtype=np.int64) - np.repeat(starts, lens)
        adv = np.nan_to_num(sub.column("advantage").to_numpy(zero_copy_only=False).astype(np.float32))
        flat["advantages"] = np.repeat(adv, lens) * flat["loss_mask"]
        weight = np.nan_to_num(sub.column("weight").to_numpy(zero_copy_only=False).astype(np.float32))
        flat["weights"] = np.repeat(weight, lens)
        row_ids = sub.column("row_id").to_pylist()
        rollout_ids = sub.column("rollout_id").to_pylist()
        out, row0, tok0 = [], 0, 0
        for b in bins:
            blens = lens[row0:row0 + len(b)]
            n = int(blens.sum())
            out.append(self._batch(flat, tok0, n, blens, row_ids[row0:row0 + len(b)],
                                   rollout_ids[row0:row0 + len(b)]))
            row0, tok0 = row0 + len(b), tok0 + n
        return out

    def _batch(self, flat: dict, start: int, n: int, blens: np.ndarray, row_ids: list,
               rollout_ids: list) -> dict:
        width = self.max_tokens if self.pad_to_max else -(-n // self.pad_to_multiple) * self.pad_to_multiple
        fills = {"input_ids": self.pad_id}
        out = {}
        for name, values in flat.items():
            part = values[start:start + n]
            if width > n:
                padded = np.full(width, fills.get(name, 0), dtype=values.dtype)
                padded[:n] = part
                part = padded
            out[name] = part
        cu = np.zeros(len(blens) + 1, dtype=np.int32)
        np.cumsum(blens, out=cu[1:])
        out["cu_seqlens"] = cu
        out["max_seqlen"] = int(blens.max()) if len(blens) else 0
        out["num_tokens"] = n
        out["row_ids"] = row_ids
        out["rollout_ids"] = rollout_ids
        return out


def _values(table: pa.Table, name: str, dtype) -> np.ndarray:
    """The flat values of a list column as a writable numpy array of ``dtype`` (one copy)."""
    col = table.column(name)
    col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    values = pc.list_flatten(col).to_numpy(zero_copy_only=False)
    return values.astype(dtype, copy=True)


def iter_packed(rows: str | os.PathLike | pa.Table, *, max_tokens: int, seed: int = 0,
                shuffle: bool = True, rank: int = 0, world_size: int = 1, window: int = 4096,
                long_rows: str = "error", pad_to_max: bool = False, pad_to_multiple: int = 1,
                pad_id: int = 0, ids_dtype=np.int64, logprobs: bool = True) -> PackedBatches:
    """Packed batches of ``rank``'s share of the rows (SPEC §4 ``rows``): an output directory,
    a rows directory or file, or an Arrow table.

    Each batch is a dict: 1-D arrays of one length T ≤ ``max_tokens`` (the rows back to back,
    then padding): ``input_ids`` (``ids_dtype``, ``pad_id`` on padding), ``position_ids``
    (int64, 0 at each row's first token, 0 on padding), ``loss_mask`` (float32),
    ``old_logprobs`` (float32; only when the rows have logprobs and ``logprobs``),
    ``advantages`` (float32, the row's advantage × loss_mask; a null advantage is 0),
    ``weights`` (float32, the row's weight on each of its tokens); ``cu_seqlens`` (int32, rows +
    1 entries, 0 first, the real token count last); ``max_seqlen`` (int); ``num_tokens`` (int,
    real tokens); ``row_ids`` and ``rollout_ids`` (lists). Arrays are C-contiguous, writable,
    native: ``torch.from_numpy`` takes each without a copy.

    T is the real token count rounded up to ``pad_to_multiple`` (which must divide
    ``max_tokens``), or ``max_tokens`` with ``pad_to_max``. A row is never split or truncated:
    one longer than ``max_tokens`` raises InputError, or with ``long_rows="drop"`` is skipped
    and counted in ``.stats.dropped_rows``.

    Data parallel: every rank of ``world_size`` gets disjoint bins, the same number of bins
    (steps) per window and so per pass, with token totals within one bin of each other; over
    the ranks every row appears exactly once. A window's bins beyond a multiple of
    ``world_size`` (its least loaded) are repacked with the next window's rows. A rank receives
    a batch without rows only when the last window holds fewer rows than ``world_size``. ``seed`` (pass the epoch) draws the row
    group order, the tie order of equal-length rows and the step order; the same arguments
    give the same batches on any machine. ``shuffle=False``: file order, steps in packing
    order. ``window``: rows packed together (more rows, fuller bins and more memory; about two
    windows are held at once).
    """
    return PackedBatches(rows, max_tokens=max_tokens, ranks=(rank,), world_size=world_size,
                         seed=seed, shuffle=shuffle, window=window, long_rows=long_rows,
                         pad_to_max=pad_to_max, pad_to_multiple=pad_to_multiple, pad_id=pad_id,
                         ids_dtype=ids_dtype, logprobs=logprobs)


def batches_table(batches: list[dict], steps: Iterable[int], *, logprobs: bool) -> pa.Table:
    """Packed batches as an Arrow table, one row per batch (what ``chainrows pack`` writes):
    ``step`` (int32, the batch's step on its rank), ``input_ids`` and ``position_ids``
    (list<int32>), ``loss_mask`` (list<uint8>), ``old_logprobs`` (list<float32>, with
    ``logprobs``), ``advantages``, ``weights`` (list<float32>), ``cu_seqlens``
    (list<int32>), ``max_seqlen``, ``num_tokens`` (int32), ``row_ids`` (list<string>)."""
    def lists(name, dtype, pa_type):
        parts = [np.asarray(b[name]).astype(dtype, copy=False) for b in batches]
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in parts], out=offsets[1:])
        values = np.concatenate(parts) if parts else np.zeros(0, dtype)
        return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa_type)).cast(
            pa.list_(pa_type))

    columns = {"step": pa.array(list(steps), type=pa.int32()),
               "input_ids": lists("input_ids", np.int32, pa.int32()),
               "position_ids": lists("position_ids", np.int32, pa.int32()),
               "loss_mask": lists("loss_mask", np.uint8, pa.uint8())}
    if logprobs:
        columns["old_logprobs"] = lists("old_logprobs", np.float32, pa.float32())
    columns["advantages"] = lists("advantages", np.float32, pa.float32())
    columns["weights"] = lists("weights", np.float32, pa.float32())
    columns["cu_seqlens"] = lists("cu_seqlens", np.int32, pa.int32())
    columns["max_seqlen"] = pa.array([b["max_seqlen"] for b in batches], type=pa.int32())
    columns["num_tokens"] = pa.array([b["num_tokens"] for b in batches], type=pa.int32())
    columns["row_ids"] = pa.array([b["row_ids"] for b in batches], type=pa.list_(pa.string()))
    return pa.table(columns)
