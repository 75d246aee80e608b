"""``chainrows import-calls`` on gigabytes of realistic call logs, against the pyarrow floor.

Logs come from ``asv_benchmarks.call_logs`` (not from chainrows' own synth): conversations whose
prompts grow to 4k-32k tokens over 20-200 calls, compactions, rejected retries, re-tokenized
turns, logprobs on every generated token, rollouts interleaved, Parquet in row groups of ~64 MB
of tokens (columns in many chunks). Shapes:

- ``long``: that log;
- ``short``: many short calls (100-400 calls of 300-2,000-token prompts): per-call costs;
- ``crowded``: the long shape with 512 rollouts side by side instead of 32 (more open state).

For each shape and format (Parquet, JSON Lines), in fresh processes, interleaved, best of
``--repeats``:

- the command: ``chainrows import-calls LOG RESULTS OUT`` at default settings, its whole
  process wall (interpreter start, kernel load and the durable commit included) and peak RSS;
- the floor: a fresh process that reads the same log with pyarrow (Parquet: the columns the
  import reads; JSON Lines: ``pyarrow.json.read_json`` of the whole file) and writes the same
  dataset the import wrote (its tables read back untimed, written with chainrows' writer
  options); only the read and the write are timed. Both run without transparent huge pages
  (as the command runs itself; ``--system-huge-pages`` leaves the floor the system's setting).
- a bounded run: ``--memory-budget`` a quarter of the log's size on disk (JSON Lines) or of its
  decoded values (Parquet), at least the smallest budget the command accepts: its path and
  peak RSS against the budget.

    python -m asv_benchmarks.import_calls --gb 2 --repeats 3
    python -m asv_benchmarks.import_calls --gb 0.5 --shapes short --formats parquet

The asv class ``ImportCalls`` times the in-process import of a small log of each format.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from asv_benchmarks import call_logs
from asv_benchmarks.common import cache_root

SHAPES = {
    "long": (call_logs.Shape(), call_logs.ACTIVE),
    "short": (call_logs.Shape(min_calls=100, max_calls=400, min_prompt=300, max_prompt=2_000, system_tokens=100),
              call_logs.ACTIVE),
    "crowded": (call_logs.Shape(), 512),
}
COLUMNS = ["rollout_id", "call_id", "prompt_ids", "completion_ids", "completion_logprobs", "output_items"]

_RUN = r"""
import json, sys, time
from chainrows.cli import main
t = time.perf_counter()
rc = main(sys.argv[1:], own_process=True)
wall = time.perf_counter() - t
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print(json.dumps({"rc": rc, "wall": wall, "peak": int(hwm.split()[1]) * 1024}))
"""

_FLOOR = r"""
import json, sys, time
import pyarrow as pa, pyarrow.json as pj, pyarrow.parquet as pq
from chainrows.memory.process import set_huge_pages
from chainrows.outdir.parquet import WRITE_OPTIONS
log, out, dst, columns, thp = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), sys.argv[5]
if thp == "off":
    set_huge_pages(False)
t = time.perf_counter()
table = pq.read_table(log, columns=columns) if log.endswith(".parquet") else pj.read_json(log)
read = time.perf_counter() - t
del table
write = 0.0
for name in ("ledger", "tokens", "import_report.parquet", "rollouts.parquet"):
    table = pq.read_table(f"{out}/{name}")
    t = time.perf_counter()
    pq.write_table(table, f"{dst}/{name.split('.')[0]}.parquet", **WRITE_OPTIONS)
    write += time.perf_counter() - t
