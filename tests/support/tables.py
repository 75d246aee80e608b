"""SPEC §2 datasets as the fuzz and CLI tests build them: dict lists (``Data``) -> Arrow tables of
the canonical schemas -> Parquet directories (one file or part files per table), and column edits
that make a table hostile."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from chainrows.formats.native.schema import (
    ACCEPTED_FIELD,
    LEDGER_SCHEMA,
    LOGPROBS_FIELD,
    ROLLOUTS_SCHEMA,
    TOKENS_SCHEMA,
)
from tests.support.builders import combine, one_call, single_chain, worked_example
from tests.support.randomized import random_dataset

TABLES = ("ledger", "tokens", "rollouts")

CANONICAL = {
    "ledger": LEDGER_SCHEMA,
    "tokens": TOKENS_SCHEMA,
    "rollouts": ROLLOUTS_SCHEMA,
}


def schemas(logprobs: bool, accepted: bool) -> dict:
    return {
        "ledger": LEDGER_SCHEMA,
        "tokens": TOKENS_SCHEMA.append(LOGPROBS_FIELD) if logprobs else TOKENS_SCHEMA,
        "rollouts": ROLLOUTS_SCHEMA.append(ACCEPTED_FIELD) if accepted else ROLLOUTS_SCHEMA,
    }


def build_tables(data: Data) -> dict[str, pa.Table]:
    sch = schemas(data.logprobs, data.accepted)
    out = {}
    for name, rows in zip(TABLES, (data.ledger, data.tokens, data.rollouts)):
        rows = [{f.name: r.get(f.name) for f in sch[name]} for r in rows]
        out[name] = pa.Table.from_pylist(rows, schema=sch[name])
    return out


def write_table(root: Path, name: str, table, *, parts: int = 1, **options) -> None:
    """``table``: a pa.Table (``parts`` > 1: a directory of that many part files, same content
    order), raw bytes (written as ``<name>.parquet``), or None (no table)."""
    if table is None:
        return
    if isinstance(table, (bytes, bytearray)):
        (root / f"{name}.parquet").write_bytes(table)
        return
    if parts <= 1:
        pq.write_table(table, root / f"{name}.parquet", **options)
        return
    folder = root / name
    folder.mkdir()
    cuts = np.linspace(0, table.num_rows, parts + 1).astype(int)
    for i in range(parts):
        pq.write_table(table.slice(cuts[i], cuts[i + 1] - cuts[i]),
                       folder / f"part-{i:05d}.parquet", **options)
    (folder / "_SUCCESS").write_bytes(b"")
    (folder / ".part-00000.parquet.crc").write_bytes(b"\x00garbage")


def write_dir(root: Path, tables: dict, **options) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name in TABLES:
        write_table(root, name, tables.get(name), **options)
    return root


@dataclass
class Data:
    ledger: list
    tokens: list
    rollouts: list
    logprobs: bool
    accepted: bool

    def copy(self) -> Data:
        return copy.deepcopy(self)


def from_builders(*parts, logprobs=False):
    ledger, tokens, rollouts = combine(*parts)
    accepted = any("accepted_response_ids" in r for r in rollouts)
    if accepted:
        for r in rollouts:
            r.setdefault("accepted_response_ids", None)
    return Data(ledger, tokens, rollouts, logprobs, accepted)


def base_data(kind: int, seed: int) -> Data:
    """A small valid (mostly ok) input; ``kind`` picks its shape."""
    lp = bool(seed % 2)
    if kind == 0:
        return from_builders(worked_example("wx", logprobs=lp), logprobs=lp)
    if kind == 1:
        return from_builders(single_chain("sc", logprobs=lp), one_call("solo", "g2", 0.0, logprobs=lp),
                              logprobs=lp)
    if kind == 2:
        b = worked_example("acc", "g", 0.5, logprobs=lp)
        b.output(["c1", "c2", "c3", "c5"], accepted_calls=["c1", "c2", "c3", "c5"])
        return from_builders(b, worked_example("wx2", "g", 0.0, logprobs=lp, twin=True),
                              single_chain("sc", "g", 1.0, logprobs=lp), logprobs=lp)
    ledger, tokens, rollouts, options = random_dataset(seed, n_rollouts=4, corrupt=0.2)
    accepted = any("accepted_response_ids" in r for r in rollouts)
    return Data(ledger, tokens, rollouts, options["logprobs"], accepted)




def set_column(table: pa.Table, col: str, arr) -> pa.Table:
    i = table.schema.get_field_index(col)
    return table.set_column(i, pa.field(col, arr.type), arr)


def invalid_utf8(arr: pa.Array, row: int) -> pa.Array:
    """The same strings, with row ``row`` turned into invalid UTF-8 bytes."""
    vals = [None if v is None else v.encode() for v in arr.to_pylist()]
    vals[row] = (vals[row] or b"") + b"\xff\xfe\xc3"
    b = pa.array(vals, pa.binary())
    return pa.Array.from_buffers(pa.string(), len(b), b.buffers(), null_count=b.null_count)


def small_tables(logprobs: bool = True) -> dict:
    """Three small valid rollouts (the worked example, a chain, a single call) as tables."""
    return build_tables(from_builders(worked_example("wx", logprobs=logprobs),
                                      single_chain("sc", logprobs=logprobs),
                                      one_call("solo", "g2", logprobs=logprobs), logprobs=logprobs))


def write_encrypted(path: Path, table: pa.Table, columns: list[str], plaintext_footer: bool) -> None:
    """``table`` written to ``path`` with Parquet modular encryption of ``columns`` (a toy KMS)."""
    import base64

    import pyarrow.parquet.encryption as pe

    class Kms(pe.KmsClient):
        def __init__(self, config):
            super().__init__()

        def wrap_key(self, key, master_key_id):
            return base64.b64encode(key)

        def unwrap_key(self, wrapped, master_key_id):
            return base64.b64decode(wrapped)

    config = pe.EncryptionConfiguration(footer_key="k1", column_keys={"k2": columns} if columns else {},
                                        plaintext_footer=plaintext_footer, uniform_encryption=not columns)
    props = pe.CryptoFactory(Kms).file_encryption_properties(pe.KmsConnectionConfig(), config)
    with pq.ParquetWriter(path, table.schema, encryption_properties=props) as writer:
        writer.write_table(table)
