"""``chainrows.batches.iter_packed`` over gigabytes of rows, against pyarrow reading the same
columns.

The rows directory is written directly (no reassembly): row lengths log-normal around 2,000
tokens (an agent mix: many short rows, a long tail up to ``--max-tokens``), random ids, a
quarter of each row prompt (loss mask 0), logprobs on generated tokens; Parquet parts of about
256 MB of values, row groups cut at 2^20 tokens (as ``reassemble`` writes them). ``--gb`` counts
the decoded values of the columns read (input_ids 4 + loss_mask 1 + logprobs 4 bytes a token).

Each measurement runs in a fresh process, interleaved, best of ``--repeats``:

- packed: one pass of ``iter_packed(ROWS, max_tokens=..., world_size=..., window=...)`` for rank
  0, touching every batch; its wall, peak RSS, fill ratio (real tokens over bins x max_tokens);
- floor: ``pyarrow.parquet.read_table(ROWS, columns=...)``, the columns iter_packed reads.

Prints the ratio packed / floor and both peaks (the floor holds every row; iter_packed about
two windows). The data is cached under ``$CHAINROWS_BENCH_CACHE``.

    python -m asv_benchmarks.packing --gb 2 --repeats 3
    python -m asv_benchmarks.packing --gb 0.2 --world-size 8

The asv class ``IterPacked`` times one pass and the floor on ~50 MB of rows.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from asv_benchmarks.common import cache_root, chainrows_root

COLUMNS = ["row_id", "rollout_id", "input_ids", "loss_mask", "advantage", "weight", "logprobs"]
BYTES_PER_TOKEN = 9
PART_TOKENS = 256_000_000 // BYTES_PER_TOKEN
GROUP_TOKENS = 1 << 20

_PACKED = r"""
import json, sys, time
from chainrows.batches import iter_packed
path, max_tokens, world, window = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t = time.perf_counter()
packed = iter_packed(path, max_tokens=max_tokens, world_size=world, window=window, seed=1)
touched = 0
for b in packed:
    touched += int(b["input_ids"][-1]) + int(b["cu_seqlens"][-1])
wall = time.perf_counter() - t
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
s = packed.stats
print(json.dumps({"wall": wall, "peak": int(hwm.split()[1]) * 1024, "fill": s.fill, "tokens": s.tokens,
                  "bins": s.bins, "rows": s.rows}))
