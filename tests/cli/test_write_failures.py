"""A write that fails mid-run (disk or quota full, the file-size limit): exit 1, as when the
machine runs out of memory, with one line naming the file being written and the OS error;
no partial ``rows``/``report`` in OUT; the work kept for ``--resume`` said with its size, as on
an interrupt (README "Exit codes"). The same line and exit code for import-gym (its bucket
files too), export-gym and import-jsonl, which leave no dataset or dump."""

from __future__ import annotations

import builtins
import errno
import io
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from chainrows.cli import main
from tests.support.cli_worker import assert_ran, cli  # noqa: F401  (cli is a fixture)
from tests.support.outputs import no_outputs, output_bytes
from tests.support.paths import REPO
from tests.support.tables import small_tables, write_dir

WORK = ".chainrows-work"


@pytest.fixture
def good(tmp_path) -> Path:
    return write_dir(tmp_path / "data", small_tables())


def _one_error_line(res) -> str:
    lines = res.stderr.splitlines()
    assert res.rc == 1 and len(lines) == 1 and res.stderr.endswith("\n"), str(res)
    assert lines[0].startswith("chainrows: error: cannot write ") and "Traceback" not in res.stderr, str(res)
    return lines[0]


ENOSPC = 'OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")'


def _full_disk(patch: str, argv: list, error: str = ENOSPC, where: str = "") -> str:
    """Worker code: run the CLI with ``patch`` (a writer method) raising ``error`` (default
    ENOSPC as pyarrow raises it: an errno, no file name), then restore it. ``where``: only
    for a writer whose ``_target`` holds it."""
    owner, method = patch.rsplit(".", 1)
    return f"""
import errno, pyarrow.ipc, pyarrow.parquet, chainrows.runners.bulk.runs
from chainrows import cli
original = getattr({owner}, {method!r})
def full(self, *args, **kwargs):
    if {where!r} in str(getattr(self, "_target", "")):
        raise {error}
    return original(self, *args, **kwargs)
setattr({owner}, {method!r}, full)
try:
    rc = cli.main({[str(a) for a in argv]!r})
finally:
    setattr({owner}, {method!r}, original)
"""


@pytest.mark.slow
def test_full_disk_while_keeping_a_bucket_names_the_run_and_says_what_resume_keeps(cli, good, tmp_path):
    """The spill path fails writing its first bucket's run: the line names that run file and
    the work left for --resume (which then finishes the job as an uninterrupted run would)."""
    out = tmp_path / "out"
    res = cli.exec(_full_disk("pyarrow.ipc.RecordBatchFileWriter.write_batch",
                              ["reassemble", good, out, "--buckets", "2"]))
    line = _one_error_line(res)
    run = out / WORK / "spill" / "bucket-00000" / "out.rows.arrow.tmp"
    assert line.startswith(f"chainrows: error: cannot write {run}: No space left on device; "
                           f"no output written; {out / WORK} keeps "), line
    assert re.search(r" keeps [\d.]+ [KMG]?B of finished work: run the same command with --resume", line), line
    assert no_outputs(out) and not run.exists()
    assert sorted(os.listdir(out)) == [WORK]  # no staging dir, no lock
    assert_ran(cli.run("reassemble", good, out, "--buckets", "2", "--resume"))
    assert_ran(cli.run("reassemble", good, tmp_path / "whole", "--buckets", "2"))
    assert output_bytes(out) == output_bytes(tmp_path / "whole") and not (out / WORK).exists()


@pytest.mark.parametrize("error,rc,said", [(ENOSPC, 1, "error: cannot write "), ("KeyboardInterrupt()", 130, "interrupted")],
                         ids=["full disk", "interrupt"])
def test_stopped_while_partitioning_keeps_no_work_and_promises_no_resume(cli, good, tmp_path, error, rc, said):
    """Nothing is finished while partitioning (a resumed run would partition again): the work
    dir is removed, the line says no output was written and offers no --resume, and the OUT
    this run made is gone."""
    out = tmp_path / "out"
    res = cli.exec(_full_disk("pyarrow.ipc.RecordBatchFileWriter.write_table",
                              ["reassemble", good, out, "--buckets", "2"], error))
    lines = res.stderr.splitlines()
    assert res.rc == rc and len(lines) == 1 and said in lines[0], str(res)
    assert lines[0].endswith("; no output written") and "--resume" not in lines[0], lines[0]
    if rc == 1:
        assert f"cannot write {out / WORK / 'spill'}/bucket-" in lines[0], lines[0]
    assert not out.exists()


