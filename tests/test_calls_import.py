"""The import's kernels (chainrows.formats.calls) against the §8 oracle's hand cases
(tests/calls_cases.py): every case through the JSON Lines reader, and through the Arrow-table
API where a table can hold the case (every record declaring its parent, or none)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa
import pytest

from chainrows.formats.calls.importer import Importer, concat, import_tables
from chainrows.formats.calls.jsonl import read_jsonl
from chainrows.formats.calls.tables import LEDGER, REPORT, TOKENS

from calls_cases import CALLS_CASES, check_calls_case  # tests/ on sys.path: conftest.py


@dataclass
class Out:
    ledger: list
    tokens: list
    report: list
    has_logprobs: bool


def import_via_jsonl(records: list, *, on_drift: str = "root", tmp_path=None, batch_bytes: int = 1 << 20) -> Out:
    """The records written as JSON Lines, read by the import's reader, decided by its kernels."""
    path = tmp_path / "calls.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    importer = Importer(on_drift)
    parts = {"ledger": [], "tokens": [], "report": []}
    for batch in read_jsonl(path, batch_bytes=batch_bytes):
        for name, table in zip(parts, importer.add(batch)):
            parts[name].append(table)
    tokens = concat(parts["tokens"], TOKENS)
    if not importer.summary.has_logprobs:
        tokens = tokens.drop_columns(["logprobs"])
    return Out(concat(parts["ledger"], LEDGER).to_pylist(), tokens.to_pylist(),
               concat(parts["report"], REPORT).to_pylist(), importer.summary.has_logprobs)


def as_table(records: list) -> pa.Table:
    """The records in the Parquet form (output_items as JSON text, parent_id a column)."""
    rows = []
    for r in records:
        row = dict(r)
        if "output_items" in row:
            row["output_items"] = None if row["output_items"] is None else json.dumps(row["output_items"])
        rows.append(row)
    names = list(dict.fromkeys(k for row in rows for k in row))  # from_pylist reads the first row's keys only
    return pa.table({k: [row.get(k) for row in rows] for k in names})


@pytest.mark.parametrize("case", CALLS_CASES, ids=[c.name for c in CALLS_CASES])
def test_case_jsonl(case, tmp_path):
    check_calls_case(case, import_via_jsonl(case.inputs(), on_drift=case.on_drift, tmp_path=tmp_path))


@pytest.mark.parametrize("case", CALLS_CASES, ids=[c.name for c in CALLS_CASES])
def test_case_one_record_per_batch(case, tmp_path):
    """State carried from batch to batch: every record in a batch of its own."""
    check_calls_case(case, import_via_jsonl(case.inputs(), on_drift=case.on_drift, tmp_path=tmp_path,
                                            batch_bytes=1))


TABLE_CASES = [c for c in CALLS_CASES if len({"parent_id" in r for r in c.records}) == 1]


@pytest.mark.parametrize("case", TABLE_CASES, ids=[c.name for c in TABLE_CASES])
def test_case_arrow_table(case):
    res = import_tables(as_table(case.inputs()), on_drift=case.on_drift)
    check_calls_case(case, Out(res.ledger.to_pylist(), res.tokens.to_pylist(), res.import_report.to_pylist(),
                               res.summary.has_logprobs))
