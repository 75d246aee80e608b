"""``run``: reassemble a dataset directory into ``OUT/rows/`` (Parquet part files) and
``OUT/report.parquet`` under a memory budget, on the cheapest path that fits:

- ``memory``: read everything, decide once, write (the estimated peak fits);
- ``stream``: read the three tables once, side by side, deciding each GRPO group as soon as
  all its rows are read (chainrows.runners.bulk.windows); each window's sorted output is a run;
- ``spill``: hash-partition by group to disk, decide bucket by bucket (input whose groups
  complete too late for any window, e.g. token rows in random order).

Runs are merged by rollout_id, so every path writes the same bytes. Everything is staged in
``OUT`` and committed atomically (chainrows.outdir.atomic.AtomicOutput); ``OUT/.chainrows-work``
holds the finished windows or buckets written to disk for ``--resume`` until the commit (a
stream holds the runs of windows that fit its budget in memory instead). A run that fails or is
interrupted before it wrote any (while partitioning, before a window's runs were written)
removes it: nothing in it would be reused.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa

from chainrows.api import Result, run_tables
from chainrows.engine.threads import inherit_threads
from chainrows.errors import InputError
from chainrows.formats.native.dataset import TABLES, footer_totals, read_dataset, table_files, table_schema
from chainrows.formats.native.footers import input_fingerprint, remembered
from chainrows.formats.native.schema import REPORT_SCHEMA, rows_schema
from chainrows.lowering.rowgroups import PartsWriter, RowGroupWriter
from chainrows.memory.process import one_arrow_thread, process_peak_rss
from chainrows.options import Options
from chainrows.outdir.atomic import AtomicOutput, write_json_atomic
from chainrows.outdir.provenance import make_provenance, with_provenance
from chainrows.progress import Progress
from chainrows.runners.bulk import plan as planner
from chainrows.runners.bulk.runs import RunStore, kept_record, merge_tree, run_path
from chainrows.runners.bulk.spill import FINISHED, partition_once, reassemble_buckets, summary_of
from chainrows.runners.bulk.stream import stream_windows
from chainrows.runners.bulk.summary import Summary
from chainrows.runners.bulk.windows import plan_windows, scan

WORK_DIR = ".chainrows-work"
WINDOWS = "windows"  # in WORK_DIR: a stream's windows written to disk, step-NNNNN.json and their runs
MANIFEST_VERSION = 10
MERGE_SHARE = 16  # of the room, what the merge's buffered run batches may take
ENCODE_SHARE = 16  # of the room, what cut row groups waiting for an encoder may take
ENCODERS = 2
RUN_MAX_ROWS = 4096
REPORT_ROW_BYTES = 256  # a report row in Arrow, ids and detail included (order of magnitude)


@dataclass(frozen=True)
class Route:
    """The path a run takes, how many batches (windows or buckets), and why; a stream's
    ``resident`` tables are read whole first (chainrows.runners.bulk.windows). ``hold``: the bytes of
    sorted runs a stream holds in memory until the merge (None: what its budget leaves,
    ``_hold_allowance``; 0: every run written to disk)."""

    path: str
    batches: int
    why: str
    plan: object = None
    resident: tuple[str, ...] = ()
    hold: int | None = None


@remembered()
def run(dataset_dir, out_dir, options: Options = Options(), *, memory_budget: int = planner.DEFAULT_BUDGET,
        resume: bool = False, progress: bool | None = None, route: Route | None = None,
        reassemble: Callable[[pa.Table, pa.Table, pa.Table, Options], Result] = run_tables) -> Summary:
    """Reassemble ``dataset_dir`` into ``out_dir``; returns the run's summary.

    ``memory_budget``: peak resident bytes of the whole process; a budget below what the
    process needs is an InputError naming the smallest that works. ``resume``: reuse the
    finished windows or buckets a killed run of the same dataset and options wrote to
    ``out_dir/.chainrows-work`` (not the windows whose runs it held in memory). ``route``: force
    a path (tests, ``--buckets``, ``--steps``).
    ``reassemble``: the engine call per batch (a seam for tests and other engines).
    Each input file's footer is read once (``footers.remembered``).
    """
    t0 = time.perf_counter()
    sizes = planner.input_totals(dataset_dir)
    decoded = sum(t.decoded for t in sizes.values())  # what the plan sizes memory and disk by
    has_lp = "logprobs" in table_schema(dataset_dir, "tokens").names
    footprint = planner.measure_footprint(options, has_lp)
    planner.check_budget(memory_budget, footprint)
    room = footprint.room(memory_budget)
    out = Path(out_dir)
    work = out / WORK_DIR
    if route is None and resume and (found := resumable_route(work, dataset_dir, options)):
        recorded, recorded_budget = found
        # a budget at least the one the plan was made under holds it (the measured baseline may
        # move a little between runs); a smaller one must still hold it
        route = recorded if memory_budget >= recorded_budget else \
            route_if_it_fits(recorded, dataset_dir, decoded, room, has_lp)
        if route is None:
            fresh = choose_route(dataset_dir, decoded, room, has_lp)
            route = replace(fresh, why=f"{fresh.why}; the interrupted run's work needs more memory "
                                       "than this budget holds, so it was not resumed")
    route = route or choose_route(dataset_dir, decoded, room, has_lp)
    if route.path == "stream" and route.plan is None:
        route = replace(route, plan=plan_windows(scan(dataset_dir, has_lp, _kept_of(route, dataset_dir, room)),
                                                 route.batches, route.resident))
    summary = Summary(input_bytes=sum(t.stored for t in sizes.values()), decoded_bytes=decoded, path=route.path,
                      why=route.why, batches=route.batches, compile_seconds=footprint.compile_seconds,
                      budget=memory_budget, provenance=provenance(dataset_dir, options), dataset=str(dataset_dir))
    Progress.say(f"path: {summary.path_text()}", enabled=progress)
    decide = lambda ledger, tokens, rollouts: reassemble(ledger, tokens, rollouts, options)  # noqa: E731
    out.mkdir(parents=True, exist_ok=True)
    schemas = {"rows": rows_schema(has_lp), "report": REPORT_SCHEMA}
    final = {name: with_provenance(schema, summary.provenance) for name, schema in schemas.items()}
    tight = room < planner.STREAM_MIN_ROOM  # one encoder, Arrow on one thread, trim after steps
    with AtomicOutput(out, remove_after_commit=[work]) as staged, \
            PartsWriter(lambda: staged.reserve_part("rows"), final["rows"], unit_column="input_ids",
                        encoders=1 if tight else ENCODERS,
                        max_pending_bytes=max(1, room // ENCODE_SHARE), sync_parts=staged.durable) as rows_w, \
            RowGroupWriter(staged.reserve_file("report"), final["report"]) as report_w:
        if route.path == "memory":
            bar = Progress("reassemble", 1, enabled=progress, unit="steps")
            ds = read_dataset(dataset_dir)
            result = decide(ds.ledger, ds.tokens, ds.rollouts)
            del ds
            summary.add(result)
            rows_w.write(result.rows)
            report_w.write(result.report)
            bar.advance(1)
            bar.close()
        else:
            made_work = not work.exists()  # checked under the lock: this run's own, if made now
            try:
                prepare_work(work, manifest(dataset_dir, options, route, memory_budget), resume)
                with (one_arrow_thread() if tight else nullcontext()):
                    ipc = planner.spill_format(out, decoded)
                    if route.path == "stream":
                        hold = route.hold if route.hold is not None else _hold_allowance(room, route.plan, tight)
                        store = RunStore(hold, ipc)
                        runs = _stream(dataset_dir, work, route, decide, room, schemas, store, progress)
                    else:  # a spill holds no run: a bucket's inputs are deleted once its runs are kept
                        store = RunStore(0, ipc)
                        runs = _spill(dataset_dir, work, route, decide, room, decoded, schemas, store, progress)
                    summary.merge(summary_of(runs))
                    summary.held_runs = sum(1 for r in runs if r.get("held"))
                    summary.written_runs = len(runs) - summary.held_runs
                    _merge(work, runs, rows_w, report_w, room, tight, store, progress)
            except InputError:  # unusable input: work this run started is of no use to --resume
                if made_work:
                    shutil.rmtree(work, ignore_errors=True)
                raise
            except BaseException:  # a failed write, an interrupt: keep only work --resume reuses
                if not holds_finished_work(work):
                    shutil.rmtree(work, ignore_errors=True)
                raise
    summary.seconds = time.perf_counter() - t0
    summary.peak_rss = process_peak_rss() or 0
    return summary


def provenance(dataset_dir, options: Options) -> dict:
    """How the outputs of ``dataset_dir`` under ``options`` are made (the metadata of both
    outputs, chainrows.outdir.provenance): the options and the input's fingerprint."""
    files = [f for name in TABLES for f in table_files(dataset_dir, name)]
    return make_provenance(options, input_fingerprint(files, dataset_dir))


