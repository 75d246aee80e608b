"""Routing rows so that every GRPO group is decided whole by one task, and taking a task's rows
apart again into the three SPEC §2 tables in their original read order.

Two keys, both stable hashes (:func:`chainrows.runners.bulk.partition.string_hashes`):

1. ``_rkey`` = hash(rollout_id) mod P, set by the read tasks: every row of one rollout, from all
   three tables, meets in one routing task;
2. ``_bucket`` = hash(group key) mod B, set there: the group key of a rollout is the group_id of
   its *first* rollouts row in read order (SPEC §3 step 4: only the first row counts), or the
   rollout id itself when that group_id is null or the rollout has no rollouts row (its own
   group, SPEC §5). Every row of the rollout, including later duplicate rollouts rows, takes
   that bucket.

A hash collision only puts more rollouts or groups in one task; ids are matched by value.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chainrows.formats.native.dataset import TABLES
from chainrows.runners.bulk.partition import string_hashes
from chainrows.runners.ray.source import RKEY_COL, SEQ_COL, TABLE_COL, TAG, TableFiles

BUCKET_COL = "_bucket"


def add_buckets(rows: pa.Table, buckets: int) -> pa.Table:
    """``rows`` (all rows of some whole rollouts, wide schema) with ``_bucket`` in place of
    ``_rkey``."""
    ro = rows.filter(pc.equal(rows[TABLE_COL], TAG["rollouts"])).sort_by(SEQ_COL)
    first = pc.index_in(rows["rollout_id"], value_set=ro["rollout_id"])  # first match in read order
    group = pc.take(ro["group_id"], first) if ro.num_rows else pa.nulls(rows.num_rows, pa.string())
    key = pc.coalesce(group, rows["rollout_id"])
    # "g:"/"r:" keep a group named like some rollout id apart from that rollout's own group
    tagged = pc.if_else(pc.is_valid(group), pc.binary_join_element_wise("g:", key, ""),
                        pc.binary_join_element_wise("r:", key, ""))
    bucket = (string_hashes(tagged) % np.uint64(buckets)).astype(np.int64)
    out = rows.drop_columns([RKEY_COL])
    return out.append_column(BUCKET_COL, pa.array(bucket))


def split_tables(rows: pa.Table, tables: dict[str, TableFiles]) -> tuple[pa.Table, pa.Table, pa.Table]:
    """A task's wide rows as the three canonical tables, each in the input's read order."""
    out = []
    for name in TABLES:
        part = rows.filter(pc.equal(rows[TABLE_COL], TAG[name])).sort_by(SEQ_COL)
        schema = tables[name].schema
        out.append(pa.Table.from_arrays([part[c].cast(schema.field(c).type) for c in schema.names],
                                        schema=schema))
    return tuple(out)
