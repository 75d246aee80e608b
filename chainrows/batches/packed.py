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
import pyarrow.dataset as ds
import pyarrow.fs as pafs
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
    """The units of a rows table, in file order: ``(path, row_group, num_rows)`` per non-empty
    row group of the Parquet files of ``rows`` (an output directory holding ``rows/`` or
    ``rows.parquet``, a rows directory, or a file), or slices of an Arrow table. Unreadable
    files and missing columns: InputError."""
    if isinstance(rows, pa.Table):
        _check_columns(rows.schema.names, "the rows table")
        return [rows.slice(i, _TABLE_UNIT) for i in range(0, rows.num_rows, _TABLE_UNIT)]
    p = Path(rows)
    if p.is_dir() and (p / "rows").exists():
        p = p / "rows"
    elif p.is_dir() and (p / "rows.parquet").is_file():
        p = p / "rows.parquet"
    try:
        paths = rows_files(p)
    except FileNotFoundError:
        raise InputError("no rows table there", table="rows", file=p) from None
    units = []
    for path in paths:
        try:
            meta = pq.read_metadata(path)
            names = pq.read_schema(path).names
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"not a readable Parquet file: {exc}", table="rows", file=path) from None
        _check_columns(names, str(path))
        units += [(str(path), g, meta.row_group(g).num_rows) for g in range(meta.num_row_groups)
                  if meta.row_group(g).num_rows]
    return units


def _check_columns(names, where: str) -> None:
    missing = [c for c in _COLUMNS if c not in names]
    if missing:
        raise InputError(f"no column {missing[0]!r}: {where} is not the rows of a reassemble output "
                         "(a dataset? run `chainrows reassemble DATA OUT` and pack OUT)",
                         table="rows", column=missing[0])


