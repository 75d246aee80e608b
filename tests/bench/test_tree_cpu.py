"""asv_benchmarks.tree_cpu: each method counts the CPU of a grandchild the child waits for and
of one it orphans, and a mark read inside the child sees what the tree used up to then."""

from __future__ import annotations

import json
import os
import sys

import pytest

from asv_benchmarks import tree_cpu
from tests.support.paths import REPO

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
SLOW = pytest.mark.slow  # over a second here: the fast tier keeps cgroup v1 and proc counts
COUNTS = ["cgroup v1", pytest.param("cgroup v2", marks=SLOW), "proc"]
MARKS = [pytest.param(how, marks=SLOW) for how in ("cgroup v1", "cgroup v2", "proc")]


def _need(how: str) -> None:
    if not tree_cpu.available(how):
        pytest.skip(f"{how} cannot measure here (a cgroup needs root and a writable hierarchy)")


@pytest.mark.parametrize("how", COUNTS)
def test_counts_a_waited_and_an_orphaned_grandchild(how, tmp_path):
    """The child (sh) starts two burners of 0.3 CPU-s: one it waits for, one in a subshell that
    exits at once (the burner is orphaned); it ends when the orphan's file appears."""
    _need(how)
    done = tmp_path / "done"
    script = ('"$0" -c "$1" & ( ("$0" -c "$1"; touch "$2") & ); wait; '
              'while [ ! -e "$2" ]; do sleep 0.02; done')
    m = tree_cpu.run(["sh", "-c", script, sys.executable, BURN, str(done)], how=how)
    assert m.returncode == 0, m.stderr
    assert m.method == how
    assert 0.58 <= m.cpu < 0.6 + 0.8, m.cpu  # two burners, plus interpreter starts
    assert m.cpu <= 2 * m.wall + 0.1  # two cores at most


@pytest.mark.parametrize("how", MARKS)
def test_mark_inside_the_child_sees_the_tree_so_far(how):
    """After its grandchild burned 0.3 CPU-s the child marks, then burns 0.3 more itself; under
    ``proc`` it sleeps around the mark so that two samples hold it."""
    _need(how)
    pause = "time.sleep(0.45)" if how == "proc" else "pass"
    child = ("import json, subprocess, sys, time\nfrom asv_benchmarks.tree_cpu import mark\n"
             f"subprocess.run([sys.executable, '-c', sys.argv[1]], check=True)\n{pause}\n"
             f"print(json.dumps(mark()), flush=True)\n{pause}\nexec(sys.argv[1])")
    env = dict(os.environ, PYTHONPATH=str(REPO))  # the child imports asv_benchmarks
    m = tree_cpu.run([sys.executable, "-c", child, BURN], env=env, how=how)
    assert m.returncode == 0, m.stderr
    at = m.cpu_at(json.loads(m.stdout))
    assert 0.3 <= at <= m.cpu - 0.29, (at, m.cpu)


@pytest.mark.slow  # over a second: the burner must outlive a few samples
@pytest.mark.parametrize("how", ["cgroup v1", "proc"])
def test_counts_a_grandchild_whose_parent_ignores_sigchld(how):
    """The kernel reaps the burner without adding its times to its parent's (as for Ray's
    raylet and its workers): ``proc`` must still count it, from its last samples (the burner
    idles 0.3 s after burning so that a sample sees all of it; the child outlives it by 0.5 s,
    so the last samples have it only as uncollected)."""
    _need(how)
    child = ("import os, signal, subprocess, sys, time\nsignal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
             "p = subprocess.Popen([sys.executable, '-c', sys.argv[1]])\n"
             "while os.path.exists(f'/proc/{p.pid}'): time.sleep(0.02)\ntime.sleep(0.5)")
    m = tree_cpu.run([sys.executable, "-c", child, BURN + "\ntime.sleep(0.3)"], how=how)
    assert m.returncode == 0, m.stderr
    assert 0.28 <= m.cpu < 0.3 + 0.8, m.cpu
