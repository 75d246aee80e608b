"""chainrows.formats.jsonl: the JSON Lines importer (docs/jsonl.md)."""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path

import pyarrow as pa
import pytest
import xxhash

from chainrows.errors import InputError
from chainrows.formats.items import fingerprint
from chainrows.formats.jsonl import (
    import_jsonl,
    import_jsonl_to_dataset,
    read_ledger_jsonl,
    read_results_jsonl,
    read_tokens_jsonl,
)
from chainrows.formats.native.dataset import read_dataset
from chainrows.formats.native.schema import (
    ACCEPTED_FIELD,
    LEDGER_SCHEMA,
    LOGPROBS_FIELD,
    ROLLOUTS_SCHEMA,
    TOKENS_SCHEMA,
)
from tests.support.jsonl_doc import doc_files


def _lines(path: Path, *records) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _err(fn, *args) -> str:
    with pytest.raises(InputError) as info:
        fn(*args)
    text = str(info.value)
    assert "\n" not in text
    return text


MSG = {"type": "message", "role": "assistant", "id": "m1",
       "content": [{"type": "output_text", "text": "hi"}]}
CALL = dict(rollout_id="r1", call_id="c1", parent_id=None, response_id="resp1", prev_len=0,
            delta_len=2, gen_len=1, chain_hash=7, output_items=[MSG])
RESULT = dict(rollout_id="r1", group_id="g", reward=1.0, output=[MSG])


# ----------------------------------------------------------------------------- the doc example

def test_documented_example(tmp_path):
    f = doc_files(tmp_path)
    ledger, tokens, rollouts = import_jsonl(f["ledger"], f["tokens"], f["results"])
    assert ledger.schema == LEDGER_SCHEMA and ledger.num_rows == 5
    assert tokens.schema == TOKENS_SCHEMA.append(LOGPROBS_FIELD)
    assert rollouts.schema == ROLLOUTS_SCHEMA  # no accepted_response_ids field in the example
    assert ledger.column("call_id").to_pylist() == ["c1", "c2", "c3", "c4", "c5"]
    # the hashes in the doc are real chain hashes (c3's given as hex)
    by_call = {r["call_id"]: r for r in ledger.to_pylist()}
    toks = {r["call_id"]: r["tokens"] for r in tokens.to_pylist()}
    for cid, row in by_call.items():
        seed = 0 if row["parent_id"] is None else by_call[row["parent_id"]]["chain_hash"]
        data = struct.pack(f"<{len(toks[cid])}i", *toks[cid])
        assert row["chain_hash"] == xxhash.xxh3_64_intdigest(data, seed=seed)
        assert row["delta_len"] == len(toks[cid])
    # output keys = keys of c1, c2, c3, c5 in order; the user message is not keyed
    ro = rollouts.to_pylist()[0]
    expect = [k for c in ("c1", "c2", "c3", "c5") for k in by_call[c]["item_keys"]]
    assert ro["output_keys"] == expect
    assert ro["output_ids"] == ["rs_1", "msg_1", "rs_2", "msg_2", "rs_3", "msg_3", "rs_5", "msg_5"]
    assert by_call["c4"]["item_ids"] == ["rs_4", "msg_4"]
    assert by_call["c4"]["item_keys"][0] not in expect


def test_import_to_dataset_roundtrip(tmp_path):
    f = doc_files(tmp_path)
    tables = import_jsonl(f["ledger"], f["tokens"], f["results"])
    import_jsonl_to_dataset(f["ledger"], f["tokens"], f["results"], tmp_path / "ds")
    d = read_dataset(tmp_path / "ds")
    assert d.ledger.equals(tables[0]) and d.tokens.equals(tables[1])
    assert d.rollouts.equals(tables[2])


# ----------------------------------------------------------------------------- keys and fields

def test_model_authored_items_only(tmp_path):
    call = {"type": "function_call", "id": "fc1", "call_id": "x", "name": "f", "arguments": "{}"}
    output = [{"type": "message", "role": "user", "content": "q"},
              {"type": "message", "role": "system", "content": "s"},
              {"role": "assistant", "content": "a"},  # role only: keyed, no id
              call,
              {"type": "function_call_output", "call_id": "x", "output": "42"},
              {"type": "reasoning", "id": "rs", "summary": []}]
    ro = read_results_jsonl(_lines(tmp_path / "r.jsonl", dict(RESULT, output=output)))
    row = ro.to_pylist()[0]
    assert row["output_ids"] == [None, "fc1", "rs"]
    assert row["output_keys"] == [fingerprint(output[2]), fingerprint(call), fingerprint(output[5])]


