"""The forest plan (SPEC §3.1): the table of shapes, loss ownership pinned by hand, and the
engine against the reference on random forests, both plans, every §5 option.

Shapes are written as parent lists: entry i is the parent of call ``c<i>`` (None for a root).
Every expected row list below is copied from the SPEC §3.1 table, never from a run.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chainrows import reasons as R
from chainrows import reference
from chainrows.options import Options
from chainrows.reasons import format_detail
from tests.support.builders import RolloutBuilder, combine
from tests.support.compare import compare_outputs
from tests.support.engine_adapter import engine_reassemble
from tests.support.profiles import examples
from tests.support.randomized import CORRUPTIONS, _corrupt, _interleave

BOTH = pytest.mark.parametrize("impl", ["engine", "reference"])
IMPLS = {"engine": engine_reassemble, "reference": reference.reassemble}


def forest(parents, rid="f", *, output=None, logprobs=False, group_id="g", reward=1.0):
    """A rollout whose call i has parent ``parents[i]`` (an index, or None for a root), one
    item each (key 100 + i), carry [10i + 1], gen [10i + 2, 10i + 3]. ``output``: the calls
    whose items form the output, in order (default: all, in capture order)."""
    b = RolloutBuilder(rid, group_id=group_id, reward=reward, logprobs=logprobs)
    for i, p in enumerate(parents):
        b.call(f"c{i}", None if p is None else f"c{p}", carry=[10 * i + 1],
               gen=[10 * i + 2, 10 * i + 3], items=[100 + i])
    b.output([f"c{i}" for i in (range(len(parents)) if output is None else output)], terminal=None)
    return b


def run(impl, b, **options):
    rows, report = IMPLS[impl](*b.build(), **dict(dict(plan="forest"), **options))
    return rows, report


def chains_of(rows):
    return [[int(c[1:]) for c in r["call_ids"]] for r in rows]


_ = None
SHAPES = [  # (parents, chains) from the SPEC §3.1 table
    ([_, _, 0, 1], [[0, 2], [1, 3]]),
    ([_, 0, 0], [[0, 1], [0, 2]]),
    ([_, _, 0, _, 1, 3], [[0, 2], [1, 4], [3, 5]]),
    ([_, _, _, 1, 2, 0], [[0, 5], [1, 3], [2, 4]]),
    ([_, _, 0, _, 1, 3, 2], [[0, 2, 6], [1, 4], [3, 5]]),
    ([_, _, 0, _, 3, _, 4, 5], [[0, 2], [1], [3, 4, 6], [5, 7]]),
    ([_, 0, 0, 1, 1, 2], [[0, 1, 3], [0, 1, 4], [0, 2, 5]]),
    ([_] + list(range(19)), [list(range(20))]),
    ([_] + list(range(9)) + [_] + list(range(10, 19)), [list(range(10)), list(range(10, 20))]),
]


@BOTH
@pytest.mark.parametrize("parents,chains", SHAPES, ids=[str(s[0]) for s in SHAPES])
def test_spec_table_shapes(impl, parents, chains):
    rows, report = run(impl, forest(parents))
    assert [r["status"] for r in report] == ["ok"], report
    assert chains_of(rows) == chains
    assert [r["row_id"] for r in rows] == [f"f_s{k}" for k in range(len(chains))]
    assert [r["segment"] for r in rows] == list(range(len(chains)))
    assert {r["num_segments"] for r in rows} == {len(chains)}
    # every call is selected once; its two generated tokens are trained once
    assert report[0]["num_selected"] == len(parents)
    assert report[0]["loss_tokens"] == 2 * len(parents)
    assert report[0]["num_rows"] == len(chains)
    for r, chain in zip(rows, chains):
        assert r["input_ids"] == [t for i in chain for t in (10 * i + 1, 10 * i + 2, 10 * i + 3)]
        assert r["prompt_len"] == 1


@BOTH
def test_spec_table_omitted_parent_is_broken_chain(impl):
    rows, report = run(impl, forest([_, 0, 1], output=[0, 2]))
    assert rows == []
    assert (report[0]["status"], report[0]["reason"]) == ("masked", "broken_chain")
    assert report[0]["detail"] == "parent is not a call selected before it: call c2"


@BOTH
def test_fork_loss_mask_by_hand(impl):
    rows, _report = run(impl, forest([_, 0, 0]))
    assert [r["loss_mask"] for r in rows] == [
        [0, 1, 1, 0, 1, 1],  # s0 = c0 c1: trains both
        [0, 0, 0, 0, 1, 1],  # s1 = c0 c2: c0 already trained in s0
    ]


@BOTH
def test_nested_fork_loss_mask_by_hand(impl):
    rows, report = run(impl, forest([_, 0, 0, 1, 1, 2]))
    assert [r["loss_mask"] for r in rows] == [
        [0, 1, 1, 0, 1, 1, 0, 1, 1],  # s0 = c0 c1 c3
        [0, 0, 0, 0, 0, 0, 0, 1, 1],  # s1 = c0 c1 c4: only c4
        [0, 0, 0, 0, 1, 1, 0, 1, 1],  # s2 = c0 c2 c5: c2 and c5
    ]
    assert report[0]["loss_tokens"] == 12
    # weights and advantage: one rollout in its group -> A = 0; weight 1/3 per row
    assert all(abs(r["weight"] - 1 / 3) < 1e-6 for r in rows)
    assert {r["advantage"] for r in rows} == {0.0}


@BOTH
def test_fork_logprobs_and_prompt_unchanged_on_shared_calls(impl):
    rows, _report = run(impl, forest([_, 0, 0], logprobs=True))
    lp = [0.0, -0.5, -1.0]  # builders.gen_logprobs: carry 0.0, then -0.5, -1.0
    assert [r["logprobs"] for r in rows] == [lp * 2, lp * 2]
    assert [r["prompt_len"] for r in rows] == [1, 1]


@BOTH
@pytest.mark.parametrize("parents,output,detail_id,call", [
    ([_, 0, 1], [0, 2], R.D_PARENT_NOT_SELECTED_BEFORE, "c2"),  # parent not selected
    ([_, 0], [1, 0], R.D_OUT_OF_ORDER, "c0"),  # selection out of capture order fails first (7)
    ([_, 0], [1], R.D_FIRST_NOT_ROOT, "c1"),
    ([_, 5, _], [0, 1], R.D_PARENT_NOT_SELECTED_BEFORE, "c1"),  # parent names no call
])
def test_10f_failures(impl, parents, output, detail_id, call):
    b = forest([p if p is None or p < len(parents) else None for p in parents], output=output)
    if any(p is not None and p >= len(parents) for p in parents):
        b.ledger_row("c1")["parent_id"] = "ghost"
    _rows, report = run(impl, b)
    assert report[0]["reason"] == R.DETAILS[detail_id][0]
    assert report[0]["detail"] == format_detail(detail_id, call_id=call)


@BOTH
def test_10f_parent_selected_later_and_self(impl):
    b = forest([_, _, _])
    b.ledger_row("c1")["parent_id"] = "c2"  # selected, but after c1
    _rows, report = run(impl, b)
    assert report[0]["detail"] == format_detail(R.D_PARENT_NOT_SELECTED_BEFORE, call_id="c1")
    b = forest([_, _, _])
    b.ledger_row("c2")["parent_id"] = "c2"
    _rows, report = run(impl, b)
    assert report[0]["detail"] == format_detail(R.D_PARENT_NOT_SELECTED_BEFORE, call_id="c2")


@BOTH
def test_defect_on_shared_call_reported_in_first_chain(impl):
    """A bad hash on the shared root of a fork masks the rollout, naming that call; a bad call
    on the second branch only is found after the first chain passed."""
    b = forest([_, 0, 0])
    b.ledger_row("c0")["chain_hash"] ^= 1
    _rows, report = run(impl, b)
    assert (report[0]["reason"], report[0]["detail"]) == (
        "hash_mismatch", format_detail(R.D_HASH, call_id="c0"))
    # chains by (root, endpoint): s0 = [0, 2], s1 = [0, 1, 3]. c1 (s1, shared by nobody) and
    # c2 (s0) broken: s0 is checked first, although c1 comes earlier in capture order
    b = forest([_, 0, 0, 1])
    b.drop_tokens("c1")
    b.token_row("c2")["tokens"] = [1]
    _rows, report = run(impl, b)
    assert report[0]["detail"] == format_detail(R.D_LEN_TOKENS, call_id="c2")
    # only s1 broken, on its last call: found after s0 passed
    b = forest([_, 0, 0, 1])
    b.ledger_row("c3")["prev_len"] += 1
    _rows, report = run(impl, b)
    assert report[0]["detail"] == format_detail(R.D_LEN_CHILD_PREV, call_id="c3")


@BOTH
def test_linear_plan_still_masks_forks(impl):
    _rows, report = run(impl, forest([_, 0, 0]), plan="linear")
    assert report[0]["detail"] == format_detail(R.D_PARENT_NOT_PREVIOUS, call_id="c2")


def test_forest_requires_cc_mode():
    with pytest.raises(ValueError, match="forest"):
        Options(mode="ordinary", plan="forest")
    with pytest.raises(ValueError, match="forest"):
        Options.of(Options(plan="forest"), mode="ordinary")
    assert Options(plan="forest").plan == "forest"


def test_cli_forest_with_ordinary_is_a_one_line_usage_error(tmp_path, capsys):
    from chainrows.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["reassemble", str(tmp_path / "ds"), str(tmp_path / "out"), "--plan", "forest",
              "--mode", "ordinary"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "forest" in err
    assert not (tmp_path / "out").exists()


def test_cli_plan_default_and_help():
    from chainrows.cli import _parser

    a = _parser().parse_args(["reassemble", "d", "o"])
    assert a.plan == "linear"
    assert _parser().parse_args(["reassemble", "d", "o", "--plan", "forest"]).plan == "forest"
    sub = next(x for x in _parser()._subparsers._group_actions[0].choices.values()
               if x.prog.endswith("reassemble"))
    assert "default: linear" in sub.format_help()


# --------------------------------------------------------------------------------------------
# Random forests
# --------------------------------------------------------------------------------------------

FOREST_DEFECTS = ("hash", "tokens", "prev_len", "drop_tokens", "lp_carry", "gen_len")


def random_forest(rng: random.Random, rid: str, group, *, logprobs: bool, accepted_col: bool,
                  corrupt: float):
    """One rollout of interleaved workers, forks and nested forks; rejected retries (calls left
    out of the output), omitted ancestors, parents captured later, identical items on sibling
    branches (a key alphabet of 4 in half the rollouts), defects on shared calls, and randomized.py's corruptions."""
    n = rng.randint(1, 8)
    alphabet = rng.choice((4, 1000))  # 4: identical items on sibling branches, ambiguity
    b = RolloutBuilder(rid, group_id=group, reward=rng.choice((0.0, 1.0, 0.5, 0.25)), logprobs=logprobs)
    for i in range(n):
        parent = None if i == 0 or rng.random() < 0.3 else f"c{rng.randrange(i)}"
        keys = [rng.randint(1, alphabet) for _ in range(rng.choice((1, 1, 2, 0)))]
        ids = [rng.choice((None, None, "a", f"{rid}.{i}.{j}")) for j in range(len(keys))]
        b.call(f"c{i}", parent, carry=[rng.randint(0, 9) for _ in range(rng.choice((0, 1, 3)))],
               gen=[rng.randint(0, 9) for _ in range(rng.choice((1, 2, 5)))], items=keys, item_ids=ids)
    calls = [r["call_id"] for r in b.ledger]
    keyed = [c for c in calls if b.ledger_row(c)["item_keys"]]
    out = [c for c in keyed if rng.random() < 0.85]  # the rest: rejected retries / omitted ancestors
    if n > 1 and rng.random() < 0.1:  # a parent captured after its child
        j = rng.randrange(n - 1)
        b.ledger_row(calls[j])["parent_id"] = calls[rng.randrange(j + 1, n)]
    b.output(out, terminal=None if rng.random() < 0.6 else ("last" if out else None),
             ids=rng.random() < 0.7,
             accepted_calls=(out if rng.random() < 0.5 else out[:-1]) if accepted_col and rng.random() < 0.4 else None)
    if accepted_col:
        b.record.setdefault("accepted_response_ids", None)
    if rng.random() < corrupt:
        parents = [r["parent_id"] for r in b.ledger if r["parent_id"]]
        shared = [c for c in calls if parents.count(c) > 1] or calls
        c = rng.choice(shared)
        kind = rng.choice(FOREST_DEFECTS)
        if kind == "hash":
            b.ledger_row(c)["chain_hash"] ^= 1 << rng.randrange(64)
        elif kind == "tokens":
            b.token_row(c)["tokens"] = b.token_row(c)["tokens"] + [1]
        elif kind == "prev_len":
            b.ledger_row(c)["prev_len"] += 1
        elif kind == "drop_tokens":
            b.drop_tokens(c)
        elif kind == "lp_carry" and logprobs:
            b.token_row(c)["logprobs"][0] = -0.25
        elif kind == "gen_len":
            b.ledger_row(c)["gen_len"] = 0
    ledger, tokens, rollouts = b.build()
    if rng.random() < corrupt / 2:
        _corrupt(rng, rng.choice(CORRUPTIONS), ledger, tokens, rollouts, logprobs, accepted_col)
    return ledger, tokens, rollouts


