"""The CLI's exit codes and error lines (SPEC §7): exit 0 when it ran (masked rollouts
included), exit 2 with exactly one line on stderr for unusable input, bad arguments or an
output it may not write (permission); exit 1 with one line when the machine runs out of memory,
disk or stdout; never a traceback, never a partial or damaged output.

Most cases run through the ``cli`` worker of test_fuzz.py (``chainrows.cli.main`` in a
long-lived child process, fds 1/2 captured); a few run the real ``python -m chainrows.cli``.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chainrows.cli import main as cli_main
from chainrows.memory.process import HUGE_PAGES_ENV, NoPandas
from tests.support.cli_worker import (  # noqa: F401  (cli is a fixture)
    assert_clean_error,
    assert_ran,
    cli,
    without_compile_notice,
)
from tests.support.outputs import OUTPUT_ENTRIES, no_outputs, output_bytes, read_output
from tests.support.paths import REPO
from tests.support.tables import invalid_utf8, set_column, small_tables, write_dir, write_encrypted


@pytest.fixture
def good(tmp_path) -> Path:
    return write_dir(tmp_path / "data", small_tables())


def _one_line(res) -> str:
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and res.stderr.endswith("\n"), f"stderr is not exactly one line:\n{res}"
    assert "Traceback" not in res.stderr
    return lines[0]


# ----------------------------------------------------------------------------- runs

def test_ok_run(cli, good, tmp_path):
    res = cli.run("reassemble", good, tmp_path / "out")
    assert_ran(res)
    assert "rollouts" in res.stdout and "3" in res.stdout
    rows, report = read_output(tmp_path / "out")
    assert report.column("status").to_pylist() == ["ok", "ok", "ok"]
    assert rows.num_rows == 4  # wx has two chains


def test_masked_rollouts_still_exit_0(cli, tmp_path):
    t = small_tables()
    t["ledger"] = set_column(t["ledger"], "failed", pa.array([True] * t["ledger"].num_rows))
    res = cli.run("reassemble", write_dir(tmp_path / "data", t), tmp_path / "out")
    assert_ran(res)
    _, report = read_output(tmp_path / "out")
    assert set(report.column("reason").to_pylist()) == {"capture_failed"}


@pytest.mark.parametrize("table", ["ledger", "tokens", "rollouts"])
def test_ids_only_in_one_table(cli, tmp_path, table):
    """Tables that disagree are data, not an error: the stray rollout is reported, the others run."""
    t = small_tables()
    extra = {
        "ledger": dict(rollout_id="stray", call_id="c1", parent_id=None, response_id="r1",
                       prev_len=0, delta_len=1, gen_len=1, chain_hash=0, item_keys=[1],
                       item_ids=None, failed=False),
        "tokens": dict(rollout_id="stray", call_id="c1", tokens=[1, 2], logprobs=[0.0, -1.0]),
        "rollouts": dict(rollout_id="stray", group_id="g", reward=1.0, output_keys=[1],
                         output_ids=None, terminal_response_id=None),
    }[table]
    t[table] = pa.concat_tables([t[table], pa.Table.from_pylist([extra], schema=t[table].schema)])
    res = cli.run("reassemble", write_dir(tmp_path / "data", t), tmp_path / "out")
    assert_ran(res)
    _, report = read_output(tmp_path / "out")
    by_id = {r["rollout_id"]: r for r in report.to_pylist()}
    want = "no_calls" if table == "rollouts" else "no_rollout_record"
    assert by_id["stray"]["status"] == "masked" and by_id["stray"]["reason"] == want
    assert [by_id[k]["status"] for k in ("wx", "sc", "solo")] == ["ok"] * 3


# ----------------------------------------------------------------------------- unusable input

def test_missing_dataset_dir(cli, tmp_path):
    res = cli.run("reassemble", tmp_path / "nope", tmp_path / "out")
    assert_clean_error(res, "nope", "does not exist")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_dataset_is_a_file(cli, tmp_path):
    (tmp_path / "f").write_text("x")
    assert_clean_error(cli.run("reassemble", tmp_path / "f", tmp_path / "out"), "not a directory")


@pytest.mark.parametrize("table", ["ledger", "tokens", "rollouts"])
def test_missing_table(cli, good, tmp_path, table):
    (good / f"{table}.parquet").unlink()
    res = cli.run("reassemble", good, tmp_path / "out")
    assert_clean_error(res, f"error: {table}: table not found", str(good))


@pytest.mark.parametrize("table,column", [
    ("ledger", "rollout_id"), ("ledger", "parent_id"), ("ledger", "chain_hash"),
    ("ledger", "failed"), ("ledger", "item_ids"), ("tokens", "call_id"), ("tokens", "tokens"),
    ("rollouts", "reward"), ("rollouts", "output_keys"), ("rollouts", "terminal_response_id"),
])
def test_missing_column(cli, tmp_path, table, column):
    t = small_tables()
    t[table] = t[table].drop_columns([column])
    data = write_dir(tmp_path / "data", t)
    res = cli.run("reassemble", data, tmp_path / "out")
    assert_clean_error(res, f"error: {table}: missing column {column!r}",
                       str(data / f"{table}.parquet"))


@pytest.mark.parametrize("table,column,array,found", [
    ("ledger", "delta_len", pa.array([1.0] * 10), "double"),
    ("ledger", "prev_len", pa.array(["0"] * 10), "string"),
    ("ledger", "chain_hash", pa.array([1] * 10, pa.int64()), "int64"),
    ("ledger", "failed", pa.array([0] * 10, pa.int8()), "int8"),
    ("ledger", "call_id", pa.array([b"c"] * 10, pa.binary()), "binary"),
    ("ledger", "item_keys", pa.array([[1]] * 10, pa.list_(pa.int64())), "list<int64>"),
    ("tokens", "tokens", pa.array([[1]] * 10, pa.list_(pa.int64())), "list<int64>"),
    ("tokens", "logprobs", pa.array([[0.0]] * 10, pa.list_(pa.float64())), "list<double>"),
    ("rollouts", "reward", pa.array([1.0] * 3, pa.float32()), "float"),
    ("rollouts", "output_keys", pa.array([["x"]] * 3), "list<string>"),
])
def test_wrong_type(cli, tmp_path, table, column, array, found):
    t = small_tables()
    t[table] = set_column(t[table], column, array[: t[table].num_rows])
    data = write_dir(tmp_path / "data", t)
    res = cli.run("reassemble", data, tmp_path / "out")
    assert_clean_error(res, f"error: {table}: column {column!r} has type {found}, expected",
                       str(data / f"{table}.parquet"))


@pytest.mark.parametrize("table,column", [("ledger", "delta_len"), ("ledger", "failed"),
                                          ("tokens", "call_id"), ("rollouts", "rollout_id")])
def test_null_in_required_column(cli, tmp_path, table, column):
    t = small_tables()
    values = t[table].column(column).to_pylist()
    values[1] = None
    t[table] = set_column(t[table], column, pa.array(values, t[table].schema.field(column).type))
    data = write_dir(tmp_path / "data", t)
    res = cli.run("reassemble", data, tmp_path / "out")
    assert_clean_error(res, f"error: {table}: column {column!r} has a null value",
                       "first at row 1 (0-based", str(data / f"{table}.parquet"))


def test_uint64_length_above_int64(cli, tmp_path):
    t = small_tables()
    vals = t["ledger"].column("delta_len").to_pylist()
    vals[2] = 2**63
    t["ledger"] = set_column(t["ledger"], "delta_len", pa.array(vals, pa.uint64()))
    res = cli.run("reassemble", write_dir(tmp_path / "data", t), tmp_path / "out")
    assert_clean_error(res, "error: ledger: column 'delta_len' has a value above the int64 range "
                            "at row 2")


@pytest.mark.parametrize("table,column", [("ledger", "rollout_id"), ("ledger", "call_id"),
                                          ("tokens", "call_id"), ("rollouts", "group_id")])
def test_invalid_utf8_id(cli, tmp_path, table, column):
    t = small_tables()
    t[table] = set_column(t[table], column, invalid_utf8(t[table].column(column).combine_chunks(), 1))
    res = cli.run("reassemble", write_dir(tmp_path / "data", t), tmp_path / "out")
    assert_clean_error(res, f"error: {table}: column {column!r} holds a string that is not valid "
                            f"UTF-8: first at row 1")


@pytest.mark.parametrize("table", ["ledger", "tokens", "rollouts"])
@pytest.mark.parametrize("keep", [0.0, 0.1, 0.5, 0.9, 0.999])
def test_truncated_file(cli, good, tmp_path, table, keep):
    path = good / f"{table}.parquet"
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    res = cli.run("reassemble", good, tmp_path / "out")
    assert_clean_error(res, f"error: {table}: unreadable Parquet file", str(path))


def test_not_parquet(cli, good, tmp_path):
    (good / "tokens.parquet").write_text("rollout_id,call_id,tokens\nwx,c1,[1]\n")
    assert_clean_error(cli.run("reassemble", good, tmp_path / "out"),
                       "error: tokens: unreadable Parquet file", str(good / "tokens.parquet"))


def test_partitioned_run_reports_unusable_input_too(cli, good, tmp_path):
    """The spill path (--buckets) reads through the same checks."""
    t = small_tables()
    t["ledger"] = set_column(t["ledger"], "call_id", invalid_utf8(t["ledger"].column("call_id").combine_chunks(), 3))
    data = write_dir(tmp_path / "data", t)
    assert_clean_error(cli.run("reassemble", data, tmp_path / "out", "--buckets", "3"),
                       "error: ledger: column 'call_id'")
    (good / "rollouts.parquet").write_bytes(b"PAR1 not really")
    assert_clean_error(cli.run("reassemble", good, tmp_path / "out2", "--buckets", "3"),
                       "error: rollouts: unreadable Parquet file")


def test_failed_run_keeps_previous_outputs(cli, good, tmp_path):
    out = tmp_path / "out"
    assert_ran(cli.run("reassemble", good, out))
    before = output_bytes(out)
    (good / "ledger.parquet").write_bytes(b"")
    assert_clean_error(cli.run("reassemble", good, out, "--overwrite"), "error: ledger: ")
    assert output_bytes(out) == before and set(before) == OUTPUT_ENTRIES


def test_a_second_run_on_the_same_out_is_refused_while_the_first_writes(cli, good, tmp_path):
    from chainrows.outdir.atomic import OUT_LOCK_NAME, AtomicOutput

    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        with AtomicOutput(out):  # the first run, still writing (its work dir included)
            work = out / ".chainrows-work"
            work.mkdir()
            (work / "manifest.json").write_text("{}")
            for flag in ([], ["--buckets", "2"], ["--resume"], ["--overwrite"]):
                assert_clean_error(cli.run("reassemble", good, out, *flag),
                                   "another chainrows run is writing", str(out))
            assert (work / "manifest.json").read_text() == "{}"  # untouched
            raise KeyboardInterrupt  # the first run is interrupted: its lock goes with it
    assert not (out / OUT_LOCK_NAME).exists()
    assert_ran(cli.run("reassemble", good, out))
    assert set(os.listdir(out)) - {".chainrows-work"} == OUTPUT_ENTRIES


def test_budget_below_the_process_is_refused_up_front(cli, good, tmp_path):
    """A budget the process itself cannot fit is unusable input: exit 2, one line naming the
    smallest budget that works, and a budget just above it is then accepted."""
    out = tmp_path / "out"
    res = cli.run("reassemble", good, out, "--memory-budget", "16MiB")
    assert_clean_error(res, "error: --memory-budget 16 MiB is below what this process needs",
                       "the smallest budget that works here is")
    assert not out.exists() or not any(out.iterdir())
    smallest = int(res.stderr.strip().rsplit(" is ", 1)[1].split()[0].replace(",", ""))
    # another process measures its own baseline, a few MiB apart: leave it that margin
    assert_ran(cli.run("reassemble", good, out, "--memory-budget", f"{smallest + 32}MiB"))


# ----------------------------------------------------------------------------- arguments

BAD_ARGS = [
    ["reassemble", "{data}", "{out}", "--frobnicate"],
    ["reassemble", "{data}", "{out}", "--mode", "foo"],
    ["reassemble", "{data}", "{out}", "--baseline", "median"],
    ["reassemble", "{data}", "{out}", "--row-weight", "token"],
    ["reassemble", "{data}", "{out}", "--memory-budget", "lots"],
    ["reassemble", "{data}", "{out}", "--memory-budget", "1KB"],
    ["reassemble", "{data}", "{out}", "--threads", "two"],
    ["reassemble", "{data}", "{out}", "--buckets", "-1"],
    ["reassemble", "{data}", "{out}", "--buckets", "many"],
    ["reassemble", "{data}", "{out}", "--steps", "0"],
    ["reassemble", "{data}", "{out}", "--hold-runs", "-1", "--steps", "2"],
    ["reassemble", "{data}", "{out}", "--hold-runs", "0"],  # needs --steps
    ["reassemble", "{data}"],
    ["reassemble"],
    ["frobnicate"],
    [],
    ["synth", "{out}", "--rollouts", "-5"],
]


@pytest.mark.parametrize("argv", BAD_ARGS, ids=lambda a: " ".join(a) or "<none>")
def test_bad_arguments_exit_2_with_one_line(cli, good, tmp_path, argv):
    argv = [a.format(data=good, out=tmp_path / "out") for a in argv]
    res = cli.run(*argv)
    assert res.rc == 2, str(res)
    line = _one_line(res)
    assert line.startswith("chainrows") and "error" in line, str(res)
    assert no_outputs(tmp_path / "out")


def test_version_and_help(cli):
    res = cli.run("--version")
    assert res.rc == 0 and res.stdout.startswith("chainrows ") and res.stderr == ""
    res = cli.run("reassemble", "--help")
    assert res.rc == 0 and "--mode" in res.stdout and res.stderr == ""


SUBCOMMAND_ERRORS = [
    ["reassemble", "{data}", "{out}", "--mode", "foo"],
    ["reassemble", "{data}", "{out}", "--plan", "forest", "--mode", "ordinary"],
    ["reassemble", "{data}"],
    ["synth", "{out}", "--corrupt-rate", "2"],
    ["synth", "{out}", "--worker-rate", "0.6", "--fork-rate", "0.6"],
    ["synth", "{out}", "--seed", "-1"],  # was an internal error from numpy
    ["import-jsonl", "a", "b"],
    ["stats", "{data}", "--threads", "0"],
    ["reassemble", "--bogus", "{data}", "{out}"],  # unknown options: the top parser reports them
    ["export-gym", "a", "b", "c", "d", "--zzz"],
]


@pytest.mark.parametrize("argv", SUBCOMMAND_ERRORS, ids=lambda a: " ".join(a))
def test_usage_errors_point_at_the_subcommands_help(cli, good, tmp_path, argv):
    res = cli.run(*[a.format(data=good, out=tmp_path / "out") for a in argv])
    assert res.rc == 2
    assert _one_line(res).endswith(f"(see chainrows {argv[0]} --help)"), res.stderr


def _subparsers():
    from chainrows.cli import _parser

    parser = _parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return parser, sub.choices


def test_every_option_has_help_and_shows_its_default():
    """Each option of each subcommand is explained, and one with a value by default names it."""
    import argparse

    parser, commands = _subparsers()
    assert {"reassemble", "synth", "import-jsonl", "stats"} <= set(commands)
    for name, sub in commands.items():
        text = "".join(sub.format_help().split())  # argparse wraps lines, also at hyphens
        for action in sub._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"{name} {action.option_strings or action.dest}: no help"
            if action.option_strings and action.default not in (None, False):
                shown = sub._get_formatter()._get_help_string(action) % {"default": action.default}
                assert "default" in shown and str(action.default) in " ".join(shown.split()), (name, action.dest)
                assert "".join(shown.split()) in text, (name, action.dest)
    top = parser.format_help()
    for name, sub in [("chainrows", parser), *commands.items()]:
        body = sub.format_help()
        assert "``" not in body and "SPEC" not in body and ":class:" not in body, (name, body)
    assert "usage: chainrows" in top


# ----------------------------------------------------------------------------- one overwrite policy

def _outputs(out: Path) -> dict:
    """Visible entries of OUT: a file's bytes, or a directory's ((part name, bytes), ...)."""
    def content(p):
        return p.read_bytes() if p.is_file() else tuple((q.name, q.read_bytes()) for q in sorted(p.iterdir()))
    return {p.name: content(p) for p in sorted(out.iterdir()) if not p.name.startswith(".")}


def _writers(good, tmp_path):
    """Each command that writes, as argv without OUT and the outputs it commits."""
    from tests.support.jsonl_doc import doc_files

    files = doc_files(tmp_path)
    return {
        "reassemble": (["reassemble", str(good)], ["rows", "report.parquet"]),
        "synth": (["synth", "--rollouts", "8"], ["ledger.parquet", "tokens.parquet", "rollouts.parquet"]),
        "import-jsonl": (["import-jsonl", str(files["ledger"]), str(files["tokens"]), str(files["results"])],
                         ["ledger.parquet", "tokens.parquet", "rollouts.parquet"]),
    }


@pytest.mark.parametrize("command", ["reassemble", "synth", "import-jsonl"])
def test_a_complete_result_is_refused_without_overwrite(cli, good, tmp_path, command):
    argv, names = _writers(good, tmp_path)[command]
    out = tmp_path / "out"
    assert_ran(cli.run(*argv, out))
    assert sorted(_outputs(out)) == sorted(names)
    before = _outputs(out)
    (out / "mine.txt").write_text("kept")
    line = assert_clean_error(cli.run(*argv, out), str(out), "--overwrite", names[-1])
    assert "Traceback" not in line and _outputs(out) == {**before, "mine.txt": b"kept"}
    assert_ran(cli.run(*argv, out, "--overwrite"))
    assert sorted(_outputs(out)) == sorted([*names, "mine.txt"])


@pytest.mark.parametrize("command", ["reassemble", "synth", "import-jsonl"])
def test_what_an_interrupted_run_left_is_never_a_reason_to_refuse(cli, good, tmp_path, command):
    """An empty OUT, a staging dir of a dead run, finished work for --resume, a rows table
    committed without its report: all replaced by a plain run, no --overwrite needed."""
    from chainrows.outdir.atomic import TMP_PREFIX
    from chainrows.runners.bulk.job import WORK_DIR

    argv, names = _writers(good, tmp_path)[command]
    out = tmp_path / "out"
    out.mkdir()
    (out / f"{TMP_PREFIX}999999999-dead").mkdir()
    (out / WORK_DIR).mkdir()
    (out / WORK_DIR / "manifest.json").write_text("{}")
    first = out / names[0]  # committed before the crash; its marker was not
    if first.suffix:
        first.write_bytes(b"half")
    else:  # a directory of parts
        first.mkdir()
        (first / "part-00000000.parquet").write_bytes(b"half")
    half = _outputs(out)[names[0]]
    assert_ran(cli.run(*argv, out))
    assert sorted(_outputs(out)) == sorted(names)
    assert _outputs(out)[names[0]] != half
    assert not any(p.name.startswith(TMP_PREFIX) for p in out.iterdir())


@pytest.mark.parametrize("where", ["same", "out inside data", "data inside out"])
def test_output_never_goes_into_the_input(cli, tmp_path, where):
    root = tmp_path / "root"
    data, out = {"same": (root, root), "out inside data": (root, root / "out"),
                 "data inside out": (root / "data", root)}[where]
    write_dir(data, small_tables())
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for extra in ([], ["--overwrite"]):
        line = assert_clean_error(cli.run("reassemble", data, out, *extra), str(out), str(data))
        assert "input" in line
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_import_jsonl_never_writes_over_its_input(cli, tmp_path):
    from tests.support.jsonl_doc import doc_files

    files = doc_files(tmp_path)
    before = files["ledger"].read_bytes()
    assert_clean_error(cli.run("import-jsonl", files["ledger"], files["tokens"], files["results"],
                               files["ledger"], "--overwrite"), "is the input", str(files["ledger"]))
    assert files["ledger"].read_bytes() == before


def test_resume_continues_an_interrupted_overwrite(cli, good, tmp_path):
    """A run replacing a complete result, interrupted with its work kept, resumes under
    --resume without --overwrite (the replacing was asked for already)."""
    from chainrows.runners.bulk.job import WORK_DIR

    out = tmp_path / "out"
    assert_ran(cli.run("reassemble", good, out))
    assert_clean_error(cli.run("reassemble", good, out, "--resume"), "--overwrite")
    (out / WORK_DIR).mkdir()
    assert_ran(cli.run("reassemble", good, out, "--resume", "--buckets", "2"))
    assert not (out / WORK_DIR).exists()


def test_unusable_input_found_mid_run_leaves_no_work_behind(cli, tmp_path):
    """A null found while partitioning (after the work dir was started): exit 2, and neither
    the partial work nor the OUT this run created stay; work an earlier run left for --resume
    is kept."""
    from chainrows.runners.bulk.job import WORK_DIR

    t = small_tables()
    values = t["tokens"].column("call_id").to_pylist()
    values[-1] = None
    t["tokens"] = set_column(t["tokens"], "call_id", pa.array(values, pa.string()))
    data = write_dir(tmp_path / "data", t)
    out = tmp_path / "out"
    assert_clean_error(cli.run("reassemble", data, out, "--buckets", "3"), "has a null value")
    assert not out.exists()
    (out / WORK_DIR).mkdir(parents=True)
    (out / WORK_DIR / "manifest.json").write_text("{}")
    assert_clean_error(cli.run("reassemble", data, out, "--buckets", "3", "--resume"), "has a null value")
    assert (out / WORK_DIR).is_dir()


def test_a_failed_run_leaves_no_empty_out_of_its_making(cli, tmp_path):
    out = tmp_path / "new"
    res = cli.run("reassemble", tmp_path / "nope", out)
    assert_clean_error(res, "nope")
    assert not out.exists()


# ----------------------------------------------------------------------------- what a run says

def test_summary_names_the_files_and_counts_placeholders(cli, tmp_path):
    t = small_tables()
    t["ledger"] = set_column(t["ledger"], "failed", pa.array([r == "solo" for r in t["ledger"]["rollout_id"].to_pylist()]))
    data = write_dir(tmp_path / "data", t)
    out = tmp_path / "out"
    res = cli.run("reassemble", data, out, "--placeholders")
    assert_ran(res)
    rows, report = read_output(out)
    trained = sum(report.column("num_rows").to_pylist())
    placeholders = rows.num_rows - trained
    assert placeholders == 1 and trained == 3  # wx has two chains, sc one; solo is masked
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("rows "))
    assert line.split(None, 1)[1] == f"{rows.num_rows} ({trained} trained, {placeholders} placeholders)"
    wrote = next(ln for ln in res.stdout.splitlines() if ln.startswith("wrote "))
    assert f"{out / 'rows'}/ (" in wrote and f"{out / 'report.parquet'} (" in wrote


def test_partition_bar_never_passes_its_total(cli, good, tmp_path):
    import re

    res = cli.run("reassemble", good, tmp_path / "out", "--buckets", "2", "--progress")
    assert res.rc == 0, res
    bars = [ln for ln in re.split(r"[\r\n]", res.stderr) if ln.startswith("partition")]
    assert bars, res.stderr
    units = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}
    for bar in bars:
        m = re.search(r"([\d.]+) (\w+) / ([\d.]+) (\w+)", bar)
        done, total = float(m[1]) * units[m[2]], float(m[3]) * units[m[4]]
        assert done <= total, bar
    assert "100.0%" in bars[-1] and m[1] == m[3] and m[2] == m[4], bars[-1]


def test_compile_notice_only_while_numba_compiles(capsys):
    """The notice hangs on Numba's compile event: said once when a kernel compiles, never when
    every kernel is loaded already (here: a fresh tiny function, then the same one again)."""
    import numba

    from chainrows.cli.common import COMPILING, CompileNotice

    f = numba.njit(lambda x: x + 1)
    with CompileNotice(enabled=True) as notice:
        assert f(1) == 2
        f(2.5)  # a second signature compiles too, but the notice is said once
    assert capsys.readouterr().err == COMPILING + "\n" and notice.seconds > 0
    with CompileNotice(enabled=True) as notice:
        assert f(3) == 4
    assert capsys.readouterr().err == "" and notice.seconds == 0
    g = numba.njit(lambda x: x - 1)
    with CompileNotice(enabled=False):
        assert g(1) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("flag, said", [([], True), (["--progress"], True), (["--no-progress"], False)])
def test_compile_notice_is_said_when_stderr_is_not_a_terminal(tmp_path, capsys, monkeypatch, flag, said):
    """A CI or batch log (stderr not a terminal, as under capsys) shows the notice too, so the
    first run's seconds of compiling are not silence; --no-progress silences it."""
    import numba

    from chainrows.cli.common import COMPILING
    from chainrows.runners import bulk
    from chainrows.runners.bulk.summary import Summary

    assert not sys.stderr.isatty()

    def run(*args, **kwargs):
        numba.njit(lambda x: x * 5)(2)  # a fresh function: Numba compiles it now
        return Summary(rollouts=1, seconds=0.01)

    monkeypatch.setattr(bulk, "run", run)
    assert cli_main(["reassemble", str(tmp_path / "data"), str(tmp_path / "out"), *flag]) == 0
    assert capsys.readouterr().err == (COMPILING + "\n" if said else "")