@pytest.mark.parametrize("value,expected", [
    (0, 0), (2**64 - 1, 2**64 - 1), ("0x1F", 31), ("0XfF", 255),
    ("0xffffffffffffffff", 2**64 - 1), ("18446744073709551615", 2**64 - 1), ("0", 0),
])
def test_chain_hash_forms(tmp_path, value, expected):
    ledger = read_ledger_jsonl(_lines(tmp_path / "l.jsonl", dict(CALL, chain_hash=value)))
    assert ledger.column("chain_hash").to_pylist() == [expected]


@pytest.mark.parametrize("value,shown", [
    (-1, "the number -1"), (2**64, f"the number {2**64}"), (1.5, "the number 1.5"),
    (True, "a boolean"), ("0x", "the string '0x'"), ("0x" + "f" * 17, "the string '0x" + "f" * 17 + "'"),
    ("abc", "the string 'abc'"), ("18446744073709551616", "the string '18446744073709551616'"),
    ("-5", "the string '-5'"), (None, "null"), ([1], "an array"),
])
def test_bad_chain_hash(tmp_path, value, shown):
    path = _lines(tmp_path / "l.jsonl", CALL, dict(CALL, call_id="c2", chain_hash=value))
    assert _err(read_ledger_jsonl, path) == (
        "ledger: line 2: field 'chain_hash' must be an unsigned 64-bit integer (a number, a "
        "decimal string or a \"0x\" hex string of at most 16 digits), got " + shown +
        f" (rollout 'r1') (file {path})")


def test_parent_and_defaults(tmp_path):
    rec = dict(CALL)
    del rec["parent_id"]
    ledger = read_ledger_jsonl(_lines(tmp_path / "l.jsonl", rec, dict(CALL, output_items=None)))
    assert ledger.column("parent_id").to_pylist() == [None, None]
    assert ledger.column("failed").to_pylist() == [False, False]
    assert ledger.column("item_keys").to_pylist() == [[fingerprint(MSG)], []]


def test_failed_record_may_be_minimal(tmp_path):
    path = _lines(tmp_path / "l.jsonl", {"rollout_id": "r1", "call_id": "c9", "failed": True})
    row = read_ledger_jsonl(path).to_pylist()[0]
    assert row == dict(rollout_id="r1", call_id="c9", parent_id=None, response_id="",
                       prev_len=0, delta_len=0, gen_len=0, chain_hash=0, item_keys=[],
                       item_ids=[], failed=True)


@pytest.mark.parametrize("field", ["rollout_id", "call_id", "response_id", "prev_len",
                                   "delta_len", "gen_len", "chain_hash", "output_items"])
def test_ledger_missing_field(tmp_path, field):
    rec = dict(CALL)
    del rec[field]
    path = _lines(tmp_path / "l.jsonl", CALL, CALL, rec)
    suffix = "" if field == "rollout_id" else " (rollout 'r1')"
    assert _err(read_ledger_jsonl, path) == (
        f"ledger: line 3: field {field!r} is missing{suffix} (file {path})")


@pytest.mark.parametrize("field,value,what", [
    ("rollout_id", 5, "must be a string, got the number 5"),
    ("call_id", None, "must be a string, got null"),
    ("parent_id", 3, "must be a string or null, got the number 3"),
    ("response_id", ["x"], "must be a string, got an array"),
    ("prev_len", 5.0, "must be an integer in the int64 range, got the number 5.0"),
    ("delta_len", "2", "must be an integer in the int64 range, got the string '2'"),
    ("gen_len", True, "must be an integer in the int64 range, got a boolean"),
    ("prev_len", 2**63, f"must be an integer in the int64 range, got the number {2**63}"),
    ("failed", "no", "must be true or false, got the string 'no'"),
    ("failed", 0, "must be true or false, got the number 0"),
    ("output_items", {"a": 1}, "must be an array of item objects, got an object"),
    ("output_items", [MSG, "text"], "item 1 must be an object, got the string 'text'"),
    ("output_items", [dict(MSG, id=7)],
     "model-authored item 0 has an id that is not a string: the number 7"),
])
def test_ledger_wrong_types(tmp_path, field, value, what):
    path = _lines(tmp_path / "l.jsonl", dict(CALL, **{field: value}))
    rollout = "" if field == "rollout_id" else " (rollout 'r1')"
    assert _err(read_ledger_jsonl, path) == (
        f"ledger: line 1: field {field!r} {what}{rollout} (file {path})")


