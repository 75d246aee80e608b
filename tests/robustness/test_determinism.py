"""Determinism: the same input and options give byte-identical ``rows/`` parts and
``report.parquet`` whatever the thread count, bucket count, memory budget, physical layout of
the input (part files, row groups, codecs, accepted physical types), the order of rows that
carries no meaning (token rows, rollouts rows, interleaving of rollouts in the ledger), and
across repeated runs (docs/decisions.md "Output").
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chainrows import reassemble
from chainrows.formats.native.dataset import read_dataset
from chainrows.outdir.provenance import read_provenance
from chainrows.synth import write_synth_dataset
from tests.support.cli_worker import assert_ran, cli  # noqa: F401  (cli is a fixture)
from tests.support.outputs import output_bytes, output_bytes_but_input

OPTION_SETS = {
    "default": [],
    "ordinary+placeholders": ["--mode", "ordinary", "--placeholders"],
    "loo-nostd-ok-row": ["--baseline", "loo", "--no-std", "--baseline-population", "ok",
                         "--row-weight", "row", "--placeholders"],
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("det") / "data"
    write_synth_dataset(root, 300, seed=5, corrupt_rate=0.25, mean_gen_tokens=120,
                        prompt_tokens=300)
    return root


@pytest.fixture(scope="module")
def baseline_dirs(cli, dataset, tmp_path_factory) -> dict:
    """The OUT of a plain in-memory run, per option set."""
    out = {}
    for name, opts in OPTION_SETS.items():
        d = tmp_path_factory.mktemp("baseline") / name
        assert_ran(cli.run("reassemble", dataset, d, "--threads", "2", *opts))
        out[name] = d
    return out


@pytest.fixture(scope="module")
def baselines(baseline_dirs) -> dict:
    """Output bytes of a plain in-memory run, per option set."""
    return {name: _bytes(d) for name, d in baseline_dirs.items()}


def _same_but_input(out: Path, baseline: Path, what: str) -> None:
    """The same rows from input files laid out otherwise: every data page the same bytes, the
    same provenance but for the input's fingerprint (which must differ)."""
    _bytes(out)
    _same(output_bytes_but_input(out), output_bytes_but_input(baseline), what)
    assert read_provenance(out)["input"] != read_provenance(baseline)["input"], what


def _bytes(out: Path) -> dict:
    files = sorted(p.name for p in out.iterdir())
    assert files == ["report.parquet", "rows"], files
    return output_bytes(out)


def _same(got: dict, want: dict, what: str) -> None:
    for name in want:
        assert got[name] == want[name], f"{what}: {name} differs"


VARIATIONS = {
    "1 thread": ["--threads", "1"],
    "2 threads": ["--threads", "2"],
    "1 bucket": ["--buckets", "1"],
    "3 buckets": ["--buckets", "3", "--threads", "2"],
    "7 buckets, 1 thread": ["--buckets", "7", "--threads", "1"],
    "3 windows": ["--steps", "3", "--threads", "2"],
    "11 windows, 1 thread": ["--steps", "11", "--threads", "1"],
    "5 windows written to disk": ["--steps", "5", "--hold-runs", "0", "--threads", "2"],
    "64GiB budget": ["--memory-budget", "64GiB", "--threads", "2"],
}
# every variation with the default options; the main ones with the others
CASES = [("default", v) for v in VARIATIONS] + [
    (o, v) for o in OPTION_SETS if o != "default"
    for v in ("1 thread", "7 buckets, 1 thread", "11 windows, 1 thread")]
RUNS = {"3 windows": "3 held in memory, 0 written to disk",
        "5 windows written to disk": "0 held in memory, 5 written to disk"}
PATHS = {"1 bucket": "memory", "3 buckets": "spill", "7 buckets, 1 thread": "spill",
         "3 windows": "stream", "11 windows, 1 thread": "stream", "5 windows written to disk": "stream", "64GiB budget": "memory"}


