"""The checker's inputs as Arrow tables: a dataset (directory, Dataset or table triple) and
the rows / report outputs (table, Parquet file or directory of part files)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from chainrows.formats.native.schema import REPORT_SCHEMA, ROWS_SCHEMA, tables_from_pylists
from chainrows.testing.reconcile.ids import TABLES
from chainrows.testing.reconcile.problems import Problems


def inputs(dataset) -> tuple[pa.Table, pa.Table, pa.Table]:
    """(ledger, tokens, rollouts) of a dataset directory, a Dataset, or a triple of Arrow
    tables or of dict lists."""
    if isinstance(dataset, (str, os.PathLike)):
        from chainrows.formats.native.dataset import read_dataset

        dataset = read_dataset(dataset)
    if all(hasattr(dataset, n) for n in TABLES):
        return dataset.ledger, dataset.tokens, dataset.rollouts
    ledger, tokens, rollouts = dataset
    if not isinstance(ledger, pa.Table):
        return tables_from_pylists(ledger, tokens, rollouts)
    return ledger, tokens, rollouts


def output(x) -> pa.Table:
    """An output table: as it is, or read from a Parquet file or a directory of part files
    (in name order, hidden and ``_`` files skipped)."""
    if isinstance(x, pa.Table):
        return x
    path = Path(x)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if not p.name.startswith((".", "_")))
        tables = [pq.read_table(p) for p in files]
        return pa.concat_tables(tables) if tables else pa.table({})
    return pq.read_table(path)


def has_columns(problems: Problems, rows: pa.Table, report: pa.Table) -> bool:
    """Whether rows and report hold every column of their schema (logprobs is optional);
    adds a problem per missing one."""
    ok = True
    for name, table, schema in (("rows", rows, ROWS_SCHEMA), ("report", report, REPORT_SCHEMA)):
        for f in schema:
            if f.name == "logprobs":
                continue
            if f.name not in table.column_names:
                problems.add(f"{name}: missing column {f.name!r}")
                ok = False
    return ok
