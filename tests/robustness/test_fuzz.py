"""Fuzzing: hostile input never crashes the CLI or the engine, never loses a rollout and never
yields a wrong row (issue "Robustness").

Every case ends in one of two ways, and the tests check which one is right:

- the input is usable (SPEC §2): exit 0, and the output equals what ``chainrows.reference`` (the
  pure-Python oracle) decides on the tables as the reader returns them, row for row, masks and
  reason codes included, and ``chainrows.testing.reconcile.reconcile`` finds nothing;
- the input is unusable: exit 2 and exactly one line on stderr, ``chainrows: error: ...``,
  naming the table and (where there is one) the column or the file.

Never a signal (segfault, abort), a hang, a traceback, exit 1 or a partial output. The CLI
runs in a long-lived worker process (``CliWorker``) so a crash is seen as a crash, with the
input that caused it, instead of killing pytest; the worker pays the numba/pyarrow start-up once.

Strategies (hypothesis; 1.2/1.5/0.8/0.6 times the profile's examples (tests/conftest.py): 120/150/
80/60 under the ci profile, about 30 s for the module on 2 cores; HYPOTHESIS_PROFILE=nightly
runs ten times that):

- ``mutations``: hostile *values* in otherwise well-typed tables: int64 extremes in the length
  fields, chain hashes, tokens shorter/longer than delta_len, null/empty lists, NaN/inf
  logprobs and rewards, empty/NUL/huge/Unicode ids, duplicated and dropped rows, ids in one
  table only, dangling/self/cyclic parents, shuffled row order;
- ``variants``: accepted physical variations (large types, dictionary strings, narrow ints,
  extra columns, tables split into part files, row groups of one row, other codecs): output
  must not change;
- ``faults``: unusable input (missing table/column, wrong types, nulls where none are allowed,
  invalid UTF-8, uint64 above int64, non-Parquet, empty and truncated files);
- byte-level corruption of a real synth dataset's files (bit flips, overwritten ranges,
  truncation);
- engine level: the same hostile tables fed to ``chainrows.reassemble`` directly, and corrupted
  ``Batch`` arrays, which ``Batch.validate`` must refuse before a kernel reads out of bounds.

``tests/robustness/corpus/`` keeps the nastiest inputs as JSON (or small Parquet directories); they are
replayed below as regression tests.
"""

from __future__ import annotations

import copy
import json
import math
import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

from chainrows import reassemble
from chainrows.errors import InputError
from chainrows.testing.reconcile import reconcile
from tests.support.cli_worker import assert_clean_error, assert_ran, cli  # noqa: F401  (cli is a fixture)
from tests.support.compare import compare_outputs
from tests.support.oracle import check_against_oracle, option_args, oracle
from tests.support.outputs import no_outputs, read_output
from tests.support.profiles import examples
from tests.support.tables import (
    CANONICAL,
    TABLES,
    Data,
    base_data,
    build_tables,
    invalid_utf8,
    schemas,
    set_column,
    write_dir,
    write_table,
)

CORPUS = Path(__file__).resolve().parent / "corpus"
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