@pytest.mark.slow
@pytest.mark.parametrize("options,variation", CASES, ids=[f"{o}|{v}" for o, v in CASES])
def test_threads_buckets_windows_budget(cli, dataset, baselines, tmp_path, options, variation):
    out = tmp_path / "out"
    res = cli.run("reassemble", dataset, out, *OPTION_SETS[options], *VARIATIONS[variation])
    assert_ran(res)
    _same(_bytes(out), baselines[options], f"{options} {variation}")
    if variation in PATHS:  # the summary names the path the run took
        path = next(x for x in res.stdout.splitlines() if x.startswith("path")).split()[1]
        assert path.rstrip(",") == PATHS[variation], res.stdout
    if variation in RUNS:  # and where a stream's sorted runs were kept
        assert re.search(rf"^  windows' runs +{RUNS[variation]}$", res.stdout, re.M), res.stdout


def test_repeated_runs_and_rerun_into_same_out(cli, dataset, baselines, tmp_path):
    out = tmp_path / "out"
    for _ in range(2):
        assert_ran(cli.run("reassemble", dataset, out, "--threads", "2", "--overwrite"))
        _same(_bytes(out), baselines["default"], "rerun into the same OUT")
    assert_ran(cli.run("reassemble", dataset, out, "--buckets", "3", "--overwrite"))
    _same(_bytes(out), baselines["default"], "partitioned rerun into the same OUT")


# ----------------------------------------------------------------------------- input layout

def _tables(dataset: Path) -> dict:
    return {n: pq.read_table(dataset / f"{n}.parquet") for n in ("ledger", "tokens", "rollouts")}


def _write_parts(root: Path, name: str, table: pa.Table, cuts, reverse_creation=True, **options):
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    bounds = [0, *sorted(cuts), table.num_rows]
    order = list(range(len(bounds) - 1))
    if reverse_creation:  # the directory listing order is not the read order
        order.reverse()
    for i in order:
        pq.write_table(table.slice(bounds[i], bounds[i + 1] - bounds[i]),
                       folder / f"part-{i:05d}.parquet", **options)
    (folder / "_SUCCESS").write_bytes(b"")
    (folder / ".hidden.parquet").write_bytes(b"not parquet, skipped")


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_split_into_part_files(cli, dataset, baseline_dirs, tmp_path, seed):
    rng = random.Random(seed)
    root = tmp_path / "parts"
    for name, table in _tables(dataset).items():
        n = table.num_rows
        if name == "rollouts" and seed == 1:  # mixed layout: one table as a single file
            root.mkdir(exist_ok=True)
            pq.write_table(table, root / "rollouts.parquet")
            continue
        cuts = rng.sample(range(1, n), k=min(rng.randint(1, 5), n - 1))
        # some parts empty, some one row long
        cuts += [cuts[0], min(cuts[0] + 1, n)]
        _write_parts(root, name, table, cuts, compression=rng.choice(["snappy", "zstd", "none"]),
                     row_group_size=rng.choice([None, 7, 100]))
    for buckets in (["--buckets", "1"], ["--buckets", "3"], ["--steps", "4"]):
        out = tmp_path / f"out{buckets[-1]}"
        assert_ran(cli.run("reassemble", root, out, "--threads", "2", *buckets))
        _same_but_input(out, baseline_dirs["default"], f"parts seed {seed} {buckets}")


def _shuffle_keep_capture_order(tables: dict, seed: int) -> dict:
    """Reorder rows in every way the SPEC says carries no meaning."""
    rng = np.random.default_rng(seed)
    tok = tables["tokens"]
    tokens = tok.take(pa.array(rng.permutation(tok.num_rows)))
    # rollouts rows: shuffle the rollout ids, keep each id's rows in their order (first counts)
    ro = tables["rollouts"]
    ids = ro.column("rollout_id").to_pylist()
    firsts = {}
    for i, rid in enumerate(ids):
        firsts.setdefault(rid, []).append(i)
    keys = list(firsts)
    rng.shuffle(keys)
    rollouts = ro.take(pa.array([i for k in keys for i in firsts[k]]))
    # ledger: a random interleaving of the rollouts, each rollout's rows in capture order
    led = tables["ledger"]
    lids = led.column("rollout_id").to_pylist()
    queues = {}
    for i, rid in enumerate(lids):
        queues.setdefault(rid, []).append(i)
    owner = np.array([rid for rid in queues for _ in queues[rid]], dtype=object)
    rng.shuffle(owner)
    pos = {rid: 0 for rid in queues}
    order = []
    for rid in owner:
        order.append(queues[rid][pos[rid]])
        pos[rid] += 1
    ledger = led.take(pa.array(order))
    return {"ledger": ledger, "tokens": tokens, "rollouts": rollouts}