"""

_FLOOR = r"""
import json, sys, time
import pyarrow.parquet as pq
t = time.perf_counter()
table = pq.read_table(sys.argv[1], columns=json.loads(sys.argv[2]))
wall = time.perf_counter() - t
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print(json.dumps({"wall": wall, "peak": int(hwm.split()[1]) * 1024, "rows": table.num_rows}))
"""


def _part(rng, tokens: int, longest: int, first_row: int) -> pa.Table:
    """About ``tokens`` tokens of rows, row ids counted from ``first_row``."""
    lengths = np.clip(rng.lognormal(np.log(2000), 0.9, tokens // 2000 + 1), 8, longest).astype(np.int64)
    lengths = lengths[:max(int(np.searchsorted(np.cumsum(lengths), tokens)), 1)]
    n, total = len(lengths), int(lengths.sum())
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    pos = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1].astype(np.int64), lengths)
    mask = (pos >= np.repeat(lengths // 4, lengths)).astype(np.uint8)
    logprobs = np.where(mask == 1, -rng.random(total, dtype=np.float32), np.float32(0))
    ids = np.arange(first_row, first_row + n)
    return pa.table({
        "row_id": pa.array([f"r{i}_s0" for i in ids.tolist()]),
        "rollout_id": pa.array([f"r{i}" for i in ids.tolist()]),
        "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(0, 150_000, total, dtype=np.int32))),
        "loss_mask": pa.ListArray.from_arrays(pa.array(offsets), pa.array(mask)),
        "logprobs": pa.ListArray.from_arrays(pa.array(offsets), pa.array(logprobs)),
        "prompt_len": pa.array((lengths // 4).astype(np.int32)),
        "advantage": pa.array(rng.normal(size=n).astype(np.float32)),
        "weight": pa.array(np.ones(n, dtype=np.float32)),
    })


def rows_dir(gb: float, longest: int, seed: int = 0) -> Path:
    """The cached rows directory of about ``gb`` GB of decoded values, rows at most ``longest``."""
    version = hashlib.sha1(inspect.getsource(_part).encode()).hexdigest()[:8]  # the generator's code
    folder = cache_root() / f"packing-{gb:g}gb-{longest}-s{seed}-{version}"
    if (folder / "done").exists():
        return folder / "rows"
    (folder / "rows").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    left, part, first = int(gb * 1e9 / BYTES_PER_TOKEN), 0, 0
    while left > 0:
        table = _part(rng, min(left, PART_TOKENS), longest, first)
        lengths = np.diff(table.column("input_ids").chunk(0).offsets.to_numpy())
        rows_per_group = max(1, int(len(lengths) * GROUP_TOKENS / max(int(lengths.sum()), 1)))
        pq.write_table(table, folder / "rows" / f"part-{part:05d}.parquet", row_group_size=rows_per_group)
        left -= int(lengths.sum())
        first += table.num_rows
        part += 1
    (folder / "done").write_text("")
    return folder / "rows"


def _python(code: str, *args) -> dict:
    env = dict(os.environ, PYTHONPATH=chainrows_root())
    res = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env)
    if res.returncode != 0 or not res.stdout.strip():
        raise RuntimeError(f"{args}: {res.stderr.strip()[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asv_benchmarks.packing", description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=2.0, help="decoded GB of the columns read (default 2)")
    ap.add_argument("--max-tokens", type=int, default=65_536, help="the packing budget (default 65536)")
    ap.add_argument("--world-size", type=int, default=1, help="data-parallel ranks; rank 0 is timed (default 1)")
    ap.add_argument("--window", type=int, default=4096, help="iter_packed's window in rows (default 4096)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each, interleaved; best kept (default 3)")
    ap.add_argument("--seed", type=int, default=0, help="the data's seed (default 0)")
    a = ap.parse_args(argv)
    path = rows_dir(a.gb, a.max_tokens, a.seed)
    disk = sum(f.stat().st_size for f in path.iterdir())
    print(f"rows: {path} ({disk / 1e9:.2f} GB on disk, {a.gb:g} GB of values)")
    _python(_FLOOR, path, json.dumps(COLUMNS))  # warm the page cache
    packed, floor = [], []
    for _ in range(a.repeats):
        floor.append(_python(_FLOOR, path, json.dumps(COLUMNS)))
        packed.append(_python(_PACKED, path, a.max_tokens, a.world_size, a.window))
    p = min(packed, key=lambda r: r["wall"])
    f = min(floor, key=lambda r: r["wall"])
    print(f"rows {f['rows']:,}, tokens {p['tokens']:,} (rank 0 of {a.world_size}), {p['bins']:,} batches of "
          f"{a.max_tokens:,}, fill {p['fill']:.1%}")
    print(f"{'iter_packed':<14} {p['wall']:7.2f} s  peak {p['peak'] / 2**20:8,.0f} MiB  (window {a.window:,} rows)")
    print(f"{'pyarrow read':<14} {f['wall']:7.2f} s  peak {f['peak'] / 2**20:8,.0f} MiB")
    print(f"ratio {p['wall'] / f['wall']:.2f}x")
    return 0


class IterPacked:
    """asv: one pass of iter_packed (rank 0 of 1 and of 4) and the pyarrow floor on ~50 MB."""

    params = [1, 4]
    param_names = ["world_size"]
    timeout = 600

    def setup(self, world_size):
        self.path = rows_dir(0.05, 16_384)

    def time_iter_packed(self, world_size):
        from chainrows.batches import iter_packed

        for _ in iter_packed(self.path, max_tokens=16_384, world_size=world_size):
            pass

    def time_pyarrow_floor(self, world_size):
        pq.read_table(self.path, columns=COLUMNS)


if __name__ == "__main__":
    sys.exit(main())
