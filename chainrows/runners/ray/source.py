"""Where a dataset lives and how a Ray task reads it: locations (local paths or pyarrow-filesystem
URIs), the driver-side check of every table's files, and the per-file read that yields checked,
normalized tables.

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
from typing import NamedTuple

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from chainrows.errors import InputError
from chainrows.formats.native import dataset as dsio
from chainrows.formats.native.dataset import (
    CANONICAL,
    TABLES,
    Totals,
    iter_file_tables,
    plan_table,
    validate_schema,
)
from chainrows.formats.native.footers import facts_of, reading

READ_BATCH_ROWS = 65_536


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


ONE_LINE = "chainrows_message"  # attribute an InputError carries through Ray's wrapping


class Read(NamedTuple):
    """One read task's share of the input: file ``file`` of table ``table``, its row groups
    ``row_groups`` (None: the whole file)."""

    table: str
    file: int
    row_groups: range | None = None


def read_plan(loc: Location, tables: dict[str, TableFiles], read_bytes: int) -> tuple[Totals, list[Read]]:
    """From the footers: the input's totals as the single-process run counts them (rows, and
    bytes of the columns read: uncompressed as stored, the summary's figure, and estimated once
    decoded, what sizes the decide tasks; other columns a capture carries do not count), and
    the reads, tables in SPEC order and files in read order, a file cut into runs of row groups
    of at most ``read_bytes`` decoded (a larger row group is a run of its own)."""
    rows = stored = decoded = 0
    reads: list[Read] = []
    for name in TABLES:
        tf = tables[name]
        for i, (path, label, present) in enumerate(zip(tf.paths, tf.shown, tf.present)):
            with reading(tf.name, label), loc.fs.open_input_file(path) as fh:
                facts = facts_of(fh)
            read = [c for c in present if c in tf.columns]
            rows += facts.num_rows
            stored += facts.stored_of(read)
            decoded += facts.decoded_of(read)
            reads += [Read(name, i, g) for g in row_group_runs(facts.group_decoded, read_bytes)]
    return Totals(rows, stored, decoded), reads


def row_group_runs(group_bytes, limit: int) -> list[range | None]:
    """Consecutive runs of row groups of at most ``limit`` bytes each (a larger group alone);
    ``[None]`` (the whole file) when it fits in one run."""
    if sum(group_bytes) <= limit or len(group_bytes) <= 1:
        return [None]
    runs, start, held = [], 0, 0
    for g, size in enumerate(group_bytes):
        if g > start and held + size > limit:
            runs.append(range(start, g))
            start, held = g, 0
        held += size
    runs.append(range(start, len(group_bytes)))
    return runs


def read_file(fs: pafs.FileSystem, tf: TableFiles, i: int, columns: list[str] | None = None,
              row_groups: range | None = None):
    """Yield file ``i`` of table ``tf`` (its ``row_groups``, default all) batch by batch as
    normalized tables of ``columns`` (default: the table's columns): the single-process
    reader's checks and normalization, with its InputError messages. A run of row groups that
    meets unusable input reads the whole file for the error, so that the message is the one a
    whole-file read gives (a short read counts the file's rows, not the run's). An InputError
    leaves with its message also kept as an attribute, which survives pickling (Ray rewrites a
    task's exception)."""
    columns = tf.columns if columns is None else columns
    read_cols = [c for c in tf.present[i] if c in columns]

    def tables(groups):
        for _, table in iter_file_tables(tf.name, tf.shown[i], columns, read_cols, READ_BATCH_ROWS,
                                         open_file=lambda: fs.open_input_file(tf.paths[i]), row_groups=groups):
            yield table

    try:
        try:
            yield from tables(row_groups)
        except InputError:
            if row_groups is None:
                raise
            for _ in tables(None):  # the whole file's first error, if it has one
                pass
            raise
    except InputError as exc:
        setattr(exc, ONE_LINE, str(exc))
        raise
