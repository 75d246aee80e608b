"""docs/calls.md: its worked example is run (import-calls, reassemble, both --on-drift values)
and must give exactly the import_report and the rows the page shows; its Python snippets run."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from chainrows.cli import main as cli_main

PAGE = Path(__file__).resolve().parents[2] / "docs" / "calls.md"


def _blocks(text: str) -> dict:
    """The ```jsonl blocks of the page, by the file name in the comment before each."""
    return dict(re.findall(r"<!-- file: (\S+) -->\n```jsonl\n(.*?)```", text, re.S))


def _table(text: str, marker: str) -> list[dict]:
    """The markdown table after ``<!-- marker -->``, as dicts of its cells."""
    body = text.split(f"<!-- {marker} -->\n", 1)[1]
    lines = [line for line in body.splitlines() if line.startswith("|")]
    lines = lines[:next((i for i, line in enumerate(lines[2:], 2) if not line.startswith("|")), len(lines))]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != len(head):
            break
        rows.append(dict(zip(head, cells)))
    return rows


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("calls-doc")
    for name, body in _blocks(PAGE.read_text()).items():
        (root / name).write_text(body)
    assert cli_main(["import-calls", str(root / "calls.jsonl"), str(root / "results.jsonl"), str(root / "data")]) == 0
    assert cli_main(["reassemble", str(root / "data"), str(root / "out")]) == 0
    return root


def _cell(value) -> str:
    if value is None:
        return ""
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def test_the_import_report_is_the_pages(example):
    shown = _table(PAGE.read_text(), "import_report")
    report = pq.read_table(example / "data" / "import_report.parquet").to_pylist()
    assert len(shown) == len(report) == 7
    for want, got in zip(shown, report):
        for column in ("call_id", "relation", "parent_id", "against_call", "diverge_at", "diverge_token",
                       "against_token"):
            assert want[column] == _cell(got[column]), (column, want, got)


def test_the_rows_are_the_pages(example):
    shown = _table(PAGE.read_text(), "rows")
    rows = pq.read_table(example / "out" / "rows").to_pylist()
    assert [{k: _cell(r[k]) for k in ("row_id", "call_ids", "input_ids", "loss_mask")} for r in rows] == shown


def test_on_drift_mask_masks_the_example_with_the_pages_detail(example):
    data, out = example / "masked-data", example / "masked-out"
    assert cli_main(["import-calls", str(example / "calls.jsonl"), str(example / "results.jsonl"), str(data),
                     "--on-drift", "mask"]) == 0
    assert cli_main(["reassemble", str(data), str(out)]) == 0
    (report,) = pq.read_table(out / "report.parquet").to_pylist()
    detail = " ".join(PAGE.read_text().split("masked instead, `hash_mismatch`: `", 1)[1].split("`", 1)[0].split())
    assert (report["status"], report["reason"], report["detail"]) == ("masked", "hash_mismatch", detail)


def test_the_python_snippets_run(example, monkeypatch, capsys):
    text = PAGE.read_text()
    snippets = re.findall(r"(<!-- not run[^>]*-->\n)?```python\n(.*?)```", text, re.S)
    run = [code for skip, code in snippets if not skip]
    assert len(run) == 2 and len(snippets) == 3
    monkeypatch.chdir(example)
    for code in run:
        exec(compile(code, str(PAGE), "exec"), {})
    out = capsys.readouterr().out
    assert "1 drifted calls in 1 rollouts" in out and "['first_root', 'child']" in out
