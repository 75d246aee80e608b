"""A NeMo Gym dump's layout and its three kinds of lines (docs/gym.md, "The dump"), parsed and form-checked.

A dump is a directory holding ``receipts.jsonl``, ``staged.jsonl`` and ``results.jsonl`` (each
may be ``.jsonl.gz``). Every parser here checks *form* only (JSON types, required fields) and
raises :class:`~chainrows.errors.InputError` naming the file, the 1-based line and the field;
what the values mean (lengths, masks, digests) is chainrows.formats.gym.verify's job and never an
error here. Token payloads become numpy arrays in one conversion per line.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from chainrows.errors import InputError
from chainrows.formats.gym.fingerprints import key_of, model_items
from chainrows.formats.gym.wire import is_hex64
from chainrows.formats.jsonl.lines import Line, kind, parse_object

NAMES = ("receipts", "staged", "results")
_MISSING = object()


def dump_files(dump_dir: str | os.PathLike) -> dict[str, Path]:
    """name -> the file of that table in the dump (``<name>.jsonl`` or ``<name>.jsonl.gz``)."""
    root = Path(dump_dir)
    if not root.is_dir():
        raise InputError("not a directory (a NeMo Gym dump is a directory of JSON Lines files)",
                         directory=root)
    out = {}
    for name in NAMES:
        found = [root / f"{name}{ext}" for ext in (".jsonl", ".jsonl.gz") if (root / f"{name}{ext}").is_file()]
        if not found:
            raise InputError(f"missing {name}.jsonl (or {name}.jsonl.gz)", table=name, directory=root)
        if len(found) > 1:
            raise InputError(f"both {name}.jsonl and {name}.jsonl.gz exist; keep one", table=name,
                             directory=root)
        out[name] = found[0]
    return out


def open_lines(path: Path, table: str):
    """The file's raw lines (binary; gzip when the name ends in ``.gz``)."""
    try:
        return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    except OSError as exc:
        raise InputError(f"cannot open JSON Lines file: {exc.strerror or exc}", table=table, file=path) from exc


