"""The dataset runner: Parquet in, Parquet out, in memory or partitioned, resumable."""

import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from chainrows import bulk, reference
from chainrows.options import Options
from chainrows.synth import write_synth_dataset

from test_properties import compare_outputs


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("synth") / "data"
    write_synth_dataset(path, 240, seed=7, corrupt_rate=0.25)
    return path


def _read(out):
    return pq.read_table(out / "rows.parquet"), pq.read_table(out / "report.parquet")


_RUN_TABLES = bulk.run_tables  # the real one, whatever a test has patched in


def _count_buckets(monkeypatch, calls, crash_at=None):
    """Patch bulk.run_tables to append to ``calls`` per bucket reassembled, and to raise on
    call number ``crash_at`` (a crash in that bucket)."""
    def counted(*args, **kwargs):
        calls.append(1)
        if len(calls) == crash_at:
            raise RuntimeError(f"simulated crash in call {crash_at}")
        return _RUN_TABLES(*args, **kwargs)

    monkeypatch.setattr(bulk, "run_tables", counted)


def test_round_trip_agrees_with_reference(dataset, tmp_path):
    """synth -> reassemble -> read rows: every rollout as the oracle decides it."""
    summary = bulk.run(dataset, tmp_path / "out", buckets=1)
    rows, report = _read(tmp_path / "out")
    ledger, tokens, rollouts = (pq.read_table(dataset / f"{n}.parquet").to_pylist()
                                for n in ("ledger", "tokens", "rollouts"))
    want_rows, want_report = reference.reassemble(ledger, tokens, rollouts)
    compare_outputs("round trip", rows.to_pylist(), report.to_pylist(), want_rows, want_report)
    assert summary.rollouts == len(want_report)
    assert summary.ok == sum(r["status"] == "ok" for r in want_report)
    assert summary.rows == len(want_rows) == rows.num_rows


@pytest.mark.parametrize("buckets", [2, 5])
def test_partitioned_output_is_byte_identical(dataset, tmp_path, buckets):
    bulk.run(dataset, tmp_path / "one", buckets=1)
    bulk.run(dataset, tmp_path / "many", buckets=buckets)
    for name in ("rows.parquet", "report.parquet"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "many" / name).read_bytes()
    assert not (tmp_path / "many" / bulk.WORK_DIR).exists()


def test_failed_run_leaves_no_output_and_resume_finishes(dataset, tmp_path, monkeypatch):
    reference_out = tmp_path / "ref"
    bulk.run(dataset, reference_out, buckets=4)
    out = tmp_path / "out"
    calls = []
    _count_buckets(monkeypatch, calls, crash_at=3)  # bucket 2
    with pytest.raises(RuntimeError):
        bulk.run(dataset, out, buckets=4)
    assert not (out / "rows.parquet").exists() and not (out / "report.parquet").exists()
    assert len(list((out / bulk.WORK_DIR / "spill").glob("*/done.json"))) == 2
    calls.clear()
    summary = bulk.run(dataset, out, buckets=4, resume=True)
    assert len(calls) == 2  # buckets 2 and 3 only
    assert summary.rollouts == 240
    for name in ("rows.parquet", "report.parquet"):
        assert (out / name).read_bytes() == (reference_out / name).read_bytes()


def test_resume_ignores_work_of_other_options(dataset, tmp_path, monkeypatch):
    out = tmp_path / "out"
    calls = []
    _count_buckets(monkeypatch, calls, crash_at=2)
    with pytest.raises(RuntimeError):
        bulk.run(dataset, out, buckets=3)
    calls.clear()
    _count_buckets(monkeypatch, calls)
    bulk.run(dataset, out, Options(mode="ordinary"), buckets=3, resume=True)
    assert len(calls) == 3  # different options: nothing reused


def test_plan_buckets_grows_with_size():
    assert bulk.plan_buckets(10 << 20, 4 << 30) == 1
    assert bulk.plan_buckets(8 << 30, 1 << 30) >= 8 * bulk.PEAK_FACTOR


def test_spill_buckets_follow_the_measured_baseline():
    size, budget = 2_250_000_000, 512 << 20  # the large test below
    k = bulk.spill_buckets(size, budget, 200 << 20)
    per_bucket = size / k
    assert bulk.SPILL_PEAK_FACTOR * per_bucket <= bulk.BUCKET_SHARE * (budget - (200 << 20))
    assert bulk.spill_buckets(size, budget, 300 << 20) > k  # a bigger process leaves less room
    assert bulk.spill_buckets(1, budget, 200 << 20) == 2
    # a budget below the baseline cannot be met; the phases still get a quarter of it
    assert bulk.headroom(budget, 600 << 20) == budget // 4