def random_forests(seed: int, n_rollouts: int | None = None, corrupt: float = 0.4):
    rng = random.Random(seed)
    n = n_rollouts if n_rollouts is not None else rng.randint(1, 8)
    logprobs = rng.random() < 0.5
    accepted_col = rng.random() < 0.3
    ledger, tokens, rollouts = [], [], []
    for i in range(n):
        ln, t, r = random_forest(rng, f"r{i}", rng.choice(("g0", "g1", None)), logprobs=logprobs,
                                 accepted_col=accepted_col, corrupt=corrupt)
        ledger += ln
        tokens += t
        rollouts += r
    if accepted_col:
        for r in rollouts:
            r.setdefault("accepted_response_ids", None)
    ledger = _interleave(rng, ledger)
    rng.shuffle(tokens)
    rng.shuffle(rollouts)
    options = dict(
        placeholders=rng.random() < 0.3,
        baseline=rng.choice(("mean", "loo")),
        no_std=rng.random() < 0.3,
        baseline_population=rng.choice(("all", "ok")),
        row_weight=rng.choice(("rollout", "row")),
        logprobs=logprobs,
    )
    return ledger, tokens, rollouts, options


def _check_loss_ownership(ledger, rows, report, options):
    """Every call in an ok rollout's rows: carry tokens loss 0, generated tokens all 1 in exactly
    one row and all 0 in the others; loss_tokens = Σ gen_len of those calls = num_selected calls."""
    by_call = {(c["rollout_id"], c["call_id"]): c for c in ledger}
    for rep in report:
        if rep["status"] != "ok":
            continue
        rid = rep["rollout_id"]
        mine = [r for r in rows if r["rollout_id"] == rid]
        trained = {}
        for r in mine:
            t = 0
            for cid in r["call_ids"]:
                c = by_call[(rid, cid)]
                carry = c["delta_len"] - c["gen_len"]
                assert set(r["loss_mask"][t:t + carry]) <= {0}
                gen = set(r["loss_mask"][t + carry:t + c["delta_len"]])
                assert gen in ({0}, {1}), (rid, cid, r["loss_mask"])
                trained[cid] = trained.get(cid, 0) + (gen == {1})
                t += c["delta_len"]
            assert t == len(r["loss_mask"])
        assert set(trained.values()) == {1}, (rid, trained)
        assert rep["num_selected"] == len(trained)
        assert rep["loss_tokens"] == sum(by_call[(rid, c)]["gen_len"] for c in trained)
        want_w = 1.0 / len(mine) if options.get("row_weight", "rollout") == "rollout" else 1.0
        assert all(abs(r["weight"] - want_w) < 1e-6 for r in mine)
        assert {r["advantage"] for r in mine} == {rep["advantage"]}


