"""Import raw JSON Lines captures into SPEC §2 tables (format: docs/jsonl.md).

Three files: ledger records carrying the call's raw ``output_items`` (Responses-API style
items; the model-authored ones become ``item_keys``/``item_ids``), token records, and agent
results carrying the agent's final ``output`` item list (giving ``output_keys``/``output_ids``).
Any malformed line raises InputError naming the file, the 1-based line number and the field.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa

from chainrows.errors import InputError
from chainrows.io.fingerprint import model_item_keys
from chainrows.io.schema import (
    ACCEPTED_FIELD,
    LEDGER_SCHEMA,
    LOGPROBS_FIELD,
    ROLLOUTS_SCHEMA,
    TOKENS_SCHEMA,
)

_MISSING = object()
_HEX = re.compile(r"0[xX][0-9a-fA-F]{1,16}")
_DEC = re.compile(r"[0-9]{1,20}")
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_U64_MAX = (1 << 64) - 1


def import_jsonl(ledger_path: str | os.PathLike, tokens_path: str | os.PathLike,
                 results_path: str | os.PathLike) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Read the three JSON Lines files (``.gz`` allowed) into (ledger, tokens, rollouts)
    Arrow tables with the schema.py schemas; tokens has ``logprobs`` iff some token record
    has that field, rollouts has ``accepted_response_ids`` iff some result record has it.
    Raises InputError (file, line, field) on any malformed record."""
    return (read_ledger_jsonl(ledger_path), read_tokens_jsonl(tokens_path),
            read_results_jsonl(results_path))


def import_jsonl_to_dataset(ledger_path, tokens_path, results_path,
                            dataset_dir: str | os.PathLike) -> Path:
    """:func:`import_jsonl`, then write the three tables as a SPEC §2 dataset directory."""
    from chainrows.formats.native.write import write_dataset

    return write_dataset(dataset_dir, *import_jsonl(ledger_path, tokens_path, results_path))


# ----------------------------------------------------------------------------- records

class _Line:
    """One parsed record plus what an error message needs (file, line, table)."""

    __slots__ = ("rec", "file", "line", "table")

    def __init__(self, rec: dict, file: Path, line: int, table: str):
        self.rec, self.file, self.line, self.table = rec, file, line, table

    def error(self, what: str, field: str | None = None) -> InputError:
        where = f"line {self.line}: " + (f"field {field!r} " if field else "")
        rid = self.rec.get("rollout_id")
        suffix = f" (rollout {rid!r})" if isinstance(rid, str) and field != "rollout_id" else ""
        return InputError(where + what + suffix, table=self.table, file=self.file,
                          column=field, line=self.line)

    def get(self, field: str, default: Any = _MISSING) -> Any:
        value = self.rec.get(field, default)
        if value is _MISSING:
            raise self.error("is missing", field)
        return value

    def string(self, field: str, nullable: bool = False, default: Any = _MISSING) -> str | None:
        value = self.get(field, default)
        if isinstance(value, str) or (nullable and value is None):
            return value
        raise self.error(f"must be a string{' or null' if nullable else ''}, got "
                         f"{_kind(value)}", field)

    def integer(self, field: str, default: Any = _MISSING) -> int:
        value = self.get(field, default)
        if type(value) is int and -(1 << 63) <= value < (1 << 63):
            return value
        raise self.error(f"must be an integer in the int64 range, got {_kind(value)}", field)

    def boolean(self, field: str, default: Any = _MISSING) -> bool:
        value = self.get(field, default)
        if isinstance(value, bool):
            return value
        raise self.error(f"must be true or false, got {_kind(value)}", field)

    def number(self, field: str, default: Any = _MISSING) -> float | None:
        value = self.get(field, default)
        if value is None or (type(value) in (int, float)):
            try:
                return None if value is None else float(value)
            except OverflowError:  # an integer literal beyond float64
                raise self.error(f"is beyond the float64 range ({str(value)[:20]}...)", field) from None
        raise self.error(f"must be a number or null, got {_kind(value)}", field)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    return {dict: "an object", list: "an array"}.get(type(value), type(value).__name__)


