"""chainrows.batches: padded numpy batches from real rows (synth -> reassemble -> Parquet)."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import chainrows
from chainrows.batches import collate, iter_batches, plan_batches, split_prompt_response
from chainrows.synth import write_synth_dataset

SYNTH = dict(mean_gen_tokens=30, mean_obs_tokens=20, prompt_tokens=50, compaction_rate=0.5,
             corrupt_rate=0.1)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """40 synthetic rollouts reassembled; rows as one file (row groups of 8) and as a directory."""
    root = tmp_path_factory.mktemp("batches")
    write_synth_dataset(root / "ds", 40, seed=3, **SYNTH)
    rows, report = chainrows.reassemble(str(root / "ds"))
    assert rows.num_rows >= 30 and 3 in set(rows.column("num_segments").to_pylist())
    pq.write_table(rows, root / "rows.parquet", row_group_size=8)
    (root / "rowsdir").mkdir()
    pq.write_table(rows.slice(0, 25), root / "rowsdir" / "part-0.parquet", row_group_size=10)
    pq.write_table(rows.slice(25), root / "rowsdir" / "part-1.parquet", row_group_size=10)
    pq.write_table(rows.slice(0, 3), root / "rowsdir" / "_ignored.parquet")
    return dict(root=root, ds=root / "ds", rows=rows, report=report,
                by_id={r["row_id"]: r for r in rows.to_pylist()})


def _all(path, **kw):
    kw.setdefault("max_tokens", 4096)
    return list(iter_batches(path, **kw))


def test_shapes_dtypes_and_padding(data):
    batches = _all(data["root"] / "rows.parquet", pad_id=-7, window=16)
    assert batches
    for b in batches:
        n, t = b.input_ids.shape
        assert n == len(b.row_ids) == len(b.rollout_ids) >= 1
        for name, dtype in (("input_ids", np.int64), ("attention_mask", np.int64),
                            ("loss_mask", np.float32), ("old_logprobs", np.float32),
                            ("advantages", np.float32)):
            a = getattr(b, name)
            assert a.shape == (n, t) and a.dtype == dtype, name
            assert a.flags.c_contiguous and a.dtype.isnative, name
        for name, dtype in (("advantage", np.float32), ("weights", np.float32),
                            ("lengths", np.int64), ("prompt_lens", np.int64)):
            a = getattr(b, name)
            assert a.shape == (n,) and a.dtype == dtype and a.flags.c_contiguous, name
        assert t == b.lengths.max()
        for i, rid in enumerate(b.row_ids):
            row = data["by_id"][rid]
            k = len(row["input_ids"])
            assert b.lengths[i] == k and b.rollout_ids[i] == row["rollout_id"]
            assert b.input_ids[i, :k].tolist() == row["input_ids"]
            assert (b.input_ids[i, k:] == -7).all()
            assert b.attention_mask[i, :k].all() and not b.attention_mask[i, k:].any()
            assert b.loss_mask[i, :k].tolist() == row["loss_mask"]
            assert not b.loss_mask[i, k:].any()
            assert b.old_logprobs[i, :k].tolist() == pytest.approx(row["logprobs"], abs=0)
            assert not b.old_logprobs[i, k:].any()
            expected_adv = np.float32(row["advantage"]) * np.array(row["loss_mask"], np.float32)
            assert b.advantages[i, :k].tolist() == expected_adv.tolist()
            assert not b.advantages[i, k:].any()
            assert b.weights[i] == np.float32(row["weight"])
            assert b.prompt_lens[i] == row["prompt_len"]


def test_torch_takes_the_arrays_as_they_are(data):
    torch = pytest.importorskip("torch")
    b = _all(data["root"] / "rows.parquet")[0]
    for name, a in b.as_dict().items():
        t = torch.from_numpy(a)
        assert t.shape == a.shape and t.data_ptr() == a.ctypes.data, name  # no copy


@pytest.mark.parametrize("source", ["rows.parquet", "rowsdir"])
@pytest.mark.parametrize("kw", [dict(max_tokens=3000), dict(batch_size=5),
                                dict(max_tokens=2000, batch_size=4, shuffle=False),
                                dict(batch_size=7, window=1), dict(max_tokens=10**9, window=10**6)])
def test_every_row_exactly_once(data, source, kw):
    kw.setdefault("max_tokens", None)
    seen = Counter(r for b in iter_batches(data["root"] / source, **kw) for r in b.row_ids)
    assert seen == Counter(data["rows"].column("row_id").to_pylist())  # _ignored.parquet skipped


def test_limits_and_pad_to_multiple(data):
    lengths = {rid: len(r["input_ids"]) for rid, r in data["by_id"].items()}
    for b in _all(data["root"] / "rows.parquet", max_tokens=2500, batch_size=6, pad_to_multiple=8):
        assert len(b) <= 6
        assert b.padded_tokens <= 2500 or len(b) == 1
        longest = max(lengths[r] for r in b.row_ids)
        assert b.input_ids.shape[1] % 8 == 0 and 0 <= b.input_ids.shape[1] - longest < 8
    # A row longer than max_tokens gets a batch of its own, untruncated.
    longest_row = max(lengths.values())
    alone = [b for b in _all(data["root"] / "rows.parquet", max_tokens=longest_row - 1)
             if longest_row in b.lengths]
    assert len(alone) == 1 and len(alone[0]) == 1 and alone[0].input_ids.shape[1] == longest_row


def test_plan_batches_greedy_under_the_token_budget():
    lengths = np.array([1, 2, 3, 3, 10, 11, 40])
    plans = [p.tolist() for p in plan_batches(lengths, max_tokens=24, batch_size=None)]
    # [1,2,3,3]: 4*3=12; +10 -> 5*10=50 > 24; [10,11]: 22; +40 -> 120; [40] alone (40 > 24)
    assert plans == [[0, 1, 2, 3], [4, 5], [6]]
    assert [p.tolist() for p in plan_batches(lengths, None, 3)] == [[0, 1, 2], [3, 4, 5], [6]]


def test_bucketing_wastes_less_padding(data):
    path = data["root"] / "rows.parquet"
    bucketed = _all(path, max_tokens=None, batch_size=6, window=10**6, seed=5)

    def pad(bs):
        return sum(b.padded_tokens - b.num_tokens for b in bs)

    lengths = np.array([len(r["input_ids"]) for r in data["by_id"].values()])

    def chunk_padding(ls):
        return sum(len(c) * c.max() - c.sum() for c in np.array_split(ls, range(6, len(ls), 6)))

    # One window: the padding of the sorted lengths cut in sixes, the least batches of 6 can have.
    assert pad(bucketed) == chunk_padding(np.sort(lengths))
    random_padding = np.mean([chunk_padding(np.random.default_rng(s).permutation(lengths))
                              for s in range(20)])
    assert pad(bucketed) < 0.5 * random_padding
    # Without shuffling, the batches of a window come in length order and do not overlap.
    ordered = _all(path, max_tokens=None, batch_size=6, window=10**6, shuffle=False)
    for a, b in zip(ordered, ordered[1:]):
        assert a.lengths.max() <= b.lengths.min()


def test_order_is_deterministic_given_a_seed(data):
    path = data["root"] / "rowsdir"

    def order(seed):
        return [r for b in iter_batches(path, max_tokens=3000, seed=seed, window=12) for r in b.row_ids]

    assert order(1) == order(1)
    assert order(1) != order(2)
    assert sorted(order(1)) == sorted(order(2))


def _pg_loss_terms(b, new_logprobs):
    """Masked, weighted policy-gradient loss terms of one batch (numpy, what a trainer does).

    Per token: -A * exp(new - old); per row: the mean over its loss tokens; the batch's share:
    sum(weight * row_loss). Dividing the sum over all batches by the number of rollouts gives a
    loss in which every rollout counts once, however many rows it was split into.
    """
    mask = b.loss_mask.astype(bool)
    ratio = np.exp(np.where(mask, new_logprobs - b.old_logprobs, 0.0))
    tok = np.where(mask, -b.advantages * ratio, 0.0)
    per_row = tok.sum(axis=1) / np.maximum(mask.sum(axis=1), 1)
    return float((b.weights * per_row).sum()), float(b.weights.sum())


def _new_logprobs(b, scale=0.01):
    """A policy that moved: new = old + scale * position (a function of the row, not the batch)."""
    return b.old_logprobs + scale * np.arange(b.input_ids.shape[1], dtype=np.float32)[None, :]


def test_masked_weighted_pg_loss_excludes_masked_tokens(data):
    batches = _all(data["root"] / "rows.parquet", max_tokens=3000, window=16)
    total = sum(_pg_loss_terms(b, _new_logprobs(b))[0] for b in batches)
    # The same loss from the Arrow rows directly, one row at a time.
    expected = 0.0
    for row in data["by_id"].values():
        m = np.array(row["loss_mask"], bool)
        pos = np.arange(len(m))[m]
        expected += row["weight"] * np.mean(-row["advantage"] * np.exp(0.01 * pos.astype(np.float32)))
    assert total == pytest.approx(expected, rel=1e-5)
    # Garbage on carry tokens and padding changes nothing; one loss token changes the loss.
    rng = np.random.default_rng(0)
    garbage = 0.0
    for b in batches:
        new = _new_logprobs(b)
        new = np.where(b.loss_mask.astype(bool), new, rng.normal(0, 50, new.shape)).astype(np.float32)
        garbage += _pg_loss_terms(b, new)[0]
    assert garbage == pytest.approx(total, rel=1e-6)
    b = next(b for b in batches if abs(b.advantage).max() > 0.1)
    i = int(np.argmax(np.abs(b.advantage)))
    j = int(np.flatnonzero(b.loss_mask[i])[0])
    new = _new_logprobs(b)
    new[i, j] += 1.0
    assert _pg_loss_terms(b, new)[0] != pytest.approx(_pg_loss_terms(b, _new_logprobs(b))[0])


def test_each_rollout_counts_once(data):
    weight_of = defaultdict(float)
    for b in _all(data["root"] / "rowsdir", max_tokens=3000):
        for rollout, w in zip(b.rollout_ids, b.weights):
            weight_of[rollout] += float(w)
    ok = [r["rollout_id"] for r in data["report"].to_pylist() if r["status"] == "ok"]
    assert sorted(weight_of) == sorted(ok)
    assert all(w == pytest.approx(1.0) for w in weight_of.values())


def _rollout_split_in_three(rows: pa.Table) -> list[dict]:
    split = [r for r in rows.to_pylist() if r["num_segments"] == 3]
    rollout = split[0]["rollout_id"]
    return sorted((r for r in split if r["rollout_id"] == rollout), key=lambda r: r["segment"])


def _unsplit(parts: list[dict]) -> dict:
    row = dict(parts[0], row_id=parts[0]["rollout_id"] + "_s0", segment=0, num_segments=1,
               weight=1.0, call_ids=sum((p["call_ids"] for p in parts), []))
    for col in ("input_ids", "loss_mask", "logprobs"):
        row[col] = sum((p[col] for p in parts), [])
    return row


def test_a_rollout_split_in_three_weighs_what_an_unsplit_one_does(data, tmp_path):
    """3 rows of weight 1/3 give the loss one unsplit row of weight 1 gives (same tokens)."""
    parts = _rollout_split_in_three(data["rows"])
    assert [p["weight"] for p in parts] == pytest.approx([1 / 3] * 3)
    assert parts[0]["advantage"] != 0
    schema = data["rows"].schema
    pq.write_table(pa.Table.from_pylist(parts, schema=schema), tmp_path / "split.parquet")
    pq.write_table(pa.Table.from_pylist([_unsplit(parts)], schema=schema), tmp_path / "whole.parquet")

    def loss(name, shift=0.3):
        terms = [_pg_loss_terms(b, b.old_logprobs + shift)
                 for b in iter_batches(tmp_path / name, batch_size=2)]
        return sum(t[0] for t in terms), sum(t[1] for t in terms)

    split_loss, split_w = loss("split.parquet")
    whole_loss, whole_w = loss("whole.parquet")
    assert split_w == pytest.approx(1.0) and whole_w == pytest.approx(1.0)
    assert split_loss == pytest.approx(whole_loss, rel=1e-6)
    assert whole_loss == pytest.approx(-parts[0]["advantage"] * np.exp(0.3), rel=1e-6)

    # With --row-weight row the split rollout would count three times.
    rows_w1, _ = chainrows.reassemble(str(data["ds"]), row_weight="row")
    heavy = _rollout_split_in_three(rows_w1)
    assert [r["row_id"] for r in heavy] == [p["row_id"] for p in parts]
    pq.write_table(pa.Table.from_pylist(heavy, schema=schema), tmp_path / "heavy.parquet")
    assert loss("heavy.parquet")[0] == pytest.approx(3 * whole_loss, rel=1e-6)


def test_split_prompt_response_rebuilds_every_row(data):
    for b in _all(data["root"] / "rows.parquet", max_tokens=3000, pad_id=-1):
        s = split_prompt_response(b, pad_id=-1)
        p_width = s["prompts"].shape[1]
        assert p_width == b.prompt_lens.max()
        for i, rid in enumerate(b.row_ids):
            row = data["by_id"][rid]
            plen, k = row["prompt_len"], len(row["input_ids"])
            assert s["prompt_mask"][i].tolist() == [0] * (p_width - plen) + [1] * plen  # left pad
            prompt = s["prompts"][i][s["prompt_mask"][i] == 1].tolist()
            resp_on = s["response_attention_mask"][i] == 1
            assert resp_on.tolist()[: k - plen] == [True] * (k - plen) and not resp_on[k - plen:].any()
            assert prompt + s["responses"][i][resp_on].tolist() == row["input_ids"]
            assert s["response_mask"][i][resp_on].tolist() == row["loss_mask"][plen:]
            assert s["old_logprobs"][i][resp_on].tolist() == pytest.approx(row["logprobs"][plen:], abs=0)
            assert (s["advantages"][i] == s["response_mask"][i] * b.advantage[i]).all()
            assert sum(row["loss_mask"][:plen]) == 0  # nothing trained is lost in the prompt


def test_placeholders_weigh_nothing(data, tmp_path):
    rows, report = chainrows.reassemble(str(data["ds"]), placeholders=True)
    masked = {r["rollout_id"] for r in report.to_pylist() if r["status"] == "masked"}
    assert masked
    pq.write_table(rows, tmp_path / "rows.parquet")
    seen = set()
    for b in iter_batches(tmp_path / "rows.parquet", max_tokens=4096):
        assert np.isfinite(b.advantages).all() and np.isfinite(b.advantage).all()
        for i, rollout in enumerate(b.rollout_ids):
            if rollout in masked:
                seen.add(rollout)
                assert b.weights[i] == 0 and not b.loss_mask[i].any() and not b.advantages[i].any()
    assert seen == masked


def test_rows_without_logprobs(tmp_path):
    write_synth_dataset(tmp_path / "ds", 8, seed=1, logprobs=False, **SYNTH)
    rows, _ = chainrows.reassemble(str(tmp_path / "ds"))
    assert "logprobs" not in rows.column_names
    pq.write_table(rows, tmp_path / "rows.parquet")
    bs = list(iter_batches(tmp_path / "rows.parquet", batch_size=4))
    assert sum(len(b) for b in bs) == rows.num_rows
    assert all(b.old_logprobs is None and "old_logprobs" not in b.as_dict() for b in bs)
    # collate on an Arrow table directly, in the table's order
    b = collate(rows.slice(0, 3))
    assert b.row_ids == rows.column("row_id").to_pylist()[:3]


def test_bad_arguments(data, tmp_path):
    path = data["root"] / "rows.parquet"
    with pytest.raises(ValueError, match="max_tokens or batch_size"):
        next(iter_batches(path))
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        next(iter_batches(path, batch_size=0))
    with pytest.raises(FileNotFoundError):
        next(iter_batches(tmp_path / "nope.parquet", batch_size=2))


@pytest.mark.slow
def test_public_attribute_is_lazy_and_needs_no_numba():
    import subprocess
    import sys

    code = ("import sys, chainrows; assert 'pyarrow' not in sys.modules and 'numba' not in sys.modules; "
            "b = chainrows.batches; assert b.iter_batches and 'numba' not in sys.modules; "
            "assert 'batches' in chainrows.__all__; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
