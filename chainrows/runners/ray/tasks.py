"""What the Ray tasks of a run do, as plain functions (the driver wraps them in ``ray.remote``):

- :func:`rollout_keys`: one rollouts file -> its rows' rollout-id hashes and group keys, and a
  sample of its ids (the driver builds the group map and the output ranges from these);
- :func:`split_file`: one input file, or one run of its row groups -> its rows cut into one
  piece per decide task;
- :func:`decide`: one bucket's pieces -> the in-memory engine on its whole groups -> the rows
  and report cut into one piece per output range;
- :func:`write_range`: one range's pieces from every decide task -> one rows part and one
  report part, sorted as the single-process run sorts them.

Every file a task writes gets a fresh name (a uuid) and is used only through what the task
returns; a task Ray retries after its worker died leaves at most an unreferenced file in the
staging directory, which the commit discards with it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from chainrows.formats.native.dataset import TABLES
from chainrows.formats.native.schema import REPORT_SCHEMA, rows_schema
from chainrows.memory.process import apply_huge_pages_choice, keep_pandas_out
from chainrows.options import Options
from chainrows.outdir.parquet import WRITE_OPTIONS, row_group_rows
from chainrows.outdir.provenance import with_provenance
from chainrows.runners.bulk.summary import Summary
from chainrows.runners.ray.route import GroupMap, cut_sorted, group_keys, sample_ids, split_by_bucket
from chainrows.runners.ray.source import Read, TableFiles, read_file

SAMPLE_IDS = 1024  # rollout ids per rollouts file for the output ranges' bounds
ROWS_ORDER = [("rollout_id", "ascending"), ("segment", "ascending")]
REPORT_ORDER = [("rollout_id", "ascending")]


@dataclass(frozen=True)
class Plan:
    """What every task of one run needs (put in Ray's object store once).

    ``tables``: the checked input files; ``reads``: the split tasks' shares of them, in read
    order (:func:`chainrows.runners.ray.source.read_plan`); ``fs``: the input's filesystem; ``out_fs`` and
    ``parts_dir``: where parts are staged; ``buckets``: decide tasks; ``bounds``: the output
    ranges' rollout-id bounds (``len(bounds) + 1`` ranges); ``provenance``: the outputs'
    metadata; ``engine(ledger, tokens, rollouts, options)``: the in-memory engine (None:
    ``chainrows.api.run_tables``); ``own_workers``: the workers serve this run alone (a session
    the run started or joined itself), so they may be set up as the command's own process is."""

    tables: dict[str, TableFiles]
    reads: list[Read]
    fs: pafs.FileSystem
    out_fs: pafs.FileSystem
    parts_dir: str
    options: Options
    has_logprobs: bool
    buckets: int
    bounds: pa.Array
    provenance: dict
    engine: Callable | None = None
    own_workers: bool = True

    @property
    def ranges(self) -> int:
        return len(self.bounds) + 1


def rollout_keys(fs: pafs.FileSystem, tf: TableFiles, i: int, own_workers: bool = True
                 ) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """Rollouts file ``i``: per row in read order (rollout-id hash, group key), and a sample of
    its rollout ids (:func:`chainrows.runners.ray.route.sample_ids`). ``own_workers``: as
    :attr:`Plan.own_workers`."""
    _worker_settings(own_workers)
    hashes, keys, ids = [], [], []
    for table in read_file(fs, tf, i, ["rollout_id", "group_id"]):
        h, k = group_keys(table["rollout_id"], table["group_id"])
        hashes.append(h)
        keys.append(k)
        ids.append(sample_ids(table["rollout_id"], SAMPLE_IDS))
    sample = sample_ids(pa.chunked_array(ids, pa.string()), SAMPLE_IDS)
    return (np.concatenate(hashes) if hashes else np.zeros(0, np.uint64),
            np.concatenate(keys) if keys else np.zeros(0, np.uint64), sample)


def split_file(plan: Plan, k: int, groups: GroupMap) -> tuple:
    """Read ``plan.reads[k]``: (info, piece for bucket 0, ..., piece for bucket B - 1); a piece
    holds the read's rows of that bucket in read order, or is None. ``info``: rows and Arrow
    bytes read."""
    _worker_settings(plan.own_workers)
    name, i, row_groups = plan.reads[k]
    per_bucket: list[list[pa.Table]] = [[] for _ in range(plan.buckets)]
    rows = nbytes = 0
    for table in read_file(plan.fs, plan.tables[name], i, row_groups=row_groups):
        rows += table.num_rows
        nbytes += table.nbytes
        cut = split_by_bucket(table, groups.buckets_of(table["rollout_id"]), plan.buckets)
        for b, piece in enumerate(cut):
            if piece is not None:
                per_bucket[b].append(piece)
    pieces = [pa.concat_tables(p) if p else None for p in per_bucket]
    return ({"read": k, "rows": rows, "bytes": nbytes}, *pieces)


def decide(plan: Plan, bucket: int, *pieces) -> tuple:
    """Bucket ``bucket``'s pieces (one per read, in ``plan.reads`` order) through the
    engine: (record, piece for range 0, ..., piece for range R - 1), a range's piece being
    (rows, report) or None. The record: bucket, counts, bytes in and out, seconds, node."""
    t0 = time.perf_counter()
    _worker_settings(plan.own_workers)
    tables = []
    for name in TABLES:
        mine = [p for read, p in zip(plan.reads, pieces) if read.table == name and p is not None]
        tables.append(pa.concat_tables(mine) if mine else plan.tables[name].schema.empty_table())
    in_bytes = sum(t.nbytes for t in tables)
    if plan.engine is None:
        from chainrows.api import run_tables as engine
    else:
        engine = plan.engine
    result = engine(*tables, plan.options)
    del tables, pieces
    rows_cut = cut_sorted(result.rows["rollout_id"], plan.bounds)
    report_cut = cut_sorted(result.report["rollout_id"], plan.bounds)
    out = []
    for r in range(plan.ranges):
        rows = result.rows.slice(rows_cut[r], rows_cut[r + 1] - rows_cut[r])
        report = result.report.slice(report_cut[r], report_cut[r + 1] - report_cut[r])
        out.append((rows, report) if rows.num_rows or report.num_rows else None)
    counts = Summary()
    counts.add(result)
    record = {"bucket": bucket, "counts": counts.counts_json(), "in_bytes": in_bytes,
              "out_bytes": result.rows.nbytes + result.report.nbytes,
              "seconds": time.perf_counter() - t0, "node": _node_id()}
    return (record, *out)


def write_range(plan: Plan, r: int, *pieces) -> list[dict]:
    """Range ``r``'s pieces from every decide task: its rows and report as one Parquet part
    each under ``parts_dir/{rows,report}/`` (with the provenance), sorted as the single-process
    run sorts them. Returns one record per file written: output, file, range, rows."""
    _worker_settings(plan.own_workers)
    got = [p for p in pieces if p is not None]
    records = []
    for k, name, order, schema in ((0, "rows", ROWS_ORDER, rows_schema(plan.has_logprobs)),
                                   (1, "report", REPORT_ORDER, REPORT_SCHEMA)):
        parts = [p[k] for p in got if p[k].num_rows]
        if not parts:
            continue
        table = pa.concat_tables(parts)
        if len(parts) > 1:  # each part is sorted and holds whole rollouts: only their interleaving is new
            from chainrows.lowering.take import take_rows

            table = take_rows(table, pc.sort_indices(table, sort_keys=order).to_numpy())
        path = f"{plan.parts_dir}/{name}/{uuid.uuid4().hex}.parquet"
        schema = with_provenance(schema, plan.provenance)
        write_parquet(plan.out_fs, path, table.select(schema.names).cast(schema))
        records.append({"output": name, "file": path, "range": r, "rows": table.num_rows})
    return records


def write_parquet(fs: pafs.FileSystem, path: str, table: pa.Table) -> int:
    """Write ``table`` with the single-process writer options; returns the file's size."""
    with fs.open_output_stream(path) as f:
        pq.write_table(table, f, row_group_size=row_group_rows(table), **WRITE_OPTIONS)
    return fs.get_file_info(path).size


def _worker_settings(own_workers: bool) -> None:
    """A Ray worker's settings: kernel threads (Numba's setting, for this thread) and Arrow's
    compute threads as many as Ray gave this task CPUs (Ray runs one task per CPU; more threads
    would only compete with the neighbouring tasks). Workers that serve this run alone are also
    set up as the ``chainrows`` command sets its own process: no transparent huge pages unless
    ``CHAINROWS_HUGE_PAGES=system`` (docs/limits.md "Huge pages": on a VM whose host reclaims
    free memory they cost more to fault in than everything else the task does), and no pandas
    (they import the engine only after this, in the task)."""
    import numba

    ray = _ray_session()
    if ray is None:
        return
    if own_workers:
        apply_huge_pages_choice()
        keep_pandas_out()
    cpus = max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))
    numba.set_num_threads(min(cpus, numba.config.NUMBA_NUM_THREADS))
    if pa.cpu_count() != cpus:
        pa.set_cpu_count(cpus)


def _node_id() -> str | None:
    ray = _ray_session()
    return None if ray is None else ray.get_runtime_context().get_node_id()


def _ray_session():
    """``ray`` inside a Ray worker (or driver), else None: a task function called directly
    (tests) must not start a Ray of its own, which ``ray.get_runtime_context()`` would."""
    import sys

    ray = sys.modules.get("ray")
    return ray if ray is not None and ray.is_initialized() else None
