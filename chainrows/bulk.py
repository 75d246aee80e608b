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
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from chainrows.api import Result, run_tables
from chainrows.io.dataset import read_dataset, table_files, table_schema
from chainrows.io.errors import InputError
from chainrows.io.partition import bucket_dir, partition, read_bucket, release_memory, string_hashes
from chainrows.io.rowgroups import RowGroupWriter
from chainrows.io.schema import REPORT_SCHEMA, rows_schema
from chainrows.io.write import AtomicOutput
from chainrows.options import Options
from chainrows.progress import Progress, human_bytes

DEFAULT_BUDGET = 4 << 30  # a laptop's worth
# What the budget covers: the peak resident set of the whole process (VmHWM), interpreter,
# libraries and loaded kernels included. docs/limits.md "Memory budget" has the measurements.
#
# In-memory run (Arrow's default pool, mimalloc): peak RSS over the uncompressed input, measured
# 6.5-8.2x on 17-207 MiB synth inputs; it decides, with BASE_RSS, whether a dataset fits at all.
PEAK_FACTOR = 12.0
BASE_RSS = 320 << 20  # process baseline where it cannot be measured (no /proc): ~220 MiB measured
# Partitioned run: one bucket's peak above the measured baseline per uncompressed input byte,
# allocator memory retained from earlier buckets included: measured 6.2x (31 MiB buckets).
SPILL_PEAK_FACTOR = 6.0
# A bucket's estimated peak may take this share of the headroom (budget - baseline); the rest
# is margin for what the factor does not capture (another machine's allocator behaviour, a
# bucket bigger than the average).
BUCKET_SHARE = 0.6
READER_BYTES = 8 << 20  # one open Parquet reader (bucket reports) in the merge, its batch included (~7 MiB measured)
# The merge buffers up to two batches per open run: together at most 1/MERGE_SHARE of the
# headroom (its sort and the output row group hold a few times that). A merge step emits the
# rows every open run has passed, so batches of one row would make a step per row, each over
# all runs: 116 runs of 1-row batches took 310 s to merge; batches of RUN_ROWS rows keep the
# steps few, and a run that cannot buffer them is merged in an extra level instead.
MERGE_SHARE = 16
RUN_ROWS = 8


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

    def add(self, result: Result) -> None:
        """Count one reassembled batch."""
        rows, report = result
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
        self.orphan_token_rows += result.orphan_token_rows

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
    """1 when an in-memory run's estimated peak fits the budget, else at least 2 (a first cut,
    made before anything is loaded; a partitioned run re-plans with :func:`spill_buckets`)."""
    usable = max(budget - BASE_RSS, budget // 4)
    return max(1, math.ceil(total_bytes * PEAK_FACTOR / usable))


def headroom(budget: int, base: int) -> int:
    """Memory the partitioned phases may use above the process baseline. A budget below the
    baseline cannot be met; the phases then get a quarter of it and the peak exceeds it."""
    return max(budget - base, budget // 4)


def spill_buckets(total_bytes: int, budget: int, base: int) -> int:
    """Spill buckets so that one bucket's estimated peak (SPILL_PEAK_FACTOR x its input) stays
    within BUCKET_SHARE of the headroom above the measured ``base``."""
    per_bucket = BUCKET_SHARE * headroom(budget, base) / SPILL_PEAK_FACTOR
    return max(2, math.ceil(total_bytes / per_bucket))


def process_rss() -> int | None:
    """This process's resident set now (VmRSS), or None where /proc is unavailable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def measure_baseline(options: Options, has_lp: bool) -> int:
    """The process baseline the partitioned phases add to: RSS once every kernel is loaded.

    Numba loads cached kernels on first call, so a tiny synthetic reassembly (with the run's
    options) and a string hash run first; then VmRSS is read. ``BASE_RSS`` where it cannot be.
    """
    from chainrows import api
    from chainrows.synth import synth_tables

    ledger, tokens, rollouts = synth_tables(8, seed=0, logprobs=has_lp)
    api.run_tables(ledger, tokens, rollouts, options)  # not this module's name: tests count those calls
    string_hashes(rollouts["rollout_id"])
    del ledger, tokens, rollouts
    release_memory()
    rss = process_rss()
    return rss if rss is not None else BASE_RSS


@contextmanager
def one_arrow_thread():
    """Arrow's CPU thread pool at one thread for a partitioned run, restored afterwards.

    Arrow's default allocator (mimalloc) keeps memory freed by a thread resident in that
    thread's heap, so what a run retains grows with the threads decoding and sorting for it,
    i.e. with the machine's core count. One thread bounds it whatever the machine: measured on
    the 2.2 GB test dataset at a 512 MiB budget (2 cores), peak 419 -> 390 MiB, RSS left after
    partitioning 238 -> 217 MiB. The kernels keep their own (Numba) threads.
    """
    previous = pa.cpu_count()
    pa.set_cpu_count(1)
    try:
        yield
    finally:
        pa.set_cpu_count(previous)


WORK_DIR = ".chainrows-work"  # spill buckets and finished bucket outputs, kept for --resume


def run(dataset_dir, out_dir, options: Options = Options(), *, memory_budget=DEFAULT_BUDGET,
        buckets: int | None = None, resume: bool = False, progress: bool | None = None) -> Summary:
    """Reassemble ``dataset_dir`` into ``out_dir`` with ``options``; returns the run's summary.

    ``resume``: reuse the partitions and finished buckets a killed run left in
    ``out_dir/.chainrows-work`` when the dataset and options are unchanged.
    """
    t0 = time.perf_counter()
    sizes = input_bytes(dataset_dir)
    total = sum(sizes.values())
    k = buckets or plan_buckets(total, memory_budget)
    has_lp = "logprobs" in table_schema(dataset_dir, "tokens").names
    summary = Summary(input_bytes=total, buckets=k)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = out / WORK_DIR
    with (one_arrow_thread() if k > 1 else nullcontext()):
        if k > 1:
            base = measure_baseline(options, has_lp)
            manifest = _manifest(dataset_dir, options, buckets or spill_buckets(total, memory_budget, base),
                                 memory_budget)
            k = summary.buckets = _prepare_work(work, manifest, resume, planned=buckets is None)
        with AtomicOutput(out) as staged:
            rows_w, report_w = _final_writers(staged, has_lp)
            try:
                if k == 1:
                    bar = Progress("reassemble", 1, enabled=progress, unit="steps")
                    ds = read_dataset(dataset_dir)
                    result = run_tables(ds.ledger, ds.tokens, ds.rollouts, options)
                    del ds
                    summary.add(result)
                    rows_w.write(result.rows)
                    report_w.write(result.report)
                    bar.advance(1)
                    bar.close()
                else:
                    _run_partitioned(dataset_dir, work, k, options, memory_budget, base, total,
                                     summary, rows_w, report_w, has_lp, progress)
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


def _manifest(dataset_dir, options: Options, k, budget) -> dict:
    files = {}
    for name in ("ledger", "tokens", "rollouts"):
        for f in table_files(dataset_dir, name):
            st = f.stat()
            files[str(f.resolve())] = [st.st_size, st.st_mtime_ns]
    # version 2: IPC spill files (a version-1 work dir is not resumed)
    return {"version": 2, "files": files, "options": options.to_json(), "buckets": k, "budget": budget}


def _prepare_work(work: Path, manifest: dict, resume: bool, planned: bool) -> int:
    """Keep ``work`` when resuming the same job, otherwise start it afresh; returns the bucket
    count. A planned count depends on the measured baseline, which varies by a few MiB from
    run to run, so a resumed job keeps the count it was partitioned with."""
    path = work / "manifest.json"
    if resume and path.exists():
        try:
            old = json.loads(path.read_text())
            if planned and isinstance(old.get("buckets"), int) and old["buckets"] >= 2:
                manifest = {**manifest, "buckets": old["buckets"]}
            if old == manifest:
                return manifest["buckets"]
        except (OSError, ValueError):
            pass
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    _write_atomic(path, json.dumps(manifest, sort_keys=True))
    return manifest["buckets"]


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _run_partitioned(dataset_dir, work: Path, k, options: Options, budget, base, total, summary, rows_w,
                     report_w, has_lp, progress):
    room = headroom(budget, base)
    spill = work / "spill"
    if not (work / "partitioned").exists():
        shutil.rmtree(spill, ignore_errors=True)
        bar = Progress("partition", total, enabled=progress)
        # Measured above the baseline (2.2 GB input, 135 buckets): the streaming Parquet reader
        # holds ~13x its batch (8 MiB batches: +120 MiB; 2 MiB: +60), the bucket buffers ~2.4x
        # their size (12/24/48 MiB: +108/+142/+189 MiB with 2 MiB batches). So batches of
        # room/128 and buffers of room/16 keep the phase near a third of the headroom.
        partition(dataset_dir, spill, k, _batch_rows(dataset_dir, room // 128), bar,
                  buffer_bytes=max(4 << 20, room // 16))
        bar.close()
        (work / "partitioned").touch()
    bar = Progress("reassemble", k, enabled=progress, unit="buckets")
    merge_bytes = room // MERGE_SHARE
    outs, out_rows, out_bytes = [], 0, 0
    for b in range(k):
        d = bucket_dir(spill, b)
        rows_f, report_f, done = d / "out-rows.arrow", d / "out-report.parquet", d / "done.json"
        if not done.exists():
            ledger, tokens, rollouts = read_bucket(d)
            result = run_tables(ledger, tokens, rollouts, options)
            del ledger, tokens, rollouts
            part = Summary()
            part.add(result)
            rows = result.rows.cast(rows_schema(has_lp))
            _write_run(rows, rows_f, _run_rows(rows.nbytes, rows.num_rows, merge_bytes))
            _write_spill(result.report, report_f, 65536)
            record = {"summary": part.to_json(), "rows": rows.num_rows, "bytes": rows.nbytes}
            del result, rows
            _write_atomic(done, json.dumps(record))
            for name in ("ledger", "tokens", "rollouts"):
                shutil.rmtree(d / name, ignore_errors=True)
            release_memory()
        record = json.loads(done.read_text())
        summary.merge(Summary.from_json(record["summary"]))
        out_rows, out_bytes = out_rows + record["rows"], out_bytes + record["bytes"]
        outs.append((rows_f, report_f))
        bar.advance(1)
    bar.close()
    run_rows = _run_rows(out_bytes, out_rows, merge_bytes)
    # each open run buffers up to two of its batches
    fan_in = _fan_in(k, merge_bytes // (2 * run_rows * max(out_bytes // max(out_rows, 1), 1)))
    _merge_tree([o[0] for o in outs], rows_w, run_rows, fan_in, spill / "merge-rows")
    # report runs stay Parquet (small rows; tests plant markers in them): fewer open at once
    report_fan_in = _fan_in(k, room // (4 * READER_BYTES))
    footers = [pq.ParquetFile(o[1]).metadata for o in outs]
    report_rows = max(16, (merge_bytes // report_fan_in) * sum(md.num_rows for md in footers)
                      // max(sum(_uncompressed(md) for md in footers), 1))
    _merge_tree([o[1] for o in outs], report_w, report_rows, report_fan_in, spill / "merge-report")


def _run_rows(nbytes: int, nrows: int, merge_bytes: int) -> int:
    """Rows per batch of a sorted run: RUN_ROWS, fewer when rows are so big that a few batches
    would not fit the merge's share."""
    per_row = max(nbytes // max(nrows, 1), 1)
    return int(max(1, min(RUN_ROWS, merge_bytes // (8 * per_row))))


def _fan_in(k: int, by_memory: int) -> int:
    """Sorted runs merged at once: all of them (one level) unless memory or the open-file
    limit say fewer."""
    return max(2, min(k, by_memory, _open_file_limit() // 4))


def _open_file_limit() -> int:
    """The soft limit on open files (each merged run holds one open)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return soft if soft != resource.RLIM_INFINITY else 1 << 16
    except (ImportError, OSError, ValueError):
        return 256


def _write_spill(table: pa.Table, path: Path, group_rows: int) -> None:
    """A bucket's sorted report, as Parquet in small row groups."""
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression="lz4", use_dictionary=False, row_group_size=group_rows)
    os.replace(tmp, path)


def _batch_rows(dataset_dir, batch_bytes: int) -> int:
    """Rows per input batch while partitioning: about ``batch_bytes`` of tokens per batch."""
    footers = [_footer("tokens", f) for f in table_files(dataset_dir, "tokens")]
    rows = sum(md.num_rows for md in footers)
    size = sum(_uncompressed(md) for md in footers)
    per_row = max(size / max(rows, 1), 1.0)
    return int(max(64, min(1 << 20, batch_bytes / per_row)))


# Sorted runs of rows (bucket outputs, intermediate merge runs) are Arrow IPC files. A Parquet
# reader holds decoder state and page buffers (~7 MiB, more once Arrow's allocator keeps its
# pages): 69 buckets of the 2.2 GB test dataset merged at fan-in 9 peaked at 492-518 MiB (512
# MiB budget). An IPC reader holds just its batches: fan-in 14 there, merge peak 323 MiB, and
# the whole run took 106-125 s instead of ~160.
RUN_SUFFIX = ".arrow"
_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4", use_threads=False)


def _write_run(table: pa.Table, path: Path, batch_rows: int) -> None:
    """A sorted run as an Arrow IPC file of ``batch_rows``-row batches (atomically)."""
    tmp = path.with_name(path.name + ".tmp")
    w = _RunWriter(tmp, table.schema, batch_rows)
    try:
        w.write(table)
    finally:
        w.close()
    os.replace(tmp, path)


class _RunWriter:
    """Writer of a sorted run (Arrow IPC, lz4 buffers) in batches of ``batch_rows`` rows."""

    def __init__(self, path: Path, schema: pa.Schema, batch_rows: int):
        self._sink = pa.OSFile(str(path), "wb")
        self._w = pa.ipc.new_file(self._sink, schema, options=_IPC_OPTIONS)
        self.batch_rows = batch_rows
        self._pending: list[pa.Table] = []
        self._rows = 0

    def write(self, table: pa.Table) -> None:
        """Append rows; batches are cut every ``batch_rows`` rows whatever the calls' sizes."""
        self._pending.append(table)
        self._rows += table.num_rows
        if self._rows >= self.batch_rows:
            self._emit(final=False)

    def _emit(self, final: bool) -> None:
        if not self._pending:
            return
        table = pa.concat_tables(self._pending)
        full = table.num_rows - table.num_rows % self.batch_rows if not final else table.num_rows
        for batch in table.slice(0, full).to_batches(max_chunksize=self.batch_rows):
            self._w.write_batch(batch)
        rest = table.slice(full)
        self._pending, self._rows = ([rest], rest.num_rows) if rest.num_rows else ([], 0)

    def close(self) -> None:
        try:
            self._emit(final=True)
            self._w.close()
        finally:
            self._sink.close()


def _run_schema(path: Path) -> pa.Schema:
    if Path(path).suffix == RUN_SUFFIX:
        with pa.OSFile(str(path)) as src:
            return pa.ipc.open_file(src).schema
    return pq.read_schema(path)


def _run_batches(path: Path, batch_rows: int):
    """The record batches of a sorted run, one at a time: as written for an IPC run, streamed
    ``batch_rows`` rows at a time for a Parquet one (bucket reports)."""
    if Path(path).suffix == RUN_SUFFIX:
        pool = pa.default_memory_pool()
        with pa.OSFile(str(path), memory_pool=pool) as src:
            reader = pa.ipc.open_file(src, memory_pool=pool)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)
    else:
        yield from pq.ParquetFile(path, pre_buffer=False, buffer_size=64 << 10).iter_batches(
            batch_size=batch_rows, use_threads=False)


def _merge_tree(files, writer, batch_rows: int, fan_in: int, scratch: Path) -> None:
    """Merge sorted files into ``writer``, at most ``fan_in`` open at once (extra rounds if
    needed, through IPC runs of ``batch_rows``-row batches; Parquet files are read in batches
    of that many rows)."""
    level = 0
    while len(files) > fan_in:
        scratch.mkdir(parents=True, exist_ok=True)
        merged = []
        for i in range(0, len(files), fan_in):
            group = files[i:i + fan_in]
            path = scratch / f"run-{level}-{i // fan_in:05d}{RUN_SUFFIX}"
            w = _RunWriter(path, _run_schema(group[0]), batch_rows)
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
    iters = [_run_batches(f, batch_rows) for f in files]
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
        release_memory()
