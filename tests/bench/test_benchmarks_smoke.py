"""Smoke test of the benchmark suite: every asv benchmark runs (setup + one call) at a tiny size,
and ``side_by_side --quick`` prints its ratio table. No timing is asserted."""

from __future__ import annotations

import inspect
import itertools
import os
import subprocess
import sys

import pytest

from tests.support.outputs import output_bytes_but_input
from tests.support.paths import REPO

pytestmark = pytest.mark.slow  # tests/README.md: benchmark smoke

ROOT = REPO
TINY = 16  # rollouts, instead of the suite's smallest size



@pytest.fixture(autouse=True)
def _bench_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("CHAINROWS_BENCH_CACHE", str(tmp_path_factory.getbasetemp() / "bench-cache"))


def _benchmark_classes():
    from asv_benchmarks import stages

    for name, obj in vars(stages).items():
        if inspect.isclass(obj) and obj.__module__ == stages.__name__ and not name.startswith("_"):
            methods = [m for m in dir(obj) if m.startswith(("time_", "track_", "mem_", "peakmem_"))]
            if methods:
                yield name, obj, methods


def test_asv_config_points_at_this_suite():
    import json
    import re

    text = (ROOT / "asv.conf.json").read_text()
    conf = json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M))
    assert conf["environment_type"] == "existing"
    assert conf["benchmark_dir"] == "asv_benchmarks"
    assert (ROOT / conf["benchmark_dir"] / "__init__.py").exists()


STAGE_CLASSES = ["Join", "Decide", "Plans", "DecideAndGather", "Gather", "Advantages", "ParquetToParquet", "Xxh3", "BulkShapes"]


def test_every_stage_has_a_benchmark():
    names = {name for name, _, _ in _benchmark_classes()}
    assert set(STAGE_CLASSES) | {"StartUp"} <= names


@pytest.mark.parametrize("cls_name", STAGE_CLASSES)
def test_stage_benchmark_runs(cls_name):
    classes = {name: (cls, methods) for name, cls, methods in _benchmark_classes()}
    cls, methods = classes[cls_name]
    # every combination of the non-size parameters, at the tiny size
    params = cls.params
    names = list(cls.param_names)
    grids = [[TINY] if n == "rollouts" else [0.002] if n == "gb" else list(p) for n, p in zip(names, params)]
    for combo in itertools.product(*grids):
        bench = cls()
        bench.setup(*combo)
        try:
            for m in methods:
                getattr(bench, m)(*combo)
        finally:
            if hasattr(bench, "teardown"):
                bench.teardown(*combo)


def test_startup_track_benchmarks_run():
    """StartUp's track_ benchmarks on a state from one probe with the current Numba cache (the
    real cold-compile probe costs ~40 s of compilation; asv and side_by_side run it)."""
    from asv_benchmarks import common, stages

    probe = common.start_probe(None)
    assert probe["rows"] > 0
    state = {"cache": None, "cold": probe, "cached": probe}
    bench = stages.StartUp()
    for m in ("track_cold_compile", "track_cold_compile_cpu", "track_cached_start", "track_cached_start_cpu"):
        assert getattr(bench, m)(state) > 0


def test_replicated_tables_are_distinct_rollouts():
    import chainrows
    from asv_benchmarks import common

    tables = common.synth_tables_cached(TINY)
    big = common.replicate_tables(tables, 3)
    assert big[2].num_rows == 3 * tables[2].num_rows
    assert len(set(big[2]["rollout_id"].to_pylist())) == 3 * tables[2].num_rows
    one, three = chainrows.reassemble(*tables), chainrows.reassemble(*big)
    assert three.rows.num_rows == 3 * one.rows.num_rows
    statuses = one.report["status"].to_pylist()
    assert sorted(three.report["status"].to_pylist()) == sorted(statuses * 3)


