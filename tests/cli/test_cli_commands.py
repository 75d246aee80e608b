"""The CLI's commands end to end: synth, reassemble (with options), stats, import-jsonl."""

import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from chainrows.cli import main, parse_size
from tests.support.jsonl_doc import doc_files


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "data"
    assert main(["synth", str(path), "--rollouts", "120", "--seed", "5", "--corrupt-rate", "0.2"]) == 0
    return path


def test_synth_refuses_to_overwrite_without_flag(data, capsys):
    assert main(["synth", str(data), "--rollouts", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--overwrite" in err[0]


def test_synth_says_what_its_corruptions_do(tmp_path, capsys):
    """synth's count of corruptions that cc mode masks is what reassemble then masks."""
    data = tmp_path / "ds"
    assert main(["synth", str(data), "--rollouts", "200", "--seed", "3", "--corrupt-rate", "0.5"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("corrupt"))
    corrupt, rest = line.split(None, 1)[1].split(": ", 1)
    in_cc = int(rest.split(" masked in cc mode")[0].replace(",", ""))
    only_ordinary = int(rest.split(", ", 1)[1].split(" only in --mode ordinary")[0].replace(",", ""))
    assert in_cc + only_ordinary == int(corrupt.replace(",", "")) and only_ordinary > 0
    assert main(["reassemble", str(data), str(tmp_path / "out")]) == 0
    report = pq.read_table(tmp_path / "out" / "report.parquet")
    assert sum(s == "masked" for s in report["status"].to_pylist()) == in_cc


@pytest.mark.parametrize("work", ["none", "unfinished", "finished"])
def test_interrupted_run_says_what_it_left(tmp_path, capsys, monkeypatch, work):
    """Ctrl-C: exit 130, one line; finished work in OUT/.chainrows-work (here a finished
    partitioning) is named with its size and --resume; work with nothing finished in it (a
    killed run's, partitioning) is not offered for --resume; an OUT the run created and left
    empty is removed."""
    from chainrows.runners import bulk
    from chainrows.runners.bulk.job import WORK_DIR
    from chainrows.runners.bulk.spill import FINISHED

    out = tmp_path / "out"

    def interrupted(dataset, out_dir, *args, **kwargs):
        (out / WORK_DIR).mkdir(parents=True) if work != "none" else out.mkdir()
        if work != "none":
            (out / WORK_DIR / "bucket").write_bytes(b"x" * 1500)
        if work == "finished":
            (out / WORK_DIR / FINISHED).touch()
        raise KeyboardInterrupt

    monkeypatch.setattr(bulk, "run", interrupted)
    data = tmp_path / "data"
    data.mkdir()
    assert main(["reassemble", str(data), str(out)]) == 130
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("chainrows: interrupted; no output written"), err
    if work == "finished":
        assert str(out / WORK_DIR) in err[0] and "1.5 KB" in err[0] and "--resume" in err[0]
    else:
        assert err[0] == "chainrows: interrupted; no output written", err
        assert out.exists() == (work == "unfinished")


def test_reassemble_says_it_compiles_and_keeps_compiling_out_of_throughput(tmp_path, capsys, monkeypatch):
    """A kernel compiled during the run: the notice once on stderr (--progress), and its time
    counted as compiling in the summary, not as work."""
    import numba

    from chainrows.cli import COMPILING
    from chainrows.runners import bulk
    from chainrows.runners.bulk.summary import Summary

    took = []

    def run(dataset, out_dir, *args, **kwargs):
        t0 = time.perf_counter()
        numba.njit(lambda x: x * 3)(2)  # a fresh function: Numba compiles it now
        took.append(time.perf_counter() - t0)
        return Summary(rollouts=1000, seconds=took[0] + 0.01)  # 10 ms of "work" after compiling

    monkeypatch.setattr(bulk, "run", run)
    assert main(["reassemble", str(tmp_path / "data"), str(tmp_path / "out"), "--progress"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count(COMPILING) == 1
    throughput = next(ln for ln in captured.out.splitlines() if ln.startswith("throughput"))
    counted_whole = 1000 / (took[0] + 0.01)
    assert float(throughput.split()[1].replace(",", "")) > 2 * counted_whole  # compiling was taken out


def test_reassemble_prints_summary_and_writes_outputs(data, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["reassemble", str(data), str(out), "--placeholders", "--baseline", "loo",
                 "--no-std", "--baseline-population", "ok", "--row-weight", "row", "--threads", "1"]) == 0
    text = capsys.readouterr().out
    for label in ("rollouts", "ok", "masked", "rows", "loss tokens", "unselected", "orphan token rows",
                  "throughput"):
        assert label in text
    rows = pq.read_table(out / "rows")
    report = pq.read_table(out / "report.parquet")
    masked = [r for r in report.to_pylist() if r["status"] == "masked"]
    assert masked, "corrupt rollouts expected"
    placeholder_ids = {r["rollout_id"] for r in rows.to_pylist() if r["weight"] == 0.0}
    assert placeholder_ids == {r["rollout_id"] for r in masked}
    assert all(r["weight"] == 1.0 for r in rows.to_pylist() if r["rollout_id"] not in placeholder_ids)


def test_ordinary_mode_masks_compacted_rollouts(data, tmp_path, capsys):
    assert main(["reassemble", str(data), str(tmp_path / "o"), "--mode", "ordinary"]) == 0
    report = pq.read_table(tmp_path / "o" / "report.parquet").to_pylist()
    assert any(r["reason"] == "multiple_roots" for r in report)


def test_stats_compares_cc_with_ordinary(data, capsys):
    assert main(["stats", str(data)]) == 0
    text = capsys.readouterr().out
    assert "ordinary" in text and "cc - ordinary" in text and "loss tokens" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("rollouts ok"))
    ordinary, cc, diff = (int(x.replace(",", "")) for x in line.split()[2:5])
    assert cc - ordinary == diff and cc > ordinary


def _stats_table(text):
    """The stats table: {measure: {column: value}}."""
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines) if "cc - ordinary" in ln)
    columns = [c.strip() for c in lines[head].split("  ") if c.strip()]
    table = {}
    for line in lines[head + 1:]:
        if line.startswith("masked by reason"):
            break
        name, values = line[:16].strip(), [int(x.replace(",", "")) for x in line[16:].split()]
        assert len(values) == len(columns), line
        table[name] = dict(zip(columns, values))
    return table


def test_stats_shows_what_the_forest_plan_recovers(tmp_path, capsys):
    """On data with workers and forks, stats' forest column is what the forest plan writes, and
    its differences to the linear (cc) plan and to ordinary capture are consistent."""
    from chainrows import reassemble

    data = tmp_path / "forest"
    assert main(["synth", str(data), "--rollouts", "96", "--seed", "4", "--worker-rate", "0.25",
                 "--fork-rate", "0.25"]) == 0
    capsys.readouterr()
    assert main(["stats", str(data)]) == 0
    table = _stats_table(capsys.readouterr().out)
    assert set(table) == {"rollouts ok", "rollouts masked", "rows", "tokens", "loss tokens"}
    for row in table.values():
        assert row["cc - ordinary"] == row["cc"] - row["ordinary"]
        assert row["forest - cc"] == row["forest"] - row["cc"]
        assert row["forest - ordinary"] == row["forest"] - row["ordinary"]
    for name in ("rollouts ok", "rows", "loss tokens"):
        assert table[name]["forest - cc"] > 0 and table[name]["forest - ordinary"] > 0
    assert table["rollouts ok"]["forest"] + table["rollouts masked"]["forest"] == 96
    for plan, column in (("linear", "cc"), ("forest", "forest")):
        report = reassemble(str(data), plan=plan).report.to_pylist()
        assert table["rollouts ok"][column] == sum(r["status"] == "ok" for r in report)
        assert table["rows"][column] == sum(r["num_rows"] for r in report)
        assert table["loss tokens"][column] == sum(r["loss_tokens"] for r in report)


def test_import_jsonl_then_reassemble(tmp_path, capsys):
    files = doc_files(tmp_path)
    ds = tmp_path / "imported"
    assert main(["import-jsonl", str(files["ledger"]), str(files["tokens"]), str(files["results"]), str(ds)]) == 0
    assert main(["reassemble", str(ds), str(tmp_path / "out")]) == 0
    report = pq.read_table(tmp_path / "out" / "report.parquet").to_pylist()
    assert report and all(r["status"] == "ok" for r in report)


def test_console_script_entry_point(tmp_path):
    res = subprocess.run([sys.executable, "-m", "chainrows.cli", "--version"], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.startswith("chainrows ")


@pytest.mark.parametrize("text,value", [("4GiB", 4 << 30), ("512MB", 512 * 10**6), ("2e9", 2 * 10**9)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("args", [["reassemble"], ["reassemble", "a", "b", "--mode", "tree"],
                                  ["reassemble", "a", "b", "--memory-budget", "lots"], ["nope"],
                                  ["synth", "a", "--fork-rate", "1.5"], ["synth", "a", "--worker-rate", "-0.1"],
                                  ["synth", "a", "--fork-rate", "nan"], ["synth", "a", "--worker-rate", "half"],
                                  ["synth", "a", "--fork-rate", "0.6", "--worker-rate", "0.5"],
                                  ["synth", "a", "--corrupt-rate", "2"], ["synth", "a", "--group-size", "0"],
                                  ["synth", "a", "--compaction-rate", "nan"], ["synth", "a", "--retry-rate", "5"],
                                  ["synth", "a", "--mean-gen-tokens", "-3"], ["synth", "a", "--workers", "-1"]])
def test_bad_arguments_exit_2(args, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2


def test_python_m_chainrows_synth_follows_the_same_policy(tmp_path, capsys):
    from chainrows.synth.writer import main as synth_main

    out = tmp_path / "ds"
    assert synth_main([str(out), "--rollouts", "16"]) == 0
    for argv in ([str(out), "--rollouts", "16"], [str(tmp_path / "bad"), "--rollouts", "16", "--corrupt-rate", "3"]):
        with pytest.raises(SystemExit) as info:
            synth_main(argv)
        assert info.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "--overwrite" in err[0] and "corrupt_rate" in err[1]
    assert not (tmp_path / "bad").exists()
    assert synth_main([str(out), "--rollouts", "32", "--overwrite"]) == 0


def _line(text: str, label: str) -> str:
    return next(x for x in text.splitlines() if x.startswith(label))[len(label):].strip()


def test_the_summary_says_each_figure_in_the_units_a_user_compares_it_with():
    """The peak in MiB beside the budget (budgets are given in MiB); the path's batches named by
    what they are; the kernels' load time shown, since the throughput leaves it out."""
    from chainrows.runners.bulk.summary import Summary

    s = Summary(rollouts=400, seconds=0.6, compile_seconds=0.4, peak_rss=321 << 20, budget=330 << 20,
                path="spill", batches=5, why="a tight budget")
    text = s.format()
    assert _line(text, "peak memory") == "321 MiB (budget 330 MiB)"
    assert _line(text, "path") == "spill, 5 buckets (a tight budget)"
    assert _line(text, "time") == "0.60 s (of which loading kernels 0.4 s)"
    assert _line(text, "throughput").startswith("2,000 rollouts/s")  # 400 in the 0.2 s left
    assert Summary(path="stream", batches=1).path_text() == "stream, 1 window"
    assert Summary(path="memory", why="fits in memory").path_text() == "memory (fits in memory)"
    assert Summary(path="ray", batches=8).path_text() == "ray, 8 tasks"
    ray = Summary(path="ray", peak_rss=1 << 30, compile_seconds=2.0, seconds=5.0).format()
    assert _line(ray, "peak memory") == "1,024 MiB"  # no budget on Ray
    assert _line(ray, "time") == "5.00 s (of which compiling kernels 2.0 s)"