FUZZ = settings(max_examples=examples(1.2), derandomize=False, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


# ============================================================================ hostile values

INT_POOL = (0, 1, -1, 2, 2**31 - 1, 2**31, 2**32 + 1, 2**53 + 1, 2**62, INT64_MAX, INT64_MAX - 1,
            INT64_MIN, INT64_MIN + 1, -(2**62))
HASH_POOL = (0, 1, 2**63, 2**64 - 1, 0x9E3779B97F4A7C15)
TOKEN_POOL = (0, -1, 2**31 - 1, -(2**31), 151_000)
ID_POOL = ("", " ", "\x00", "a\x00b", "é", "\U0001F642", "\u202eevil", "x" * 3000, "r_s0", "wx_s1",
           "None", "null", "c1", "resp-c1", "ghost", "\n", "\ud7ff")
# Rewards up to the float64 limit: the group statistics must not overflow, and an advantage
# float32 cannot hold (--no-std, or a masked rollout outside --baseline-population ok scaled by
# the others' std) saturates at the largest float32 (docs/limits.md). --no-std on huge rewards
# is kept out (_std_if_huge): A = r - mean is then exact only to the float64 rounding of the
# group's largest |reward|, which the exact reference does not share.
FLOAT_POOL = (math.nan, math.inf, -math.inf, None, 1e30, -1e30, 1e308, -1e308, 1e200, -0.0, 5e-324)
KEY_POOL = (0, 1, 2**63, 2**64 - 1)


def _pick(draw, seq, label):
    return draw(st.sampled_from(seq), label=label)


def _index(draw, seq, label):
    assume(len(seq) > 0)
    return draw(st.integers(0, len(seq) - 1), label=label)


def m_int_field(d: Data, draw):
    i = _index(draw, d.ledger, "ledger row")
    field = _pick(draw, ("prev_len", "delta_len", "gen_len"), "field")
    row = d.ledger[i]
    value = draw(st.one_of(st.sampled_from(INT_POOL),
                           st.sampled_from((row[field] - 1, row[field] + 1)).filter(
                               lambda v: INT64_MIN <= v <= INT64_MAX)), label="value")
    row[field] = value


def m_overflow(d: Data, draw):
    """prev_len/delta_len whose int64 sum wraps around to the child's recorded prev_len."""
    by_id = {(r["rollout_id"], r["call_id"]): r for r in d.ledger}
    kids = [r for r in d.ledger if r["parent_id"] is not None
            and (r["rollout_id"], r["parent_id"]) in by_id]
    assume(kids)
    child = kids[_index(draw, kids, "child")]
    parent = by_id[(child["rollout_id"], child["parent_id"])]
    d = parent["delta_len"]
    parent["prev_len"] = INT64_MAX - d + 1 if 1 <= d <= INT64_MAX else INT64_MAX
    child["prev_len"] = INT64_MIN  # what a wrapping int64 sum would give


def m_chain_hash(d: Data, draw):
    d.ledger[_index(draw, d.ledger, "ledger row")]["chain_hash"] = _pick(draw, HASH_POOL, "hash")


def m_tokens(d: Data, draw):
    t = d.tokens[_index(draw, d.tokens, "token row")]
    how = _pick(draw, ("truncate", "extend", "empty", "null", "value"), "how")
    toks = t["tokens"] or []
    if how == "truncate" and toks:
        t["tokens"] = toks[:draw(st.integers(0, len(toks) - 1), label="keep")]
    elif how == "extend":
        t["tokens"] = toks + [_pick(draw, TOKEN_POOL, "tok")] * draw(st.integers(1, 3), label="n")
    elif how == "empty":
        t["tokens"] = []
    elif how == "null":
        t["tokens"] = None
    elif toks:
        toks[draw(st.integers(0, len(toks) - 1), label="pos")] = _pick(draw, TOKEN_POOL, "tok")
    if d.logprobs and how in ("truncate", "extend", "empty", "null") and draw(st.booleans(), label="lp too"):
        t["logprobs"] = None if t["tokens"] is None else [0.0] * len(t["tokens"])


def m_logprobs(d: Data, draw):
    assume(d.logprobs)
    t = d.tokens[_index(draw, d.tokens, "token row")]
    lp = t.get("logprobs")
    how = _pick(draw, ("value", "null", "short", "long"), "how")
    if how == "value" and lp:
        lp[draw(st.integers(0, len(lp) - 1), label="pos")] = _pick(
            draw, (math.nan, math.inf, -math.inf, -0.0, 1e-45, -3.0), "lp")
    elif how == "null":
        t["logprobs"] = None
    elif how == "short" and lp:
        t["logprobs"] = lp[:-1]
    elif how == "long":
        t["logprobs"] = (lp or []) + [0.0]


def m_rename_rollout(d: Data, draw):
    """Rename a rollout everywhere (decisions unchanged) or in one row only (tables disagree)."""
    ids = sorted({r["rollout_id"] for r in d.ledger + d.tokens + d.rollouts})
    assume(ids)
    old = _pick(draw, ids, "rollout")
    new = _pick(draw, ID_POOL, "new id")
    if draw(st.booleans(), label="everywhere"):
        for r in d.ledger + d.tokens + d.rollouts:
            if r["rollout_id"] == old:
                r["rollout_id"] = new
    else:
        table = _pick(draw, ("ledger", "tokens", "rollouts"), "table")
        rows = [r for r in getattr(d, table) if r["rollout_id"] == old]
        assume(rows)
        rows[_index(draw, rows, "row")]["rollout_id"] = new


def m_rename_call(d: Data, draw):
    i = _index(draw, d.ledger, "ledger row")
    row = d.ledger[i]
    new = _pick(draw, ID_POOL, "new id")
    where = _pick(draw, ("ledger", "tokens", "both", "parent_refs"), "where")
    old = row["call_id"]
    if where in ("ledger", "both", "parent_refs"):
        row["call_id"] = new
    if where in ("tokens", "both", "parent_refs"):
        for t in d.tokens:
            if t["rollout_id"] == row["rollout_id"] and t["call_id"] == old:
                t["call_id"] = new
    if where == "parent_refs":
        for r in d.ledger:
            if r["rollout_id"] == row["rollout_id"] and r["parent_id"] == old:
                r["parent_id"] = new


def m_duplicate(d: Data, draw):
    table = _pick(draw, TABLES, "table")
    rows = getattr(d, table)
    i = _index(draw, rows, "row")
    dup = copy.deepcopy(rows[i])
    if table == "rollouts" and draw(st.booleans(), label="other reward"):
        dup["reward"] = 0.125
    if table == "tokens" and draw(st.booleans(), label="other tokens"):
        dup["tokens"] = (dup["tokens"] or []) + [7]
    pos = draw(st.integers(i + 1, len(rows)), label="at")
    rows.insert(pos, dup)


def m_drop(d: Data, draw):
    table = _pick(draw, TABLES, "table")
    rows = getattr(d, table)
    del rows[_index(draw, rows, "row")]


def m_orphan(d: Data, draw):
    """Ids in one table only."""
    rid = _pick(draw, ("orphan", "", "wx", "\x00"), "rollout id")
    table = _pick(draw, TABLES, "table")
    if table == "ledger":
        d.ledger.append(dict(rollout_id=rid, call_id="c1", parent_id=None, response_id="r1",
                             prev_len=0, delta_len=1, gen_len=1, chain_hash=0, item_keys=[1],
                             item_ids=None, failed=False))
    elif table == "tokens":
        t = dict(rollout_id=rid, call_id=_pick(draw, ("c1", "nope"), "call"), tokens=[1, 2])
        if d.logprobs:
            t["logprobs"] = [0.0, -1.0]
        d.tokens.append(t)
    else:
        r = dict(rollout_id=rid, group_id="g", reward=1.0, output_keys=[1], output_ids=None,
                 terminal_response_id=None)
        if d.accepted:
            r["accepted_response_ids"] = None
        d.rollouts.append(r)


def m_lists(d: Data, draw):
    which = _pick(draw, ("item_keys", "item_ids", "output_keys", "output_ids"), "column")
    rows = d.ledger if which.startswith("item") else d.rollouts
    row = rows[_index(draw, rows, "row")]
    how = _pick(draw, ("empty", "null", "extra", "key", "id"), "how")
    cur = row[which]
    if how == "empty":
        row[which] = []
    elif how == "null":
        row[which] = None
    elif how == "extra":
        row[which] = (cur or []) + ([_pick(draw, KEY_POOL, "key")] if which.endswith("keys")
                                    else [_pick(draw, ID_POOL[:6], "id")])
    elif how == "key" and which.endswith("keys") and cur:
        cur[draw(st.integers(0, len(cur) - 1), label="pos")] = _pick(draw, KEY_POOL, "key")
    elif how == "id" and which.endswith("ids") and cur:
        cur[draw(st.integers(0, len(cur) - 1), label="pos")] = draw(
            st.sampled_from((None, "", "msg_1", "rs_1", "fc_1", "\x00")), label="id")


def m_parent(d: Data, draw):
    row = d.ledger[_index(draw, d.ledger, "ledger row")]
    same = [r["call_id"] for r in d.ledger if r["rollout_id"] == row["rollout_id"]]
    row["parent_id"] = draw(st.sampled_from([None, "ghost", "", row["call_id"]] + same), label="parent")


def m_response(d: Data, draw):
    row = d.ledger[_index(draw, d.ledger, "ledger row")]
    same = [r["response_id"] for r in d.ledger if r["rollout_id"] == row["rollout_id"]]
    row["response_id"] = draw(st.sampled_from(["", "\x00", "ghost"] + same), label="response")


def m_terminal(d: Data, draw):
    row = d.rollouts[_index(draw, d.rollouts, "rollouts row")]
    resp = [r["response_id"] for r in d.ledger if r["rollout_id"] == row["rollout_id"]]
    row["terminal_response_id"] = draw(st.sampled_from([None, "", "ghost"] + resp), label="terminal")


def m_accepted(d: Data, draw):
    assume(d.accepted)
    row = d.rollouts[_index(draw, d.rollouts, "rollouts row")]
    resp = [r["response_id"] for r in d.ledger if r["rollout_id"] == row["rollout_id"]]
    row["accepted_response_ids"] = draw(st.sampled_from(
        [None, [], [None], resp, resp[::-1], resp + resp[:1], ["ghost"]]), label="accepted")


def m_failed(d: Data, draw):
    d.ledger[_index(draw, d.ledger, "ledger row")]["failed"] = True


def m_reward(d: Data, draw):
    d.rollouts[_index(draw, d.rollouts, "rollouts row")]["reward"] = _pick(draw, FLOAT_POOL, "reward")


def m_group(d: Data, draw):
    row = d.rollouts[_index(draw, d.rollouts, "rollouts row")]
    row["group_id"] = draw(st.sampled_from([None, "", "g", "g2", "\x00", "x" * 3000]), label="group")


def m_shuffle(d: Data, draw):
    """Reorder rows without changing any rollout's capture order (output must not change)."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1), label="shuffle seed"))
    rng.shuffle(d.tokens)
    queues: dict = {}
    for r in d.ledger:
        queues.setdefault(r["rollout_id"], []).append(r)
    ledger, live = [], list(queues)
    while live:
        rid = rng.choice(live)
        ledger.append(queues[rid].pop(0))
        if not queues[rid]:
            live.remove(rid)
    d.ledger = ledger
    firsts: dict = {}
    for r in d.rollouts:
        firsts.setdefault(r["rollout_id"], []).append(r)
    keys = list(firsts)
    rng.shuffle(keys)
    d.rollouts = [r for k in keys for r in firsts[k]]


MUTATIONS = {f.__name__[2:]: f for f in (
    m_int_field, m_overflow, m_chain_hash, m_tokens, m_logprobs, m_rename_rollout, m_rename_call,
    m_duplicate, m_drop, m_orphan, m_lists, m_parent, m_response, m_terminal, m_accepted,
    m_failed, m_reward, m_group, m_shuffle)}


def draw_hostile(draw, max_mutations: int = 3) -> tuple[Data, list[str]]:
    kind = draw(st.integers(0, 3), label="base kind")
    seed = draw(st.integers(0, 10_000), label="base seed")
    data = base_data(kind, seed)
    names = draw(st.lists(st.sampled_from(sorted(MUTATIONS)), min_size=0, max_size=max_mutations),
                 label="mutations")
    for name in names:
        MUTATIONS[name](data, draw)
    return data, names


# ============================================================================ physical variants

def _fits(arr, t: pa.DataType) -> bool:
    if len(arr) == 0 or arr.null_count == len(arr):
        return True
    mm = pa.compute.min_max(arr).as_py()
    info = np.iinfo(t.to_pandas_dtype())
    return info.min <= mm["min"] and mm["max"] <= info.max


INT_TYPES = (pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64())


def _variant_column(table: pa.Table, col: str, draw) -> pa.Table:
    arr = table.column(col).combine_chunks()
    t = arr.type
    if pa.types.is_string(t):
        how = _pick(draw, ("large", "dict", "view"), f"{col} as")
        new = {"large": lambda: arr.cast(pa.large_string()),
               "dict": lambda: arr.dictionary_encode(),
               "view": lambda: arr.cast(pa.string_view())}[how]()
    elif pa.types.is_list(t):
        item = t.value_type
        if pa.types.is_string(item) and draw(st.booleans(), label=f"{col} large items"):
            item = pa.large_string()
        new = arr.cast(pa.large_list(item) if draw(st.booleans(), label=f"{col} large") else pa.list_(item))
    elif t == pa.int64():
        fitting = [x for x in INT_TYPES if _fits(arr, x)]
        if not fitting:
            return table
        new = arr.cast(_pick(draw, fitting, f"{col} as"))
    else:
        return table
    return set_column(table, col, new)


def apply_variants(tables: dict, draw) -> tuple[dict, dict]:
    """Accepted physical variations; returns (tables, write options)."""
    tables = dict(tables)
    for name in TABLES:
        t = tables[name]
        cols = draw(st.lists(st.sampled_from(t.column_names), max_size=3, unique=True),
                    label=f"{name} retyped")
        for col in cols:
            t = _variant_column(t, col, draw)
        if draw(st.booleans(), label=f"{name} extra columns"):
            n = t.num_rows
            t = t.append_column("extra_struct", pa.array([{"a": i, "b": [str(i)]} for i in range(n)]))
            t = t.append_column("__index_level_0__", pa.array(range(n), pa.int64()))
            t = t.append_column("binary_junk", pa.array([b"\xff\x00"] * n, pa.binary()))
        if draw(st.booleans(), label=f"{name} reversed columns"):
            t = t.select(t.column_names[::-1])
        tables[name] = t
    options = dict(
        compression=_pick(draw, ("snappy", "zstd", "none", "gzip", "lz4"), "codec"),
        use_dictionary=draw(st.booleans(), label="dictionary"),
        data_page_version=_pick(draw, ("1.0", "2.0"), "page version"),
    )
    rg = _pick(draw, (None, 1, 2, 3), "row group size")
    if rg:
        options["row_group_size"] = rg
    return tables, options


# ============================================================================ faults (exit 2)

WRONG_TYPES = {
    "int": (pa.float64(), pa.string(), pa.bool_()),
    "chain_hash": (pa.int64(), pa.float64(), pa.string()),
    "reward": (pa.float32(), pa.string(), pa.int64()),
    "failed": (pa.int8(), pa.string()),
    "string": (pa.binary(), pa.int64()),
    "list": (pa.list_(pa.int64()), pa.list_(pa.float64()), pa.string()),
}


def _wrong_array(arr: pa.Array, target: pa.DataType) -> pa.Array:
    n = len(arr)
    if pa.types.is_list(target):
        return pa.array([[1]] * n, target)
    if pa.types.is_string(target):
        return pa.array(["1"] * n, target)
    if pa.types.is_binary(target):
        return pa.array([b"x"] * n, target)
    if pa.types.is_boolean(target):
        return pa.array([True] * n, target)
    if pa.types.is_floating(target):
        return pa.array([1.0] * n, target)
    return pa.array([1] * n, target)


def _category(table_name: str, col: str, t: pa.DataType) -> str:
    if col in ("chain_hash", "reward", "failed"):
        return col
    if pa.types.is_list(t):
        return "list"
    if pa.types.is_string(t):
        return "string"
    return "int"


NOT_NULLABLE = {
    "ledger": ("rollout_id", "call_id", "response_id", "prev_len", "delta_len", "gen_len",
               "chain_hash", "failed"),
    "tokens": ("rollout_id", "call_id"),
    "rollouts": ("rollout_id",),
}
NO_NULL_ENTRIES = {"ledger": ("item_keys",), "tokens": ("tokens", "logprobs"),
                   "rollouts": ("output_keys",)}


def apply_fault(tables: dict, draw, root: Path) -> tuple[dict, list[str], dict]:
    """One kind of unusable input. Returns (tables, needles for the error line, layout)."""
    kind = _pick(draw, ("missing_table", "missing_column", "wrong_type", "null", "null_entry",
                        "uint64_over", "utf8", "dup_column", "not_parquet", "empty_file",
                        "truncated", "twice", "subdir", "logprobs_some_parts"), "fault")
    name = _pick(draw, TABLES, "fault table")
    t = tables[name]
    tables = dict(tables)
    layout: dict = {}
    needles = [f"error: {name}: "]
    if kind == "missing_table":
        tables[name] = None
        needles.append("table not found")
    elif kind in ("missing_column", "wrong_type", "dup_column"):
        required = [c for c in CANONICAL[name].names]
        col = _pick(draw, required, "column")
        if kind == "missing_column":
            tables[name] = t.drop_columns([col])
        elif kind == "dup_column":
            tables[name] = t.append_column(col, t.column(col))
        else:
            target = _pick(draw, WRONG_TYPES[_category(name, col, CANONICAL[name].field(col).type)], "type")
            if col in ("output_keys", "item_keys") and target == pa.list_(pa.int64()):
                target = pa.list_(pa.int32())
            tables[name] = set_column(t, col, _wrong_array(t.column(col), target))
        needles.append(repr(col))
    elif kind == "null":
        assume(t.num_rows > 0)
        col = _pick(draw, NOT_NULLABLE[name], "column")
        row = _index(draw, range(t.num_rows), "row")
        vals = t.column(col).to_pylist()
        vals[row] = None
        tables[name] = set_column(t, col, pa.array(vals, t.schema.field(col).type))
        needles.append(repr(col))
    elif kind == "null_entry":
        cols = [c for c in NO_NULL_ENTRIES[name] if c in t.column_names]
        col = _pick(draw, cols, "column")
        vals = t.column(col).to_pylist()
        rows = [i for i, v in enumerate(vals) if v]
        assume(rows)
        row = _pick(draw, rows, "row")
        vals[row][_index(draw, vals[row], "pos")] = None
        tables[name] = set_column(t, col, pa.array(vals, t.schema.field(col).type))
        needles.append(repr(col))
    elif kind == "uint64_over":
        assume(name == "ledger" and t.num_rows > 0)
        col = _pick(draw, ("prev_len", "delta_len", "gen_len"), "column")
        vals = [v if v >= 0 else 0 for v in t.column(col).to_pylist()]
        vals[_index(draw, vals, "row")] = INT64_MAX + 1 + draw(st.integers(0, 2**63 - 1), label="over")
        tables[name] = set_column(t, col, pa.array(vals, pa.uint64()))
        needles += [repr(col), "int64 range"]
    elif kind == "utf8":
        cols = [c for c in ("rollout_id", "call_id", "parent_id", "response_id", "group_id",
                            "terminal_response_id") if c in t.column_names]
        col = _pick(draw, cols, "column")
        assume(t.num_rows > 0)
        row = _index(draw, range(t.num_rows), "row")
        tables[name] = set_column(t, col, invalid_utf8(t.column(col).combine_chunks(), row))
        needles += [repr(col), "UTF-8"]
    elif kind == "not_parquet":
        tables[name] = b"rollout_id,call_id\nr,c\n"
        needles.append("unreadable Parquet file")
    elif kind == "empty_file":
        tables[name] = b""
        needles.append("unreadable Parquet file")
    elif kind == "truncated":
        path = root.parent / f".{name}-full.parquet"
        pq.write_table(t, path)
        data = path.read_bytes()
        path.unlink()
        keep = draw(st.integers(0, len(data) - 1), label="keep bytes")
        tables[name] = data[:keep]
        needles.append("unreadable Parquet file")
    elif kind == "twice":
        layout["twice"] = name
        needles.append("table stored twice")
    elif kind == "subdir":
        layout["subdir"] = name
        needles.append("subdirectory")
    elif kind == "logprobs_some_parts":
        assume(name == "tokens" and "logprobs" in t.column_names and t.num_rows >= 2)
        layout["lp_parts"] = True
        needles.append("'logprobs'")
    return tables, needles, layout


def write_case(root: Path, tables: dict, options: dict, layout: dict, parts: dict) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in TABLES:
        t = tables[name]
        if layout.get("lp_parts") and name == "tokens":
            folder = root / "tokens"
            folder.mkdir()
            half = t.num_rows // 2
            pq.write_table(t.slice(0, half), folder / "part-0.parquet", **options)
            pq.write_table(t.slice(half).drop_columns(["logprobs"]), folder / "part-1.parquet", **options)
            continue
        twice = layout.get("twice") == name
        write_table(root, name, t, parts=1 if twice else parts.get(name, 1), **options)
        if twice:
            (root / name).mkdir(exist_ok=True)
            pq.write_table(tables[name], root / name / "part-0.parquet")
        if layout.get("subdir") == name:
            folder = root / name
            if not folder.exists():
                folder.mkdir()
                (root / f"{name}.parquet").rename(folder / "part-0.parquet")
            (folder / "nested").mkdir()
    return root


# ============================================================================ the oracle

def draw_options(draw) -> dict:
    return dict(mode=_pick(draw, ("cc", "cc", "ordinary"), "mode"),
                placeholders=draw(st.booleans(), label="placeholders"),
                baseline=_pick(draw, ("mean", "loo"), "baseline"),
                no_std=draw(st.booleans(), label="no_std"),
                baseline_population=_pick(draw, ("all", "ok"), "population"),
                row_weight=_pick(draw, ("rollout", "row"), "row_weight"))


def _std_if_huge(d: Data, opts: dict) -> dict:
    """--no-std with rewards where float64 sums round off more than the comparison's tolerance
    (docs/limits.md: the engine sums the group mean in float64, the reference exactly)."""
    huge = any(r.get("reward") is not None and math.isfinite(r["reward"]) and abs(r["reward"]) > 1e6
               for r in d.rollouts)
    return dict(opts, no_std=False) if huge else opts


# ============================================================================ CLI fuzzing

@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_cli_hostile_tables(cli, tmp_path_factory, data):
    """Hostile values, accepted physical variants and at most one unusable-input fault, written
    as Parquet and fed to the CLI: a correct result or a one-line exit 2, nothing else."""
    draw = data.draw
    d, names = draw_hostile(draw)
    note(f"mutations: {names}")
    tables = build_tables(d)
    tables, wopts = apply_variants(tables, draw)
    root = tmp_path_factory.mktemp("case") / "data"
    root.mkdir()
    fault = draw(st.integers(0, 9), label="fault?") < 3
    needles, layout = [], {}
    if fault:
        tables, needles, layout = apply_fault(tables, draw, root)
    parts = {n: _pick(draw, (1, 1, 2, 3), f"{n} parts") for n in TABLES}
    write_case(root, tables, wopts, layout, parts)
    opts = _std_if_huge(d, draw_options(draw))
    extra = []
    buckets = _pick(draw, (None, None, 2, 3), "buckets")
    if buckets:
        extra += ["--buckets", buckets]
    if draw(st.booleans(), label="one thread"):
        extra += ["--threads", 1]
    out = root.parent / "out"
    res = cli.run("reassemble", root, out, *option_args(opts), *extra)
    note(str(res))
    if fault:
        assert_clean_error(res, *needles)
        assert no_outputs(out)
        return
    assert_ran(res)
    rows, report = read_output(out)
    check_against_oracle(f"mutations={names}", root, rows, report, opts)


# ============================================================================ engine fuzzing

def _normalized(tables: dict):
    """The tables as the reader would return them (null lists -> empty etc.), for the oracle."""
    from chainrows.formats.native.dataset import Dataset, normalize, validate_schema

    out = {n: normalize(n, t, validate_schema(n, t.schema)) for n, t in tables.items()}
    return Dataset(out["ledger"], out["tokens"], out["rollouts"], {})


@settings(FUZZ, max_examples=examples(1.5))
@given(data=st.data())
def test_engine_hostile_tables(data):
    """``chainrows.reassemble`` on hostile Arrow tables (no Parquet in between): every output row
    equals the reference's; unusable tables raise InputError and nothing else."""
    draw = data.draw
    d, names = draw_hostile(draw)
    note(f"mutations: {names}")
    tables = build_tables(d)
    tables, _ = apply_variants(tables, draw)
    opts = _std_if_huge(d, draw_options(draw))
    if draw(st.integers(0, 9), label="fault?") < 2:
        kind = _pick(draw, ("null", "utf8", "wrong_type", "missing_column"), "fault")
        name = _pick(draw, TABLES, "table")
        t = tables[name]
        if kind == "missing_column":
            tables[name] = t.drop_columns([_pick(draw, CANONICAL[name].names, "column")])
        elif kind == "wrong_type":
            col = _pick(draw, CANONICAL[name].names, "column")
            target = _pick(draw, WRONG_TYPES[_category(name, col, CANONICAL[name].field(col).type)], "type")
            tables[name] = set_column(t, col, _wrong_array(t.column(col), target))
        else:
            assume(t.num_rows > 0)
            col = _pick(draw, ("rollout_id",) if kind == "utf8" else NOT_NULLABLE[name], "column")
            row = _index(draw, range(t.num_rows), "row")
            if kind == "utf8":
                arr = invalid_utf8(t.column(col).combine_chunks(), row)
            else:
                vals = t.column(col).to_pylist()
                vals[row] = None
                arr = pa.array(vals, t.schema.field(col).type)
            tables[name] = set_column(t, col, arr)
        with pytest.raises(InputError) as err:
            reassemble(tables["ledger"], tables["tokens"], tables["rollouts"], mode=opts["mode"])
        assert "\n" not in str(err.value) and str(err.value).startswith(f"{name}: ")
        return
    result = reassemble(tables["ledger"], tables["tokens"], tables["rollouts"], **opts)
    ds = _normalized(tables)
    want_rows, want_report = oracle(ds, opts)
    compare_outputs(f"mutations={names}", result.rows.to_pylist(), result.report.to_pylist(),
                    want_rows, want_report)
    problems = reconcile(ds, result.rows, result.report)
    assert not problems, "\n".join(problems)


# ============================================================================ byte corruption

@pytest.fixture(scope="module")
def small_synth(tmp_path_factory):
    from chainrows.synth import write_synth_dataset

    root = tmp_path_factory.mktemp("synth") / "data"
    write_synth_dataset(root, 24, seed=11, corrupt_rate=0.3, mean_gen_tokens=40, prompt_tokens=60)
    return root


CODECS = ("snappy", "zstd", "none", "gzip")


@pytest.mark.slow
@settings(FUZZ, max_examples=examples(0.8))
@given(data=st.data())
def test_cli_corrupted_parquet_bytes(cli, small_synth, tmp_path_factory, data):
    """Flip, overwrite or cut bytes of a real dataset's Parquet files: the CLI either reports
    an unreadable file (exit 2, one line naming table and file) or, when the damaged bytes
    still decode, its output is exactly what the reference decides on what the reader reads."""
    draw = data.draw
    root = tmp_path_factory.mktemp("bytes") / "data"
    root.mkdir()
    codec = _pick(draw, CODECS, "codec")
    page = _pick(draw, ("1.0", "2.0"), "page version")
    for name in TABLES:
        t = pq.read_table(small_synth / f"{name}.parquet")
        pq.write_table(t, root / f"{name}.parquet", compression=codec, data_page_version=page,
                       row_group_size=_pick(draw, (None, 16, 64), f"{name} row groups"))
    name = _pick(draw, TABLES, "table")
    path = root / f"{name}.parquet"
    raw = bytearray(path.read_bytes())
    how = _pick(draw, ("flip", "flip", "overwrite", "truncate", "zero", "footer"), "how")
    n = len(raw)
    if how == "flip":
        for _ in range(draw(st.integers(1, 4), label="flips")):
            pos = draw(st.integers(0, n - 1), label="pos")
            raw[pos] ^= 1 << draw(st.integers(0, 7), label="bit")
    elif how == "overwrite":
        pos = draw(st.integers(0, n - 1), label="pos")
        junk = draw(st.binary(min_size=1, max_size=16), label="junk")
        raw[pos:pos + len(junk)] = junk
    elif how == "truncate":
        raw = raw[:draw(st.integers(0, n - 1), label="keep")]
    elif how == "zero":
        pos = draw(st.integers(0, n - 1), label="pos")
        raw[pos:pos + draw(st.integers(1, 256), label="len")] = bytes(min(256, n - pos))[: n - pos]
        raw = raw[:n]
    else:  # inside the footer (metadata: row counts, offsets, types)
        pos = n - 8 - draw(st.integers(1, min(400, n - 9)), label="from end")
        raw[pos] = draw(st.integers(0, 255), label="byte")
    path.write_bytes(bytes(raw))
    # damaged bytes can decode to any reward: advantages saturate, but --no-std on huge rewards
    # is exact only to float64 rounding (_std_if_huge), so these runs keep the std path
    opts = dict(draw_options(draw), no_std=False)
    buckets = _pick(draw, (None, 3), "buckets")
    out = root.parent / "out"
    res = cli.run("reassemble", root, out, *option_args(opts), *(["--buckets", buckets] if buckets else []))
    note(f"{how} {name} {codec} page {page}\n{res}")
    if res.rc == 2:
        assert_clean_error(res, f"error: {name}: ", str(path))
        return
    assert_ran(res)
    rows, report = read_output(out)
    check_against_oracle(f"{how} {name}", root, rows, report, opts)


@pytest.mark.slow
def test_damaged_pages_read_alike_on_every_path(small_synth, tmp_path):
    """No page checksums: a flipped bit in a data page may still decode, to other values. The
    whole-table read (the in-memory path, the oracle above) and the record batches the stream
    and spill paths read must then see the same rows, or both refuse the file. (A read a row
    group at a time restarted the list columns' decoding at each group: a flip at byte 6,763 of
    a 64-row-group ledger moved item_ids by one row from row 64 on, where the batches did not.)"""
    from chainrows.formats.native.dataset import iter_table_batches, read_table

    src = pq.read_table(small_synth / "ledger.parquet")
    clean = tmp_path / "clean.parquet"
    pq.write_table(src, clean, compression="snappy", data_page_version="1.0", row_group_size=64)
    raw = clean.read_bytes()
    rng = random.Random(5)
    root = tmp_path / "data"
    root.mkdir()
    for name in ("tokens", "rollouts"):
        shutil.copy(small_synth / f"{name}.parquet", root / f"{name}.parquet")
    decoded = 0
    for flip in [(6763, 1)] + [(rng.randrange(4, len(raw) - 8), rng.randrange(8)) for _ in range(300)]:
        damaged = bytearray(raw)
        damaged[flip[0]] ^= 1 << flip[1]
        (root / "ledger.parquet").write_bytes(bytes(damaged))
        try:
            whole = read_table(root, "ledger")
        except InputError:
            whole = None
        try:
            batches = pa.Table.from_batches(list(iter_table_batches(root, "ledger", batch_rows=37)))
        except InputError:
            batches = None
        assert (whole is None) == (batches is None), flip
        if whole is not None:
            decoded += 1
            assert whole.to_pylist() == batches.to_pylist(), flip
    assert decoded > 100  # most flips still decode: the comparison ran


# ============================================================================ Batch guard

def _second_buffer_first(b):
    """Two buffers (the same data twice), tok_order's first call moved to the second one."""
    b.tokens = (b.tokens[0], b.tokens[0])
    b.logprobs = (b.logprobs[0], b.logprobs[0])
    b.tok_chunk[b.tok_order[0]] = 1


@pytest.mark.parametrize("threads", [1, 2])
def test_batch_validate_refuses_out_of_bounds_arrays(threads):
    """Every offset or index that would let a kernel (no bounds checks) leave its buffer is
    refused by Batch.validate with a ValueError naming the array, at 1 and 2 threads (the
    indices and the token rows checked side by side); with one fault in each of those halves,
    the indices' error comes, as in order."""
    import numba

    from chainrows.engine.run import decide
    from chainrows.lowering.columnar import build_batch

    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"needs {threads} threads")
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        _validate_cases(decide, build_batch)
    finally:
        numba.set_num_threads(before)


