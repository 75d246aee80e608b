"""The JSON Lines parser every JSON format reuses (docs/jsonl.md, docs/gym.md): files read line by
line (``.gz`` allowed), each line a JSON object wrapped in a :class:`Line` whose typed getters
and the field readers below raise an InputError naming the file, the 1-based line number and
the field. No Arrow here; :mod:`chainrows.formats.jsonl.importer` builds the tables.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from chainrows.errors import InputError
from chainrows.formats.items import model_item_keys

MISSING = object()  # the default of a required field: its absence is an error
_HEX = re.compile(r"0[xX][0-9a-fA-F]{1,16}")
_DEC = re.compile(r"[0-9]{1,20}")
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_U64_MAX = (1 << 64) - 1


# ----------------------------------------------------------------------------- records

class Line:
    """One parsed record plus what an error message needs (file, line, table). Its getters return
    a field of the wanted JSON type or raise the InputError :meth:`error` makes; a field without a
    ``default`` (:data:`MISSING`) is required."""

    __slots__ = ("rec", "file", "line", "table")

    def __init__(self, rec: dict, file: Path, line: int, table: str):
        self.rec, self.file, self.line, self.table = rec, file, line, table

    def error(self, what: str, field: str | None = None) -> InputError:
        where = f"line {self.line}: " + (f"field {field!r} " if field else "")
        rid = self.rec.get("rollout_id")
        suffix = f" (rollout {rid!r})" if isinstance(rid, str) and field != "rollout_id" else ""
        return InputError(where + what + suffix, table=self.table, file=self.file,
                          column=field, line=self.line)

    def get(self, field: str, default: Any = MISSING) -> Any:
        value = self.rec.get(field, default)
        if value is MISSING:
            raise self.error("is missing", field)
        return value

    def string(self, field: str, nullable: bool = False, default: Any = MISSING) -> str | None:
        value = self.get(field, default)
        if isinstance(value, str) or (nullable and value is None):
            return value
        raise self.error(f"must be a string{' or null' if nullable else ''}, got "
                         f"{kind(value)}", field)

    def integer(self, field: str, default: Any = MISSING) -> int:
        value = self.get(field, default)
        if type(value) is int and -(1 << 63) <= value < (1 << 63):
            return value
        raise self.error(f"must be an integer in the int64 range, got {kind(value)}", field)

    def boolean(self, field: str, default: Any = MISSING) -> bool:
        value = self.get(field, default)
        if isinstance(value, bool):
            return value
        raise self.error(f"must be true or false, got {kind(value)}", field)

    def number(self, field: str, default: Any = MISSING) -> float | None:
        value = self.get(field, default)
        if value is None or (type(value) in (int, float)):
            try:
                return None if value is None else float(value)
            except OverflowError:  # an integer literal beyond float64
                raise self.error(f"is beyond the float64 range ({str(value)[:20]}...)", field) from None
        raise self.error(f"must be a number or null, got {kind(value)}", field)


def kind(value: Any) -> str:
    """How an error message names a JSON value: ``null``, ``a boolean``, ``the number 3``, ``the
    string '...'`` (40 characters at most), ``an object``, ``an array``."""
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
        raise InputError(f"line {number}: expected a JSON object, got {kind(rec)}", table=table,
                         file=file, line=number)
    return rec


def iter_records(path: str | os.PathLike, table: str) -> Iterator[Line]:
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
                    yield Line(parse_object(raw, file, number, table), file, number, table)
        except (OSError, EOFError) as exc:  # unreadable or truncated .gz
            raise InputError(f"cannot read JSON Lines file: {exc}", table=table,
                             file=file) from exc


# ----------------------------------------------------------------------------- fields

def chain_hash_value(r: Line, default: Any = MISSING) -> int:
    """The record's ``chain_hash`` field as an unsigned 64-bit int: a number, a decimal string or a
    ``0x`` hex string of at most 16 digits (docs/jsonl.md); InputError otherwise."""
    value = r.get("chain_hash", default)
    if type(value) is int and 0 <= value <= _U64_MAX:
        return value
    if isinstance(value, str) and _HEX.fullmatch(value):
        return int(value, 16)
    if isinstance(value, str) and _DEC.fullmatch(value) and int(value) <= _U64_MAX:
        return int(value)
    raise r.error(f"must be an unsigned 64-bit integer (a number, a decimal string or a "
                  f"\"0x\" hex string of at most 16 digits), got {kind(value)}", "chain_hash")


def item_keys(r: Line, field: str, default: Any = MISSING) -> tuple[list[int], list]:
    """The item fingerprints (SPEC §2.1) and ids of the model-authored items of the item list in
    ``field`` (null: none); InputError (naming the line and field) for anything that is not a list
    of objects, items that cannot be fingerprinted, or an id that is not a string."""
    items = r.get(field, default)
    if items is None:
        return [], []
    if not isinstance(items, list):
        raise r.error(f"must be an array of item objects, got {kind(items)}", field)
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise r.error(f"item {i} must be an object, got {kind(item)}", field)
    try:
        keys, ids = model_item_keys(items)
    except (ValueError, TypeError) as exc:  # NaN/Infinity, unserializable values
        raise r.error(f"cannot be fingerprinted: {exc}", field) from exc
    except RecursionError:
        raise r.error("cannot be fingerprinted: nested too deeply", field) from None
    for i, item_id in enumerate(ids):
        if item_id is not None and not isinstance(item_id, str):
            raise r.error(f"model-authored item {i} has an id that is not a string: "
                          f"{kind(item_id)}", field)
    return keys, ids


def int32_list(r: Line, field: str) -> list[int] | None:
    """``field`` as a list of int32 values (null: None); InputError for another type or an entry
    outside the int32 range."""
    values = r.get(field)
    if values is None:
        return None
    if not isinstance(values, list):
        raise r.error(f"must be an array of integers, got {kind(values)}", field)
    if not all(type(v) is int for v in values):
        bad = next(i for i, v in enumerate(values) if type(v) is not int)
        raise r.error(f"entry {bad} must be an integer, got {kind(values[bad])}", field)
    if values and (min(values) < _I32_MIN or max(values) > _I32_MAX):
        bad = next(i for i, v in enumerate(values) if not _I32_MIN <= v <= _I32_MAX)
        raise r.error(f"entry {bad} ({values[bad]}) is outside the int32 range", field)
    return values


def float_list(r: Line, field: str) -> list[float] | None:
    """``field`` as a list of numbers (null: None), integers float32 cannot hold exactly given as
    floats (beyond float64: ±inf); InputError for another type."""
    values = r.get(field)
    if values is None:
        return None
    if not isinstance(values, list):
        raise r.error(f"must be an array of numbers or null, got {kind(values)}", field)
    if not all(type(v) in (float, int) for v in values):
        bad = next(i for i, v in enumerate(values) if type(v) not in (float, int))
        raise r.error(f"entry {bad} must be a number, got {kind(values[bad])}", field)
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


def string_list(r: Line, field: str) -> list[str] | None:
    """``field`` as a list of strings (null: None); InputError for another type or entry."""
    values = r.get(field)
    if values is None:
        return None
    if not isinstance(values, list):
        raise r.error(f"must be an array of strings or null, got {kind(values)}", field)
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise r.error(f"entry {i} must be a string, got {kind(v)}", field)
    return values