def iter_raw(path: Path, table: str) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw line) of every non-blank line."""
    with open_lines(path, table) as handle:
        try:
            for number, raw in enumerate(handle, start=1):
                if raw.strip():
                    yield number, raw
        except (OSError, EOFError) as exc:  # unreadable or truncated .gz
            raise InputError(f"cannot read JSON Lines file: {exc}", table=table, file=path) from exc


def parse_line(raw: bytes, file: Path, number: int, table: str) -> Line:
    """One JSON object (:func:`chainrows.formats.jsonl.lines.parse_object`'s checks)."""
    return Line(parse_object(raw, file, number, table), file, number, table)


# ----------------------------------------------------------------------------- field helpers

class _Obj:
    """A nested object of a line (a manifest entry), with the line's error context."""

    def __init__(self, line: Line, rec: dict, prefix: str):
        self.line, self.rec, self.prefix = line, rec, prefix

    def get(self, name: str, default: Any = _MISSING) -> Any:
        value = self.rec.get(name, default)
        if value is _MISSING:
            raise self.error("is missing", name)
        return value

    def error(self, what: str, name: str) -> InputError:
        return self.line.error(what, f"{self.prefix}{name}")


def _string(o, name, nullable=False, default: Any = _MISSING):
    value = o.get(name, default)
    if isinstance(value, str) or (nullable and value is None):
        return value
    raise o.error(f"must be a string{' or null' if nullable else ''}, got {kind(value)}", name)


def _integer(o, name, default: Any = _MISSING) -> int:
    value = o.get(name, default)
    if type(value) is int and -(1 << 63) <= value < (1 << 63):
        return value
    raise o.error(f"must be an integer in the int64 range, got {kind(value)}", name)


def _numbers(o, name, what: str) -> list:
    value = o.get(name)
    if not isinstance(value, list):
        raise o.error(f"must be an array of {what}, got {kind(value)}", name)
    return value


def _types_within(values: list, allowed: set) -> bool:
    return set(map(type, values)) <= allowed  # C-level scan: no Python loop per token


def _inferred(values: list) -> np.ndarray | None:
    """numpy's own reading of ``values`` when it is a flat array, else None (nested or ragged
    entries: left to the per-value type check, which names the entry)."""
    try:
        arr = np.array(values)
    except (ValueError, TypeError):
        return None
    return arr if arr.ndim == 1 else None


def _int_array(o, name, no_bools: bool) -> tuple[np.ndarray, bool]:
    """(uint64 ids, in_range): ids outside [0, 2**64) are kept wrapped, flagged for verify.
    ``no_bools``: the line holds no ``true``/``false`` at all, so numpy's own type inference is
    an exact check (it would read a bool as 0/1); else every value's type is checked."""
    values = _numbers(o, name, "integers")
    arr = _inferred(values) if no_bools and values else None
    if arr is not None:
        if arr.dtype.kind == "u":
            return arr.astype(np.uint64, copy=False), True
        if arr.dtype.kind == "i":
            return arr.astype(np.uint64), bool(arr.min() >= 0)
    if not _types_within(values, {int}):
        bad = next(i for i, v in enumerate(values) if type(v) is not int)
        raise o.error(f"entry {bad} must be an integer, got {kind(values[bad])}", name)
    try:
        return np.array(values, dtype=np.uint64), True
    except OverflowError:  # an id < 0 or >= 2**64: an integrity failure, not a form error
        return np.array([v & 0xFFFFFFFFFFFFFFFF for v in values], dtype=np.uint64), False


def _float_array(o, name, no_bools: bool) -> np.ndarray:
    values = _numbers(o, name, "numbers")
    arr = _inferred(values) if no_bools and values else None
    if arr is not None:
        if arr.dtype.kind in "fiu":
            return arr.astype(np.float64, copy=False)
    if not _types_within(values, {int, float}):
        bad = next(i for i, v in enumerate(values) if type(v) not in (int, float))
        raise o.error(f"entry {bad} must be a number, got {kind(values[bad])}", name)
    try:
        return np.array(values, dtype=np.float64)
    except OverflowError:  # an integer beyond float64: an impossible mask or logprob
        return np.full(len(values), np.inf)


# ----------------------------------------------------------------------------- staged calls

SHARED = ("schema_version", "digest_version", "extras_digest_version", "parent_call_id", "mode",
          "prev_len", "delta_len", "cum_len", "weight_version", "digest", "extras_digest",
          "chain_hash", "cumulative_hash")
_INT_FIELDS = ("schema_version", "digest_version", "extras_digest_version", "prev_len", "delta_len",
               "cum_len", "weight_version")


@dataclass
class StagedCall:
    """One line of staged.jsonl. ``tokens``: uint64 ids (wrapped when ``ids_in_u64`` is False);
    ``mask`` and ``logprobs`` as given (float64); ``extras`` None when absent."""

    rollout_id: str
    model_call_id: str
    parent_call_id: str | None
    mode: str
    schema_version: int
    digest_version: int
    extras_digest_version: int
    prev_len: int
    delta_len: int
    cum_len: int
    weight_version: int
    digest: str
    extras_digest: str
    chain_hash: str | None
    cumulative_hash: str | None
    tokens: np.ndarray
    ids_in_u64: bool
    mask: np.ndarray
    logprobs: np.ndarray
    extras: Any
    line: int


def parse_staged(r: Line, raw: bytes | None = None, arrays=None) -> StagedCall:
    """``raw``: the line's bytes, when at hand (lets the number arrays skip a per-value type
    scan when the line holds no JSON booleans). ``arrays``: the three arrays as
    chainrows.formats.gym.fast read them (a fast.Parsed; ``r`` is then its record, whose arrays
    are placeholders); the other fields are checked here in the same order either way."""
    no_bools = raw is not None and b"true" not in raw and b"false" not in raw
    ints = {f: _integer(r, f) for f in _INT_FIELDS}
    if arrays is None:
        tokens, in_range = _int_array(r, "token_ids_delta", no_bools)
    else:
        tokens, in_range = arrays.tokens, arrays.ids_in_u64
    extras = r.rec.get("extras")
    if extras is not None and not isinstance(extras, dict):
        raise r.error(f"must be an object or null, got {kind(extras)}", "extras")
    return StagedCall(
        rollout_id=r.string("rollout_id"), model_call_id=r.string("model_call_id"),
        parent_call_id=r.string("parent_call_id", nullable=True, default=None), mode=r.string("mode"),
        digest=r.string("digest"), extras_digest=r.string("extras_digest"),
        chain_hash=r.string("chain_hash", nullable=True, default=None),
        cumulative_hash=r.string("cumulative_hash", nullable=True, default=None),
        tokens=tokens, ids_in_u64=in_range,
        mask=_float_array(r, "token_mask_delta", no_bools) if arrays is None else arrays.mask,
        logprobs=_float_array(r, "generation_log_probs_delta", no_bools) if arrays is None else arrays.logprobs,
        extras=extras, line=r.line, **ints,
    )


def staged_lines(source, file: Path, fast: bool = True) -> Iterator[tuple[int, bytes, Line, Any]]:
    """(number, raw, Line, fast.Parsed or None) of every staged line of ``source``. ``fast``:
    the token arrays are read by chainrows.formats.gym.fast, and only the lines it doubts are
    decoded whole by json.loads; either way the Line's scalar fields are json.loads'.
    Raises the exact parser's InputError for a line that is not a JSON object."""
    if not fast:
        for number, raw in source:
            yield number, raw, parse_line(raw, file, number, "staged"), None
        return
    from chainrows.formats.gym.fast import blocks

    for number, raw, parsed in blocks(source):
        if parsed is None:
            yield number, raw, parse_line(raw, file, number, "staged"), None
        else:
            yield number, raw, Line(parsed.rec, file, number, "staged"), parsed


def parse_staged_line(number: int, raw: bytes, line: Line, parsed, file: Path) -> StagedCall:
    """A StagedCall from a staged_lines item. A line the fast reader read that fails a form
    check is parsed again exactly, so the error is the exact parser's own."""
    if parsed is not None:
        try:
            return parse_staged(line, arrays=parsed)
        except InputError:
            line = parse_line(raw, file, number, "staged")
    return parse_staged(line, raw)


def staged_key(r: Line) -> tuple[str, str]:
    """(rollout_id, model_call_id) of a staged line, form-checked (for partitioning)."""
    return r.string("rollout_id"), r.string("model_call_id")


# ----------------------------------------------------------------------------- receipts

@dataclass
class CallRecord:
    """One manifest entry. ``item_keys``/``item_ids`` come from ``output_items``."""

    model_call_id: str
    parent_call_id: str | None
    mode: str
    schema_version: int
    digest_version: int
    extras_digest_version: int
    prev_len: int
    delta_len: int
    cum_len: int
    weight_version: int
    digest: str | None
    extras_digest: str | None
    chain_hash: str | None
    cumulative_hash: str | None
    staging_key: str | None
    response_id: str
    item_keys: list
    item_ids: list


@dataclass
class Receipt:
    rollout_id: str
    reward: float | None
    manifest: list
    pending_call_ids: list
    capture_poisoned: bool
    line: int
    terminal_model_call_id: str | None = None
    extra: dict = field(default_factory=dict)


def _output_items(o: _Obj, name: str, default) -> tuple[list, list]:
    items = o.get(name, default)
    if items is None:
        return [], []
    if not isinstance(items, list):
        raise o.error(f"must be an array of {{id, fingerprint}} objects or null, got {kind(items)}", name)
    keys, ids = [], []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not is_hex64(item.get("fingerprint")):
            raise o.error(f"entry {i} must be an object with a 64-hex 'fingerprint'", name)
        item_id = item.get("id")
        if item_id is not None and not isinstance(item_id, str):
            raise o.error(f"entry {i} has an id that is not a string: {kind(item_id)}", name)
        keys.append(key_of(item["fingerprint"]))
        ids.append(item_id)
    return keys, ids


def parse_record(o: _Obj, soft: bool) -> CallRecord:
    """``soft``: the receipt is poisoned, so a missing field takes a neutral default (the
    rollout is masked capture_failed whatever it holds)."""
    d0, dn = (0, None) if soft else (_MISSING, _MISSING)
    keys, ids = _output_items(o, "output_items", None)
    return CallRecord(
        model_call_id=_string(o, "model_call_id"),
        parent_call_id=_string(o, "parent_call_id", nullable=True, default=None),
        mode=_string(o, "mode", default="" if soft else _MISSING),
        **{f: _integer(o, f, d0) for f in _INT_FIELDS},
        digest=_string(o, "digest", nullable=soft, default=dn),
        extras_digest=_string(o, "extras_digest", nullable=soft, default=dn),
        chain_hash=_string(o, "chain_hash", nullable=True, default=None),
        cumulative_hash=_string(o, "cumulative_hash", nullable=True, default=None),
        staging_key=_string(o, "staging_key", nullable=True, default=None),
        response_id=_string(o, "response_id", default="" if soft else _MISSING),
        item_keys=keys, item_ids=ids,
    )


def parse_receipt(r: Line) -> Receipt:
    rollout_id = r.string("rollout_id")
    poisoned = r.boolean("capture_poisoned", False)
    manifest = r.get("manifest", [] if poisoned else _MISSING)
    if manifest is None:
        manifest = []
    if not isinstance(manifest, list):
        raise r.error(f"must be an array of CallRecord objects, got {kind(manifest)}", "manifest")
    records = []
    for i, entry in enumerate(manifest):
        if not isinstance(entry, dict):
            raise r.error(f"entry {i} must be an object, got {kind(entry)}", "manifest")
        records.append(parse_record(_Obj(r, entry, f"manifest[{i}]."), poisoned))
    pending = r.get("pending_call_ids", [])
    if pending is None:
        pending = []
    if not isinstance(pending, list) or not all(isinstance(p, str) for p in pending):
        raise r.error("must be an array of strings", "pending_call_ids")
    return Receipt(rollout_id=rollout_id, reward=r.number("reward", None), manifest=records,
                   pending_call_ids=pending, capture_poisoned=poisoned, line=r.line,
                   terminal_model_call_id=r.string("terminal_model_call_id", nullable=True, default=None))


# ----------------------------------------------------------------------------- results

@dataclass
class Result:
    rollout_id: str
    group_id: str | None
    response_id: str | None
    output_keys: list
    output_ids: list
    terminal_response_id: str | None
    accepted_response_ids: list | None
    line: int


def parse_result(r: Line) -> Result:
    response = r.get("response")
    if response is not None and not isinstance(response, dict):
        raise r.error(f"must be an object {{id, output}} or null, got {kind(response)}", "response")
    response = response or {}
    resp_id = response.get("id")
    if resp_id is not None and not isinstance(resp_id, str):
        raise r.error(f"id must be a string or null, got {kind(resp_id)}", "response")
    output = response.get("output")
    if output is None:
        output = []
    if not isinstance(output, list) or not all(isinstance(i, dict) for i in output):
        raise r.error("output must be an array of item objects", "response")
    try:
        keys, ids = model_items(output)
    except (ValueError, TypeError) as exc:
        raise r.error(f"output cannot be fingerprinted: {exc}", "response") from exc
    except RecursionError:
        raise r.error("output cannot be fingerprinted: nested too deeply", "response") from None
    for i, item_id in enumerate(ids):
        if item_id is not None and not isinstance(item_id, str):
            raise r.error(f"model-authored output item {i} has an id that is not a string", "response")
    return Result(rollout_id=r.string("rollout_id"), group_id=r.string("group_id", nullable=True, default=None),
                  response_id=resp_id, output_keys=keys, output_ids=ids,
                  terminal_response_id=r.string("terminal_response_id", nullable=True, default=None),
                  accepted_response_ids=_trajectory(r), line=r.line)


def _trajectory(r: Line) -> list | None:
    """The response_ids of ng_trajectory's model-call refs, in order; None when absent."""
    traj = r.rec.get("ng_trajectory")
    if traj is None:
        return None
    turns = traj.get("turns") if isinstance(traj, dict) else None
    if not isinstance(turns, list):
        raise r.error("must be an object with a 'turns' array", "ng_trajectory")
    out = []
    for t, turn in enumerate(turns):
        calls = turn.get("model_calls") if isinstance(turn, dict) else None
        if calls is None:
            calls = []
        if not isinstance(calls, list):
            raise r.error(f"turns[{t}].model_calls must be an array", "ng_trajectory")
        for ref in calls:
            rid = ref.get("response_id") if isinstance(ref, dict) else None
            if not isinstance(rid, str):
                raise r.error(f"turns[{t}].model_calls entries need a string 'response_id'", "ng_trajectory")
            out.append(rid)
    return out
