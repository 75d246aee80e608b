"""The user docs stay true: docs/format.md's examples run and pass, docs/reasons.md covers every
reason code, docs/trainers.md's loss snippet runs, `python -m chainrows` works."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chainrows
from chainrows import reasons
from chainrows.errors import InputError
from chainrows.formats.items import canonical_json
from chainrows.formats.native.dataset import read_dataset
from chainrows.reference import chain_hash as reference_chain_hash
from tests.support.paths import REPO

ROOT = REPO
DOCS = ROOT / "docs"


def marked_blocks(doc: Path) -> dict[str, str]:
    """The ```python blocks preceded by a ``<!-- docs-test: NAME -->`` line, by NAME."""
    text = doc.read_text(encoding="utf-8")
    found = re.findall(r"<!-- docs-test: ([\w-]+) -->\n```python\n(.*?)\n```", text, re.S)
    blocks = dict(found)
    assert len(blocks) == len(found), f"duplicate docs-test names in {doc.name}"
    return blocks


def run_block(code: str, cwd: Path) -> None:
    """Run a doc block as a user would: a fresh interpreter, in its own directory."""
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr


def test_format_blocks_are_marked():
    assert set(marked_blocks(DOCS / "format.md")) == {"chain-hash", "write-dataset"}


def test_format_chain_hash_snippet_matches_the_project():
    ns: dict = {}
    exec(marked_blocks(DOCS / "format.md")["chain-hash"], ns)
    root = reference_chain_hash([1, 2, 3, 4, 10, 11], 0)
    assert ns["root"] == root
    assert ns["child"] == reference_chain_hash([5, 6, 12, 13, 14], root)
    assert ns["child"] != reference_chain_hash([5, 6, 12, 13, 14], 0)  # the seed matters


def test_format_canonical_json_example_is_exact():
    text = (DOCS / "format.md").read_text(encoding="utf-8")
    item_src = re.search(r"\nitem = (\{.*?\})\n", text, re.S).group(1)
    shown = re.search(r"canonical_json\(item\)\s+# '(.*?)'\n", text).group(1)
    assert canonical_json(eval(item_src)) == shown


@pytest.mark.slow
def test_format_example_dataset_passes_reassemble(tmp_path):
    run_block(marked_blocks(DOCS / "format.md")["write-dataset"], tmp_path)
    data = tmp_path / "my-dataset"
    assert sorted(p.name for p in data.iterdir()) == ["ledger.parquet", "rollouts.parquet",
                                                      "tokens.parquet"]
    rows, report = chainrows.reassemble(str(data))
    assert report.column("status").to_pylist() == ["ok", "ok"]
    got = {r["row_id"]: r for r in rows.to_pylist()}
    assert sorted(got) == ["r1_s0", "r2_s0", "r2_s1"]
    # The tokens the doc promises, from the deltas written in the example.
    assert got["r1_s0"]["input_ids"] == [101, 102, 103, 104, 11, 12, 201, 202, 13, 14, 15]
    assert got["r1_s0"]["loss_mask"] == [0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    assert got["r1_s0"]["logprobs"] == pytest.approx([0, 0, 0, 0, -0.5, -0.25, 0, 0, -0.1, -0.2, -0.3])
    assert got["r2_s0"]["input_ids"] == [101, 102, 103, 104, 21, 22]
    assert got["r2_s1"]["input_ids"] == [101, 401, 402, 24, 25, 26]
    assert got["r2_s1"]["loss_mask"] == [0, 0, 0, 1, 1, 1]
    assert got["r2_s0"]["call_ids"] == ["c3"] and got["r2_s1"]["call_ids"] == ["c5"]
    assert [got[k]["weight"] for k in ("r1_s0", "r2_s0", "r2_s1")] == [1.0, 0.5, 0.5]
    std = np.std([1.0, 0.0], ddof=1)
    assert got["r1_s0"]["advantage"] == pytest.approx(0.5 / (std + 1e-6), rel=1e-6)
    assert got["r2_s1"]["advantage"] == pytest.approx(-0.5 / (std + 1e-6), rel=1e-6)
    _, ordinary = chainrows.reassemble(str(data), mode="ordinary")
    assert ordinary.column("reason").to_pylist() == [None, "multiple_roots"]

    # The CLI on the same dataset: exit 0 and the same rows on disk.
    out = subprocess.run([sys.executable, "-m", "chainrows", "reassemble", str(data),
                          str(tmp_path / "my-out")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    written = pq.read_table(tmp_path / "my-out" / "rows")
    assert written.column("input_ids").to_pylist() == rows.column("input_ids").to_pylist()


def test_inferred_types_are_refused_as_the_doc_says(tmp_path):
    """format.md: pyarrow infers list<int64>/list<double> from Python lists; both are refused."""
    run_block(marked_blocks(DOCS / "format.md")["write-dataset"], tmp_path)
    data = tmp_path / "my-dataset"
    tokens = pq.read_table(data / "tokens.parquet")
    inferred = pa.table({c: tokens.column(c).to_pylist() for c in tokens.column_names})
    assert inferred.schema.field("tokens").type == pa.list_(pa.int64())
    assert inferred.schema.field("logprobs").type == pa.list_(pa.float64())
    pq.write_table(inferred, data / "tokens.parquet")
    with pytest.raises(InputError, match="'tokens' has type list<int64>, expected list<int32>"):
        read_dataset(data)
    pq.write_table(inferred.set_column(2, "tokens", tokens.column("tokens")), data / "tokens.parquet")
    with pytest.raises(InputError, match="'logprobs' has type list<double>, expected list<float>"):
        read_dataset(data)
    text = (DOCS / "format.md").read_text(encoding="utf-8")
    assert "list<int64>" in text and "list<double>" in text


def _reason_sections(text: str) -> dict[str, str]:
    """``## `code` `` sections of docs/reasons.md, by code."""
    parts = re.split(r"^## `(\w+)`[^\n]*\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_reasons_doc_covers_every_code():
    sections = _reason_sections((DOCS / "reasons.md").read_text(encoding="utf-8"))
    codes = [r for r in reasons.REASONS if r]
    assert sorted(sections) == sorted(set(codes))  # every code, nothing invented
    for code, body in sections.items():
        for part in ("**What happened.**", "**Usual cause.**", "**Fix.**"):
            assert part in body, (code, part)


def test_reasons_doc_quotes_every_detail_message():
    text = (DOCS / "reasons.md").read_text(encoding="utf-8")
    sections = _reason_sections(text)
    for reason, message, _ in reasons.DETAILS[1:]:
        assert f"`{message}" in sections[reason], (reason, message)


