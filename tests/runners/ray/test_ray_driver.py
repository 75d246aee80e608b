"""The Ray driver and its tasks without Ray: ``chainrows.runners.ray.job.run`` on a stand-in
for Ray that runs each task inline when it is launched (same task functions, same argument
passing, errors carried by the results the way Ray carries them). Fast and exact: every
routing, range and ordering decision of the driver is checked against the single-process run;
the real cluster (retries, kills, several nodes) is tests/runners/ray/test_ray.py's."""

from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from chainrows.errors import InputError
from chainrows.options import Options
from chainrows.runners.ray import job
from tests.runners.ray.test_ray import messy_dataset, parts, read_output, same_table, single_process


class _Ref:
    def __init__(self, value=None, error: BaseException | None = None):
        self.value, self.error = value, error


class _Remote:
    def __init__(self, fn, calls: Counter, returns: int = 1):
        self.fn, self.calls, self.returns = fn, calls, returns

    def options(self, num_returns: int = 1, scheduling_strategy: str = "DEFAULT"):
        assert scheduling_strategy in ("DEFAULT", "SPREAD")
        return _Remote(self.fn, self.calls, num_returns)

    def remote(self, *args):
        self.calls[self.fn.__name__] += 1
        values = [a.value if isinstance(a, _Ref) else a for a in args]
        self.calls.update(f"plan.own_workers={v.own_workers}" for v in values if hasattr(v, "own_workers"))
        errors = [a.error for a in args if isinstance(a, _Ref) and a.error is not None]
        try:
            if errors:
                raise errors[0]
            got = self.fn(*[a.value if isinstance(a, _Ref) else a for a in args])
        except Exception as exc:  # Ray keeps the error in every return of the task
            return _Ref(error=exc) if self.returns == 1 else [_Ref(error=exc) for _ in range(self.returns)]
        if self.returns == 1:
            return _Ref(got)
        assert len(got) == self.returns, (self.fn.__name__, len(got), self.returns)
        return [_Ref(v) for v in got]


class FakeRay:
    """What job.run uses of Ray, run inline."""

    def __init__(self, cpus: int = 2):
        self.cpus, self.calls = cpus, Counter()

    def cluster_resources(self):
        return {"CPU": self.cpus}

    def remote(self, fn):
        return _Remote(fn, self.calls)

    def put(self, value):
        return _Ref(value)

    def wait(self, refs, num_returns=1, timeout=None):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        if ref.error is not None:
            raise ref.error
        return ref.value

    def cancel(self, ref):
        pass


@pytest.fixture
def fake_ray(monkeypatch):
    ray = FakeRay()

    @contextlib.contextmanager
    def connected(address, num_cpus=None, *, worker_logs=True):
        yield ray

    monkeypatch.setattr(job, "connected", connected)
    return ray


@pytest.mark.parametrize("buckets", [1, 3, 7])
def test_driver_gives_the_single_process_tables(tmp_path, fake_ray, monkeypatch, buckets):
    """With 3 buckets, every file is also read in runs of a few row groups."""
    data = messy_dataset(tmp_path / "data", 90, seed=buckets, group_size=3)
    if buckets == 3:
        for f in (*(data / "tokens").iterdir(), *(data / "ledger").iterdir()):
            pq.write_table(pq.read_table(f), f, row_group_size=5)
        monkeypatch.setattr(job, "READ_BYTES", 1)
    assert single_process(data, tmp_path / "want", [])[0] == 0
    records: list = []
    summary = job.run(data, tmp_path / "got", Options(), buckets=buckets, progress=False, records=records)
    for name in ("rows", "report"):
        assert same_table(read_output(tmp_path / "got", name), read_output(tmp_path / "want", name)), name
    assert sorted(r["bucket"] for r in records) == list(range(buckets))
    assert summary.rollouts == read_output(tmp_path / "want", "report").num_rows
    assert parts(tmp_path / "got", "report") == min(buckets, summary.rollouts)
    files = sum(len(list((data / name).iterdir())) for name in ("ledger", "tokens", "rollouts"))
    assert fake_ray.calls["decide"] == buckets
    assert (fake_ray.calls["split_file"] > files) == (buckets == 3)


def test_driver_forest_plan_without_logprobs(tmp_path, fake_ray):
    data = messy_dataset(tmp_path / "data", 60, seed=11, worker_rate=0.3, fork_rate=0.2, group_size=3,
                         logprobs=False)
    flags = ["--plan", "forest", "--placeholders", "--baseline", "loo"]
    assert single_process(data, tmp_path / "want", flags)[0] == 0
    job.run(data, tmp_path / "got", Options(plan="forest", placeholders=True, baseline="loo"), buckets=4,
            progress=False)
    for name in ("rows", "report"):
        assert same_table(read_output(tmp_path / "got", name), read_output(tmp_path / "want", name)), name


def test_a_bad_file_found_in_a_task_is_the_single_process_error_and_nothing_is_committed(tmp_path, fake_ray):
    data = messy_dataset(tmp_path / "data", 60, seed=2)
    f = max((data / "tokens").iterdir(), key=lambda p: p.stat().st_size)
    raw = bytearray(f.read_bytes())
    raw[100:2100] = b"\xff" * 2000  # the footer survives, the first pages do not
    f.write_bytes(bytes(raw))
    rc, err = single_process(data, tmp_path / "want", [])
    assert rc == 2
    with pytest.raises(InputError) as got:
        job.run(data, tmp_path / "got", Options(), buckets=3, progress=False)
    assert f"chainrows: error: {got.value}" == err.strip()
    assert not Path(tmp_path / "got").exists() or not list((tmp_path / "got").iterdir())


def test_empty_dataset_writes_one_empty_part_each(tmp_path, fake_ray):
    data = messy_dataset(tmp_path / "data", 50, seed=4)
    for name in ("ledger", "tokens", "rollouts"):
        for f in (data / name).iterdir():
            pq.write_table(pq.read_table(f).slice(0, 0), f)
    assert single_process(data, tmp_path / "want", [])[0] == 0
    job.run(data, tmp_path / "got", Options(), buckets=2, progress=False)
    for name in ("rows", "report"):
        assert read_output(tmp_path / "got", name).num_rows == 0
        assert parts(tmp_path / "got", name) == 1


@pytest.mark.parametrize("exclusive, own", [(None, True), (True, True), (False, False)])
def test_workers_are_set_up_as_the_runs_own_only_when_they_are(tmp_path, fake_ray, exclusive, own):
    """No session held here: by default the run's workers are its own (pandas kept out, no huge
    pages); ``exclusive=False`` leaves them as they are."""
    data = messy_dataset(tmp_path / "data", 50, seed=6)
    job.run(data, tmp_path / "got", Options(), buckets=2, progress=False, exclusive=exclusive)
    assert fake_ray.calls[f"plan.own_workers={own}"] > 0 and fake_ray.calls[f"plan.own_workers={not own}"] == 0
