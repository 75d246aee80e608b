"""``chainrows import-calls`` end to end (SPEC §8): round trips through a call log, the same
bytes on every path (JSON Lines or Parquet, one pass or bucketed), bad input refused with one
line naming file, line or row and field, and nothing written when a run fails."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chainrows.cli import main as cli_main
from chainrows.formats.calls.export import export_calls, write_calls_jsonl, write_results_jsonl
from chainrows.formats.native.dataset import read_dataset
from chainrows.runners.calls import job


def _files(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _run(capsys, *argv) -> tuple[int, str]:
    rc = cli_main([str(a) for a in argv])
    return rc, capsys.readouterr().err


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> dict:
    """A consistent synthetic dataset with workers and forks, and its call log in every form."""
    root = tmp_path_factory.mktemp("calls")
    assert cli_main(["synth", str(root / "ds"), "--rollouts", "160", "--seed", "11", "--corrupt-rate", "0",
                     "--worker-rate", "0.15", "--fork-rate", "0.15"]) == 0
    ds = read_dataset(root / "ds")
    inferred = export_calls(ds.ledger, ds.tokens)
    declared = export_calls(ds.ledger, ds.tokens, declare_parents=True)
    pq.write_table(inferred, root / "calls.parquet", row_group_size=97)
    pq.write_table(declared, root / "declared.parquet")
    folder = root / "calls_dir"
    folder.mkdir()
    for i, start in enumerate(range(0, inferred.num_rows, 400)):
        pq.write_table(inferred.slice(start, 400), folder / f"part-{i:03d}.parquet")
    write_calls_jsonl(inferred, root / "calls.jsonl")
    with open(root / "calls.jsonl", "rb") as src, gzip.open(root / "calls.jsonl.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    write_results_jsonl(root / "results.jsonl", ds.rollouts)
    return {"root": root, "ds": root / "ds", "results": root / "results.jsonl",
            "parquet": root / "calls.parquet", "declared": root / "declared.parquet", "dir": folder,
            "jsonl": root / "calls.jsonl", "gz": root / "calls.jsonl.gz"}


@pytest.fixture(scope="module")
def imported(logs) -> Path:
    out = logs["root"] / "imported"
    assert cli_main(["import-calls", str(logs["parquet"]), str(logs["results"]), str(out)]) == 0
    return out


@pytest.mark.slow
@pytest.mark.parametrize("options", [[], ["--mode", "ordinary"], ["--plan", "forest"]])
@pytest.mark.parametrize("form", ["parquet", "declared"])
def test_round_trip_gives_the_original_rows_and_report(logs, tmp_path, options, form):
    out = tmp_path / "imp"
    assert cli_main(["import-calls", str(logs[form]), str(logs["results"]), str(out)]) == 0
    assert cli_main(["reassemble", str(logs["ds"]), str(tmp_path / "a"), *options]) == 0
    assert cli_main(["reassemble", str(out), str(tmp_path / "b"), *options]) == 0
    for name in ("rows", "report.parquet"):
        assert pq.read_table(tmp_path / "a" / name).equals(pq.read_table(tmp_path / "b" / name)), name


@pytest.mark.slow
@pytest.mark.parametrize("form", ["jsonl", "gz", "dir"])
def test_every_form_of_the_log_gives_the_same_bytes(logs, imported, tmp_path, form):
    out = tmp_path / "imp"
    assert cli_main(["import-calls", str(logs[form]), str(logs["results"]), str(out)]) == 0
    assert _files(out) == _files(imported)


@pytest.mark.parametrize("buckets", [2, 7])
def test_bucketed_gives_the_same_bytes(logs, imported, tmp_path, buckets, capsys):
    out = tmp_path / "imp"
    rc, _ = _run(capsys, "import-calls", logs["jsonl"], logs["results"], out, "--buckets", buckets)
    assert rc == 0
    assert _files(out) == _files(imported)


def test_state_outgrowing_its_allowance_goes_bucketed_with_the_same_bytes(logs, imported, tmp_path,
                                                                           monkeypatch, capsys):
    monkeypatch.setattr(job.Plan, "of", classmethod(lambda cls, *_: cls(1 << 20, 1 << 20, 200_000)))
    out = tmp_path / "imp"
    rc = cli_main(["import-calls", str(logs["parquet"]), str(logs["results"]), str(out)])
    summary = capsys.readouterr().out
    assert rc == 0
    assert "buckets of rollouts (the rollouts' state would reach" in summary
    assert _files(out) == _files(imported)
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


# ----------------------------------------------------------------------------- bad input

GOOD = {"rollout_id": "r", "call_id": "c1", "prompt_ids": [1, 2], "completion_ids": [3],
        "completion_logprobs": [-0.5], "output_items": []}
RESULTS = [{"rollout_id": "r", "group_id": "g", "reward": 1.0, "output": []}]


def _write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


BAD_LINES = [
    ({**GOOD, "rollout_id": 7}, "field 'rollout_id' must be a string, got the number 7"),
    ({k: v for k, v in GOOD.items() if k != "call_id"}, "field 'call_id' is missing"),
    ({k: v for k, v in GOOD.items() if k != "prompt_ids"}, "field 'prompt_ids' is missing"),
    ({**GOOD, "prompt_ids": "1 2"}, "field 'prompt_ids' must be an array of integers"),
    ({**GOOD, "prompt_ids": [1, 2.5]}, "field 'prompt_ids' entry 1 must be an integer"),
    ({**GOOD, "prompt_ids": [1, 1 << 31]}, "field 'prompt_ids' entry 1 (2147483648) is outside the int32 range"),
    ({**GOOD, "completion_ids": [], "completion_logprobs": []}, "field 'completion_ids' must hold at least 1 token"),
    ({**GOOD, "completion_ids": None}, "field 'completion_ids' must be an array of integers, got null"),
    ({**GOOD, "completion_logprobs": [-0.5, -1.0]}, "field 'completion_logprobs' has 2 entries, completion_ids 1"),
    ({**GOOD, "completion_logprobs": ["x"]}, "field 'completion_logprobs' entry 0 must be a number"),
    ({**GOOD, "output_items": {"type": "message"}}, "field 'output_items' must be an array of item objects"),
    ({**GOOD, "output_items": [{"role": "assistant", "x": float("nan")}]}, "field 'output_items' cannot be fingerprinted"),
    ({**GOOD, "parent_id": 3}, "field 'parent_id' must be a string or null"),
    ({**GOOD, "failed": "no"}, "field 'failed' must be true or false"),
    ({**GOOD, "response_id": ["a"]}, "field 'response_id' must be a string or null"),
    ('{"rollout_id": "r", ', "invalid JSON"),
    ("[1, 2]", "expected a JSON object"),
]


@pytest.mark.parametrize("bad,message", BAD_LINES, ids=[m.split(" ")[1] + str(i) for i, (_, m) in enumerate(BAD_LINES)])
def test_a_malformed_line_is_one_line_naming_file_line_and_field_and_nothing_is_written(tmp_path, capsys, bad, message):
    calls = _write_jsonl(tmp_path / "calls.jsonl", [GOOD, {**GOOD, "call_id": "c0"}, bad])
    results = _write_jsonl(tmp_path / "results.jsonl", RESULTS)
    out = tmp_path / "out"
    rc, err = _run(capsys, "import-calls", calls, results, out)
    assert rc == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"calls: line 3: {message}" in err, err
    assert f"(file {calls})" in err
    assert not out.exists()


BAD_COLUMNS = [
    (lambda t: t.drop_columns(["prompt_ids"]), "calls: missing column 'prompt_ids'"),
    (lambda t: t.set_column(t.schema.get_field_index("prompt_ids"), "prompt_ids",
                            pa.array(["x"] * t.num_rows)), "calls: column 'prompt_ids' has type string"),
    (lambda t: t.set_column(t.schema.get_field_index("call_id"), "call_id",
                            pa.array(["a", None, "c"])), "calls: column 'call_id' is null: row 1 (0-based, rollout 'r')"),
    (lambda t: t.set_column(t.schema.get_field_index("completion_ids"), "completion_ids",
                            pa.array([[1], [1 << 40], [2]], pa.list_(pa.int64()))),
     "calls: column 'completion_ids' has a token outside the int32 range: row 1 (0-based, rollout 'r')"),
    (lambda t: t.set_column(t.schema.get_field_index("completion_ids"), "completion_ids",
                            pa.array([[1], [], [2]], pa.list_(pa.int32()))),
     "calls: column 'completion_ids' is empty: a call generates at least one token: row 1"),
    (lambda t: t.set_column(t.schema.get_field_index("output_items"), "output_items",
                            pa.array(["[]", "[", "[]"])), "calls: column 'output_items' is not valid JSON"),
    (lambda t: t.set_column(t.schema.get_field_index("completion_logprobs"), "completion_logprobs",
                            pa.array([[0.5], [0.5, 0.5], [0.5]], pa.list_(pa.float32()))),
     "calls: column 'completion_logprobs' is not of the length of completion_ids: row 1"),
]


@pytest.mark.parametrize("damage,message", BAD_COLUMNS, ids=[str(i) for i in range(len(BAD_COLUMNS))])
def test_a_malformed_parquet_log_is_one_line_naming_file_column_and_row(tmp_path, capsys, damage, message):
    rows = [dict(GOOD, call_id=f"c{i}", output_items="[]") for i in range(3)]
    table = damage(pa.Table.from_pylist(rows))
    pq.write_table(table, tmp_path / "calls.parquet")
    results = _write_jsonl(tmp_path / "results.jsonl", RESULTS)
    rc, err = _run(capsys, "import-calls", tmp_path / "calls.parquet", results, tmp_path / "out")
    assert rc == 2 and err.count("\n") == 1, err
    assert message in err and f"(file {tmp_path / 'calls.parquet'})" in err, err
    assert not (tmp_path / "out").exists()


def test_a_log_that_is_neither_format_is_refused(tmp_path, capsys):
    (tmp_path / "calls.bin").write_bytes(b"\x00\x01binary")
    results = _write_jsonl(tmp_path / "results.jsonl", RESULTS)
    rc, err = _run(capsys, "import-calls", tmp_path / "calls.bin", results, tmp_path / "out")
    assert rc == 2 and "not a call log" in err


def test_an_interrupt_leaves_nothing_and_exits_130(logs, tmp_path, monkeypatch, capsys):
    from chainrows.formats.calls import importer

    seen = []
    real = importer.Importer.add

    def add(self, batch):
        seen.append(1)
        if len(seen) == 3:  # the first is the kernels' warm-up: the second batch of the log
            raise KeyboardInterrupt
        return real(self, batch)

    monkeypatch.setattr(importer.Importer, "add", add)
    monkeypatch.setattr(job.Plan, "of", classmethod(lambda cls, *_: cls(1 << 16, 1 << 20, 1 << 40)))
    out = tmp_path / "out"
    rc = cli_main(["import-calls", str(logs["jsonl"]), str(logs["results"]), str(out)])
    assert rc == 130 and len(seen) == 3
    assert not out.exists()
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    seen.clear()
    assert cli_main(["import-calls", str(logs["jsonl"]), str(logs["results"]), str(out)]) == 130
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_a_complete_output_is_refused_without_overwrite(logs, tmp_path, capsys):
    out = tmp_path / "out"
    assert _run(capsys, "import-calls", logs["parquet"], logs["results"], out)[0] == 0
    rc, err = _run(capsys, "import-calls", logs["parquet"], logs["results"], out)
    assert rc == 2 and "already holds a complete result (rollouts.parquet)" in err
    assert _run(capsys, "import-calls", logs["parquet"], logs["results"], out, "--overwrite")[0] == 0


def test_no_logprobs_anywhere_writes_no_logprobs_column(tmp_path, capsys):
    recs = [{k: v for k, v in GOOD.items() if k != "completion_logprobs"},
            {**{k: v for k, v in GOOD.items() if k != "completion_logprobs"}, "call_id": "c2",
             "prompt_ids": [1, 2, 3, 4], "completion_logprobs": None}]
    calls = _write_jsonl(tmp_path / "calls.jsonl", recs)
    results = _write_jsonl(tmp_path / "results.jsonl", RESULTS)
    rc, _ = _run(capsys, "import-calls", calls, results, tmp_path / "out")
    assert rc == 0
    tokens = pq.read_table(tmp_path / "out" / "tokens")
    assert tokens.column_names == ["rollout_id", "call_id", "tokens"]
    assert tokens.column("tokens").to_pylist() == [[1, 2, 3], [4, 3]]
    report = pq.read_table(tmp_path / "out" / "import_report.parquet").to_pylist()
    assert [r["relation"] for r in report] == ["first_root", "child"]


def test_the_summary_names_drift_places_with_their_tokens(tmp_path, capsys):
    recs = [dict(GOOD, prompt_ids=[1, 2], completion_ids=[3, 4], completion_logprobs=[-1.0, -1.0]),
            dict(GOOD, call_id="c2", prompt_ids=[1, 2, 3, 9, 5], completion_ids=[6], completion_logprobs=[-1.0])]
    calls = _write_jsonl(tmp_path / "calls.jsonl", recs)
    results = _write_jsonl(tmp_path / "results.jsonl", RESULTS)
    rc = cli_main(["import-calls", str(calls), str(results), str(tmp_path / "out")])
    text = capsys.readouterr().out
    assert rc == 0
    assert "rollouts with drift      1" in text
    assert "rollout r call c2 drifted from c1 at token 3: prompt has 9, c1 had 4" in text


# ----------------------------------------------------------------------------- memory budget

@pytest.fixture(scope="module")
def big_log(tmp_path_factory) -> dict:
    """A JSON Lines call log of over 2 GiB (prompts of 4k-32k tokens, 20-200 calls a rollout,
    rollouts interleaved) and the same log as Parquet."""
    from asv_benchmarks.call_logs import write_call_log

    root = tmp_path_factory.mktemp("big")
    jsonl, results = write_call_log(root / "j", 1600 << 20, seed=5, fmt="jsonl")
    parquet, _ = write_call_log(root / "p", 1600 << 20, seed=5, fmt="parquet")
    return {"jsonl": jsonl, "parquet": parquet, "results": results, "root": root}


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_a_log_four_times_the_budget_imports_under_it_with_the_same_bytes(big_log):
    from tests.support.peaks import peak_run

    root = big_log["root"]
    # the unbounded run also warms Numba's on-disk cache: a cold compile inflates the baseline the
    # process measures (a one-time cost, not data memory), and with it the smallest budget
    rc, _, _ = peak_run("import-calls", big_log["jsonl"], big_log["results"], root / "unbounded")
    assert rc == 0
    rc, _, refused = peak_run("import-calls", big_log["jsonl"], big_log["results"], root / "no",
                              "--memory-budget", "1MiB")
    smallest = int(refused.stderr.strip().rsplit(" is ", 1)[1].split()[0].replace(",", ""))
    budget = max(512, smallest + 16) << 20
    assert big_log["jsonl"].stat().st_size >= 4 * budget, (big_log["jsonl"].stat().st_size, budget)
    rc, peak, res = peak_run("import-calls", big_log["jsonl"], big_log["results"], root / "bounded",
                             "--memory-budget", f"{budget >> 20}MiB")
    assert rc == 0, res.stderr
    assert peak < budget, f"peak RSS {peak >> 20} MiB over the {budget >> 20} MiB budget\n{res.stdout}"
    assert _files(root / "bounded") == _files(root / "unbounded")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_the_smallest_budget_holds_on_a_parquet_log_that_must_go_bucketed(big_log):
    from tests.support.peaks import at_smallest_budget

    root = big_log["root"]
    budget, peak, res = at_smallest_budget("import-calls", [big_log["parquet"], big_log["results"]], root / "small")
    assert "buckets of rollouts" in res.stdout, res.stdout
    assert peak < budget << 20, f"peak RSS {peak >> 20} MiB over the {budget} MiB budget\n{res.stdout}"
    out = next(p for p in (root / "small").iterdir() if p.name.startswith("out"))
    assert _files(out) == _files(root / "unbounded")


def test_a_malformed_results_file_is_refused_and_nothing_is_written(logs, tmp_path, capsys):
    """The results file is read beside the log: its error still stops the import with one line
    naming it, and no dataset is written."""
    results = tmp_path / "results.jsonl"
    results.write_text(logs["results"].read_text().splitlines()[0] + "\n" + '{"rollout_id": 5}\n')
    out = tmp_path / "out"
    rc, err = _run(capsys, "import-calls", logs["parquet"], results, out)
    assert rc == 2 and err.count("\n") == 1, err
    assert "results: line 2: field 'rollout_id' must be a string" in err and f"(file {results})" in err
    assert not out.exists()
