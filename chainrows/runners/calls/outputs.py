"""The import's output files (SPEC §8.6), written as the records are decided.

``ledger/`` and ``tokens/`` are directories of Parquet parts and ``import_report.parquet`` one
file, each cut into row groups and parts by content alone (chainrows.io.rowgroups), so the bytes
depend only on the rows written, whatever the chunking or the path the import took.
``rollouts.parquet`` (the results) is written last: it is the commit marker of the dataset.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from chainrows.errors import writing
from chainrows.formats.calls.tables import LEDGER, REPORT, TOKENS
from chainrows.lowering.rowgroups import PartsWriter, RowGroupWriter
from chainrows.outdir.atomic import AtomicOutput
from chainrows.outdir.parquet import WRITE_OPTIONS

NAMES = ("ledger", "tokens", "import_report", "rollouts")  # commit order: rollouts marks a dataset
ENCODE_PENDING = 64 << 20  # cut row groups waiting for an encoder thread, at most


class CallsOutput:
    """The three streamed outputs of one import inside an open AtomicOutput. ``logprobs``: the
    tokens table carries the logprobs column (:meth:`finish` drops it when no record had any);
    ``pending_bytes``: cut row groups that may wait for the encoder threads.
    A context manager: leaving on an exception stops the writers (the AtomicOutput discards
    their files)."""

    def __init__(self, out: AtomicOutput, logprobs: bool, pending_bytes: int = ENCODE_PENDING):
        self.out = out
        self.tokens_schema = TOKENS if logprobs else TOKENS.remove(TOKENS.get_field_index("logprobs"))
        self.ledger = PartsWriter(lambda: out.reserve_part("ledger"), LEDGER, max_pending_bytes=pending_bytes // 4)
        self.tokens = PartsWriter(lambda: out.reserve_part("tokens"), self.tokens_schema, unit_column="tokens",
                                  max_pending_bytes=pending_bytes)
        self.report = RowGroupWriter(out.reserve_file("import_report"), REPORT)

    def write(self, ledger: pa.Table, tokens: pa.Table, report: pa.Table) -> None:
        self.ledger.write(ledger)
        self.tokens.write(tokens.select(self.tokens_schema.names))
        self.report.write(report)

    def close(self) -> None:
        for writer in (self.ledger, self.tokens, self.report):
            writer.close()

    def finish(self, rollouts: pa.Table, has_logprobs: bool) -> None:
        """Close the writers, drop an unused logprobs column, write ``rollouts`` (last)."""
        self.close()
        if not has_logprobs and "logprobs" in self.tokens_schema.names:
            drop_column(Path(self.out.tmp_dir) / "tokens", "logprobs")
        self.out.write_table("rollouts", rollouts)

    def __enter__(self) -> CallsOutput:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            return
        for writer in (self.ledger, self.tokens, self.report):
            writer.__exit__(exc_type, exc, tb)


def drop_column(folder: Path, name: str) -> None:
    """Rewrite every part file of ``folder`` without column ``name``, row group by row group
    (the groups stay where they were: the bytes are those of a run that never had it)."""
    for part in sorted(folder.iterdir()):
        pf = pq.ParquetFile(part)
        schema = pf.schema_arrow.remove(pf.schema_arrow.get_field_index(name))
        tmp = part.with_name(part.name + ".tmp")
        with writing(tmp), pq.ParquetWriter(tmp, schema, **WRITE_OPTIONS) as writer:
            for i in range(pf.num_row_groups):
                group = pf.read_row_group(i).drop_columns([name])
                writer.write_table(group, row_group_size=max(group.num_rows, 1))
        pf.close()
        os.replace(tmp, part)