def test_item_that_cannot_be_fingerprinted(tmp_path):
    path = _lines(tmp_path / "l.jsonl", '{"rollout_id": "r1", "call_id": "c1", "response_id": "x",'
                  ' "prev_len": 0, "delta_len": 1, "gen_len": 1, "chain_hash": 1, "output_items":'
                  ' [{"type": "reasoning", "score": NaN}]}')
    msg = _err(read_ledger_jsonl, path)
    assert msg.startswith("ledger: line 1: field 'output_items' cannot be fingerprinted: ")
    assert msg.endswith(f"(rollout 'r1') (file {path})")


# ----------------------------------------------------------------------------- tokens

def test_tokens_and_logprobs_column_presence(tmp_path):
    t = read_tokens_jsonl(_lines(tmp_path / "a.jsonl",
                                 dict(rollout_id="r", call_id="c", tokens=[1, -2, 2**31 - 1])))
    assert t.schema == TOKENS_SCHEMA and t.column("tokens").to_pylist() == [[1, -2, 2**31 - 1]]
    t = read_tokens_jsonl(_lines(tmp_path / "b.jsonl",
                                 dict(rollout_id="r", call_id="c", tokens=[1], logprobs=[0]),
                                 dict(rollout_id="r", call_id="d", tokens=None),
                                 dict(rollout_id="r", call_id="e", tokens=[3], logprobs=None)))
    assert t.schema == TOKENS_SCHEMA.append(LOGPROBS_FIELD)
    assert t.column("logprobs").to_pylist() == [[0.0], None, None]
    assert t.column("tokens").to_pylist() == [[1], None, [3]]


@pytest.mark.parametrize("field,value,what", [
    ("tokens", [1, 1.5], "entry 1 must be an integer, got the number 1.5"),
    ("tokens", [1.0], "entry 0 must be an integer, got the number 1.0"),
    ("tokens", [True], "entry 0 must be an integer, got a boolean"),
    ("tokens", ["1"], "entry 0 must be an integer, got the string '1'"),
    ("tokens", [0, 2**31], f"entry 1 ({2**31}) is outside the int32 range"),
    ("tokens", [-(2**31) - 1], f"entry 0 ({-(2**31) - 1}) is outside the int32 range"),
    ("tokens", 5, "must be an array of integers, got the number 5"),
    ("logprobs", [0.0, "x"], "entry 1 must be a number, got the string 'x'"),
    ("logprobs", [False], "entry 0 must be a number, got a boolean"),
    ("logprobs", "0.5", "must be an array of numbers or null, got the string '0.5'"),
    ("call_id", 1, "must be a string, got the number 1"),
])
def test_tokens_wrong_types(tmp_path, field, value, what):
    good = dict(rollout_id="r1", call_id="c", tokens=[1, 2])
    path = _lines(tmp_path / "t.jsonl", good, dict(good, **{field: value}))
    assert _err(read_tokens_jsonl, path) == (
        f"tokens: line 2: field {field!r} {what} (rollout 'r1') (file {path})")


def test_tokens_many_records_chunked(tmp_path):
    recs = [dict(rollout_id=f"r{i // 3}", call_id=f"c{i}", tokens=[i, i + 1]) for i in range(9001)]
    t = read_tokens_jsonl(_lines(tmp_path / "t.jsonl", *recs))
    assert t.num_rows == 9001 and t.column("tokens")[9000].as_py() == [9000, 9001]
    assert t.column("call_id").to_pylist() == [r["call_id"] for r in recs]


def test_nan_logprobs_are_left_to_the_engine(tmp_path):
    path = _lines(tmp_path / "t.jsonl", '{"rollout_id": "r", "call_id": "c", "tokens": [1, 2],'
                  ' "logprobs": [NaN, -Infinity]}')
    lp = read_tokens_jsonl(path).column("logprobs").to_pylist()[0]
    assert lp[0] != lp[0] and lp[1] == float("-inf")


# ----------------------------------------------------------------------------- results

def test_results_fields_and_accepted_presence(tmp_path):
    rows = read_results_jsonl(_lines(
        tmp_path / "r.jsonl",
        dict(RESULT, terminal_response_id="resp1", accepted_response_ids=["resp1"]),
        dict(rollout_id="r2", reward=None, output=None),
        '{"rollout_id": "r3", "reward": NaN, "output": [], "accepted_response_ids": null}',
        dict(rollout_id="r4", reward=3, output=[]),
    ))
    assert rows.schema == ROLLOUTS_SCHEMA.append(ACCEPTED_FIELD)
    got = rows.to_pylist()
    assert got[0]["accepted_response_ids"] == ["resp1"] and got[0]["terminal_response_id"] == "resp1"
    assert got[1] == dict(rollout_id="r2", group_id=None, reward=None, output_keys=[],
                          output_ids=[], terminal_response_id=None, accepted_response_ids=None)
    assert got[2]["reward"] != got[2]["reward"] and got[3]["reward"] == 3.0
    assert read_results_jsonl(_lines(tmp_path / "s.jsonl", RESULT)).schema == ROLLOUTS_SCHEMA