@pytest.mark.parametrize("columns, plaintext_footer", [(["call_id"], True), (["chain_hash"], True), ([], True),
                                                       (["call_id"], False)])
@pytest.mark.parametrize("route", [[], ["--buckets", "2"], ["--steps", "2"]], ids=["memory", "spill", "stream"])
def test_an_encrypted_file_is_one_line_not_an_abort(cli, good, tmp_path, columns, plaintext_footer, route):
    """Found by fuzzing: encrypted columns under a plaintext footer made pyarrow abort the
    process (SIGABRT) when chainrows read the columns' sizes from the footer."""
    ledger = good / "ledger.parquet"
    table = pq.read_table(ledger)
    ledger.unlink()
    write_encrypted(ledger, table, columns, plaintext_footer)
    line = assert_clean_error(cli.run("reassemble", good, tmp_path / "out", *route), str(ledger))
    assert "encrypt" in line and "internal error" not in line


def _stray_signature_bytes(path: Path) -> None:
    """28 stray bytes between ``path``'s footer metadata and its length, the length counting
    them: a plaintext footer's layout with its signature, without any encryption."""
    data = path.read_bytes()
    n = int.from_bytes(data[-8:-4], "little")
    path.write_bytes(data[:-8] + bytes(range(28)) + (n + 28).to_bytes(4, "little") + b"PAR1")