def test_side_by_side_quick_prints_ratio_table(capsys):
    from asv_benchmarks import side_by_side

    assert side_by_side.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "== ratio table ==" in out
    table = out[out.index("== ratio table =="):]
    assert "| measurement" in table and "| ratio" in table
    for row in ("engine vs reference", "decide+gather (1 thread) vs memcpy floor",
                "parquet->parquet chainrows vs pyarrow floor", "CLI capture, 0.004 GB", "API capture, 1 thread",
                "API capture, 1 thread, over copy + id hashing", "API capture, 1 thread, freed memory retained",
                "cached start", "peak RSS"):
        assert row in table, row
    assert "one copy's own" in table  # the API's speed-up beside the copy's on as many threads


def test_side_by_side_runs_as_a_module():
    """``python -m asv_benchmarks.side_by_side`` parses its arguments (full quick run above)."""
    p = subprocess.run([sys.executable, "-m", "asv_benchmarks.side_by_side", "--help"], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "--big-gb" in p.stdout and "--quick" in p.stdout


SCRIPTS = sorted(p.stem for p in (ROOT / "asv_benchmarks").glob("*.py") if '__name__ == "__main__"' in p.read_text())


def _undescribed(help_text: str) -> list[str]:
    """The arguments argparse lists under 'positional arguments:' or 'options:' with no
    description (none on their line, and no deeper-indented line after it)."""
    missing, section = [], False
    lines = help_text.splitlines()
    for k, line in enumerate(lines):
        if line.endswith(":") and not line.startswith(" "):
            section = line in ("positional arguments:", "options:", "optional arguments:")
            continue
        if not section or not line.startswith("  ") or line.startswith("   "):
            continue
        name, _, rest = line.strip().partition("  ")
        follows = lines[k + 1] if k + 1 < len(lines) else ""
        if not rest.strip() and not follows.startswith("   "):
            missing.append(name)
    return missing


def test_benchmark_scripts_are_found():
    assert {"bulk_shapes", "gym", "import_calls", "packing", "per_call_floor", "ray_bench", "shapes",
            "side_by_side"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_benchmark_script_describes_each_flag(script):
    """``python -m asv_benchmarks.SCRIPT --help`` runs and describes every argument."""
    p = subprocess.run([sys.executable, "-m", f"asv_benchmarks.{script}", "--help"], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.startswith("usage: "), p.stderr[-2000:]
    assert _undescribed(p.stdout) == [], p.stdout


def test_shaped_datasets_have_the_shapes_they_claim(tmp_path):
    """capture: each group's rows close together; shuffled: token rows spread; every shape has
    multi-chunk columns as pyarrow reads them and logprobs; and chainrows decides them as the
    reference does."""
    import numpy as np
    import pyarrow.parquet as pq

    import chainrows
    from asv_benchmarks.shapes import write_shaped_dataset
    from chainrows.formats.native.dataset import read_dataset

    for shape in ("capture", "shuffled", "short"):
        src = write_shaped_dataset(tmp_path / shape, shape, 2_000_000, seed=1)
        ds = read_dataset(src)  # small files: chainrows reads them as one group, one chunk
        assert pq.read_table(src / "tokens")["tokens"].num_chunks > 1 and "logprobs" in ds.tokens.column_names
        rid = ds.tokens["rollout_id"].to_pylist()
        first = {}
        for i, r in enumerate(rid):
            first.setdefault(r, i)
        span = np.mean([i - first[r] for i, r in enumerate(rid)])
        assert (span > len(rid) / 10) == (shape == "shuffled"), (shape, span)
        res = chainrows.reassemble(src)
        ids = set()
        for name in ("ledger", "tokens", "rollouts"):
            ids |= set(pq.read_table(src / name, columns=["rollout_id"])["rollout_id"].to_pylist())
        assert res.report.num_rows == len(ids)
        assert res.rows.num_rows > 0


def test_split_shape_is_its_source_in_many_files_read_in_order(tmp_path):
    """``files``: the capture shape's tables, row for row in read order, in many part files."""
    from asv_benchmarks.shapes import DERIVED_SHAPES, split_dataset, write_shaped_dataset
    from chainrows.formats.native.dataset import read_dataset

    source, _ = DERIVED_SHAPES["files"]
    src = write_shaped_dataset(tmp_path / "src", source, 500_000, seed=2)
    out = split_dataset(src, tmp_path / "files", 23)
    a, b = read_dataset(src), read_dataset(out)
    for name in ("ledger", "tokens", "rollouts"):
        assert len(list((out / name).glob("*.parquet"))) == 23
        assert getattr(b, name).equals(getattr(a, name)), name


def test_wide_shape_is_its_source_with_text_a_run_never_reads(tmp_path):
    """``wide``: the capture shape's rows and files, with request text and transcripts that
    outweigh the SPEC's columns; the same output, and the same input size in the summary."""
    import pyarrow.parquet as pq

    from asv_benchmarks.shapes import DERIVED_SHAPES, write_shaped_dataset
    from chainrows.formats.native.dataset import footer_totals, plan_table, read_dataset
    from chainrows.runners import bulk

    source, make = DERIVED_SHAPES["wide"]
    src = write_shaped_dataset(tmp_path / "src", source, 500_000, seed=2)
    out = make(src, tmp_path / "wide")
    a, b = read_dataset(src), read_dataset(out)
    for name in ("ledger", "tokens", "rollouts"):
        assert [f.name for f in b.files[name]] == [f.name for f in a.files[name]]
        assert getattr(b, name).equals(getattr(a, name)), name
        assert footer_totals(out, name) == footer_totals(src, name), name
    whole = sum(f.stored_bytes for name in ("ledger", "rollouts") for f in plan_table(out, name).facts)
    assert whole > 10 * sum(footer_totals(src, name)[1] for name in ("ledger", "rollouts"))
    assert "request_text" in pq.read_schema(b.files["ledger"][0]).names
    from asv_benchmarks.bulk_shapes import _read_columns  # the floor reads what chainrows reads

    assert _read_columns(out) == {name: getattr(a, name).column_names for name in ("ledger", "tokens", "rollouts")}
    sa, sb = bulk.run(src, tmp_path / "oa"), bulk.run(out, tmp_path / "ob")
    assert sb.input_bytes == sa.input_bytes and sb.path == sa.path
    # the same rows: the outputs differ only in the input's fingerprint
    assert output_bytes_but_input(tmp_path / "ob") == output_bytes_but_input(tmp_path / "oa")


def test_per_call_floor_runs_every_pass_over_every_row_and_id(tmp_path, capsys):
    """``per_call_floor``: its kernels compute what they claim on a short-calls dataset (XXH3 of
    every token row as the ``xxhash`` package has it, the logprobs' largest magnitude bits), its
    counts cover every call and id string, and ``main`` prints its line."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import xxhash

    from asv_benchmarks import per_call_floor as pcf
    from asv_benchmarks.shapes import write_shaped_dataset
    from chainrows.formats.native.dataset import read_dataset

    src = write_shaped_dataset(tmp_path / "short", "short", 400_000, seed=2)
    ds = read_dataset(src)
    tok_off, tok = pcf._list_column(ds.tokens, "tokens")
    lp_off, lp = pcf._list_column(ds.tokens, "logprobs")
    want = 0
    for i in range(len(tok_off) - 1):
        want ^= xxhash.xxh3_64_intdigest(tok[tok_off[i]:tok_off[i + 1]].astype("<i4").tobytes())
    assert int(pcf.hash_rows(tok_off, tok)) == want
    bits = lp.view(np.uint32)
    assert int(pcf.max_bits(lp_off, bits)) == int((bits & 0x7FFFFFFF).max())

    tables = (ds.ledger, ds.tokens, ds.rollouts)
    r = pcf.per_call_floor(tables, out_bytes=1 << 20, repeats=1)
    strings = 0
    for table in tables:
        for name in table.column_names:
            col = table[name]
            while pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
                col = pc.list_flatten(col)
            is_text = pa.types.is_string(col.type) or pa.types.is_large_string(col.type)
            if is_text and name != "integrity_error":  # an error text, not an id
                strings += len(col) - col.null_count  # null ids are not read
    assert r["calls"] == ds.tokens.num_rows and r["id_strings"] == strings
    assert all(r[k] > 0 for k in ("copy", "hash", "logprobs", "ids"))
    assert pcf.main([str(src), "--repeats", "1"]) == 0
    assert f"{ds.tokens.num_rows:,} calls" in capsys.readouterr().out


def test_bulk_shapes_refuses_a_work_directory_another_run_holds(tmp_path, capsys):
    """Two runs in one work directory removed each other's outputs mid-run: the second is
    refused before it reads or writes anything."""
    from asv_benchmarks import bulk_shapes

    work = tmp_path / "work"
    held = bulk_shapes._lock_work(work)
    assert held is not None
    with pytest.raises(SystemExit) as exc:
        bulk_shapes.main(["--gb", "0.001", "--shapes", "capture", "--repeats", "1", "--work", str(work)])
    assert exc.value.code == 2
    assert f"another bulk_shapes run is using {work}" in capsys.readouterr().err
    assert sorted(p.name for p in work.iterdir()) == [".lock"]
    held.close()
    again = bulk_shapes._lock_work(work)  # free once the holder closes it
    assert again is not None
    again.close()


def test_import_calls_benchmark_prints_its_ratios(tmp_path, capsys):
    """``python -m asv_benchmarks.import_calls`` on a tiny log of each shape and format: a line of
    figures each, the bounded run under its budget; and the asv class's setup and one call."""
    from asv_benchmarks import import_calls

    assert import_calls.main(["--gb", "0.004", "--repeats", "1", "--work", str(tmp_path / "w")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()[1:]
    assert [line.split()[:2] for line in lines] == [[s, f] for s in ("long", "short", "crowded")
                                                    for f in ("parquet", "jsonl")]
    for line in lines:
        assert "ratio" in line and "budget" in line, line
    bench = import_calls.ImportCalls()
    bench.setup("parquet")
    try:
        bench.time_import("parquet")
    finally:
        bench.teardown("parquet")


def test_packing_benchmark_prints_its_ratio_and_fill(capsys):
    """``python -m asv_benchmarks.packing`` on a tiny rows directory: the fill, both runs with
    their peaks, the ratio; and the asv class's setup and one call of each."""
    from asv_benchmarks import packing

    assert packing.main(["--gb", "0.003", "--repeats", "1", "--max-tokens", "16384", "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    fill = float(out.split("fill ", 1)[1].split("%")[0])
    assert 50 < fill <= 100 and "iter_packed" in out and "pyarrow read" in out and "ratio" in out
    bench = packing.IterPacked()
    bench.setup(4)
    bench.time_iter_packed(4)
    bench.time_pyarrow_floor(4)


def test_call_logs_have_the_habits_they_claim(tmp_path):
    """The generated log: prompts that grow within the shape's bounds, interleaved rollouts,
    and the harness's habits (compactions, retries, re-tokenized turns) present."""
    import pyarrow.parquet as pq

    from asv_benchmarks.call_logs import Shape, write_call_log
    from chainrows.formats.calls import import_calls as import_log

    log, results = write_call_log(tmp_path, 40 << 20, seed=3, shape=Shape(min_calls=20, max_calls=40))
    table = pq.read_table(log)
    rollouts = table.column("rollout_id").to_pylist()
    assert len(set(rollouts)) >= 2 and rollouts != sorted(rollouts)  # interleaved
    lengths = [len(p) for p in table.column("prompt_ids").to_pylist()]
    assert max(lengths) <= 32_000 + 1 and min(lengths) >= 2_000
    relations = import_log(log, results).summary
    assert relations.relation("drift") and relations.relation("rewrite") and relations.relation("child")
