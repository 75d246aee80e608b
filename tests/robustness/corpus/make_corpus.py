"""Regenerate the JSON cases of this corpus, from the repository root:
``python -m tests.robustness.corpus.make_corpus``.

Each case is a small SPEC §2 input that once broke something or sits on an edge, with what the
CLI must do with it (``test_fuzz.py::test_corpus`` replays them). The format, one JSON object:

    why       what the case is about
    tables    {"ledger": [rows], "tokens": [rows], "rollouts": [rows]} (dicts of SPEC columns)
    logprobs  bool, the tokens table has the logprobs column
    accepted  bool, the rollouts table has accepted_response_ids
    types     {"<table>.<column>": "<arrow type>"} physical type overrides (uint64, int32,
              large_string, large_list<int32>, float32, string, ...)
    drop      ["<table>.<column>", ...] columns left out
    args      extra CLI arguments
    expect    {"exit": 0, "report": {rollout_id: [status, reason]}} or
              {"exit": 2, "stderr": [substrings of the one error line]}

String values written as {"$bytes": "<hex>"} are stored as raw bytes in a string column
(invalid UTF-8). NaN / Infinity use Python's JSON extensions. Cases kept as directories
(``<name>/`` with Parquet files and ``expect.json``) hold byte-level damage.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from tests.support.builders import combine, one_call, single_chain, worked_example

HERE = Path(__file__).resolve().parent

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


def base(*builders):
    ledger, tokens, rollouts = combine(*builders)
    return {"ledger": ledger, "tokens": tokens, "rollouts": rollouts}


def row(tables, table, rollout_id, call_id=None):
    return next(r for r in tables[table] if r["rollout_id"] == rollout_id
                and (call_id is None or r["call_id"] == call_id))


CASES = {}


def case(name, why, tables, expect, *, args=(), logprobs=False, accepted=False, types=None, drop=()):
    CASES[name] = {"why": why, "tables": tables, "logprobs": logprobs, "accepted": accepted,
                   "types": types or {}, "drop": list(drop), "args": list(args), "expect": expect}


def masked(reason):
    return ["masked", reason]


OK = ["ok", None]

# ---------------------------------------------------------------------------- lengths
t = base(worked_example("wx"), one_call("solo"))
row(t, "ledger", "wx", "c1")["delta_len"] = 2**62
case("delta_len_2pow62", "a length near the int64 limit must not overflow a size or offset",
     t, {"exit": 0, "report": {"wx": masked("length_mismatch"), "solo": OK}})

t = base(single_chain("sc"), one_call("solo"))
c1, c2 = row(t, "ledger", "sc", "c1"), row(t, "ledger", "sc", "c2")
c1["prev_len"] = INT64_MAX - c1["delta_len"] + 1
c2["prev_len"] = INT64_MIN  # what a wrapping int64 parent.prev_len + parent.delta_len gives
case("prev_len_wraps_int64", "parent prev_len + delta_len overflows int64 to the child's value",
     t, {"exit": 0, "report": {"sc": masked("length_mismatch"), "solo": OK}}, args=["--mode", "ordinary"])

t = base(single_chain("sc"))
row(t, "ledger", "sc", "c2")["prev_len"] = INT64_MAX
row(t, "ledger", "sc", "c3")["prev_len"] = INT64_MIN
case("prev_len_extremes", "prev_len at both int64 limits", t,
     {"exit": 0, "report": {"sc": masked("length_mismatch")}}, args=["--mode", "ordinary"])

t = base(worked_example("wx"))
row(t, "ledger", "wx", "c3")["gen_len"] = INT64_MIN
row(t, "ledger", "wx", "c5")["gen_len"] = INT64_MAX
case("gen_len_extremes", "gen_len outside [1, delta_len] at the int64 limits", t,
     {"exit": 0, "report": {"wx": masked("length_mismatch")}})

t = base(worked_example("wx"), one_call("solo"))
row(t, "tokens", "wx", "c2")["tokens"] = [4]
case("tokens_shorter_than_delta_len", "a delta shorter than delta_len: gathering by delta_len "
     "would read past the token buffer", t,
     {"exit": 0, "report": {"wx": masked("length_mismatch"), "solo": OK}})

t = base(worked_example("wx"), one_call("solo"))
row(t, "tokens", "wx", "c5")["tokens"] = None
row(t, "ledger", "solo", "c1")["delta_len"] = -1
case("null_tokens_negative_delta", "a null token list reads as empty; a negative delta_len", t,
     {"exit": 0, "report": {"wx": masked("length_mismatch"), "solo": masked("length_mismatch")}})

# ---------------------------------------------------------------------------- ids
t = base(one_call(""), one_call("a\u0000b", ""), one_call("a"), one_call("a\u0000"))
for r in t["ledger"] + t["tokens"]:
    if r["rollout_id"] == "":
        r["call_id"] = ""
        if "parent_id" in r:
            r["response_id"] = ""
t["rollouts"][0]["terminal_response_id"] = ""
case("empty_and_nul_ids", "empty strings and NUL bytes are ordinary ids (sorted by bytes)", t,
     {"exit": 0, "report": {"": OK, "a": OK, "a\u0000": OK, "a\u0000b": OK}},
     args=["--buckets", "3"])

t = base(worked_example("a", "g"), one_call("a_s1", "g"), one_call("a_s0_s0", "g"))
case("rollout_ids_like_row_ids", "row ids <rollout>_s<k> stay unique and ordered", t,
     {"exit": 0, "report": {"a": OK, "a_s1": OK, "a_s0_s0": OK}})

t = base(one_call("\U0001F642", "\u202eg"), one_call("x" * 5000, "\u202eg"))
case("unicode_and_long_ids", "non-ASCII and 5000-character ids", t,
     {"exit": 0, "report": {"\U0001F642": OK, "x" * 5000: OK}}, args=["--buckets", "2"])

t = base(one_call("wx"))
t["ledger"][0]["call_id"] = {"$bytes": "63ff"}
case("invalid_utf8_call_id", "invalid UTF-8 in an id is unusable input (it could not be "
     "written back or compared reliably)", t,
     {"exit": 2, "stderr": ["error: ledger: column 'call_id'", "not valid UTF-8", "row 0"]})

t = base(one_call("ok1"), one_call("ok2"))
t["rollouts"][1]["rollout_id"] = {"$bytes": "6f6bc3"}
case("invalid_utf8_rollout_id", "a truncated multi-byte sequence in a rollout id", t,
     {"exit": 2, "stderr": ["error: rollouts: column 'rollout_id'", "not valid UTF-8"]},
     args=["--buckets", "2"])

# ---------------------------------------------------------------------------- tables disagree
t = base(worked_example("wx"), one_call("only-rollouts"))
t["ledger"].append(dict(row(t, "ledger", "wx", "c1"), rollout_id="only-ledger"))
t["tokens"].append(dict(row(t, "tokens", "wx", "c1"), rollout_id="only-tokens"))
t["ledger"] = [r for r in t["ledger"] if r["rollout_id"] != "only-rollouts"]
t["tokens"] = [r for r in t["tokens"] if r["rollout_id"] != "only-rollouts"]
case("ids_in_one_table_only", "each table holds a rollout the others lack", t,
     {"exit": 0, "report": {"wx": OK, "only-ledger": masked("no_rollout_record"),
                            "only-tokens": masked("no_rollout_record"),
                            "only-rollouts": masked("no_calls")}}, args=["--placeholders"])

t = base(worked_example("wx"), single_chain("sc"), one_call("solo"), one_call("dupro", "g", 0.5))
t["ledger"].append(copy.deepcopy(row(t, "ledger", "wx", "c4")))
t["tokens"].append(copy.deepcopy(row(t, "tokens", "sc", "c2")))
t["rollouts"].append(dict(row(t, "rollouts", "dupro"), reward=0.0))
t["tokens"].append(dict(row(t, "tokens", "solo", "c1"), call_id="orphan"))
case("duplicated_keys", "a repeated call_id, a call with two token rows, a repeated rollouts "
     "row; an orphan token row is ignored", t,
     {"exit": 0, "report": {"wx": masked("duplicate_call"), "sc": masked("duplicate_call"),
                            "dupro": masked("duplicate_call"), "solo": OK}})

t = base(single_chain("sc"), single_chain("cy"), single_chain("self"))
row(t, "ledger", "cy", "c1")["parent_id"] = "c3"
row(t, "rollouts", "cy")["terminal_response_id"] = None  # no root, no leaf
row(t, "ledger", "self", "c2")["parent_id"] = "c2"
case("parent_cycles", "a parent cycle and a self-parent in ordinary mode", t,
     {"exit": 0, "report": {"sc": OK, "cy": masked("ambiguous_terminal"),
                            "self": masked("walk_mismatch")}}, args=["--mode", "ordinary"])

# ---------------------------------------------------------------------------- values
t = base(worked_example("wx", logprobs=True), one_call("solo", logprobs=True))
row(t, "tokens", "wx", "c3")["logprobs"][0] = -0.0
row(t, "tokens", "solo", "c1")["logprobs"][-1] = float("nan")
case("logprob_negative_zero_and_nan", "-0.0 on a carry token counts as zero; NaN is invalid", t,
     {"exit": 0, "report": {"wx": OK, "solo": masked("logprob_invalid")}}, logprobs=True)

t = base(worked_example("wx"), one_call("nan", "g2"), one_call("inf", "g2"), one_call("null", "g2"))
row(t, "rollouts", "nan")["reward"] = float("nan")
row(t, "rollouts", "inf")["reward"] = float("-inf")
row(t, "rollouts", "null")["reward"] = None
row(t, "ledger", "wx", "c4")["failed"] = True
case("bad_rewards_and_failed_call", "non-finite rewards; a failed (poison) call", t,
     {"exit": 0, "report": {"wx": masked("capture_failed"), "nan": masked("reward_invalid"),
                            "inf": masked("reward_invalid"), "null": masked("reward_invalid")}})

t = base(one_call("tiny", "g", 5e-324), one_call("zero", "g", 0.0), one_call("huge", "h", 1e308),
         one_call("huge2", "h", -1e308))
case("extreme_rewards", "a subnormal and float64-limit rewards: finite advantages, no numpy "
     "warning on stderr", t, {"exit": 0, "report": {"tiny": OK, "zero": OK, "huge": OK, "huge2": OK}})

b = worked_example("acc")
b.output(["c1", "c2", "c3", "c5"], accepted=["resp-c1", None, "resp-c3", "resp-c5"])
t = base(b)
case("accepted_ids_null_entry", "a null entry in accepted_response_ids names no call", t,
     {"exit": 0, "report": {"acc": masked("unmatched_output")}}, accepted=True)

t = base(worked_example("wx"))
row(t, "ledger", "wx", "c1")["item_keys"] = None
row(t, "ledger", "wx", "c1")["item_ids"] = None
row(t, "rollouts", "wx")["output_keys"] = []
row(t, "rollouts", "wx")["output_ids"] = None
case("null_and_empty_key_lists", "a null item_keys list reads as empty; empty output_keys", t,
     {"exit": 0, "report": {"wx": masked("no_output")}})

t = base(worked_example("wx"))
row(t, "rollouts", "wx")["output_keys"] = []
case("output_ids_longer_than_keys", "step 4b (id list lengths) comes before step 5 (no_output)",
     t, {"exit": 0, "report": {"wx": masked("length_mismatch")}})

# ---------------------------------------------------------------------------- unusable input
t = base(worked_example("wx"))
row(t, "ledger", "wx", "c2")["delta_len"] = 2**63
case("uint64_length_above_int64", "a uint64 length column with a value above int64", t,
     {"exit": 2, "stderr": ["error: ledger: column 'delta_len'", "above the int64 range", "row 1"]},
     types={"ledger.delta_len": "uint64"})

t = base(worked_example("wx"))
row(t, "ledger", "wx", "c3")["failed"] = None
case("null_failed_flag", "a null `failed` is not `false`: unusable input", t,
     {"exit": 2, "stderr": ["error: ledger: column 'failed' has a null value", "row 2",
                            "rollout 'wx'"]})

t = base(worked_example("wx"))
for r in t["ledger"]:
    r["chain_hash"] = r["chain_hash"] % 2**63
case("chain_hash_as_int64", "chain_hash must be uint64", t,
     {"exit": 2, "stderr": ["error: ledger: column 'chain_hash' has type int64, expected uint64"]},
     types={"ledger.chain_hash": "int64"})

t = base(worked_example("wx"))
case("tokens_as_int64", "token ids are int32", t,
     {"exit": 2, "stderr": ["error: tokens: column 'tokens' has type list<int64>"]},
     types={"tokens.tokens": "list<int64>"})

t = base(worked_example("wx"))
case("missing_failed_column", "a required column is absent", t,
     {"exit": 2, "stderr": ["error: ledger: missing column 'failed'"]}, drop=["ledger.failed"])

t = base(worked_example("wx"))
row(t, "tokens", "wx", "c2")["tokens"] = [4, None, 13]
case("null_token_entry", "a null token inside a token list", t,
     {"exit": 2, "stderr": ["error: tokens: column 'tokens' has a list with a null entry"]},
     args=["--buckets", "2"])

# ---------------------------------------------------------------------------- edges
case("zero_rollouts", "three empty tables", {"ledger": [], "tokens": [], "rollouts": []},
     {"exit": 0, "report": {}}, logprobs=True, accepted=True, args=["--placeholders"])

t = base(one_call("solo", "lonely", 0.25), one_call("n", None, 1.0))
case("groups_of_one", "a group of one and a null group: advantage 0", t,
     {"exit": 0, "report": {"solo": OK, "n": OK}}, args=["--baseline", "loo"])


def bitflip_case():
    """ledger.parquet with one bit flipped in its first page header: pyarrow's streaming reader
    (iter_batches) then yields zero rows without an error while the footer says 8. The
    partitioned path used to take that for an empty ledger and mask every rollout no_calls."""
    import io

    import pyarrow.parquet as pq

    from chainrows.formats.native.schema import tables_from_pylists

    t = base(worked_example("wx"), single_chain("sc"))
    ledger, tokens, rollouts = tables_from_pylists(t["ledger"], t["tokens"], t["rollouts"])
    folder = HERE / "ledger_page_bitflip"
    folder.mkdir(exist_ok=True)
    buf = io.BytesIO()
    pq.write_table(ledger, buf, compression="snappy")
    raw = bytearray(buf.getvalue())
    raw[5] ^= 1 << 1
    (folder / "ledger.parquet").write_bytes(bytes(raw))
    pq.write_table(tokens, folder / "tokens.parquet", compression="snappy")
    pq.write_table(rollouts, folder / "rollouts.parquet", compression="snappy")
    expect = {"why": bitflip_case.__doc__.split("\n")[0], "runs": [[], ["--buckets", "2"]],
              "expect": {"exit": 2, "stderr": ["error: ledger: unreadable Parquet file", "ledger.parquet"]}}
    (folder / "expect.json").write_text(json.dumps(expect, indent=1) + "\n")


def main():
    for path in HERE.glob("*.json"):
        path.unlink()
    bitflip_case()
    for name, spec in CASES.items():
        (HERE / f"{name}.json").write_text(json.dumps(spec, indent=1, ensure_ascii=True) + "\n")
    print(f"wrote {len(CASES)} cases to {HERE}")


if __name__ == "__main__":
    main()
