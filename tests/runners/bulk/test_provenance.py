"""How an output was made (chainrows.outdir.provenance): every rows and report file of a
reassembly carries the chainrows version, the options and the input's fingerprint, with nothing
that depends on where input and output live or on the route; and the summary's untrained-tokens
count and warning (chainrows.runners.bulk.summary)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chainrows
from chainrows.api import run_tables
from chainrows.errors import InputError
from chainrows.formats.native.dataset import TABLES, read_dataset, table_files
from chainrows.options import Options
from chainrows.outdir.provenance import PROVENANCE_KEY, describe, option_flags, provenance_of, read_provenance
from chainrows.runners import bulk
from chainrows.runners.bulk.summary import UNTRAINED_WARN_SHARE, Summary
from chainrows.synth.writer import write_synth_dataset
from tests.support.cli_worker import assert_ran, cli  # noqa: F401  (cli is a fixture)
from tests.support.outputs import output_bytes

OPTIONS = Options(mode="ordinary", placeholders=True, baseline="loo", no_std=True,
                  baseline_population="ok", row_weight="row")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("prov") / "data"
    write_synth_dataset(root, 80, seed=11, retry_rate=0.4, mean_gen_tokens=40, prompt_tokens=60,
                        mean_obs_tokens=30)
    return root


@pytest.fixture(scope="module")
def ref(data, tmp_path_factory) -> tuple[Path, Summary]:
    """An in-memory run of ``data`` with the default options: its OUT and summary."""
    out = tmp_path_factory.mktemp("prov-ref") / "out"
    return out, bulk.run(data, out)


def _files(root: Path) -> list[Path]:
    return [f for name in TABLES for f in table_files(root, name)]


def _footers(out: Path) -> list[dict]:
    files = sorted((out / "rows").iterdir()) + [out / "report.parquet"]
    return [provenance_of(pq.read_metadata(f).metadata) for f in files]


def test_every_output_file_records_the_version_the_options_and_the_input(data, tmp_path):
    bulk.run(data, tmp_path / "out", OPTIONS)
    provs = _footers(tmp_path / "out")
    prov = provs[0]
    assert all(p == prov for p in provs) and len(provs) >= 2
    assert prov["chainrows"] == chainrows.__version__ and prov["command"] == "reassemble"
    assert prov["options"] == {"mode": "ordinary", "plan": "linear", "placeholders": True, "baseline": "loo",
                               "no_std": True, "baseline_population": "ok", "row_weight": "row"}
    assert prov["input"]["files"] == 3
    assert prov["input"]["bytes"] == sum(f.stat().st_size for f in _files(data))
    assert len(prov["input"]["fingerprint"]) == 32
    assert read_provenance(tmp_path / "out") == prov
    text = describe(prov)
    assert "mode ordinary" in text and "placeholders" in text and "not divided by the std" in text
    assert option_flags(prov["options"]) == ["--mode", "ordinary", "--placeholders", "--baseline", "loo",
                                             "--no-std", "--baseline-population", "ok", "--row-weight", "row"]
    assert prov["input"]["fingerprint"][:12] in text


def test_same_bytes_whatever_the_paths_and_the_route(data, ref, tmp_path, monkeypatch):
    """The dataset moved elsewhere (and named by a relative path), OUT elsewhere, and the
    stream and spill routes: byte-identical outputs."""
    want = output_bytes(ref[0])
    moved = tmp_path / "elsewhere" / "deeper" / "copy"
    shutil.copytree(data, moved)
    monkeypatch.chdir(tmp_path / "elsewhere")
    bulk.run(Path("deeper") / "copy", "out-rel")
    assert output_bytes(tmp_path / "elsewhere" / "out-rel") == want
    for i, route in enumerate([bulk.Route("stream", 3, "test"), bulk.Route("spill", 2, "test")]):
        bulk.run(moved, tmp_path / f"route{i}", route=route)
        assert output_bytes(tmp_path / f"route{i}") == want, route.path


@pytest.mark.slow
def test_other_input_or_options_are_told_apart(data, ref, tmp_path):
    base = read_provenance(ref[0])
    changed = tmp_path / "changed"
    shutil.copytree(data, changed)
    rollouts = pq.read_table(changed / "rollouts.parquet")
    pq.write_table(rollouts.slice(0, rollouts.num_rows - 1), changed / "rollouts.parquet")
    other = read_provenance(_run(changed, tmp_path / "other"))
    assert other["input"]["fingerprint"] != base["input"]["fingerprint"]
    assert other["options"] == base["options"]
    forest = read_provenance(_run(data, tmp_path / "forest", Options(plan="forest")))
    assert forest["input"] == base["input"] and forest["options"]["plan"] == "forest"


def _run(data, out, options=Options()) -> Path:
    bulk.run(data, out, options)
    return out


def test_api_tables_carry_it_and_keep_it_when_written(data, ref, tmp_path):
    ds = read_dataset(data)
    result = run_tables(ds.ledger, ds.tokens, ds.rollouts, OPTIONS)
    for table in result:
        prov = provenance_of(table.schema.metadata)
        assert prov["input"] is None and prov["options"] == OPTIONS.to_json()
    from_path = chainrows.reassemble(data)
    pq.write_table(from_path.rows, tmp_path / "rows.parquet")
    assert read_provenance(tmp_path / "rows.parquet") == read_provenance(ref[0])


def test_read_provenance_finds_the_first_file_or_says_none(ref, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(ref[0], out)
    prov = read_provenance(out)
    assert prov is not None
    for where in (out / "rows", next((out / "rows").iterdir()), out / "report.parquet"):
        assert read_provenance(where) == prov, where
    (out / "rows").rename(tmp_path / "rows-gone")
    assert read_provenance(out) == prov  # the report then
    pq.write_table(pa.table({"x": [1]}), tmp_path / "plain.parquet")
    (tmp_path / "empty").mkdir()
    assert read_provenance(tmp_path / "plain.parquet") is None
    assert read_provenance(tmp_path / "empty") is None
    assert read_provenance(tmp_path / "missing") is None
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputError, match="bad.parquet"):
        read_provenance(tmp_path / "bad.parquet")
    meta = pq.read_metadata(out / "report.parquet").metadata
    assert meta[PROVENANCE_KEY].decode() == meta[PROVENANCE_KEY].decode().strip()  # compact JSON
    assert b" " not in meta[PROVENANCE_KEY]


def _untrained_by_hand(data: Path, out: Path) -> tuple[int, int]:
    """(generated, untrained) of the ok rollouts from the tables: Σ gen_len of their non-failed
    calls, and of those whose call_id is in no row."""
    ledger = pq.read_table(data / "ledger.parquet").to_pandas()
    report = pq.read_table(out / "report.parquet").to_pandas()
    rows = pq.read_table(out / "rows", columns=["rollout_id", "call_ids", "weight"]).to_pandas()
    trained = {(r, c) for r, calls, w in zip(rows.rollout_id, rows.call_ids, rows.weight) if w > 0 for c in calls}
    ok = set(report.rollout_id[report.status == "ok"])
    mine = ledger[ledger.rollout_id.isin(ok) & ~ledger.failed]
    generated = int(mine.gen_len.sum())
    keys = pd.Series(list(zip(mine.rollout_id, mine.call_id)), index=mine.index)
    untrained = int(mine.gen_len[~keys.isin(trained)].sum())
    return generated, untrained


def test_untrained_tokens_are_counted_on_every_route_and_warned_about(data, ref, tmp_path):
    generated, untrained = _untrained_by_hand(data, ref[0])
    assert untrained / generated >= UNTRAINED_WARN_SHARE  # rejected retries are never trained
    for i, route in enumerate([None, bulk.Route("stream", 3, "test"), bulk.Route("spill", 2, "test")]):
        summary = ref[1] if route is None else bulk.run(data, tmp_path / f"r{i}", route=route)
        assert (summary.generated_tokens, summary.untrained_tokens) == (generated, untrained)
        assert f"{untrained:,} of {generated:,}" in summary.format()
        assert f"chainrows explain {data} ROLLOUT_ID" in summary.format()
    result = chainrows.reassemble(data)
    assert (result.generated_tokens, result.untrained_tokens) == (generated, untrained)


def test_no_warning_without_untrained_tokens_or_below_the_share(tmp_path):
    data = tmp_path / "data"
    write_synth_dataset(data, 40, seed=2, retry_rate=0.0, mean_gen_tokens=40, prompt_tokens=60)
    summary = bulk.run(data, tmp_path / "out")
    generated, untrained = _untrained_by_hand(data, tmp_path / "out")
    assert (summary.generated_tokens, summary.untrained_tokens) == (generated, untrained)
    assert generated > 0 and untrained / generated < UNTRAINED_WARN_SHARE
    assert "warning" not in summary.format() and "made with" in summary.format()
    below = Summary(generated_tokens=10_000, untrained_tokens=int(10_000 * UNTRAINED_WARN_SHARE) - 1)
    at = Summary(generated_tokens=10_000, untrained_tokens=int(10_000 * UNTRAINED_WARN_SHARE))
    assert below.untrained_warning() is None and at.untrained_warning() is not None


@pytest.mark.slow
def test_cli_summary_shows_how_it_was_made_and_the_warning(cli, data, tmp_path):
    res = cli.run("reassemble", data, tmp_path / "out", "--mode", "ordinary")
    assert_ran(res)
    prov = read_provenance(tmp_path / "out")
    made = [line for line in res.stdout.splitlines() if line.startswith("made with")]
    assert len(made) == 1 and "mode ordinary" in made[0]
    assert "input 3 files" in made[0] and prov["input"]["fingerprint"][:12] in made[0]
    assert f"chainrows explain {data} ROLLOUT_ID --mode ordinary" in res.stdout.splitlines()[-1]
    assert os.path.basename(str(data)) not in made[0]  # no paths in it