def choose_route(dataset_dir, total: int, room: int, has_lp: bool) -> Route:
    """``total``: the input's decoded bytes (``plan.input_totals``). In memory when its estimated
    peak fits; else streaming windows when a plan with at most
    MAX_STEPS steps fits (reading the id columns once to know) and the room is at least
    STREAM_MIN_ROOM: all tables streamed, else one table resident (the smallest that makes a
    plan fit: e.g. the tokens table when its rows are shuffled); else spill buckets. A stream
    holds the tables its scan keeps (``planner.scan_keeps``: many small files) resident too, unless
    only a plan without them held fits."""
    if planner.fits_in_memory(total, room):
        return Route("memory", 1, "fits in memory")
    if room < planner.STREAM_MIN_ROOM:
        return Route("spill", planner.spill_buckets(total, room),
                     "a tight budget: partitioned, whatever the read order")
    keeps = planner.scan_keeps(dataset_dir, room)
    # with the tables kept held, else (they may be what a stream lacks room for) as if none were
    for keep in ((keeps, ()) if keeps else ((),)):
        sc = scan(dataset_dir, has_lp, keep)
        if (plan := _stream_plan(sc, room, keep)) is not None:
            kept = f"; {' and '.join(keep)} in many small files: read once, held in memory" if keep else ""
            return Route("stream", plan.steps, "groups complete in read order" + kept, plan, keep)
    by_size = sorted(sc.tables, key=lambda n: sc.tables[n].nbytes.sum())
    for name in by_size:
        if sc.tables[name].nbytes.sum() <= planner.SHARE * room and (plan := _stream_plan(sc, room, (name,))):
            return Route("stream", plan.steps, f"rows of {name} out of read order: that table held "
                         "in memory, the others streamed", plan, (name,))
    return Route("spill", planner.spill_buckets(total, room),
                 "groups complete too late in read order to stream within the budget")