@pytest.mark.parametrize("method,name,named", [("touch", "partitioned", False), ("mkdir", ".chainrows-work", True)],
                         ids=["partitioned marker", "work dir"])
def test_out_of_room_making_a_marker_or_directory_is_a_failed_write(cli, good, tmp_path, method, name, named):
    """A marker file or a directory that cannot be made for want of room (out of inodes) is a
    failed write like a file's: one line naming it, exit 1, not unusable input (exit 2).
    ``named``: the OSError names the path (mkdir's does), else only the writer knows it."""
    out = tmp_path / "out"
    res = cli.exec(f"""
import errno, pathlib
from chainrows import cli
original = pathlib.Path.{method}
def fail(self, *args, **kwargs):
    if self.name == {name!r}:
        raise OSError(errno.ENOSPC, "No space left on device", *([str(self)] if {named!r} else []))
    return original(self, *args, **kwargs)
pathlib.Path.{method} = fail
try:
    rc = cli.main({[str(a) for a in ["reassemble", good, out, "--buckets", "2"]]!r})
finally:
    pathlib.Path.{method} = original
""")
    line = _one_error_line(res)
    path = out / WORK / "partitioned" if name == "partitioned" else out / WORK
    assert line.startswith(f"chainrows: error: cannot write {path}: No space left on device"), line
    assert no_outputs(out)


@pytest.mark.slow
@pytest.mark.parametrize("step,kept", [(0, False), (1, True)])
def test_full_disk_in_a_stream_keeps_the_work_once_a_window_is_finished(cli, tmp_path, step, kept):
    """The stream path: failing to keep its first window leaves nothing --resume reuses (the
    work dir goes); failing on a later one keeps the finished windows and says so."""
    good = tmp_path / "data"  # groups spread over the windows (the small dataset's finish in the last)
    assert_ran(cli.run("synth", good, "--rollouts", "200"))
    out = tmp_path / "out"
    run = f"step-{step:05d}.rows.arrow"
    steps = ["--steps", "3", "--hold-runs", "0"]  # every run written
    res = cli.exec(_full_disk("chainrows.runners.bulk.runs.RunWriter._emit", ["reassemble", good, out, *steps],
                              where=run))
    line = _one_error_line(res)
    assert line.startswith(f"chainrows: error: cannot write {out / WORK / 'windows' / run}.tmp: "
                           "No space left on device; no output written"), line
    assert ("--resume" in line) == kept and (out / WORK).exists() == kept and out.exists() == kept, line
    if kept:
        assert re.search(r" keeps [\d.]+ [KMG]?B of finished work: run the same command with --resume", line), line
        assert_ran(cli.run("reassemble", good, out, *steps, "--resume"))
        assert_ran(cli.run("reassemble", good, tmp_path / "whole", "--steps", "3"))
        assert output_bytes(out) == output_bytes(tmp_path / "whole") and not (out / WORK).exists()


def test_full_disk_while_writing_a_part_names_the_part_and_leaves_no_out(cli, good, tmp_path):
    """The in-memory path fails in a rows part's encoder thread (or the report): the line names
    the staged file; the OUT this run made is gone."""
    out = tmp_path / "out"
    res = cli.exec(_full_disk("pyarrow.parquet.ParquetWriter.write_table", ["reassemble", good, out]))
    line = _one_error_line(res)
    assert re.fullmatch(rf"chainrows: error: cannot write {re.escape(str(out))}/\.chainrows-tmp-[^/]+/"
                        r"(rows/part-\d+\.parquet|report\.parquet): No space left on device; no output written",
                        line), line
    assert not out.exists()


def _file_size_limit(limit: int):
    def preexec():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return preexec


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
@pytest.mark.parametrize("flags", [[], ["--buckets", "2"]])
def test_file_size_limit_in_the_real_process(good, tmp_path, flags):
    """`ulimit -f`: the kernel sends SIGXFSZ, which Python ignores, so the write fails with
    EFBIG: exit 1 and one line naming the file, not a kill and not exit 2 (unusable input)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("CHAINROWS_DEBUG", None)
    argv = [sys.executable, "-m", "chainrows.cli", "reassemble", str(good)]
    warm = subprocess.run(argv + [str(tmp_path / "warm")], cwd=REPO, env=env, capture_output=True, text=True)
    assert warm.returncode == 0, warm.stderr  # the kernel cache is written before the limit applies
    out = tmp_path / "out"
    p = subprocess.run(argv + [str(out), *flags], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=180, preexec_fn=_file_size_limit(1024))
    lines = p.stderr.splitlines()
    assert p.returncode == 1 and len(lines) == 1, p.stderr
    m = re.fullmatch(r"chainrows: error: cannot write (\S+): File too large; no output written(; .*)?", lines[0])
    assert m and Path(m[1]).is_relative_to(out), lines[0]
    assert no_outputs(out)
    if (out / WORK).exists():
        assert m[2].startswith(f"; {out / WORK} keeps ") and "--resume" in m[2], lines[0]
    else:
        assert m[2] is None and not out.exists(), lines[0]


# ----------------------------------------------------------------------------- the other commands

class _FullDisk(io.FileIO):
    """A file on a full disk: every write fails as the kernel's does (ENOSPC, no file name)."""

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")