@pytest.mark.slow
@pytest.mark.parametrize("options", sorted(OPTION_SETS))
def test_row_order_without_meaning(cli, dataset, baseline_dirs, tmp_path, options):
    tables = _shuffle_keep_capture_order(_tables(dataset), seed=len(options))
    root = tmp_path / "shuffled"
    root.mkdir()
    for name, t in tables.items():
        pq.write_table(t, root / f"{name}.parquet", row_group_size=50)
    for extra in ([], ["--buckets", "4"], ["--steps", "5"]):
        out = tmp_path / f"out{'-'.join(extra)}"
        assert_ran(cli.run("reassemble", root, out, "--threads", "2", *OPTION_SETS[options], *extra))
        _same_but_input(out, baseline_dirs[options], f"shuffled rows {options} {extra}")


def test_accepted_physical_types(cli, dataset, baseline_dirs, tmp_path):
    """large_string / dictionary ids, large_list lists, narrow integers: same bytes out."""
    tables = _tables(dataset)
    led = tables["ledger"]
    led = led.set_column(led.schema.get_field_index("rollout_id"), "rollout_id",
                         led.column("rollout_id").cast(pa.large_string()))
    led = led.set_column(led.schema.get_field_index("call_id"), "call_id",
                         led.column("call_id").combine_chunks().dictionary_encode())
    led = led.set_column(led.schema.get_field_index("gen_len"), "gen_len",
                         led.column("gen_len").cast(pa.int32()))
    led = led.set_column(led.schema.get_field_index("item_keys"), "item_keys",
                         led.column("item_keys").cast(pa.large_list(pa.uint64())))
    tok = tables["tokens"]
    tok = tok.set_column(tok.schema.get_field_index("tokens"), "tokens",
                         tok.column("tokens").cast(pa.large_list(pa.int32())))
    tok = tok.select(tok.column_names[::-1]).append_column("junk", pa.array([b"x"] * tok.num_rows))
    root = tmp_path / "typed"
    root.mkdir()
    pq.write_table(led, root / "ledger.parquet", compression="gzip")
    pq.write_table(tok, root / "tokens.parquet", compression="none", data_page_version="2.0")
    pq.write_table(tables["rollouts"], root / "rollouts.parquet", use_dictionary=False)
    out = tmp_path / "out"
    assert_ran(cli.run("reassemble", root, out, "--threads", "2"))
    _same_but_input(out, baseline_dirs["default"], "physical types")


def test_api_independent_of_thread_count(dataset):
    import numba

    ds = read_dataset(dataset)
    before = numba.get_num_threads()
    try:
        results = []
        for n in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(n)
            results.append(reassemble(ds.ledger, ds.tokens, ds.rollouts, placeholders=True))
    finally:
        numba.set_num_threads(before)
    for r in results[1:]:
        assert r.rows.equals(results[0].rows) and r.report.equals(results[0].report)



def test_build_helper_thread_returns_and_raises_like_inline():
    """build_batch makes the token buffers through columnar._submit: on a helper thread when
    Numba and Arrow both have more than one, inline otherwise. Either way .result() gives the value, or raises the
    error at the point the caller asks for it (so errors keep their order)."""
    import numba

    from chainrows.errors import InputError
    from chainrows.lowering import columnar

    def boom(x):
        raise InputError(f"tokens: bad {x}")

    before, arrow_before = numba.get_num_threads(), pa.cpu_count()
    seen = set()
    try:
        for n, arrow in ((1, 2), (numba.config.NUMBA_NUM_THREADS, 2), (numba.config.NUMBA_NUM_THREADS, 1)):
            numba.set_num_threads(n)
            pa.set_cpu_count(arrow)
            threaded = not isinstance(columnar._submit(lambda: None), columnar._Deferred)
            assert threaded == (n > 1 and arrow > 1)  # one Arrow thread (a partitioned run): no helper
            seen.add(threaded)
            assert columnar._submit(lambda a, b: a + b, 2, 3).result() == 5
            fut = columnar._submit(boom, "x")  # no raise yet
            with pytest.raises(InputError, match="tokens: bad x"):
                fut.result()
    finally:
        numba.set_num_threads(before)
        pa.set_cpu_count(arrow_before)
    assert seen == ({False, True} if numba.config.NUMBA_NUM_THREADS > 1 else {False})