def _validate_cases(decide, build_batch):

    tables = build_tables(base_data(2, 1))
    good, _ = build_batch(tables["ledger"], tables["tokens"], tables["rollouts"])
    decide(copy.deepcopy(good))

    def bump(name, i, value):
        def f(b):
            getattr(b, name)[i] = value
        return f

    def replace(name, value):
        return lambda b: setattr(b, name, value)

    C = good.num_calls
    cases = {
        "tok_stop past the buffer": (bump("tok_stop", C - 1, len(good.tokens[0]) + 1), "tok_start/tok_stop"),
        "tok_start negative": (bump("tok_start", 0, -5), "tok_start/tok_stop"),
        "tok_stop before tok_start": (bump("tok_stop", 0, good.tok_start[0] - 1), "tok_start/tok_stop"),
        "lp_stop past the buffer": (bump("lp_stop", 0, len(good.logprobs[0]) + 7), "lp_start/lp_stop"),
        "tok_chunk past the buffers": (bump("tok_chunk", 0, 1), "tok_chunk"),
        "tok_chunk negative": (bump("tok_chunk", 0, -1), "tok_chunk"),
        "tokens not a tuple": (replace("tokens", good.tokens[0]), "tokens"),
        "fewer logprobs buffers": (replace("logprobs", ()), "tokens/logprobs"),
        "tokens buffer dtype": (replace("tokens", (good.tokens[0].astype(np.int64),)), "tokens"),
        "tok_order not by buffer": (_second_buffer_first, "tok_order: must list the calls buffer by buffer"),
        "call_off end": (bump("call_off", -1, C + 1), "call_off"),
        "call_off decreasing": (bump("call_off", 1, good.call_off[2] + 1), "call_off"),
        "key_off end": (bump("key_off", -1, len(good.item_keys) + 1), "key_off"),
        "out_off start": (bump("out_off", 0, 1), "out_off"),
        "parent in another rollout": (bump("parent", C - 1, 0), "parent: index outside its rollout's calls"),
        "parent past the calls": (bump("parent", 1, C + 3), "parent: index outside its rollout's calls"),
        "parent bad sentinel": (bump("parent", 1, -7), "parent: invalid sentinel"),
        "terminal past the calls": (bump("terminal", 0, C), "terminal"),
        "cand_call outside": (bump("cand_call", 0, C), "cand_call: index outside its rollout's calls"),
        "cand_len off by one": (bump("cand_len", 0, good.cand_len[0] + 1), "cand_len: differs from the call's item count"),
        "lp_start negative": (bump("lp_start", 0, -5), "lp_start/lp_stop"),
        "group outside": (bump("group", 0, 10_000), "group"),
        "tok_order outside": (bump("tok_order", 0, C), "tok_order: index outside [0, num_calls)"),
        "tok_order repeats a call": (bump("tok_order", 1, good.tok_order[0]), "tok_order: must list every call with a token row exactly once"),
        "tok_order misses a call": (replace("tok_order", good.tok_order[1:].copy()), "tok_order: must list every call with a token row exactly once"),
        "short per-call array": (replace("gen_len", good.gen_len[:-1].copy()), "gen_len"),
        "wrong dtype": (replace("delta_len", good.delta_len.astype(np.int32)), "delta_len"),
        "not contiguous": (replace("prev_len", np.repeat(good.prev_len, 2)[::2]), "prev_len"),
        "2-D": (replace("chain_hash", good.chain_hash.reshape(1, -1)), "chain_hash"),
        "item_ids past the outputs": (bump("item_ids", 0, len(good.out_keys)), "item_ids"),
        "item_ids below the sentinels": (bump("item_ids", 0, -3), "item_ids"),
        "out_ids past the outputs": (bump("out_ids", 0, 2**40), "out_ids"),
        "out_ids below null": (bump("out_ids", 0, -2), "out_ids"),
    }
    if len(good.acc_call):
        cases["acc_call outside"] = (bump("acc_call", 0, C + 1), "acc_call")
    for what, (edit, needle) in cases.items():
        b = copy.deepcopy(good)
        edit(b)
        with pytest.raises(ValueError) as err:
            decide(b)
        assert needle in str(err.value), f"{what}: {err.value}"
    token_side = ["tok_stop past the buffer", "lp_start negative", "tok_order outside", "tok_chunk past the buffers"]
    index_side = ["call_off decreasing", "parent in another rollout", "cand_len off by one", "out_ids past the outputs"]
    for tok_fault, index_fault in zip(token_side, index_side):
        b = copy.deepcopy(good)
        cases[tok_fault][0](b)
        cases[index_fault][0](b)
        with pytest.raises(ValueError) as err:
            decide(b)
        assert cases[index_fault][1] in str(err.value), f"{index_fault} with {tok_fault}: {err.value}"