print(json.dumps({"read": read, "write": write, "seconds": read + write}))
"""


def log_paths(shape: str, fmt: str, gb: float, seed: int = 0) -> tuple[Path, Path]:
    """The cached log of ``shape`` in ``fmt`` (about ``gb`` GB of token and logprob values)."""
    version = hashlib.sha1(Path(call_logs.__file__).read_bytes()).hexdigest()[:8]  # the generator's code
    folder = cache_root() / f"calls-{shape}-{gb:g}gb-s{seed}-{fmt}-{version}"
    log = folder / ("calls.parquet" if fmt == "parquet" else "calls.jsonl")
    if not (folder / "done").exists():
        shutil.rmtree(folder, ignore_errors=True)
        spec, active = SHAPES[shape]
        previous, call_logs.ACTIVE = call_logs.ACTIVE, active
        try:
            call_logs.write_call_log(folder, int(gb * 1e9), seed, fmt, spec)
        finally:
            call_logs.ACTIVE = previous
        (folder / "done").write_text("")
    return log, folder / "results.jsonl"


def _python(code: str, *args) -> dict:
    res = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True)
    if res.returncode != 0 or not res.stdout.strip():
        raise RuntimeError(f"{args}: {res.stderr.strip()[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_import(log: Path, results: Path, out: Path, *extra) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    got = _python(_RUN, "import-calls", log, results, out, "--no-progress", *extra)
    if got["rc"] != 0:
        raise RuntimeError(f"import-calls exited {got['rc']}")
    return got


def run_floor(log: Path, out: Path, work: Path, thp: str) -> dict:
    dst = work / "floor"
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    return _python(_FLOOR, log, out, dst, json.dumps(COLUMNS), thp)


def smallest_budget(log: Path, results: Path, work: Path) -> int:
    """The smallest --memory-budget (bytes) the command accepts here, as it names it."""
    res = subprocess.run([sys.executable, "-m", "chainrows", "import-calls", str(log), str(results),
                          str(work / "refused"), "--memory-budget", "1MiB"], capture_output=True, text=True)
    mib = int(res.stderr.rsplit(" is ", 1)[1].split()[0].replace(",", ""))
    return (mib + 16) << 20


def measure(shape: str, fmt: str, gb: float, repeats: int, thp: str, work: Path) -> dict:
    log, results = log_paths(shape, fmt, gb)
    out = work / "out"
    ours, floor = [], []
    for _ in range(repeats):  # interleaved
        ours.append(run_import(log, results, out))
        floor.append(run_floor(log, out, work, thp))
    size = log.stat().st_size
    if fmt == "parquet":
        import pyarrow.parquet as pq

        from chainrows.formats.calls.sources import decoded_bytes

        size = decoded_bytes(pq.ParquetFile(log).metadata)
    budget = max(size // 4, smallest_budget(log, results, work))
    bounded = run_import(log, results, work / "bounded", "--memory-budget", f"{budget >> 20}MiB")
    best, best_floor = min(o["wall"] for o in ours), min(f["seconds"] for f in floor)
    return {"shape": shape, "format": fmt, "log_bytes": size, "ours": best, "floor": best_floor,
            "floor_read": min(f["read"] for f in floor), "ratio": best / best_floor,
            "peak": min(o["peak"] for o in ours), "budget": budget, "bounded_peak": bounded["peak"],
            "bounded_wall": bounded["wall"]}


def _print(r: dict) -> None:
    target = 1.5 if r["format"] == "parquet" else 2.0
    print(f"{r['shape']:<8} {r['format']:<8} log {r['log_bytes'] / 1e9:5.2f} GB  import {r['ours']:6.2f} s  "
          f"floor {r['floor']:6.2f} s (read {r['floor_read']:.2f})  ratio {r['ratio']:.2f}x (target <= {target}x)  "
          f"peak {r['peak'] >> 20} MiB  |  budget {r['budget'] >> 20} MiB: peak {r['bounded_peak'] >> 20} MiB, "
          f"{r['bounded_wall']:.1f} s", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m asv_benchmarks.import_calls",
                                description="import-calls against pyarrow reading the log and writing the "
                                            "dataset, in fresh processes, on realistic call logs.")
    p.add_argument("--gb", type=float, default=2.0, help="GB of token and logprob values per log (default 2)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved runs of each side; the best counts (default 3)")
    p.add_argument("--shapes", default="long,short,crowded", help="comma-separated shapes: long, short, crowded")
    p.add_argument("--formats", default="parquet,jsonl", help="comma-separated formats: parquet, jsonl")
    p.add_argument("--system-huge-pages", action="store_true",
                   help="leave the floor's process the system's transparent huge pages (default: off, as the "
                        "command runs itself)")
    p.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temporary one)")
    a = p.parse_args(argv)
    work = a.work or Path(tempfile.mkdtemp(prefix="import-calls-bench-"))
    print(f"floor {'with the system huge-page setting' if a.system_huge_pages else 'without huge pages'}; "
          f"best of {a.repeats}", flush=True)
    for shape in a.shapes.split(","):
        for fmt in a.formats.split(","):
            _print(measure(shape, fmt, a.gb, a.repeats, "system" if a.system_huge_pages else "off", work))
    if a.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


class ImportCalls:
    """asv: the in-process import of a small log (~64 MB of values) of each format."""

    params = ["parquet", "jsonl"]
    param_names = ["format"]
    timeout = 600

    def setup(self, fmt):
        from chainrows.runners.calls.job import load_kernels

        self.log, self.results = log_paths("long", fmt, 0.064)
        self.tmp = Path(tempfile.mkdtemp(prefix="asv-import-calls-"))
        load_kernels()

    def teardown(self, fmt):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def time_import(self, fmt):
        from chainrows.runners.calls.job import import_calls_to_dataset

        import_calls_to_dataset(self.log, self.results, self.tmp / f"out-{time.perf_counter_ns()}")


if __name__ == "__main__":
    sys.exit(main())
