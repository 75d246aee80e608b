"""The command line on user-shaped data, against the pyarrow floor, in one run.

For each shape of ``asv_benchmarks.shapes`` (capture order, token rows shuffled, many short
calls, the capture order cut into 1,000 small files per table, and the capture order with ~1 GB
of request text and transcripts beside the format's columns) at ``--gb`` of token + logprob bytes:

- CLI: ``chainrows reassemble DATA OUT`` at default settings in a fresh process (warm kernel
  cache), against a fresh process that reads the three tables with pyarrow (the columns
  chainrows reads: neither reads the ``wide`` shape's text) and writes the same
  rows and report tables (same codec, no dictionary). Two ratios: the CLI's process wall over
  the floor's timed read + write (interpreter start and imports not counted), and over the
  floor's whole process wall. Runs are interleaved, best of ``--repeats``; peak RSS is each
  process's own VmHWM.
- API (``--api``): ``chainrows.reassemble`` on the dataset's tables in memory (as the reader
  gives them: multi-chunk columns), build_batch included, on 1 thread and on all threads,
  against one ``np.copyto`` of all output list bytes (input_ids + loss_mask + logprobs) between
  touched buffers, and one copy into a new Arrow buffer with the previous still alive (what the
  API's outputs get: every result is new memory, first written by the engine); and against
  that copy plus pyarrow dictionary-encoding every id string of the tables once, one thread
  (the per-call work the copy leaves out, which dominates many short calls). The speed-up on
  all threads is printed beside the same copy's own on as many threads (its parts side by
  side): a copy-bound call cannot gain more than memory bandwidth gives the copy.
- API with freed memory retained (``--retained``): the same, in a fresh process whose
  allocators keep freed memory for reuse (``RETAIN_ENV``: mimalloc never purges, glibc never
  maps an array on its own nor trims; docs/decisions-engine.md "Fresh memory on this VM").
- Huge pages: the ``chainrows`` command forbids transparent huge pages in its own process
  (docs/limits.md "Huge pages"); the floor and the API keep the system's setting unless
  ``--no-huge-pages`` forbids them in this process and every process it starts. The first
  line printed says which; on a machine where huge pages fault in slowly the two floors differ
  by 2-3x, so compare runs made the same way.

One run at a time per output directory (``--work``, default ``bulk-shapes-out`` in the benchmark
cache): a second is refused, exit 2, as two runs there delete each other's outputs.

    python -m asv_benchmarks.bulk_shapes --gb 2.1 --shapes capture,shuffled --api [--retained] [--no-huge-pages]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from asv_benchmarks import common
from asv_benchmarks.shapes import DERIVED_SHAPES, SHAPES, write_shaped_dataset

_FLOOR = r"""
import json, sys, time
import pyarrow.parquet as pq
src, outs, dst, columns = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
t0 = time.perf_counter()
for name in ("ledger", "tokens", "rollouts"):
    pq.read_table(f"{src}/{name}", columns=columns[name])
t1 = time.perf_counter()
for name, stored in (("rows", "rows"), ("report", "report.parquet")):
    table = pq.read_table(f"{outs}/{stored}")  # untimed: the tables to write
    t = time.perf_counter()
    pq.write_table(table, f"{dst}/{name}.parquet", compression="zstd", compression_level=1,
                   use_dictionary=False)
    t1 += time.perf_counter() - t
    del table
