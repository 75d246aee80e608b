"""A chainrows command's peak memory, for the budget tests: the command runs in a fresh
interpreter that reads its own VmHWM at the end. (ru_maxrss survives execve on Linux, so a child
forked from a big pytest process would report the parent's RSS at fork time: measured ~1 GiB
for a 495 MiB run.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PEAK_SCRIPT = r"""
import sys
from chainrows.cli import main
rc = main(sys.argv[1:])
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print(rc, int(hwm.split()[1]) * 1024)
"""


def peak_run(*args) -> tuple[int, int, subprocess.CompletedProcess]:
    """``chainrows ARGS`` in a fresh interpreter: its exit code, peak resident bytes, and the
    process (stdout ends with a line of those two)."""
    res = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, *map(str, args)],
                         capture_output=True, text=True, check=True)
    rc, peak = map(int, res.stdout.strip().splitlines()[-1].split())
    return rc, peak, res


def at_smallest_budget(command: str, source, work: Path) -> tuple[int, int, subprocess.CompletedProcess]:
    """``chainrows COMMAND SOURCE OUT --memory-budget B`` (SOURCE: a path, or a list of the
    command's inputs) at the smallest budget B (MiB) the
    command names when refused (``work/no``), plus the few MiB another process's baseline may
    differ by: B, the accepted run's peak bytes and its process (outputs under ``work``)."""
    rc, _, refused = peak_run(command, *(source if isinstance(source, (list, tuple)) else [source]), work / "no",
                              "--memory-budget", "1MiB")
    assert rc == 2, refused.stdout + refused.stderr
    smallest = int(refused.stderr.strip().rsplit(" is ", 1)[1].split()[0].replace(",", ""))
    for extra in (4, 12, 24):  # a budget this process refuses is tried a little higher
        budget = smallest + extra
        rc, peak, res = peak_run(command, *(source if isinstance(source, (list, tuple)) else [source]),
                                 work / f"out{extra}", "--memory-budget", f"{budget}MiB")
        if rc == 0:
            break
    assert rc == 0, res.stdout + res.stderr
    return budget, peak, res