def _kept_of(route: Route, dataset_dir, room: int) -> tuple[str, ...]:
    """The resident tables of a given route (an interrupted run's, or forced) that the scan
    keeps: those a chosen route would keep under this room. Keeping fewer changes no window
    (a resident table is read at step 0 either way), only whether it is read twice."""
    return tuple(n for n in planner.scan_keeps(dataset_dir, room) if n in route.resident)


def _stream_plan(sc, room: int, resident: tuple[str, ...]):
    """The streaming plan with the fewest steps (doubling up to MAX_STEPS) whose estimated peak
    fits the room, or None."""
    first = planner.first_steps(sc.total_bytes, room)
    steps = first
    while steps <= planner.MAX_STEPS:
        plan = plan_windows(sc, steps, resident)
        if planner.stream_peak(plan) <= planner.SHARE * room:
            return plan
        if plan.decided.max(initial=0) * planner.MEMORY_FACTOR > planner.SHARE * room and steps >= 4 * first:
            return None  # more steps no longer shrink the largest window: its groups complete late
        steps *= 2
    return None


def manifest(dataset_dir, options: Options, route: Route, budget: int) -> dict:
    """What identifies a bulk job's work (input files by size and mtime, options, route), and
    the memory budget its route was planned under (``same_job`` leaves that out)."""
    files = {}
    for name in TABLES:
        for f in table_files(dataset_dir, name):
            st = f.stat()
            files[str(f.resolve())] = [st.st_size, st.st_mtime_ns]
    return {"version": MANIFEST_VERSION, "files": files, "options": options.to_json(),
            "path": route.path, "batches": route.batches, "resident": list(route.resident),
            "budget": int(budget)}


def same_job(a: dict, b: dict) -> bool:
    """Two manifests name the same job: equal in everything but the budget."""
    return {k: v for k, v in a.items() if k != "budget"} == {k: v for k, v in b.items() if k != "budget"}


