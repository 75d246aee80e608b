"""Footers whose fields pyarrow's metadata accessors abort on (SIGABRT from an uncaught C++
exception) are refused with exit 2, naming file, row group and column: one crafted footer per
guarded field (chainrows.formats.native.guard). Each runs in the CLI worker (a child process),
so an abort fails the test instead of killing pytest."""

import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from chainrows.cli import main
from chainrows.formats.native import thrift as t
from tests.support.cli_worker import cli  # noqa: F401
from tests.support.footers import chunk_meta, craft, set_field, split

ROLLOUT_ID, REWARD, OUTPUT_KEYS = 0, 2, 3  # rollouts.parquet's leaf columns

CASES = {
    "definition histogram": (OUTPUT_KEYS, "output_keys.list.element",
                             lambda m: chunk_meta(m, 0, OUTPUT_KEYS)[16][3].pop()),
    "repetition histogram": (OUTPUT_KEYS, "output_keys.list.element",
                             lambda m: chunk_meta(m, 0, OUTPUT_KEYS)[16][2].append(0)),
    "unencoded bytes": (REWARD, "reward", lambda m: set_field(chunk_meta(m, 0, REWARD)[16], 1, t.I64, 9)),
    "short statistics": (REWARD, "reward", lambda m: set_field(chunk_meta(m, 0, REWARD)[12], 6, t.BINARY, b"\1")),
    "physical type": (REWARD, "reward", lambda m: set_field(chunk_meta(m, 0, REWARD), 1, t.I32, 2)),
    "codec": (REWARD, "reward", lambda m: set_field(chunk_meta(m, 0, REWARD), 4, t.I32, 8)),
    "extra chunk": (7, "has 8 column chunks", lambda m: m[4][0][1].append(m[4][0][1][0])),
    "missing chunk": (None, "has 6 column chunks", lambda m: m[4][0][1].pop()),
}
PROBE = ("import sys, pyarrow.parquet as pq\nmd = pq.ParquetFile(sys.argv[1]).metadata\n"
         "[md.row_group(g).column(j).to_dict() for g in range(md.num_row_groups) "
         "for j in range(md.row_group(g).num_columns)]\n")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("guard") / "data"
    assert main(["synth", str(path), "--rollouts", "30", "--seed", "2"]) == 0
    return path


def _damaged(data, tmp_path, change):
    bad = tmp_path / "bad"
    shutil.copytree(data, bad)
    craft(data / "rollouts.parquet", bad / "rollouts.parquet", change)
    return bad


def test_the_writer_fills_the_guarded_fields(data):
    """The crafted cases change fields pyarrow writes (size statistics, min/max statistics)."""
    _, meta = split((data / "rollouts.parquet").read_bytes())
    assert 16 in chunk_meta(meta, 0, OUTPUT_KEYS) and 12 in chunk_meta(meta, 0, REWARD)
    assert len(chunk_meta(meta, 0, OUTPUT_KEYS)[16][3]) == 4  # max definition level 3


@pytest.mark.parametrize("case", CASES)
def test_damaged_footer_is_refused_not_aborted(cli, data, tmp_path, case):  # noqa: F811
    column, named, change = CASES[case]
    bad = _damaged(data, tmp_path, change)
    res = cli.run("reassemble", bad, tmp_path / "out")
    lines = res.stderr.strip().splitlines()
    assert res.rc == 2 and len(lines) == 1, res
    assert "rollouts.parquet" in lines[0] and named in lines[0] and "row group 0" in lines[0], res
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if CASES[c][0] is not None])
def test_each_crafted_footer_aborts_pyarrows_accessors(data, tmp_path, case):
    """The guard is needed: each crafted footer (but the missing chunk's, which only raises) kills
    a process that walks its metadata with pyarrow (SIGABRT), on the pyarrow the tests run with."""
    bad = _damaged(data, tmp_path, CASES[case][2])
    probe = subprocess.run([sys.executable, "-c", PROBE, str(bad / "rollouts.parquet")], capture_output=True,
                           text=True)
    assert probe.returncode < 0, probe.stderr[-300:]


def test_damaged_call_log_footer_is_refused(cli, tmp_path):  # noqa: F811
    import pyarrow as pa

    log = tmp_path / "calls.parquet"
    pq.write_table(pa.table({"rollout_id": ["r"], "call_id": ["c"], "prompt_ids": [[1, 2, 3]],
                             "completion_ids": [[4]]}), log)
    results = tmp_path / "results.jsonl"
    results.write_text('{"rollout_id": "r", "group_id": "g", "reward": 1.0, "output": []}\n')
    bad = craft(log, tmp_path / "bad.parquet", lambda m: chunk_meta(m, 0, 2)[16][3].pop())
    res = cli.run("import-calls", bad, results, tmp_path / "out")
    assert res.rc == 2 and "row group 0" in res.stderr and "prompt_ids.list.element" in res.stderr, res
    assert not (tmp_path / "out").exists()


def test_cut_call_log_is_refused(cli, tmp_path):  # noqa: F811
    """A Parquet call log cut short is exit 2 naming it (found by the fuzz campaign: the check
    for a logprobs column opened it outside the reader's error handling, exit 1)."""
    import pyarrow as pa

    log = tmp_path / "calls.parquet"
    pq.write_table(pa.table({"rollout_id": ["r"], "call_id": ["c"], "prompt_ids": [[1, 2, 3]],
                             "completion_ids": [[4]]}), log)
    log.write_bytes(log.read_bytes()[:100])
    results = tmp_path / "results.jsonl"
    results.write_text('{"rollout_id": "r", "group_id": "g", "reward": 1.0, "output": []}\n')
    res = cli.run("import-calls", log, results, tmp_path / "out")
    assert res.rc == 2 and "calls.parquet" in res.stderr and len(res.stderr.splitlines()) == 1, res
    assert not (tmp_path / "out").exists()
