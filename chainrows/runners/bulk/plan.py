"""How a bulk run fits its memory budget: the measured process baseline, the path (in memory,
streaming windows, spill buckets) and its sizes.

The budget covers the peak resident set of the whole process (VmHWM), interpreter, libraries
and loaded kernels included. The factors are peak bytes over input bytes, measured on this
project's benchmark shapes (docs/limits.md "Memory budget"); the baseline is measured in the
running process after its kernels are loaded.
"""

from __future__ import annotations

import math
import shutil

import numpy as np
import pyarrow as pa

from chainrows.formats.native.dataset import TABLES, Totals, footer_totals, plan_table, plan_totals
from chainrows.formats.native.small_files import many_small_files
from chainrows.memory.budget import BASE_RSS, Footprint, check_budget, footprint_after  # noqa: F401 (re-exported)
from chainrows.options import Options
from chainrows.runners.bulk.partition import PLAIN_IPC, SPILL_IPC
from chainrows.runners.bulk.windows import KEPT_TABLES, SCAN_BATCH_ROWS

DEFAULT_BUDGET = 4 << 30
MEMORY_FACTOR = 4.0      # in-memory run: peak over the input's decoded bytes (2.3-2.4x measured)
MEMORY_FIXED = 96 << 20  # in-memory run: working memory whatever the input's size (threads, writers)
SHARE = 0.75             # of the room above the baseline, what the planned peak may use
SPILL_PEAK_FACTOR = 4.0  # spill bucket: peak over its decoded input, allocator retention included
BUCKET_SHARE = 0.6
MAX_STEPS = 64
STEP_BYTES = 96 << 20  # estimated input a streaming step aims at (docs/limits.md "Memory budget")
RUN_DISK_FACTOR = 4  # buckets (~ the decoded input) and runs (~ the output) uncompressed, with margin
STREAM_MIN_ROOM = 1 << 30  # below this room, spill: its factors are measured down to 384 MiB budgets
KEEP_SHARE = 8  # the tables a stream's scan keeps hold at most 1 / KEEP_SHARE of the room
KEEP_MIN_FILES = 64  # below, the file opens a kept table saves (~0.5 ms each) are worth less than
# the decoding it moves out of the stream, where it overlaps the engine, into the scan


def measure_footprint(options: Options, has_logprobs: bool) -> Footprint:
    """Load every kernel with a two-call reassembly (compiling them on a cold cache), then read
    the process's resident set."""
    from chainrows import api
    from chainrows.engine.run import decide, gather_rows
    from chainrows.lowering.columnar import build_batch
    from chainrows.runners.bulk.partition import string_hashes
    from chainrows.runners.bulk.warmup import tiny_tables

    def load_kernels():
        tables = tiny_tables(has_logprobs)
        api.run_tables(*tables, options)
        batch, _ = build_batch(*tables)
        gather_rows(batch, decide(batch, options), options)  # decide_and_gather's fallback: plain copies
        string_hashes(tables[2]["rollout_id"])

    return footprint_after(load_kernels)


def input_totals(dataset_dir) -> dict[str, Totals]:
    """Each table's rows and bytes (as stored, and estimated once decoded: what the planner
    sizes a run by), from Parquet footers (no data read). Every file's schema is checked
    first, so unusable input fails before any work."""
    return {name: footer_totals(dataset_dir, name) for name in TABLES}


def spill_format(work_parent, total_bytes: int) -> pa.ipc.IpcWriteOptions:
    """Write options of the spill buckets and sorted runs: uncompressed when the disk under
    ``work_parent`` has RUN_DISK_FACTOR times ``total_bytes`` (the input, decoded) free (lz4 cost
    about a seventh of a shuffled run's CPU, docs/decisions-io.md), else lz4 (about half the bytes)."""
    try:
        free = shutil.disk_usage(work_parent).free
    except OSError:
        return SPILL_IPC
    return PLAIN_IPC if free >= RUN_DISK_FACTOR * total_bytes else SPILL_IPC


def fits_in_memory(total_bytes: int, room: int) -> bool:
    """The in-memory path's estimated peak above the baseline is within SHARE of the room."""
    return MEMORY_FIXED + total_bytes * MEMORY_FACTOR <= SHARE * room


def stream_peak(plan) -> float:
    """Estimated peak above the baseline of a streaming plan, at its worst step: the rows held,
    the decided window's working memory, the previous window's output still being written,
    and the next step's rows read meanwhile; for resident tables, the rows of this window and
    of the next (built meanwhile) copied out of them (at most: some are sliced), on top of the
    tables held."""
    if plan.steps == 0:
        return 0.0
    previous = np.concatenate(([0.0], plan.decided[:-1]))
    ahead = np.concatenate((plan.read[1:], [0.0]))
    copied = plan.copied if plan.copied is not None else np.zeros(plan.steps)
    copies = copied + np.concatenate((copied[1:], [0.0]))
    return float((plan.held + (MEMORY_FACTOR - 1) * plan.decided + previous + ahead + copies).max())


def first_steps(total_bytes: float, room: int) -> int:
    """Steps so that one step's share of the input, decided, fits the room, and is about
    STEP_BYTES (the first step's read and the last step's decide and write overlap nothing:
    smaller steps leave less of the run unoverlapped); at most MAX_STEPS."""
    fits = math.ceil(total_bytes * MEMORY_FACTOR / (SHARE * room))
    return min(MAX_STEPS, max(2, fits, math.ceil(total_bytes / STEP_BYTES)))


def spill_buckets(total_bytes: int, room: int) -> int:
    """Spill buckets so one bucket's estimated peak stays within BUCKET_SHARE of the room."""
    per_bucket = BUCKET_SHARE * room / SPILL_PEAK_FACTOR
    return max(2, math.ceil(total_bytes / per_bucket))


def scan_keeps(dataset_dir, room: int) -> tuple[str, ...]:
    """The tables a stream's id scan reads whole, for the stream to take from memory instead of
    reading them again (``KEPT_TABLES``, held resident): each that comes in many small files (at
    least KEEP_MIN_FILES, ``small_files.many_small_files``: a second read would pay each file's
    fixed cost again), while their decoded bytes (footers) together stay within
    ``room / KEEP_SHARE``. A table in a few files is read by the stream alone, beside the engine."""
    keep, held = [], 0
    for name in KEPT_TABLES:
        plan = plan_table(dataset_dir, name)
        decoded = plan_totals(plan).decoded
        if len(plan.files) >= KEEP_MIN_FILES and many_small_files(plan, SCAN_BATCH_ROWS) \
                and held + decoded <= room / KEEP_SHARE:
            keep.append(name)
            held += decoded
    return tuple(keep)
