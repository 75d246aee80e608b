"""``chainrows pack OUT PACKED``: one directory of Parquet parts per rank holding exactly the
batches ``iter_packed`` gives that rank, every row once over the ranks; a summary with the fill;
bad input exits 2 with one line and nothing written."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest

from chainrows.batches import iter_packed
from chainrows.cli import main
from tests.support.rows import agent_lengths, rows_table


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """A reassemble-shaped output directory: OUT/rows/ of two parts."""
    root = tmp_path_factory.mktemp("pack") / "out"
    (root / "rows").mkdir(parents=True)
    lengths = agent_lengths(400, 11, median=300, longest=3000)
    pq.write_table(rows_table(lengths[:250], 1), root / "rows" / "part-0.parquet", row_group_size=60)
    pq.write_table(rows_table(lengths[250:], 2, start=1000), root / "rows" / "part-1.parquet", row_group_size=60)
    return root


def test_each_rank_gets_its_batches_and_every_row_once(out, tmp_path, capsys):
    packed = tmp_path / "packed"
    assert main(["pack", str(out), str(packed), "--max-tokens", "4096", "--world-size", "3",
                 "--seed", "2", "--window", "150"]) == 0
    summary = capsys.readouterr().out
    fill = float(summary.split("fill", 1)[1].split("%")[0])
    assert "batches" in summary and 80 <= fill <= 100
    rows = pq.read_table(out / "rows")
    seen = Counter()
    counts = set()
    for rank in range(3):
        t = pq.read_table(packed / f"rank-{rank:05d}")
        expected = list(iter_packed(out, max_tokens=4096, world_size=3, rank=rank, seed=2, window=150))
        counts.add(t.num_rows)
        assert t["step"].to_pylist() == list(range(t.num_rows))
        for got, want in zip(t.to_pylist(), expected):
            assert got["row_ids"] == want["row_ids"] and got["rollout_ids"] == want["rollout_ids"]
            assert got["input_ids"] == want["input_ids"].tolist()
            assert got["cu_seqlens"] == want["cu_seqlens"].tolist()
            assert got["position_ids"] == want["position_ids"].tolist()
            assert got["loss_mask"] == want["loss_mask"].astype(np.uint8).tolist()
            assert got["advantages"] == pytest.approx(want["advantages"].tolist(), abs=0)
            seen.update(got["row_ids"])
        assert len(expected) == t.num_rows
    assert len(counts) == 1 and seen == Counter(rows["row_id"].to_pylist())
    per_rank = pq.read_table(packed / "packing.parquet").to_pydict()
    assert per_rank["rank"] == [0, 1, 2] and sum(per_rank["tokens"]) == sum(
        len(x) for x in rows["input_ids"].to_pylist())
    assert main(["pack", str(out), str(packed), "--max-tokens", "4096"]) == 2  # refuses to overwrite
    assert "--overwrite" in capsys.readouterr().err


def test_a_long_row_exits_2_with_nothing_written_or_is_dropped(out, tmp_path, capsys):
    packed = tmp_path / "packed"
    assert main(["pack", str(out), str(packed), "--max-tokens", "1000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "longer than max_tokens=1,000, the longest" in err[0] and "--drop-long-rows" in err[0]
    assert not packed.exists()
    assert main(["pack", str(out), str(packed), "--max-tokens", "1000", "--drop-long-rows", "--pad-to-max"]) == 0
    text = capsys.readouterr().out
    dropped = int(text.split("dropped (long)", 1)[1].split("rows")[0].replace(",", ""))
    lengths = [len(x) for x in pq.read_table(out / "rows", columns=["input_ids"])["input_ids"].to_pylist()]
    assert dropped == sum(n > 1000 for n in lengths) > 0
    share = sum(n for n in lengths if n > 1000) / sum(lengths)
    assert ("warning: --drop-long-rows dropped" in text) == (share >= 0.05)
    t = pq.read_table(packed / "rank-00000")
    assert {len(x) for x in t["input_ids"].to_pylist()} == {1000}


def test_a_dataset_instead_of_an_output_says_so(tmp_path, capsys):
    assert main(["synth", str(tmp_path / "data"), "--rollouts", "5", "--seed", "1"]) == 0
    capsys.readouterr()
    assert main(["pack", str(tmp_path / "data"), str(tmp_path / "packed"), "--max-tokens", "4096"]) == 2
    err = capsys.readouterr().err
    assert "is not the rows of a reassemble output" in err and err.count("\n") == 1


def test_no_rows_table_exits_2(tmp_path, capsys):
    assert main(["pack", str(tmp_path / "missing"), str(tmp_path / "packed"), "--max-tokens", "10"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "packed").exists()