def _full_disk_for(monkeypatch, inside: str, on: str) -> None:
    """Files Python's ``open`` opens for writing whose path holds ``inside`` are on a full disk;
    ``on``: where the error shows, on the ``write`` call (unbuffered) or on ``close`` (the
    write only filled the buffer, as a small file's does)."""
    real_open = builtins.open

    def full_open(file, mode="r", *args, **kwargs):
        if inside not in str(file) or "w" not in mode:
            return real_open(file, mode, *args, **kwargs)
        unbuffered = on == "write"
        handle = io.BufferedWriter(_FullDisk(file, "w"), 1 if unbuffered else io.DEFAULT_BUFFER_SIZE)
        if "b" in mode:
            return handle
        return io.TextIOWrapper(handle, encoding=kwargs.get("encoding"), write_through=unbuffered)

    monkeypatch.setattr(builtins, "open", full_open)


def _the_error_line(rc: int, err: str) -> str:
    lines = err.splitlines()
    assert rc == 1 and len(lines) == 1 and err.endswith("\n") and "Traceback" not in err, (rc, err)
    return lines[0]


GYM_DUMP = REPO / "examples" / "gym" / "dump"
GYM_RAW = REPO / "examples" / "gym" / "raw"
RAW = [GYM_RAW / f"{name}.jsonl" for name in ("ledger", "tokens", "results")]


@pytest.mark.parametrize("on", ["write", "close"])
def test_import_gym_full_disk_in_a_bucket_file_names_it(tmp_path, capsys, monkeypatch, on):
    """A bucketed import-gym routes the dump's lines into bucket files in its staging dir with
    Python writes: a full disk there is the one line naming the bucket file, exit 1 (once
    'error: No space left on device', exit 2), and no dataset."""
    out = tmp_path / "ds"
    _full_disk_for(monkeypatch, "gym-buckets", on)
    rc = main(["import-gym", str(GYM_DUMP), str(out), "--buckets", "2"])
    line = _the_error_line(rc, capsys.readouterr().err)
    assert re.fullmatch(rf"chainrows: error: cannot write {re.escape(str(out))}/\.chainrows-tmp-[^/]+/gym-buckets/"
                        r"(receipts|staged|results)-[01]\.txt: No space left on device; no output written",
                        line), line
    assert not out.exists()


@pytest.mark.parametrize("on", ["write", "close"])
@pytest.mark.parametrize("previous", ["none", "a dump"])
def test_export_gym_full_disk_names_the_file_and_keeps_the_dump(tmp_path, capsys, monkeypatch, on, previous):
    """export-gym writes its JSON Lines with Python writes, staged in a hidden dir of DUMP: a
    full disk is the one line naming the staged file, exit 1, and DUMP is as it was (absent, or
    the earlier dump's files untouched)."""
    dump = tmp_path / "dump"
    if previous == "a dump":
        assert main(["export-gym", *map(str, RAW), str(dump)]) == 0
        (dump / "staged.jsonl").write_text("earlier\n")  # told apart from a new export
    before = {p.name: p.read_bytes() for p in dump.iterdir()} if dump.exists() else None
    capsys.readouterr()
    _full_disk_for(monkeypatch, ".chainrows-tmp-", on)
    rc = main(["export-gym", *map(str, RAW), str(dump), "--overwrite"])
    line = _the_error_line(rc, capsys.readouterr().err)
    assert re.fullmatch(rf"chainrows: error: cannot write {re.escape(str(dump))}/\.chainrows-tmp-[^/]+/"
                        r"(receipts|staged|results)\.jsonl: No space left on device; no output written",
                        line), line
    if before is None:
        assert not dump.exists()
    else:
        assert {p.name: p.read_bytes() for p in dump.iterdir()} == before


