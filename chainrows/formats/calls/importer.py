"""The import's core, shared by the command and the Python API: records batches in input
order in, the ledger, tokens and import_report rows of each out (SPEC §8)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from chainrows.formats.calls.records import lower
from chainrows.formats.calls.state import ImportState
from chainrows.formats.calls.summary import CallsSummary, collect
from chainrows.formats.calls.tables import LEDGER, ON_DRIFT, REPORT, TOKENS, chunk_tables


class Importer:
    """Decides records batches one after the other (each must follow the one before in input
    order) and keeps the summary's counts. ``state`` is what it remembers of earlier records."""

    def __init__(self, on_drift: str = "root"):
        if on_drift not in ON_DRIFT:
            raise ValueError(f"on_drift must be one of {ON_DRIFT}, got {on_drift!r}")
        self.on_drift = on_drift
        self.state = ImportState()
        self.summary = CallsSummary()
        self._drifted = np.zeros(64, bool)

    def add(self, batch: pa.RecordBatch) -> tuple[pa.Table, pa.Table, pa.Table]:
        """(ledger, tokens, import_report) of the records ``batch`` (RECORDS schema)."""
        low = lower(batch)
        dec = self.state.decide(low)
        ledger, tokens, report = chunk_tables(batch, low, dec, self.state, self.on_drift)
        s = self.summary
        self._drifted = collect(s, batch, dec, self._drifted, self.state.calls.names)
        s.input_tokens += int(low.prompt_off[-1] - low.prompt_off[0] + low.completion_off[-1] - low.completion_off[0])
        s.has_logprobs = s.has_logprobs or bool(low.has_logprobs.any())
        s.rollouts = self.state.rollouts.n_codes
        s.drifted_rollouts = int(self._drifted.sum())
        return ledger, tokens, report


@dataclass
class CallsImport:
    """An import done in memory: the §2 tables (``rollouts`` None when no results were
    given), ``import_report``, and the summary."""

    ledger: pa.Table
    tokens: pa.Table
    rollouts: pa.Table | None
    import_report: pa.Table
    summary: CallsSummary

    def __iter__(self):
        return iter((self.ledger, self.tokens, self.rollouts, self.import_report))


def import_calls(calls, results=None, *, on_drift: str = "root", batch_rows: int = 4096) -> CallsImport:
    """SPEC §8 in memory: a call log -> the §2 tables and import_report.

    ``calls``: an Arrow table in the Parquet form of docs/calls.md (one row per call, capture
    order), or the path of a log (JSON Lines, Parquet file or directory), read whole.
    ``results``: the rollouts table (SPEC §2), the path of a results JSON Lines file as
    import-jsonl reads it, or None (``rollouts`` is None then). InputError (column and row, or
    file, line and field) on a malformed call. For logs larger than memory, the command
    ``chainrows import-calls`` (chainrows.runners.calls) streams under a memory budget."""
    from chainrows.formats.calls.arrow_input import records_from_table
    from chainrows.formats.calls.sources import open_source
    from chainrows.formats.jsonl.importer import read_results_jsonl

    if isinstance(calls, (pa.Table, pa.RecordBatch)):
        table = pa.Table.from_batches([calls]) if isinstance(calls, pa.RecordBatch) else calls
        batches = (records_from_table(table.slice(start, batch_rows), row0=start, first_record=start)
                   for start in range(0, table.num_rows, batch_rows))
    else:
        batches = open_source(calls).batches(32 << 20)
    parts: dict[str, list] = {"ledger": [], "tokens": [], "report": []}
    importer = Importer(on_drift)
    for batch in batches:
        for name, rows in zip(parts, importer.add(batch)):
            parts[name].append(rows)
    summary = importer.summary
    rollouts = results if results is None or isinstance(results, pa.Table) else read_results_jsonl(results)
    summary.results = 0 if rollouts is None else rollouts.num_rows
    tokens = drop_logprobs_if_none(concat(parts["tokens"], TOKENS), summary)
    return CallsImport(concat(parts["ledger"], LEDGER), tokens, rollouts, concat(parts["report"], REPORT), summary)


def concat(parts: list[pa.Table], schema: pa.Schema) -> pa.Table:
    return pa.concat_tables(parts) if parts else schema.empty_table()


def drop_logprobs_if_none(tokens: pa.Table, summary: CallsSummary) -> pa.Table:
    """SPEC §8.1: the logprobs column exists iff some record had completion_logprobs."""
    return tokens if summary.has_logprobs else tokens.drop_columns(["logprobs"])


__all__ = ["Importer", "CallsImport", "import_calls", "concat", "drop_logprobs_if_none", "LEDGER", "TOKENS",
           "REPORT"]