def test_trainers_loss_snippet_runs_on_real_batches(tmp_path):
    from chainrows.synth import write_synth_dataset

    write_synth_dataset(tmp_path / "ds", 12, seed=2, mean_gen_tokens=20, mean_obs_tokens=10,
                        prompt_tokens=30, corrupt_rate=0.0)
    rows, _ = chainrows.reassemble(str(tmp_path / "ds"))
    (tmp_path / "OUT" / "rows").mkdir(parents=True)  # as reassemble writes it: a directory of parts
    pq.write_table(rows.slice(0, 5), tmp_path / "OUT" / "rows" / "part-00000000.parquet")
    pq.write_table(rows.slice(5), tmp_path / "OUT" / "rows" / "part-00000001.parquet")
    blocks = marked_blocks(DOCS / "trainers.md")
    assert set(blocks) == {"numpy-loss", "packed-loss"}  # padded, and packed with cu_seqlens
    import os

    # With new == old logprobs the ratio is 1: the loss is -sum(weight * advantage) / rollouts.
    expected = -sum(r["weight"] * r["advantage"] for r in rows.to_pylist()) / len(
        set(rows.column("rollout_id").to_pylist()))
    cwd = os.getcwd()
    for name, block in blocks.items():
        ns: dict = {}
        try:
            os.chdir(tmp_path)
            exec(block, ns)
        finally:
            os.chdir(cwd)
        assert ns["loss"] == pytest.approx(expected, rel=1e-5, abs=1e-6), name


def test_python_dash_m_chainrows():
    out = subprocess.run([sys.executable, "-m", "chainrows", "--help"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "reassemble" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "chainrows", "no-such-command"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2


def test_integrity_error_column_masks_what_format_md_says(tmp_path):
    """format.md: a non-null ledger.integrity_error fails check 14 for a call a chain trains
    (the text in the detail); on the rejected retry c4 it masks nothing."""
    run_block(marked_blocks(DOCS / "format.md")["write-dataset"], tmp_path)
    data = tmp_path / "my-dataset"
    ledger = pq.read_table(data / "ledger.parquet")
    assert ledger.column("call_id").to_pylist() == ["c1", "c2", "c3", "c4", "c5"]
    for flagged, want in ((["c4"], ["ok", "ok"]), (["c4", "c5"], ["ok", "masked"])):
        column = pa.array([f"digest differs at {c}" if c in flagged else None
                           for c in ledger.column("call_id").to_pylist()], pa.string())
        pq.write_table(ledger.append_column("integrity_error", column), data / "ledger.parquet")
        _, report = chainrows.reassemble(str(data))
        assert report.column("status").to_pylist() == want
    assert report.column("reason").to_pylist() == [None, "hash_mismatch"]
    assert report.column("detail").to_pylist()[1] == "integrity_error is set: call c5: digest differs at c5"
    assert "`integrity_error is set: call <call_id>: <text>`" in (DOCS / "format.md").read_text(encoding="utf-8")


# Links of every page (README and docs/*.md) are checked in tests/docs/test_docs_cite.py.
