"""chainrows next to its baselines, in one run on the same synthetic data; prints ratios.

    python -m asv_benchmarks.side_by_side [--rollouts N] [--big-gb X] [--shapes-gb X] [--quick]

Sections (all times are best of ``--repeats`` unless said otherwise; the machine may be shared,
so read the ratios, not the absolute numbers):

1. engine vs the pure-Python reference oracle (``chainrows.reference``), cc mode, Arrow tables in
   memory, on N rollouts (``--ref-rollouts`` for fewer on the reference side: both are reported
   per rollout). The reference's input is ``Table.to_pylist()``, timed apart and excluded; the
   reference is timed best of ``--ref-repeats`` (default 2).
2. in-memory reassembly of a big batch (token + logprob values >= ``--big-gb`` GB) against a
   memory-copy floor: ``np.copyto`` of as many bytes as the output holds (input_ids + loss_mask +
   logprobs), one thread. The big batch is ``--rollouts`` synthetic rollouts replicated k times with
   distinct rollout/group ids (``common.replicate_tables``), which gives the engine the same work
   per byte as synthesising k times more rollouts, ~100x faster. The engine is timed on 1 thread
   (``numba.set_num_threads(1)``) and on all threads, both as decide + gather (checks, select,
   cut, verify with hashes, gather) and with build_batch (the Arrow join) included; hashing and
   gather alone are put against the floor too, and the peak extra memory of build + decide +
   gather is read from VmHWM (reset through /proc/self/clear_refs). Before the section,
   ``--prefault-gb`` of memory is touched and freed once: on a VM, pages the guest touches for the
   first time can fault in at ~0.25 GB/s, which otherwise lands in whatever allocates first.
3. Parquet -> Parquet: read the three tables, reassemble, write rows + report (pyarrow default
   writer options), against the pyarrow floor: read the three tables with ``pq.read_table`` and
   write the same rows + report tables with ``pq.write_table``. When ``chainrows.runners.bulk.run`` (the
   CLI's path: project writer options, atomic output) exists it is timed as well, against a floor
   with the same writer options.
4. memory and start-up: peak RSS of a fresh child running section 3 once (VmHWM: ru_maxrss is
   inherited across fork + exec on Linux) and of this whole process (ru_maxrss); cold compile (fresh interpreter, empty NUMBA_CACHE_DIR, import +
   8-rollout reassemble), the same with that cache filled, and ``python -m chainrows.cli --help``.

5. user-shaped data (``asv_benchmarks.shapes``, ``asv_benchmarks.bulk_shapes``): on
   ``--shapes-gb`` GB of token + logprob values per shape (default 2.1; capture order, token
   rows shuffled, many short calls, capture order in 1,000 small files per table, capture order
   with ~1 GB of text columns a run never reads), ``chainrows reassemble DATA OUT`` at default
   settings in a fresh process against a fresh pyarrow process that reads the three tables (the
   columns chainrows reads) and writes the same
   rows and report (same codec, no dictionary), best of ``--repeats`` interleaved; and the API on
   the same tables (multi-chunk columns, build_batch included) on 1 and on all threads against one
   copy of all output list bytes (touched buffers, and into fresh memory) and against that copy
   plus pyarrow dictionary-encoding every id string once, and the API again in a
   process whose allocators keep freed memory (``bulk_shapes.RETAIN_ENV``). The datasets are
   written once under the benchmark cache (minutes per shape at 2.1 GB).

``--quick`` shrinks everything (seconds, for a CI smoke test) and skips the cold compile (~40 s
of Numba compilation whatever the size) unless ``--cold-compile`` is given.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from asv_benchmarks import common
from chainrows.memory.process import process_peak_rss, process_rss

# ---- small helpers -------------------------------------------------------------------------

def _rss_gb() -> float:
    """Peak resident set size of this process so far, GB (ru_maxrss is KiB on Linux)."""
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb * (1 if sys.platform != "darwin" else 1 / 1024) * 1024 / 1e9


def _reset_peak() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux >= 4.0); False when not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return process_peak_rss() is not None
    except OSError:
        return False


def prefault(gb: float) -> float:
    """Touch ``gb`` GB once and free it; returns seconds. On a VM, memory the guest touches for the
    first time can fault in at well under 1 GB/s (seen here: ~0.25 GB/s); after this, allocations
    reuse guest pages the host has already backed, so big-batch timings measure the engine."""
    if gb <= 0:
        return 0.0
    t = time.perf_counter()
    x = np.ones(int(gb * 1e9), dtype=np.uint8)
    del x
    return time.perf_counter() - t


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "n/a"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} us"


def _fmt_b(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _fmt_n(x: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f} {unit}"
    return f"{x:.0f}"


class Report:
    """Detail lines per section, and the summary table of ratios printed at the end."""

    def __init__(self):
        self.summary: list[tuple[str, str, str, str]] = []

    @staticmethod
    def section(title: str) -> None:
        print(f"\n== {title} ==", flush=True)

    @staticmethod
    def line(text: str) -> None:
        print(f"  {text}", flush=True)

    def ratio(self, name: str, value: str, ratio: str, meaning: str) -> None:
        self.summary.append((name, value, ratio, meaning))

    def print_summary(self) -> None:
        head = ("measurement", "value", "ratio", "ratio means")
        rows = [head] + self.summary
        w = [max(len(r[i]) for r in rows) for i in range(4)]
        print("\n== ratio table ==")
        sep = "+" + "+".join("-" * (x + 2) for x in w) + "+"
        print(sep)
        for k, r in enumerate(rows):
            print("| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(r)) + " |")
            if k == 0:
                print(sep.replace("-", "="))
        print(sep, flush=True)


def _interleaved(fns: dict, repeats: int) -> dict:
    """Best seconds of each callable, calling them round-robin so a noisy neighbour hits all."""
    best = {k: float("inf") for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            gc.collect()
            t = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t)
    return best


def _max_threads() -> int:
    import numba

    return int(numba.config.NUMBA_NUM_THREADS)


# ---- 1. engine vs reference ------------------------------------------------------------------

def engine_vs_reference(rep: Report, n: int, n_ref: int, repeats: int, ref_repeats: int = 1) -> None:
    import numba

    import chainrows
    from chainrows import reference

    rep.section("1. engine vs pure-Python reference (cc mode, in memory)")
    tables = common.synth_tables_cached(n)
    tokens_in = common.token_bytes(tables[1]) // (8 if "logprobs" in tables[1].column_names else 4)
    rep.line(f"data: synth {n} rollouts, {tables[0].num_rows} calls, {_fmt_n(tokens_in)} input tokens "
             f"(tokens/s below counts input tokens)")
    chainrows.reassemble(*tables)  # warm (compile or cache load)
    nt = _max_threads()
    eng = {}
    for threads in sorted({1, nt}):
        numba.set_num_threads(threads)
        chainrows.reassemble(*tables)  # untimed: first run at this thread count
        eng[threads], res = common.best_of(lambda: chainrows.reassemble(*tables), repeats)
    numba.set_num_threads(nt)

    ref_tables = tables if n_ref == n else common.synth_tables_cached(n_ref)
    ref_tokens = common.token_bytes(ref_tables[1]) // (8 if "logprobs" in ref_tables[1].column_names else 4)
    t = time.perf_counter()
    dicts = [tb.to_pylist() for tb in ref_tables]
    t_conv = time.perf_counter() - t
    t_ref = float("inf")
    for _ in range(ref_repeats):  # best of several: one 4 s run on a shared machine swings ~30%
        t = time.perf_counter()
        ref_rows, ref_report = reference.reassemble(*dicts)
        t_ref = min(t_ref, time.perf_counter() - t)
    del dicts

    ref_rps = n_ref / t_ref
    rep.line(f"reference: {n_ref} rollouts in {_fmt_s(t_ref)} (best of {ref_repeats}) -> {_fmt_n(ref_rps)} rollouts/s, "
             f"{_fmt_n(ref_tokens / t_ref)} tokens/s; Arrow -> dicts took {_fmt_s(t_conv)} more (excluded)")
    for threads, te in eng.items():
        rep.line(f"engine {threads} thread(s): {n} rollouts in {_fmt_s(te)} -> {_fmt_n(n / te)} rollouts/s, "
                 f"{_fmt_n(tokens_in / te)} tokens/s, {(n / te) / ref_rps:.0f}x the reference")
        rep.ratio(f"engine vs reference, {threads} thread(s)", f"{_fmt_n(n / te)} rollouts/s",
                  f"{(n / te) / ref_rps:.0f}x", "times the reference's rollouts/s"
                  + ("" if n_ref == n else f" (ref on {n_ref})"))
    need = (t_ref / n_ref) * n / 200
    out_b = sum(res.rows.column(c).combine_chunks().values.nbytes for c in ("input_ids", "loss_mask", "logprobs")
                if c in res.rows.column_names)
    src_b = np.ones(out_b, dtype=np.uint8)
    dst_b = np.empty_like(src_b)
    t_copy, _ = common.best_of(lambda: np.copyto(dst_b, src_b), repeats)
    del src_b, dst_b
    rep.line(f"200x the reference = {_fmt_s(need)} for these {n} rollouts; np.copyto of their "
             f"{_fmt_b(out_b)} of row tokens alone takes {_fmt_s(t_copy)} ({need / t_copy:.2f}x that floor)")
    rep.ratio("  time 200x the reference allows / memcpy of the rows", _fmt_s(need), f"{need / t_copy:.2f}x",
              "the whole pipeline would have to run in this many memcpys")
    if n_ref == n:
        same = (res.report.select(["rollout_id", "status", "reason"]).to_pylist()
                == [{k: r[k] for k in ("rollout_id", "status", "reason")} for r in ref_report])
        rep.line(f"engine and reference agree on status+reason of every rollout: {'yes' if same else 'NO'}; "
                 f"rows {res.rows.num_rows} vs {len(ref_rows)}")
    rep.line(f"peak RSS so far: {_rss_gb():.2f} GB (mostly the reference's Python dicts)")


# ---- 2. big in-memory batch vs memcpy --------------------------------------------------------

def big_batch(rep: Report, base_n: int, big_gb: float, repeats: int, prefault_gb: float) -> None:
    import numba

    from chainrows.engine.run import decide, decide_and_gather, gather_rows
    from chainrows.engine.xxh3 import hash_deltas
    from chainrows.lowering.columnar import build_batch

    rep.section(f"2. in-memory reassembly of a >= {big_gb:g} GB token batch vs np.copyto floor")
    if prefault_gb > 0:
        rep.line(f"prefault: touched and freed {prefault_gb:g} GB in {_fmt_s(prefault(prefault_gb))} "
                 f"(VM first-touch cost kept out of the timings; --prefault-gb 0 to skip)")
    t = time.perf_counter()
    tables, copies, per = common.big_tables(big_gb * 1e9, base_n)
    rep.line(f"data: synth {base_n} rollouts x {copies} copies = {tables[2].num_rows} rollouts, "
             f"{tables[0].num_rows} calls; token+logprob values {_fmt_b(per * copies)} "
             f"(built in {_fmt_s(time.perf_counter() - t)})")
    nt = _max_threads()
    numba.set_num_threads(1)
    gc.collect()
    base_rss = process_rss()
    peak_ok = _reset_peak()
    batch, _labels = build_batch(*tables)  # untimed first run, measured for peak memory
    dec = decide(batch)
    rows = gather_rows(batch, dec)
    peak = process_peak_rss() if peak_ok else None
    del batch, _labels, dec
    gc.collect()
    t_build, (batch, _labels) = common.best_of(lambda: build_batch(*tables), max(1, repeats - 1))
    del tables
    gc.collect()
    dec = decide(batch)
    out_bytes = rows.input_ids.nbytes + rows.loss_mask.nbytes + (rows.logprobs.nbytes if rows.logprobs is not None else 0)
    n_out_tokens = len(rows.input_ids)
    in_bytes = sum(t.nbytes for t in batch.tokens) + sum(t.nbytes for t in batch.logprobs)
    tokens = common.flat_tokens(batch)
    rep.line(f"batch: {_fmt_n(len(tokens))} input tokens ({_fmt_b(in_bytes)} tokens+logprobs); "
             f"output {_fmt_n(n_out_tokens)} tokens in {len(rows.tok_off) - 1} rows = {_fmt_b(out_bytes)} "
             f"(input_ids + loss_mask + logprobs)")
    del rows
    gc.collect()

    src = np.ones(out_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch every page of dst once

    def floor_touched():
        np.copyto(dst, src)

    def floor_fresh():
        d = np.empty_like(src)
        np.copyto(d, src)

    starts, stops, seeds = common.flat_token_runs(batch)
    hash_deltas(tokens, starts[:1], stops[:1], seeds[:1])
    hashed_bytes = int((stops - starts).sum()) * 4

    times = {}
    for threads in sorted({1, nt}):
        numba.set_num_threads(threads)
        decide(batch)
        box = {}

        def run_decide():
            box["dec"] = decide(batch)

        def run_gather():
            gather_rows(batch, box["dec"])

        def run_hash():
            hash_deltas(tokens, starts, stops, seeds)

        def run_fused():
            decide_and_gather(batch)

        fns = {"decide": run_decide, "gather": run_gather, "fused": run_fused, "hash": run_hash}
        for fn in fns.values():  # untimed: first run at this thread count
            fn()
        def run_pcopy():
            common.parallel_copy(dst, src)

        run_pcopy()
        fns["pcopy"] = run_pcopy
        if threads == 1:
            fns = {"floor": floor_touched, "floor_fresh": floor_fresh, **fns}
        best = _interleaved(fns, repeats)
        for k, v in best.items():
            times[k if k.startswith("floor") else (k, threads)] = v
    numba.set_num_threads(nt)
    del src, dst
    gc.collect()

    floor = times["floor"]
    rep.line(f"floor: np.copyto {_fmt_b(out_bytes)} into touched memory {_fmt_s(floor)} "
             f"({out_bytes / floor / 1e9:.1f} GB/s); into fresh np.empty {_fmt_s(times['floor_fresh'])} "
             f"(page faults; the engine allocates its output fresh)")
    for threads in sorted({1, nt}):
        d, g, h = times[("decide", threads)], times[("gather", threads)], times[("hash", threads)]
        rep.line(f"{threads} thread(s): decide {_fmt_s(d)}, gather {_fmt_s(g)}, decide+gather {_fmt_s(d + g)} "
                 f"= {(d + g) / floor:.2f}x floor; + build_batch (1 thread, {_fmt_s(t_build)}) "
                 f"= {(d + g + t_build) / floor:.2f}x floor")
        f = times[("fused", threads)]
        rep.line(f"    decide_and_gather (the API's: checks 14-15 in the row copy) {_fmt_s(f)} "
                 f"= {f / floor:.2f}x floor, {(d + g) / f:.2f}x faster than decide+gather")
        rep.line(f"    of which: hash_deltas over every call's delta {_fmt_s(h)} "
                 f"({hashed_bytes / h / 1e9:.1f} GB/s, {h / d:.0%} of decide); "
                 f"gather = {g / times['floor_fresh']:.2f}x the fresh-memory floor")
    d1 = times[("decide", 1)] + times[("gather", 1)]
    rep.ratio("decide+gather (1 thread) vs memcpy floor", _fmt_s(d1), f"{d1 / floor:.2f}x",
              f"times np.copyto of {_fmt_b(out_bytes)} (1 thread)")
    rep.ratio("build+decide+gather (1 thread) vs memcpy", _fmt_s(d1 + t_build), f"{(d1 + t_build) / floor:.2f}x",
              "times the same floor")
    f1 = times[("fused", 1)]
    rep.ratio("decide_and_gather (1 thread) vs memcpy", _fmt_s(f1), f"{f1 / floor:.2f}x",
              "the API's engine call: checks 14-15 in the copy")
    h1 = times[("hash", 1)]
    rep.ratio("  hashing alone (1 thread) vs memcpy floor", _fmt_s(h1), f"{h1 / floor:.2f}x",
              f"hash_deltas over all deltas, {hashed_bytes / h1 / 1e9:.1f} GB/s")
    g1 = times[("gather", 1)]
    rep.ratio("  gather alone (1 thread) vs memcpy floor", _fmt_s(g1), f"{g1 / floor:.2f}x",
              f"fresh-memory floor {times['floor_fresh'] / floor:.2f}x")
    if nt > 1:
        dn = times[("decide", nt)] + times[("gather", nt)]
        rep.ratio(f"decide+gather {nt} threads vs memcpy floor", _fmt_s(dn), f"{dn / floor:.2f}x",
                  "times the 1-thread floor")
        rep.ratio(f"decide+gather speed-up, {nt} threads vs 1", "", f"{d1 / dn:.2f}x",
                  f"ideal {nt}x; shared machine")
        rep.ratio(f"decide_and_gather speed-up, {nt} threads vs 1", "", f"{f1 / times[('fused', nt)]:.2f}x",
                  f"ideal {nt}x; shared machine")
        pc1, pcn = times[("pcopy", 1)], times[("pcopy", nt)]
        rep.line(f"memory-copy floor with Numba threads: 1 thread {_fmt_s(pc1)}, {nt} threads {_fmt_s(pcn)} "
                 f"-> {pc1 / pcn:.2f}x: what memory bandwidth allows a copy-bound kernel to gain")
        rep.ratio(f"  copy floor speed-up, {nt} threads vs 1", "", f"{pc1 / pcn:.2f}x",
                  "the same bytes copied by a prange kernel")
    if peak is not None and base_rss is not None:
        extra = peak - base_rss
        rep.line(f"peak memory of build_batch + decide + gather (1 thread), over the RSS with the input "
                 f"tables loaded: +{_fmt_b(extra)} = {extra / in_bytes:.2f}x the batch's token+logprob bytes "
                 f"(output alone is {out_bytes / in_bytes:.2f}x)")
        rep.ratio("peak extra RSS in memory / token+logprob bytes", f"+{_fmt_b(extra)}", f"{extra / in_bytes:.2f}x",
                  "build+decide+gather, VmHWM over input tables")
    del batch, dec
    gc.collect()


# ---- 3. Parquet -> Parquet -------------------------------------------------------------------

_E2E_CHILD = r"""
import json, resource, sys, time
import pyarrow.parquet as pq
import chainrows


