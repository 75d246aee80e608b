"""Spill step for datasets larger than memory: hash-partition the three tables by group.

Every row goes to bucket ``hash(group_id) % K`` of its rollout (``hash(rollout_id)`` when the
rollout has no rollouts row or a null group), so a bucket holds whole GRPO groups and every
token row of its calls, in original order (capture order survives). A bucket's tables are
Arrow IPC part files, ``<spill>/bucket-00007/{ledger,tokens,rollouts}/part-000003.arrow``,
holding rows already checked and normalized by the reader (:func:`read_bucket` reads them back).

IPC, not Parquet: the rows need no second check, and reading Parquet parts back left Arrow's
allocator holding far more (docs/decisions-io.md "Spill files").
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chainrows.arrays import FirstValue, coalesced, one_chunk, string_parts
from chainrows.engine.batch import readonly
from chainrows.engine.dense import dense_codes
from chainrows.engine.strhash import FNV_OFFSET, SECOND_OFFSET, hash_strings
from chainrows.engine.threads import wait_out
from chainrows.errors import InputError, writing
from chainrows.formats.native.dataset import TABLES, footer_totals, iter_table_batches, table_schema
from chainrows.lowering.take import take_rows
from chainrows.memory.process import release_memory
from chainrows.outdir.digest import file_digest

SPILL_IPC = pa.ipc.IpcWriteOptions(compression="lz4", use_threads=False)  # when disk is short
PLAIN_IPC = pa.ipc.IpcWriteOptions(compression=None, use_threads=False)
PARTS_MANIFEST = "parts.txt"  # per bucket, a line per part file written: "<table>/<name> <digest>"


def string_hashes(col, second: bool = False) -> np.ndarray:
    """uint64 hash of each string (a null hashes like the empty string); ``second``: an
    independent hash (another FNV offset basis), for :func:`check_no_collisions`."""
    arr = one_chunk(col)
    if len(arr) == 0:
        return np.zeros(0, dtype=np.uint64)
    offsets, data, _ = string_parts(arr)
    return hash_strings(readonly(np.ascontiguousarray(offsets)), readonly(data),
                        SECOND_OFFSET if second else FNV_OFFSET)


def check_no_collisions(first: np.ndarray, second: np.ndarray) -> None:
    """Two distinct rollout ids whose routing hashes collide would split a group across windows
    or buckets: refuse (InputError) when some ``first`` hash comes with two ``second`` hashes."""
    _, _, clash = dense_codes(first, second)
    if clash >= 0:
        raise collision_error(first[clash])


def collision_error(routing_hash) -> InputError:
    return InputError(
        f"two distinct rollout ids share the 64-bit routing hash {int(routing_hash):#018x}; "
        "the streaming and spill paths cannot tell them apart: rename one, or give a "
        "--memory-budget large enough for the in-memory path")


class Router:
    """rollout id hash -> bucket, from the rollouts table (first row of each id counts)."""

    def __init__(self, dataset_dir, n_buckets: int, batch_rows: int):
        self.k = np.uint64(n_buckets)
        rid_h, rid_h2, bucket = [], [], []
        for batch in coalesced(iter_table_batches(dataset_dir, "rollouts", ["rollout_id", "group_id"], batch_rows),
                               batch_rows):
            h = string_hashes(batch.column("rollout_id"))
            g = string_hashes(batch.column("group_id"))
            valid = pc.is_valid(batch.column("group_id")).to_numpy(zero_copy_only=False)
            rid_h.append(h)
            rid_h2.append(string_hashes(batch.column("rollout_id"), second=True))
            bucket.append(np.where(valid, g, h) % self.k)
        if rid_h:
            check_no_collisions(np.concatenate(rid_h), np.concatenate(rid_h2))
        self._bucket_of = FirstValue(np.concatenate(rid_h) if rid_h else np.zeros(0, np.uint64),
                                     np.concatenate(bucket) if bucket else np.zeros(0, np.uint64))

    def route(self, rollout_ids) -> np.ndarray:
        h = string_hashes(rollout_ids)
        return self._bucket_of.get(h, h % self.k).astype(np.int64)


def bucket_dir(spill: Path, b: int) -> Path:
    return spill / f"bucket-{b:05d}"


def _part_name(i: int) -> str:
    return f"part-{i:06d}.arrow"


def _write_part(path: Path, schema: pa.Schema, tables: list[pa.Table], ipc: pa.ipc.IpcWriteOptions) -> str:
    """Write one part file; returns its content digest. A failed write is a WriteError naming it."""
    with writing(path), pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema, options=ipc) as w:
        for table in tables:
            w.write_table(table)
    return file_digest(path)


def parts_intact(bucket: Path) -> bool:
    """The part files under ``bucket`` are the ones :func:`partition` wrote: the same names, each
    with the digest it recorded in ``bucket/PARTS_MANIFEST`` (parts are not fsynced; after a
    machine crash one may be missing, cut short or hold a zeroed page)."""
    try:
        wanted = dict(line.split(" ") for line in (bucket / PARTS_MANIFEST).read_text().splitlines())
        found = {p.relative_to(bucket).as_posix(): p for p in bucket.glob("*/part-*.arrow")}
        return found.keys() == wanted.keys() and all(file_digest(p) == wanted[k] for k, p in found.items())
    except (OSError, ValueError):
        return False


def open_mapped(path: Path) -> pa.NativeFile:
    """``path`` opened for reading as a memory map, or as a plain file where the file system
    cannot map it (the caller's reads are then copies). Buffers read from a map see the file
    itself: a mapped file must never be rewritten in place (runs and parts are written once,
    under names of their own, or replaced by rename), and a disk error while reading one
    raises SIGBUS instead of an OSError."""
    try:
        return pa.memory_map(str(path))
    except (OSError, pa.ArrowException):
        return pa.OSFile(str(path), memory_pool=pa.default_memory_pool())


def read_bucket(bucket: Path) -> tuple[pa.Table, pa.Table, pa.Table]:
    """A bucket's ledger, tokens and rollouts (parts in write order), memory-mapped: uncompressed
    parts are the page cache's pages, not a copy in new memory (lz4 parts are decompressed
    into the current Arrow pool)."""
    pool = pa.default_memory_pool()
    tables = []
    for name in TABLES:
        parts = []
        for path in sorted((bucket / name).glob("part-*.arrow")):
            with open_mapped(path) as src:  # the tables' buffers keep a mapping alive
                parts.append(pa.ipc.open_file(src, memory_pool=pool).read_all())
        tables.append(pa.concat_tables(parts))
    return tables[0], tables[1], tables[2]


def partition(dataset_dir, spill: Path, n_buckets: int, batch_rows: int, progress=None,
              buffer_bytes: int = 64 << 20, ipc: pa.ipc.IpcWriteOptions = SPILL_IPC) -> list[Path]:
    """Write every bucket's three tables under ``spill``; returns the bucket directories.

    Rows are buffered per bucket and flushed, all buckets at once, as numbered part files
    (``bucket-00007/tokens/part-000003.arrow``) whenever ``buffer_bytes`` are buffered: no
    writer stays open, so memory does not grow with the number of buckets. ``ipc``: the part
    files' write options (compression). Each part's digest is appended to its bucket's
    ``PARTS_MANIFEST`` as the part is written (:func:`parts_intact`), so nothing grows in memory
    with the number of parts. A flush is written on a thread of its own while the next one fills
    (one at a time, in order): the reader decodes meanwhile, where under a tight budget Arrow
    runs one thread (docs/decisions-io.md "Spill files").
    """
    router = Router(dataset_dir, n_buckets, batch_rows)
    dirs = [bucket_dir(spill, b) for b in range(n_buckets)]

    def write_part(b: int, name: str, part: int, schema, tables) -> None:
        digest = _write_part(dirs[b] / name / _part_name(part), schema, tables, ipc)
        with writing(dirs[b] / PARTS_MANIFEST), open(dirs[b] / PARTS_MANIFEST, "a", encoding="ascii") as manifest:
            manifest.write(f"{name}/{_part_name(part)} {digest}\n")

    with ThreadPoolExecutor(1, thread_name_prefix="chainrows-spill") as writer:
        for name in TABLES:
            _partition_table(dataset_dir, name, dirs, router, batch_rows, buffer_bytes, progress, write_part,
                             writer)
    return dirs


class _Flushes:
    """The buckets' buffers of one table, written flush by flush on ``writer`` (one thread) while
    the next flush fills: at most one in flight, in order, so parts and manifests are what
    writing them in place gave."""

    def __init__(self, name: str, schema: pa.Schema, n_buckets: int, write_part, writer: ThreadPoolExecutor):
        self.name, self.schema, self.write_part, self.writer = name, schema, write_part, writer
        self.buffers: list[list[pa.Table]] = [[] for _ in range(n_buckets)]
        self.bytes = 0
        self.part = 1  # part 0 of every bucket is the empty one written first
        self.in_flight = None

    def flush(self) -> None:
        self.wait()
        full, self.buffers = self.buffers, [[] for _ in self.buffers]
        self.in_flight = self.writer.submit(self._write, self.part, full)
        self.bytes = 0
        self.part += 1

    def _write(self, part: int, full: list[list[pa.Table]]) -> None:
        for b, tables in enumerate(full):
            if tables:
                self.write_part(b, self.name, part, self.schema, tables)
        full.clear()
        release_memory()  # the pool keeps unused memory per thread (mimalloc): this thread's too

    def poll(self) -> None:
        """A flush written by now: its error raised, its memory handed back."""
        if self.in_flight is not None and self.in_flight.done():
            self.wait()

    def wait(self) -> None:
        if self.in_flight is not None:
            future, self.in_flight = self.in_flight, None
            future.result()  # a failed write (a WriteError naming the part) is raised here
            release_memory()

    def stopped(self, stop: BaseException) -> None:
        """The table's pass stopped on ``stop``: wait for the flush being written, through further
        interrupts too (a stopped run removes its work dir: not while a write still makes files
        in it); raise its failure instead when it came first (not for an interrupt)."""
        future, self.in_flight = self.in_flight, None
        if future is None:
            return
        wait_out(future)
        error = future.exception()
        if error is not None and not isinstance(stop, KeyboardInterrupt):
            raise error from None


def _partition_table(dataset_dir, name: str, dirs: list[Path], router: Router, batch_rows: int,
                     buffer_bytes: int, progress, write_part, writer: ThreadPoolExecutor) -> None:
    """One table of :func:`partition`: its batches routed to the buckets' buffers, each full
    flush written on ``writer`` while the next fills (:class:`_Flushes`)."""
    n_buckets = len(dirs)
    schema = table_schema(dataset_dir, name)
    for d in dirs:
        (d / name).mkdir(parents=True, exist_ok=True)
    for b in range(n_buckets):
        write_part(b, name, 0, schema, [])
    flushes = _Flushes(name, schema, n_buckets, write_part, writer)
    # The bar's total is the footers' estimate of the decoded bytes (what the planner sizes a
    # run by), while Arrow batches hold a little more or less: advance by each batch's share
    # of its table's estimate, so the bar ends exactly at its total, never past it.
    table_rows, _, table_bytes = footer_totals(dataset_dir, name)
    rows_seen = bytes_shown = 0
    try:
        for batch in iter_table_batches(dataset_dir, name, None, batch_rows):
            buckets = router.route(batch.column("rollout_id"))
            order = np.argsort(buckets, kind="stable")
            cuts = np.searchsorted(buckets[order], np.arange(n_buckets + 1))
            sorted_batch = take_rows(pa.Table.from_batches([batch]), order).cast(schema)
            for b in np.flatnonzero(np.diff(cuts)):
                flushes.buffers[b].append(sorted_batch.slice(cuts[b], cuts[b + 1] - cuts[b]))
            flushes.bytes += sorted_batch.nbytes
            if progress is not None:
                rows_seen += batch.num_rows
                step = table_bytes * rows_seen // max(table_rows, 1) - bytes_shown
                progress.advance(step)
                bytes_shown += step
            del batch, sorted_batch
            flushes.poll()
            if flushes.bytes >= buffer_bytes:
                flushes.flush()
        flushes.flush()
        flushes.wait()
    except BaseException as stop:
        flushes.stopped(stop)
        raise