peak = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"seconds": t1 - t0, "peak": int(peak) * 1024}))
"""


RETAIN_ENV = {"MIMALLOC_PURGE_DELAY": "-1", "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "2147483647"}

_API_CHILD = r"""
import json, sys
from pathlib import Path
from asv_benchmarks.bulk_shapes import api_vs_copy
print(json.dumps(api_vs_copy(Path(sys.argv[1]), int(sys.argv[2]))))
"""


def dataset(shape: str, gb: float, seed: int = 0) -> Path:
    """The shaped dataset, written once under the benchmark cache."""
    path = common.cache_root() / f"shape-{shape}-{gb:g}gb-s{seed}-{common._synth_version()}"
    if not (path / "tokens").exists():
        if shape in DERIVED_SHAPES:
            source, make = DERIVED_SHAPES[shape]
            make(dataset(source, gb, seed), path)
        else:
            write_shaped_dataset(path, shape, int(gb * 1e9), seed)
    return path


def _cli(src: Path, out: Path, extra=()) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-c", "import sys; from chainrows.cli import console_main; sys.exit(console_main())",
           "reassemble", str(src), str(out), "--no-progress", *extra]
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/env", *cmd], capture_output=True, text=True, env=common.probe_env())
    seconds = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip()[-400:])
    fields = dict(line.split(None, 1) for line in p.stdout.splitlines() if line and not line.startswith(" "))
    return {"seconds": seconds, "path": fields.get("path", "?").strip(),
            "peak": fields.get("peak", "?").replace("memory", "").strip()}


def _floor(src: Path, outs: Path, dst: Path) -> dict:
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", _FLOOR, str(src), str(outs), str(dst), json.dumps(_read_columns(src))],
                       capture_output=True, text=True, env=common.probe_env())
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip()[-400:])
    info = json.loads(p.stdout.strip().splitlines()[-1])
    info["wall"] = wall
    return info


def _read_columns(src: Path) -> dict[str, list[str]]:
    """Per table, the columns chainrows reads, which the floor reads too: other columns a
    capture carries (the ``wide`` shape's text) are read by neither."""
    from chainrows.formats.native.dataset import TABLES, plan_table

    return {name: plan_table(src, name).columns for name in TABLES}


def _copy_seconds(nbytes: int, repeats: int) -> float:
    """Best seconds of one ``np.copyto`` of ``nbytes`` (both buffers touched first)."""
    import numpy as np

    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.ones_like(src)
    return common.best_of(lambda: np.copyto(dst, src), repeats)[0]


def _copy_speedup(nbytes: int, repeats: int, threads: int) -> tuple[float, float]:
    """Best seconds of ``common.parallel_copy`` of ``nbytes`` between touched buffers on 1 and
    on ``threads`` threads: the ceiling of the API's speed-up on the same machine, since what a
    copy gains from threads is what memory bandwidth allows."""
    import numba
    import numpy as np

    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.ones_like(src)
    before = numba.get_num_threads()
    common.parallel_copy(dst[:1 << 20], src[:1 << 20])  # compiled before it is timed
    seconds = []
    try:
        for n in (1, threads):
            numba.set_num_threads(n)
            seconds.append(common.best_of(lambda: common.parallel_copy(dst, src), repeats)[0])
    finally:
        numba.set_num_threads(before)
    return seconds[0], seconds[1]


def _fresh_copy_seconds(nbytes: int, repeats: int) -> float:
    """Best seconds of one copy of ``nbytes`` into a new buffer from Arrow's pool, the previous
    one still alive, as the API's outputs are (the caller holds its last result)."""
    import numpy as np

    from chainrows.engine.buffers import empty

    src = np.ones(nbytes, dtype=np.uint8)

    def copy():
        dst = empty(nbytes, np.uint8)
        np.copyto(dst, src)
        return dst

    return common.best_of(copy, repeats)[0]


def _string_values(col):
    """A column's strings as a ChunkedArray, list columns flattened (their item strings)."""
    import pyarrow as pa

    chunks = []
    for chunk in col.chunks:
        while pa.types.is_list(chunk.type) or pa.types.is_large_list(chunk.type):
            chunk = chunk.flatten()
        chunks.append(chunk)
    return pa.chunked_array(chunks, chunks[0].type) if chunks else None


def id_string_columns(tables) -> list:
    """Every id column of the tables (string columns and lists of strings, ``integrity_error``
    left out: an error text, not an id) as a ChunkedArray of its strings, lists flattened."""
    from chainrows.formats.native.dataset import _has_strings  # a string column, or lists of strings

    cols = [_string_values(t.column(name)) for t in tables for name in t.column_names
            if name != "integrity_error" and _has_strings(t.schema.field(name).type)]
    return [c for c in cols if c is not None]


def output_list_bytes(result) -> int:
    """The bytes of a result's output lists (input_ids, loss_mask, logprobs values)."""
    return sum(result.rows[c].combine_chunks().values.nbytes
               for c in ("input_ids", "loss_mask", "logprobs") if c in result.rows.column_names)


def _id_hash_seconds(tables, repeats: int) -> float:
    """Best seconds of pyarrow hashing every id string of the tables once: one
    ``pc.dictionary_encode`` per string column (list columns by their item strings), on one
    thread. The copy floor leaves out the per-call work; this is what pyarrow's usual first
    step of an id join costs on the same ids. Not a strict lower bound: one table per column
    misses cache on millions of distinct ids, where the engine's tables are per rollout."""
    import pyarrow as pa
    import pyarrow.compute as pc

    cols = id_string_columns(tables)
    threads = pa.cpu_count()
    pa.set_cpu_count(1)
    try:
        return common.best_of(lambda: [pc.dictionary_encode(c) for c in cols], repeats)[0]
    finally:
        pa.set_cpu_count(threads)


def api_vs_copy(src: Path, repeats: int) -> dict:
    """The API on 1 and on all threads against one copy of the output list bytes: seconds of
    each (``one``, ``all``), of the two copies (``copy``, ``fresh``), and the sizes."""
    import numba

    import chainrows
    from chainrows.formats.native.dataset import read_dataset

    ds = read_dataset(src)
    tables = (ds.ledger, ds.tokens, ds.rollouts)
    result = chainrows.reassemble(*tables)  # warm
    out_bytes = output_list_bytes(result)
    del result
    copy = _copy_seconds(out_bytes, repeats)
    fresh = _fresh_copy_seconds(out_bytes, repeats)
    ids = _id_hash_seconds(tables, repeats)
    threads = numba.get_num_threads()
    copy_one, copy_all = _copy_speedup(out_bytes, repeats, threads)
    times = {}
    for n in (1, threads):
        numba.set_num_threads(n)
        times[n] = common.best_of(lambda: chainrows.reassemble(*tables), repeats)[0]
    numba.set_num_threads(threads)
    return {"chunks": ds.tokens["tokens"].num_chunks, "out_bytes": out_bytes, "copy": copy,
            "fresh": fresh, "ids": ids, "threads": threads, "copy_one": copy_one, "copy_all": copy_all,
            "one": times[1], "all": times[threads]}


def api_retained(src: Path, repeats: int) -> dict:
    """``api_vs_copy`` in a fresh process started with ``RETAIN_ENV`` (the allocators read it
    when they load, so it cannot be set in this one)."""
    env = {**common.probe_env(), **RETAIN_ENV}  # probe_env: chainrows and asv_benchmarks importable
    p = subprocess.run([sys.executable, "-c", _API_CHILD, str(src), str(repeats)], capture_output=True,
                       text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip()[-400:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def api_line(r: dict, label: str = "API") -> str:
    return (f"  {label}, {r['chunks']} token chunks, {r['out_bytes'] / 1e9:.2f} GB of output lists: 1 thread "
            f"{r['one']:.2f} s = {r['one'] / r['copy']:.1f}x one copy ({r['copy']:.3f} s), "
            f"{r['one'] / r['fresh']:.1f}x one copy into fresh memory ({r['fresh']:.3f} s), "
            f"{r['one'] / (r['copy'] + r['ids']):.1f}x one copy + every id string hashed once by pyarrow "
            f"({r['ids']:.3f} s); {r['threads']} threads "
            f"{r['all']:.2f} s, speed-up {r['one'] / r['all']:.2f}x (one copy's own on {r['threads']} threads "
            f"{r['copy_one'] / r['copy_all']:.2f}x: {r['copy_one']:.3f} -> {r['copy_all']:.3f} s)")


def cli_vs_floor(shape: str, gb: float, repeats: int, work: Path) -> dict:
    """The CLI and the pyarrow floor on one shape, interleaved, best of ``repeats`` each:
    ``cli`` (process seconds, path, peak), ``floor`` (timed read + write, process wall, peak)."""
    src = dataset(shape, gb)
    cli = [_cli(src, work / "cli")]  # also the output the floor writes
    floor = []
    for _ in range(repeats):
        floor.append(_floor(src, work / "cli", work / "floor"))
        if len(cli) < repeats:
            cli.append(_cli(src, work / "cli"))
    return {"shape": shape, "src": src, "disk": sum(p.stat().st_size for p in src.rglob("*.parquet")),
            "cli": min(cli, key=lambda r: r["seconds"]), "floor": min(floor, key=lambda r: r["seconds"])}


def cli_line(r: dict) -> str:
    c, f = r["cli"], r["floor"]
    return (f"{r['shape']:<9} {r['disk'] / 1e9:5.2f} GB on disk | chainrows reassemble {c['seconds']:6.1f} s "
            f"(process, {c['path']}; peak {c['peak']}) | floor {f['seconds']:6.1f} s (read + write; "
            f"process {f['wall']:.1f} s, peak {f['peak'] / 2**30:.2f} GiB) | ratio {c['seconds'] / f['seconds']:.2f}x "
            f"(process walls {c['seconds'] / f['wall']:.2f}x)")


def _lock_work(work: Path):
    """An exclusive flock on ``work/.lock`` (the file, open), or None when another run holds it:
    two runs in one output directory delete each other's outputs mid-run."""
    import fcntl

    work.mkdir(parents=True, exist_ok=True)
    f = open(work / ".lock", "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asv_benchmarks.bulk_shapes", description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=2.1, help="token + logprob GB of each shape's dataset (default 2.1)")
    ap.add_argument("--shapes", default=",".join([*SHAPES, *DERIVED_SHAPES]),
                    help="comma list of the shapes to run (default: all, %(default)s)")
    ap.add_argument("--repeats", type=int, default=2,
                    help="interleaved runs of the CLI and the floor; the best counts (default 2)")
    ap.add_argument("--work", default=None, help="where outputs go (default: the benchmark cache)")
    ap.add_argument("--api", action="store_true", help="also the API against the copy floor")
    ap.add_argument("--retained", action="store_true",
                    help="also the API in a process whose allocators keep freed memory (RETAIN_ENV)")
    ap.add_argument("--no-huge-pages", action="store_true",
                    help="forbid transparent huge pages in this process and every process it starts "
                         "(the floor's, the API's); the chainrows command forbids them in its own anyway")
    a = ap.parse_args(argv)
    from chainrows.memory.process import set_huge_pages

    if a.no_huge_pages and not set_huge_pages(False):
        ap.error("--no-huge-pages: this system cannot forbid transparent huge pages")
    work = Path(a.work) if a.work else common.cache_root() / "bulk-shapes-out"
    lock = _lock_work(work)  # held while this function runs
    if lock is None:
        ap.error(f"another bulk_shapes run is using {work}: wait for it, or pass --work DIR")
    print(f"chainrows CLI vs pyarrow floor, {a.gb:g} GB of token+logprob bytes, best of {a.repeats}, "
          f"{os.cpu_count()} CPUs (a shared machine: read the ratios); huge pages "
          f"{'forbidden' if a.no_huge_pages else 'as the system sets them'} outside the chainrows command")
    for shape in [s.strip() for s in a.shapes.split(",") if s.strip()]:
        r = cli_vs_floor(shape, a.gb, a.repeats, work)
        print(cli_line(r), flush=True)
        if a.api:
            print(api_line(api_vs_copy(r["src"], a.repeats)), flush=True)
        if a.retained:
            print(api_line(api_retained(r["src"], a.repeats), "API, freed memory retained"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
