"""CPU-seconds of a whole process tree: one child and every process it starts (for Ray: the
driver, gcs_server, raylet and its workers, all of their threads), daemonized ones included.

Three methods, the first that works here is used (``method()`` says which):

- ``cgroup v1``: the child joins a fresh ``cpuacct`` cgroup before it execs (a ``sh`` wrapper),
  so every descendant is in it; ``cpuacct.usage`` (ns) is the tree's CPU time. Needs a writable
  ``/sys/fs/cgroup/cpuacct`` (root).
- ``cgroup v2``: the same with a fresh cgroup of the unified hierarchy (``/sys/fs/cgroup/unified``
  or ``/sys/fs/cgroup``) and ``cpu.stat``'s ``usage_usec``.
- ``proc``: this process becomes a child subreaper for the run (orphaned descendants are
  reparented to it) and samples ``/proc`` every 0.2 s: utime + stime + cutime + cstime of the
  child, the adopted orphans and their descendants, and the times of those that ended that no
  parent collected. The total is this process's children rusage once the child and every
  adopted orphan are waited for (leftovers killed first), plus those uncollected times, and at
  least the last sample. A process whose parent ignores SIGCHLD loses what it used after its
  last sample (all of it if it lived under 0.2 s): a lower bound.

The measured child can read its tree's CPU so far with ``mark()`` (a cgroup path in the
environment variable ``CHAINROWS_BENCH_CPU``); under ``proc`` a mark carries only its time and
``Measured.cpu_at`` reads the parent's samples at that time (linear between two samples).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ENV = "CHAINROWS_BENCH_CPU"
_V1 = Path("/sys/fs/cgroup/cpuacct")
_V2 = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
_JOIN = 'echo $$ > "$0" && exec "$@"'  # sh -c: join the cgroup whose cgroup.procs is $0, then exec
_TICK = os.sysconf("SC_CLK_TCK")
SAMPLE_SECONDS = 0.2


def _cgroup_base(method: str) -> tuple[Path, str] | None:
    """(parent directory, usage file name) of ``method``'s cgroups, when writable here."""
    if method == "cgroup v1":
        candidates = [(_V1, "cpuacct.usage")]
    elif method == "cgroup v2":
        candidates = [(p, "cpu.stat") for p in _V2 if (p / "cgroup.controllers").exists()]
    else:
        return None
    for base, usage in candidates:
        if (base / usage).exists() and os.access(base, os.W_OK):
            return base, usage
    return None


def available(how: str) -> bool:
    """Whether ``how`` (``cgroup v1``, ``cgroup v2`` or ``proc``) can measure here: for a cgroup
    method, a cgroup can be made (root, a writable hierarchy)."""
    if how == "proc":
        return os.path.isdir("/proc/self")
    base = _cgroup_base(how)
    if base is None:
        return False
    probe = base[0] / f"chainrows-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return False
    return True


def method() -> str:
    """The first of ``cgroup v1``, ``cgroup v2``, ``proc`` that works here."""
    return next(how for how in ("cgroup v1", "cgroup v2", "proc") if available(how))


def read_usage(path: str | os.PathLike) -> float:
    """CPU-seconds in a cgroup's usage file (v1 ``cpuacct.usage`` in ns, v2 ``cpu.stat``)."""
    text = Path(path).read_text()
    if Path(path).name == "cpu.stat":
        return next(int(line.split()[1]) for line in text.splitlines() if line.startswith("usage_usec")) / 1e6
    return int(text) / 1e9


def mark() -> dict:
    """Inside a measured child: ``{"t": monotonic seconds, "cpu": the tree's CPU-seconds so far}``
    (``cpu`` None under ``proc``: ``Measured.cpu_at`` fills it from the parent's samples)."""
    path = os.environ.get(ENV)
    return {"t": time.monotonic(), "cpu": read_usage(path) if path else None}


@dataclass
class Measured:
    """One measured run: exit code, output, wall (monotonic start and end), the tree's CPU."""

    returncode: int
    stdout: str
    stderr: str
    started: float
    ended: float
    cpu: float
    method: str
    leftovers: int = 0  # processes still in the cgroup after the child exited (killed)
    samples: list = field(default_factory=list)  # proc: (monotonic, CPU-seconds so far)

    @property
    def wall(self) -> float:
        return self.ended - self.started

    def cpu_at(self, m: dict) -> float:
        """The tree's CPU-seconds at a ``mark()`` the child printed."""
        if m.get("cpu") is not None:
            return m["cpu"]
        points = [(self.started, 0.0), *self.samples, (self.ended, self.cpu)]
        for (t0, c0), (t1, c1) in zip(points, points[1:]):
            if t0 <= m["t"] <= t1:
                return c0 + (c1 - c0) * ((m["t"] - t0) / (t1 - t0) if t1 > t0 else 1.0)
        return self.cpu


