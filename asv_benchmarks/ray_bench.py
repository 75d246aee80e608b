"""The Ray path against the single-process command on one machine, in one run: CPU-seconds per
GB of the whole process tree of each (driver, gcs_server, raylet, workers) and the wall ratio,
with Ray's start, run and shutdown reported apart; plus the per-task figures a cluster plan needs.

Every Ray session runs in a network namespace with only loopback up (``unshare --net``, root):
Ray advertises the machine's interface address, and these machines may only talk to loopback.

    python -m asv_benchmarks.ray_bench --gb 1.1 --shapes capture,shuffled --cpus 2 [--repeats 3] [--cli] [--json PATH]

For each shape of ``asv_benchmarks.shapes`` at ``--gb`` of token + logprob bytes (the datasets
of ``asv_benchmarks.bulk_shapes``, cached), after one untimed single-process run (Numba's cache
filled, the files read once), interleaved, best of ``--repeats`` for each figure:

- single: ``python -m chainrows reassemble DATA OUT --no-progress`` in a fresh process;
- Ray: a fresh process in the loopback-only namespace starts a local Ray of ``--cpus`` CPUs
  ("Ray start": from the process start to ``ray.init`` returned), runs
  ``chainrows.runners.ray.job.run`` with ``exclusive=True`` (its workers set up as those of the
  Ray the CLI starts; "Ray run": chainrows' imports included, as in the single process) and shuts Ray down ("Ray shutdown": to the process end);
- with ``--cli``: ``chainrows reassemble DATA OUT --ray`` in a fresh namespaced process.

CPU is the whole process tree's (``asv_benchmarks.tree_cpu``: a cgroup per run, or sampling
/proc where cgroups are not writable; the first line says which). Printed per shape: the input
GB (uncompressed, from the Ray run's summary), each part's wall, CPU-seconds and CPU-seconds per
GB, the ratios Ray / single of CPU and wall with Ray's start excluded and included, whether the
outputs are the same tables, and the decide tasks (count, median MB/s of in-memory input, the
nodes when the records name them). Then one table over the shapes against the targets
(``TARGETS``: Ray run at most 1.5x the single process's CPU-seconds per GB and 1.6x its wall).
Exit 1 when an output differs, 2 when the namespace cannot be made.

The asv class ``RayPath`` times both paths on a small synthetic dataset (fresh processes; the
Ray one namespaced); it is skipped where ``unshare --net`` or Ray is not available.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from asv_benchmarks import common, tree_cpu

TARGETS = {"cpu": 1.5, "wall": 1.6}  # Ray run / single process, start excluded (issue 55)

_INNER = r"""
import json, logging, sys
from asv_benchmarks.tree_cpu import mark
import ray
ray.init(num_cpus=int(sys.argv[3]), include_dashboard=False, logging_level=logging.WARNING)
started = mark()
from chainrows.options import Options
from chainrows.runners.ray.job import run
records = []
summary = run(sys.argv[1], sys.argv[2], Options(), progress=False, records=records, exclusive=True)
ran = mark()
ray.shutdown()
print(json.dumps({"started": started, "ran": ran, "input_bytes": summary.input_bytes,
                  "tasks": records, "rollouts": summary.rollouts}))