@pytest.mark.parametrize("route", [[], ["--buckets", "2"], ["--steps", "2"]], ids=["memory", "spill", "stream"])
def test_stray_bytes_after_a_footer_are_not_taken_for_encryption(cli, good, tmp_path, route):
    """A footer followed by as many stray bytes as an encryption signature was refused as
    encrypted; pyarrow reads such a file, and so does chainrows now: the same rows as without
    the bytes. The footer's metadata, not its length, tells (``footers.names_encryption``)."""
    from chainrows.formats.native.footers import names_encryption

    assert_ran(cli.run("reassemble", good, tmp_path / "clean", *route))
    ledger = good / "ledger.parquet"
    _stray_signature_bytes(ledger)
    assert pq.ParquetFile(ledger).metadata.num_rows > 0  # pyarrow reads it
    assert_ran(cli.run("reassemble", good, tmp_path / "out", *route))
    assert pq.read_table(tmp_path / "out" / "rows").equals(pq.read_table(tmp_path / "clean" / "rows"))
    assert pq.read_table(tmp_path / "out" / "report.parquet").equals(
        pq.read_table(tmp_path / "clean" / "report.parquet"))

    data = ledger.read_bytes()
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    meta = data[footer:len(data) - 8 - 28]
    assert not names_encryption(meta)
    assert names_encryption(meta[: len(meta) // 2])  # unparseable: refused, never read
    encrypted = tmp_path / "encrypted.parquet"
    write_encrypted(encrypted, pq.read_table(ledger), ["call_id"], True)
    data = encrypted.read_bytes()
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    assert names_encryption(data[footer:len(data) - 8 - 28])


# ----------------------------------------------------------------------------- outputs

def test_output_under_a_file(cli, good, tmp_path):
    (tmp_path / "f").write_text("x")
    res = cli.run("reassemble", good, tmp_path / "f" / "out")
    line = assert_clean_error(res, str(tmp_path / "f"))
    assert "internal error" not in line
    assert line.endswith(f"(a file is where chainrows needs a directory: {tmp_path / 'f'})")  # the file itself


def test_output_is_a_file(cli, good, tmp_path):
    (tmp_path / "f").write_text("x")
    line = assert_clean_error(cli.run("reassemble", good, tmp_path / "f"), str(tmp_path / "f"))
    assert "--overwrite" not in line, "a file is not a result: --overwrite would not help"
    assert (tmp_path / "f").read_text() == "x"


@pytest.mark.parametrize("make, bad, hint", [
    (lambda out: out.symlink_to(out.parent / "nowhere"), lambda out: out, "a symbolic link to nothing"),
    (lambda out: (out / ".chainrows-lock").mkdir(parents=True), lambda out: out / ".chainrows-lock",
     "a directory is where chainrows needs a file"),
], ids=["dangling-symlink", "lock-is-a-directory"])
def test_a_path_in_the_way_is_named_with_what_is_wrong(cli, good, tmp_path, make, bad, hint):
    """Found by fuzzing: "File exists: OUT" for an OUT that does not exist (a dangling symlink)."""
    out = tmp_path / "out"
    make(out)
    line = assert_clean_error(cli.run("reassemble", good, out), str(bad(out)))
    assert hint in line


def test_output_on_a_read_only_filesystem(cli, good):
    """/proc refuses new entries even for root (chmod would not stop root)."""
    res = cli.run("reassemble", good, "/proc/chainrows-test-out")
    assert_clean_error(res, "/proc/chainrows-test-out")


# ----------------------------------------------------------------------------- the real process

def _real(*argv, timeout=180):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("CHAINROWS_DEBUG", None)
    p = subprocess.run([sys.executable, "-m", "chainrows.cli", *map(str, argv)], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=timeout)
    p.stderr = without_compile_notice(p.stderr)
    return p


@pytest.mark.slow
def test_real_process_exit_codes(good, tmp_path):
    """`python -m chainrows.cli`: the interpreter's own exit path, not just main()'s return."""
    p = _real("reassemble", good, tmp_path / "out")
    assert p.returncode == 0 and p.stderr == "", p.stderr
    (good / "rollouts.parquet").write_bytes(b"\x00" * 10)
    p = _real("reassemble", good, tmp_path / "out2")
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1, p.stderr
    assert p.stderr.startswith("chainrows: error: rollouts: unreadable Parquet file")
    assert no_outputs(tmp_path / "out2")


@pytest.mark.slow
def test_a_reader_that_closes_stdout_early_ends_the_run_as_sigpipe_would(good, tmp_path):
    """`chainrows reassemble ... | head -1`: the outputs are committed before the summary is
    printed; the broken pipe then ends the process with 141 (128 + SIGPIPE), silently, not
    with exit 2 as if the input were unusable."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written
    p = subprocess.run([sys.executable, "-m", "chainrows.cli", "reassemble", str(good), str(tmp_path / "out"),
                        "--no-progress"], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                       stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=600)
    os.close(write_end)
    assert p.returncode == 141, p.stderr
    assert p.stderr == ""
    assert set(output_bytes(tmp_path / "out")) == OUTPUT_ENTRIES


GYM_RAW = REPO / "examples" / "gym" / "raw"
# argv of a command that commits an output, OUT for where it goes
COMMITTING = {"reassemble": lambda good: ["reassemble", good, "OUT", "--no-progress"],
              "export-gym": lambda good: ["export-gym", *(GYM_RAW / f"{n}.jsonl" for n in ("ledger", "tokens", "results")),
                                          "OUT"]}


def _committing(command: str, good: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "chainrows.cli"] + [str(out) if a == "OUT" else str(a)
                                                       for a in COMMITTING[command](good)]


def _assert_summary_lost_output_kept(p, command: str, out: Path, strerror: str) -> None:
    assert p.returncode == 1, p.stderr
    assert _one_line(p) == (f"chainrows: error: cannot write stdout: {strerror}; "
                            f"the run finished and its output is in {out}"), p.stderr
    if command == "reassemble":
        assert set(output_bytes(out)) == OUTPUT_ENTRIES and sorted(os.listdir(out)) == sorted(OUTPUT_ENTRIES)
    else:
        assert sorted(os.listdir(out)) == ["receipts.jsonl", "results.jsonl", "staged.jsonl"]


def _env(buffered: bool = True) -> dict:
    """The real process's environment; ``buffered``: stdout block-buffered, as Python makes a
    file or a pipe (PYTHONUNBUFFERED unset), else written through at each print."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("CHAINROWS_DEBUG", None)
    env.pop("PYTHONUNBUFFERED", None)
    return env if buffered else dict(env, PYTHONUNBUFFERED="1")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("command", sorted(COMMITTING))
def test_a_full_stdout_after_the_commit_is_not_blamed_on_the_input(good, tmp_path, command, buffered):
    """`chainrows reassemble ... > /dev/full`: the outputs are committed before the summary is
    printed, so a stdout that cannot be written is the machine's limit, as a full disk is:
    exit 1, one line saying the output is in OUT. It was 'error: No space left on device',
    exit 2, as if the input were unusable (stdout unbuffered), or the interpreter's
    'Exception ignored' at exit and exit 120 (buffered: the summary was never flushed by the
    run)."""
    out = tmp_path / "out"
    env = _env(buffered)
    with open("/dev/full", "w") as full:
        p = subprocess.run(_committing(command, good, out), cwd=REPO, env=env, stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=600)
    _assert_summary_lost_output_kept(p, command, out, "No space left on device")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_version_on_a_full_stdout_is_one_line_not_a_traceback(tmp_path):
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "chainrows", "--version"], cwd=REPO, stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    assert p.returncode == 1 and p.stderr == "chainrows: error: cannot write stdout: No space left on device\n", p.stderr


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
def test_a_stdout_file_past_the_file_size_limit_fails_in_the_run_not_at_exit(good, tmp_path):
    """stdout a regular file (block-buffered), already at the file-size limit: the summary is
    flushed by the run, so the failure is its one line and exit 1, not the interpreter's
    'Exception ignored' at exit and exit 120."""
    import resource

    limit = 1 << 20  # above every output file of this small run
    env = _env()
    warm = subprocess.run(_committing("reassemble", good, tmp_path / "warm"), cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert warm.returncode == 0, warm.stderr  # the kernel cache is written before the limit applies
    log = tmp_path / "log"
    log.write_bytes(b"." * limit)

    def file_size_limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    out = tmp_path / "out"
    with open(log, "ab") as stdout:
        p = subprocess.run(_committing("reassemble", good, out), cwd=REPO, env=env, stdout=stdout,
                           stderr=subprocess.PIPE, text=True, timeout=600, preexec_fn=file_size_limit)
    _assert_summary_lost_output_kept(p, "reassemble", out, "File too large")
    assert log.stat().st_size == limit


@pytest.mark.slow
def test_a_fifo_among_a_tables_parts_is_refused_not_read(good, tmp_path):
    """A named pipe in a table directory would block the reader forever (a review's run hung
    until `timeout` killed it): it is refused up front, exit 2, one line naming it."""
    parts = tmp_path / "parts"
    for name in ("ledger", "tokens", "rollouts"):
        (parts / name).mkdir(parents=True)
        (parts / name / "a.parquet").write_bytes((good / f"{name}.parquet").read_bytes())
    os.mkfifo(parts / "tokens" / "b.parquet")
    res = subprocess.run([sys.executable, "-m", "chainrows", "reassemble", str(parts), str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 2, res
    line = _one_line(res)
    assert "tokens" in line and "'b.parquet'" in line and "not a regular file" in line, line
    assert not (tmp_path / "out").exists()


def test_out_of_memory_while_reading_is_not_blamed_on_the_input(good, tmp_path, monkeypatch, capsys):
    """pyarrow's ArrowMemoryError is an ArrowException too: it was reported as an unreadable
    file (exit 2). It is the machine's limit: exit 1, one line saying so."""

    from chainrows.cli import main

    def no_memory(self, *args, **kwargs):
        raise pa.ArrowMemoryError("malloc of size 39925248 failed")

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", no_memory)
    assert main(["reassemble", str(good), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "out of memory (malloc of size 39925248 failed)" in err, err
    assert "unreadable" not in err and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_no_std_on_rewards_beyond_float32_saturates_without_a_numpy_warning(tmp_path):
    """--no-std on rewards beyond float32: the advantages saturate at ±float32 max, in the
    report and on the rows (they were ±inf, and numpy's overflow warning reached stderr)."""

    from chainrows.synth import write_synth_dataset

    data = tmp_path / "data"
    write_synth_dataset(data, 8, seed=2)
    ro = pq.read_table(data / "rollouts.parquet")
    reward = pa.array([1e39 if i == 0 else 0.0 for i in range(ro.num_rows)], pa.float64())
    pq.write_table(ro.set_column(ro.schema.get_field_index("reward"), "reward", reward),
                           data / "rollouts.parquet")
    res = subprocess.run([sys.executable, "-m", "chainrows", "reassemble", str(data), str(tmp_path / "out"),
                          "--no-std"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0 and without_compile_notice(res.stderr) == "", res.stderr
    top = float(np.finfo(np.float32).max)
    report = pq.read_table(tmp_path / "out" / "report.parquet")
    adv = dict(zip(report["rollout_id"].to_pylist(), report["advantage"].to_pylist()))
    assert top in adv.values(), adv  # 1e39 - mean
    assert all(math.isfinite(a) for a in adv.values())
    rows = pq.read_table(tmp_path / "out" / "rows", columns=["rollout_id", "advantage"])
    assert all(a == adv[r] for r, a in zip(rows["rollout_id"].to_pylist(), rows["advantage"].to_pylist()))


# ----------------------------------------------------------------------------- pandas

@pytest.mark.slow
@pytest.mark.parametrize("module", ["chainrows", "chainrows.cli"])
def test_the_command_keeps_pandas_out_of_its_process(good, tmp_path, module):
    """``python -m chainrows`` (as the ``chainrows`` script) runs a whole reassembly without
    pandas, which pyarrow would otherwise import on its first ``pa.array``."""
    pytest.importorskip("pandas")  # without it there is nothing to keep out
    out = tmp_path / "out"
    code = ("import atexit, runpy, sys\n"
            "atexit.register(lambda: print('pandas imported:', 'pandas' in sys.modules))\n"
            f"sys.argv = ['chainrows', 'reassemble', {str(good)!r}, {str(out)!r}]\n"
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0 and without_compile_notice(p.stderr) == "", p.stderr
    assert p.stdout.splitlines()[-1] == "pandas imported: False", p.stdout
    assert pq.read_table(out / "rows").num_rows > 0


def test_pandas_is_kept_out_only_while_the_commands_own_process_runs(monkeypatch):
    from chainrows import cli as cli_module
    from chainrows.memory.process import keep_pandas_out

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delitem(sys.modules, "pandas", raising=False)
    before = list(sys.meta_path)
    finder = keep_pandas_out()
    assert sys.meta_path[0] is finder and keep_pandas_out() is None  # one finder at most
    with pytest.raises(ModuleNotFoundError):
        import pandas  # noqa: F401
    sys.meta_path.remove(finder)
    assert cli_module.main(["--version"]) == 0  # a caller's own process: nothing installed
    assert sys.meta_path == before
    seen = []
    monkeypatch.setattr(cli_module, "_print_version",
                        lambda a: seen.append(any(isinstance(f, NoPandas) for f in sys.meta_path)) or 0)
    assert cli_module.main(["--version"], own_process=True) == 0
    assert seen == [True] and sys.meta_path == before  # in place while the command ran, then removed


# ----------------------------------------------------------------------------- huge pages

def _prctl_switch_works() -> bool:
    from chainrows.memory.process import huge_pages_enabled, set_huge_pages

    before = huge_pages_enabled()
    return before is not None and set_huge_pages(before)


needs_thp_switch = pytest.mark.skipif(not _prctl_switch_works(),
                                      reason="no prctl(PR_SET_THP_DISABLE) here (not Linux, gVisor, Linux < 3.15)")


def _huge_pages_after_command(args, env_value=None):
    """(exit code, stderr, whether huge pages were allowed when the process exited) of the
    command run as ``python -m chainrows`` in a process that allowed them at its start."""
    code = ("import atexit, runpy, sys\n"
            "from chainrows.memory.process import huge_pages_enabled, set_huge_pages\n"
            "assert set_huge_pages(True)\n"
            "atexit.register(lambda: print('huge pages:', huge_pages_enabled()))\n"
            f"sys.argv = ['chainrows', *{list(map(str, args))!r}]\n"
            "runpy.run_module('chainrows', run_name='__main__', alter_sys=True)\n")
    env = _env()
    env.pop(HUGE_PAGES_ENV, None)
    if env_value is not None:
        env[HUGE_PAGES_ENV] = env_value
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    lines = p.stdout.splitlines()
    return p.returncode, p.stderr, lines[-1] if lines else f"no output; stderr: {p.stderr}"


@pytest.mark.slow
@needs_thp_switch
def test_the_command_forbids_huge_pages_in_its_process_unless_told_to_keep_the_systems(good, tmp_path):
    rc, err, last = _huge_pages_after_command(["reassemble", good, tmp_path / "a"])
    assert (rc, err, last) == (0, "", "huge pages: False")
    rc, err, last = _huge_pages_after_command(["reassemble", good, tmp_path / "b"], " System ")
    assert (rc, err, last) == (0, "", "huge pages: True")
    assert pq.read_table(tmp_path / "a" / "rows").equals(pq.read_table(tmp_path / "b" / "rows"))
    assert _huge_pages_after_command(["--version"], "")[2] == "huge pages: True"  # --version touches nothing
    assert _huge_pages_after_command(["stats", good], "")[::2] == (0, "huge pages: False")  # empty: unset
    rc, err, last = _huge_pages_after_command(["reassemble", good, tmp_path / "c"], "never")
    assert rc == 2 and last == "huge pages: True" and not (tmp_path / "c").exists()
    assert err == "chainrows: error: CHAINROWS_HUGE_PAGES='never': expected one of off, system\n"


@needs_thp_switch
def test_main_in_a_callers_process_leaves_its_huge_pages_alone(good, tmp_path, monkeypatch):
    from chainrows.memory.process import huge_pages_enabled, set_huge_pages

    monkeypatch.delenv(HUGE_PAGES_ENV, raising=False)
    before = huge_pages_enabled()
    try:
        assert set_huge_pages(True) and huge_pages_enabled() is True
        assert cli_main(["reassemble", str(good), str(tmp_path / "out")]) == 0
        assert huge_pages_enabled() is True
        assert set_huge_pages(False) and huge_pages_enabled() is False
        status = open("/proc/self/status").read()
        if "THP_enabled:" in status:  # Linux 5.0+ shows the flag there too
            assert status.split("THP_enabled:")[1].split()[0] == "0"
    finally:
        set_huge_pages(bool(before))
