"""Call logs as JSON Lines (``.jsonl``, ``.jsonl.gz``; SPEC §8.1) -> records batches.

Each line is one call. :func:`parse_record` is the exact reader of one line: every field's
form is checked and a malformed line is an InputError naming the file, the line and the field
(chainrows.formats.jsonl.lines: the line reader and field checks import-jsonl uses). The token
arrays, nearly all of a line's bytes, are read by a kernel (chainrows.formats.json_arrays) and
the rest of the line by ``json.loads`` (chainrows.formats.json_arrays: what makes a line
doubtful); a line the kernel cannot read exactly as the exact reader would goes to the exact
reader, which gives its value or its error. ``FALLBACKS`` counts those lines by reason.
"""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from chainrows.errors import InputError
from chainrows.formats import json_arrays as JA
from chainrows.formats.calls.records import RECORDS
from chainrows.formats.jsonl import lines as J

TABLE = "calls"
BATCH_BYTES = 32 << 20  # JSON bytes per records batch
ARRAYS = ("prompt_ids", "completion_ids", "completion_logprobs")
_NAMES, _NAME_OFF = JA.field_names(ARRAYS)
_KINDS = np.array([JA.INT, JA.INT, JA.FLOAT], np.int64)
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
FAST = True  # lines through the kernel (False: json.loads of every line; tests compare the two)
FALLBACKS: Counter = Counter()  # reason -> lines read by the exact reader instead


def parse_record(r) -> dict:
    """The RECORDS fields (but ``record``) of one parsed line ``r`` (a line of
    chainrows.io.jsonl.iter_records), or InputError naming the line and the field. Where the
    kernel read the arrays, ``r.rec`` holds them as numpy arrays (form already checked)."""
    failed = r.boolean("failed", False)
    rec = r.rec
    out = {
        "rollout_id": r.string("rollout_id"),
        "call_id": r.string("call_id"),
        "response_id": r.string("response_id", nullable=True, default=None),
        "declares": "parent_id" in rec,
        "parent_id": r.string("parent_id", nullable=True, default=None),
        "failed": failed,
    }
    out["prompt_ids"] = _tokens(r, "prompt_ids", failed, least=0)
    out["completion_ids"] = _tokens(r, "completion_ids", failed, least=1)
    out["completion_logprobs"] = _logprobs(r, out["completion_ids"])
    keys, ids = J.item_keys(r, "output_items", None if failed else J.MISSING)
    out["item_keys"], out["item_ids"] = keys, ids
    return out


def _tokens(r, field: str, failed: bool, least: int) -> list | None:
    if field not in r.rec:
        if failed:
            return None
        raise r.error("is missing", field)
    values = r.rec[field] if isinstance(r.rec[field], np.ndarray) else J.int32_list(r, field)
    if values is None:
        if failed:
            return None
        raise r.error("must be an array of integers, got null", field)
    if len(values) < least and not failed:
        raise r.error(f"must hold at least {least} token{'s' if least > 1 else ''}, got an empty array", field)
    return values


def _logprobs(r, completion: list | None) -> list | None:
    if "completion_logprobs" not in r.rec:
        return None
    values = r.rec["completion_logprobs"]
    if not isinstance(values, np.ndarray):
        values = J.float_list(r, "completion_logprobs")
    n = 0 if completion is None else len(completion)
    if values is not None and len(values) != n:
        raise r.error(f"has {len(values)} entries, completion_ids {n}: they must be of the same length",
                      "completion_logprobs")
    return values


def _list_column(values: list, dtype, arrow_type) -> pa.Array:
    """A list column of per-row arrays or lists (None: a null list)."""
    with np.errstate(over="ignore"):  # a logprob beyond float32 is stored as ±inf (the engine reports it)
        arrays = [np.zeros(0, dtype) if v is None else np.asarray(v, dtype) for v in values]
    offsets = np.zeros(len(arrays) + 1, np.int64)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype)
    valid = np.array([v is not None for v in values], bool)
    off = pa.array(offsets.astype(np.int32)) if offsets[-1] < 2**31 else pa.array(offsets)
    make = pa.ListArray if offsets[-1] < 2**31 else pa.LargeListArray
    out = make.from_arrays(off, pa.array(flat, arrow_type), mask=None if valid.all() else pa.array(~valid))
    return out.cast(pa.list_(arrow_type)) if make is pa.LargeListArray else out


def records(rows: list, first_record: int) -> pa.RecordBatch:
    """A RECORDS batch of parse_record results."""
    columns = {f.name: [row[f.name] for row in rows] for f in RECORDS if f.name not in ("record",) + ARRAYS}
    columns["record"] = list(range(first_record, first_record + len(rows)))
    arrays = {"prompt_ids": _list_column([r["prompt_ids"] for r in rows], np.int32, pa.int32()),
              "completion_ids": _list_column([r["completion_ids"] for r in rows], np.int32, pa.int32()),
              "completion_logprobs": _list_column([r["completion_logprobs"] for r in rows], np.float32, pa.float32())}
    return pa.RecordBatch.from_arrays([arrays[f.name] if f.name in arrays else pa.array(columns[f.name], f.type)
                                       for f in RECORDS], schema=RECORDS)


def exact_batch(numbers: list, lines: list, path: Path, first_record: int) -> pa.RecordBatch:
    """A RECORDS batch of raw lines, each read by json.loads and checked, one after the other
    (the first malformed line is the one reported)."""
    return records([parse_record(_exact_line(raw, path, number)) for number, raw in zip(numbers, lines)],
                   first_record)