"""


def netns_available() -> str | None:
    """None when ``unshare --net`` works here, else why not."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip not installed"
    probe = subprocess.run(["unshare", "--net", "sh", "-c", "ip link set lo up"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare --net not permitted: {probe.stderr.strip()}"


def netns_command(args: list[str]) -> list[str]:
    """``args`` wrapped to run in a fresh network namespace with only ``lo`` up."""
    return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *args]


def _ray_env() -> dict:
    env = common.probe_env()
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env.pop("RAY_ADDRESS", None)
    return env


def in_netns(args: list[str], **kw) -> subprocess.CompletedProcess:
    """Run ``args`` in a fresh network namespace with only ``lo`` up."""
    return subprocess.run(netns_command(args), env=_ray_env(), **kw)


def _cli(args: list[str], netns: bool) -> float:
    """Process wall of ``python -m chainrows ARGS`` (raises on a non-zero exit)."""
    cmd = [sys.executable, "-m", "chainrows", *args]
    t0 = time.perf_counter()
    p = in_netns(cmd, capture_output=True, text=True) if netns else \
        subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise RuntimeError(f"{' '.join(args)} failed: {p.stderr[-2000:]}")
    return wall


def _measured(cmd: list[str], what: str, how: str) -> tree_cpu.Measured:
    m = tree_cpu.run(cmd, env=_ray_env(), how=how)
    if m.returncode:
        raise RuntimeError(f"{what} failed (exit {m.returncode}): {m.stderr[-2000:]}")
    return m


def _single(data: Path, out: Path, how: str) -> dict:
    """Wall and CPU of ``python -m chainrows reassemble DATA OUT`` in a fresh process."""
    shutil.rmtree(out, ignore_errors=True)
    m = _measured([sys.executable, "-m", "chainrows", "reassemble", str(data), str(out), "--no-progress"],
                  "the single-process run", how)
    return {"wall": m.wall, "cpu": m.cpu, "leftovers": m.leftovers}


def _ray_cli(data: Path, out: Path, how: str) -> dict:
    """Wall and CPU of ``chainrows reassemble DATA OUT --ray`` in a fresh namespaced process."""
    shutil.rmtree(out, ignore_errors=True)
    m = _measured(netns_command([sys.executable, "-m", "chainrows", "reassemble", str(data), str(out), "--ray",
                                 "--no-progress"]), "the --ray CLI run", how)
    return {"wall": m.wall, "cpu": m.cpu, "leftovers": m.leftovers}


def _ray(data: Path, out: Path, cpus: int, how: str) -> dict:
    """Ray start, run and shutdown, each's wall and CPU, of one fresh namespaced process."""
    shutil.rmtree(out, ignore_errors=True)
    m = _measured(netns_command([sys.executable, "-c", _INNER, str(data), str(out), str(cpus)]),
                  "the Ray API run", how)
    inner = json.loads(m.stdout.strip().splitlines()[-1])
    started, ran = inner["started"], inner["ran"]
    c_start, c_ran = m.cpu_at(started), m.cpu_at(ran)
    return {"start_wall": started["t"] - m.started, "start_cpu": c_start,
            "run_wall": ran["t"] - started["t"], "run_cpu": c_ran - c_start,
            "shutdown_wall": m.ended - ran["t"], "shutdown_cpu": m.cpu - c_ran,
            "wall": m.wall, "cpu": m.cpu, "leftovers": m.leftovers,
            "input_bytes": inner["input_bytes"], "rollouts": inner["rollouts"], "tasks": inner["tasks"]}


def _best(runs: list[dict]) -> dict:
    """Each numeric figure's minimum over the repeats; the rest from the last repeat."""
    best = dict(runs[-1])
    for key, value in best.items():
        if isinstance(value, float):
            best[key] = min(r[key] for r in runs)
    return best


def _tasks(records: list[dict]) -> dict:
    rates = [r["in_bytes"] / 1e6 / max(r["seconds"], 1e-9) for r in records]
    nodes = sorted({str(r["node"]) for r in records if "node" in r})
    return {"count": len(records), "median_mb_s": statistics.median(rates) if rates else 0.0,
            "seconds": sorted(r["seconds"] for r in records), "nodes": nodes}


def measure_shape(shape: str, gb: float, cpus: int, repeats: int, cli: bool, how: str) -> dict:
    """Every figure of one shape (see the module docstring); outputs compared."""
    from asv_benchmarks.bulk_shapes import dataset

    data = dataset(shape, gb)
    tmp = Path(tempfile.mkdtemp(prefix="crbench-ray-", dir=common.cache_root()))
    try:
        _single(data, tmp / "warm", how)  # Numba's kernel cache, the files read once
        singles, rays, clis = [], [], []
        for _ in range(repeats):
            singles.append(_single(data, tmp / "single", how))
            rays.append(_ray(data, tmp / "ray-api", cpus, how))
            if cli:
                clis.append(_ray_cli(data, tmp / "ray-cli", how))
        same = _same_output(tmp / "single", tmp / "ray-api")
        same_cli = _same_output(tmp / "single", tmp / "ray-cli") if cli else None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ray = _best(rays)
    single = _best(singles)
    gb_in = ray["input_bytes"] / 1e9
    ratios = {"cpu": ray["run_cpu"] / single["cpu"], "wall": ray["run_wall"] / single["wall"],
              "cpu_with_start": (ray["start_cpu"] + ray["run_cpu"]) / single["cpu"],
              "wall_with_start": (ray["start_wall"] + ray["run_wall"]) / single["wall"]}
    return {"shape": shape, "input_gb": gb_in, "rollouts": ray["rollouts"], "repeats": repeats,
            "single": single, "ray": {k: v for k, v in ray.items() if k != "tasks"},
            "ray_cli": _best(clis) if cli else None, "tasks": _tasks(ray["tasks"]), "ratios": ratios,
            "same": same, "same_cli": same_cli}


def _same_output(a: Path, b: Path) -> bool:
    import pyarrow as pa
    import pyarrow.parquet as pq

    def read(out: Path, name: str):
        if (out / f"{name}.parquet").is_file():
            return pq.read_table(out / f"{name}.parquet")
        return pa.concat_tables([pq.read_table(f) for f in sorted((out / name).glob("*.parquet"))])

    return all(same_table(read(a, n), read(b, n)) for n in ("report", "rows"))


def same_table(a, b) -> bool:
    """Schema and every value equal, in order; NaN equals NaN (pyarrow's ``equals`` says a
    NaN reward differs from itself)."""
    import numpy as np
    import pyarrow as pa

    if not a.schema.equals(b.schema) or a.num_rows != b.num_rows:
        return False
    for name in a.column_names:
        x, y = a[name].combine_chunks(), b[name].combine_chunks()
        if pa.types.is_floating(x.type):
            if not x.is_null().equals(y.is_null()):
                return False
            xv = x.fill_null(0).to_numpy(zero_copy_only=False)
            yv = y.fill_null(0).to_numpy(zero_copy_only=False)
            if not np.array_equal(xv, yv, equal_nan=True):
                return False
        elif not x.equals(y):
            return False
    return True


def _print_shape(f: dict, cpus: int) -> None:
    gb, single, ray = f["input_gb"], f["single"], f["ray"]
    print(f"\nshape {f['shape']}: {gb:.2f} GB uncompressed input, {f['rollouts']:,} rollouts, best of {f['repeats']}")
    print(f"  {'':<40}{'wall s':>9}{'CPU s':>9}{'CPU s/GB':>10}")

    def row(label, wall, cpu, per_gb=True):
        print(f"  {label:<40}{wall:>9.1f}{cpu:>9.1f}" + (f"{cpu / max(gb, 1e-9):>10.1f}" if per_gb else ""))

    row("single-process CLI", single["wall"], single["cpu"])
    row(f"Ray start (local, {cpus} CPUs)", ray["start_wall"], ray["start_cpu"], per_gb=False)
    row("Ray run (chainrows.runners.ray.job.run)", ray["run_wall"], ray["run_cpu"])
    row("Ray shutdown", ray["shutdown_wall"], ray["shutdown_cpu"], per_gb=False)
    row("Ray process (start + run + shutdown)", ray["wall"], ray["cpu"])
    if f["ray_cli"]:
        row("--ray CLI (process)", f["ray_cli"]["wall"], f["ray_cli"]["cpu"])
    r = f["ratios"]
    print(f"  {'ratio Ray run / single (start excluded)':<40}{r['wall']:>9.2f}{'':>9}{r['cpu']:>10.2f}")
    print(f"  {'ratio Ray start + run / single':<40}{r['wall_with_start']:>9.2f}{'':>9}{r['cpu_with_start']:>10.2f}")
    same = "yes" if f["same"] else "NO"
    if f["same_cli"] is not None:
        same += ", --ray CLI " + ("yes" if f["same_cli"] else "NO")
    print(f"  outputs identical to the single-process run: {same}")
    t = f["tasks"]
    secs = f"{t['seconds'][0]:.1f} to {t['seconds'][-1]:.1f} s" if t["seconds"] else "-"
    nodes = f", nodes {', '.join(t['nodes'])}" if t["nodes"] else ""
    print(f"  decide tasks: {t['count']}, {secs} each, median {t['median_mb_s']:.0f} MB/s of in-memory input{nodes}")
    left = single["leftovers"] + ray["leftovers"] + (f["ray_cli"]["leftovers"] if f["ray_cli"] else 0)
    if left:
        print(f"  processes left running after their run ended, killed: {left}")


def _print_summary(figures: list[dict]) -> None:
    print(f"\n{'shape':<10}{'GB':>6}  {'CPU/GB ratio':>12} {'target':>6}  {'wall ratio':>10} {'target':>6}"
          f"  {'with start: CPU':>15} {'wall':>6}  same")
    for f in figures:
        r = f["ratios"]
        cpu_mark = "PASS" if r["cpu"] <= TARGETS["cpu"] else "MISS"
        wall_mark = "PASS" if r["wall"] <= TARGETS["wall"] else "MISS"
        print(f"{f['shape']:<10}{f['input_gb']:>6.2f}  {r['cpu']:>7.2f} {cpu_mark:<4} {TARGETS['cpu']:>6.1f}"
              f"  {r['wall']:>5.2f} {wall_mark:<4} {TARGETS['wall']:>6.1f}  {r['cpu_with_start']:>15.2f}"
              f" {r['wall_with_start']:>6.2f}  {'yes' if f['same'] and f['same_cli'] is not False else 'NO'}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asv_benchmarks.ray_bench",
                                 description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--gb", type=float, default=1.1, help="token + logprob bytes of each dataset (default 1.1)")
    ap.add_argument("--shapes", default="capture,shuffled",
                    help="comma-separated shapes of asv_benchmarks.shapes (default capture,shuffled)")
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="CPUs of the local Ray (default: all)")
    ap.add_argument("--repeats", type=int, default=1, help="interleaved runs per path; best of them (default 1)")
    ap.add_argument("--cli", action="store_true", help="also the `chainrows reassemble --ray` process")
    ap.add_argument("--json", metavar="PATH", help="write every figure to this JSON file")
    ap.add_argument("--measure", choices=("auto", "cgroup v1", "cgroup v2", "proc"), default="auto",
                    help="how CPU-seconds are measured (asv_benchmarks.tree_cpu; default: the first that works)")
    a = ap.parse_args(argv)
    why = netns_available()
    if why:
        print(f"ray_bench: {why}; the Ray path only runs in a loopback-only namespace here", file=sys.stderr)
        return 2
    how = tree_cpu.method() if a.measure == "auto" else a.measure
    if not tree_cpu.available(how):
        print(f"ray_bench: --measure {how!r} cannot measure here", file=sys.stderr)
        return 2
    load = os.getloadavg()
    print(f"CPU-seconds: whole process tree, by {how}; local Ray of {a.cpus} CPUs; machine: {os.cpu_count()} "
          f"cores, load {load[0]:.1f} at start")
    figures = []
    for shape in [s for s in a.shapes.split(",") if s]:
        figures.append(measure_shape(shape, a.gb, a.cpus, max(a.repeats, 1), a.cli, how))
        _print_shape(figures[-1], a.cpus)
    _print_summary(figures)
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (on {os.cpu_count()} cores; above that, walls are shared)")
    if a.json:
        Path(a.json).write_text(json.dumps({"argv": sys.argv[1:] if argv is None else list(argv), "method": how,
                                            "cpus": a.cpus, "cores": os.cpu_count(), "load_at_start": load[0],
                                            "targets": TARGETS, "shapes": figures}, indent=1))
    return 0 if all(f["same"] and f["same_cli"] is not False for f in figures) else 1


class RayPath:
    """Fresh-process walls of ``chainrows reassemble`` with and without ``--ray`` (a local Ray
    of 2 CPUs in a loopback-only namespace) on 2,048 synthetic rollouts."""

    timeout = 600
    number = 1
    repeat = 1
    warmup_time = 0
    n = 2048

    def setup(self):
        why = netns_available()
        try:
            import ray  # noqa: F401
        except ImportError:
            why = why or "Ray is not installed (pip install 'chainrows[ray]')"
        if why:
            raise NotImplementedError(why)  # asv: skip
        self.data = common.synth_dataset_dir(self.n)
        self.tmp = Path(tempfile.mkdtemp(prefix="crbench-raypath-"))
        _cli(["reassemble", str(self.data), str(self.tmp / "warm"), "--no-progress"], netns=False)

    def teardown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def time_single_process(self):
        _cli(["reassemble", str(self.data), str(self.tmp / "single"), "--no-progress", "--overwrite"], netns=False)

    def time_ray_local(self):
        _cli(["reassemble", str(self.data), str(self.tmp / "ray"), "--ray", "--no-progress", "--overwrite"],
             netns=True)


if __name__ == "__main__":
    sys.exit(main())
