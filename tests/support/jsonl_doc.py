"""docs/jsonl.md's example files, for the importers' and the CLI's tests."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.paths import DOCS

DOC = DOCS / "jsonl.md"


def doc_files(tmp_path: Path) -> dict[str, Path]:
    """The example blocks of docs/jsonl.md, written to files."""
    text = DOC.read_text()
    out = {}
    for name, body in re.findall(r"<!-- file: (\w+)\.jsonl -->\n```jsonl\n(.*?)```", text, re.S):
        out[name] = tmp_path / f"{name}.jsonl"
        out[name].write_text(body)
    assert sorted(out) == ["ledger", "results", "tokens"]
    return out