@pytest.mark.parametrize("field,value,what", [
    ("reward", "1.0", "must be a number or null, got the string '1.0'"),
    ("reward", True, "must be a number or null, got a boolean"),
    ("group_id", 1, "must be a string or null, got the number 1"),
    ("output", "text", "must be an array of item objects, got the string 'text'"),
    ("terminal_response_id", 2, "must be a string or null, got the number 2"),
    ("accepted_response_ids", "resp1", "must be an array of strings or null, got the string 'resp1'"),
    ("accepted_response_ids", ["a", None], "entry 1 must be a string, got null"),
])
def test_results_wrong_types(tmp_path, field, value, what):
    path = _lines(tmp_path / "r.jsonl", dict(RESULT, **{field: value}))
    assert _err(read_results_jsonl, path) == (
        f"results: line 1: field {field!r} {what} (rollout 'r1') (file {path})")


@pytest.mark.parametrize("field", ["rollout_id", "reward", "output"])
def test_results_missing_field(tmp_path, field):
    rec = dict(RESULT)
    del rec[field]
    path = _lines(tmp_path / "r.jsonl", rec)
    assert f"results: line 1: field {field!r} is missing" in _err(read_results_jsonl, path)


# ----------------------------------------------------------------------------- file level

def test_bad_json_line_number_counts_blank_lines(tmp_path):
    path = _lines(tmp_path / "l.jsonl", CALL, "", "   ", '{"rollout_id": "r1",')
    assert _err(read_ledger_jsonl, path) == (
        f"ledger: line 4: invalid JSON: Expecting property name enclosed in double quotes "
        f"(file {path})")


def test_blank_lines_skipped(tmp_path):
    path = _lines(tmp_path / "l.jsonl", "", CALL, "\t", dict(CALL, call_id="c2"), "")
    assert read_ledger_jsonl(path).column("call_id").to_pylist() == ["c1", "c2"]


@pytest.mark.parametrize("line,what", [
    ("[1, 2]", "expected a JSON object, got an array"),
    ("42", "expected a JSON object, got the number 42"),
    ('"x"', "expected a JSON object, got the string 'x'"),
    ("null", "expected a JSON object, got null"),
])
def test_non_object_line(tmp_path, line, what):
    path = _lines(tmp_path / "r.jsonl", RESULT, line)
    assert _err(read_results_jsonl, path) == f"results: line 2: {what} (file {path})"


def test_invalid_utf8(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"rollout_id": "r", "call_id": "c", "tokens": []}\n{"rollout_id": "\xff"}\n')
    assert _err(read_tokens_jsonl, path) == f"tokens: line 2: invalid JSON: invalid UTF-8 (file {path})"


def test_missing_file(tmp_path):
    path = tmp_path / "nope.jsonl"
    msg = _err(read_results_jsonl, path)
    assert msg.startswith("results: cannot open JSON Lines file: ") and msg.endswith(f"(file {path})")


def test_gzip_and_truncated_gzip(tmp_path):
    path = tmp_path / "l.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        for i in range(200):
            fh.write(json.dumps(dict(CALL, call_id=f"c{i}")) + "\n")
    assert read_ledger_jsonl(path).num_rows == 200
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    msg = _err(read_ledger_jsonl, path)
    assert msg.startswith("ledger: cannot read JSON Lines file: ") and msg.endswith(f"(file {path})")


def test_import_jsonl_reports_the_failing_file(tmp_path):
    f = doc_files(tmp_path)
    f["tokens"].write_text(f["tokens"].read_text() + "oops\n")
    msg = _err(import_jsonl, f["ledger"], f["tokens"], f["results"])
    assert msg == f"tokens: line 6: invalid JSON: Expecting value (file {f['tokens']})"


def test_tables_are_arrow_with_expected_types(tmp_path):
    f = doc_files(tmp_path)
    ledger, tokens, rollouts = import_jsonl(f["ledger"], f["tokens"], f["results"])
    assert ledger.schema.field("chain_hash").type == pa.uint64()
    assert tokens.schema.field("tokens").type == pa.list_(pa.int32())
    assert rollouts.schema.field("output_keys").type == pa.list_(pa.uint64())