def vm(field):
    # VmHWM is per address space, so fresh after exec; ru_maxrss is inherited across fork+exec
    try:
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        return None


src, out = sys.argv[1], sys.argv[2]
base = vm("VmRSS")
t = time.perf_counter()
res = chainrows.reassemble(src)
pq.write_table(res.rows, out + "/rows.parquet")
pq.write_table(res.report, out + "/report.parquet")
hwm = vm("VmHWM")
print(json.dumps({"seconds": time.perf_counter() - t, "base_gb": base,
                  "maxrss_gb": hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}))
"""


def parquet_to_parquet(rep: Report, n: int, repeats: int, tmp: Path) -> None:
    import json

    import chainrows

    rep.section("3. Parquet -> Parquet vs pyarrow floor (read 3 tables, write rows + report)")
    src = common.synth_dataset_dir(n)
    in_file_bytes = sum((src / f"{t}.parquet").stat().st_size for t in common.TABLES)
    in_mem = sum(t.nbytes for t in common.read_tables(src))
    res = chainrows.reassemble(str(src))
    rows, report = res.rows, res.report
    rep.line(f"data: {src} ({in_file_bytes / 1e6:.0f} MB on disk, {in_mem / 1e6:.0f} MB in Arrow); "
             f"output rows {rows.num_rows} ({rows.nbytes / 1e6:.0f} MB in Arrow), report {report.num_rows}")
    out = tmp / "p2p"
    out.mkdir()

    def engine():
        r = chainrows.reassemble(str(src))
        pq.write_table(r.rows, out / "rows.parquet")
        pq.write_table(r.report, out / "report.parquet")

    def floor():
        common.read_tables(src)
        pq.write_table(rows, out / "rows_floor.parquet")
        pq.write_table(report, out / "report_floor.parquet")

    fns = {"engine": engine, "floor": floor}
    bulk_note = None
    try:
        from chainrows.outdir.parquet import WRITE_OPTIONS
        from chainrows.runners import bulk

        k = [0]

        def cli_path():
            k[0] += 1
            bulk.run(str(src), str(out / f"bulk{k[0]}"), progress=False)

        def floor_opts():
            common.read_tables(src)
            pq.write_table(rows, out / "rows_floor2.parquet", **WRITE_OPTIONS)
            pq.write_table(report, out / "report_floor2.parquet", **WRITE_OPTIONS)

        cli_path()
        fns.update(bulk=cli_path, floor_opts=floor_opts)
    except Exception as exc:  # the CLI path is optional here
        bulk_note = f"{type(exc).__name__}: {exc}"
    best = _interleaved(fns, repeats)
    e, f = best["engine"], best["floor"]
    rep.line(f"chainrows (read_dataset + reassemble + pq.write_table): {_fmt_s(e)}; pyarrow floor: {_fmt_s(f)} "
             f"-> {e / f:.2f}x; {_fmt_n(n / e)} rollouts/s")
    rep.ratio("parquet->parquet chainrows vs pyarrow floor", _fmt_s(e), f"{e / f:.2f}x",
              "times pq.read_table x3 + pq.write_table x2")
    if "bulk" in best:
        b, fo = best["bulk"], best["floor_opts"]
        rep.line(f"chainrows.runners.bulk.run (CLI path: project writer options, atomic output): {_fmt_s(b)}; "
                 f"floor with the same writer options: {_fmt_s(fo)} -> {b / fo:.2f}x")
        rep.ratio("  CLI path (bulk.run) vs pyarrow floor", _fmt_s(b), f"{b / fo:.2f}x",
                  "same floor, project writer options")
    else:
        rep.line(f"chainrows.runners.bulk.run not measured ({bulk_note})")

    child_out = tmp / "p2p-child"
    child_out.mkdir()
    p = subprocess.run([sys.executable, "-c", _E2E_CHILD, str(src), str(child_out)], env=common.probe_env(),
                       capture_output=True, text=True, timeout=1800, check=False)
    if p.returncode == 0:
        info = json.loads(p.stdout.strip().splitlines()[-1])
        rss, base = info["maxrss_gb"], info.get("base_gb")
        extra = rss - base if base is not None else rss
        rep.line(f"peak RSS of a fresh process doing it once: {rss:.2f} GB, of which {base or 0:.2f} GB after "
                 f"imports: +{extra:.2f} GB = {extra * 1e9 / in_mem:.1f}x the input's Arrow bytes")
        rep.ratio("peak RSS parquet->parquet, over imports", f"+{extra:.2f} GB", f"{extra * 1e9 / in_mem:.1f}x",
                  f"times the input's {_fmt_b(in_mem)} in Arrow (fresh process)")
    else:
        rep.line(f"peak-RSS child failed: {p.stderr.strip()[-500:]}")


# ---- 4. start-up ------------------------------------------------------------------------------

SHAPE_TARGETS = {"capture": 1.1, "shuffled": 1.6}  # issue 11: CLI over the pyarrow floor


def user_shapes(rep: Report, shapes: list[str], gb: float, repeats: int, tmp: Path) -> None:
    from asv_benchmarks import bulk_shapes

    rep.section(f"5. user-shaped data, {gb:g} GB of token + logprob values per shape: CLI vs pyarrow, API vs a copy")
    for shape in shapes:
        r = bulk_shapes.cli_vs_floor(shape, gb, repeats, tmp / "shapes")
        rep.line(bulk_shapes.cli_line(r))
        c, f = r["cli"], r["floor"]
        target = SHAPE_TARGETS.get(shape)
        rep.ratio(f"CLI {shape}, {gb:g} GB ({c['path']})", f"{c['seconds']:.1f} s / {f['seconds']:.1f} s",
                  f"{c['seconds'] / f['seconds']:.2f}x",
                  f"over pyarrow read + write{f'; target <= {target}x' if target else ''}; peak {c['peak']}")
        a = bulk_shapes.api_vs_copy(r["src"], repeats)
        rep.line(bulk_shapes.api_line(a).strip())
        rep.ratio(f"API {shape}, 1 thread", f"{a['one']:.2f} s", f"{a['one'] / a['copy']:.1f}x / {a['one'] / a['fresh']:.1f}x",
                  "over one copy of the output list bytes (touched / fresh memory); target <= 4x")
        rep.ratio(f"API {shape}, 1 thread, over copy + id hashing", f"{a['one']:.2f} s / {a['copy'] + a['ids']:.2f} s",
                  f"{a['one'] / (a['copy'] + a['ids']):.1f}x",
                  "over that copy plus pyarrow dictionary-encoding every id string once (per-call work)")
        rep.ratio(f"API {shape}, {a['threads']} threads", f"{a['all']:.2f} s", f"{a['one'] / a['all']:.2f}x",
                  f"speed-up over 1 thread; target >= 1.6x; one copy's own {a['copy_one'] / a['copy_all']:.2f}x")
        k = bulk_shapes.api_retained(r["src"], repeats)
        rep.line(bulk_shapes.api_line(k, "API, freed memory retained").strip())
        rep.ratio(f"API {shape}, 1 thread, freed memory retained", f"{k['one']:.2f} s",
                  f"{k['one'] / k['copy']:.1f}x / {k['one'] / k['fresh']:.1f}x",
                  "the same in a process started with bulk_shapes.RETAIN_ENV (docs/decisions-engine.md)")


def startup(rep: Report, cold: bool, repeats: int) -> None:
    rep.section("4. compile and start-up (fresh interpreters, import chainrows + 8-rollout reassemble)")
    cache = None
    if cold:
        cache = common.fresh_cache_dir("side-by-side-numba-cache")
        c = common.start_probe(cache)
        rep.line(f"cold (empty NUMBA_CACHE_DIR): import {_fmt_s(c['import_s'])} + reassemble "
                 f"{_fmt_s(c['reassemble_s'])} = {_fmt_s(c['total_s'])} ({c['cpu_s']:.1f} CPU s; "
                 f"process wall {_fmt_s(c['wall_s'])})")
    else:
        rep.line("cold compile skipped (--quick without --cold-compile)")
    w = min((common.start_probe(cache) for _ in range(max(1, min(repeats, 2)))), key=lambda r: r["total_s"])
    where = "that cache" if cold else "the current Numba cache"
    rep.line(f"cached ({where}): import {_fmt_s(w['import_s'])} + reassemble {_fmt_s(w['reassemble_s'])} "
             f"= {_fmt_s(w['total_s'])} ({w['cpu_s']:.1f} CPU s; process wall {_fmt_s(w['wall_s'])})")
    helpt = common.cli_help_time(cache, repeats=repeats)
    rep.line(f"python -m chainrows.cli --help: {_fmt_s(helpt) if helpt is not None else 'n/a (no working CLI)'}")
    if cold:
        rep.ratio("cold compile (import + tiny reassemble)", _fmt_s(c["total_s"]),
                  f"{c['total_s'] / w['total_s']:.0f}x", "times the cached start")
    rep.ratio("cached start (import + tiny reassemble)", _fmt_s(w["total_s"]), "", "fresh interpreter, warm cache")
    if helpt is not None:
        rep.ratio("cached start: chainrows.cli --help", _fmt_s(helpt), "", "whole process")


# ---- main --------------------------------------------------------------------------------------

def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m asv_benchmarks.side_by_side", description=__doc__.splitlines()[0])
    p.add_argument("--rollouts", type=int, default=None, help="rollouts for sections 1 and 3, and the base of "
                   "the big batch (default 4096; 64 with --quick)")
    p.add_argument("--ref-rollouts", type=int, default=None,
                   help="rollouts for the reference in section 1 (default: --rollouts)")
    p.add_argument("--ref-repeats", type=int, default=None,
                   help="best of this many reference runs in section 1 (default 2; 1 with --quick)")
    p.add_argument("--big-gb", type=float, default=None,
                   help="token+logprob GB of the big batch in section 2 (default 1.0; 0.002 with --quick)")
    p.add_argument("--repeats", type=int, default=None, help="best of this many (default 3; 1 with --quick)")
    p.add_argument("--prefault-gb", type=float, default=None,
                   help="touch this much memory once before section 2 (default 5 x --big-gb; 0 with --quick)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, for a CI smoke run")
    p.add_argument("--cold-compile", action="store_true", help="measure the cold compile even with --quick")
    p.add_argument("--shapes-gb", type=float, default=None,
                   help="token+logprob GB per user shape in section 5 (default 2.1; 0.004 with --quick)")
    p.add_argument("--shapes", default=None, help="comma list of user shapes for section 5 (default: "
                   "capture,shuffled,short; capture with --quick)")
    p.add_argument("--skip", default="", help="comma list of sections to skip: ref,big,parquet,shapes,startup")
    a = p.parse_args(argv)
    n = a.rollouts or (64 if a.quick else 4096)
    n_ref = min(a.ref_rollouts or n, n)
    big = a.big_gb if a.big_gb is not None else (0.002 if a.quick else 1.0)
    repeats = a.repeats or (1 if a.quick else 3)
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}

    import numba

    import chainrows

    print(f"chainrows side-by-side: chainrows {chainrows.__version__} from {common.chainrows_root()}, "
          f"numba {numba.__version__}, {os.cpu_count()} CPUs, up to {_max_threads()} Numba threads, "
          f"best of {repeats}{', QUICK' if a.quick else ''}", flush=True)
    print("(a shared, noisy machine: read the ratios; each pair is measured interleaved)")
    rep = Report()
    tmp = Path(tempfile.mkdtemp(prefix="chainrows-sbs-"))
    try:
        t0 = time.perf_counter()
        common.warm_engine("cc")
        print(f"warm-up (compile or Numba cache load): {_fmt_s(time.perf_counter() - t0)}")
        if "ref" not in skip:
            engine_vs_reference(rep, n, n_ref, repeats, a.ref_repeats or (1 if a.quick else 2))
        if "big" not in skip:
            big_batch(rep, n, big, repeats, a.prefault_gb if a.prefault_gb is not None else (0 if a.quick else 5 * big))
        if "parquet" not in skip:
            parquet_to_parquet(rep, n, repeats, tmp)
        if "shapes" not in skip:
            from asv_benchmarks.shapes import DERIVED_SHAPES, SHAPES

            shapes = a.shapes or ("capture" if a.quick else ",".join([*SHAPES, *DERIVED_SHAPES]))
            user_shapes(rep, [x.strip() for x in shapes.split(",") if x.strip()],
                        a.shapes_gb or (0.004 if a.quick else 2.1), repeats, tmp)
        if "startup" not in skip:
            startup(rep, cold=(not a.quick) or a.cold_compile, repeats=repeats)
        rep.ratio("peak RSS of this process", f"{_rss_gb():.2f} GB", "",
                  "ru_maxrss: reference dicts, big batch, floor arrays")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rep.print_summary()
    return 0


if __name__ == "__main__":
    sys.exit(main())
