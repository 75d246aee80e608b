"""An interrupt at any moment gives exit 130 (nothing written) or, once the output is committed,
0 (the output complete): never a message that no output was written beside a committed one,
never death by the signal during the summary or the interpreter's shutdown."""

import os
import random
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from tests.support.cli_worker import default_sigint
from tests.support.paths import REPO

LATE = r"""
import atexit, os, signal, sys, time
import chainrows.cli as cli
where, out = sys.argv[1], sys.argv[2]
if where == "summary":  # after the commit, before the summary
    said = cli.print_summary
    def late(*a, **k):
        os.kill(os.getpid(), signal.SIGINT); time.sleep(0.05)
        return said(*a, **k)
    cli.print_summary = late
else:  # during the interpreter's shutdown
    atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.05)))
sys.argv = ["chainrows", "synth", out, "--rollouts", "5", "--no-logprobs"]
sys.exit(cli.console_main())
"""


def _env():
    return dict(os.environ, PYTHONPATH=str(REPO))


def _complete(out) -> bool:
    names = sorted(os.listdir(out)) if os.path.isdir(out) else []
    if names != ["ledger.parquet", "rollouts.parquet", "tokens.parquet"]:
        return False
    return pq.read_table(out / "rollouts.parquet").num_rows == 5


@pytest.mark.slow
@pytest.mark.parametrize("where", ["summary", "shutdown"])
def test_interrupt_after_the_commit_exits_0(tmp_path, where):
    res = subprocess.run([sys.executable, "-c", LATE, where, str(tmp_path / "o")], capture_output=True,
                         text=True, env=_env(), timeout=120, preexec_fn=default_sigint)
    assert res.returncode == 0 and _complete(tmp_path / "o"), res.stderr
    assert "Traceback" not in res.stderr and "no output written" not in res.stderr, res.stderr
    assert res.stdout.startswith("chainrows synth"), res.stdout


@pytest.mark.slow
def test_interrupt_at_random_moments(tmp_path):
    """SIGINT at random delays over a whole run, start-up and shutdown included: 130 and no
    output, or 0 and the complete output."""
    rng = random.Random(56)
    argv = [sys.executable, "-m", "chainrows", "synth", "", "--rollouts", "5", "--no-logprobs"]
    for name in ("warm", "timed"):  # the second run's span: the first may compile the kernels
        t0 = time.perf_counter()
        subprocess.run(argv[:4] + [str(tmp_path / name)] + argv[5:], env=_env(), check=True, capture_output=True)
        span = time.perf_counter() - t0
    seen = set()
    for k in range(16):
        out = tmp_path / f"o{k}"
        proc = subprocess.Popen(argv[:4] + [str(out)] + argv[5:], env=_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
        time.sleep(rng.uniform(0.3, 1.1) * span)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode in (0, 130), (proc.returncode, stderr)
        assert "Traceback" not in stderr, stderr
        assert _complete(out) == (proc.returncode == 0), (proc.returncode, stderr)
        seen.add(proc.returncode)
    assert seen == {0, 130}, seen


def test_an_interrupt_waits_for_numbas_compiler_lock():
    """SIGINT while the main thread holds Numba's compiler lock (compiling a kernel, or loading
    one from the cache, inside LLVM's bindings) is raised only once the lock is free: raised
    inside, it left half-made LLVM objects whose finalizers crashed the process (SIGSEGV)."""
    from numba.core.compiler_lock import global_compiler_lock

    from chainrows import cli as cli_module

    previous = signal.getsignal(signal.SIGALRM)
    cli_module._settled.clear()
    cli_module._committed.clear()
    inside = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with global_compiler_lock:
                cli_module._on_sigint(signal.SIGINT, None)  # deferred: nothing raised in here
                time.sleep(0.1)  # the recheck finds the lock still held
                inside.append("done")
            time.sleep(2)  # the recheck raises it now
        assert inside == ["done"]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        cli_module._deferred.clear()
        cli_module._alarm.clear()
        cli_module._settled.set()


def test_an_interrupt_inside_a_finalizer_waits():
    """SIGINT handled inside a ``__del__`` (Python swallows what a finalizer raises, so the
    interrupt was lost: exit 0 and "Exception ignored in ..." on stderr) is raised once out."""
    from chainrows import cli as cli_module

    frames = []

    class Dying:
        def __del__(self):
            frames.append(sys._getframe())

    Dying()
    previous = signal.getsignal(signal.SIGALRM)
    cli_module._settled.clear()
    cli_module._committed.clear()
    said = []
    try:
        with pytest.raises(KeyboardInterrupt):
            cli_module._on_sigint(signal.SIGINT, frames[0])  # deferred: nothing raised
            said.append("deferred")
            time.sleep(2)
        assert said == ["deferred"]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        cli_module._deferred.clear()
        cli_module._alarm.clear()
        cli_module._settled.set()


def test_an_interrupt_during_numbas_own_import_is_not_an_internal_error(monkeypatch):
    """Found by the long fuzz campaign (seed 1014, kills 87): SIGINT while numba's modules were
    still being imported found ``numba.core.compiler_lock`` in sys.modules without its lock
    yet, and the check raised AttributeError (exit 1) instead of letting the interrupt through."""
    import types

    import chainrows.cli as cli

    monkeypatch.setitem(sys.modules, "numba.core.compiler_lock", types.ModuleType("numba.core.compiler_lock"))
    assert cli._in_numba() is False
