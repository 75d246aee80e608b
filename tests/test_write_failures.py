"""A write that fails mid-run (disk or quota full, the file-size limit): exit 1, as when the
machine runs out of memory, with one line naming the file being written and the OS error;
no partial ``rows``/``report`` in OUT; the work kept for ``--resume`` said with its size, as on
an interrupt (README "Exit codes")."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli import _tables
from test_fuzz import REPO, assert_ran, cli, write_dir  # noqa: F401  (cli is a fixture)
from outputs import no_outputs, output_bytes

WORK = ".chainrows-work"


@pytest.fixture
def good(tmp_path) -> Path:
    return write_dir(tmp_path / "data", _tables())


def _one_error_line(res) -> str:
    lines = res.stderr.splitlines()
    assert res.rc == 1 and len(lines) == 1 and res.stderr.endswith("\n"), str(res)
    assert lines[0].startswith("chainrows: error: cannot write ") and "Traceback" not in res.stderr, str(res)
    return lines[0]


def _full_disk(patch: str, argv: list) -> str:
    """Worker code: run the CLI with ``patch`` (a pyarrow writer method) raising ENOSPC as
    pyarrow does (an errno, no file name), then restore it."""
    owner, method = patch.rsplit(".", 1)
    return f"""
import errno, pyarrow.ipc, pyarrow.parquet
from chainrows import cli
def full(self, *args, **kwargs):
    raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")
setattr({owner}, {method!r}, full)
try:
    rc = cli.main({[str(a) for a in argv]!r})
finally:
    delattr({owner}, {method!r})
"""


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