def _exact_line(raw: bytes, path: Path, number: int):
    return J.Line(J.parse_object(raw, path, number, TABLE), path, number, TABLE)


def _int32_bad(ints: np.ndarray, state, ranges) -> np.ndarray:
    """Per line: some integer array of it holds a value outside int32 (left to the exact reader
    for its message)."""
    out_of = (ints < _I32_MIN) | (ints > _I32_MAX)
    if not out_of.any():
        return np.zeros(len(state), bool)
    cs = np.concatenate(([0], np.cumsum(out_of)))
    bad = np.zeros(len(state), bool)
    for f in (0, 1):
        bad |= (state[:, f] == JA.ARRAY) & (cs[ranges[:, 2 * f + 1]] > cs[ranges[:, 2 * f]])
    return bad


def _reduced(raw: bytes, span_starts: list, span_ends: list, base: int):
    """The line with each array replaced by ``0``, parsed; None when json.loads does not give an
    object with those zeros, or a lone surrogate is in it (the exact reader decides then)."""
    parts, at = [], 0
    for a, b in sorted(zip(span_starts, span_ends)):
        parts += [raw[at:a - base], b"0"]
        at = b - base
    parts.append(raw[at:])
    reduced = b"".join(parts)  # the arrays hold digits only: a surrogate is in what is left
    try:  # decoded as UTF-8 here: json.loads(bytes) would guess UTF-16/32 from NULs
        rec = json.loads(reduced.decode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(rec, dict) or (J.SURROGATE.search(reduced) and J.has_lone_surrogate(rec)):
        return None
    return rec


def fast_batch(numbers: list, lines: list, path: Path, first_record: int) -> pa.RecordBatch:
    """A RECORDS batch of raw lines: the arrays read by the kernel, the rest by json.loads, a
    doubtful line by the exact reader."""
    buf = np.frombuffer(b"".join(lines), np.uint8)
    ends = np.cumsum([len(x) for x in lines]).astype(np.int64)
    starts = ends - np.array([len(x) for x in lines], np.int64)
    status, state, spans, ranges, ints, floats, slow = JA.scan(buf, starts, ends, _NAMES, _NAME_OFF, _KINDS, JA.POW10)
    JA.convert_slow(buf, slow, floats)
    status = np.where((status == JA.OK) & _int32_bad(ints, state, ranges), -1, status)
    rows = []
    for ln, (number, raw) in enumerate(zip(numbers, lines)):
        rec = None
        if status[ln] == JA.OK:
            mine = np.flatnonzero(state[ln] == JA.ARRAY)
            rec = _reduced(raw, spans[ln, 2 * mine].tolist(), spans[ln, 2 * mine + 1].tolist(), starts[ln])
            if rec is not None and any(type(rec.get(ARRAYS[f])) is not int or rec[ARRAYS[f]] != 0 for f in mine):
                rec = None
        if rec is None:
            FALLBACKS[JA.REASONS[status[ln]] if status[ln] > 0 else
                      "integer beyond int32" if status[ln] < 0 else "json.loads disagrees"] += 1
            rows.append(parse_record(_exact_line(raw, path, number)))
            continue
        for f in mine.tolist():
            a, b = ranges[ln, 2 * f], ranges[ln, 2 * f + 1]
            rec[ARRAYS[f]] = ints[a:b] if _KINDS[f] == JA.INT else floats[a:b]
        rows.append(parse_record(J.Line(rec, path, number, TABLE)))
    return records(rows, first_record)


def raw_blocks(path: Path, block_bytes: int) -> Iterator[tuple[list, list, int]]:
    """(line numbers, raw lines, input bytes consumed) of the non-blank lines of a JSON Lines
    file (gzip when its name ends in ``.gz``), about ``block_bytes`` of lines at a time; the
    bytes consumed are of the file as stored (compressed for ``.gz``). InputError when the
    file cannot be opened or read (a truncated .gz), naming it."""
    try:
        raw = open(path, "rb")
    except OSError as exc:
        raise InputError(f"cannot open JSON Lines file: {exc.strerror or exc}", table=TABLE, file=path) from exc
    with raw:
        handle = gzip.GzipFile(fileobj=raw) if path.suffix == ".gz" else raw
        numbers, lines, size, told = [], [], 0, 0
        try:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                numbers.append(number)
                lines.append(line)
                size += len(line)
                if size >= block_bytes:
                    at = raw.tell()
                    yield numbers, lines, at - told
                    told, numbers, lines, size = at, [], [], 0
        except (OSError, EOFError) as exc:
            raise InputError(f"cannot read JSON Lines file: {exc}", table=TABLE, file=path) from exc
        yield numbers, lines, raw.tell() - told


def read_jsonl(path: str | os.PathLike, first_record: int = 0, batch_bytes: int | None = None,
               advance: Callable[[int], None] | None = None) -> Iterator[pa.RecordBatch]:
    """RECORDS batches of a JSON Lines call log, in line order, records numbered from
    ``first_record``; ``advance(n)`` is told the file bytes each batch consumed. InputError
    (file, line, field) on the first malformed line."""
    path = Path(path)
    n = first_record
    for numbers, lines, consumed in raw_blocks(path, batch_bytes or BATCH_BYTES):
        if lines:
            yield (fast_batch if FAST else exact_batch)(numbers, lines, path, n)
            n += len(lines)
        if advance:
            advance(consumed)


__all__ = ["read_jsonl", "parse_record", "exact_batch", "fast_batch", "raw_blocks", "FALLBACKS"]
