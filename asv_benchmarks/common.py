"""Shared helpers for the asv suite and ``side_by_side``: synthetic data, big batches, probes.

Nothing here is a benchmark (asv only collects ``time_``/``track_``/``mem_``/``peakmem_`` names).

Environment: ``CHAINROWS_BENCH_CACHE`` (data cache directory), ``CHAINROWS_BENCH_DATA_KEY`` (pin
the data across synth.py versions), ``CHAINROWS_BENCH_VERBOSE=1`` (print which chainrows is used).

Synthetic data comes from ``chainrows.synth``. Generating it is slow compared with the engine
(a few seconds for 4,096 rollouts), so ``synth_dataset_dir`` writes each (rollouts, seed) dataset
to Parquet once, under ``$CHAINROWS_BENCH_CACHE`` (default: ``<tmp>/chainrows-bench-cache``), keyed
by a hash of ``chainrows/synth.py``; benchmark ``setup`` reads it back in well under a second.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

TABLES = ("ledger", "tokens", "rollouts")

if os.environ.get("CHAINROWS_BENCH_VERBOSE"):  # e.g. to check which checkout asv benchmarks
    import chainrows as _cr

    print(f"[chainrows-bench] chainrows from {os.path.dirname(os.path.abspath(_cr.__file__))}", file=sys.stderr)
TINY_ROLLOUTS = 8  # the compile / start-up probes run a reassemble on this many rollouts


def cache_root() -> Path:
    checkout = hashlib.sha1(chainrows_root().encode()).hexdigest()[:8]
    root = os.environ.get("CHAINROWS_BENCH_CACHE") or os.path.join(
        tempfile.gettempdir(), f"chainrows-bench-cache-{checkout}")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def chainrows_root() -> str:
    """The directory that holds the imported ``chainrows`` package (for subprocess PYTHONPATH)."""
    import chainrows

    return os.path.dirname(os.path.dirname(os.path.abspath(chainrows.__file__)))


def _synth_version() -> str:
    """Cache key of the synthetic data: a hash of the chainrows.synth package in use (every
    module of it), or $CHAINROWS_BENCH_DATA_KEY (set it to benchmark two commits whose synth
    code differs on the very same data)."""
    pinned = os.environ.get("CHAINROWS_BENCH_DATA_KEY")
    if pinned:
        return pinned
    import chainrows.synth as synth

    try:
        root = Path(synth.__file__).parent
        data = b"".join(f.read_bytes() for f in sorted(root.glob("*.py")))
        data += (Path(__file__).parent / "shapes.py").read_bytes()
    except OSError:  # pragma: no cover
        import chainrows

        data = chainrows.__version__.encode()
    return hashlib.sha1(data).hexdigest()[:12]


def synth_dataset_dir(n_rollouts: int, seed: int = 0) -> Path:
    """A §2 dataset directory of ``n_rollouts`` synthetic rollouts, written once and cached."""
    from chainrows.synth import write_synth_dataset

    path = cache_root() / f"synth-n{n_rollouts}-s{seed}-{_synth_version()}"
    if all((path / f"{t}.parquet").exists() for t in TABLES):
        return path
    try:
        write_synth_dataset(path, n_rollouts, seed, overwrite=True)
    except (FileExistsError, OSError):
        # another process raced us to it; its rename is atomic, so a complete dataset is there
        if not all((path / f"{t}.parquet").exists() for t in TABLES):
            raise
    return path


def read_tables(dataset_dir) -> tuple[pa.Table, pa.Table, pa.Table]:
    """The three tables of a single-file-per-table dataset, with pyarrow alone."""
    d = Path(dataset_dir)
    return tuple(pq.read_table(d / f"{t}.parquet") for t in TABLES)  # type: ignore[return-value]


def synth_tables_cached(n_rollouts: int, seed: int = 0) -> tuple[pa.Table, pa.Table, pa.Table]:
    return read_tables(synth_dataset_dir(n_rollouts, seed))


def token_bytes(tokens: pa.Table) -> int:
    """Bytes of the token values (int32) and logprob values (float32) of a tokens table."""
    n = int(pc.sum(pc.list_value_length(tokens["tokens"])).as_py() or 0)
    per = 4 + (4 if "logprobs" in tokens.column_names else 0)
    return n * per


def replicate_tables(tables, copies: int):
    """``copies`` copies of a dataset as one dataset, each copy's ids made distinct.

    Copy k prefixes every rollout_id and group_id with ``"k<k>."`` (call, response and item ids
    are scoped by rollout, so they stay as they are). The result is a valid §2 dataset with
    ``copies`` times the rollouts, calls and tokens and the same decisions per copy; rows of
    different copies do not interleave. Token/logprob buffers are shared, not copied, by Arrow.
    """
    ledger, tokens, rollouts = tables
    if copies == 1:
        return ledger, tokens, rollouts
    out = []
    for table, cols in ((ledger, ("rollout_id",)), (tokens, ("rollout_id",)), (rollouts, ("rollout_id", "group_id"))):
        parts = []
        for k in range(copies):
            t = table
            for name in cols:
                i = t.column_names.index(name)
                col = t.column(i)
                new = pc.binary_join_element_wise(pa.scalar(f"k{k}."), col.cast(pa.string()), "")
                t = t.set_column(i, name, new.cast(col.type))
            parts.append(t)
        out.append(pa.concat_tables(parts))
    return tuple(out)


def big_tables(target_bytes: int, base_rollouts: int = 4096, seed: int = 0):
    """A dataset whose token+logprob values take at least ``target_bytes``, by replication.

    Returns (tables, copies, base_token_bytes). Replicating a cached synth dataset is ~100x faster
    than synthesising that many rollouts and gives the engine the same work per byte.
    """
    base = synth_tables_cached(base_rollouts, seed)
    per = token_bytes(base[1])
    copies = max(1, -(-int(target_bytes) // per))
    return replicate_tables(base, copies), copies, per


def warm_engine(mode: str = "cc") -> None:
    """Compile (or load from the Numba cache) every kernel a reassemble of ``mode`` uses."""
    import chainrows
    from chainrows.synth import synth_tables

    chainrows.reassemble(*synth_tables(TINY_ROLLOUTS, 0), mode=mode)


# ---- compile / start-up probes (subprocesses) ----------------------------------------------

_PROBE = r"""
import json, sys, time
t0, c0 = time.perf_counter(), time.process_time()
import chainrows
t1 = time.perf_counter()
import pyarrow.parquet as pq
d = sys.argv[1]
tables = [pq.read_table(f"{d}/{n}.parquet") for n in ("ledger", "tokens", "rollouts")]
t2 = time.perf_counter()
res = chainrows.reassemble(*tables)
t3, c3 = time.perf_counter(), time.process_time()
print(json.dumps({"import_s": t1 - t0, "reassemble_s": t3 - t2, "total_s": (t1 - t0) + (t3 - t2),
                  "cpu_s": c3 - c0, "rows": res.rows.num_rows}))
