"""What Ray Data's tasks run: route a set of rollouts, decide a bucket of whole GRPO groups
with the in-memory engine, and write a sorted block of the outputs as a Parquet part.

Every task's files get a fresh name (a uuid) and are only used through the records the task
returns; so a task that Ray retries after its worker died leaves at most an unreferenced file
in the staging directory, which the commit discards with it.
"""

from __future__ import annotations

import json
import time
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from chainrows.api import run_tables
from chainrows.formats.native.schema import REPORT_SCHEMA, rows_schema
from chainrows.options import Options
from chainrows.outdir.parquet import WRITE_OPTIONS, row_group_rows
from chainrows.outdir.provenance import with_provenance
from chainrows.runners.bulk.summary import Summary
from chainrows.runners.ray.route import BUCKET_COL, add_buckets, split_tables

OUT_COL = "_out"  # 0: a rows row, 1: a report row, in the one sorted output stream
PART_RECORD = pa.schema([("output", pa.string()), ("file", pa.string()), ("first_id", pa.string()),
                         ("first_segment", pa.int64()), ("num_rows", pa.int64())])


def output_schema(has_logprobs: bool) -> pa.Schema:
    """The rows and report columns in one schema (shared names have the same types) plus
    ``_out``; the sort key is (rollout_id, _out, segment), segment 0 on report rows."""
    fields = {f.name: f for f in rows_schema(has_logprobs)}
    for f in REPORT_SCHEMA:
        fields.setdefault(f.name, f)
    return pa.schema([*fields.values(), pa.field(OUT_COL, pa.int8())])


SORT_KEYS = ["rollout_id", OUT_COL, "segment"]


def write_parquet(fs: pafs.FileSystem, path: str, table: pa.Table) -> int:
    """Write ``table`` with the single-process writer options; returns the file's size."""
    with fs.open_output_stream(path) as f:
        pq.write_table(table, f, row_group_size=row_group_rows(table), **WRITE_OPTIONS)
    return fs.get_file_info(path).size


def route(rows: pa.Table, buckets: int) -> pa.Table:
    """map_groups on ``_rkey``: every row of these rollouts with its ``_bucket``."""
    return add_buckets(rows, buckets)


def decide(rows: pa.Table, *, tables, options: Options, fs: pafs.FileSystem, records_dir: str,
           has_logprobs: bool, engine=run_tables) -> pa.Table:
    """map_groups on ``_bucket``: run ``engine`` (the in-memory ``chainrows.reassemble``) on the
    bucket's whole groups; return its rows and report stacked in :func:`output_schema`. Its
    record (counts, bytes in and out, seconds, the Ray node id that ran it) goes to
    ``records_dir/b<bucket>.json`` (a retried task rewrites the same file)."""
    from ray import get_runtime_context  # only ever called in a Ray task

    t0 = time.perf_counter()
    bucket = int(rows[BUCKET_COL][0].as_py()) if rows.num_rows else -1
    in_bytes = rows.nbytes
    ledger, tokens, rollouts = split_tables(rows, tables)
    del rows
    result = engine(ledger, tokens, rollouts, options)
    del ledger, tokens, rollouts
    schema = output_schema(has_logprobs)
    out = pa.concat_tables([_widen(result.rows, 0, schema), _widen(result.report, 1, schema)])
    counts = Summary()
    counts.add(result)
    record = {"bucket": bucket, "counts": counts.counts_json(), "in_bytes": in_bytes,
              "out_bytes": out.nbytes, "seconds": time.perf_counter() - t0,
              "node": get_runtime_context().get_node_id()}
    path = f"{records_dir}/b{bucket:06d}.json"
    with fs.open_output_stream(path + ".tmp") as f:
        f.write(json.dumps(record).encode())
    fs.move(path + ".tmp", path)
    return out


def _widen(table: pa.Table, out: int, schema: pa.Schema) -> pa.Table:
    n = table.num_rows
    cols = []
    for f in schema:
        if f.name == OUT_COL:
            cols.append(pa.array(np.full(n, out, np.int8)))
        elif f.name in table.column_names:
            cols.append(table.column(f.name).cast(f.type))
        elif f.name == "segment":
            cols.append(pa.array(np.zeros(n, np.int32)))
        else:
            cols.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(cols, schema=schema)


def write_part(block: pa.Table, *, fs: pafs.FileSystem, parts_dir: str, has_logprobs: bool,
               provenance: dict | None = None) -> pa.Table:
    """map_batches on a sorted output block: write its rows and its report rows as one Parquet
    part each under ``parts_dir/{rows,report}/`` (with ``provenance`` as their metadata, when
    given); return PART_RECORD rows naming each file and its first (rollout_id, segment), by
    which the commit orders the parts."""
    records = []
    for out, name, schema in ((0, "rows", rows_schema(has_logprobs)), (1, "report", REPORT_SCHEMA)):
        part = block.filter(pc.equal(block[OUT_COL], out))
        if part.num_rows == 0:
            continue
        path = f"{parts_dir}/{name}/{uuid.uuid4().hex}.parquet"
        if provenance is not None:
            schema = with_provenance(schema, provenance)
        write_parquet(fs, path, part.select(schema.names).cast(schema))
        records.append({"output": name, "file": path, "first_id": part["rollout_id"][0].as_py(),
                        "first_segment": part["segment"][0].as_py(), "num_rows": part.num_rows})
    return pa.Table.from_pylist(records, schema=PART_RECORD)
