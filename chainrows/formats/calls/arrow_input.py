"""Call logs as Arrow tables (Parquet files, or tables given to the Python API) -> records
batches (SPEC §8.1).

Columns: ``rollout_id``, ``call_id`` (string), ``prompt_ids``, ``completion_ids`` (list of an
integer type, values within int32), optional ``completion_logprobs`` (list of a float type),
``response_id`` (string), ``output_items`` (string: the item array as JSON text; required
unless every row is failed), ``parent_id`` (string: its presence declares every row's parent)
and ``failed`` (bool). A null means the field is absent. Other columns are ignored. Every
problem is an InputError naming the column and the row (0-based, with its rollout), and the
file when there is one.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chainrows.arrays import one_chunk
from chainrows.errors import InputError
from chainrows.formats.calls.records import RECORDS
from chainrows.formats.jsonl import lines as J
from chainrows.formats.native import dataset as D

TABLE = "calls"
STRINGS = ("rollout_id", "call_id", "response_id", "parent_id", "output_items")
TOKENS = ("prompt_ids", "completion_ids")
COLUMNS = ("rollout_id", "call_id", "prompt_ids", "completion_ids", "completion_logprobs",
           "response_id", "output_items", "parent_id", "failed")
_I32 = (-(1 << 31), (1 << 31) - 1)


def _type_ok(name: str, t: pa.DataType) -> bool:
    if pa.types.is_null(t):
        return True
    if name in STRINGS:
        return pa.types.is_string(t) or pa.types.is_large_string(t)
    if name == "failed":
        return pa.types.is_boolean(t)
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    item = t.value_type
    return pa.types.is_floating(item) if name == "completion_logprobs" else pa.types.is_integer(item)


_EXPECTED = {"failed": "bool", "completion_logprobs": "list<float32> (any float, or large_list)",
             "prompt_ids": "list<int32> (any integer, or large_list)",
             "completion_ids": "list<int32> (any integer, or large_list)"}


def check_columns(schema: pa.Schema, file: Path | None = None) -> list[str]:
    """The call-log columns ``schema`` has, checked: the required ones present, each of an
    accepted type, none twice. InputError naming the column otherwise."""
    present = []
    for name in COLUMNS:
        hits = schema.get_all_field_indices(name)
        if not hits:
            if name in ("rollout_id", "call_id") + TOKENS:
                raise InputError(f"missing column {name!r}", table=TABLE, file=file, column=name)
            continue
        if len(hits) > 1:
            raise InputError(f"column {name!r} appears {len(hits)} times", table=TABLE, file=file, column=name)
        t = schema.field(hits[0]).type
        if not _type_ok(name, t):
            raise InputError(f"column {name!r} has type {t}, expected "
                             f"{_EXPECTED.get(name, 'string (or large_string)')}", table=TABLE,
                             file=file, column=name)
        present.append(name)
    return present


class _Row:
    """What chainrows.io.jsonl's field checks need of a record, for one table row: its errors
    name the row instead of a line."""

    def __init__(self, rec: dict, row: int, rollout_id, file):
        self.rec, self.row, self.rollout_id, self.file = rec, row, rollout_id, file

    def get(self, field, default=J.MISSING):
        value = self.rec.get(field, default)
        if value is J.MISSING:
            raise self.error("is missing", field)
        return value

    def error(self, what: str, field: str | None = None) -> InputError:
        where = f"row {self.row} (0-based" + (f", rollout {self.rollout_id!r}" if self.rollout_id else "") + ")"
        return InputError(f"column {field!r} {what}: {where}" if field else f"{what}: {where}",
                          table=TABLE, file=self.file, column=field, row=self.row)


def _items(texts: pa.Array, rollouts: pa.Array, row0: int, file) -> tuple[list, list]:
    """item_keys and item_ids of every row's output_items JSON text (null: no items)."""
    keys, ids = [], []
    for i, (text, rollout) in enumerate(zip(texts.to_pylist(), rollouts.to_pylist())):
        if text is None:
            keys.append([])
            ids.append([])
            continue
        row = _Row({}, row0 + i, rollout, file)
        try:
            row.rec["output_items"] = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise row.error(f"is not valid JSON: {' '.join(str(exc).split())[:120]}", "output_items") from None
        k, d = J.item_keys(row, "output_items")
        keys.append(k)
        ids.append(d)
    return keys, ids


