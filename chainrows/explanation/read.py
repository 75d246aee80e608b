"""Read only what explaining a few rollouts needs from a SPEC §2 dataset directory.

A rollout's decision depends on its own ledger, tokens and rollouts rows; its advantage on its
group's rewards (and, with ``baseline_population="ok"``, on its siblings' decisions). So the
rollouts of the asked ids' groups are read whole, and nothing else: of each file, the id column
(``rollout_id`` or ``group_id``), then only the row groups that hold a wanted id, one at a time.
A dataset written rollout by rollout (as every importer and ``synth`` write) therefore answers in
the time of its id columns and a few row groups, whatever its size (docs/explain.md).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from chainrows.errors import InputError
from chainrows.formats.native.dataset import TABLES, TablePlan, normalize, plan_table
from chainrows.formats.native.footers import reading


def _matching_groups(pf: pq.ParquetFile, column: str, wanted: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(row groups holding a wanted value of ``column``, their first rows): the id column is read
    whole (small beside the token lists), the rest only where it matches."""
    ids = pf.read(columns=[column]).column(0)
    hit = np.flatnonzero(pc.is_in(ids, value_set=wanted.cast(ids.type)).to_numpy(zero_copy_only=False))
    sizes = [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)]
    starts = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)))
    groups = np.unique(np.searchsorted(starts, hit, side="right") - 1)
    return groups, starts


def read_filtered(plan: TablePlan, column: str, values: Sequence[str]) -> pa.Table:
    """The rows of ``plan``'s table whose ``column`` is one of ``values``, file by file in read
    order, each piece checked and normalized as every reader does (``normalize``). Only the row
    groups that hold a wanted value are decoded, one at a time, so memory stays at one row group
    whatever the file's size."""
    wanted = pa.array(sorted(set(values)), pa.string())
    parts = []
    for i, file in enumerate(plan.files):
        with reading(plan.name, file):
            pf = pq.ParquetFile(file)
            groups, starts = _matching_groups(pf, column, wanted)
            for g in groups:
                piece = pf.read_row_group(int(g), columns=plan.read_columns(i))
                keep = pc.is_in(piece.column(column), value_set=wanted.cast(piece.column(column).type))
                parts.append((piece.filter(keep), file, int(starts[g])))  # row0: the row group's, for messages
    if not parts:
        return plan.schema.empty_table()
    tables = [normalize(plan.name, t, plan.columns, file, row0) for t, file, row0 in parts]
    return pa.concat_tables(tables, promote_options="permissive")


def read_for_rollouts(data: str | os.PathLike, rollout_ids: Sequence[str]) -> tuple[pa.Table, pa.Table, pa.Table]:
    """(ledger, tokens, rollouts) of ``rollout_ids`` and of every rollout of their groups.

    Raises InputError naming the rollout when an id is in no table of the dataset, and as the
    dataset reader does on unusable files."""
    _not_an_output(Path(data))
    plans = {name: plan_table(data, name) for name in TABLES}
    rollouts = read_filtered(plans["rollouts"], "rollout_id", rollout_ids)
    groups = [g for g in rollouts.column("group_id").unique().to_pylist() if g is not None]
    if groups:
        siblings = read_filtered(plans["rollouts"], "group_id", groups)
        rollouts = _union_rows(rollouts, siblings)
    members = sorted(set(rollout_ids) | set(rollouts.column("rollout_id").to_pylist()))
    ledger = read_filtered(plans["ledger"], "rollout_id", members)
    tokens = read_filtered(plans["tokens"], "rollout_id", members)
    seen = set(ledger.column("rollout_id").to_pylist()) | set(tokens.column("rollout_id").to_pylist()) \
        | set(rollouts.column("rollout_id").to_pylist())
    for rid in rollout_ids:
        if rid not in seen:
            raise InputError(f"rollout {rid!r} is in no table of the dataset", directory=data)
    return ledger, tokens, rollouts


def _not_an_output(root: Path) -> None:
    """A reassemble output given where a dataset belongs gets a message that says so."""
    is_output = any((root / f"{n}{ext}").exists() for n in ("report", "rows") for ext in ("", ".parquet"))
    if is_output and not (root / "ledger.parquet").exists() and not (root / "ledger").exists():
        raise InputError("this is a reassemble output, not a dataset: explain takes the dataset "
                         "reassemble read (DATA of `chainrows reassemble DATA OUT`)", directory=root)


def _union_rows(first: pa.Table, second: pa.Table) -> pa.Table:
    """The rows of ``second`` (a superset read in file order) when it holds every row of
    ``first``; rollouts rows whose group_id is null are only in ``first`` and are kept too."""
    null_group = first.filter(pc.is_null(first.column("group_id")))
    if null_group.num_rows == 0:
        return second
    return pa.concat_tables([second, null_group], promote_options="permissive")