def resumable_route(work: Path, dataset_dir, options: Options) -> tuple[Route, int] | None:
    """The route an interrupted run of the same dataset and options recorded in ``work``, and
    the budget it was planned under, so a resumed job keeps its batches (the planner's choice
    depends on the measured baseline)."""
    try:
        recorded = json.loads((work / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    resident = recorded.get("resident", [])
    probe = manifest(dataset_dir, options, Route(recorded.get("path", ""), recorded.get("batches", 0), "",
                                                 resident=tuple(resident) if isinstance(resident, list) else ()), 0)
    if not same_job(recorded, probe) or probe["path"] not in ("stream", "spill") \
            or not set(probe["resident"]) <= set(TABLES) or not isinstance(recorded.get("budget"), int):
        return None
    return (Route(probe["path"], int(probe["batches"]), "resumed: the interrupted run's plan",
                  resident=tuple(probe["resident"])), recorded["budget"])


def route_if_it_fits(route: Route, dataset_dir, total: int, room: int, has_lp: bool) -> Route | None:
    """``route`` (an interrupted run's, from ``resumable_route``) when this run's room holds it,
    else None: a stream needs the room choose_route asks of one and its plan's estimated peak
    within the planned share; a spill needs at least the buckets this room would plan (with
    fewer, each bucket would need more than the room holds)."""
    if route.path == "stream":
        if room < planner.STREAM_MIN_ROOM:
            return None
        plan = plan_windows(scan(dataset_dir, has_lp, _kept_of(route, dataset_dir, room)), route.batches,
                            route.resident)
        return replace(route, plan=plan) if planner.stream_peak(plan) <= planner.SHARE * room else None
    return route if route.batches >= planner.spill_buckets(total, room) else None


def holds_finished_work(work: Path) -> bool:
    """``work`` holds something ``--resume`` reuses: the spill path's finished partitioning (its
    finished buckets come after it) or a stream's window written to disk. Work without either
    (a run stopped while partitioning, or before a window's runs were written: held runs die
    with the process) is of no use: a resumed run would start it again."""
    return (work / FINISHED).exists() or any((work / WINDOWS).glob("step-*.json"))


def prepare_work(work: Path, wanted: dict, resume: bool) -> None:
    """Keep ``work`` when resuming the same job; otherwise start it afresh."""
    path = work / "manifest.json"
    if resume and path.exists():
        try:
            if same_job(json.loads(path.read_text()), wanted):
                return
        except (OSError, ValueError):
            pass
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    write_json_atomic(path, wanted)


def _keep(result: Result, store: RunStore, where: Path, stem: str, schemas: dict, batch_bytes: int) -> dict:
    """A batch's sorted outputs as the runs ``<stem>.rows.arrow`` / ``.report.arrow`` (held by
    ``store``, or written) in batches of about ``batch_bytes``; returns its record (counts,
    where, the largest batch, held or the files' sizes and digests)."""
    rows = result.rows.cast(schemas["rows"])
    per_row = max(rows.nbytes // max(rows.num_rows, 1), 1)
    batch_rows = int(max(1, min(RUN_MAX_ROWS, batch_bytes // per_row)))
    report_rows = int(max(1, min(RUN_MAX_ROWS, batch_bytes // REPORT_ROW_BYTES)))
    kept = store.keep(where / stem, {"rows": (rows, batch_rows), "report": (result.report, report_rows)})
    part = Summary()
    part.add(result)
    return {"summary": part.counts_json(), "stem": str(where / stem), "batch_bytes": batch_rows * per_row,
            "batch_rows": batch_rows, "report_rows": report_rows, **kept}


def _run_batch_bytes(room: int, runs: int) -> int:
    """Bytes per run batch so that two batches of every run fit the merge's share."""
    return max(1, (room // MERGE_SHARE) // (2 * max(runs, 1)))


def _hold_allowance(room: int, plan, tight: bool) -> int:
    """Bytes of a stream's runs it may hold in memory until the merge: what SHARE of the room
    leaves beside the larger of the stream's estimated peak and the merge's buffers (run batches
    read back, row groups waiting for an encoder); none under a tight budget."""
    if tight:
        return 0
    merge = room // MERGE_SHARE + room // ENCODE_SHARE
    return max(0, int(planner.SHARE * room - max(planner.stream_peak(plan), merge)))


def _stream(dataset_dir, work: Path, route: Route, decide, room: int, schemas, store: RunStore,
            progress) -> list[dict]:
    """Decide every window not kept by an interrupted run; returns every window's record in
    step order. A window whose runs ``store`` held leaves no marker: --resume decides it again."""
    windows = work / WINDOWS
    windows.mkdir(exist_ok=True)
    plan = route.plan
    records = {k: r for k in range(plan.steps) if (r := kept_record(windows / f"step-{k:05d}.json")) is not None}
    bar = Progress("stream", plan.steps, enabled=progress, unit="steps")
    in_schemas = {n: table_schema(dataset_dir, n) for n in TABLES}

    def store_window(k, result):
        record = _keep(result, store, windows, f"step-{k:05d}", schemas, _run_batch_bytes(room, plan.steps))
        marker = windows / f"step-{k:05d}.json"
        if record.get("held"):
            marker.unlink(missing_ok=True)  # an earlier run's, whose runs were damaged
        else:
            write_json_atomic(marker, record)
        records[k] = record
        bar.advance(1)

    bar.advance(len(records))
    with ThreadPoolExecutor(1, thread_name_prefix="chainrows-keep", **inherit_threads()) as keeper:
        pending = []

        def one(k, window):  # decide window k while window k - 1's runs are kept
            result = decide(window["ledger"], window["tokens"], window["rollouts"])
            if pending:
                pending.pop().result()
            pending.append(keeper.submit(store_window, k, result))

        stream_windows(dataset_dir, plan, in_schemas, one, skip=set(records))
        if pending:
            pending.pop().result()
    bar.close()
    return [records[k] for k in sorted(records)]


def _spill(dataset_dir, work: Path, route: Route, decide, room: int, total: int, schemas, store: RunStore,
           progress) -> list[dict]:
    # The streaming Parquet reader holds ~9x its batch's decoded bytes (13x its stored bytes on
    # the capture shape, which decode to 1.46x those), the bucket buffers ~2.4x their size, and
    # one full flush is written while the next fills: batches of room/128 and buffers of room/16
    # keep partitioning near 0.4 of the room.
    spill = partition_once(dataset_dir, work, route.batches, _batch_rows(dataset_dir, room // 128),
                           max(4 << 20, room // 16), total, progress, store.ipc)
    return reassemble_buckets(spill, route.batches, decide,
                              lambda b, result, d: _keep(result, store, d, "out", schemas,
                                                         _run_batch_bytes(room, route.batches)),
                              progress)


def _batch_rows(dataset_dir, batch_bytes: int) -> int:
    """Rows per input batch while partitioning: about ``batch_bytes`` of tokens per batch."""
    rows, _, size = footer_totals(dataset_dir, "tokens")
    return int(max(64, min(1 << 20, batch_bytes / max(size / max(rows, 1), 1.0))))


def _merge(work: Path, records: list[dict], rows_w, report_w, room: int, tight: bool, store: RunStore,
           progress) -> None:
    """Merge the sorted runs (held by ``store`` or on disk) into the final writers: all at once
    when their batches fit the merge's share of the room (runs were cut for that), else in
    levels written with ``store``'s IPC options."""
    stems = [Path(r["stem"]) for r in records]
    batch_bytes = max((r["batch_bytes"] for r in records), default=1)
    fan_in = max(2, min(len(stems), _open_file_limit() // 4,
                        (room // MERGE_SHARE) // (2 * max(batch_bytes, 1))))
    report_fan_in = max(2, min(len(stems), _open_file_limit() // 4,
                               (room // MERGE_SHARE) // (2 * REPORT_ROW_BYTES * max(
                                   (r.get("report_rows", 1) for r in records), default=1))))
    # intermediate runs of a multi-level merge keep the first level's batch sizes
    rows_batch = min((r.get("batch_rows", RUN_MAX_ROWS) for r in records), default=RUN_MAX_ROWS)
    report_batch = min((r.get("report_rows", RUN_MAX_ROWS) for r in records), default=RUN_MAX_ROWS)
    bar = Progress("merge", 2, enabled=progress, unit="tables")
    # Under a tight budget a step is a row or two and each write copies its rows out: steps are
    # gathered, up to half as much as the buffers hold, into one write (the whole share raised
    # the peak on many short calls). Otherwise each step goes to the writer as it comes: its row
    # groups take from the steps' tables, and gathered ones, hundreds of chunks each, made that
    # slower (docs/decisions-io.md "Merge steps").
    flush = room // (2 * MERGE_SHARE) if tight else 0
    merge_tree([run_path(s, "rows") for s in stems], rows_w,
               rows_batch, fan_in, work / "merge-rows", release=tight, flush_bytes=flush, store=store)
    bar.advance(1)
    merge_tree([run_path(s, "report") for s in stems], report_w, report_batch,
               report_fan_in, work / "merge-report", release=tight, flush_bytes=flush, store=store)
    bar.advance(1)
    bar.close()


def _open_file_limit() -> int:
    """The soft limit on open files (kept as a bound on the merge's fan-in: a merged run holds
    a file open only while a batch of it is read, then a map of that batch)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return soft if soft != resource.RLIM_INFINITY else 1 << 16
    except (ImportError, OSError, ValueError):
        return 256
