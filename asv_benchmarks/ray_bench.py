"""The Ray path (``chainrows reassemble --ray``) on one machine against the single-process CLI,
on the same dataset, in one run; plus the per-task figures a cluster plan needs.

Every Ray session runs in a network namespace with only loopback up (``unshare --net``, root):
Ray advertises the machine's interface address, and these machines may only talk to loopback.

    python -m asv_benchmarks.ray_bench --gb 1.1 [--shape capture] [--cpus 2]

prints, for the ``--shape`` dataset of ``asv_benchmarks.shapes`` at ``--gb`` of token + logprob
bytes (cached like ``bulk_shapes``):

- single: ``chainrows reassemble DATA OUT`` in a fresh process (process wall);
- ray: ``chainrows reassemble DATA OUT --ray`` in a fresh process (process wall: a local Ray of
  ``--cpus`` CPUs started and stopped, the run, the commit), and inside it the run alone
  (``chainrows.runners.ray.job.run`` on an already started Ray);
- the ratios ray / single, and whether the two outputs are the same tables;
- per decide task: input bytes (Arrow, in memory), seconds, MB/s; and the whole run's
  CPU-seconds per GB of input (run wall x CPUs / input GB), from which README "Many machines"
  sizes a cluster.

The asv class ``RayPath`` times both paths on a small synthetic dataset (fresh processes; the
Ray one namespaced); it is skipped where ``unshare --net`` or Ray is not available.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from asv_benchmarks import common

_INNER = r"""
import json, logging, sys, time
t0 = time.perf_counter()
import ray
ray.init(num_cpus=int(sys.argv[3]), include_dashboard=False, logging_level=logging.WARNING)
started = time.perf_counter() - t0
from chainrows.options import Options
from chainrows.runners.ray.job import run
records = []
t1 = time.perf_counter()
summary = run(sys.argv[1], sys.argv[2], Options(), progress=False, records=records)
seconds = time.perf_counter() - t1
ray.shutdown()
print(json.dumps({"start": started, "run": seconds, "input_bytes": summary.input_bytes,
                  "tasks": records, "rollouts": summary.rollouts}))
"""


def netns_available() -> str | None:
    """None when ``unshare --net`` works here, else why not."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip not installed"
    probe = subprocess.run(["unshare", "--net", "sh", "-c", "ip link set lo up"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare --net not permitted: {probe.stderr.strip()}"


def in_netns(args: list[str], **kw) -> subprocess.CompletedProcess:
    """Run ``args`` in a fresh network namespace with only ``lo`` up."""
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *args],
                          env=env, **kw)


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asv_benchmarks.ray_bench",
                                 description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--gb", type=float, default=1.1, help="token + logprob bytes of the dataset (default 1.1)")
    ap.add_argument("--shape", default="capture", help="a shape of asv_benchmarks.shapes (default capture)")
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="CPUs of the local Ray")
    a = ap.parse_args(argv)
    why = netns_available()
    if why:
        print(f"ray_bench: {why}; the Ray path only runs in a loopback-only namespace here", file=sys.stderr)
        return 2
    from asv_benchmarks.bulk_shapes import dataset

    data = dataset(a.shape, a.gb)
    tmp = Path(tempfile.mkdtemp(prefix="crbench-ray-", dir=common.cache_root()))
    try:
        _cli(["reassemble", str(data), str(tmp / "warm"), "--no-progress"], netns=False)  # kernel cache
        single = _cli(["reassemble", str(data), str(tmp / "single"), "--no-progress"], netns=False)
        ray_cli = _cli(["reassemble", str(data), str(tmp / "ray-cli"), "--ray", "--no-progress"], netns=True)
        p = in_netns([sys.executable, "-c", _INNER, str(data), str(tmp / "ray-api"), str(a.cpus)],
                     capture_output=True, text=True)
        if p.returncode:
            raise RuntimeError(f"the Ray API run failed: {p.stderr[-2000:]}")
        inner = json.loads(p.stdout.strip().splitlines()[-1])
        same = _same_output(tmp / "single", tmp / "ray-cli") and _same_output(tmp / "single", tmp / "ray-api")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    gb_in = inner["input_bytes"] / 1e9
    print(f"dataset: shape {a.shape}, {gb_in:.2f} GB uncompressed input, {inner['rollouts']:,} rollouts; "
          f"local Ray of {a.cpus} CPUs (machine: {os.cpu_count()} cores, shared: expect 2x noise)")
    print(f"{'single-process CLI (process wall)':<44}{single:>9.1f} s")
    print(f"{'--ray CLI (process wall, Ray start included)':<44}{ray_cli:>9.1f} s   ratio {ray_cli / single:5.2f}")
    print(f"{'Ray start alone':<44}{inner['start']:>9.1f} s")
    print(f"{'Ray run alone (chainrows.runners.ray.job.run)':<44}{inner['run']:>9.1f} s   ratio {inner['run'] / single:5.2f}")
    print(f"{'outputs identical to the single-process run':<44}{'yes' if same else 'NO':>9}")
    print(f"{'Ray run, CPU-seconds per GB of input':<44}{inner['run'] * a.cpus / max(gb_in, 1e-9):>9.1f}")
    print(f"{'single, CPU-seconds per GB (x cores)':<44}{single * (os.cpu_count() or 1) / max(gb_in, 1e-9):>9.1f}")
    tasks = inner["tasks"]
    print(f"decide tasks: {len(tasks)}")
    print(f"  {'bucket':>6} {'in (MB)':>9} {'out (MB)':>9} {'seconds':>8} {'MB/s':>7}")
    for t in tasks:
        print(f"  {t['bucket']:>6} {t['in_bytes'] / 1e6:>9.1f} {t['out_bytes'] / 1e6:>9.1f} {t['seconds']:>8.2f} "
              f"{t['in_bytes'] / 1e6 / max(t['seconds'], 1e-9):>7.1f}")
    return 0 if same else 1


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
            import ray.data  # noqa: F401
        except ImportError:
            why = why or "Ray Data is not installed (pip install 'chainrows[ray]')"
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
