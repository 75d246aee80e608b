"""Smoke test of asv_benchmarks/gym.py at a tiny size: the asv class and the one-run script run
and print every figure. No timing is asserted."""

from __future__ import annotations

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.slow  # tests/README.md: benchmark smoke

ROOT = REPO


@pytest.fixture(autouse=True)
def _bench_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CHAINROWS_BENCH_CACHE", str(tmp_path / "bench-cache"))


def test_asv_class_runs_every_benchmark():
    from asv_benchmarks.gym import ImportGym

    methods = [m for m in dir(ImportGym) if m.startswith("time_")]
    assert len(methods) == 4
    bench = ImportGym()
    for threads in (1, 2):
        bench.setup(2, threads)
        try:
            for m in methods:
                getattr(bench, m)(2, threads)
        finally:
            bench.teardown(2, threads)


def test_one_run_script_prints_ratios(capsys):
    from asv_benchmarks import gym

    assert gym.main(["--rollouts", "2"]) == 0
    out = capsys.readouterr().out
    for label in ("import_gym MB/s", "import_gym, exact parser", "verifier alone MB/s", "sha256 staged floor",
                  "sha256 checks floor", "import CPU s (fast, exact)"):
        assert label in out
    assert out.count("/ staged floor") == 6  # import, exact parser and verifier, on 1 and 2 threads
