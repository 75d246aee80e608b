"""Import raw JSON Lines captures into SPEC §2 tables (format: docs/jsonl.md).

Three files: ledger records carrying the call's raw ``output_items`` (Responses-API style
items; the model-authored ones become ``item_keys``/``item_ids``), token records, and agent
results carrying the agent's final ``output`` item list (giving ``output_keys``/``output_ids``).
Any malformed line raises InputError naming the file, the 1-based line number and the field.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa

from chainrows.errors import InputError
from chainrows.formats.jsonl.lines import (
    MISSING,
    Line,
    chain_hash_value,
    float_list,
    int32_list,
    item_keys,
    iter_records,
    string_list,
)
from chainrows.formats.native.schema import (
    ACCEPTED_FIELD,
    LEDGER_SCHEMA,
    LOGPROBS_FIELD,
    ROLLOUTS_SCHEMA,
    TOKENS_SCHEMA,
)


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


# Fields only one kind of record holds: a record that fails as one kind but holds another
# kind's field is a sign the files came in the wrong order, and the error says so.
_TELLTALES = {"ledger": ("output_items", "response_id", "delta_len", "chain_hash"), "tokens": ("tokens",),
              "results": ("reward", "output")}


def _order_hint(r: Line, table: str) -> str | None:
    """'it looks like a <kind> record ...' when ``r``, read as a ``table`` record, holds a field
    of another kind's and none of its own kind's; else None."""
    if any(f in r.rec for f in _TELLTALES[table]):
        return None
    for kind, fields in _TELLTALES.items():
        found = next((f for f in fields if f in r.rec), None)
        if kind != table and found is not None:
            return (f"it looks like a {kind} record (field {found!r}): the three files go in the order "
                    "LEDGER TOKENS RESULTS")
    return None


def _rows(path: str | os.PathLike, table: str, convert: Callable[[Line], dict]) -> Iterator[tuple[Line, dict]]:
    """(record, ``convert(record)``) of each record of the ``table`` file; an InputError of
    ``convert`` says when the record looks like one of another file (:func:`_order_hint`)."""
    for r in iter_records(path, table):
        try:
            row = convert(r)
        except InputError as exc:
            hint = _order_hint(r, table)
            if hint is None:
                raise
            raise InputError(f"{exc.reason}; {hint}", table=exc.table, file=exc.file, column=exc.column,
                             line=exc.line) from exc
        yield r, row


def read_ledger_jsonl(path: str | os.PathLike) -> pa.Table:
    """Ledger JSON Lines → ledger table (LEDGER_SCHEMA), in line order (= capture order)."""
    out = _Columns(LEDGER_SCHEMA)
    for _, row in _rows(path, "ledger", _ledger_row):
        out.add(row)
    return out.table()


def _ledger_row(r: Line) -> dict:
    rollout_id, call_id = r.string("rollout_id"), r.string("call_id")
    failed = r.boolean("failed", False)
    soft = 0 if failed else MISSING  # a failed capture may omit what it never got
    row = {
        "rollout_id": rollout_id,
        "call_id": call_id,
        "parent_id": r.string("parent_id", nullable=True, default=None),
        "response_id": r.string("response_id", default="" if failed else MISSING),
        "prev_len": r.integer("prev_len", soft),
        "delta_len": r.integer("delta_len", soft),
        "gen_len": r.integer("gen_len", soft),
        "chain_hash": chain_hash_value(r, soft),
        "failed": failed,
    }
    row["item_keys"], row["item_ids"] = item_keys(r, "output_items", None if failed else MISSING)
    return row


def read_tokens_jsonl(path: str | os.PathLike) -> pa.Table:
    """Token JSON Lines → tokens table (TOKENS_SCHEMA, + logprobs iff any record has it)."""
    out = _Columns(TOKENS_SCHEMA.append(LOGPROBS_FIELD))
    has_logprobs = False
    for r, row in _rows(path, "tokens", _tokens_row):
        has_logprobs = has_logprobs or "logprobs" in r.rec
        out.add(row)
    return out.table(drop=() if has_logprobs else ("logprobs",))


def _tokens_row(r: Line) -> dict:
    return {
        "rollout_id": r.string("rollout_id"),
        "call_id": r.string("call_id"),
        "tokens": int32_list(r, "tokens"),
        "logprobs": float_list(r, "logprobs") if "logprobs" in r.rec else None,
    }


def read_results_jsonl(path: str | os.PathLike) -> pa.Table:
    """Agent results JSON Lines → rollouts table (ROLLOUTS_SCHEMA, + accepted_response_ids
    iff any record has that field)."""
    out = _Columns(ROLLOUTS_SCHEMA.append(ACCEPTED_FIELD))
    has_accepted = False
    for r, row in _rows(path, "results", _results_row):
        has_accepted = has_accepted or "accepted_response_ids" in r.rec
        out.add(row)
    return out.table(drop=() if has_accepted else ("accepted_response_ids",))


def _results_row(r: Line) -> dict:
    row = {
        "rollout_id": r.string("rollout_id"),
        "group_id": r.string("group_id", nullable=True, default=None),
        "reward": r.number("reward"),
        "terminal_response_id": r.string("terminal_response_id", nullable=True, default=None),
        "accepted_response_ids": string_list(r, "accepted_response_ids")
        if "accepted_response_ids" in r.rec else None,
    }
    row["output_keys"], row["output_ids"] = item_keys(r, "output")
    return row
