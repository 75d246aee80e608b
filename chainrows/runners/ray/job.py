"""The driver of a Ray run: check the input, launch the tasks, commit the outputs.

Tasks (chainrows.runners.ray.tasks), Arrow tables from end to end, one shuffle of the input:

    rollout_keys  one per rollouts file     -> the group map (rollout -> bucket) and the
                                               output ranges' bounds, built here
    split_file    one per file or run of row groups (<= 128 MiB decoded)
                                            -> its rows, one piece per bucket
    decide        one per bucket            -> whole GRPO groups through the engine; rows and
                                               report, one piece per output range
    write_range   one per output range      -> one rows part and one report part

Every task is launched at once (Ray starts each when its inputs exist). Output ranges are
rollout-id ranges, in order, so naming the parts by range makes ``OUT/rows`` and ``OUT/report``,
read in file-name order, the tables of the single-process run.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pyarrow as pa

from chainrows.formats.native.footers import input_fingerprint
from chainrows.formats.native.schema import REPORT_SCHEMA, rows_schema
from chainrows.options import Options
from chainrows.outdir.provenance import make_provenance, with_provenance
from chainrows.progress import Progress
from chainrows.runners.bulk.summary import Summary
from chainrows.runners.ray import tasks
from chainrows.runners.ray.cluster import connected, input_error_in, session_held
from chainrows.runners.ray.commit import Staging
from chainrows.runners.ray.route import GroupMap, range_bounds
from chainrows.runners.ray.source import check_tables, locate, read_plan

BUCKET_BYTES = 256 << 20  # decoded input per decide task (footer estimate): the engine holds a few times this
READ_BYTES = 128 << 20  # decoded input per split task at most, unless one row group is larger
TASKS_PER_CPU = 2
# every node reads, decides and writes its share: each task's inputs come from all nodes alike,
# and Ray's default (the node holding most of a task's inputs, while it has room) would queue
# the decide tasks where the first reads ran
SPREAD = "SPREAD"
SETTLE_SECONDS = 60  # after an error, how long the tasks still running may take to end


def run(dataset, out, options: Options | None = None, *, address: str | None = None,
        buckets: int | None = None, num_cpus: int | None = None, progress: bool | None = None,
        engine=None, records: list | None = None, worker_logs: bool = True,
        exclusive: bool | None = None) -> Summary:
    """Reassemble ``dataset`` into ``out`` on Ray; returns the run's summary (path ``ray``).

    ``dataset``, ``out``: local paths (on a shared mount for a multi-node cluster) or
    pyarrow-filesystem URIs. ``address``: None starts a local Ray with ``num_cpus`` CPUs;
    ``auto`` or ``ray://host:port`` joins a cluster. ``buckets``: decide tasks (default: from
    the input size and the cluster's CPUs). ``progress``: a progress line per stage on stderr
    (None: when stderr is a terminal). ``engine(ledger, tokens, rollouts, options)``: the
    in-memory engine each task runs (None: ``chainrows.api.run_tables``; a seam for tests).
    ``records``: a list that receives one dict per decide task (bucket, bytes in and out,
    seconds, the Ray node that ran it), for measurements. ``worker_logs``: copy the workers'
    output to this process's stderr (chainrows.runners.ray.cluster.connected). ``exclusive``:
    the Ray workers serve this run alone, so they are set up as the command's own process is
    (no pandas, no transparent huge pages; ``tasks.Plan.own_workers``); None: when this run
    starts or joins the session itself, not in a session this process already holds.

    Unusable input raises InputError (the single-process messages), before Ray starts when the
    footers tell. On any error nothing is committed and earlier outputs stay.
    """
    t0 = time.perf_counter()
    options = Options.of(options)
    src, dst = locate(dataset), locate(out)
    tables = check_tables(src)
    sizes, reads = read_plan(src, tables, READ_BYTES)
    has_lp = "logprobs" in tables["tokens"].columns
    prov = make_provenance(options, input_fingerprint([p for t in tables.values() for p in t.paths], src.path, src.fs))
    held = session_held()
    with connected(address, num_cpus, worker_logs=worker_logs) as ray:
        n = buckets or default_buckets(int(ray.cluster_resources().get("CPU", 1)), sizes.decoded)
        plan = tasks.Plan(tables, reads, src.fs, dst.fs, "", options, has_lp, n, pa.array([], pa.string()), prov,
                          engine, own_workers=not held if exclusive is None else exclusive)
        try:
            with Staging(dst) as stage:
                got = _pipeline(ray, stage, plan, progress)
        except Exception as exc:
            found = input_error_in(exc)
            if found is not None and found is not exc:
                raise found from None
            raise
    summary = Summary(input_bytes=sizes.stored, decoded_bytes=sizes.decoded, path="ray", batches=n,
                      why=f"{n:,} decide tasks on {_where(address, held)}",
                      provenance=prov, dataset=str(dataset))
    for r in got:
        summary.merge(Summary.from_counts(r["counts"]))
    if records is not None:
        records.extend({k: r[k] for k in ("bucket", "in_bytes", "out_bytes", "seconds", "node")} for r in got)
    summary.seconds = time.perf_counter() - t0
    return summary


def default_buckets(cpus: int, decoded_bytes: int) -> int:
    """Decide tasks for ``decoded_bytes`` of input on ``cpus`` CPUs: at least TASKS_PER_CPU per
    CPU and one per BUCKET_BYTES, rounded up to a multiple of the CPUs (each wave of tasks then
    fills the cluster)."""
    cpus = max(1, cpus)
    n = max(TASKS_PER_CPU * cpus, math.ceil(decoded_bytes / BUCKET_BYTES))
    return math.ceil(n / cpus) * cpus


def _pipeline(ray, stage: Staging, plan: tasks.Plan, progress: bool | None) -> list[dict]:
    """Run the tasks and place their parts (both outputs carrying the plan's provenance);
    returns the decide tasks' records in bucket order."""
    parts_dir = f"{stage.root}/parts"
    fs = plan.out_fs
    for d in (f"{parts_dir}/rows", f"{parts_dir}/report"):
        fs.create_dir(d, recursive=True)
    groups, bounds = _group_map(ray, plan, progress)
    plan = dataclasses.replace(plan, parts_dir=parts_dir, bounds=bounds)
    read_infos, decide_records, written = _launch(ray, plan, groups)
    try:
        _wait(ray, read_infos, "read", progress)
        records = _wait(ray, decide_records, "decide", progress)
        parts = [p for got in _wait(ray, written, "write", progress) for p in got]
    except Exception:
        # no ray.cancel (it crashed Ray 2.60's driver: task_manager.cc "Tried to complete task
        # that was not pending"); the tasks that still run are let finish, for a while, so that
        # none writes into the staging directory after it is deleted
        ray.wait(written, num_returns=len(written), timeout=SETTLE_SECONDS)
        raise
    for name, schema in (("rows", rows_schema(plan.has_logprobs)), ("report", REPORT_SCHEMA)):
        files = [p["file"] for p in sorted(parts, key=lambda p: p["range"]) if p["output"] == name]
        if not files:  # an empty output is one empty part, as the single-process run writes one
            files = [f"{parts_dir}/{name}/empty.parquet"]
            tasks.write_parquet(fs, files[0], with_provenance(schema.empty_table(), plan.provenance))
        stage.place(name, files)
    return sorted(records, key=lambda r: r["bucket"])


def _where(address: str | None, held: bool) -> str:
    if held:
        return "the Ray session this process holds"
    return "a local Ray" if address is None else address


def _launch(ray, plan: tasks.Plan, groups) -> tuple[list, list, list]:
    """Launch every split, decide and write task; returns the refs of the read infos, the
    decide records and the write records. The pieces' refs are dropped here: each piece is then
    held by the object store only until the task that takes it has finished."""
    plan_ref, groups_ref = ray.put(plan), ray.put(groups)
    split = ray.remote(tasks.split_file).options(num_returns=plan.buckets + 1, scheduling_strategy=SPREAD)
    splits = [split.remote(plan_ref, k, groups_ref) for k in range(len(plan.reads))]
    decide = ray.remote(tasks.decide).options(num_returns=plan.ranges + 1, scheduling_strategy=SPREAD)
    decided = [decide.remote(plan_ref, b, *[s[1 + b] for s in splits]) for b in range(plan.buckets)]
    write = ray.remote(tasks.write_range).options(scheduling_strategy=SPREAD)
    written = [write.remote(plan_ref, r, *[d[1 + r] for d in decided]) for r in range(plan.ranges)]
    return [s[0] for s in splits], [d[0] for d in decided], written


def _group_map(ray, plan: tasks.Plan, progress: bool | None):
    """The rollouts table's group map (chainrows.runners.ray.route.GroupMap) for the plan's
    buckets, and the output ranges' bounds (at most one range per bucket), from one task per
    rollouts file."""
    tf, n = plan.tables["rollouts"], plan.buckets
    keys = ray.remote(tasks.rollout_keys).options(num_returns=1)
    refs = [keys.remote(plan.fs, tf, i, plan.own_workers) for i in range(len(tf.paths))]
    got = _wait(ray, refs, "rollouts", progress)
    hashes = np.concatenate([g[0] for g in got]) if got else np.zeros(0, np.uint64)
    group_keys = np.concatenate([g[1] for g in got]) if got else np.zeros(0, np.uint64)
    return GroupMap.build(hashes, group_keys, n), range_bounds([g[2] for g in got], n)


def _wait(ray, refs: list, label: str, progress: bool | None) -> list:
    """The values of ``refs`` (small task results), in order, as they finish; a failed task's
    error is raised as soon as it is known."""
    bar = Progress(label, len(refs), enabled=progress, unit="count")
    pending, index = list(refs), {ref: k for k, ref in enumerate(refs)}
    values: list = [None] * len(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
        for ref in ready:
            values[index[ref]] = ray.get(ref)
        bar.advance(len(ready))
    bar.close()
    return values