# JSON that parses but that Python cannot carry on with: each was an internal error (exit 1)
@pytest.mark.parametrize("reader,line,what", [
    (read_ledger_jsonl, json.dumps(CALL).replace('"c1"', '"\\ud800"'),
     "line 1: invalid JSON: a string holds a lone UTF-16 surrogate (not Unicode text)"),
    (read_results_jsonl, json.dumps(RESULT).replace('"g"', '"\\udfff"'),
     "line 1: invalid JSON: a string holds a lone UTF-16 surrogate (not Unicode text)"),
    (read_results_jsonl, json.dumps(RESULT).replace("1.0", "1" + "0" * 400),
     "line 1: field 'reward' is beyond the float64 range"),
    (read_ledger_jsonl, json.dumps(CALL).replace('"hi"', "[" * 900 + "]" * 900),
     "line 1: field 'output_items' cannot be fingerprinted: nested too deeply"),
    (read_ledger_jsonl, json.dumps(CALL).replace('"prev_len": 0', '"prev_len": 1' + "0" * 5000),
     "line 1: invalid JSON: Exceeds the limit (4300 digits)"),
])
def test_json_python_cannot_hold_is_a_one_line_input_error(tmp_path, reader, line, what):
    path = tmp_path / "x.jsonl"
    path.write_text(line + "\n")
    assert what in _err(reader, path)


def test_an_integer_logprob_float32_cannot_hold_is_rounded_as_a_float_is(tmp_path):
    """Arrow refuses an integer float32 cannot hold exactly (2**24 + 1); the importer reads it
    as the float it is, rounded to float32 as ``-16777217.0`` would be."""
    toks = _lines(tmp_path / "t.jsonl", '{"rollout_id": "r1", "call_id": "c1", "tokens": [1, 2, 3], '
                                        '"logprobs": [0, -16777217, 1099511627776]}')
    assert read_tokens_jsonl(toks).column("logprobs").to_pylist() == [[0.0, -16777216.0, 2.0 ** 40]]


def test_a_lone_surrogate_written_as_its_bytes_is_one_line(tmp_path):
    """json.loads decodes bytes with "surrogatepass": ED A0 80 gives the lone surrogate an
    escape would, which Arrow then refused as an internal error."""
    path = tmp_path / "l.jsonl"
    path.write_bytes(json.dumps(CALL).replace('"c1"', '"c1@"').encode().replace(b"@", b"\xed\xa0\x80") + b"\n")
    assert "line 1: invalid JSON: a string holds a lone UTF-16 surrogate" in _err(read_ledger_jsonl, path)


def test_a_surrogate_pair_escape_is_text_and_a_huge_logprob_is_inf(tmp_path):
    """A proper \\ud83d\\ude00 pair decodes to one character; a logprob integer literal beyond
    float64 becomes -inf as float32 storage would have it (left to check 15)."""
    call = _lines(tmp_path / "l.jsonl", json.dumps(CALL).replace('"c1"', '"c\\ud83d\\ude00"'))
    assert read_ledger_jsonl(call).column("call_id").to_pylist() == ["c\U0001F600"]
    toks = _lines(tmp_path / "t.jsonl", '{"rollout_id": "r1", "call_id": "c1", "tokens": [1, 2], '
                                        '"logprobs": [0.0, -1' + "0" * 400 + "]}")
    assert read_tokens_jsonl(toks).column("logprobs").to_pylist() == [[0.0, float("-inf")]]


@pytest.mark.parametrize("order", [("tokens", "ledger", "results"), ("results", "tokens", "ledger"),
                                   ("ledger", "results", "tokens"), ("tokens", "results", "ledger"),
                                   ("results", "ledger", "tokens")])
def test_files_in_the_wrong_order_hint_at_the_order(tmp_path, order):
    """A file given in another's place fails on its first record, and the one-line error says
    which kind of record it looks like and the order the files go in."""
    files = doc_files(tmp_path)
    text = _err(import_jsonl, *(files[kind] for kind in order))
    slot = next(s for s, kind in zip(("ledger", "tokens", "results"), order) if s != kind)
    given = order[("ledger", "tokens", "results").index(slot)]
    assert text.startswith(f"{slot}: line 1: field "), text
    assert f"it looks like a {given} record" in text, text
    assert "the three files go in the order LEDGER TOKENS RESULTS" in text and str(files[given]) in text, text


def test_a_bad_record_of_the_right_file_has_no_order_hint(tmp_path):
    ledger = _lines(tmp_path / "ledger.jsonl", {"rollout_id": "r1", "call_id": "c1", "prev_len": 0})
    text = _err(read_ledger_jsonl, ledger)
    assert "response_id' is missing" in text and "order" not in text, text