def run(cmd: list[str], env: dict | None = None, how: str | None = None) -> Measured:
    """Run ``cmd`` to its end (stdout and stderr to files, so a leftover descendant holding them
    cannot block) and measure its tree's CPU with ``how`` (default: ``method()``)."""
    how = how or method()
    env = dict(os.environ if env is None else env)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        if how == "proc":
            env.pop(ENV, None)
            got = _run_sampled(cmd, env, out, err)
        else:
            got = _run_in_cgroup(cmd, env, out, err, how)
        out.seek(0)
        err.seek(0)
        got.stdout, got.stderr = out.read(), err.read()
    return got


def _run_in_cgroup(cmd, env, out, err, how: str) -> Measured:
    base, usage_name = _cgroup_base(how)
    group = Path(tempfile.mkdtemp(prefix="chainrows-bench-", dir=base))
    usage = group / usage_name
    env[ENV] = str(usage)
    try:
        t0 = time.monotonic()
        code = subprocess.run(["sh", "-c", _JOIN, str(group / "cgroup.procs"), *cmd], env=env,
                              stdout=out, stderr=err).returncode
        t1 = time.monotonic()
        cpu = read_usage(usage)
        leftovers = _empty(group)
    finally:
        _empty(group)
        group.rmdir()
    return Measured(code, "", "", t0, t1, cpu, how, leftovers)


def _empty(group: Path) -> int:
    """Kill what is left in the cgroup and wait until it is empty; how many there were."""
    seen = set()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        if not pids:
            break
        for pid in pids:
            seen.add(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return len(seen)


def _stat(pid: int) -> tuple[int, str, float, float] | None:
    """(ppid, state, utime + stime, cutime + cstime) of a pid in /proc, in seconds."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state is fields[0]
    return int(fields[1]), fields[0], (int(fields[11]) + int(fields[12])) / _TICK, \
        (int(fields[13]) + int(fields[14])) / _TICK


def _all_stats() -> dict:
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            s = _stat(int(entry))
            if s is not None:
                stats[int(entry)] = s
    return stats


def _subreaper(on: bool) -> bool:
    """Make this process collect its orphaned descendants (Linux prctl PR_SET_CHILD_SUBREAPER)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(36, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class _Sampler:
    """The /proc samples of one tree: the root, its descendants, and the orphans this process
    (a subreaper) adopted; each one's utime + stime + cutime + cstime, plus ``lost``: the times
    of processes that ended and that no parent collected (a parent that ignores SIGCHLD, as
    Ray's raylet does, reaps its children without adding their times to its own)."""

    def __init__(self, root: int):
        self.root, self.samples, self.lost, self.last = root, [], 0.0, {}

    def sample(self) -> None:
        me = os.getpid()
        stats = _all_stats()
        tree = {p for p, s in stats.items() if p == self.root or s[0] == me}
        grew = True
        while grew:
            new = {p for p, s in stats.items() if s[0] in tree and p not in tree}
            tree |= new
            grew = bool(new)
        now = {p: stats[p] for p in tree}
        ended = sum(s[2] + s[3] for p, s in self.last.items() if p not in now)
        collected = sum(max(s[3] - self.last[p][3], 0.0) for p, s in now.items() if p in self.last)
        self.lost += max(ended - collected, 0.0)
        self.last = now
        self.samples.append((time.monotonic(), self.lost + sum(s[2] + s[3] for s in now.values())))


def _collect_orphans(deadline_seconds: float = 10) -> int:
    """Kill and wait for every child of this process still there (orphans it adopted); how many
    were still running."""
    me, seen = os.getpid(), set()
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        children = {p: s[1] for p, s in _all_stats().items() if s[0] == me}
        if not children:
            break
        for pid, state in children.items():
            if state != "Z":
                seen.add(pid)
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
    return len(seen)


def _run_sampled(cmd, env, out, err) -> Measured:
    """The root's and every adopted orphan's rusage, once all are waited for, is the tree's CPU."""
    adopted = _subreaper(True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
        sampler, done = _Sampler(p.pid), threading.Event()

        def loop():
            while not done.wait(SAMPLE_SECONDS):
                sampler.sample()

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            code = p.wait()
        finally:
            done.set()
            thread.join()
        t1 = time.monotonic()
        leftovers = _collect_orphans() if adopted else 0
    finally:
        if adopted:
            _subreaper(False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) + sampler.lost
    samples = [(t, c) for t, c in sampler.samples if t < t1]
    if samples:  # one that ended uncollected after the last sample: its times of that sample
        cpu = max(cpu, samples[-1][1])
    return Measured(code, "", "", t0, t1, cpu, "proc", leftovers, samples)
