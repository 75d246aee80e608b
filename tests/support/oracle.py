"""The reference as the oracle of a CLI run: what ``chainrows.reference`` decides on the tables
as the reader returns them, compared row for row with the run's output, and reconciled. Shared by
the fuzz tests (tests/robustness/test_fuzz.py) and the fuzz campaign (tests/fuzz/)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

from chainrows import reference
from chainrows.formats.native.dataset import read_dataset
from chainrows.testing.reconcile import reconcile
from tests.support.compare import compare_outputs


def option_args(opts: dict) -> list[str]:
    args = ["--mode", opts["mode"], "--baseline", opts["baseline"],
            "--baseline-population", opts["baseline_population"], "--row-weight", opts["row_weight"]]
    if opts["placeholders"]:
        args.append("--placeholders")
    if opts["no_std"]:
        args.append("--no-std")
    return args


def oracle(dataset, opts: dict):
    """What the reference decides on the tables as the reader returns them."""
    ds = read_dataset(dataset) if isinstance(dataset, (str, os.PathLike)) else dataset
    return reference.reassemble(ds.ledger.to_pylist(), ds.tokens.to_pylist(), ds.rollouts.to_pylist(),
                                logprobs=ds.has_logprobs, **opts)


def check_against_oracle(ctx: str, dataset: Path, rows: pa.Table, report: pa.Table, opts: dict):
    ds = read_dataset(dataset)
    want_rows, want_report = oracle(ds, opts)
    compare_outputs(ctx, rows.to_pylist(), report.to_pylist(), want_rows, want_report)
    problems = reconcile(ds, rows, report)
    assert not problems, f"{ctx}\n" + "\n".join(problems)
