"""The driver of a Ray run: check the input, build the Ray Data pipeline, commit the outputs.

Pipeline, one Ray Data execution (each arrow after the read is a hash shuffle or a sort):

    read_datasource (one task per input file: checked, normalized, tagged rows)
      -> groupby(_rkey).map_groups(route)       every row of a rollout in one task: its bucket
      -> groupby(_bucket).map_groups(decide)    whole GRPO groups through the engine
      -> sort(rollout_id, _out, segment)        rows and report rows in one ordered stream
      -> map_batches(write_part)                each sorted block: a rows part, a report part

The commit names the parts in sort order, so reading ``OUT/rows`` and ``OUT/report`` in file-name
order gives the tables of the single-process run.
"""

from __future__ import annotations

import json
import logging
import math
import time

import pyarrow.fs as pafs

from chainrows.api import run_tables
from chainrows.formats.native.dataset import Totals
from chainrows.formats.native.footers import input_fingerprint
from chainrows.formats.native.schema import REPORT_SCHEMA, rows_schema
from chainrows.options import Options
from chainrows.outdir.provenance import make_provenance, with_provenance
from chainrows.runners.bulk.summary import Summary
from chainrows.runners.ray import tasks
from chainrows.runners.ray.cluster import connected, input_error_in
from chainrows.runners.ray.commit import Staging
from chainrows.runners.ray.route import BUCKET_COL
from chainrows.runners.ray.source import RKEY_COL, Location, check_tables, datasource, locate

BUCKET_BYTES = 256 << 20  # decoded input per decide task (footer estimate): the engine holds a few times this
TASKS_PER_CPU = 2


def run(dataset, out, options: Options | None = None, *, address: str | None = None,
        buckets: int | None = None, num_cpus: int | None = None, progress: bool | None = None,
        engine=run_tables, records: list | None = None, worker_logs: bool = True) -> Summary:
    """Reassemble ``dataset`` into ``out`` on Ray; returns the run's summary (path ``ray``).

    ``dataset``, ``out``: local paths (on a shared mount for a multi-node cluster) or
    pyarrow-filesystem URIs. ``address``: None starts a local Ray with ``num_cpus`` CPUs;
    ``auto`` or ``ray://host:port`` joins a cluster. ``buckets``: decide tasks (default: from
    the input size and the cluster's CPUs). ``progress``: Ray Data's progress bars (None: Ray's
    default). ``engine(ledger, tokens, rollouts, options)``: the in-memory engine each task runs
    (a seam for tests). ``records``: a list that receives one dict per decide task (bucket,
    bytes in and out, seconds, the Ray node id), for measurements. ``worker_logs``: copy the workers' output to
    this process's stderr (chainrows.runners.ray.cluster.connected).

    Unusable input raises InputError (the single-process messages), before Ray starts when the
    footers tell. On any error nothing is committed and earlier outputs stay.
    """
    t0 = time.perf_counter()
    options = Options.of(options)
    src, dst = locate(dataset), locate(out)
    tables = check_tables(src)
    sizes = _input_totals(src, tables)
    has_lp = "logprobs" in tables["tokens"].columns
    prov = make_provenance(options, input_fingerprint([p for t in tables.values() for p in t.paths], src.path, src.fs))
    with connected(address, num_cpus, worker_logs=worker_logs) as ray:
        from ray.data import DataContext

        ctx = DataContext.get_current()
        if progress is not None:
            ctx.enable_progress_bars = progress
        if progress is False:  # no bars: no "Starting execution" lines either
            logging.getLogger("ray.data").setLevel(logging.WARNING)
        n = buckets or max(TASKS_PER_CPU * int(ray.cluster_resources().get("CPU", 1)),
                           math.ceil(sizes.decoded / BUCKET_BYTES))
        try:
            with Staging(dst) as stage:
                got = _pipeline(ray, src, dst, stage, tables, options, n, has_lp, engine, prov)
        except Exception as exc:
            found = input_error_in(exc)
            if found is not None and found is not exc:
                raise found from None
            raise
    summary = Summary(input_bytes=sizes.stored, decoded_bytes=sizes.decoded, path="ray", batches=n,
                      why=f"{n:,} decide tasks on {'a local Ray' if address is None else address}",
                      provenance=prov, dataset=str(dataset))
    for r in got:
        summary.merge(Summary.from_counts(r["counts"]))
    if records is not None:
        records.extend({k: r[k] for k in ("bucket", "in_bytes", "out_bytes", "seconds", "node")} for r in got)
    summary.seconds = time.perf_counter() - t0
    return summary


