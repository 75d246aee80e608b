"""Where a dataset lives and how Ray Data reads it: locations (local paths or pyarrow-filesystem
URIs), the driver-side check of every table's files, and the Ray Data datasource whose read
tasks produce checked, normalized rows in one wide schema.

The check and the normalization are the single-process reader's own
(:func:`chainrows.formats.native.dataset.plan_table`, :func:`~chainrows.formats.native.dataset.validate_schema`,
:func:`~chainrows.formats.native.dataset.normalize`), so unusable input raises the same one-line
:class:`~chainrows.errors.InputError` as ``chainrows reassemble`` without ``--ray``: on the
driver for anything a footer tells (missing table or column, wrong type, unreadable footer), in
the read task that meets it for anything only the data tells (a null where none is allowed,
invalid UTF-8, damaged pages).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from chainrows.errors import InputError
from chainrows.formats.native import dataset as dsio
from chainrows.formats.native.dataset import CANONICAL, TABLES, iter_file_tables, plan_table, validate_schema
from chainrows.formats.native.footers import reading
from chainrows.runners.bulk.partition import string_hashes

TAG = {name: i for i, name in enumerate(TABLES)}  # ledger 0, tokens 1, rollouts 2
ROW_BITS = 40  # _seq = file index << ROW_BITS | row in file: the input's read order
READ_BATCH_ROWS = 65_536
TABLE_COL, SEQ_COL, RKEY_COL = "_table", "_seq", "_rkey"


@dataclass(frozen=True)
class Location:
    """A directory on a pyarrow filesystem. ``path`` is what the filesystem is asked for
    (absolute for local paths, so workers on other nodes of a shared mount find it);
    ``shown`` is what messages print (the user's own spelling)."""

    fs: pafs.FileSystem
    path: str
    shown: str

    @property
    def local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem) and "://" not in self.shown

    def join(self, *parts: str) -> str:
        return "/".join([self.path.rstrip("/"), *parts])


def locate(where: str | os.PathLike) -> Location:
    """``where`` as a Location: a URI (``s3://bucket/x``, ``file:///x``, ``gs://...``) through
    ``pyarrow.fs.FileSystem.from_uri``, anything else a local path. A URI no pyarrow
    filesystem reads is an InputError."""
    text = os.fspath(where)
    if "://" in text:
        try:
            fs, path = pafs.FileSystem.from_uri(text)
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise InputError(f"no pyarrow filesystem reads {text!r}: {' '.join(str(exc).split())}") from exc
        return Location(fs, path, text)
    return Location(pafs.LocalFileSystem(), str(Path(text).absolute()), text)


@dataclass(frozen=True)
class TableFiles:
    """One table's checked files: ``paths`` for the filesystem, ``shown`` for messages,
    ``present`` the canonical columns each file has, ``columns`` those the read returns."""

    name: str
    paths: list[str]
    shown: list[str]
    present: list[list[str]]
    columns: list[str]

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([CANONICAL[self.name].field(c) for c in self.columns])


def check_tables(loc: Location) -> dict[str, TableFiles]:
    """List and check the three tables' files (footers only, no data read); InputError on
    unusable input, with the single-process messages."""
    if loc.local:
        out = {}
        for name in TABLES:
            plan = plan_table(loc.shown, name)
            out[name] = TableFiles(name, [str(Path(f).absolute()) for f in plan.files],
                                   [str(f) for f in plan.files], plan.present, plan.columns)
        return out
    return {name: _check_remote(loc, name) for name in TABLES}


def _check_remote(loc: Location, name: str) -> TableFiles:
    """plan_table's rules on a pyarrow filesystem (same messages, URIs for paths)."""
    info = loc.fs.get_file_info(loc.path)
    if info.type != pafs.FileType.Directory:
        raise InputError(f"dataset directory {loc.shown!r} does not exist or is not a directory", table=name)
    single, folder = (loc.fs.get_file_info(loc.join(n)) for n in (f"{name}.parquet", name))
    shown_root = loc.shown.rstrip("/")
    if single.type != pafs.FileType.NotFound and folder.type != pafs.FileType.NotFound:
        raise InputError(f"table stored twice: both {name}.parquet and {name}/ exist; keep one",
                         table=name, directory=loc.shown)
    if single.type == pafs.FileType.File:
        paths, shown = [single.path], [f"{shown_root}/{name}.parquet"]
    else:
        base = single if single.type == pafs.FileType.Directory else folder
        if base.type != pafs.FileType.Directory:
            hint = " (a file, expected a directory)" if folder.type == pafs.FileType.File else ""
            raise InputError(f"table not found: expected {name}.parquet or a directory {name}/{hint}",
                             table=name, directory=loc.shown)
        entries = sorted(loc.fs.get_file_info(pafs.FileSelector(base.path)), key=lambda e: e.base_name)
        sub = base.base_name
        paths, shown = [], []
        for e in entries:
            if e.base_name.startswith((".", "_")):
                continue
            if e.type == pafs.FileType.Directory:
                raise InputError(f"unexpected subdirectory {e.base_name!r} in the table directory "
                                 f"(nested or partitioned layouts are not supported)",
                                 table=name, directory=f"{shown_root}/{sub}")
            paths.append(e.path)
            shown.append(f"{shown_root}/{sub}/{e.base_name}")
    present = []
    for path, label in zip(paths, shown):
        with reading(name, label), loc.fs.open_input_file(path) as fh:
            schema = pq.read_schema(fh)
        present.append(validate_schema(name, schema, label))
    wanted = list(CANONICAL[name].names)
    columns = [c for c in wanted if c not in dsio.OPTIONAL[name] or any(c in p for p in present)]
    for col in columns:
        if col in dsio.OPTIONAL[name] and col not in dsio.FILL_IF_MISSING:
            for label, p in zip(shown, present):
                if col not in p:
                    raise InputError(f"optional column {col!r} is present in some files of the "
                                     f"table but missing in this one", table=name, file=label, column=col)
    return TableFiles(name, paths, shown, present, columns)


