"""``chainrows explain`` on a dataset directory: the pruned read, --json, errors."""

from __future__ import annotations

import json
import re

import pyarrow.parquet as pq
import pytest

from chainrows import reassemble
from chainrows.cli import main
from chainrows.explanation.read import read_filtered
from chainrows.formats.native.dataset import plan_table
from chainrows.outdir.provenance import option_flags
from chainrows.reasons import FIXES, REASONS
from tests.support.paths import REPO


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("explain") / "data"
    assert main(["synth", str(out), "--rollouts", "120", "--seed", "11", "--corrupt-rate", "0.4"]) == 0
    return out


def test_json_objects_agree_with_reassemble(data, capsys):
    rows, report = reassemble(str(data))
    picked = report.slice(0, 40).to_pylist()
    capsys.readouterr()
    assert main(["explain", str(data), *[r["rollout_id"] for r in picked], "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(picked)
    for line, rep in zip(lines, picked):
        e = json.loads(line)
        assert {"rollout_id", "status", "reason", "detail", "calls", "rows"} <= set(e)
        assert (e["rollout_id"], e["status"], e["reason"], e["detail"]) == \
            (rep["rollout_id"], rep["status"], rep["reason"], rep["detail"])
        for c in e["calls"]:
            assert {"call_id", "parent_id", "selected", "chain"} <= set(c)
            assert isinstance(c["selected"], bool) and (c["chain"] is None or isinstance(c["chain"], int))
        mine = [r for r in rows.select(["rollout_id", "row_id", "call_ids"]).to_pylist()
                if r["rollout_id"] == rep["rollout_id"]]
        assert [(r["row_id"], r["call_ids"]) for r in e["rows"]] == [(r["row_id"], r["call_ids"]) for r in mine]


def test_the_tree_names_the_failed_check_and_its_fix(data, capsys):
    _, report = reassemble(str(data))
    masked = [r for r in report.to_pylist() if r["reason"] == "hash_mismatch"][:1]
    assert masked, "the synth seed must give a hash_mismatch rollout"
    rid = masked[0]["rollout_id"]
    capsys.readouterr()
    assert main(["explain", str(data), rid]) == 0
    out = capsys.readouterr().out
    assert f"rollout {rid}  masked  hash_mismatch" in out
    assert "expected: chain_hash 0x" in out and "(recomputed)" in out and "(recorded)" in out
    assert FIXES["hash_mismatch"] in out


@pytest.mark.parametrize("args, message", [
    (["NOPE"], "rollout 'NOPE' is in no table of the dataset"),
    (["r00000001", "--plan", "forest", "--mode", "ordinary"], "plan 'forest' applies to mode cc only"),
])
def test_bad_ids_and_options_exit_2_with_one_line(data, capsys, args, message):
    capsys.readouterr()
    try:
        rc = main(["explain", str(data), *args])
    except SystemExit as exc:  # a usage error ends in argparse's way
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_bad_data_exits_2_with_one_line(tmp_path, capsys):
    assert main(["explain", str(tmp_path / "missing"), "r1"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and err.count("\n") == 1


def test_the_read_keeps_only_the_asked_rollouts(data, tmp_path):
    ledger = pq.read_table(data / "ledger.parquet")
    ids = sorted(set(ledger.column("rollout_id").to_pylist()))[:3]
    got = read_filtered(plan_table(data, "ledger"), "rollout_id", ids)
    assert sorted(set(got.column("rollout_id").to_pylist())) == ids
    want = [r for r in ledger.to_pylist() if r["rollout_id"] in set(ids)]
    assert got.to_pylist() == want


def test_every_fix_is_its_docs_paragraph():
    text = (REPO / "docs" / "reasons.md").read_text()
    assert set(FIXES) == {r for r in REASONS if r}
    for code, fix in FIXES.items():
        section = text.split(f"## `{code}`\n", 1)[1].split("\n## ", 1)[0]
        paragraph = " ".join(section.split("**Fix.** ", 1)[1].split("\n\n", 1)[0].split())
        paragraph = re.sub(r"\[`?([^\]`]+)`?\]\(([^)#]+)(#[^)]*)?\)", lambda m: "docs/" + m.group(2), paragraph)
        assert fix == paragraph, code


def test_the_flags_a_summary_suggests_are_explains(data, capsys):
    """The untrained-tokens warning suggests ``chainrows explain DATA ROLLOUT_ID`` with the run's
    options as flags (chainrows.outdir.provenance.option_flags): explain takes every one."""
    flags = option_flags({"mode": "ordinary", "plan": "linear", "placeholders": True, "baseline": "loo",
                          "no_std": True, "baseline_population": "ok", "row_weight": "row"})
    capsys.readouterr()
    assert main(["explain", str(data), "r00000001", *flags, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mode"] == "ordinary"