def _ok_rollouts_identical(rows_a, report_a, rows_b, report_b, options):
    """Rollouts ok in (rows_a, report_a) have identical report rows and rows in b; returns
    how many there were.

    With baseline_population "ok" the advantage is the one exception: the forest plan keeps
    rollouts the linear plan masks, they join their group's population and move its mean and
    std, so siblings' advantages change (SPEC §3.1's "byte-identical" cannot hold there)."""
    ok = {r["rollout_id"] for r in report_a if r["status"] == "ok"}
    drop = {"advantage"} if options.get("baseline_population") == "ok" else set()

    def keep(table):
        return [{k: v for k, v in r.items() if k not in drop} for r in table if r["rollout_id"] in ok]

    assert keep(report_a) == keep(report_b)
    assert keep(rows_a) == keep(rows_b)
    return len(ok)


@settings(max_examples=examples(2.5), suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_random_forests_engine_matches_reference(seed):
    ledger, tokens, rollouts, options = random_forests(seed)
    rng = random.Random(seed ^ 0x5EED)
    mode = "ordinary" if rng.random() < 0.15 else "cc"
    for plan in (("linear",) if mode == "ordinary" else ("linear", "forest")):
        opts = dict(options, mode=mode, plan=plan)
        want_rows, want_report = reference.reassemble(ledger, tokens, rollouts, **opts)
        got_rows, got_report = engine_reassemble(ledger, tokens, rollouts, **opts)
        compare_outputs(f"seed={seed} options={opts}", got_rows, got_report, want_rows, want_report)
        if plan == "forest":
            _check_loss_ownership(ledger, got_rows, got_report, opts)
        else:
            linear = (got_rows, got_report)
    if mode == "cc":
        _ok_rollouts_identical(*linear, got_rows, got_report, options)


def test_random_forests_reach_the_forest_paths():
    """The generator above does produce forks, interleaving and each 10f failure (else the
    property is weak): forest rows with a shared call, rollouts only the forest plan keeps,
    and every broken_chain detail."""
    shared = kept = 0
    details = set()
    for seed in range(150):
        ledger, tokens, rollouts, options = random_forests(seed)
        rows, report = reference.reassemble(ledger, tokens, rollouts, **dict(options, plan="forest"))
        _rows, linear = reference.reassemble(ledger, tokens, rollouts, **options)
        status = {r["rollout_id"]: r["status"] for r in linear}
        kept += sum(r["status"] == "ok" and status[r["rollout_id"]] == "masked" for r in report)
        shared += sum(0 in r["loss_mask"][r["prompt_len"]:] and r["segment"] > 0 for r in rows)
        details |= {r["detail"].split(":")[0] for r in report if r["reason"] == "broken_chain"}
    assert kept >= 20 and shared >= 20, (kept, shared)
    assert {R.DETAILS[R.D_FIRST_NOT_ROOT][1], R.DETAILS[R.D_PARENT_NOT_SELECTED_BEFORE][1]} <= details


@settings(max_examples=examples(0.25))
@given(seed=st.integers(0, 2**32 - 1))
def test_random_forests_large_batches(seed):
    """Many rollouts per batch: the kernels' parallel chunks and shared scratch slots."""
    ledger, tokens, rollouts, options = random_forests(seed, n_rollouts=80)
    opts = dict(options, plan="forest")
    want_rows, want_report = reference.reassemble(ledger, tokens, rollouts, **opts)
    got_rows, got_report = engine_reassemble(ledger, tokens, rollouts, **opts)
    compare_outputs(f"seed={seed}", got_rows, got_report, want_rows, want_report)


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_linear_accepted_rollouts_identical_under_forest_on_linear_data(seed):
    """randomized.py's inputs (compactions and retries, built for the linear cut): every rollout
    the linear plan accepts comes out identical under the forest plan."""
    from tests.support.randomized import random_dataset

    ledger, tokens, rollouts, options = random_dataset(seed)
    options = dict(options, mode="cc")
    a = engine_reassemble(ledger, tokens, rollouts, **options)
    b = engine_reassemble(ledger, tokens, rollouts, **dict(options, plan="forest"))
    _ok_rollouts_identical(*a, *b, options)


def test_linear_accepted_rollouts_byte_identical_on_synth_data(tmp_path):
    """Arrow tables, not dicts: the rows and report of every rollout the linear plan accepts are
    equal as Arrow data under the forest plan, on a synthetic dataset."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from chainrows import reassemble
    from chainrows.synth import write_synth_dataset

    write_synth_dataset(tmp_path / "ds", 200, seed=3, corrupt_rate=0.2, mean_gen_tokens=40)
    lin = reassemble(str(tmp_path / "ds"))
    fo = reassemble(str(tmp_path / "ds"), plan="forest")
    ok = lin.report.filter(pc.equal(lin.report["status"], "ok"))["rollout_id"]
    assert len(ok) > 50

    def keep(t):
        return t.filter(pc.is_in(t["rollout_id"], value_set=ok)).combine_chunks()

    assert keep(lin.report).equals(keep(fo.report))
    assert keep(lin.rows).equals(keep(fo.rows))
    assert keep(lin.rows).num_rows == lin.rows.num_rows  # only ok rollouts have rows
    assert isinstance(keep(fo.rows), pa.Table)


def test_api_plan_reaches_the_engine():
    """chainrows.reassemble: plan= as a keyword and inside an Options object."""
    from chainrows import reassemble
    from chainrows.formats.native.schema import tables_from_pylists

    tables = tables_from_pylists(*combine(forest([_, 0, 0])), logprobs=False, accepted=False)
    assert reassemble(*tables).report["status"].to_pylist() == ["masked"]
    assert reassemble(*tables, plan="forest").rows.num_rows == 2
    assert reassemble(*tables, Options(plan="forest")).rows.num_rows == 2


def _read_out(path):
    import pyarrow.parquet as pq

    return pq.read_table(path if path.exists() else path.with_suffix("")).to_pylist()


@pytest.mark.parametrize("flags", [[], ["--buckets", "1"], ["--buckets", "3"], ["--steps", "3"]],
                         ids=["auto", "memory", "spill", "stream"])
def test_cli_plan_forest_on_every_path(tmp_path, flags, capsys):
    """--plan forest reaches the engine on the in-memory, spill and streaming paths: each writes
    what chainrows.reassemble(plan="forest") returns for the same tables."""
    import pyarrow.parquet as pq

    from chainrows import reassemble
    from chainrows.cli import main
    from chainrows.formats.native.schema import tables_from_pylists

    ledger, tokens, rollouts, options = random_forests(11, n_rollouts=60, corrupt=0.2)
    tables = tables_from_pylists(ledger, tokens, rollouts, logprobs=options["logprobs"], accepted=False)
    ds = tmp_path / "ds"
    ds.mkdir()
    for name, t in zip(("ledger", "tokens", "rollouts"), tables):
        pq.write_table(t, ds / f"{name}.parquet")
    want = reassemble(*tables, plan="forest")
    assert main(["reassemble", str(ds), str(tmp_path / "out"), "--plan", "forest", *flags]) == 0
    capsys.readouterr()

    def key(r):
        return (r["rollout_id"], r.get("segment", 0))

    got_rows = sorted(_read_out(tmp_path / "out" / "rows"), key=key)
    got_report = sorted(_read_out(tmp_path / "out" / "report.parquet"), key=key)
    assert got_report == sorted(want.report.to_pylist(), key=key)
    assert got_rows == sorted(want.rows.to_pylist(), key=key)
    shared = [r for r in got_rows if r["segment"] > 0 and 0 in r["loss_mask"][r["prompt_len"]:]]
    assert shared, "the dataset has no forest rows with a shared call"


@pytest.mark.slow
@settings(max_examples=examples(1.5))
@given(sizes=st.lists(st.integers(0, 9), min_size=1, max_size=8), seed=st.integers(0, 2**32 - 1))
def test_forest_chains_kernel_matches_its_definition(sizes, seed):
    """forest_chains against the plain-Python definition in its docstring, on raw selections:
    parents anywhere in the rollout (earlier, later, self, MISSING), some calls unselected,
    some rollouts already masked, both passes through run._forest."""
    import numpy as np

    from chainrows.engine.run import _forest

    rng = random.Random(seed)
    R_, off = len(sizes), [0]
    for n in sizes:
        off.append(off[-1] + n)
    parent, sel, sel_len, sel_off = [], [], [], [0]
    for r, n in enumerate(sizes):
        a = off[r]
        for i in range(n):
            x = rng.random()
            parent.append(-1 if i == 0 or x < 0.3 else -2 if x < 0.33 else
                          a + rng.randrange(n) if x < 0.4 else a + rng.randrange(i))
        chosen = [a + i for i in range(n) if rng.random() < 0.85]
        sel += chosen + [-1] * rng.randint(0, 2)  # a slot larger than the selection, as select leaves it
        sel_len.append(len(chosen))
        sel_off.append(len(sel))
    detail = np.array([0 if rng.random() < 0.9 else 99 for _ in range(R_)], dtype=np.int32)
    want_detail = detail.copy()
    want_chains, want_bad = [], [-1] * R_
    for r in range(R_):
        S = sel[sel_off[r]:sel_off[r] + sel_len[r]]
        chains = []
        if want_detail[r] == 0:
            for i, c in enumerate(S):
                if parent[c] != -1 and parent[c] not in S[:i]:
                    want_detail[r] = R.D_FIRST_NOT_ROOT if i == 0 else R.D_PARENT_NOT_SELECTED_BEFORE
                    want_bad[r] = c
                    break
        if want_detail[r] == 0:
            ends = [c for c in S if c not in {parent[x] for x in S}]
            for e in ends:
                ch = [e]
                while parent[ch[-1]] != -1:
                    ch.append(parent[ch[-1]])
                chains.append(ch[::-1])
            chains.sort(key=lambda ch: (ch[0], ch[-1]))
        want_chains.append(chains)
    chunks = np.array(sorted({0, R_, *(rng.randrange(R_ + 1) for _ in range(2))}), dtype=np.int64)
    bad_call = np.full(R_, -1, dtype=np.int64)
    n_chains = np.zeros(R_, dtype=np.int64)
    out_off, out, out_len, flags = _forest(chunks, detail, bad_call, np.array(sel_off, dtype=np.int64),
                                           np.array(sel, dtype=np.int64), np.array(sel_len, dtype=np.int64),
                                           np.array(parent, dtype=np.int64), n_chains)
    assert detail.tolist() == want_detail.tolist()
    assert bad_call.tolist() == want_bad
    for r in range(R_):
        seg, fl = out[out_off[r]:out_off[r + 1]].tolist(), flags[out_off[r]:out_off[r + 1]].tolist()
        chains = want_chains[r]
        assert n_chains[r] == len(chains) and out_len[r] == len(seg)
        assert seg == [c for ch in chains for c in ch]
        seen, want_flags = set(), []
        for ch in chains:
            for j, c in enumerate(ch):
                want_flags.append((1 if j == 0 else 0) | (2 if c in seen else 0))
            seen |= set(ch)
        assert fl == want_flags