def wide_schema(tables: dict[str, TableFiles]) -> pa.Schema:
    """One schema for the rows of all three tables (a row's other tables' columns are null),
    plus the table tag, the read-order sequence number and the routing key."""
    fields: dict[str, pa.Field] = {}
    for name in TABLES:
        for f in tables[name].schema:
            fields.setdefault(f.name, f)
    return pa.schema([*fields.values(), pa.field(TABLE_COL, pa.int8()), pa.field(SEQ_COL, pa.int64()),
                      pa.field(RKEY_COL, pa.int64())])


def route_key(rollout_ids, partitions: int) -> np.ndarray:
    """First routing key: a stable hash of the rollout id (collisions only put two rollouts in
    one task; the routing there matches ids by value)."""
    return (string_hashes(rollout_ids) % np.uint64(partitions)).astype(np.int64)


def widen(table: pa.Table, name: str, file_index: int, row0: int, schema: pa.Schema,
          partitions: int) -> pa.Table:
    """A normalized table's rows in the wide schema, tagged with table, sequence and route key."""
    n = table.num_rows
    cols = []
    for f in schema:
        if f.name == TABLE_COL:
            cols.append(pa.array(np.full(n, TAG[name], np.int8)))
        elif f.name == SEQ_COL:
            cols.append(pa.array((np.int64(file_index) << ROW_BITS) + row0 + np.arange(n, dtype=np.int64)))
        elif f.name == RKEY_COL:
            cols.append(pa.array(route_key(table.column("rollout_id"), partitions)))
        elif f.name in table.column_names:
            cols.append(table.column(f.name).cast(f.type))
        else:
            cols.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(cols, schema=schema)


ONE_LINE = "chainrows_message"  # attribute an InputError carries through Ray's wrapping


def read_file(fs: pafs.FileSystem, tf: TableFiles, i: int, schema: pa.Schema, partitions: int):
    """Yield file ``i`` of table ``tf`` as wide blocks: the single-process reader's checks and
    normalization (same InputError messages), batch by batch. An InputError leaves with its
    message also kept as an attribute, which survives pickling (Ray Data rewrites the args)."""
    try:
        yield from _read_file(fs, tf, i, schema, partitions)
    except InputError as exc:
        setattr(exc, ONE_LINE, str(exc))
        raise


def _read_file(fs, tf: TableFiles, i: int, schema: pa.Schema, partitions: int):
    path, label, present = tf.paths[i], tf.shown[i], tf.present[i]
    read_cols = [c for c in present if c in tf.columns]
    rows_read = 0
    for row0, table in iter_file_tables(tf.name, label, tf.columns, read_cols, READ_BATCH_ROWS,
                                        open_file=lambda: fs.open_input_file(path)):
        rows_read = row0 + table.num_rows
        yield widen(table, tf.name, i, row0, schema, partitions)
    if rows_read == 0:  # no rows (the footer says so, else the read raised): the schema
        yield schema.empty_table()


def datasource(loc: Location, tables: dict[str, TableFiles], partitions: int):
    """A Ray Data datasource with one read task per input file (see :func:`read_file`)."""
    from ray.data import Datasource, ReadTask
    from ray.data.block import BlockMetadata

    schema = wide_schema(tables)
    fs = loc.fs

    class ChainrowsTables(Datasource):
        def estimate_inmemory_data_size(self):
            return None

        def get_read_tasks(self, parallelism, per_task_row_limit=None, data_context=None):
            tasks = []
            for name in TABLES:
                tf = tables[name]
                for i in range(len(tf.paths)):
                    meta = BlockMetadata(num_rows=None, size_bytes=None, input_files=[tf.paths[i]],
                                         exec_stats=None)
                    tasks.append(ReadTask(lambda tf=tf, i=i: read_file(fs, tf, i, schema, partitions),
                                          meta, schema=schema))
            return tasks

    return ChainrowsTables(), schema