"""


def probe_env(cache_dir=None) -> dict:
    """The environment of a probe child: chainrows importable; Numba's cache in ``cache_dir``
    (None: whatever the parent uses, i.e. NUMBA_CACHE_DIR if set, else the in-tree cache)."""
    env = dict(os.environ)
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = str(cache_dir)
    root = chainrows_root()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def start_probe(cache_dir=None, timeout: float = 900) -> dict:
    """A fresh interpreter imports chainrows and reassembles a tiny dataset, with Numba's cache in
    ``cache_dir``: an empty directory gives the cold compile time, a second run the cached start.
    Returns import_s, reassemble_s, total_s (both), cpu_s (CPU seconds of the child up to then,
    reading its 8-rollout input included; less sensitive to a busy machine than wall time) and
    wall_s (the whole child process, interpreter start-up included)."""
    data = synth_dataset_dir(TINY_ROLLOUTS, 0)
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _PROBE, str(data)], env=probe_env(cache_dir),
                         capture_output=True, text=True, timeout=timeout, check=False)
    wall = time.perf_counter() - t
    if out.returncode != 0:
        raise RuntimeError(f"start-up probe failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["wall_s"] = wall
    return result


def fresh_cache_dir(name: str) -> Path:
    """An empty directory for NUMBA_CACHE_DIR (emptied if it exists)."""
    path = cache_root() / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def cli_help_time(cache_dir=None, repeats: int = 3) -> float | None:
    """Best wall time of ``python -m chainrows.cli --help``; None when there is no CLI."""
    import importlib.util

    if importlib.util.find_spec("chainrows.cli") is None:
        return None
    env = probe_env(cache_dir)
    best = None
    for _ in range(repeats):
        t = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "chainrows.cli", "--help"], env=env,
                             capture_output=True, text=True, timeout=300, check=False)
        dt = time.perf_counter() - t
        if out.returncode != 0:
            return None
        best = dt if best is None else min(best, dt)
    return best


def best_of(fn, repeats: int = 3, min_repeats: int = 1):
    """(best seconds, last result) of ``fn()`` over ``repeats`` calls."""
    best, result = float("inf"), None
    for _ in range(max(repeats, min_repeats)):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return best, result


def flat_tokens(batch) -> np.ndarray:
    """The batch's token buffers as one (the buffer itself when there is one)."""
    return batch.tokens[0] if len(batch.tokens) == 1 else np.concatenate(batch.tokens)


def flat_token_runs(batch):
    """starts, stops (into :func:`flat_tokens`), seeds (parents' chain hashes, 0 for roots) of
    every call with tokens."""
    has = batch.tok_start >= 0
    base = np.concatenate(([0], np.cumsum([len(t) for t in batch.tokens])))[batch.tok_chunk[has]]
    starts = np.ascontiguousarray(batch.tok_start[has] + base)
    stops = np.ascontiguousarray(batch.tok_stop[has] + base)
    parent = batch.parent[has]
    seeds = np.where(parent >= 0, batch.chain_hash[np.maximum(parent, 0)], 0).astype(np.uint64)
    return starts, stops, seeds


_PARALLEL_COPY = None


def parallel_copy(dst: np.ndarray, src: np.ndarray, pieces: int = 64) -> None:
    """dst[:] = src[:] split into ``pieces`` ranges run on Numba's threads: the memory-copy
    floor at a given thread count (how far memory bandwidth scales with threads here)."""
    global _PARALLEL_COPY
    if _PARALLEL_COPY is None:
        import numba

        @numba.njit(parallel=True, nogil=True, cache=True)
        def copy(dst, src, pieces):
            n = len(src)
            step = (n + pieces - 1) // pieces
            for k in numba.prange(pieces):
                a = min(n, k * step)
                b = min(n, a + step)
                dst[a:b] = src[a:b]

        _PARALLEL_COPY = copy
    _PARALLEL_COPY(dst, src, pieces)
