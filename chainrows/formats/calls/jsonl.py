"""Call logs as JSON Lines (``.jsonl``, ``.jsonl.gz``; SPEC §8.1) -> records batches.

Each line is one call. :func:`parse_record` is the exact reader of one line: every field's
form is checked and a malformed line is an InputError naming the file, the line and the field
(chainrows.io.jsonl's line reader and field checks, shared with import-jsonl). The token
arrays, nearly all of a line's bytes, are read by a kernel (chainrows.formats.calls.scan) and
the rest of the line by ``json.loads``; a line the kernel cannot read exactly as the exact
reader would goes to the exact reader, which gives its value or its error.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Callable, Iterator

import pyarrow as pa

from chainrows.formats.calls.records import RECORDS
from chainrows.io import jsonl as J
from chainrows.io.errors import InputError

TABLE = "calls"
BATCH_BYTES = 32 << 20  # JSON bytes per records batch


def parse_record(r) -> dict:
    """The RECORDS fields (but ``record``) of one parsed line ``r`` (a line of
    chainrows.io.jsonl.iter_records), or InputError naming the line and the field."""
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
    keys, ids = J._item_keys(r, "output_items", None if failed else J._MISSING)
    out["item_keys"], out["item_ids"] = keys, ids
    return out


def _tokens(r, field: str, failed: bool, least: int) -> list | None:
    if field not in r.rec:
        if failed:
            return None
        raise r.error("is missing", field)
    values = J._int32_list(r, field)
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
    values = J._float_list(r, "completion_logprobs")
    if values is not None and len(values) != len(completion or ()):
        raise r.error(f"has {len(values)} entries, completion_ids {len(completion or ())}: they must "
                      f"be of the same length", "completion_logprobs")
    return values


def exact_batch(lines: list, first_record: int) -> pa.RecordBatch:
    """A RECORDS batch of parsed lines (chainrows.io.jsonl line objects) read exactly."""
    rows = [parse_record(r) for r in lines]
    columns = {f.name: [row[f.name] for row in rows] for f in RECORDS if f.name != "record"}
    columns["record"] = list(range(first_record, first_record + len(rows)))
    return pa.RecordBatch.from_pydict(columns, schema=RECORDS)


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
        parsed = [J._Line(J.parse_object(raw, path, number, TABLE), path, number, TABLE)
                  for number, raw in zip(numbers, lines)]
        if parsed:
            yield exact_batch(parsed, n)
            n += len(parsed)
        if advance:
            advance(consumed)


__all__ = ["read_jsonl", "parse_record", "exact_batch", "raw_blocks"]
