"""The reference (chainrows.reference) against the hand-written cases of tests/cases.py."""

from __future__ import annotations

import copy
import time

import pyarrow as pa
import pytest
import xxhash

from chainrows import reasons as R
from chainrows.formats.native.schema import tables_from_pylists
from chainrows.reference import chain_hash, reassemble
from tests.cases import CASES, check_case
from tests.support.builders import delta_hash, one_call, worked_example


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(case):
    rows, report = reassemble(*case.inputs(), **case.options)
    check_case(case, rows, report)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_through_arrow(case):
    """The same case after an Arrow round trip (null lists, uint64 keys, float32 logprobs)."""
    tables = tables_from_pylists(*case.inputs())
    ledger, tokens, rollouts = (t.to_pylist() for t in tables)
    rows, report = reassemble(ledger, tokens, rollouts, **case.options)
    check_case(case, rows, report)


def test_every_detail_is_covered():
    """Every detail id has a case, except the cc walk's safety check, which the cut makes
    unreachable (docs/decisions.md, "Walk in cc mode")."""
    covered = {e.detail_id for c in CASES for e in c.expect.values()}
    missing = set(range(1, len(R.DETAILS))) - covered - {R.D_WALK_LEAVES_CHAIN}
    assert not missing, [R.DETAILS[i] for i in sorted(missing)]


def test_detail_texts():
    assert R.format_detail(R.D_HASH, call_id="c2") == "recomputed chain hash differs from chain_hash: call c2"
    assert R.format_detail(R.D_UNMATCHED, position=6) == "no call matches the output items starting at output position 6"


def test_chain_hash():
    assert chain_hash([], 0) == xxhash.xxh3_64_intdigest(b"", 0)
    assert chain_hash([1, -2, 3], 7) == xxhash.xxh3_64_intdigest(
        b"\x01\x00\x00\x00\xfe\xff\xff\xff\x03\x00\x00\x00", 7)
    assert chain_hash([5, 6, 7], 123) == delta_hash([5, 6, 7], 123)


def test_inputs_not_mutated():
    ledger, tokens, rollouts = worked_example().build()
    before = copy.deepcopy((ledger, tokens, rollouts))
    reassemble(ledger, tokens, rollouts)
    reassemble(ledger, tokens, rollouts, mode="ordinary", placeholders=True)
    assert (ledger, tokens, rollouts) == before


def test_rows_and_report_build_arrow_tables():
    """The output dicts fit the SPEC §4 schemas."""
    from chainrows.formats.native.schema import REPORT_SCHEMA, rows_schema

    for logprobs in (False, True):
        parts = [worked_example("a", logprobs=logprobs), one_call("b", logprobs=logprobs)]
        parts[1].ledger_row("c1")["failed"] = True
        ledger, tokens, rollouts = [], [], []
        for p in parts:
            lg, tk, ro = p.build()
            ledger, tokens, rollouts = ledger + lg, tokens + tk, rollouts + ro
        rows, report = reassemble(ledger, tokens, rollouts, placeholders=True)
        assert pa.Table.from_pylist(rows, schema=rows_schema(logprobs)).num_rows == 3
        assert pa.Table.from_pylist(report, schema=REPORT_SCHEMA).num_rows == 2


def test_options_validated():
    ledger, tokens, rollouts = worked_example().build()
    for bad in (dict(mode="tree"), dict(baseline="median"), dict(baseline_population="some"),
                dict(row_weight="token")):
        with pytest.raises(ValueError):
            reassemble(ledger, tokens, rollouts, **bad)


@pytest.mark.slow
def test_a_few_thousand_rollouts_in_seconds():
    ledger, tokens, rollouts = [], [], []
    for i in range(3000):
        lg, tk, ro = worked_example(f"r{i:05d}", group_id=f"g{i // 8}", reward=float(i % 3)).build()
        ledger += lg
        tokens += tk
        rollouts += ro
    t0 = time.perf_counter()
    rows, report = reassemble(ledger, tokens, rollouts)
    elapsed = time.perf_counter() - t0
    assert len(report) == 3000 and len(rows) == 6000
    assert elapsed < 20, elapsed
