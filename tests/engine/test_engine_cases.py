"""Every hand-written case of tests/cases.py, run through the Numba engine."""

import pytest

from tests.cases import CASES, check_case
from tests.support.engine_adapter import engine_reassemble


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_engine_case(case):
    ledger, tokens, rollouts = case.inputs()
    rows, report = engine_reassemble(ledger, tokens, rollouts, **case.options)
    check_case(case, rows, report)
