"""The fuzz campaign in CI (docs/fuzz.md): at least 2,000 seeded cases across the families, none
failing; the counts by family are printed (``-s`` shows them)."""

import pytest

from tests.fuzz.campaign import FAMILIES, campaign, summary

CASES = 2000


@pytest.mark.slow
def test_fuzz_campaign(tmp_path):
    tally = campaign(CASES, seed=56, work=tmp_path / "work", replay=tmp_path / "failures")
    print("\n" + summary(tally))
    assert sum(tally.cases.values()) >= CASES and all(tally.cases[f] for f in FAMILIES)
    assert not tally.failures, "\n".join(tally.failures)
