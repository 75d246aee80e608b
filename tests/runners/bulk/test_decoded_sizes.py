"""What a read holds in memory, estimated from the Parquet footers before any data is read.

Parquet's dictionary and run-length encodings store some columns far below their decoded size
(token ids of a small vocabulary: about 8x less), so every size that plans memory (the route,
spill buckets, the reader's batches, small-file groups, Ray's tasks) is the decoded estimate,
never the stored bytes; the summary shows both."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from chainrows.formats.native import dataset as dsmod
from chainrows.formats.native import footers
from chainrows.formats.native.dataset import TABLES, footer_totals, plan_table
from chainrows.memory.budget import MIN_ROOM
from chainrows.options import Options
from chainrows.runners import bulk
from chainrows.runners.bulk import plan as planner
from chainrows.synth import write_synth_dataset

SMALL_VOCAB = dict(vocab=16, logprobs=False, mean_gen_tokens=200, mean_obs_tokens=400, prompt_tokens=1500)


def _columns(n: int, rng) -> pa.Table:
    """A column of every kind chainrows reads or a capture carries, several of them stored far
    below their decoded size."""
    lengths = rng.integers(0, 300, n)
    ids = [f"rollout-{i // 8:06d}" for i in range(n)]  # repeated: dictionary-encoded
    return pa.table({
        "tokens": pa.array([rng.integers(0, 16, k).astype(np.int32) for k in lengths], pa.list_(pa.int32())),
        "logprobs": pa.array([rng.standard_normal(k).astype(np.float32) for k in lengths], pa.list_(pa.float32())),
        "rollout_id": ids,
        "call_id": [f"c{i:07d}" for i in range(n)],
        "failed": pa.array(rng.random(n) < 0.1),
        "reward": pa.array([None if i % 7 == 0 else float(i % 3) for i in range(n)], pa.float64()),
        "step": pa.array(np.repeat(np.arange(n // 100 + 1), 100)[:n].astype(np.int64)),  # runs: RLE
        "digest": pa.array([bytes([i % 256]) * 16 for i in range(n)], pa.binary(16)),
        "item_ids": pa.array([[f"item-{j:05d}" for j in range(i % 5)] for i in range(n)]),
        "error": pa.array([None] * n, pa.string()),  # all null: no statistics, an offset each
        "detail": [None if i % 10 else f"detail of call {i} " * 4 for i in range(n)],  # mostly null
        "group_id": ["" if i % 50 == 0 else f"group-{i // 40:08d}" for i in range(n)],  # "" is the min
        "nested": pa.array([[[i, i]] * (i % 3) for i in range(n)], pa.list_(pa.list_(pa.int64()))),
    })


def test_the_decoded_estimate_is_near_what_pyarrow_decodes(tmp_path):
    table = _columns(3000, np.random.default_rng(0))
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=700)
    facts = footers.facts_of(pa.OSFile(str(path)))
    decoded = pq.read_table(path)
    assert facts.column_decoded is not None and list(facts.column_decoded) == table.column_names
    for name in table.column_names:
        actual, estimate = decoded[name].nbytes, facts.column_decoded[name]
        assert estimate >= 0.9 * actual, (name, estimate, actual)
        # a bitmap pyarrow leaves out when a chunk has no nulls is counted: a few bytes
        assert estimate <= 1.25 * actual or estimate - actual < 1024, (name, estimate, actual)
    # what the estimate exists for: stored far below what a read holds
    for name in ("tokens", "rollout_id", "step"):
        assert facts.column_stored[name] * 3 < decoded[name].nbytes, name
    assert facts.decoded_bytes == sum(facts.column_decoded.values())
    assert facts.decoded_of(["tokens", "absent"]) == facts.column_decoded["tokens"]


def test_strings_without_statistics_count_at_least_their_stored_bytes(tmp_path):
    table = _columns(500, np.random.default_rng(1)).select(["rollout_id", "call_id"])
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, write_statistics=False)
    facts = footers.facts_of(pa.OSFile(str(path)))
    for name in table.column_names:
        assert facts.column_decoded[name] >= facts.column_stored[name] > 0, name  # strings: at least stored
    # unique strings are stored plainly: the fallback is then about right
    assert facts.column_decoded["call_id"] >= 0.9 * pq.read_table(path)["call_id"].nbytes


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "data"
    write_synth_dataset(path, 300, seed=2, **SMALL_VOCAB)
    return path


def test_a_small_vocabulary_decodes_to_several_times_its_stored_bytes(small_vocab):
    tokens = footer_totals(small_vocab, "tokens")
    assert tokens.decoded > 5 * tokens.stored
    actual = dsmod.read_table(small_vocab, "tokens").nbytes
    assert 0.9 * actual <= tokens.decoded <= 1.2 * actual
    # the reader's batches are sized by what they decode
    plan = plan_table(small_vocab, "tokens")
    by_stored = dsmod.READ_BATCH_BYTES * plan.facts[0].num_rows // plan.read_stored(0)
    assert 1024 < dsmod._read_batch_rows(plan, 0) < by_stored < dsmod.DEFAULT_BATCH_ROWS


def test_the_route_is_chosen_by_the_decoded_bytes(small_vocab, tmp_path, monkeypatch):
    """A budget whose room holds the in-memory path's estimate for the stored bytes, but not
    for the decoded ones (the estimate once used the stored bytes: a 600 MiB budget then peaked
    at 970 MB on such data), does not read everything at once; the summary shows both sizes."""
    sizes = planner.input_totals(small_vocab)
    stored = sum(t.stored for t in sizes.values())
    decoded = sum(t.decoded for t in sizes.values())
    room = MIN_ROOM + (64 << 20)  # above the floor, whatever this process's baseline does next
    # the data is small; the rule is the point: the stored bytes' estimate is half the room's share
    monkeypatch.setattr(planner, "MEMORY_FIXED", 0)
    monkeypatch.setattr(planner, "MEMORY_FACTOR", planner.SHARE * room / (2 * stored))
    monkeypatch.setattr(planner, "STREAM_MIN_ROOM", 0)
    assert planner.fits_in_memory(stored, room) and not planner.fits_in_memory(decoded, room)
    baseline = planner.measure_footprint(Options(), False).baseline
    summary = bulk.run(small_vocab, tmp_path / "out", memory_budget=baseline + room)
    assert summary.path != "memory", summary.format()
    assert (summary.input_bytes, summary.decoded_bytes) == (stored, decoded)
    line = next(x for x in summary.format().splitlines() if x.startswith("input"))
    assert line.endswith(" decoded") and line.count("B") == 2
    assert summary.rollouts == 300


def test_every_tables_estimate_is_near_what_a_read_holds(small_vocab):
    for name in TABLES:
        t = footer_totals(small_vocab, name)
        table = dsmod.read_table(small_vocab, name)
        assert t.rows == table.num_rows > 0
        assert 0.95 * table.nbytes <= t.decoded <= 1.3 * table.nbytes, (name, t.decoded, table.nbytes)