def _open(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


# a surrogate written as an escape, or as its three UTF-8 bytes (json.loads decodes bytes with
# "surrogatepass"): what can put a lone one into a parsed string
SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def has_lone_surrogate(value: Any) -> bool:
    """Some string in the parsed JSON value holds a lone UTF-16 surrogate (JSON's \\ud800
    escapes decode to such strings, which are not Unicode text). Iterative: no recursion limit."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def parse_object(raw: bytes, file: Path, number: int, table: str) -> dict:
    """One line's JSON object. InputError (file, line) for bad UTF-8, bad JSON, JSON Python
    cannot hold (nesting too deep, an integer past its digit limit), a string with a lone
    UTF-16 surrogate, or a value that is not an object."""
    try:
        rec = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, int limits
        if isinstance(exc, json.JSONDecodeError):
            msg = exc.msg
        elif isinstance(exc, UnicodeDecodeError):
            msg = "invalid UTF-8"
        elif isinstance(exc, RecursionError):
            msg = "nested too deeply"
        else:  # e.g. an integer literal past Python's digit limit
            msg = " ".join(str(exc).split())
        raise InputError(f"line {number}: invalid JSON: {msg}", table=table, file=file, line=number) from exc
    if SURROGATE.search(raw) and has_lone_surrogate(rec):
        raise InputError(f"line {number}: invalid JSON: a string holds a lone UTF-16 surrogate "
                         f"(not Unicode text)", table=table, file=file, line=number)
    if not isinstance(rec, dict):
        raise InputError(f"line {number}: expected a JSON object, got {_kind(rec)}", table=table,
                         file=file, line=number)
    return rec


def iter_records(path: str | os.PathLike, table: str) -> Iterator[_Line]:
    """Yield each non-blank line of a JSON Lines file as a parsed object, with its 1-based
    line number. Raises InputError for a missing file, bad UTF-8, bad JSON, a non-object."""
    file = Path(path)
    try:
        handle = _open(file)
    except OSError as exc:
        raise InputError(f"cannot open JSON Lines file: {exc.strerror or exc}", table=table,
                         file=file) from exc
    with handle:
        try:
            for number, raw in enumerate(handle, start=1):
                if raw.strip():
                    yield _Line(parse_object(raw, file, number, table), file, number, table)
        except (OSError, EOFError) as exc:  # unreadable or truncated .gz
            raise InputError(f"cannot read JSON Lines file: {exc}", table=table,
                             file=file) from exc


# ----------------------------------------------------------------------------- fields

def _chain_hash(r: _Line, default: Any = _MISSING) -> int:
    value = r.get("chain_hash", default)
    if type(value) is int and 0 <= value <= _U64_MAX:
        return value
    if isinstance(value, str) and _HEX.fullmatch(value):
        return int(value, 16)
    if isinstance(value, str) and _DEC.fullmatch(value) and int(value) <= _U64_MAX:
        return int(value)
    raise r.error(f"must be an unsigned 64-bit integer (a number, a decimal string or a "
                  f"\"0x\" hex string of at most 16 digits), got {_kind(value)}", "chain_hash")


def _item_keys(r: _Line, field: str, default: Any = _MISSING) -> tuple[list[int], list]:
    items = r.get(field, default)
    if items is None:
        return [], []
    if not isinstance(items, list):
        raise r.error(f"must be an array of item objects, got {_kind(items)}", field)
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise r.error(f"item {i} must be an object, got {_kind(item)}", field)
    try:
        keys, ids = model_item_keys(items)
    except (ValueError, TypeError) as exc:  # NaN/Infinity, unserializable values
        raise r.error(f"cannot be fingerprinted: {exc}", field) from exc
    except RecursionError:
        raise r.error("cannot be fingerprinted: nested too deeply", field) from None
    for i, item_id in enumerate(ids):
        if item_id is not None and not isinstance(item_id, str):
            raise r.error(f"model-authored item {i} has an id that is not a string: "
                          f"{_kind(item_id)}", field)
    return keys, ids


def _int32_list(r: _Line, field: str) -> list[int] | None:
    values = r.get(field)
    if values is None:
        return None
    if not isinstance(values, list):
        raise r.error(f"must be an array of integers, got {_kind(values)}", field)
    if not all(type(v) is int for v in values):
        bad = next(i for i, v in enumerate(values) if type(v) is not int)
        raise r.error(f"entry {bad} must be an integer, got {_kind(values[bad])}", field)
    if values and (min(values) < _I32_MIN or max(values) > _I32_MAX):
        bad = next(i for i, v in enumerate(values) if not _I32_MIN <= v <= _I32_MAX)
        raise r.error(f"entry {bad} ({values[bad]}) is outside the int32 range", field)
    return values


def _float_list(r: _Line, field: str) -> list[float] | None:
    values = r.get(field)
    if values is None:
        return None
    if not isinstance(values, list):
        raise r.error(f"must be an array of numbers or null, got {_kind(values)}", field)
    if not all(type(v) in (float, int) for v in values):
        bad = next(i for i, v in enumerate(values) if type(v) not in (float, int))
        raise r.error(f"entry {bad} must be a number, got {_kind(values[bad])}", field)
    if any(type(v) is int and not -_F32_EXACT <= v <= _F32_EXACT for v in values):
        # Arrow refuses an integer float32 cannot hold exactly: rounded as a float literal is
        return [_float_or_inf(v) for v in values]
    return values


_F32_EXACT = 1 << 24  # every integer up to this is exactly a float32


def _float_or_inf(v) -> float:
    try:
        return float(v)
    except OverflowError:  # an integer literal beyond float64: as float32 storage does, ±inf
        return float("inf") if v > 0 else float("-inf")


def _string_list(r: _Line, field: str) -> list[str] | None:
    values = r.get(field)
    if values is None:
        return None
    if not isinstance(values, list):
        raise r.error(f"must be an array of strings or null, got {_kind(values)}", field)
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise r.error(f"entry {i} must be a string, got {_kind(v)}", field)
    return values


# ----------------------------------------------------------------------------- tables

class _Columns:
    """Accumulates rows column-wise and converts them to Arrow every ``chunk_rows`` rows, so
    Python objects never pile up for a whole big file."""

    def __init__(self, schema: pa.Schema, chunk_rows: int = 4096):
        self.schema, self.chunk_rows = schema, chunk_rows
        self.cols: dict[str, list] = {n: [] for n in schema.names}
        self.chunks: list[pa.Table] = []

    def add(self, row: dict) -> None:
        for name, values in self.cols.items():
            values.append(row[name])
        if len(self.cols[self.schema.names[0]]) >= self.chunk_rows:
            self._flush()

    def _flush(self) -> None:
        self.chunks.append(pa.Table.from_pydict(self.cols, schema=self.schema))
        self.cols = {n: [] for n in self.schema.names}

    def table(self, drop: tuple[str, ...] = ()) -> pa.Table:
        self._flush()
        out = pa.concat_tables(self.chunks)
        return out.drop_columns(list(drop)) if drop else out


def read_ledger_jsonl(path: str | os.PathLike) -> pa.Table:
    """Ledger JSON Lines → ledger table (LEDGER_SCHEMA), in line order (= capture order)."""
    out = _Columns(LEDGER_SCHEMA)
    for r in iter_records(path, "ledger"):
        rollout_id, call_id = r.string("rollout_id"), r.string("call_id")
        failed = r.boolean("failed", False)
        soft = 0 if failed else _MISSING  # a failed capture may omit what it never got
        row = {
            "rollout_id": rollout_id,
            "call_id": call_id,
            "parent_id": r.string("parent_id", nullable=True, default=None),
            "response_id": r.string("response_id", default="" if failed else _MISSING),
            "prev_len": r.integer("prev_len", soft),
            "delta_len": r.integer("delta_len", soft),
            "gen_len": r.integer("gen_len", soft),
            "chain_hash": _chain_hash(r, soft),
            "failed": failed,
        }
        row["item_keys"], row["item_ids"] = _item_keys(r, "output_items",
                                                       None if failed else _MISSING)
        out.add(row)
    return out.table()


def read_tokens_jsonl(path: str | os.PathLike) -> pa.Table:
    """Token JSON Lines → tokens table (TOKENS_SCHEMA, + logprobs iff any record has it)."""
    out = _Columns(TOKENS_SCHEMA.append(LOGPROBS_FIELD))
    has_logprobs = False
    for r in iter_records(path, "tokens"):
        has_logprobs = has_logprobs or "logprobs" in r.rec
        out.add({
            "rollout_id": r.string("rollout_id"),
            "call_id": r.string("call_id"),
            "tokens": _int32_list(r, "tokens"),
            "logprobs": _float_list(r, "logprobs") if "logprobs" in r.rec else None,
        })
    return out.table(drop=() if has_logprobs else ("logprobs",))


def read_results_jsonl(path: str | os.PathLike) -> pa.Table:
    """Agent results JSON Lines → rollouts table (ROLLOUTS_SCHEMA, + accepted_response_ids
    iff any record has that field)."""
    out = _Columns(ROLLOUTS_SCHEMA.append(ACCEPTED_FIELD))
    has_accepted = False
    for r in iter_records(path, "results"):
        has_accepted = has_accepted or "accepted_response_ids" in r.rec
        row = {
            "rollout_id": r.string("rollout_id"),
            "group_id": r.string("group_id", nullable=True, default=None),
            "reward": r.number("reward"),
            "terminal_response_id": r.string("terminal_response_id", nullable=True,
                                             default=None),
            "accepted_response_ids": _string_list(r, "accepted_response_ids")
            if "accepted_response_ids" in r.rec else None,
        }
        row["output_keys"], row["output_ids"] = _item_keys(r, "output")
        out.add(row)
    return out.table(drop=() if has_accepted else ("accepted_response_ids",))
