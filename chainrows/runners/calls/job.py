"""``import_calls_to_dataset``: a full-sequence call log -> a SPEC §2 dataset + ``import_report.parquet``,
under a memory budget, all or nothing (SPEC §8).

Memory. The log is read a chunk at a time and every chunk's rows are written as it is decided,
so what stays is the state (chainrows.formats.calls.state): every rollout's trie, about the
deltas written, plus a few dozen bytes per call. A call log repeats every prompt, so it is
usually many times the dataset it becomes and the state fits where the log does not. The
import streams first; if the state outgrows its share of the budget, it starts again bucketed
(chainrows.formats.calls.buckets) with as many buckets as the growth seen so far says the
whole log needs. Both paths write the same bytes.

Everything is staged through AtomicOutput: a malformed record (InputError), a failed write or
an interrupt leaves no dataset behind.
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from chainrows.engine.threads import wait_out
from chainrows.formats.calls.importer import Importer
from chainrows.formats.calls.sources import CallsSource, open_source, read_ahead
from chainrows.formats.calls.summary import SAMPLES, CallsSummary
from chainrows.formats.calls.tables import LEDGER, REPORT, TOKENS
from chainrows.memory.budget import check_budget, footprint_after
from chainrows.memory.process import one_arrow_thread, process_peak_rss, release_memory
from chainrows.outdir.atomic import AtomicOutput
from chainrows.progress import Progress
from chainrows.runners.calls.buckets import Merge, Partition, RunWriter
from chainrows.runners.calls.outputs import NAMES, CallsOutput

DEFAULT_BUDGET = 4 << 30
MIN_ROOM = 256 << 20  # the least room above the baseline an import works in
SHARE = 0.75          # of the room above the baseline, what the import plans to use
CHUNK_SHARE = 32      # a chunk of the log: 1 / CHUNK_SHARE of the room, within the limits below
CHUNK_LIMITS = (2 << 20, 32 << 20)
WORK_CHUNKS = 12      # a chunk's peak while it is read and decided (two in flight), in chunks
ENCODE_SHARE = 16     # cut row groups waiting for the encoders: 1 / ENCODE_SHARE of the room
READ_FIXED = {"parquet": 112 << 20, "jsonl": 24 << 20}  # a reader's own buffers, measured
TIGHT_ROOM = 1 << 30  # below: Arrow on one thread, freed memory handed back after each chunk
SCAN_SHARE = 4        # Parquet row groups decoded side by side: up to 1 / SCAN_SHARE of the room
MAX_BUCKETS = 4096


@dataclass(frozen=True)
class Plan:
    """How the import uses the room above the process's baseline: the log's chunk size (bytes of
    JSON, or of decoded Parquet values), the encoders' queue, what the state may reach before
    the import goes bucketed, and whether the room is tight (docs/limits.md "Importing call
    logs")."""

    chunk_bytes: int
    encode_bytes: int
    state_bytes: int
    tight: bool = False
    scan_bytes: int = 0  # room for decoding Parquet row groups side by side (sources.parquet_tables)

    @classmethod
    def of(cls, room: int, kind: str = "parquet") -> Plan:
        chunk = int(min(max(room // CHUNK_SHARE, CHUNK_LIMITS[0]), CHUNK_LIMITS[1]))
        encode = int(min(room // ENCODE_SHARE, 64 << 20))
        scan = room // SCAN_SHARE if room >= TIGHT_ROOM else 0
        state = SHARE * room - READ_FIXED[kind] - WORK_CHUNKS * chunk - encode - scan
        return cls(chunk, encode, int(max(state, 16 << 20)), room < TIGHT_ROOM, scan)


class Background:
    """``fn(*args)`` on a thread of its own while the import runs (the results file: its items
    are fingerprinted in Python while Arrow decodes the log on its threads). ``check`` raises its
    error as soon as there is one; leaving the block waits for it."""

    def __init__(self, fn, *args):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="chainrows-results")
        self._future = self._pool.submit(fn, *args)

    def check(self) -> None:
        if self._future.done():
            self._future.result()

    def result(self):
        return self._future.result()

    def __enter__(self) -> Background:
        return self

    def __exit__(self, *exc) -> None:
        wait_out(self._future)
        self._pool.shutdown(wait=True)


class StateOutgrown(Exception):
    """The streaming import's state passed its allowance: ``projected`` bytes for the whole log."""

    def __init__(self, projected: int):
        super().__init__(f"state projected at {projected} bytes")
        self.projected = projected


_WARM_LINES = [  # a root and a declared child: every kernel of the one-pass path runs
    b'{"rollout_id": "w", "call_id": "a", "prompt_ids": [1, 2], "completion_ids": [3], '
    b'"completion_logprobs": [-0.12345678901234567], "output_items": []}\n',
    b'{"rollout_id": "w", "call_id": "b", "parent_id": "a", "prompt_ids": [1, 2, 3, 4], '
    b'"completion_ids": [5], "output_items": []}\n']


def load_kernels() -> None:
    """Run every kernel of the import once (compiling them on a cold cache)."""
    from chainrows.formats.calls.jsonl import fast_batch

    batch = fast_batch([1, 2], _WARM_LINES, Path("warm-up"), 0)
    Importer("mask").add(batch)


def import_calls_to_dataset(calls: str | os.PathLike, results: str | os.PathLike, out: str | os.PathLike, *,
                 on_drift: str = "root", memory_budget: int = DEFAULT_BUDGET, progress: bool | None = None,
                 buckets: int | None = None) -> CallsSummary:
    """Import the call log ``calls`` (JSON Lines or Parquet, docs/calls.md) with the results file
    ``results`` (as import-jsonl reads it) into the dataset directory ``out``. ``buckets``: force
    the bucketed path with that many buckets (tests, measurements). InputError (file, line or
    row, field) on malformed input; nothing is written then."""
    t0 = time.perf_counter()
    source = open_source(calls)
    footprint = footprint_after(load_kernels)
    check_budget(memory_budget, footprint, MIN_ROOM)
    plan = Plan.of(footprint.room(memory_budget), source.kind)
    from chainrows.formats.jsonl.importer import read_results_jsonl

    summary = None
    with Background(read_results_jsonl, results) as rollouts, \
            one_arrow_thread() if plan.tight else nullcontext():
        if buckets is None:
            try:
                summary = _stream(source, out, on_drift, plan, rollouts, progress)
            except StateOutgrown as grown:
                buckets = min(MAX_BUCKETS, max(2, math.ceil(1.25 * grown.projected / plan.state_bytes)))
                why = f"the rollouts' state would reach {grown.projected / (1 << 20):,.0f} MiB"
        else:
            why = "forced"
        if summary is None:
            release_memory()
            summary = _bucketed(source, out, on_drift, buckets, rollouts, plan, progress)
            summary.path = f"{buckets} buckets of rollouts ({why})"
    summary.seconds = time.perf_counter() - t0
    summary.peak_rss = process_peak_rss()
    return summary


def _stream(source: CallsSource, out, on_drift: str, plan: Plan, rollouts: Background,
            progress: bool | None) -> CallsSummary:
    importer = Importer(on_drift)
    bar = Progress("importing", source.size, enabled=progress)
    consumed = [0]

    def advance(n: int) -> None:
        consumed[0] += n
        bar.advance(n)

    try:
        with AtomicOutput(out, names=NAMES) as staged, \
                CallsOutput(staged, source.maybe_logprobs, plan.encode_bytes) as writer:
            for piece in read_ahead(source.pieces(plan.chunk_bytes, advance, plan.scan_bytes)):
                batch = piece()
                writer.write(*importer.add(batch))
                del batch
                rollouts.check()
                if plan.tight:
                    release_memory()
                state = importer.state.nbytes
                if state > plan.state_bytes:
                    done = max(consumed[0], 1)
                    raise StateOutgrown(int(state * max(source.size / done, 1.0)))
            table = rollouts.result()
            importer.summary.results = table.num_rows
            writer.finish(table, importer.summary.has_logprobs)
    finally:
        bar.close()
    importer.summary.path = "one pass (the rollouts' state fits)"
    return importer.summary


def _bucketed(source: CallsSource, out, on_drift: str, k: int, rollouts: Background, plan: Plan,
              progress: bool | None) -> CallsSummary:
    summary = CallsSummary()
    with AtomicOutput(out, names=NAMES) as staged, \
            CallsOutput(staged, source.maybe_logprobs, plan.encode_bytes) as writer:
        work = Path(staged.tmp_dir) / "buckets"
        partition = Partition(work, k)
        bar = Progress("partitioning", source.size, enabled=progress)
        for piece in read_ahead(source.pieces(plan.chunk_bytes, bar.advance, plan.scan_bytes)):
            partition.add(piece())
        partition.close()
        bar.close()
        runs = _import_buckets(partition, work, on_drift, summary, plan, progress)
        merge = Merge(partition, runs, plan.chunk_bytes // 8)
        for tables in merge.windows():
            writer.write(*tables)
        merge.close()
        table = rollouts.result()
        summary.results = table.num_rows
        writer.finish(table, summary.has_logprobs)
    return summary


def _import_buckets(partition: Partition, work: Path, on_drift: str, summary: CallsSummary, plan: Plan,
                    progress: bool | None) -> list:
    """Import every bucket alone into its run files; the summaries added into ``summary``, each
    record's delta length into ``partition`` (the merge's windows are cut by them)."""
    runs = []
    bar = Progress("buckets", partition.k, enabled=progress, unit="buckets")
    for b in range(partition.k):
        importer = Importer(on_drift)
        run = RunWriter(work, b, (LEDGER, TOKENS, REPORT))
        for batch in partition.batches(b):
            ledger, tokens, report = importer.add(batch)
            partition.delta_len[batch.column("record").to_numpy()] = ledger.column("delta_len").to_numpy()
            run.write(ledger, tokens, report)
            if plan.tight:
                release_memory()
        run.close()
        _add(summary, importer.summary)
        runs.append(run.paths)
        partition.paths[b].unlink(missing_ok=True)
        bar.advance(1)
    bar.close()
    return runs


def _add(total: CallsSummary, part: CallsSummary) -> None:
    """Counts of a bucket's import added to the whole's (buckets hold disjoint rollouts)."""
    total.records += part.records
    total.relations = total.relations + part.relations
    total.rollouts += part.rollouts
    total.drifted_rollouts += part.drifted_rollouts
    total.input_tokens += part.input_tokens
    total.delta_tokens += part.delta_tokens
    total.has_logprobs = total.has_logprobs or part.has_logprobs
    total.samples = sorted(total.samples + part.samples, key=lambda s: s["record"])[:SAMPLES]


__all__ = ["import_calls_to_dataset", "load_kernels", "DEFAULT_BUDGET", "Plan", "StateOutgrown"]
