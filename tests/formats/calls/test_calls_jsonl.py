"""The call log's JSON Lines reader: the kernel path (chainrows.formats.json_arrays) gives
exactly what the exact reader (json.loads of every line) gives, value for value and error for
error, on random lines with tricky numbers, formatting and defects."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chainrows.errors import InputError
from chainrows.formats.calls import jsonl as CJ
from tests.support.json_numbers import float_literals
from tests.support.profiles import examples

PATH = Path("calls.jsonl")


def _outcome(fn):
    try:
        return "ok", fn()
    except InputError as exc:
        return "error", str(exc)


def _both(lines: list) -> tuple:
    numbers = list(range(1, len(lines) + 1))
    fast = _outcome(lambda: CJ.fast_batch(numbers, lines, PATH, 0))
    exact = _outcome(lambda: CJ.exact_batch(numbers, lines, PATH, 0))
    return fast, exact


def _same(fast, exact) -> None:
    assert fast[0] == exact[0], (fast, exact)
    if fast[0] == "error":
        assert fast[1] == exact[1]
        return
    a, b = fast[1], exact[1]
    assert a.schema == b.schema
    for name in a.schema.names:
        x, y = a.column(name), b.column(name)
        if name == "completion_logprobs":  # bit for bit: signs of zero, NaN
            assert x.is_valid().equals(y.is_valid())
            assert x.offsets.equals(y.offsets)
            assert x.values.to_numpy().view(np.uint32).tolist() == y.values.to_numpy().view(np.uint32).tolist()
        else:
            assert x.equals(y), name


@pytest.mark.parametrize("seed", range(3))
def test_every_float_literal_rounds_as_the_exact_reader(seed):
    rng = random.Random(seed)
    lits = float_literals(rng, 3000, integers=True)
    lines = []
    for i in range(0, len(lits), 300):
        part = lits[i:i + 300]
        lines.append(('{"rollout_id": "r", "call_id": "c%d", "prompt_ids": [], "completion_ids": [%s], '
                      '"completion_logprobs": [%s], "output_items": []}\n'
                      % (i, ", ".join(["1"] * len(part)), ", ".join(part))).encode())
    before = sum(CJ.FALLBACKS.values())
    _same(*_both(lines))
    assert sum(CJ.FALLBACKS.values()) == before  # every line read by the kernel


def test_integers_at_the_int32_limits_and_minus_zero():
    good = b'{"rollout_id": "r", "call_id": "c", "prompt_ids": [-0, 0, 2147483647, -2147483648], ' \
           b'"completion_ids": [7], "output_items": null}\n'
    fast, exact = _both([good])
    _same(fast, exact)
    assert fast[1].column("prompt_ids").to_pylist() == [[0, 0, 2**31 - 1, -2**31]]
    for bad in (b"2147483648", b"-2147483649", b"99999999999999999999"):
        fast, exact = _both([good.replace(b"2147483647", bad)])
        _same(fast, exact)
        assert fast[0] == "error" and "prompt_ids" in fast[1]


# ----------------------------------------------------------------------------- random lines

ITEMS = [[], None, [{"type": "message", "role": "assistant", "id": "m1", "content": [
    {"type": "output_text", "text": "see \"prompt_ids\": [1, 2] and \\u00e9 {[}]"}]}],
    [{"type": "function_call", "name": "f", "arguments": "{\"prompt_ids\": [3]}", "prompt_ids": [9, 9]}]]


@st.composite
def lines(draw):
    rec = {"rollout_id": draw(st.sampled_from(["r", "r2", "é"])), "call_id": f"c{draw(st.integers(0, 3))}",
           "prompt_ids": draw(st.lists(st.integers(-5, 2**31 - 1), max_size=6)),
           "completion_ids": draw(st.lists(st.integers(0, 9), min_size=1, max_size=4)),
           "output_items": draw(st.sampled_from(ITEMS))}
    if draw(st.booleans()):
        rec["completion_logprobs"] = draw(st.one_of(st.none(), st.lists(
            st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=len(rec["completion_ids"]),
            max_size=len(rec["completion_ids"]))))
    if draw(st.booleans()):
        rec["parent_id"] = draw(st.sampled_from([None, "c0", "zz"]))
    if draw(st.integers(0, 5)) == 0:
        rec["failed"] = draw(st.booleans())
    keys = list(rec)
    random.Random(draw(st.integers(0, 1000))).shuffle(keys)
    sep = draw(st.sampled_from([(", ", ": "), (",", ":"), (" , ", " :  ")]))
    text = json.dumps({k: rec[k] for k in keys}, separators=sep, ensure_ascii=draw(st.booleans()))
    edit = draw(st.sampled_from(["none"] * 6 + ["float", "exp", "true", "null_entry", "nested", "big", "string",
                                                "dup", "escaped_key", "not_object", "trailing", "nan", "minus0",
                                                "unterminated", "leading_zero", "plus"]))
    return _edit(text, edit, draw(st.integers(0, 3))) + "\n"


def _edit(text: str, edit: str, k: int) -> str:
    field = ("prompt_ids", "completion_ids", "completion_logprobs")[k % 3]
    key = f'"{field}"'
    at = text.find(key)
    if edit == "none" or (at < 0 and edit not in ("not_object", "trailing", "unterminated")):
        return text
    colon = text.find("[", at) if text.find("[", at) >= 0 else text.find(":", at) + 1
    head, tail = text[:colon + 1], text[colon + 1:]
    return {
        "float": lambda: head + "1.0, " + tail,
        "exp": lambda: head + "1e3, " + tail,
        "true": lambda: head + "true, " + tail,
        "null_entry": lambda: head + "null, " + tail,
        "nested": lambda: head + "[1], " + tail,
        "big": lambda: head + "123456789012345678901, " + tail,
        "string": lambda: text.replace(key, key, 1)[:at] + key + ': "1 2",' + text[at + len(key):].split(",", 1)[-1]
        if "," in text[at + len(key):] else text,
        "dup": lambda: text[:-1] + f', {key}: [1]}}',
        "escaped_key": lambda: text.replace(key, key.replace("_", "\\u005f"), 1),
        "not_object": lambda: "[" + text + "]",
        "trailing": lambda: text + " x",
        "nan": lambda: head + "NaN, " + tail,
        "minus0": lambda: head + "-0, " + tail,
        "unterminated": lambda: text[:-2],
        "leading_zero": lambda: head + "01, " + tail,
        "plus": lambda: head + "+1, " + tail,
    }[edit]()


@settings(max_examples=examples(4), suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(lines(), min_size=1, max_size=4))
def test_kernel_and_exact_reader_agree_on_random_lines(batch):
    _same(*_both([line.encode() for line in batch]))
