"""The import's kernels (chainrows.formats.calls) against the §8 oracle's hand cases
(tests/calls_cases.py): every case through the JSON Lines reader, and through the Arrow-table
API where a table can hold the case (every record declaring its parent, or none)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa
import pytest

from chainrows.formats.calls import import_calls
from chainrows.formats.calls.importer import Importer, concat
from chainrows.formats.calls.jsonl import read_jsonl
from chainrows.formats.calls.tables import LEDGER, REPORT, TOKENS
from tests.calls_cases import CALLS_CASES, check_calls_case
from tests.support.profiles import examples


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


@pytest.mark.parametrize("batch_rows", [4096, 1])
@pytest.mark.parametrize("case", TABLE_CASES, ids=[c.name for c in TABLE_CASES])
def test_case_arrow_table(case, batch_rows):
    res = import_calls(as_table(case.inputs()), on_drift=case.on_drift, batch_rows=batch_rows)
    check_calls_case(case, Out(res.ledger.to_pylist(), res.tokens.to_pylist(), res.import_report.to_pylist(),
                               res.summary.has_logprobs))


# --------------------------------------------------------------------------------------------
# Against the oracle on random call logs
# --------------------------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from chainrows.reference.calls import import_calls as reference_import  # noqa: E402
from tests.calls_cases import call_logs  # noqa: E402


def _same_as_reference(records: list, on_drift: str, tmp_path, batch_bytes: int) -> None:
    want = reference_import(records, on_drift=on_drift)
    got = import_via_jsonl(records, on_drift=on_drift, tmp_path=tmp_path, batch_bytes=batch_bytes)
    assert got.has_logprobs == want.has_logprobs
    assert got.report == want.report
    assert got.ledger == want.ledger
    assert got.tokens == want.tokens


@settings(max_examples=examples(3), suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(call_logs(), st.sampled_from(["root", "mask"]), st.sampled_from([1, 200, 1 << 20]))
def test_same_as_reference_on_small_logs(tmp_path, records, on_drift, batch_bytes):
    _same_as_reference(records, on_drift, tmp_path, batch_bytes)


@settings(max_examples=examples(0.6), suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(call_logs(max_records=40, vocabulary=4, max_new=8), st.sampled_from(["root", "mask"]))
def test_same_as_reference_on_longer_logs(tmp_path, records, on_drift):
    _same_as_reference(records, on_drift, tmp_path, 1 << 20)