_BATCH_SNIPPET = """
import copy, json
import numpy as np
from tests.support.tables import base_data, build_tables
from chainrows.engine.run import decide, gather_rows
from chainrows.lowering.columnar import build_batch
from chainrows.options import Options
spec = json.loads({spec!r})
tables = build_tables(base_data(spec["kind"], spec["seed"]))
batch, _ = build_batch(tables["ledger"], tables["tokens"], tables["rollouts"])
for name, pos, value in spec["edits"]:
    arr = getattr(batch, name).copy()  # the batch holds read-only views of Arrow buffers
    setattr(batch, name, arr)
    if len(arr):
        arr[pos % len(arr)] = np.array(value).astype(arr.dtype)
try:
    options = Options(mode=spec["mode"], placeholders=spec["placeholders"])
    dec = decide(batch, options)
    gather_rows(batch, dec, options)
    rc = 0
except ValueError:
    rc = 3
"""

_INDEX_FIELDS = ("call_off", "out_off", "acc_off", "cand_off", "key_off", "parent", "terminal",
                 "acc_call", "cand_call", "tok_start", "tok_stop", "tok_order", "lp_start", "lp_stop", "group",
                 "prev_len", "delta_len", "gen_len", "out_ids", "item_ids")


@settings(FUZZ, max_examples=examples(0.6))
@given(data=st.data())
def test_corrupted_batch_never_crashes(cli, data):
    """Random values in the Batch's index arrays: validate refuses them (ValueError) or the
    kernels run to the end; never a crash or a hang (run in the worker)."""
    draw = data.draw
    spec = {
        "kind": draw(st.integers(0, 3), label="kind"), "seed": draw(st.integers(0, 100), label="seed"),
        "mode": _pick(draw, ("cc", "ordinary"), "mode"), "placeholders": draw(st.booleans(), label="ph"),
        "edits": draw(st.lists(st.tuples(
            st.sampled_from(_INDEX_FIELDS), st.integers(0, 1000),
            st.sampled_from((-3, -2, -1, 0, 1, 2, 5, 40, 1000, 2**40, INT64_MAX, INT64_MIN))),
            min_size=1, max_size=3), label="edits"),
    }
    res = cli.exec(_BATCH_SNIPPET.format(spec=json.dumps(spec)), timeout=60)
    assert res.rc in (0, 3), f"{spec}\n{res}"


