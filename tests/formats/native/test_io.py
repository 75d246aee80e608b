"""chainrows.io: dataset reading (SPEC §2), InputError messages, atomic output writing (§4, §7)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numba
import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from chainrows.errors import InputError
from chainrows.formats.native import dataset as dsmod
from chainrows.formats.native.dataset import (
    Dataset,
    iter_table_batches,
    plan_table,
    read_dataset,
    read_table,
    table_files,
    table_schema,
    validate_schema,
)
from chainrows.formats.native.schema import (
    ACCEPTED_FIELD,
    LEDGER_SCHEMA,
    LOGPROBS_FIELD,
    REPORT_SCHEMA,
    ROLLOUTS_SCHEMA,
    TOKENS_SCHEMA,
    rows_schema,
    tables_from_pylists,
)
from chainrows.formats.native.write import write_dataset, write_dataset_atomic
from chainrows.lowering.rowgroups import PartsWriter, RowGroupWriter
from chainrows.outdir import atomic as wmod
from chainrows.outdir.atomic import AtomicOutput, clean_stale_temp_dirs
from chainrows.outdir.parquet import WRITE_OPTIONS
from tests.support.builders import scribble_pages
from tests.support.paths import REPO

# ----------------------------------------------------------------------------- fixtures

def _ledger_rows(n_rollouts=2):
    rows = []
    for r in range(n_rollouts):
        rows += [
            dict(rollout_id=f"r{r}", call_id="c1", parent_id=None, response_id="resp1", prev_len=0,
                 delta_len=3, gen_len=1, chain_hash=2**64 - 1 - r, item_keys=[11, 12],
                 item_ids=["a", None], failed=False),
            dict(rollout_id=f"r{r}", call_id="c2", parent_id="c1", response_id="resp2", prev_len=3,
                 delta_len=2, gen_len=2, chain_hash=5, item_keys=[13], item_ids=None, failed=False),
        ]
    return rows


def _token_rows(n_rollouts=2, logprobs=True):
    rows = []
    for r in range(n_rollouts):
        rows += [dict(rollout_id=f"r{r}", call_id="c1", tokens=[1, 2, 3], logprobs=[0.0, 0.0, -1.0]),
                 dict(rollout_id=f"r{r}", call_id="c2", tokens=[4, 5], logprobs=[-0.5, -0.5])]
    if not logprobs:
        for row in rows:
            del row["logprobs"]
    return rows


def _rollout_rows(n_rollouts=2, accepted=False):
    rows = [dict(rollout_id=f"r{r}", group_id="g", reward=float(r), output_keys=[11, 12, 13],
                 output_ids=["a", None, None], terminal_response_id="resp2")
            for r in range(n_rollouts)]
    if accepted:
        for row in rows:
            row["accepted_response_ids"] = ["resp1", "resp2"]
    return rows


def _tables(logprobs=True, accepted=False):
    return tables_from_pylists(_ledger_rows(), _token_rows(logprobs=logprobs),
                               _rollout_rows(accepted=accepted))


@pytest.fixture
def ds_dir(tmp_path):
    """A valid dataset, one file per table."""
    root = tmp_path / "ds"
    write_dataset(root, *_tables())
    return root


def _replace_column(table: pa.Table, name: str, array) -> pa.Table:
    i = table.schema.get_field_index(name)
    arr = array if isinstance(array, (pa.Array, pa.ChunkedArray)) else pa.array(array)
    return table.set_column(i, pa.field(name, arr.type), arr)


def _write(path: Path, table: pa.Table) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def _err(fn, *args, **kwargs) -> str:
    with pytest.raises(InputError) as info:
        fn(*args, **kwargs)
    text = str(info.value)
    assert "\n" not in text, "InputError must be one line"
    return text


# ----------------------------------------------------------------------------- happy path

def test_roundtrip_gives_canonical_tables(ds_dir):
    ledger, tokens, rollouts = _tables()
    d = read_dataset(ds_dir)
    assert isinstance(d, Dataset)
    assert d.ledger.schema == LEDGER_SCHEMA and d.ledger.equals(ledger)
    assert d.tokens.schema == TOKENS_SCHEMA.append(LOGPROBS_FIELD) and d.tokens.equals(tokens)
    assert d.rollouts.schema == ROLLOUTS_SCHEMA and d.rollouts.equals(rollouts)
    # exactly canonical, list field names included (Parquet round trips may say "element")
    assert str(d.ledger.schema) == str(LEDGER_SCHEMA)
    assert str(d.rollouts.schema) == str(ROLLOUTS_SCHEMA)
    assert d.has_logprobs and not d.has_accepted
    assert d.files == {n: [ds_dir / f"{n}.parquet"] for n in ("ledger", "tokens", "rollouts")}
    assert "logprobs" in table_schema(ds_dir, "tokens").names


def test_optional_columns_absent_and_present(tmp_path):
    write_dataset(tmp_path, *_tables(logprobs=False, accepted=True))
    d = read_dataset(tmp_path)
    assert not d.has_logprobs and d.has_accepted
    assert d.tokens.schema == TOKENS_SCHEMA
    assert d.rollouts.schema == ROLLOUTS_SCHEMA.append(ACCEPTED_FIELD)
    assert "logprobs" not in table_schema(tmp_path, "tokens").names


def test_extra_columns_ignored(ds_dir):
    ledger = _tables()[0].append_column("notes", pa.array(["x"] * 4)).append_column(
        "delta_len_v2", pa.array(["bad type, unused"] * 4))
    _write(ds_dir / "ledger.parquet", ledger)
    out = read_table(ds_dir, "ledger")
    assert out.schema == LEDGER_SCHEMA


def test_columns_subset_reads_and_checks_only_those(ds_dir):
    ledger = _replace_column(_tables()[0], "item_ids", pa.array([1, 2, 3, 4]))  # bad, unread
    _write(ds_dir / "ledger.parquet", ledger)
    out = read_table(ds_dir, "ledger", columns=["call_id", "rollout_id"])
    assert out.column_names == ["rollout_id", "call_id"]  # canonical order
    assert "item_ids" in _err(read_table, ds_dir, "ledger")
    with pytest.raises(ValueError, match="unknown ledger column"):
        read_table(ds_dir, "ledger", columns=["nope"])


def test_table_schema_reads_footers_only(ds_dir):
    assert table_schema(ds_dir, "tokens") == TOKENS_SCHEMA.append(LOGPROBS_FIELD)
    assert table_schema(ds_dir, "rollouts", columns=["reward"]).names == ["reward"]


# ----------------------------------------------------------------------------- file layout

def test_missing_dataset_dir(tmp_path):
    msg = _err(read_dataset, tmp_path / "nope")
    assert msg.startswith("dataset directory") and "nope" in msg and "does not exist" in msg  # no table: it is all of them


def test_missing_table(ds_dir):
    (ds_dir / "tokens.parquet").unlink()
    msg = _err(read_dataset, ds_dir)
    assert msg == (f"tokens: table not found: expected tokens.parquet or a directory tokens/ "
                   f"(directory {ds_dir})")


def test_table_name_is_a_file_not_a_directory(ds_dir):
    (ds_dir / "tokens.parquet").rename(ds_dir / "tokens")
    msg = _err(table_files, ds_dir, "tokens")
    assert "table not found" in msg and "a file, expected a directory" in msg


def test_both_file_and_directory(ds_dir):
    _write(ds_dir / "ledger" / "part-0.parquet", _tables()[0])
    msg = _err(read_dataset, ds_dir)
    assert msg == (f"ledger: table stored twice: both ledger.parquet and ledger/ exist; keep one "
                   f"(directory {ds_dir})")


def test_directory_order_and_hidden_files(ds_dir):
    ledger = _tables()[0]
    (ds_dir / "ledger.parquet").unlink()
    d = ds_dir / "ledger"
    # lexicographic by name: "part-10" < "part-9"; hidden / underscore names skipped
    _write(d / "part-9.parquet", ledger.slice(2, 2))
    _write(d / "part-10.parquet", ledger.slice(0, 2))
    _write(d / "_common_metadata", ledger)            # skipped
    (d / "_SUCCESS").write_bytes(b"")                  # skipped (not Parquet)
    (d / ".part-9.parquet.crc").write_bytes(b"junk")  # skipped (not Parquet)
    (d / "_tmp").mkdir()                               # skipped directory
    assert [p.name for p in table_files(ds_dir, "ledger")] == ["part-10.parquet", "part-9.parquet"]
    assert read_table(ds_dir, "ledger").equals(ledger)
    assert read_dataset(ds_dir).files["ledger"] == [d / "part-10.parquet", d / "part-9.parquet"]


def test_single_name_parquet_may_be_a_directory(ds_dir):
    ledger = _tables()[0]
    (ds_dir / "ledger.parquet").unlink()
    _write(ds_dir / "ledger.parquet" / "part-00000.parquet", ledger.slice(0, 1))
    _write(ds_dir / "ledger.parquet" / "part-00001.parquet", ledger.slice(1))
    (ds_dir / "ledger.parquet" / "_SUCCESS").write_bytes(b"")
    assert read_table(ds_dir, "ledger").equals(ledger)


def test_empty_directory_is_an_empty_table(ds_dir):
    (ds_dir / "tokens.parquet").unlink()
    (ds_dir / "tokens").mkdir()
    (ds_dir / "tokens" / ".keep").write_bytes(b"")
    out = read_table(ds_dir, "tokens")
    assert out.num_rows == 0 and out.schema == TOKENS_SCHEMA
    assert list(iter_table_batches(ds_dir, "tokens")) == []
    assert "logprobs" not in table_schema(ds_dir, "tokens").names


def test_subdirectory_in_table_directory(ds_dir):
    (ds_dir / "ledger.parquet").unlink()
    _write(ds_dir / "ledger" / "a.parquet", _tables()[0])
    (ds_dir / "ledger" / "date=2024").mkdir()
    msg = _err(read_table, ds_dir, "ledger")
    assert msg.startswith("ledger: unexpected subdirectory 'date=2024'")
    assert msg.endswith(f"(directory {ds_dir / 'ledger'})")


def test_non_parquet_file(ds_dir):
    (ds_dir / "ledger.parquet").unlink()
    _write(ds_dir / "ledger" / "a.parquet", _tables()[0])
    (ds_dir / "ledger" / "b.json").write_text('{"not": "parquet"}')
    msg = _err(read_table, ds_dir, "ledger")
    assert msg.startswith("ledger: unreadable Parquet file: ")
    assert msg.endswith(f"(file {ds_dir / 'ledger' / 'b.json'})")


@pytest.mark.parametrize("keep", [0.5, 0.0, 0.9])
def test_truncated_parquet_file(ds_dir, keep):
    path = ds_dir / "tokens.parquet"
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    msg = _err(read_dataset, ds_dir)
    assert msg.startswith("tokens: unreadable Parquet file: ") and msg.endswith(f"(file {path})")


def test_corrupt_data_pages_after_good_footer(tmp_path):
    ledger = tables_from_pylists(_ledger_rows(200), [], [])[0]
    path = tmp_path / "ledger.parquet"
    pq.write_table(ledger, path, compression="zstd")
    scribble_pages(path)
    assert validate_schema("ledger", pq.read_schema(path), path)  # footer still fine
    msg = _err(read_table, tmp_path, "ledger")
    assert msg.startswith("ledger: unreadable Parquet file: ") and msg.endswith(f"(file {path})")
    msg = _err(lambda: list(iter_table_batches(tmp_path, "ledger")))
    assert msg.endswith(f"(file {path})")


def test_all_schemas_checked_before_data(ds_dir, monkeypatch):
    (ds_dir / "ledger.parquet").unlink()
    good, bad = _tables()[0], _replace_column(_tables()[0], "call_id", pa.array([1, 2, 3, 4]))
    _write(ds_dir / "ledger" / "a.parquet", good)
    _write(ds_dir / "ledger" / "b.parquet", bad)
    read_calls = []
    monkeypatch.setattr(dsmod, "_read_file", lambda *a: read_calls.append(a))
    msg = _err(read_dataset, ds_dir)
    assert "column 'call_id' has type int64" in msg and read_calls == []
    gen = iter_table_batches(ds_dir, "ledger")
    assert "b.parquet" in _err(next, gen)  # fails before yielding a.parquet's batches


# ----------------------------------------------------------------------------- types

def _ledger(**replace):
    t = _tables()[0]
    for name, arr in replace.items():
        t = _replace_column(t, name, arr)
    return t


WRONG_TYPES = [
    ("ledger", "delta_len", pa.array(["3", "2", "3", "2"]), "string", "an integer type"),
    ("ledger", "prev_len", pa.array([0.0, 3.0, 0.0, 3.0]), "double", "an integer type"),
    ("ledger", "gen_len", pa.array([True, True, True, True]), "bool", "an integer type"),
    ("ledger", "chain_hash", pa.array([1, 2, 3, 4], pa.int64()), "int64", "uint64"),
    ("ledger", "chain_hash", pa.array(["1", "2", "3", "4"]), "string", "uint64"),
    ("ledger", "failed", pa.array([0, 0, 0, 0], pa.int8()), "int8", "bool"),
    ("ledger", "rollout_id", pa.array([b"r0", b"r0", b"r1", b"r1"]), "binary",
     "string (or large_string)"),
    ("ledger", "parent_id", pa.array([1, 2, 3, 4]), "int64", "string (or large_string)"),
    ("ledger", "item_keys", pa.array([[1], [2], [3], [4]], pa.list_(pa.int64())),
     "list<int64>", "list<uint64> (or large_list)"),
    ("ledger", "item_keys", pa.array([1, 2, 3, 4], pa.uint64()), "uint64",
     "list<uint64> (or large_list)"),
    ("ledger", "item_ids", pa.array(["a", "b", "c", "d"]), "string",
     "list<string> (or large_list)"),
    ("ledger", "item_ids", pa.array([[1], [2], [3], [4]], pa.list_(pa.int32())), "list<int32>",
     "list<string> (or large_list)"),
]


@pytest.mark.parametrize("table,column,array,found,expected", WRONG_TYPES)
def test_wrong_type_ledger(ds_dir, table, column, array, found, expected):
    path = _write(ds_dir / "ledger.parquet", _ledger(**{column: array}))
    msg = _err(read_dataset, ds_dir)
    assert msg == (f"ledger: column {column!r} has type {found}, expected {expected} "
                   f"(file {path})")


@pytest.mark.parametrize("column,array,found,expected", [
    ("tokens", pa.array([[1]] * 4, pa.list_(pa.int64())), "list<int64>",
     "list<int32> (or large_list)"),
    ("tokens", pa.array([[1]] * 4, pa.list_(pa.uint32())), "list<uint32>",
     "list<int32> (or large_list)"),
    ("tokens", pa.array([[1]] * 4, pa.list_view(pa.int32())), "list_view<int32>",
     "list<int32> (or large_list)"),
    ("tokens", pa.array([[1]] * 4, pa.list_(pa.int32(), 1)), "fixed_size_list<int32>[1]",
     "list<int32> (or large_list)"),
    ("logprobs", pa.array([[1.0]] * 4, pa.list_(pa.float64())), "list<double>",
     "list<float> (or large_list)"),
    ("call_id", pa.array([1, 2, 3, 4]), "int64", "string (or large_string)"),
])
def test_wrong_type_tokens(ds_dir, column, array, found, expected):
    path = _write(ds_dir / "tokens.parquet", _replace_column(_tables()[1], column, array))
    msg = _err(read_table, ds_dir, "tokens")
    assert msg == (f"tokens: column {column!r} has type {found}, expected {expected} "
                   f"(file {path})")


@pytest.mark.parametrize("column,array,found,expected", [
    ("reward", pa.array([1.0, 2.0], pa.float32()), "float", "double"),
    ("reward", pa.array([1, 2]), "int64", "double"),
    ("output_keys", pa.array([[1], [2]], pa.list_(pa.int64())), "list<int64>",
     "list<uint64> (or large_list)"),
    ("output_ids", pa.array([[1], [2]], pa.list_(pa.int64())), "list<int64>",
     "list<string> (or large_list)"),
    ("terminal_response_id", pa.array([1, 2]), "int64", "string (or large_string)"),
    ("accepted_response_ids", pa.array(["a", "b"]), "string", "list<string> (or large_list)"),
])
def test_wrong_type_rollouts(ds_dir, column, array, found, expected):
    ro = _tables(accepted=True)[2]
    path = _write(ds_dir / "rollouts.parquet", _replace_column(ro, column, array))
    msg = _err(read_table, ds_dir, "rollouts")
    assert msg == (f"rollouts: column {column!r} has type {found}, expected {expected} "
                   f"(file {path})")


@pytest.mark.parametrize("table,column", [
    ("ledger", "gen_len"), ("ledger", "chain_hash"), ("ledger", "failed"),
    ("tokens", "tokens"), ("rollouts", "output_ids"), ("rollouts", "terminal_response_id"),
])
def test_missing_column(ds_dir, table, column):
    idx = {"ledger": 0, "tokens": 1, "rollouts": 2}[table]
    path = _write(ds_dir / f"{table}.parquet", _tables()[idx].drop_columns([column]))
    assert _err(read_dataset, ds_dir) == f"{table}: missing column {column!r} (file {path})"


def test_duplicate_column(ds_dir):
    t = _tables()[0]
    t = t.append_column("call_id", t.column("call_id"))
    path = _write(ds_dir / "ledger.parquet", t)
    assert _err(read_dataset, ds_dir) == f"ledger: column 'call_id' appears 2 times (file {path})"


def test_large_and_view_types_accepted_and_normalized(ds_dir):
    ledger, tokens, rollouts = _tables(accepted=True)
    big = ledger.cast(pa.schema([
        ("rollout_id", pa.large_string()), ("call_id", pa.string_view()),
        ("parent_id", pa.large_string()), ("response_id", pa.string()),
        ("prev_len", pa.int8()), ("delta_len", pa.uint16()), ("gen_len", pa.uint64()),
        ("chain_hash", pa.uint64()), ("item_keys", pa.large_list(pa.uint64())),
        ("item_ids", pa.large_list(pa.large_string())), ("failed", pa.bool_()),
    ]))
    big = _replace_column(big, "response_id", big.column("response_id").dictionary_encode())
    tok = tokens.cast(pa.schema([("rollout_id", pa.large_string()), ("call_id", pa.string()),
                                 ("tokens", pa.large_list(pa.int32())),
                                 ("logprobs", pa.large_list(pa.float32()))]))
    ro = rollouts.cast(pa.schema([
        ("rollout_id", pa.string()), ("group_id", pa.large_string()), ("reward", pa.float64()),
        ("output_keys", pa.large_list(pa.uint64())),
        ("output_ids", pa.list_(pa.string_view())),
        ("terminal_response_id", pa.large_string()),
        ("accepted_response_ids", pa.large_list(pa.string()))]))
    for name, t in (("ledger", big), ("tokens", tok), ("rollouts", ro)):
        _write(ds_dir / f"{name}.parquet", t)
    d = read_dataset(ds_dir)
    assert d.ledger.schema == LEDGER_SCHEMA and d.ledger.equals(ledger)
    assert d.tokens.equals(tokens) and d.rollouts.equals(rollouts)


def test_files_of_one_table_may_differ_in_schema(ds_dir):
    ledger = _tables()[0]
    (ds_dir / "ledger.parquet").unlink()
    _write(ds_dir / "ledger" / "a.parquet", ledger.slice(0, 2))
    other = ledger.slice(2).cast(ledger.schema.set(4, pa.field("prev_len", pa.int32()))
                                 .set(8, pa.field("item_keys", pa.large_list(pa.uint64()))))
    _write(ds_dir / "ledger" / "b.parquet", other.select(list(reversed(other.column_names))))
    out = read_table(ds_dir, "ledger")
    assert out.schema == LEDGER_SCHEMA and out.equals(ledger)


def test_uint64_above_int64_range(ds_dir):
    vals = pa.array([3, 2, 3, 2**63], pa.uint64())
    path = _write(ds_dir / "ledger.parquet", _ledger(delta_len=vals))
    assert _err(read_dataset, ds_dir) == (
        f"ledger: column 'delta_len' has a value above the int64 range at row 3 (0-based) "
        f"(file {path})")


def test_all_null_typed_column(ds_dir):
    path = _write(ds_dir / "ledger.parquet", _ledger(parent_id=pa.nulls(4)))
    out = read_table(ds_dir, "ledger")
    assert out.schema == LEDGER_SCHEMA and out.column("parent_id").null_count == 4
    _write(ds_dir / "ledger.parquet", _ledger(call_id=pa.nulls(4)))
    assert _err(read_table, ds_dir, "ledger") == (
        f"ledger: column 'call_id' has a null value; the column is not nullable: first at row 0 "
        f"(0-based, rollout 'r0') (file {path})")


# ----------------------------------------------------------------------------- nulls

NON_NULLABLE = [
    ("ledger", c) for c in ("rollout_id", "call_id", "response_id", "prev_len", "delta_len",
                            "gen_len", "chain_hash", "failed")
] + [("tokens", "rollout_id"), ("tokens", "call_id"), ("rollouts", "rollout_id")]


@pytest.mark.parametrize("table,column", NON_NULLABLE)
def test_null_in_non_nullable_column(ds_dir, table, column):
    idx = {"ledger": 0, "tokens": 1, "rollouts": 2}[table]
    t = _tables()[idx]
    col = t.column(column).to_pylist()
    col[1] = None
    path = _write(ds_dir / f"{table}.parquet",
                  _replace_column(t, column, pa.array(col, t.schema.field(column).type)))
    msg = _err(read_dataset, ds_dir)
    rollout = "" if column == "rollout_id" else ", rollout 'r0'"
    assert msg == (f"{table}: column {column!r} has a null value; the column is not nullable: "
                   f"first at row 1 (0-based{rollout}) (file {path})")
    err = pytest.raises(InputError, read_dataset, ds_dir).value
    assert (err.table, err.column, err.row, err.file) == (table, column, 1, str(path))


@pytest.mark.parametrize("table,column,item_type", [
    ("ledger", "item_keys", pa.uint64()), ("rollouts", "output_keys", pa.uint64()),
    ("tokens", "tokens", pa.int32()), ("tokens", "logprobs", pa.float32()),
])
def test_null_entry_inside_list(ds_dir, table, column, item_type):
    idx = {"ledger": 0, "tokens": 1, "rollouts": 2}[table]
    t = _tables()[idx]
    col = t.column(column).to_pylist()
    col[1] = [*col[1], None]
    path = _write(ds_dir / f"{table}.parquet",
                  _replace_column(t, column, pa.array(col, pa.list_(item_type))))
    rollout = "r1" if table == "rollouts" else "r0"
    assert _err(read_dataset, ds_dir) == (
        f"{table}: column {column!r} has a list with a null entry; entries may not be null: "
        f"first at row 1 (0-based, rollout {rollout!r}) (file {path})")


def test_null_entries_allowed_in_id_lists(ds_dir):
    ro = _tables(accepted=True)[2]
    ro = _replace_column(ro, "accepted_response_ids", pa.array([[None, "x"], None],
                                                                pa.list_(pa.string())))
    _write(ds_dir / "rollouts.parquet", ro)
    assert read_table(ds_dir, "rollouts").equals(ro)  # output_ids already hold null entries


def test_null_lists_accepted(ds_dir):
    ledger, tokens, rollouts = _tables(accepted=True)
    ledger = _ledger(item_keys=pa.array([None, [1], None, [2]], pa.list_(pa.uint64())),
                     item_ids=pa.array([None] * 4, pa.list_(pa.string())),
                     parent_id=pa.array([None] * 4, pa.string()))
    tokens = _replace_column(tokens, "tokens", pa.array([None, [1]] * 2, pa.list_(pa.int32())))
    tokens = _replace_column(tokens, "logprobs", pa.array([None, [0.0]] * 2,
                                                          pa.list_(pa.float32())))
    rollouts = rollouts.set_column(3, "output_keys", pa.array([None, []], pa.list_(pa.uint64())))
    for c in ("group_id", "reward", "terminal_response_id"):
        i = rollouts.schema.get_field_index(c)
        rollouts = rollouts.set_column(i, rollouts.field(i), pa.nulls(2, rollouts.field(i).type))
    rollouts = _replace_column(rollouts, "output_ids", pa.nulls(2, pa.list_(pa.string())))
    rollouts = _replace_column(rollouts, "accepted_response_ids",
                               pa.nulls(2, pa.list_(pa.string())))
    write_dataset(ds_dir, ledger, tokens, rollouts)
    d = read_dataset(ds_dir)
    # SPEC §2: null item_keys / output_keys / tokens read as empty lists ...
    assert d.ledger.column("item_keys").to_pylist() == [[], [1], [], [2]]
    assert d.ledger.column("item_keys").null_count == 0
    assert d.tokens.column("tokens").to_pylist() == [[], [1], [], [1]]
    assert d.rollouts.column("output_keys").to_pylist() == [[], []]
    # ... id lists, logprobs and accepted ids keep their null (it has a meaning of its own)
    assert d.ledger.column("item_ids").null_count == 4
    assert d.tokens.column("logprobs").null_count == 2
    assert d.rollouts.column("output_ids").null_count == 2
    assert d.rollouts.column("accepted_response_ids").null_count == 2


# ----------------------------------------------------------------------------- optional columns

def test_logprobs_in_some_files_only(ds_dir):
    tokens = _tables()[1]
    (ds_dir / "tokens.parquet").unlink()
    _write(ds_dir / "tokens" / "a.parquet", tokens.slice(0, 2))
    b = _write(ds_dir / "tokens" / "b.parquet", tokens.slice(2).drop_columns(["logprobs"]))
    msg = _err(read_dataset, ds_dir)
    assert msg == ("tokens: optional column 'logprobs' is present in some files of the table "
                   f"but missing in this one (file {b})")
    assert read_table(ds_dir, "tokens", columns=["call_id"]).num_rows == 4  # not asked: fine


def test_accepted_ids_in_some_files_only_filled_with_null(ds_dir):
    ro = _tables(accepted=True)[2]
    (ds_dir / "rollouts.parquet").unlink()
    _write(ds_dir / "rollouts" / "a.parquet", ro.slice(0, 1).drop_columns(["accepted_response_ids"]))
    _write(ds_dir / "rollouts" / "b.parquet", ro.slice(1))
    out = read_table(ds_dir, "rollouts")
    assert out.column("accepted_response_ids").to_pylist() == [None, ["resp1", "resp2"]]
    assert out.schema == ROLLOUTS_SCHEMA.append(ACCEPTED_FIELD)


# ----------------------------------------------------------------------------- batches

def test_iter_table_batches_order_types_and_row_numbers(ds_dir):
    ledger = tables_from_pylists(_ledger_rows(5), [], [])[0]  # 10 rows
    (ds_dir / "ledger.parquet").unlink()
    _write(ds_dir / "ledger" / "1.parquet", ledger.slice(0, 7).cast(
        ledger.schema.set(1, pa.field("call_id", pa.large_string()))))
    _write(ds_dir / "ledger" / "2.parquet", ledger.slice(7))
    batches = list(iter_table_batches(ds_dir, "ledger", batch_rows=3))
    assert [b.num_rows for b in batches] == [3, 3, 1, 3]  # never spans files
    assert all(b.schema == LEDGER_SCHEMA for b in batches)
    assert pa.Table.from_batches(batches).equals(ledger)
    cols = list(iter_table_batches(ds_dir, "ledger", columns=["chain_hash"], batch_rows=4))
    assert cols[0].schema.names == ["chain_hash"]
    # a null in file 1 at row 5 (second batch) is reported with its row in the file
    bad = ledger.slice(0, 7).to_pylist()
    bad[5]["gen_len"] = None
    path = _write(ds_dir / "ledger" / "1.parquet", pa.Table.from_pylist(bad, LEDGER_SCHEMA))
    msg = _err(lambda: list(iter_table_batches(ds_dir, "ledger", batch_rows=3)))
    assert msg == ("ledger: column 'gen_len' has a null value; the column is not nullable: "
                   f"first at row 5 (0-based, rollout 'r2') (file {path})")


def test_null_entry_row_number_in_later_chunk(ds_dir):
    # several row groups -> several chunks per column; the row index must count them all
    ledger = tables_from_pylists(_ledger_rows(50), [], [])[0]
    rows = ledger.to_pylist()
    rows[77]["item_keys"] = [1, None]
    path = ds_dir / "ledger.parquet"
    pq.write_table(pa.Table.from_pylist(rows, LEDGER_SCHEMA), path, row_group_size=10)
    assert "first at row 77 (0-based, rollout 'r38')" in _err(read_table, ds_dir, "ledger")


def test_large_offset_fallback_keeps_large_types(ds_dir, monkeypatch):
    tokens = _tables()[1]
    (ds_dir / "tokens.parquet").unlink()
    _write(ds_dir / "tokens" / "a.parquet", tokens.slice(0, 2))
    _write(ds_dir / "tokens" / "b.parquet", tokens.slice(2).cast(
        tokens.schema.set(2, pa.field("tokens", pa.large_list(pa.int32())))))
    real = dsmod._narrow_cast

    def narrow(col, target):  # pretend file b's large_list is beyond 32-bit offsets
        if pa.types.is_large_list(col.type):
            raise pa.ArrowInvalid("Array of type large_list<item: int32> too large to convert")
        return real(col, target)

    monkeypatch.setattr(dsmod, "_narrow_cast", narrow)
    out = read_table(ds_dir, "tokens")
    assert out.schema.field("tokens").type == pa.large_list(pa.int32())
    assert out.schema.field("logprobs").type == pa.list_(pa.float32())
    assert out.column("tokens").to_pylist() == tokens.column("tokens").to_pylist()
    types = [b.schema.field("tokens").type for b in iter_table_batches(ds_dir, "tokens")]
    assert types == [pa.list_(pa.int32()), pa.large_list(pa.int32())]


def test_plan_and_check_schema_return_present_columns(ds_dir):
    present = validate_schema("tokens", pq.read_schema(ds_dir / "tokens.parquet"), "f")
    assert present == ["rollout_id", "call_id", "tokens", "logprobs"]
    plan = plan_table(ds_dir, "rollouts")
    assert plan.columns == ROLLOUTS_SCHEMA.names and plan.schema == ROLLOUTS_SCHEMA


def test_input_error_is_one_line_with_attributes():
    err = InputError("bad\nthing  here", table="t", file="/x", column="c", row=3)
    assert str(err) == "t: bad thing here (file /x)"
    assert (err.table, err.file, err.column, err.row) == ("t", "/x", "c", 3)
    assert str(InputError("gone", table="t", directory="/a\nb")) == "t: gone (directory /a b)"
    assert str(InputError("plain")) == "plain"


# ----------------------------------------------------------------------------- writing

def _rows_table(n=5, with_logprobs=True):
    schema = rows_schema(with_logprobs)
    data = {
        "row_id": [f"r{i}_s0" for i in range(n)], "rollout_id": [f"r{i}" for i in range(n)],
        "group_id": ["g"] * n, "segment": [0] * n, "num_segments": [1] * n,
        "input_ids": [[1, 2, 3]] * n, "loss_mask": [[0, 1, 1]] * n,
        "logprobs": [[0.0, -1.0, -2.0]] * n, "prompt_len": [1] * n, "call_ids": [["c1"]] * n,
        "reward": [1.0] * n, "advantage": [0.0] * n, "weight": [1.0] * n,
    }
    return pa.Table.from_pydict({k: data[k] for k in schema.names}, schema=schema)


def _report_table(n=5):
    data = {"rollout_id": [f"r{i}" for i in range(n)], "group_id": ["g"] * n,
            "status": ["ok"] * n, "reason": [None] * n, "detail": [None] * n,
            "num_rows": [1] * n, "num_calls": [2] * n, "num_selected": [2] * n,
            "num_roots": [1] * n, "loss_tokens": [2] * n, "reward": [1.0] * n,
            "advantage": [0.0] * n}
    return pa.Table.from_pydict(data, schema=REPORT_SCHEMA)


def _entries(path: Path) -> list[str]:
    return sorted(os.listdir(path))


def test_atomic_output_single_files(tmp_path):
    out = tmp_path / "out"
    rows, report = _rows_table(), _report_table()
    with AtomicOutput(out) as o:
        o.write_table("rows", rows)
        o.write_table("report", report)
        assert _entries(out) == sorted([wmod.OUT_LOCK_NAME, o.tmp_dir.name])  # nothing visible before commit
        assert o.tmp_dir.name.startswith(".chainrows-tmp-")
    assert o.committed
    assert _entries(out) == ["report.parquet", "rows.parquet"]
    assert pq.read_table(out / "rows.parquet").equals(rows)
    assert pads.dataset(out / "rows.parquet").to_table().equals(rows)
    assert pads.dataset(out / "report.parquet").to_table().equals(report)


def test_atomic_output_parts_and_streaming(tmp_path):
    out = tmp_path / "out"
    rows = _rows_table(30)
    with AtomicOutput(out) as o:
        paths = [o.write_part("rows", rows.slice(i, 10)) for i in (0, 10, 20)]
        with RowGroupWriter(o.reserve_file("report"), REPORT_SCHEMA) as w:
            for i in range(0, 30, 7):
                w.write(_report_table(30).slice(i, 7))
    assert [p.name for p in paths] == [f"part-{i:08d}.parquet" for i in range(3)]
    assert _entries(out) == ["report.parquet", "rows"]
    assert _entries(out / "rows") == [p.name for p in paths]
    assert pads.dataset(out / "rows").to_table().equals(rows)  # lexicographic = write order
    assert pq.read_table(out / "report.parquet").equals(_report_table(30))
    assert pq.ParquetFile(out / "report.parquet").metadata.num_row_groups == 1  # buffered


def test_read_back_with_chainrows_reader_semantics(tmp_path):
    """Outputs follow the same layout rules as inputs: readable by table_files."""
    out = tmp_path / "out"
    with AtomicOutput(out) as o:
        o.write_part("rows", _rows_table(3))
        o.write_part("rows", _rows_table(2))
        o.write_table("report", _report_table())
    assert len(table_files(out, "rows")) == 2 and table_files(out, "report")


def test_reserve_file_for_callers_own_writer(tmp_path):
    out = tmp_path / "out"
    with AtomicOutput(out) as o:
        path = o.reserve_file("rows")
        assert path == o.tmp_dir / "rows.parquet"
        pq.write_table(_rows_table(), path)
        o.write_table("report", _report_table())
        with pytest.raises(ValueError, match="already written as a single file"):
            o.reserve_file("rows")
    assert pq.read_table(out / "rows.parquet").equals(_rows_table())


def test_write_dataset_atomic_replaces_and_reads_back(tmp_path):
    root = tmp_path / "ds"
    _write(root / "tokens" / "part-0.parquet", _tables()[1])  # an older directory form
    (root / "notes.txt").parent.mkdir(exist_ok=True)
    (root / "notes.txt").write_text("kept")
    write_dataset_atomic(root, *_tables(accepted=True))
    assert _entries(root) == ["ledger.parquet", "notes.txt", "rollouts.parquet", "tokens.parquet"]
    d = read_dataset(root)
    assert d.ledger.equals(_tables()[0]) and d.has_accepted


def test_writer_options_applied(tmp_path):
    out = tmp_path / "out"
    with AtomicOutput(out) as o:
        o.write_table("rows", _rows_table())
        o.write_table("report", _report_table())
    meta = pq.ParquetFile(out / "rows.parquet").metadata
    cols = {meta.schema.column(i).path: meta.row_group(0).column(i) for i in range(meta.num_columns)}
    assert all(c.compression == "ZSTD" for c in cols.values())
    assert "RLE_DICTIONARY" in cols["group_id"].encodings
    assert "RLE_DICTIONARY" not in cols["input_ids.list.element"].encodings
    assert "RLE_DICTIONARY" not in cols["logprobs.list.element"].encodings
    assert WRITE_OPTIONS["compression"] == "zstd"


def test_exception_leaves_nothing_and_keeps_previous_outputs(tmp_path):
    out = tmp_path / "out"
    with AtomicOutput(out) as o:
        o.write_table("rows", _rows_table(2))
        o.write_table("report", _report_table(2))
    (out / "keep.txt").write_text("user file")
    before = {n: (out / n).read_bytes() for n in ("rows.parquet", "report.parquet")}
    for exc in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with AtomicOutput(out) as o:
                o.write_table("rows", _rows_table(7))
                w = RowGroupWriter(o.reserve_file("report"), REPORT_SCHEMA)
                w.write(_report_table(7))
                raise exc
        assert _entries(out) == ["keep.txt", "report.parquet", "rows.parquet"]
        assert {n: (out / n).read_bytes() for n in before} == before


def test_missing_output_fails_without_touching_previous(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.parquet").write_bytes(b"old")
    with pytest.raises(RuntimeError, match=r"\['report'\] were never written"):
        with AtomicOutput(out) as o:
            o.write_table("rows", _rows_table())
    assert _entries(out) == ["report.parquet"]
    assert (out / "report.parquet").read_bytes() == b"old"


def test_commit_replaces_both_forms(tmp_path):
    out = tmp_path / "out"
    with AtomicOutput(out) as o:
        o.write_part("rows", _rows_table(2))
        o.write_part("report", _report_table(2))
    assert _entries(out) == ["report", "rows"]
    with AtomicOutput(out) as o:
        o.write_table("rows", _rows_table(4))
        o.write_table("report", _report_table(4))
    assert _entries(out) == ["report.parquet", "rows.parquet"]
    assert pq.read_table(out / "rows.parquet").num_rows == 4


def test_commit_failure_restores_previous_outputs(tmp_path, monkeypatch):
    out = tmp_path / "out"
    with AtomicOutput(out) as o:
        o.write_table("rows", _rows_table(2))
        o.write_table("report", _report_table(2))
    before = {n: (out / n).read_bytes() for n in ("rows.parquet", "report.parquet")}
    real, failed = os.replace, []

    def flaky(src, dst):  # placing the new report fails (once)
        if Path(dst) == out / "report.parquet" and Path(src).parent.name != ".old" \
                and not failed:
            failed.append(src)
            raise OSError("disk full")
        return real(src, dst)

    monkeypatch.setattr(wmod.os, "replace", flaky)
    with pytest.raises(OSError, match="disk full"):
        with AtomicOutput(out) as o:
            o.write_table("rows", _rows_table(9))
            o.write_table("report", _report_table(9))
    assert _entries(out) == ["report.parquet", "rows.parquet"]
    assert {n: (out / n).read_bytes() for n in before} == before


def test_output_misuse(tmp_path):
    with AtomicOutput(tmp_path / "o") as o:
        o.write_table("rows", _rows_table())
        with pytest.raises(ValueError, match="already written as a single file"):
            o.write_part("rows", _rows_table())
        o.write_part("report", _report_table())
        with pytest.raises(ValueError, match="already written as part files"):
            o.write_table("report", _report_table())
        with pytest.raises(ValueError, match="unknown output"):
            o.write_table("other", _report_table())
    with pytest.raises(RuntimeError, match="not open"):
        AtomicOutput(tmp_path / "p").write_table("rows", _rows_table())


_KILLED_CHILD = """
import os, signal, sys
from chainrows.outdir.atomic import AtomicOutput
o = AtomicOutput(sys.argv[1]).__enter__()
o.write_table("rows", __import__("pyarrow").table({"x": [1]}))
print(o.tmp_dir, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_stale_temp_dir_from_killed_run_is_cleaned(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _KILLED_CHILD, str(out)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    stale = Path(proc.stdout.strip())
    assert stale.is_dir() and stale.parent == out
    with AtomicOutput(out) as live:  # a live run's dir is never taken for stale
        assert not stale.exists()
        assert clean_stale_temp_dirs(out) == [] and live.tmp_dir.is_dir()
        live.write_table("rows", _rows_table())
        live.write_table("report", _report_table())
    assert _entries(out) == ["report.parquet", "rows.parquet"]


def test_one_atomic_output_at_a_time_per_directory(tmp_path):
    out = tmp_path / "out"
    with AtomicOutput(out) as first:
        assert (out / wmod.OUT_LOCK_NAME).exists()
        with pytest.raises(InputError, match="another chainrows run is writing") as err:
            AtomicOutput(out).__enter__()
        assert str(out) in str(err.value)
        assert first.tmp_dir.is_dir()  # the refused one touched nothing
        first.write_table("rows", _rows_table())
        first.write_table("report", _report_table())
    assert _entries(out) == ["report.parquet", "rows.parquet"]  # lock removed on commit
    with AtomicOutput(out) as again:  # free again
        again.write_table("rows", _rows_table())
        again.write_table("report", _report_table())
    assert _entries(out) == ["report.parquet", "rows.parquet"]


def test_work_removed_after_commit_while_the_lock_is_held(tmp_path, monkeypatch):
    import fcntl

    out, work = tmp_path / "out", tmp_path / "out" / ".chainrows-work"
    seen = []
    rmtree = wmod.shutil.rmtree

    def spy(path, *a, **k):
        if Path(path) == work:  # is another run still kept out at this moment?
            fd = os.open(out / wmod.OUT_LOCK_NAME, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen.append("free")
            except BlockingIOError:
                seen.append("held")
            finally:
                os.close(fd)
        return rmtree(path, *a, **k)

    monkeypatch.setattr(wmod.shutil, "rmtree", spy)
    with AtomicOutput(out, remove_after_commit=[work]) as o:
        work.mkdir()
        o.write_table("rows", _rows_table())
        o.write_table("report", _report_table())
    assert seen == ["held"] and not work.exists()
    assert _entries(out) == ["report.parquet", "rows.parquet"]


def test_stale_temp_dir_without_lock_file_cleaned_by_age(tmp_path):
    old, young = tmp_path / ".chainrows-tmp-1-old", tmp_path / ".chainrows-tmp-2-young"
    old.mkdir()
    young.mkdir()
    (old / "rows.parquet").write_bytes(b"partial")
    past = time.time() - wmod.STALE_AGE_S - 10
    os.utime(old, (past, past))
    assert clean_stale_temp_dirs(tmp_path) == [old]
    assert young.exists() and not old.exists()


def test_row_group_writer_closes_once_and_discards_on_error(tmp_path):
    rows = _rows_table(10, with_logprobs=False)
    with RowGroupWriter(tmp_path / "x.parquet", rows.schema) as w:
        w.write(rows.slice(0, 4))
        w.write(rows.slice(4).select(list(reversed(rows.column_names))))  # by name
        w.write(rows.slice(0, 0))
    w.close()  # idempotent
    assert pq.read_table(tmp_path / "x.parquet").equals(rows)
    with pytest.raises(RuntimeError):
        with RowGroupWriter(tmp_path / "y.parquet", rows.schema) as w:
            w.write(rows)
            raise RuntimeError("boom")
    with pytest.raises(RuntimeError):  # the writer is closed: no more rows
        w.write(rows)


def test_output_loads_with_hugging_face_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "out"
    with AtomicOutput(out) as o:
        o.write_part("rows", _rows_table(3))
        o.write_part("rows", _rows_table(2))
        o.write_table("report", _report_table())
    hf = datasets.load_dataset("parquet", data_files=str(out / "rows" / "*.parquet"),
                               split="train")
    assert hf.num_rows == 5 and hf[0]["input_ids"] == [1, 2, 3]


def test_abort_removes_only_an_out_dir_it_created_and_left_empty(tmp_path):
    fresh, existing = tmp_path / "fresh", tmp_path / "existing"
    existing.mkdir()
    for out in (fresh, existing):
        with pytest.raises(RuntimeError):
            with AtomicOutput(out) as o:
                o.write_table("rows", _rows_table(2))
                raise RuntimeError("boom")
    assert not fresh.exists() and existing.exists() and _entries(existing) == []


def _parts(folder: Path) -> list[tuple[str, bytes]]:
    return [(p.name, p.read_bytes()) for p in sorted(folder.iterdir())]


def _parts_writer(folder: Path, schema, **kw) -> PartsWriter:
    folder.mkdir(parents=True, exist_ok=True)
    names = iter(range(1 << 20))
    return PartsWriter(lambda: folder / f"part-{next(names):05d}.parquet", schema, **kw)


@pytest.mark.parametrize("encoders", [1, 2, 3])
def test_parts_writer_cuts_parts_by_content_whatever_the_arrival(tmp_path, encoders):
    rows = _rows_table(50)
    kw = dict(unit_column="input_ids", max_units=7, groups_per_part=3, encoders=encoders)
    with _parts_writer(tmp_path / "whole", rows.schema, **kw) as w:
        w.write(rows)
    rng = np.random.default_rng(encoders)
    cuts = np.sort(rng.choice(np.arange(1, 50), size=9, replace=False))
    with _parts_writer(tmp_path / "pieces", rows.schema, max_pending_bytes=1, **kw) as w:
        for a, b in zip(np.r_[0, cuts], np.r_[cuts, 50]):
            w.write(rows.slice(int(a), int(b - a)))
    whole = _parts(tmp_path / "whole")
    assert whole == _parts(tmp_path / "pieces")
    assert len(whole) == w.parts_written > 1
    files = [pq.ParquetFile(tmp_path / "whole" / name) for name, _ in whole]
    assert all(f.metadata.num_row_groups == 3 for f in files[:-1])
    assert 1 <= files[-1].metadata.num_row_groups <= 3
    assert pa.concat_tables([f.read() for f in files]).equals(rows)
    # the same groups as one RowGroupWriter file, part after part
    with RowGroupWriter(tmp_path / "one.parquet", rows.schema, unit_column="input_ids", max_units=7) as one:
        one.write(rows)
    single = pq.ParquetFile(tmp_path / "one.parquet")
    sizes = [f.metadata.row_group(i).num_rows for f in files for i in range(f.metadata.num_row_groups)]
    assert sizes == [single.metadata.row_group(i).num_rows for i in range(single.metadata.num_row_groups)]


@pytest.mark.parametrize("encoders", [1, 2])
def test_write_taken_writes_what_write_of_the_taken_rows_writes(tmp_path, encoders):
    """Rows handed over as (source, order), mixed with plain writes, groups spanning calls and
    sources of several chunks: the same part files, byte for byte, as writing the taken rows."""
    from chainrows.lowering.take import take_rows

    rows = _rows_table(60)
    lens = [i % 5 + 1 for i in range(60)]  # rows of different lengths and values: 2-6 units each
    for name, values in (("input_ids", lambda i, k: [i * 10 + j for j in range(k)]),
                         ("loss_mask", lambda i, k: [(i + j) % 2 for j in range(k)]),
                         ("logprobs", lambda i, k: [-0.5 * (i + j) for j in range(k)])):
        col = pa.array([values(i, k) for i, k in enumerate(lens)], rows.schema.field(name).type)
        rows = rows.set_column(rows.schema.get_field_index(name), name, col)
    rng = np.random.default_rng(encoders)
    sources = [pa.concat_tables([rows.slice(0, 25), rows.slice(25, 15)]), rows.slice(40, 20)]
    orders = [rng.permutation(40), rng.permutation(20)]
    kw = dict(unit_column="input_ids", max_units=7, groups_per_part=3, encoders=encoders)
    with _parts_writer(tmp_path / "taken", rows.schema, max_pending_bytes=1, **kw) as w:
        w.write_taken(sources[0], orders[0][:17])
        w.write(take_rows(sources[0], orders[0][17:30]))
        w.write_taken(sources[0], orders[0][30:])
        w.write_taken(sources[1], orders[1])
    expected = pa.concat_tables([take_rows(s, o) for s, o in zip(sources, orders)])
    with _parts_writer(tmp_path / "whole", rows.schema, **kw) as w:
        w.write(expected)
    assert _parts(tmp_path / "taken") == _parts(tmp_path / "whole")
    assert pq.read_table(tmp_path / "taken").equals(expected)


@pytest.mark.parametrize("sync_parts", [False, True])
def test_parts_writer_fsyncs_each_finished_part_on_its_encoder(tmp_path, monkeypatch, sync_parts):
    import threading

    from chainrows.lowering import rowgroups

    synced = []
    monkeypatch.setattr(rowgroups, "fsync_file", lambda path: synced.append(
        (Path(path).name, Path(path).stat().st_size, threading.current_thread().name)))
    rows = _rows_table(50)
    with _parts_writer(tmp_path / "parts", rows.schema, unit_column="input_ids", max_units=7,
                       groups_per_part=3, sync_parts=sync_parts) as w:
        w.write(rows)
    written = [(p.name, p.stat().st_size) for p in sorted((tmp_path / "parts").iterdir())]
    assert len(written) > 1
    if sync_parts:  # every part, once whole (its final size), on an encoder thread
        assert sorted((name, size) for name, size, _ in synced) == written
        assert all(thread.startswith("chainrows-encode") for _, _, thread in synced)
    else:
        assert synced == []


def test_parts_writer_writes_one_empty_part_for_no_rows(tmp_path):
    rows = _rows_table(3)
    with _parts_writer(tmp_path / "p", rows.schema) as w:
        w.write(rows.slice(0, 0))
    w.close()  # idempotent
    (name, _), = _parts(tmp_path / "p")
    back = pq.read_table(tmp_path / "p" / name)
    assert back.num_rows == 0 and back.schema.equals(rows.schema)


def test_parts_writer_raises_an_encoder_error_and_stops(tmp_path, monkeypatch):
    rows = _rows_table(40)
    calls = []

    def failing(self, table, row_group_size=None):
        calls.append(table.num_rows)
        raise OSError("disk full")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", failing)
    w = _parts_writer(tmp_path / "p", rows.schema, unit_column="input_ids", max_units=5,
                      groups_per_part=2, max_pending_bytes=1)
    with pytest.raises(OSError, match="disk full"):
        with w:
            for i in range(40):
                w.write(rows.slice(i, 1))
    assert calls  # the encoder's own error, raised on the writing thread
    with pytest.raises(RuntimeError, match="closed"):
        w.write(rows)


# ----------------------------------------------------------------------------- API input checks

def _bad_utf8(arr: pa.ChunkedArray, row: int) -> pa.Array:
    """``arr`` with row ``row`` turned into bytes that are not UTF-8."""
    vals = [None if v is None else v.encode() for v in arr.to_pylist()]
    vals[row] = (vals[row] or b"") + b"\xff\xfe\xc3"
    b = pa.array(vals, pa.binary())
    return pa.Array.from_buffers(pa.string(), len(b), b.buffers(), null_count=b.null_count)


def _serial_error(tables) -> str:
    """The error of checking the tables one after the other, each wholly (UTF-8 then nulls),
    before any join: the order build_batch promises whatever runs on its helper thread."""
    for name, t in zip(("ledger", "tokens", "rollouts"), tables):
        try:
            dsmod.normalize(name, t, validate_schema(name, t.schema))
        except (InputError, UnicodeDecodeError) as exc:
            return str(exc)
    return ""


class _Threads:
    """Numba at ``n`` threads and Arrow at least as many (build_batch's helper thread runs only
    when both allow more than one), restored on exit."""

    def __init__(self, n: int):
        if n > numba.config.NUMBA_NUM_THREADS:
            pytest.skip(f"needs {n} threads")
        self.n = n

    def __enter__(self):
        self.before = numba.get_num_threads(), pa.cpu_count()
        numba.set_num_threads(self.n)
        pa.set_cpu_count(max(self.n, self.before[1]))

    def __exit__(self, *exc):
        numba.set_num_threads(self.before[0])
        pa.set_cpu_count(self.before[1])


UTF8_FAULTS = [("ledger", "rollout_id"), ("ledger", "parent_id"), ("tokens", "call_id"),
               ("rollouts", "group_id"), ("rollouts", "terminal_response_id")]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("utf8_at", UTF8_FAULTS)
@pytest.mark.parametrize("null_at", [None, ("ledger", "call_id"), ("tokens", "rollout_id"),
                                     ("rollouts", "rollout_id")])
def test_api_input_errors_come_in_serial_order(utf8_at, null_at, threads):
    """The API's UTF-8 checks run beside the joins; the error raised is still the first of
    checking each table wholly in turn: an invalid string before a null in the same or a later
    table, a null in an earlier table before it, and before any join's own error."""
    from chainrows import reassemble

    tables = list(_tables())
    idx = {"ledger": 0, "tokens": 1, "rollouts": 2}
    t = tables[idx[utf8_at[0]]]
    tables[idx[utf8_at[0]]] = _replace_column(t, utf8_at[1], _bad_utf8(t.column(utf8_at[1]), 1))
    if null_at is not None:
        t = tables[idx[null_at[0]]]
        col = t.column(null_at[1]).to_pylist()
        col[0] = None
        tables[idx[null_at[0]]] = _replace_column(t, null_at[1], pa.array(col, t.schema.field(null_at[1]).type))
    expected = _serial_error(tables)
    first_utf8 = null_at is None or idx[null_at[0]] >= idx[utf8_at[0]]
    if first_utf8:
        assert expected.startswith(f"{utf8_at[0]}: column {utf8_at[1]!r} holds a string that is not valid UTF-8")
    else:
        assert expected.startswith(f"{null_at[0]}: column {null_at[1]!r} has a null value")
    with _Threads(threads):
        assert _err(reassemble, *tables) == expected


@pytest.mark.parametrize("threads", [1, 2])
def test_api_utf8_error_wins_over_a_join_error(monkeypatch, threads):
    """A join that fails while the UTF-8 checks still run gives way to the invalid string,
    which a serial run would have reported first; with valid strings the join's error stands."""
    from chainrows import reassemble
    from chainrows.lowering import columnar

    def failing_join(*args):
        raise InputError("rollouts: a join failed")

    monkeypatch.setattr(columnar, "join_items", failing_join)
    ledger, tokens, rollouts = _tables()
    bad = _replace_column(ledger, "call_id", _bad_utf8(ledger.column("call_id"), 1))
    bad_tokens = _replace_column(tokens, "call_id", _bad_utf8(tokens.column("call_id"), 0))
    with _Threads(threads):
        assert _err(reassemble, ledger, tokens, rollouts) == "rollouts: a join failed"
        msg = _err(reassemble, bad, tokens, rollouts)
        both = _err(reassemble, bad, bad_tokens, rollouts)  # two invalid tables: the first one's
        assert _err(reassemble, ledger, bad_tokens, rollouts).startswith("tokens: column 'call_id'")
        assert _err(reassemble, bad, "not a table", rollouts) == msg  # a TypeError comes later
    assert msg.startswith("ledger: column 'call_id' holds a string that is not valid UTF-8: first at row 1")
    assert both == msg


@pytest.mark.parametrize("threads", [1, 2])
def test_joins_beside_each_other_fail_in_serial_order(monkeypatch, threads):
    """The token-row and responses joins run beside `Records` and the item join (on the helper
    thread with two threads, when asked for with one); whichever of them fail, the error of the
    one first in serial order (token rows, Records, responses, items) comes, raised on its own
    rather than while handling a later one's."""
    import itertools

    from chainrows import reassemble
    from chainrows.lowering import columnar

    def failing(message):
        def step(*args):
            raise InputError(message)
        return step

    errors = {"join_tokens": "tokens: the token rows join failed",  # in serial order
              "Records": "rollouts: taking the records failed",
              "join_responses": "rollouts: the responses join failed",
              "join_items": "ledger: the item join failed"}
    tables = _tables()
    with _Threads(threads):
        for k in range(1, len(errors) + 1):
            for steps in itertools.combinations(errors, k):
                for step in steps:
                    monkeypatch.setattr(columnar, step, failing(errors[step]))
                with pytest.raises(InputError) as err:
                    reassemble(*tables)
                monkeypatch.undo()
                assert str(err.value) == errors[steps[0]], steps
                assert err.value.__context__ is None and err.value.__cause__ is None, steps


def test_a_failed_build_leaves_nothing_on_the_helper_thread(monkeypatch):
    """When build_batch raises, every task it handed to the helper thread has finished: the
    responses join, still running when the token rows fail, is waited for (it would hold the
    call's arrays and delay the next call's tasks)."""
    import threading

    from chainrows import reassemble
    from chainrows.lowering import columnar

    finished = threading.Event()
    responses = columnar._responses_and_rewards

    def slow_responses(*args):
        time.sleep(0.3)
        out = responses(*args)
        finished.set()
        return out

    def failing_tokens(*args):
        raise InputError("tokens: the token rows join failed")

    monkeypatch.setattr(columnar, "_responses_and_rewards", slow_responses)
    monkeypatch.setattr(columnar, "join_tokens", failing_tokens)
    with _Threads(2):
        assert _err(reassemble, *_tables()) == "tokens: the token rows join failed"
        assert finished.is_set()


def _broken_offsets(arr: pa.ChunkedArray, how: str) -> pa.Array:
    """A string or list<string> column whose offsets Arrow's quick ``validate()`` accepts and a
    reader of the bytes would follow out of bounds: a middle string offset past the data
    (``past``), falling string offsets (``fall``), a middle list offset past the list's
    values (``list``)."""
    a = arr.combine_chunks()
    if how == "list":
        o = a.offsets.to_numpy().copy()
        o[1] += 1000
        return pa.Array.from_buffers(a.type, len(a), [a.buffers()[0], pa.py_buffer(o.tobytes())],
                                     children=[a.values])
    if pa.types.is_list(a.type):
        return pa.Array.from_buffers(a.type, len(a), a.buffers()[:2],
                                     children=[_broken_offsets(pa.chunked_array([a.values]), how)])
    _, off, data = a.buffers()
    o = np.frombuffer(off, dtype=np.int32)[a.offset:a.offset + len(a) + 1].copy()
    if how == "past":
        o[1] += 1000
    else:
        o[1], o[2] = o[2] + 1, o[1]
    return pa.Array.from_buffers(pa.string(), len(a), [a.buffers()[0], pa.py_buffer(o.tobytes()), data])


_REASSEMBLE_IPC = """
import sys, numba, pyarrow as pa
from chainrows import reassemble
numba.set_num_threads(int(sys.argv[2]))
pa.set_cpu_count(max(int(sys.argv[2]), pa.cpu_count()))
tables = [pa.ipc.open_file(f"{sys.argv[1]}/{n}.arrow").read_all() for n in ("ledger", "tokens", "rollouts")]
try:
    reassemble(*tables)
    print("no error")
except Exception as exc:
    print(exc)
"""


@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("table,column,how", [
    ("ledger", "rollout_id", "past"), ("ledger", "rollout_id", "fall"), ("rollouts", "group_id", "past"),
    ("ledger", "item_ids", "past"), ("ledger", "item_ids", "list"), ("rollouts", "output_ids", "list"),
])
def test_api_refuses_broken_string_offsets_before_reading_them(tmp_path, table, column, how, threads):
    """Tables built by hand can carry string offsets that only Arrow's full validation catches.
    The UTF-8 check that runs it now runs beside the joins, so the offsets are checked before
    anything reads the strings: the same error as checking the tables in turn, never a crash
    (run in a child process, where a read out of bounds would kill only the child)."""
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip(f"needs {threads} threads")
    tables = dict(zip(("ledger", "tokens", "rollouts"), _tables()))
    t = tables[table]
    tables[table] = _replace_column(t, column, _broken_offsets(t.column(column), how))
    expected = _serial_error(list(tables.values()))
    assert expected.startswith(f"{table}: column {column!r}")
    for name, t in tables.items():
        with pa.ipc.new_file(tmp_path / f"{name}.arrow", t.schema) as w:
            w.write_table(t)
    p = subprocess.run([sys.executable, "-c", _REASSEMBLE_IPC, str(tmp_path), str(threads)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == expected


def _string_array(offsets, data: bytes, n: int, offset: int = 0, typ=pa.string()) -> pa.Array:
    wide = pa.types.is_large_string(typ)
    buf = pa.py_buffer(np.asarray(offsets, np.int64 if wide else np.int32).tobytes())
    return pa.Array.from_buffers(typ, n, [None, buf, pa.py_buffer(data)], offset=offset)


def _offsets_form(t: pa.Table, form: str) -> tuple[str, pa.Array | pa.ChunkedArray]:
    """(column, replacement) of the ledger: one way to hand-build string offsets. Broken forms
    read outside the bytes (or fall); ``unreferenced`` and ``odd_buffer`` are sound arrays that
    only look odd (a slice whose unused part is broken; an offsets buffer 2 bytes too long)."""
    ids = t.column("rollout_id").combine_chunks()
    n, data = len(ids), b"".join(v.encode() for v in ids.to_pylist())
    sound = np.concatenate(([0], np.cumsum([len(v.encode()) for v in ids.to_pylist()])))
    if form in ("past", "fall", "large"):
        o = sound.copy()
        if form == "fall":
            o[1], o[2] = o[2] + 1, o[1]
        else:
            o[1] += 1 << 30
        return "rollout_id", _string_array(o, data, n, typ=pa.large_string() if form == "large" else pa.string())
    if form in ("sliced", "unreferenced"):  # the column is the back half of an array twice as long
        o = np.concatenate((sound, sound[1:] + sound[-1]))
        o[(n + 1) if form == "sliced" else 1] += 1 << 30
        return "rollout_id", _string_array(o, data + data, n, offset=n)
    if form == "chunks":  # the second chunk broken
        o = sound.copy()
        o[1] += 1 << 30
        return "rollout_id", pa.chunked_array([ids.slice(0, 1), _string_array(o, data, n).slice(0, n - 1)])
    if form == "odd_buffer":
        buf = pa.py_buffer(sound.astype(np.int32).tobytes() + b"\0\0")
        return "rollout_id", pa.Array.from_buffers(pa.string(), n, [None, buf, pa.py_buffer(data)])
    items = t.column("item_ids").combine_chunks()  # list<string>: the list's offsets or its strings'
    lo = items.offsets.to_numpy().copy()
    child = items.values
    if form == "list":
        lo[1] += 1 << 30
    else:  # "child"
        strs = [v or "" for v in child.to_pylist()]
        co = np.concatenate(([0], np.cumsum([len(v.encode()) for v in strs])))
        co[1] += 1 << 30
        child = _string_array(co, "".join(strs).encode(), len(strs))
    return "item_ids", pa.Array.from_buffers(items.type, len(items), [items.buffers()[0], pa.py_buffer(lo.tobytes())],
                                             children=[child])


@pytest.mark.parametrize("form", ["past", "fall", "large", "sliced", "chunks", "list", "child",
                                  "unreferenced", "odd_buffer"])
def test_normalize_checks_string_offsets_before_handing_the_table_on(form):
    """With the UTF-8 check run elsewhere (build_batch's helper), ``normalize`` itself refuses
    offsets a reader would follow out of bounds, with the error the full check gives in place;
    sound arrays that only look odd pass, and the hook still runs for them."""
    ledger = _tables()[0]
    column, arr = _offsets_form(ledger, form)
    t = _replace_column(ledger, column, arr)
    columns = validate_schema("ledger", t.schema)
    called = []
    hook = lambda *args: called.append(args[0])  # noqa: E731
    if form in ("unreferenced", "odd_buffer"):
        dsmod.normalize("ledger", t, columns)  # the full check in place accepts them too
        dsmod.normalize("ledger", t, columns, utf8_check=hook)
        assert called == ["ledger"]
        return
    expected = _err(dsmod.normalize, "ledger", t, columns)  # the full check in place
    assert expected.startswith(f"ledger: column {column!r}")

    def stop(*args):  # raised at once, so nothing after the hook reads the offsets
        raise RuntimeError("the table went on to the UTF-8 hook with unsafe offsets")

    try:
        dsmod.normalize("ledger", t, columns, utf8_check=stop)
        got = "no error"
    except (InputError, RuntimeError) as exc:
        got = str(exc)
    del t, arr  # a failure report that printed the broken table would read outside its buffers
    assert got == expected


def _pointer_form(t: pa.Table, column: str, form: str) -> pa.Array:
    """A column whose cast to the canonical type follows pointers outside its buffers: a
    dictionary whose strings' offsets run past their bytes, or string views past the data."""
    n = t.num_rows
    if form == "dictionary":
        words = _string_array([0, 1, 1 << 30, 3], b"abc", 3)
        return pa.DictionaryArray.from_arrays(pa.array(np.arange(n) % 3, pa.int32()), words)
    views = b"".join(np.array([20, 0x61616161, 0, 1 << 30], np.int32).tobytes() for _ in range(n))
    return pa.Array.from_buffers(pa.string_view(), n, [None, pa.py_buffer(views), pa.py_buffer(b"a" * 32)])


@pytest.mark.slow
@pytest.mark.parametrize("table,column,form", [("rollouts", "group_id", "dictionary"),
                                               ("ledger", "call_id", "view")])
def test_casts_that_follow_pointers_validate_the_array_first(tmp_path, table, column, form):
    """Dictionary and view columns are cast to the canonical types before any other check, and
    the cast reads their strings: a hand-built one pointing outside its buffers is refused
    with an InputError first (in a child process, where a bad read would kill only the child)."""
    tables = dict(zip(("ledger", "tokens", "rollouts"), _tables()))
    tables[table] = _replace_column(tables[table], column, _pointer_form(tables[table], column, form))
    for name, t in tables.items():
        with pa.ipc.new_file(tmp_path / f"{name}.arrow", t.schema) as w:
            w.write_table(t)
    p = subprocess.run([sys.executable, "-c", _REASSEMBLE_IPC, str(tmp_path), "1"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().startswith(f"{table}: column {column!r} is not a valid Arrow array: ")


@pytest.mark.parametrize("column", ["rollout_id", "call_id", "parent_id"])
def test_api_reads_an_offsets_buffer_longer_than_its_offsets(column):
    """Arrow lets an offsets buffer be longer than its offsets, by any number of bytes: such a
    column gives the rows and report of the same column built the usual way."""
    from chainrows import reassemble

    ledger, tokens, rollouts = _tables()
    arr = ledger.column(column).combine_chunks()
    valid, off, data = arr.buffers()
    odd = pa.py_buffer(off.to_pybytes()[:4 * (len(arr) + 1)] + b"\0\0\0")
    same = pa.Array.from_buffers(pa.string(), len(arr), [valid, odd, data], null_count=arr.null_count)
    assert same.equals(arr) and len(odd) % 4 == 3
    got = reassemble(_replace_column(ledger, column, same), tokens, rollouts)
    want = reassemble(ledger, tokens, rollouts)
    assert got.rows.equals(want.rows) and got.report.equals(want.report)


@pytest.mark.parametrize("table,column", [("ledger", "rollout_id"), ("rollouts", "output_ids"),
                                          ("tokens", "tokens")])
def test_api_refuses_an_array_whose_end_offset_is_past_its_buffer(table, column):
    """Arrow's quick validation catches an end offset past the values (a slice that ends at a
    broken middle offset: building an array checks its ends, slicing does not); the API says
    so in one line naming the table and column (it was pyarrow's own error from building a
    table)."""
    from chainrows import reassemble

    tables = dict(zip(("ledger", "tokens", "rollouts"), _tables()))
    a = tables[table].column(column).combine_chunks()
    if pa.types.is_list(a.type):
        o = a.offsets.to_numpy().copy()
        o[1] += 1000
        broken = pa.Array.from_buffers(a.type, len(a), [a.buffers()[0], pa.py_buffer(o.tobytes())],
                                       children=[a.values])
    else:
        _, off, data = a.buffers()
        o = np.frombuffer(off, dtype=np.int32, count=len(a) + 1).copy()
        o[1] += 1000
        broken = pa.Array.from_buffers(pa.string(), len(a), [None, pa.py_buffer(o.tobytes()), data])
    column_data = pa.chunked_array([broken.slice(0, 1), a.slice(1)], a.type)  # chunk 0 ends past its values
    tables[table] = _replace_column(tables[table], column, column_data)
    assert _err(reassemble, *tables.values()).startswith(f"{table}: column {column!r} is not a valid Arrow array: ")


@pytest.mark.parametrize("table,column", [("tokens", "tokens"), ("tokens", "logprobs"), ("ledger", "item_keys"),
                                          ("rollouts", "output_keys")])
@pytest.mark.parametrize("how", ["past", "fall", "negative"])
def test_api_refuses_number_lists_whose_middle_offsets_are_broken(table, column, how):
    """Middle offsets pass Arrow's quick validation whatever they hold; before any kernel or
    Arrow function reads such a list column, the API refuses it in one line naming table and
    column (a review got bare ValueErrors and IndexErrors from later steps)."""
    from chainrows import reassemble

    tables = dict(zip(("ledger", "tokens", "rollouts"), _tables()))
    a = tables[table].column(column).combine_chunks()
    o = a.offsets.to_numpy().copy()
    if how == "past":
        o[1] += 1_000_000
    elif how == "fall":
        o[1], o[2] = o[2] + 1, o[1]
    else:
        o[1] = -1_000_000
    broken = pa.Array.from_buffers(a.type, len(a), [a.buffers()[0], pa.py_buffer(o.tobytes())], children=[a.values])
    broken.validate()  # the quick validation passes
    tables[table] = _replace_column(tables[table], column, pa.chunked_array([broken], a.type))
    assert _err(reassemble, *tables.values()) == \
        f"{table}: column {column!r} has list offsets that fall or point outside its values"


def test_api_refuses_tables_beside_a_dataset_directory(tmp_path):
    """reassemble(DIR) reads the directory; tables passed beside it were silently ignored."""
    from chainrows import reassemble

    ledger, tokens, rollouts = _tables()
    with pytest.raises(TypeError, match="a dataset directory comes alone"):
        reassemble(str(tmp_path), tokens, rollouts)


def _unbuffered_empty(typ: pa.DataType) -> pa.Array:
    """A zero-length array of ``typ`` without an offsets buffer (or any other), which Arrow
    accepts as valid: a hand-built table may hold one."""
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        arr = pa.Array.from_buffers(typ, 0, [None, None], children=[_unbuffered_empty(typ.value_type)])
    elif pa.types.is_string(typ) or pa.types.is_large_string(typ):  # Arrow wants the data buffer
        arr = pa.Array.from_buffers(typ, 0, [None, None, pa.py_buffer(b"")])
    else:
        arr = pa.Array.from_buffers(typ, 0, [None, None])
    arr.validate(full=True)
    return arr


def _forked(fn) -> str:
    """fn() (returning a str) in a forked child, where a crash kills only the child: its
    value, 'raised: ...', or 'died: <exit status>'."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            out = fn()
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            out = f"raised: {exc}"
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while data := os.read(r, 1 << 16):
        chunks.append(data)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return b"".join(chunks).decode() if code == 0 else f"died: {code}"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("table,column", [
    ("ledger", "item_keys"), ("ledger", "item_ids"), ("ledger", "rollout_id"), ("ledger", "parent_id"),
    ("tokens", "tokens"), ("tokens", "logprobs"), ("rollouts", "output_ids"), ("rollouts", "output_keys"),
])
@pytest.mark.parametrize("rows", ["beside rows", "alone"])
def test_api_reads_a_zero_length_chunk_without_buffers(table, column, rows):
    """A hand-built column may hold a zero-length chunk with no offsets buffer, which Arrow
    calls valid and some of its kernels crash on (``list_flatten``: a segfault on an empty
    ledger's item_keys, found in review). Such a chunk beside the column's rows, or as the
    whole of an empty table, gives what the same table without it gives (in a forked child,
    where a crash kills only the child)."""
    from chainrows import reassemble

    tables = dict(zip(("ledger", "tokens", "rollouts"), _tables()))
    if rows == "alone":
        tables[table] = tables[table].slice(0, 0)
    want = reassemble(*tables.values())
    t = tables[table]
    cols = [pa.chunked_array(t.column(i).chunks + [_unbuffered_empty(f.type) if f.name == column
                                                   else pa.array([], f.type)], f.type)
            for i, f in enumerate(t.schema)]
    tables[table] = pa.Table.from_arrays(cols, schema=t.schema)
    assert tables[table].column(column).chunks[-1].buffers()[1] is None

    def run() -> str:
        got = reassemble(*tables.values())
        return "same" if got.rows.equals(want.rows) and got.report.equals(want.report) else "differs"

    assert _forked(run) == "same"
