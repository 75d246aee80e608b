"""Writing a SPEC §2 dataset: the three tables as ``<name>.parquet`` files, plainly or all or
nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

from chainrows.outdir.atomic import AtomicOutput
from chainrows.outdir.parquet import write_parquet


def write_dataset(dataset_dir: str | os.PathLike, ledger: pa.Table, tokens: pa.Table,
                  rollouts: pa.Table) -> Path:
    """Write a SPEC §2 dataset as ``ledger.parquet``, ``tokens.parquet``, ``rollouts.parquet``
    (not atomic; for tests, the synthesizer and the JSONL importer)."""
    root = Path(dataset_dir)
    root.mkdir(parents=True, exist_ok=True)
    for name, table in (("ledger", ledger), ("tokens", tokens), ("rollouts", rollouts)):
        write_parquet(root / f"{name}.parquet", table)
    return root


def write_dataset_atomic(dataset_dir: str | os.PathLike, ledger: pa.Table, tokens: pa.Table,
                         rollouts: pa.Table) -> Path:
    """:func:`write_dataset`, all or nothing: the three files appear together (via
    :class:`AtomicOutput`; earlier ``<name>.parquet`` or ``<name>/`` tables are replaced)."""
    root = Path(dataset_dir)
    with AtomicOutput(root, names=("ledger", "tokens", "rollouts")) as out:
        for name, table in (("ledger", ledger), ("tokens", tokens), ("rollouts", rollouts)):
            out.write_table(name, table)
    return root