def _first_row(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _fail(table, name: str, row: int, what: str, row0: int, file) -> InputError:
    rid = table.column("rollout_id")[row].as_py()
    return _Row({}, row0 + row, rid, file).error(what, name)


def _token_column(table: pa.Table, name: str, failed: np.ndarray, least: int, row0: int, file) -> pa.Array:
    col = one_chunk(table.column(name))
    valid = ~np.asarray(col.is_null().to_numpy(zero_copy_only=False), bool)
    if np.any(~valid & ~failed):
        raise _fail(table, name, _first_row(~valid & ~failed), "is null (only a failed record may omit it)", row0, file)
    lengths = pc.list_value_length(col).fill_null(0).to_numpy(zero_copy_only=False)
    if least and np.any((lengths < least) & ~failed):
        raise _fail(table, name, _first_row((lengths < least) & ~failed), "is empty: a call generates at least "
                    "one token", row0, file)
    values = pc.list_flatten(col)
    if values.null_count:
        parent = pc.list_parent_indices(col).to_numpy()
        raise _fail(table, name, int(parent[_first_row(values.is_null().to_numpy(zero_copy_only=False))]),
                    "has a null token", row0, file)
    if values.type != pa.int32() and len(values):
        lo, hi = pc.min_max(values).values()
        if lo.as_py() < _I32[0] or hi.as_py() > _I32[1]:
            v = values.to_numpy()
            bad = (v < _I32[0]) | (v > _I32[1])
            parent = pc.list_parent_indices(col).to_numpy()
            raise _fail(table, name, int(parent[_first_row(bad)]), "has a token outside the int32 range",
                        row0, file)
    return col.cast(pa.list_(pa.int32()))


def _logprob_column(table: pa.Table, completion: pa.Array, row0: int, file) -> pa.Array:
    n = table.num_rows
    if "completion_logprobs" not in table.column_names:
        return pa.nulls(n, pa.list_(pa.float32()))
    col = one_chunk(table.column("completion_logprobs"))
    if pa.types.is_null(col.type):
        return pa.nulls(n, pa.list_(pa.float32()))
    valid = ~np.asarray(col.is_null().to_numpy(zero_copy_only=False), bool)
    mine = pc.list_value_length(col).fill_null(0).to_numpy(zero_copy_only=False)
    theirs = pc.list_value_length(completion).fill_null(0).to_numpy(zero_copy_only=False)
    if np.any(valid & (mine != theirs)):
        raise _fail(table, "completion_logprobs", _first_row(valid & (mine != theirs)),
                    "is not of the length of completion_ids", row0, file)
    if pc.list_flatten(col).null_count:
        parent = pc.list_parent_indices(col).to_numpy()
        raise _fail(table, "completion_logprobs", int(parent[_first_row(
            pc.list_flatten(col).is_null().to_numpy(zero_copy_only=False))]), "has a null entry", row0, file)
    return col.cast(pa.list_(pa.float32()), safe=False)


def _strings(table: pa.Table, name: str) -> pa.Array:
    if name not in table.column_names:
        return pa.nulls(table.num_rows, pa.string())
    return one_chunk(table.column(name)).cast(pa.string())


def records_from_table(table: pa.Table, *, file: Path | None = None, row0: int = 0,
                       first_record: int = 0) -> pa.RecordBatch:
    """A RECORDS batch of a call-log table (rows numbered from ``row0`` in messages, records
    from ``first_record``). InputError on any malformed column or row."""
    table = table.select(check_columns(table.schema, file))
    D.validate_offsets(TABLE, file, table, row0)
    D.validate_list_offsets(TABLE, file, table)
    D.validate_utf8(TABLE, file, table, row0)
    for name in ("rollout_id", "call_id"):
        nulls = table.column(name).is_null().to_numpy(zero_copy_only=False) if table.column(name).null_count else None
        if nulls is not None:
            raise _fail(table, name, _first_row(nulls), "is null", row0, file)
    n = table.num_rows
    failed = (np.asarray(table.column("failed").fill_null(False).to_numpy(zero_copy_only=False), bool)
              if "failed" in table.column_names and not pa.types.is_null(table.column("failed").type)
              else np.zeros(n, bool))
    prompt = _token_column(table, "prompt_ids", failed, 0, row0, file)
    completion = _token_column(table, "completion_ids", failed, 1, row0, file)
    if "output_items" not in table.column_names and not failed.all():
        raise InputError("missing column 'output_items'", table=TABLE, file=file, column="output_items")
    rollouts = _strings(table, "rollout_id")
    keys, ids = _items(_strings(table, "output_items"), rollouts, row0, file)
    return pa.RecordBatch.from_arrays([
        pa.array(np.arange(first_record, first_record + n, dtype=np.int64)),
        rollouts, _strings(table, "call_id"), _strings(table, "response_id"),
        pa.array(np.full(n, "parent_id" in table.column_names)), _strings(table, "parent_id"),
        pa.array(failed), prompt, completion, _logprob_column(table, completion, row0, file),
        pa.array(keys, pa.list_(pa.uint64())), pa.array(ids, pa.list_(pa.string())),
    ], schema=RECORDS)
