"""Small Parquet files read a group at a time.

A capture written by many workers, or by a Spark or Ray job, comes as thousands of small part
files. Read one by one, each file pays a fixed cost: open, footer, a decode started on Arrow's
threads, checks per column. On the capture shape cut into 1,000 files per table that was ~1 ms
a file, about as much as decoding its rows (docs/limits.md "Many small files"). Consecutive
small files of one layout are therefore read as one table by Arrow's dataset scanner, which
opens and decodes several files at once, and checked as one table. No group holds more rows
than one batch of the reader would, so memory stays what the batch size plans.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:  # dataset.py imports this module
    from chainrows.formats.native.dataset import TablePlan

SMALL_FILE_BYTES = 8 << 20  # decoded bytes (footer estimate) of the columns read of a file read in a group, at most
GROUP_BYTES = 64 << 20  # decoded bytes of a group, at most


def file_groups(plan: TablePlan, batch_rows: int) -> list[list[int]]:
    """Indices of the files of a table's ``plan`` (in read order) cut into groups: a group of
    several files holds only small files (``SMALL_FILE_BYTES`` at most of the columns read) of
    one Arrow schema and one set of columns read, at most ``batch_rows`` rows and
    ``GROUP_BYTES`` bytes; every other file is a group alone."""
    groups: list[list[int]] = []
    rows = size = 0
    first: int | None = None  # the last group's first file, while the group takes more small files
    for i, f in enumerate(plan.facts):
        nbytes = plan.read_decoded(i)
        small = nbytes <= SMALL_FILE_BYTES and f.num_rows <= batch_rows
        if (small and first is not None and rows + f.num_rows <= batch_rows
                and size + nbytes <= GROUP_BYTES and plan.read_columns(i) == plan.read_columns(first)
                and f.schema.equals(plan.facts[first].schema)):
            groups[-1].append(i)
            rows += f.num_rows
            size += nbytes
        else:
            groups.append([i])
            rows, size, first = f.num_rows, nbytes, i if small else None
    return groups


def many_small_files(plan: TablePlan, batch_rows: int) -> bool:
    """The table comes in several files, most of them small ones read in groups
    (:func:`file_groups`: two files or more a group on average), so that every read of the
    table pays a fixed cost per file."""
    return len(plan.files) > 1 and len(plan.files) >= 2 * len(file_groups(plan, batch_rows))


def read_group(files: list[Path], schema: pa.Schema, columns: list[str], buffer_size: int) -> pa.Table:
    """The ``columns`` of ``files`` (all of Arrow schema ``schema``, as :func:`file_groups`
    groups them) as one table, rows in file order, decoded with the settings of the one-file
    reader (no whole-file pre-buffering, a ``buffer_size`` buffered stream) and Arrow's threads
    only when its CPU pool has more than one (a tight budget runs Arrow on one,
    ``memory.process.one_arrow_thread``). Raises what the scanner raises; the caller reads the files
    one by one then, for an error that names the file."""
    import pyarrow.dataset as pads

    fmt = pads.ParquetFileFormat(default_fragment_scan_options=pads.ParquetFragmentScanOptions(
        pre_buffer=False, buffer_size=buffer_size, use_buffered_stream=True))
    return pads.dataset([str(f) for f in files], schema=schema, format=fmt).to_table(
        columns=columns, use_threads=pa.cpu_count() > 1)
