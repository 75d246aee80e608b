"""asv benchmarks: one class per engine stage, plus compile / start-up tracking.

Sizes are synthetic rollouts from ``chainrows.synth`` (defaults: ~7 calls, ~3,300 tokens per
rollout, logprobs on, 5 % corrupt). Every ``setup`` reads a cached Parquet copy of the data
(``common.synth_dataset_dir``) and runs the stage once, so Numba compilation (or cache loading)
never lands in a timed sample; compile time is tracked on its own by ``StartUp``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from asv_benchmarks import common
from chainrows.options import Options

SIZES = [256, 4096]


def _engine():
    from chainrows.engine.advantage import advantages, row_weights
    from chainrows.engine.run import decide, gather_rows
    from chainrows.lowering.columnar import build_batch

    return build_batch, decide, gather_rows, advantages, row_weights


class _Stage:
    params = [SIZES]
    param_names = ["rollouts"]
    timeout = 300
    repeat = (1, 5, 20.0)  # min, max samples, max seconds per benchmark
    warmup_time = 0.0  # setup already warmed the kernels

    def _load(self, n):
        self.tables = common.synth_tables_cached(n)
        self.n_tokens = common.token_bytes(self.tables[1]) // 8


class Join(_Stage):
    """build_batch: Arrow tables -> Batch (id joins, token buffers)."""

    def setup(self, n):
        self._load(n)
        self.build_batch = _engine()[0]
        self.build_batch(*self.tables)

    def time_build_batch(self, n):
        self.build_batch(*self.tables)


class Decide(_Stage):
    """decide: rollout checks, select + cut (cc) or terminal walk (ordinary), verify with hashes."""

    params = [["cc", "ordinary"], SIZES]
    param_names = ["mode", "rollouts"]

    def setup(self, mode, n):
        self._load(n)
        build_batch, self.decide = _engine()[:2]
        self.batch, _ = build_batch(*self.tables)
        self.options = Options(mode=mode)
        self.decide(self.batch, self.options)

    def time_decide(self, mode, n):
        self.decide(self.batch, self.options)


class Plans(_Stage):
    """decide + gather in cc mode under the linear and the forest plan, on the same data (the
    forest plan's cost over the linear cut; synth data with its default shares)."""

    params = [["linear", "forest"], SIZES]
    param_names = ["plan", "rollouts"]

    def setup(self, plan, n):
        self._load(n)
        build_batch, self.decide, self.gather_rows = _engine()[:3]
        self.batch, _ = build_batch(*self.tables)
        self.options = Options(plan=plan)
        self.time_decide_gather(plan, n)

    def time_decide_gather(self, plan, n):
        self.gather_rows(self.batch, self.decide(self.batch, self.options), self.options)


class DecideAndGather(_Stage):
    """decide_and_gather, the API's engine call: decide + gather with checks 14-15 run in the
    row copy (commits before it have no such function: the benchmark is skipped there)."""

    params = [[False, True], SIZES]
    param_names = ["placeholders", "rollouts"]

    def setup(self, placeholders, n):
        from chainrows.engine import run

        if not hasattr(run, "decide_and_gather"):
            raise NotImplementedError  # asv: skip
        self._load(n)
        self.batch, _ = _engine()[0](*self.tables)
        self.decide_and_gather = run.decide_and_gather
        self.options = Options(placeholders=placeholders)
        self.decide_and_gather(self.batch, self.options)

    def time_decide_and_gather(self, placeholders, n):
        self.decide_and_gather(self.batch, self.options)


class Gather(_Stage):
    """gather_rows: row sizes, then copy every ok chain's deltas into the output buffers."""

    params = [[False, True], SIZES]
    param_names = ["placeholders", "rollouts"]

    def setup(self, placeholders, n):
        self._load(n)
        build_batch, decide, self.gather_rows = _engine()[:3]
        self.batch, _ = build_batch(*self.tables)
        self.dec = decide(self.batch, Options())
        self.options = Options(placeholders=placeholders)
        self.gather_rows(self.batch, self.dec, self.options)

    def time_gather_rows(self, placeholders, n):
        self.gather_rows(self.batch, self.dec, self.options)


class Advantages(_Stage):
    """GRPO advantages (§5) per rollout and row weights."""

    params = [["mean", "loo"], SIZES]
    param_names = ["baseline", "rollouts"]

    def setup(self, baseline, n):
        self._load(n)
        build_batch, decide, gather_rows, self.advantages, self.row_weights = _engine()
        self.batch, _ = build_batch(*self.tables)
        self.dec = decide(self.batch, Options())
        self.rows = gather_rows(self.batch, self.dec, Options())
        self.time_advantages(baseline, n)

    def time_advantages(self, baseline, n):
        b = self.batch
        self.advantages(b.reward, b.has_record, b.group, self.dec.ok, Options(baseline=baseline))
        self.row_weights(self.rows.num_segments, self.dec.ok[self.rows.row_rollout], Options())


class ParquetToParquet(_Stage):
    """Parquet dataset -> rows + report Parquet, against the pyarrow-only floor.

    ``time_chainrows``: ``chainrows.reassemble(dataset_dir)`` (reads the three tables with the
    project's reader), then ``pq.write_table`` of rows and report. ``time_pyarrow_floor``: read the
    three tables with ``pq.read_table`` and write tables of the same size (the very rows and
    report) with ``pq.write_table``. Both use pyarrow's default writer options.
    """

    repeat = (1, 3, 30.0)

    def setup(self, n):
        import chainrows

        self.dataset = common.synth_dataset_dir(n)
        self.out = Path(tempfile.mkdtemp(prefix="chainrows-asv-out-"))
        self.reassemble = chainrows.reassemble
        res = self.reassemble(str(self.dataset))
        self.rows, self.report = res.rows, res.report

    def teardown(self, n):
        shutil.rmtree(self.out, ignore_errors=True)

    def time_chainrows(self, n):
        res = self.reassemble(str(self.dataset))
        pq.write_table(res.rows, self.out / "rows.parquet")
        pq.write_table(res.report, self.out / "report.parquet")

    def time_pyarrow_floor(self, n):
        common.read_tables(self.dataset)
        pq.write_table(self.rows, self.out / "rows_floor.parquet")
        pq.write_table(self.report, self.out / "report_floor.parquet")


class Xxh3(_Stage):
    """XXH3-64 over int32 tokens: ``hash_deltas`` on every call's delta (parallel kernel), one
    ``xxh3_64_tokens`` call over the whole token buffer (one thread, no parallel launch), and the
    xxhash C library on that same buffer (one thread): the last two give bytes/s per core."""

    def setup(self, n):
        self._load(n)
        from chainrows.engine.xxh3 import hash_deltas, xxh3_64_tokens

        build_batch = _engine()[0]
        batch, _ = build_batch(*self.tables)
        self.tokens = common.flat_tokens(batch)
        self.runs = common.flat_token_runs(batch)
        self.hash_deltas = hash_deltas
        self.xxh3_64_tokens = xxh3_64_tokens
        self.hash_deltas(self.tokens, *self.runs)
        self.time_hash_whole_buffer(n)

    def time_hash_deltas(self, n):
        self.hash_deltas(self.tokens, *self.runs)

    def time_hash_whole_buffer(self, n):
        self.xxh3_64_tokens(self.tokens, 0, len(self.tokens), np.uint64(0))

    def time_xxhash_c_whole_buffer(self, n):
        import xxhash

        xxhash.xxh3_64_intdigest(memoryview(self.tokens).cast("B"), 0)


class StartUp:
    """Seconds for a fresh interpreter to import chainrows and reassemble 8 rollouts.

    cold: NUMBA_CACHE_DIR is a new empty directory, so every kernel compiles.
    cached: a second interpreter with that same directory, so kernels load from the cache.
    ``import_s`` and ``reassemble_s`` are measured inside the child; reading its input is not.
    """

    timeout = 1800
    rounds = 1
    repeat = 1
    number = 1
    unit = "seconds"

    def setup_cache(self):
        cache = common.fresh_cache_dir("asv-numba-cache")
        cold = common.start_probe(cache)
        cached = common.start_probe(cache)
        return {"cache": str(cache), "cold": cold, "cached": cached}

    def track_cold_compile(self, state):
        """Wall seconds, import + first reassemble, empty Numba cache."""
        return state["cold"]["total_s"]

    def track_cold_compile_cpu(self, state):
        """CPU seconds of that child (robust to a busy machine)."""
        return state["cold"]["cpu_s"]

    def track_cached_start(self, state):
        """Wall seconds, import + first reassemble, Numba cache filled by the cold run."""
        return state["cached"]["total_s"]

    def track_cached_start_cpu(self, state):
        return state["cached"]["cpu_s"]

    for _f in (track_cold_compile, track_cold_compile_cpu, track_cached_start, track_cached_start_cpu):
        _f.unit = "seconds"
    del _f


class BulkShapes:
    """The CLI's runner (``chainrows.runners.bulk.run``, default settings) on user-shaped data
    (``asv_benchmarks.shapes``: capture order, token rows shuffled, many short calls; random
    hex ids, multi-chunk columns, logprobs), against the pyarrow floor: read the three tables,
    write the same rows and report (zstd level 1, no dictionary). ``python -m
    asv_benchmarks.bulk_shapes`` runs the same at gigabytes, in fresh processes."""

    params = [["capture", "shuffled", "short"], [0.05]]
    param_names = ["shape", "gb"]
    timeout = 900
    repeat = (1, 3, 60.0)
    warmup_time = 0.0

    def setup(self, shape, gb):
        from asv_benchmarks.bulk_shapes import dataset
        from chainrows.runners import bulk

        self.run = bulk.run
        self.src = dataset(shape, gb)
        self.out = Path(tempfile.mkdtemp(prefix="chainrows-asv-bulk-"))
        self.run(self.src, self.out / "cli", progress=False)  # warm; also the tables to write
        self.rows = pq.read_table(self.out / "cli" / "rows")
        self.report = pq.read_table(self.out / "cli" / "report.parquet")

    def teardown(self, shape, gb):
        shutil.rmtree(self.out, ignore_errors=True)

    def time_chainrows_cli_path(self, shape, gb):
        self.run(self.src, self.out / "cli", progress=False)

    def time_pyarrow_floor(self, shape, gb):
        for name in ("ledger", "tokens", "rollouts"):
            pq.read_table(self.src / name)
        for name, table in (("rows", self.rows), ("report", self.report)):
            pq.write_table(table, self.out / f"{name}_floor.parquet", compression="zstd",
                           compression_level=1, use_dictionary=False)