# ============================================================================ the corpus

_TYPES = {"uint64": pa.uint64(), "int64": pa.int64(), "int32": pa.int32(), "float32": pa.float32(),
          "float64": pa.float64(), "string": pa.string(), "large_string": pa.large_string(),
          "list<int64>": pa.list_(pa.int64()), "list<int32>": pa.list_(pa.int32()),
          "large_list<int32>": pa.large_list(pa.int32()), "bool": pa.bool_()}


def corpus_tables(spec: dict) -> dict:
    sch = schemas(spec["logprobs"], spec["accepted"])
    out = {}
    for name in TABLES:
        rows = spec["tables"][name]
        arrays, fields = [], []
        for f in sch[name]:
            key = f"{name}.{f.name}"
            if key in spec["drop"]:
                continue
            t = _TYPES[spec["types"][key]] if key in spec["types"] else f.type
            values = [r.get(f.name) for r in rows]
            if any(isinstance(v, dict) and "$bytes" in v for v in values):
                raw = [None if v is None else bytes.fromhex(v["$bytes"]) if isinstance(v, dict)
                       else v.encode() for v in values]
                b = pa.array(raw, pa.binary())
                arr = pa.Array.from_buffers(pa.string(), len(b), b.buffers(), null_count=b.null_count)
            else:
                arr = pa.array(values, t)
            arrays.append(arr)
            fields.append(pa.field(f.name, arr.type))
        out[name] = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    return out