def test_baseline_is_the_process_rss_after_loading_kernels():
    base = bulk.measure_baseline(Options(), True)
    rss = bulk.process_rss()
    if rss is None:  # no /proc: the constant
        assert base == bulk.BASE_RSS
    else:
        assert 0 < base and abs(rss - base) < 64 << 20


def test_resume_keeps_the_planned_bucket_count(dataset, tmp_path, monkeypatch):
    """The planned count depends on the measured baseline; a resumed job keeps its own."""
    out = tmp_path / "out"
    calls = []
    monkeypatch.setattr(bulk, "plan_buckets", lambda total, budget: 2)  # "does not fit"
    monkeypatch.setattr(bulk, "spill_buckets", lambda total, budget, base: 4)
    _count_buckets(monkeypatch, calls, crash_at=3)
    with pytest.raises(RuntimeError):
        bulk.run(dataset, out)
    calls.clear()
    monkeypatch.setattr(bulk, "spill_buckets", lambda total, budget, base: 5)  # another baseline
    _count_buckets(monkeypatch, calls)
    summary = bulk.run(dataset, out, resume=True)
    assert summary.buckets == 4 and len(calls) == 2  # buckets 2 and 3 only
    bulk.run(dataset, tmp_path / "ref", buckets=1)
    for name in ("rows.parquet", "report.parquet"):
        assert (out / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()


# The measured command is the CLI's, run in a fresh interpreter whose own VmHWM is read at the
# end: ru_maxrss survives execve on Linux, so a child forked from a big pytest process would
# report the parent's RSS at fork time (measured: ~1 GiB for a 495 MiB run).
PEAK_SCRIPT = r"""
import sys
from chainrows.cli import main
rc = main(["reassemble", *sys.argv[1:]])
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print(rc, int(hwm.split()[1]) * 1024)
"""


def _peak(*args):
    res = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, *map(str, args)],
                         capture_output=True, text=True, check=True)
    *summary, last = res.stdout.strip().splitlines()
    rc, peak = map(int, last.split())
    assert rc == 0, res.stdout + res.stderr
    return "\n".join(summary), peak


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmHWM from /proc")
def test_larger_than_memory_stays_under_budget(tmp_path):
    """A dataset 4x the memory budget runs in buckets with peak RSS under the budget.

    ``chainrows reassemble DATA OUT --memory-budget 512MiB`` on 2.2 GB (uncompressed) of
    synthetic data; about 3 minutes and 6 GB of temporary disk (1.6 GB of input, spill files
    and runs up to 4.1 GB). (Byte-identity with an in-memory run is
    tested on small data above: the bucket count does not change the output.)
    """
    data = tmp_path / "big"
    write_synth_dataset(data, 31_000, seed=3, mean_gen_tokens=900, prompt_tokens=3000, workers=2)
    budget = 512 << 20
    size = sum(bulk.input_bytes(data).values())
    assert size >= 4 * budget, f"dataset {size} too small for the test"
    # warm Numba's on-disk cache first, through the same partitioned path: a cold compile is a
    # one-time cost, not data memory
    small = tmp_path / "small"
    write_synth_dataset(small, 16, seed=1)
    _peak(small, tmp_path / "warm", "--memory-budget", "512MiB", "--buckets", "2")
    summary, peak = _peak(data, tmp_path / "out", "--memory-budget", "512MiB")
    buckets = int(next(line.split()[-1] for line in summary.splitlines() if line.startswith("buckets")).replace(",", ""))
    rollouts = int(next(line.split()[-1] for line in summary.splitlines() if line.startswith("rollouts")).replace(",", ""))
    assert buckets > 1
    assert rollouts == _distinct_rollout_ids(data)  # every rollout reported once
    assert peak < budget, f"peak RSS {peak >> 20} MiB over the {budget >> 20} MiB budget\n{summary}"


def _distinct_rollout_ids(data):
    ids = set()
    for name in ("ledger", "tokens", "rollouts"):
        ids |= set(pq.read_table(data / f"{name}.parquet", columns=["rollout_id"])["rollout_id"].unique().to_pylist())
    return len(ids)
