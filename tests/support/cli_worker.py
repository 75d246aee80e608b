"""A long-lived CLI worker for tests that run ``chainrows`` many times: ``chainrows.cli.main(argv)``
(or a code snippet) in a persistent child process, so a crash is seen as a crash, with the input
that caused it, instead of killing pytest; the worker pays the numba/pyarrow start-up once.

A test module takes the ``cli`` fixture by importing it (``from tests.support.cli_worker import cli``).
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.paths import REPO

_WORKER = r"""
import json, os, sys, traceback
proto = os.fdopen(os.dup(1), "w")
home = os.getcwd()
def run(req):
    if req.get("cwd"):
        os.chdir(req["cwd"])
    if "argv" in req:
        from chainrows import cli
        return cli.main(req["argv"])
    ns = {}
    exec(req["code"], ns)
    return ns.get("rc", 0)
for line in sys.stdin:
    req = json.loads(line)
    with open(req["stdout"], "wb") as fo, open(req["stderr"], "wb") as fe:
        sys.stdout.flush(); sys.stderr.flush()
        s1, s2 = os.dup(1), os.dup(2)
        os.dup2(fo.fileno(), 1); os.dup2(fe.fileno(), 2)
        try:
            try:
                rc = run(req)
            except SystemExit as exc:  # argparse
                rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:  # what `python -m chainrows.cli` would do: traceback, exit 1
                traceback.print_exc()
                rc = 1
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os.dup2(s1, 1); os.dup2(s2, 2); os.close(s1); os.close(s2)
            os.chdir(home)
    proto.write(json.dumps({"rc": rc}) + "\n"); proto.flush()
"""


def default_sigint() -> None:
    """In the child, before it runs: SIGINT's default disposition. A campaign started in the
    background by a shell (``cmd &``) has SIGINT ignored, which children inherit and Python then
    leaves alone, so the SIGINT cases would test nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def without_compile_notice(stderr: str) -> str:
    """``stderr`` without the line a command says while Numba compiles kernels (chainrows.cli.common
    .COMPILING): said on a cold or stale kernel cache only, so it depends on what ran before."""
    from chainrows.cli.common import COMPILING

    return stderr.replace(COMPILING + "\n", "")


@dataclass
class CliResult:
    rc: int | str  # exit code; -N for a signal; "timeout"
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return f"rc={self.rc!r}\n--- stdout\n{self.stdout[-2000:]}\n--- stderr\n{self.stderr[-4000:]}"


class CliWorker:
    """Runs ``chainrows.cli.main(argv)`` (or a code snippet) in a persistent child process, with
    its fds 1 and 2 captured per request. A crash or a hang kills only the worker, which is
    restarted for the next request."""

    def __init__(self):
        self.proc = None
        self.tmp = Path(tempfile.mkdtemp(prefix="chainrows-worker-"))
        self.started = 0

    def _start(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        env.pop("CHAINROWS_DEBUG", None)
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, cwd=str(REPO), env=env)
        self.started += 1

    def _request(self, req: dict, timeout: float) -> CliResult:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        out, err = self.tmp / "stdout", self.tmp / "stderr"
        for f in (out, err):
            f.unlink(missing_ok=True)
        req = dict(req, stdout=str(out), stderr=str(err))
        self.proc.stdin.write((json.dumps(req) + "\n").encode())
        self.proc.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout)
        sel.close()
        line = self.proc.stdout.readline() if ready else b""
        text = lambda f: f.read_text(errors="replace") if f.exists() else ""  # noqa: E731
        if not ready:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            return CliResult("timeout", text(out), text(err))
        if not line:  # the worker died
            rc = self.proc.wait()
            self.proc = None
            return CliResult(rc if rc < 0 else f"died({rc})", text(out), text(err))
        return CliResult(json.loads(line)["rc"], text(out), without_compile_notice(text(err)))

    def run(self, *argv, timeout: float = 120, cwd=None) -> CliResult:
        """``chainrows.cli.main(argv)``; ``cwd``: the directory it runs in (default the repository)."""
        return self._request({"argv": [str(a) for a in argv], "cwd": str(cwd) if cwd else None}, timeout)

    def exec(self, code: str, timeout: float = 120) -> CliResult:
        """Run a code snippet in the worker; it sets ``rc`` (default 0)."""
        return self._request({"code": code}, timeout)

    def close(self):
        if self.proc is not None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def cli():
    worker = CliWorker()
    yield worker
    worker.close()


def assert_clean_error(res: CliResult, *needles: str) -> str:
    """Exit 2, exactly one line on stderr, ``chainrows: error: ...`` holding every needle."""
    assert res.rc == 2, str(res)
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and res.stderr.endswith("\n"), f"stderr is not one line:\n{res}"
    line = lines[0]
    assert line.startswith("chainrows: error: "), str(res)
    for needle in needles:
        assert needle in line, f"{needle!r} not in the error line:\n{res}"
    return line


def assert_ran(res: CliResult) -> None:
    """Exit 0, nothing on stderr (no warning, no traceback)."""
    assert res.rc == 0 and res.stderr == "", str(res)