def test_import_jsonl_full_disk_names_the_file(tmp_path, capsys, monkeypatch):
    """import-jsonl writes through write_parquet, which names its file: the same line, exit 1,
    and no dataset."""
    import pyarrow.parquet as pq

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    out = tmp_path / "ds"
    rc = main(["import-jsonl", *map(str, RAW), str(out)])
    line = _the_error_line(rc, capsys.readouterr().err)
    assert re.fullmatch(rf"chainrows: error: cannot write {re.escape(str(out))}/\.chainrows-tmp-[^/]+/"
                        r"(ledger|tokens|rollouts)\.parquet: No space left on device; no output written", line), line
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
@pytest.mark.parametrize("argv", [["import-gym", GYM_DUMP, "OUT", "--buckets", "2"], ["export-gym", *RAW, "OUT"]],
                         ids=["import-gym", "export-gym"])
def test_file_size_limit_in_the_real_process_of_the_gym_commands(tmp_path, argv):
    """`ulimit -f` below the size of a bucket file or an exported file: a real EFBIG from the
    kernel, through Python's buffered writes: exit 1, one line naming the file, no output."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("CHAINROWS_DEBUG", None)
    with_out = lambda out: [sys.executable, "-m", "chainrows.cli"] + [  # noqa: E731
        str(out) if a == "OUT" else str(a) for a in argv]
    warm = subprocess.run(with_out(tmp_path / "warm"), cwd=REPO, env=env, capture_output=True, text=True)
    assert warm.returncode == 0, warm.stderr  # the kernel cache is written before the limit applies
    out = tmp_path / "out"
    p = subprocess.run(with_out(out), cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
                       preexec_fn=_file_size_limit(1024))
    line = _the_error_line(p.returncode, p.stderr)
    m = re.fullmatch(r"chainrows: error: cannot write (\S+): File too large; no output written", line)
    assert m and Path(m[1]).is_relative_to(out), line
    assert not out.exists()


@pytest.mark.parametrize("error, start", [
    ("MemoryError('malloc of size 4096 failed')",
     "chainrows: error: out of memory (malloc of size 4096 failed): give the run a --memory-budget"),
    ("RuntimeError('a bug')", "chainrows: internal error: RuntimeError: a bug"),
])
def test_a_run_that_stops_on_memory_or_a_bug_says_what_resume_keeps(cli, good, tmp_path, error, start):
    """Out of memory or an internal error after the spill path finished partitioning: one line,
    exit 1, and the finished work a rerun with --resume reuses (which then gives the bytes of
    an uninterrupted run), as an interrupt or a failed write says it."""
    out = tmp_path / "out"
    res = cli.exec(f"""
import chainrows.runners.bulk.job
from chainrows import cli
original = chainrows.runners.bulk.job._merge
def fail(*args, **kwargs):
    raise {error}
chainrows.runners.bulk.job._merge = fail
try:
    rc = cli.main({[str(a) for a in ("reassemble", good, out, "--buckets", "2")]!r})
finally:
    chainrows.runners.bulk.job._merge = original
""")
    lines = res.stderr.splitlines()
    assert res.rc == 1 and len(lines) == 1 and "Traceback" not in res.stderr, str(res)
    assert lines[0].startswith(start), lines[0]
    assert re.search(rf"; {re.escape(str(out / WORK))} keeps [\d.]+ [KMG]?B of finished work: run the same "
                     r"command with --resume to reuse it, or delete it$", lines[0]), lines[0]
    assert no_outputs(out)
    assert_ran(cli.run("reassemble", good, out, "--buckets", "2", "--resume"))
    assert_ran(cli.run("reassemble", good, tmp_path / "whole", "--buckets", "2"))
    assert output_bytes(out) == output_bytes(tmp_path / "whole") and not (out / WORK).exists()


def test_the_resume_words_of_a_stop_message_never_raise(monkeypatch):
    """They are only extra words on the one line: an internal error that is itself a broken
    import (the bulk modules cannot load) or a disk that fails while the work dir is measured
    must still give that line, not a traceback."""
    import argparse

    from chainrows import cli as cli_module

    args = argparse.Namespace(command="reassemble", ray=None, out="OUT")

    def broken(a):
        raise ImportError("numba: llvmlite mismatch")

    monkeypatch.setattr(cli_module, "_work_dir", broken)
    assert cli_module._left_behind(args) == ""
    monkeypatch.setattr(cli_module, "_work_dir", lambda a: "OUT/.chainrows-work")
    monkeypatch.setattr("chainrows.runners.bulk.job.holds_finished_work", lambda work: True)
    monkeypatch.setattr(cli_module, "tree_bytes", lambda path: (_ for _ in ()).throw(OSError(5, "I/O error")))
    assert cli_module._left_behind(args) == ""
