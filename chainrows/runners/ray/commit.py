"""Staging and the atomic commit of ``OUT/rows/`` and ``OUT/report/`` for a Ray run.

Workers write into a hidden staging directory inside OUT (its name starts with ``.``, so
readers skip it). The driver then names the finished parts ``part-NNNNNNNN.parquet`` in output
order and commits: rows in, then report (the report is the commit marker).

- A local OUT (also a shared mount that every node sees at the same path) goes through the
  single-process :class:`chainrows.outdir.atomic.AtomicOutput`: renames on one filesystem, fsync'd;
  on any error the staging directory is deleted and earlier outputs stay; a directory left by
  a killed driver is removed by the next run into that OUT.
- Any other pyarrow filesystem (``s3://`` and the like) gets the same order with the
  filesystem's own ``move``; object stores copy on move, so there a crash in the commit itself
  can leave new rows without a report (never a report without its rows).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import pyarrow.fs as pafs

from chainrows.outdir.atomic import OUTPUT_NAMES, PART_DIGITS, AtomicOutput
from chainrows.runners.ray.source import Location

STAGE_PREFIX = ".chainrows-tmp-ray-"


class Staging:
    """Context manager: ``root`` is the staging directory (a path on ``loc.fs``); ``place(name,
    files)`` renames finished part files into ``<name>/part-NNNNNNNN.parquet`` in the given
    order; leaving the block normally commits, an exception discards everything staged."""

    def __init__(self, loc: Location):
        self.loc = loc
        self._atomic: AtomicOutput | None = None
        self.root = ""

    def __enter__(self) -> Staging:
        if self.loc.local:
            self._atomic = AtomicOutput(self.loc.path).__enter__()
            self.root = str(self._atomic.tmp_dir) + "/.ray"
        else:
            self.root = self.loc.join(f"{STAGE_PREFIX}{uuid.uuid4().hex}")
        self.loc.fs.create_dir(self.root, recursive=True)
        return self

    def place(self, name: str, files: Iterable[str]) -> int:
        """Move ``files`` (in order) to the staged ``name`` directory; returns how many."""
        fs, n = self.loc.fs, 0
        if self._atomic is None:
            fs.create_dir(f"{self.root}/out/{name}", recursive=True)
        for src in files:
            if self._atomic is not None:
                dst = str(self._atomic.reserve_part(name))
            else:
                dst = f"{self.root}/out/{name}/part-{n:0{PART_DIGITS}d}.parquet"
            fs.move(src, dst)
            n += 1
        return n

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._atomic is not None:
            self._atomic.__exit__(exc_type, exc, tb)
            return False
        try:
            if exc_type is None:
                self._commit()
        finally:
            _delete(self.loc.fs, self.root)
        return False

    def _commit(self) -> None:
        fs, out = self.loc.fs, self.loc.path.rstrip("/")
        for name in reversed(OUTPUT_NAMES):  # the old report goes first: no report without its rows
            for form in (f"{name}.parquet", name):
                _delete(fs, f"{out}/{form}")
        for name in OUTPUT_NAMES:  # file by file: object stores move files, not directories
            fs.create_dir(f"{out}/{name}", recursive=True)
            staged = fs.get_file_info(pafs.FileSelector(f"{self.root}/out/{name}"))
            for info in sorted(staged, key=lambda i: i.base_name):
                fs.move(info.path, f"{out}/{name}/{info.base_name}")


def _delete(fs: pafs.FileSystem, path: str) -> None:
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        fs.delete_dir(path)
    elif info.type == pafs.FileType.File:
        fs.delete_file(path)