def _unit_rows(unit) -> int:
    return unit.num_rows if isinstance(unit, pa.Table) else unit[2]


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
    """A window's rows, in ``units`` order: its row groups read as one Arrow dataset (decoded on
    Arrow's threads, reads pre-buffered, as ``pyarrow.parquet.read_table`` does)."""
    if isinstance(units[0], pa.Table):
        tables = [u.select(columns) for u in units]
        return pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    fs = pafs.LocalFileSystem()
    fmt = ds.ParquetFileFormat(default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=True))
    frags = [fmt.make_fragment(path, filesystem=fs, row_groups=[g]) for path, g, _ in units]
    try:
        schema = pq.read_schema(units[0][0])
        return ds.FileSystemDataset(frags, schema, fmt, filesystem=fs).to_table(columns=columns, use_threads=True)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"cannot read its row groups: {exc}", table="rows",
                         file=units[0][0] if len(frags) == 1 else None) from None


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
        if isinstance(rows, pa.Table):
            with_lp = logprobs and "logprobs" in rows.schema.names
        else:
            paths = sorted({u[0] for u in self.units})
            with_lp = logprobs and bool(paths) and all("logprobs" in pq.read_schema(p).names for p in paths)
        self.columns = list(_COLUMNS) + (["logprobs"] if with_lp else [])
        self.total_rows = sum(_unit_rows(u) for u in self.units)
        self.stats = PackStats(self.max_tokens)
        self.on_window = None  # called with each window's row count once it is packed (progress)

    def __iter__(self) -> Iterator[dict]:
        for _, batch in self.with_ranks():
            yield batch

    def with_ranks(self) -> Iterator[tuple[int, dict]]:
        """``(rank, batch)`` for every step of every rank asked for, window by window; within a
        window, rank by rank in the order given, each rank's batches in step order. The next
        window is read on a helper thread while this one is packed (so about two windows are
        held at once)."""
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
                r = int(long[np.argmax(lengths[long])])
                raise InputError(f"{len(long):,} of this window's {len(lengths):,} rows are longer than "
                                 f"max_tokens={self.max_tokens:,}, the longest {table.column('row_id')[r].as_py()!r} "
                                 f"with {int(lengths[r]):,} tokens (rows are never split; raise max_tokens, or "
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
        cols = _Window(table, lengths, self.columns)
        for rank in self.ranks:
            for step in step_order.tolist():
                rows = bins[dealt[rank][step]]
                n = int(lengths[rows].sum())
                width = self.max_tokens if self.pad_to_max else -(-n // self.pad_to_multiple) * self.pad_to_multiple
                batch = cols.batch(rows, width, self.pad_id, self.ids_dtype)
                self._count(rank, batch)
                yield rank, batch
        return table.take(pa.array(carried, type=pa.int64())) if len(carried) else None

    def _count(self, rank: int, batch: dict) -> None:
        s = self.stats
        s.rows += len(batch["row_ids"])
        s.tokens += batch["num_tokens"]
        s.bins += 1
        s.tokens_per_rank[rank] = s.tokens_per_rank.get(rank, 0) + batch["num_tokens"]
        s.bins_per_rank[rank] = s.bins_per_rank.get(rank, 0) + 1


class _Window:
    """A window's columns as numpy, each row addressed by (chunk, start) in every list column,
    so that a bin is filled by one slice copy per row and column (memcpy speed; no per-token
    index arrays, no Arrow ``take``)."""

    def __init__(self, table: pa.Table, lengths: np.ndarray, columns: list[str]):
        self.lengths = lengths.tolist()
        self.lists = {}
        for name in ("input_ids", "loss_mask", "logprobs"):
            if name not in columns:
                continue
            values, chunk, start, lens = [], [], [], []
            for k, ch in enumerate(table.column(name).chunks):
                offsets = ch.offsets.to_numpy()
                values.append(ch.values.to_numpy(zero_copy_only=False))
                chunk.append(np.full(len(ch), k, dtype=np.int64))
                start.append(offsets[:-1].astype(np.int64))
                lens.append(np.diff(offsets))
            lens = np.concatenate(lens) if lens else np.zeros(0, np.int64)
            bad = np.flatnonzero(lens != lengths)
            if len(bad):
                rid = table.column("row_id")[int(bad[0])].as_py()
                raise InputError(f"row {rid!r}: {name} has {int(lens[bad[0]])} values, input_ids "
                                 f"{int(lengths[bad[0]])}", table="rows", column=name)
            self.lists[name] = (values, np.concatenate(chunk).tolist(), np.concatenate(start).tolist())
        self.advantage = np.nan_to_num(table.column("advantage").to_numpy(zero_copy_only=False)
                                       .astype(np.float32)).tolist()
        self.weight = np.nan_to_num(table.column("weight").to_numpy(zero_copy_only=False)
                                    .astype(np.float32)).tolist()
        self.row_ids = table.column("row_id")
        self.rollout_ids = table.column("rollout_id")
        self.steps = np.arange(max(lengths.max(initial=0), 1), dtype=np.int64)

    def batch(self, rows: np.ndarray, width: int, pad_id: int, ids_dtype) -> dict:
        """The batch of ``rows`` (window positions, in order), padded to ``width``."""
        out = {"input_ids": np.full(width, pad_id, dtype=ids_dtype),
               "position_ids": np.zeros(width, dtype=np.int64),
               "loss_mask": np.zeros(width, dtype=np.float32)}
        if "logprobs" in self.lists:
            out["old_logprobs"] = np.zeros(width, dtype=np.float32)
        out["advantages"] = np.zeros(width, dtype=np.float32)
        out["weights"] = np.zeros(width, dtype=np.float32)
        copies = [(out[dst], *self.lists[src]) for dst, src in (("input_ids", "input_ids"), ("loss_mask", "loss_mask"),
                                                               ("old_logprobs", "logprobs")) if src in self.lists]
        pos, mask, adv, weights, steps = (out["position_ids"], out["loss_mask"], out["advantages"],
                                          out["weights"], self.steps)
        rows = rows.tolist()
        cu = np.zeros(len(rows) + 1, dtype=np.int32)
        s = 0
        for i, r in enumerate(rows):
            n = self.lengths[r]
            e = s + n
            for dst, values, chunk, start in copies:
                a = start[r]
                dst[s:e] = values[chunk[r]][a:a + n]
            pos[s:e] = steps[:n]
            np.multiply(mask[s:e], self.advantage[r], out=adv[s:e])
            weights[s:e] = self.weight[r]
            cu[i + 1] = e
            s = e
        take = pa.array(rows, type=pa.int64())
        out.update(cu_seqlens=cu, max_seqlen=max((self.lengths[r] for r in rows), default=0), num_tokens=s,
                   row_ids=self.row_ids.take(take).to_pylist(), rollout_ids=self.rollout_ids.take(take).to_pylist())
        return out


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
    (steps) per window and so per pass, each window's token totals within one bin of each
    other; over the ranks every row appears exactly once. A window's bins beyond a multiple of
    ``world_size`` (its least loaded) are repacked with the next window's rows. A rank receives
    a batch without rows only when the last window holds fewer rows than ``world_size``.
    ``seed`` (pass the epoch) draws the row group order, the tie order of equal-length rows
    and the step order; the same arguments give the same batches on any machine. ``shuffle=False``: file order, steps in packing
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
    (list<int32>), ``max_seqlen``, ``num_tokens`` (int32), ``row_ids`` and ``rollout_ids``
    (list<string>, one per packed row)."""
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
    columns["rollout_ids"] = pa.array([b["rollout_ids"] for b in batches], type=pa.list_(pa.string()))
    return pa.table(columns)
