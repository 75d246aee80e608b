"""Reassemble a dataset directory into ``OUT/rows.parquet`` and ``OUT/report.parquet`` under a
memory budget.

Small datasets (estimated peak within the budget) are read, decided and written in one go.
Larger ones are hash-partitioned by group into K spill buckets (chainrows.io.partition), each
bucket is reassembled alone, and the sorted bucket outputs are merged by rollout_id. Both paths
write through RowGroupWriter, so the output bytes do not depend on the budget or batch size.
Everything is staged in a temp directory inside OUT and moved into place at the end.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from chainrows.api import run_tables
from chainrows.io.dataset import read_dataset, table_files, table_schema
from chainrows.io.errors import InputError
from chainrows.io.partition import bucket_dir, partition
from chainrows.io.rowgroups import RowGroupWriter
from chainrows.io.schema import REPORT_SCHEMA, rows_schema
from chainrows.io.write import AtomicOutput
from chainrows.progress import Progress, human_bytes

DEFAULT_BUDGET = 4 << 30  # a laptop's worth
# Peak RSS of one in-memory reassembly over its uncompressed input, measured on synth data:
# ~11x for a 41 MB bucket (input tables + combined token/logprob buffers + Batch + gathered
# rows + Arrow output tables + writer buffers). Spill buckets are sized with it.
PEAK_FACTOR = 12.0
BASE_RSS = 320 << 20  # interpreter + numba + pyarrow + compiled kernels and thread pools: ~250 MB measured, up to ~300 MB in CI
READER_BYTES = 6 << 20  # Arrow keeps ~4-5 MB of buffers per open Parquet reader (measured)


@dataclass
class Summary:
    rollouts: int = 0
    ok: int = 0
    reasons: Counter = field(default_factory=Counter)
    rows: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    calls: int = 0
    unselected_calls: int = 0
    orphan_token_rows: int = 0
    input_bytes: int = 0
    buckets: int = 1
    seconds: float = 0.0

    def add(self, rows: pa.Table, report: pa.Table, orphans: int) -> None:
        status = report["status"].to_numpy(zero_copy_only=False)
        ok = status == "ok"
        self.rollouts += report.num_rows
        self.ok += int(ok.sum())
        reasons = report["reason"].filter(pa.array(~ok)).value_counts()
        for item in reasons.to_pylist():
            self.reasons[item["values"]] += item["counts"]
        self.rows += int(np.asarray(report["num_rows"]).sum())
        self.tokens += int(pc.sum(pc.list_value_length(rows["input_ids"]).filter(
            pc.greater(rows["weight"], 0))).as_py() or 0) if rows.num_rows else 0
        self.loss_tokens += int(np.asarray(report["loss_tokens"]).sum())
        calls = np.asarray(report["num_calls"])
        self.calls += int(calls.sum())
        self.unselected_calls += int((calls - np.asarray(report["num_selected"]))[ok].sum())
        self.orphan_token_rows += orphans

    def merge(self, other: "Summary") -> None:
        """Add another bucket's counts (input_bytes, buckets and seconds are the run's own)."""
        for name in ("rollouts", "ok", "rows", "tokens", "loss_tokens", "calls",
                     "unselected_calls", "orphan_token_rows"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.reasons.update(other.reasons)

    def to_json(self) -> dict:
        d = {k: v for k, v in vars(self).items() if k != "reasons"}
        d["reasons"] = dict(self.reasons)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Summary":
        d = dict(d)
        reasons = Counter(d.pop("reasons", {}))
        return cls(reasons=reasons, **d)

    def format(self) -> str:
        masked = self.rollouts - self.ok
        rate = self.tokens / self.seconds if self.seconds > 0 else 0.0
        lines = [
            ("rollouts", f"{self.rollouts:,}"),
            ("  ok", f"{self.ok:,}"),
            ("  masked", f"{masked:,}"),
        ]
        for reason, n in sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append((f"    {reason}", f"{n:,}"))
        lines += [
            ("rows", f"{self.rows:,}"),
            ("tokens", f"{self.tokens:,}"),
            ("loss tokens", f"{self.loss_tokens:,}"),
            ("calls", f"{self.calls:,}"),
            ("  unselected (ok rollouts)", f"{self.unselected_calls:,}"),
            ("orphan token rows", f"{self.orphan_token_rows:,}"),
            ("input (uncompressed)", human_bytes(self.input_bytes)),
            ("buckets", f"{self.buckets:,}"),
            ("time", f"{self.seconds:.2f} s"),
            ("throughput", f"{self.rollouts / max(self.seconds, 1e-9):,.0f} rollouts/s, "
                           f"{rate / 1e6:,.1f} M tokens/s"),
        ]
        width = max(len(k) for k, _ in lines)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in lines)


def _footer(name: str, file) -> pq.FileMetaData:
    """A Parquet footer; an unreadable file is unusable input."""
    try:
        return pq.ParquetFile(file).metadata
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(f"unreadable Parquet file: {' '.join(str(exc).split())}", table=name,
                         file=file) from exc


def _uncompressed(md: pq.FileMetaData) -> int:
    return sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))


def input_bytes(dataset_dir) -> dict[str, int]:
    """Uncompressed bytes of each table, from Parquet footers (no data read).

    Every file's schema is checked first, so unusable input fails before any work.
    """
    for name in ("ledger", "tokens", "rollouts"):
        table_schema(dataset_dir, name)
    return {name: sum(_uncompressed(_footer(name, f)) for f in table_files(dataset_dir, name))
            for name in ("ledger", "tokens", "rollouts")}


def plan_buckets(total_bytes: int, budget: int) -> int:
    """Number of spill buckets so that one bucket's estimated peak fits the budget."""
    usable = max(budget - BASE_RSS, budget // 4)
    return max(1, math.ceil(total_bytes * PEAK_FACTOR / usable))


WORK_DIR = ".chainrows-work"  # spill buckets and finished bucket outputs, kept for --resume


def run(dataset_dir, out_dir, *, mode="cc", placeholders=False, baseline="mean", no_std=False,
        baseline_population="all", row_weight="rollout", memory_budget=DEFAULT_BUDGET,
        buckets: int | None = None, resume: bool = False, progress: bool | None = None) -> Summary:
    """Reassemble ``dataset_dir`` into ``out_dir``; returns the run's summary.

    ``resume``: reuse the partitions and finished buckets a killed run left in
    ``out_dir/.chainrows-work`` when the dataset and options are unchanged.
    """
    t0 = time.perf_counter()
    opts = dict(mode=mode, placeholders=placeholders, baseline=baseline, no_std=no_std,
                baseline_population=baseline_population, row_weight=row_weight)
    sizes = input_bytes(dataset_dir)
    total = sum(sizes.values())
    k = buckets or plan_buckets(total, memory_budget)
    has_lp = "logprobs" in table_schema(dataset_dir, "tokens").names
    summary = Summary(input_bytes=total, buckets=k)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = out / WORK_DIR
    with AtomicOutput(out) as staged:
        rows_w, report_w = _final_writers(staged, has_lp)
        try:
            if k == 1:
                bar = Progress("reassemble", 1, enabled=progress, unit="steps")
                ds = read_dataset(dataset_dir)
                result, orphans = run_tables(ds.ledger, ds.tokens, ds.rollouts, **opts)
                del ds
                summary.add(result.rows, result.report, orphans)
                rows_w.write(result.rows)
                report_w.write(result.report)
                bar.advance(1)
                bar.close()
            else:
                manifest = _manifest(dataset_dir, opts, k, memory_budget)
                _prepare_work(work, manifest, resume)
                _run_partitioned(dataset_dir, work, k, opts, memory_budget, total, summary,
                                 rows_w, report_w, has_lp, progress)
        finally:
            rows_w.close()
            report_w.close()
    shutil.rmtree(work, ignore_errors=True)  # only after the outputs are committed
    summary.seconds = time.perf_counter() - t0
    return summary


def _final_writers(staged: AtomicOutput, has_lp: bool):
    rows_w = RowGroupWriter(staged.reserve_file("rows"), rows_schema(has_lp), unit_column="input_ids")
    report_w = RowGroupWriter(staged.reserve_file("report"), REPORT_SCHEMA)
    return rows_w, report_w


def _manifest(dataset_dir, opts, k, budget) -> dict:
    files = {}
    for name in ("ledger", "tokens", "rollouts"):
        for f in table_files(dataset_dir, name):
            st = f.stat()
            files[str(f.resolve())] = [st.st_size, st.st_mtime_ns]
    return {"version": 1, "files": files, "options": opts, "buckets": k, "budget": budget}


def _prepare_work(work: Path, manifest: dict, resume: bool) -> None:
    """Keep ``work`` when resuming the same job; otherwise start it afresh."""
    path = work / "manifest.json"
    if resume and path.exists():
        try:
            if json.loads(path.read_text()) == manifest:
                return
        except (OSError, ValueError):
            pass
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    _write_atomic(path, json.dumps(manifest, sort_keys=True))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _run_partitioned(dataset_dir, work: Path, k, opts, budget, total, summary, rows_w, report_w,
                     has_lp, progress):
    spill = work / "spill"
    if not (work / "partitioned").exists():
        shutil.rmtree(spill, ignore_errors=True)
        bar = Progress("partition", total, enabled=progress)
        partition(dataset_dir, spill, k, _batch_rows(dataset_dir, budget), bar,
                  buffer_bytes=max(8 << 20, (budget - BASE_RSS) // 8))
        bar.close()
        (work / "partitioned").touch()
    bar = Progress("reassemble", k, enabled=progress, unit="buckets")
    outs = []
    for b in range(k):
        d = bucket_dir(spill, b)
        rows_f, report_f, done = d / "out-rows.parquet", d / "out-report.parquet", d / "done.json"
        if not done.exists():
            ds = read_dataset(d)
            result, orphans = run_tables(ds.ledger, ds.tokens, ds.rollouts, **opts)
            del ds
            part = Summary()
            part.add(result.rows, result.report, orphans)
            _write_spill(result.rows.cast(rows_schema(has_lp)), rows_f, _spill_group_rows(result.rows, budget, k))
            _write_spill(result.report, report_f, 65536)
            del result
            _write_atomic(done, json.dumps(part.to_json()))
            for name in ("ledger", "tokens", "rollouts"):
                shutil.rmtree(d / name, ignore_errors=True)
            pa.default_memory_pool().release_unused()
        summary.merge(Summary.from_json(json.loads(done.read_text())))
        outs.append((rows_f, report_f))
        bar.advance(1)
    bar.close()
    fan_in = max(2, min((budget - BASE_RSS) // (4 * READER_BYTES), _open_file_limit() // 4))
    row_bytes = max(_avg_row_bytes(outs), 1)
    merge_rows = int(max(16, (budget - BASE_RSS) // (16 * min(k, fan_in) * row_bytes)))
    _merge_tree([o[0] for o in outs], rows_w, merge_rows, fan_in, spill / "merge-rows")
    _merge_tree([o[1] for o in outs], report_w, 65536, fan_in, spill / "merge-report")


def _open_file_limit() -> int:
    """The soft limit on open files (each merged run holds one open)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return soft if soft != resource.RLIM_INFINITY else 1 << 16
    except (ImportError, OSError, ValueError):
        return 256


def _write_spill(table: pa.Table, path: Path, group_rows: int) -> None:
    """A bucket's sorted output, in small row groups: the merge holds one group per bucket."""
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression="lz4", use_dictionary=False, row_group_size=group_rows)
    os.replace(tmp, path)


def _spill_group_rows(rows: pa.Table, budget: int, k: int) -> int:
    per_row = max(rows.nbytes // max(rows.num_rows, 1), 1)
    return int(max(16, budget // (8 * k * per_row)))


def _avg_row_bytes(outs) -> int:
    footers = [pq.ParquetFile(r).metadata for r, _ in outs]
    return sum(_uncompressed(md) for md in footers) // max(sum(md.num_rows for md in footers), 1)


def _batch_rows(dataset_dir, budget) -> int:
    """Rows per input batch while partitioning: about budget / 64 bytes of tokens per batch."""
    footers = [_footer("tokens", f) for f in table_files(dataset_dir, "tokens")]
    rows = sum(md.num_rows for md in footers)
    size = sum(_uncompressed(md) for md in footers)
    per_row = max(size / max(rows, 1), 1.0)
    return int(max(64, min(1 << 20, (budget / 64) / per_row)))


class _SpillWriter:
    """Writer for intermediate merge runs: small row groups, fast compression."""

    def __init__(self, path: Path, schema: pa.Schema, group_rows: int):
        self._w = pq.ParquetWriter(path, schema, compression="lz4", use_dictionary=False)
        self.group_rows = group_rows

    def write(self, table: pa.Table) -> None:
        self._w.write_table(table, row_group_size=self.group_rows)

    def close(self) -> None:
        self._w.close()


def _merge_tree(files, writer, batch_rows: int, fan_in: int, scratch: Path) -> None:
    """Merge sorted files into ``writer``, at most ``fan_in`` open at once (extra rounds if needed)."""
    level = 0
    while len(files) > fan_in:
        scratch.mkdir(parents=True, exist_ok=True)
        merged = []
        for i in range(0, len(files), fan_in):
            group = files[i:i + fan_in]
            path = scratch / f"run-{level}-{i // fan_in:05d}.parquet"
            w = _SpillWriter(path, pq.read_schema(group[0]), batch_rows)
            try:
                _merge_sorted(group, w, batch_rows)
            finally:
                w.close()
            if level:  # intermediate runs only: bucket outputs stay for --resume
                for f in group:
                    Path(f).unlink(missing_ok=True)
            merged.append(path)
        files, level = merged, level + 1
    _merge_sorted(files, writer, batch_rows)


def _merge_sorted(files, writer, batch_rows: int) -> None:
    """k-way merge of files sorted by rollout_id (ids disjoint across files), batch at a time."""
    # one buffered stream per column per file: keep each small, k files are open at once
    iters = [pq.ParquetFile(f, pre_buffer=False, buffer_size=64 << 10).iter_batches(batch_size=batch_rows, use_threads=False)
             for f in files]
    bufs: list[pa.Table | None] = [None] * len(iters)

    def refill(i):
        while bufs[i] is None or bufs[i].num_rows == 0:
            nxt = next(iters[i], None)
            if nxt is None:
                bufs[i] = None
                return
            bufs[i] = pa.Table.from_batches([nxt])

    for i in range(len(iters)):
        refill(i)
    while any(b is not None for b in bufs):
        live = [i for i, b in enumerate(bufs) if b is not None]
        bound = min(bufs[i]["rollout_id"][-1].as_py() for i in live)
        pieces = []
        for i in live:
            n = int(pc.sum(pc.less_equal(bufs[i]["rollout_id"], bound)).as_py() or 0)
            if n:
                pieces.append(bufs[i].slice(0, n))
                bufs[i] = bufs[i].slice(n)
            refill(i)
        merged = pa.concat_tables(pieces)
        keys = [("rollout_id", "ascending")] + ([("segment", "ascending")] if "segment" in merged.column_names else [])
        writer.write(merged.take(pc.sort_indices(merged, sort_keys=keys)))
        del merged, pieces
        pa.default_memory_pool().release_unused()
