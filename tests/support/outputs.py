"""What a run committed to OUT, for tests: ``rows`` is a directory of part files, ``report`` one
file (chainrows.runners.bulk.job)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from chainrows.outdir.provenance import provenance_of

OUTPUT_ENTRIES = {"rows", "report.parquet"}


def output_bytes(out) -> dict:
    """``{"rows": ((part name, bytes), ...), "report.parquet": bytes}`` of what OUT holds; an
    absent output is left out."""
    out = Path(out)
    got = {}
    if (out / "rows").is_dir():
        got["rows"] = tuple((p.name, p.read_bytes()) for p in sorted((out / "rows").iterdir())
                            if not p.name.startswith((".", "_")))
    if (out / "report.parquet").exists():
        got["report.parquet"] = (out / "report.parquet").read_bytes()
    return got


def output_bytes_but_input(out) -> dict:
    """``output_bytes`` for outputs of the same rows made from input files laid out otherwise:
    each file's bytes before its footer (every data page, byte for byte) and its provenance
    without the input's fingerprint, the one thing such outputs may differ in."""
    def strip(data: bytes) -> tuple:
        footer = int.from_bytes(data[-8:-4], "little")
        prov = provenance_of(pq.ParquetFile(pa.BufferReader(data)).metadata.metadata)
        assert prov is not None and prov["input"] is not None, "an output without provenance"
        return data[:len(data) - footer - 8], {k: v for k, v in prov.items() if k != "input"}
    got = output_bytes(out)
    return {"rows": tuple((name, *strip(b)) for name, b in got["rows"]),
            "report.parquet": strip(got["report.parquet"])}


def read_outputs(out) -> tuple[pa.Table, pa.Table]:
    """(rows, report) as tables, the rows' parts read in name order."""
    out = Path(out)
    return pq.read_table(out / "rows"), pq.read_table(out / "report.parquet")


def no_outputs(out) -> bool:
    """Neither output is in OUT (in either form)."""
    out = Path(out)
    return not any((out / n).exists() for n in ("rows", "rows.parquet", "report", "report.parquet"))


def read_output(out: Path) -> tuple[pa.Table, pa.Table]:
    """(rows, report) as tables, each output in either form (one file or a directory)."""
    def one(name):
        for form in (out / f"{name}.parquet", out / name):
            if form.exists():
                return pq.read_table(form)
        raise AssertionError(f"{name} missing in {out}: {sorted(os.listdir(out))}")
    return one("rows"), one("report")

