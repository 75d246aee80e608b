"""``chainrows inspect``: a self-contained page that says what the output holds, drawn in a real
browser (headless Chromium) for the slow tier."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import numpy as np
import pyarrow.parquet as pq
import pytest

from chainrows.cli import main
from chainrows.inspection.facts import sample
from tests.explanation import browser


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("inspect")
    data, out, page = root / "data", root / "out", root / "report.html"
    assert main(["synth", str(data), "--rollouts", "300", "--seed", "5", "--corrupt-rate", "0.3"]) == 0
    assert main(["reassemble", str(data), str(out), "--no-progress"]) == 0
    assert main(["inspect", str(out), "--data", str(data), "--html", str(page), "--sample", "10"]) == 0
    return data, out, page


class _Calls(HTMLParser):
    """Per drawn rollout (data-rollout-id), the number of ``<g class="call">`` nodes."""

    def __init__(self):
        super().__init__()
        self.current, self.calls = None, {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "data-rollout-id" in a:
            self.current = a["data-rollout-id"]
            self.calls[self.current] = 0
        if tag == "g" and a.get("class") == "call":
            self.calls[self.current] += 1


def _check_page(text: str, out) -> dict:
    report = pq.read_table(out / "report.parquet").to_pylist()
    by_id = {r["rollout_id"]: r for r in report}
    for reason in {r["reason"] for r in report if r["reason"]}:
        assert reason in text, reason
    parser = _Calls()
    parser.feed(text)
    assert parser.calls, "no rollout drawn"
    for rid, n in parser.calls.items():
        assert n == by_id[rid]["num_calls"], rid
    return parser.calls


def test_the_page_holds_every_reason_and_one_node_per_call(made):
    data, out, page = made
    text = page.read_text()
    drawn = _check_page(text, out)
    report = pq.read_table(out / "report.parquet").to_pylist()
    masked = [r for r in report if r["status"] == "masked"]
    assert sum(1 for rid in drawn if rid in {r["rollout_id"] for r in masked}) == min(10, len(masked))
    assert not re.search(r"(src|href)=\"?(https?:)?//", text), "the page must load nothing"
    assert '<div id="provenance">' in text and "option mode" in text
    assert page.stat().st_size < 5 << 20


def test_the_sample_is_deterministic_and_takes_every_key_first():
    ids = [f"r{i}" for i in range(50)]
    keys = ["a"] * 40 + ["b"] * 9 + ["c"]
    got = sample(ids, keys, 5)
    assert got == sample(list(reversed(ids)), list(reversed(keys)), 5)
    assert {"r49"} <= set(got) and {k for i, k in zip(ids, keys) if i in got} == {"a", "b", "c"}


def test_an_existing_file_is_kept_without_overwrite(made, capsys):
    data, out, page = made
    before = page.read_bytes()
    assert main(["inspect", str(out), "--html", str(page)]) == 2
    assert "--overwrite" in capsys.readouterr().err and page.read_bytes() == before


def test_not_an_output_exits_2(tmp_path, capsys):
    assert main(["inspect", str(tmp_path), "--html", str(tmp_path / "x.html")]) == 2
    assert "no report" in capsys.readouterr().err and not (tmp_path / "x.html").exists()


@pytest.mark.slow
def test_a_real_browser_renders_the_page(made, tmp_path):
    from PIL import Image

    data, out, page = made
    dom = browser.rendered_dom(page, tmp_path / "profile")
    _check_page(dom, out)
    png = browser.screenshot(page, tmp_path / "profile", tmp_path / "page.png")
    pixels = np.asarray(Image.open(png).convert("L"), dtype=np.float64)
    assert pixels.std() > 10 and len(np.unique(pixels)) > 20, "the screenshot is blank"


def test_data_other_than_the_outputs_input_exits_2(made, tmp_path, capsys):
    data, out, page = made
    other = tmp_path / "other"
    assert main(["synth", str(other), "--rollouts", "20", "--seed", "9"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(out), "--data", str(other), "--html", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert "is not the dataset" in err and err.count("\n") == 1 and not (tmp_path / "x.html").exists()


def test_a_dataset_where_the_output_belongs_exits_2_saying_so(made, tmp_path, capsys):
    data, out, page = made
    assert main(["inspect", str(data), "--html", str(tmp_path / "x.html")]) == 2
    assert "this is a dataset, not a reassemble output" in capsys.readouterr().err
    assert main(["explain", str(out), "r00000001"]) == 2
    assert "this is a reassemble output, not a dataset" in capsys.readouterr().err