def _corpus_cases():
    cases = sorted(p for p in CORPUS.glob("*.json"))
    cases += sorted(p for p in CORPUS.iterdir() if p.is_dir() and (p / "expect.json").exists())
    return cases


def _options_of(args: list[str]) -> dict:
    opts = dict(mode="cc", placeholders=False, baseline="mean", no_std=False, baseline_population="all",
                row_weight="rollout")
    it = iter(args)
    for a in it:
        if a == "--placeholders":
            opts["placeholders"] = True
        elif a == "--no-std":
            opts["no_std"] = True
        elif a in ("--mode", "--baseline", "--baseline-population", "--row-weight"):
            opts[{"--mode": "mode", "--baseline": "baseline", "--baseline-population": "baseline_population",
                  "--row-weight": "row_weight"}[a]] = next(it)
        else:
            next(it, None)  # --buckets N, --threads N: no effect on the result
    return opts


@pytest.mark.parametrize("path", _corpus_cases(), ids=lambda p: p.stem)
def test_corpus(cli, tmp_path, path):
    """Replay the regression corpus (tests/robustness/corpus/, see make_corpus.py for the format)."""
    if path.is_dir():
        spec = json.loads((path / "expect.json").read_text())
        data, runs = path, spec["runs"]
    else:
        spec = json.loads(path.read_text())
        data = write_dir(tmp_path / "data", corpus_tables(spec))
        runs = [spec["args"]]
    expect = spec["expect"]
    for i, args in enumerate(runs):
        out = tmp_path / f"out{i}"
        res = cli.run("reassemble", data, out, *args)
        if expect["exit"] == 2:
            assert_clean_error(res, *expect["stderr"])
            assert not (out / "report.parquet").exists()
            continue
        assert_ran(res)
        rows, report = read_output(out)
        got = {r["rollout_id"]: [r["status"], r["reason"]] for r in report.to_pylist()}
        assert got == expect["report"], f"{path.stem}: {got}"
        check_against_oracle(path.stem, data, rows, report, _options_of(args))