def _pipeline(ray, src: Location, dst: Location, stage: Staging, tables, options, n: int, has_lp: bool,
              engine, prov: dict) -> list[dict]:
    """Run the pipeline and place its parts (both outputs carrying ``prov``); returns the decide
    tasks' records in bucket order."""
    source, _ = datasource(src, tables, n)
    records_dir, parts_dir = f"{stage.root}/records", f"{stage.root}/parts"
    for d in (records_dir, f"{parts_dir}/rows", f"{parts_dir}/report"):
        dst.fs.create_dir(d, recursive=True)
    files = max(1, sum(len(t.paths) for t in tables.values()))
    # one block per file read: Ray Data would otherwise split the reads into ~200 small blocks
    parts = (ray.data.read_datasource(source, override_num_blocks=files)
             .groupby(RKEY_COL, num_partitions=n)
             .map_groups(tasks.route, fn_args=(n,), batch_format="pyarrow")
             .groupby(BUCKET_COL, num_partitions=n)
             .map_groups(tasks.decide, batch_format="pyarrow",
                         fn_kwargs=dict(tables=tables, options=options, fs=dst.fs, records_dir=records_dir,
                                        has_logprobs=has_lp, engine=engine))
             .sort(tasks.SORT_KEYS)
             .map_batches(tasks.write_part, batch_size=None, batch_format="pyarrow",
                          fn_kwargs=dict(fs=dst.fs, parts_dir=parts_dir, has_logprobs=has_lp, provenance=prov))
             .take_all())
    for name, schema in (("rows", rows_schema(has_lp)), ("report", REPORT_SCHEMA)):
        # sorted blocks cover disjoint key ranges: their first keys order them
        mine = sorted((p for p in parts if p["output"] == name), key=lambda p: (p["first_id"], p["first_segment"]))
        files = [p["file"] for p in mine]
        if not files:  # an empty output is one empty part, as the single-process run writes one
            files = [f"{parts_dir}/{name}/empty.parquet"]
            tasks.write_parquet(dst.fs, files[0], with_provenance(schema.empty_table(), prov))
        stage.place(name, files)
    records = []
    for info in dst.fs.get_file_info(pafs.FileSelector(records_dir)):
        if info.base_name.endswith(".json"):
            with dst.fs.open_input_stream(info.path) as f:
                records.append(json.loads(f.read()))
    return sorted(records, key=lambda r: r["bucket"])


def _input_totals(src: Location, tables) -> Totals:
    """Rows and bytes of the columns read, from the footers, as the single-process run counts
    them (``formats.native.dataset.footer_totals``): uncompressed as stored (the summary's figure) and
    estimated once decoded (what sizes the decide tasks). Other columns a capture carries do
    not count."""
    from chainrows.formats.native.footers import facts_of, reading

    rows = stored = decoded = 0
    for tf in tables.values():
        for path, label, present in zip(tf.paths, tf.shown, tf.present):
            with reading(tf.name, label), src.fs.open_input_file(path) as fh:
                facts = facts_of(fh)
            read = [c for c in present if c in tf.columns]
            rows += facts.num_rows
            stored += facts.stored_of(read)
            decoded += facts.decoded_of(read)
    return Totals(rows, stored, decoded)
