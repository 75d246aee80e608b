"""How an output was made: the provenance every ``rows`` and ``report`` of ``reassemble`` carries
as Parquet key-value (Arrow schema) metadata under :data:`PROVENANCE_KEY`.

The record is a plain dict: ``{"chainrows": version, "command": "reassemble", "options": every
field of :class:`chainrows.options.Options`, "input": {"files", "bytes", "fingerprint"} or None}``
(None: Arrow tables handed to the API). It holds no timestamp, absolute path or host name, so
the same input and options give the same bytes whatever the path, route or machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from chainrows import __version__
from chainrows.errors import InputError
from chainrows.options import Options
from chainrows.progress import human_bytes

PROVENANCE_KEY = b"chainrows"
COMMAND = "reassemble"
OUTPUT_NAMES = ("rows", "report")  # searched in this order by read_provenance


def make_provenance(options: Options, input: dict | None = None) -> dict:
    """The provenance of a reassembly with ``options`` of ``input`` (what
    ``chainrows.formats.native.footers.input_fingerprint`` returns; None for Arrow tables)."""
    return {"chainrows": __version__, "command": COMMAND, "options": options.to_json(),
            "input": None if input is None else dict(input)}


def encode(prov: dict) -> bytes:
    """The metadata value: compact JSON with sorted keys, UTF-8 (the same dict, the same bytes)."""
    return json.dumps(prov, sort_keys=True, separators=(",", ":")).encode()


def with_provenance(schema_or_table, prov: dict):
    """``schema_or_table`` (a ``pa.Schema``, ``pa.Table`` or ``pa.RecordBatch``) with
    :data:`PROVENANCE_KEY` set to ``prov`` in its schema metadata (other keys kept)."""
    schema = schema_or_table if isinstance(schema_or_table, pa.Schema) else schema_or_table.schema
    metadata = {**(schema.metadata or {}), PROVENANCE_KEY: encode(prov)}
    if isinstance(schema_or_table, pa.Schema):
        return schema.with_metadata(metadata)
    return schema_or_table.replace_schema_metadata(metadata)


def provenance_of(metadata: dict | None) -> dict | None:
    """The provenance in a schema's or a Parquet footer's key-value ``metadata``, or None."""
    raw = (metadata or {}).get(PROVENANCE_KEY)
    if raw is None:
        return None
    try:
        prov = json.loads(raw)
    except ValueError:
        return None
    return prov if isinstance(prov, dict) else None


def read_provenance(path: str | os.PathLike) -> dict | None:
    """The provenance of an output. ``path``: an OUT directory (its ``rows``, else its
    ``report``, as ``<name>.parquet`` or ``<name>/``), or one such file or directory. Reads only
    the footer of the first Parquet file (name order, skipping names starting with ``.`` or
    ``_``). None when there is no such file or it carries none; an unreadable file is an
    InputError naming it."""
    first = _first_file(Path(path))
    if first is None:
        return None
    try:
        metadata = pq.read_metadata(first).metadata
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"unreadable Parquet file: {' '.join(str(exc).split())[:300]}", file=first) from exc
    return provenance_of(metadata)


def _first_file(path: Path) -> Path | None:
    if path.is_file():
        return path
    if not path.is_dir():
        return None
    for name in OUTPUT_NAMES:
        for form in (path / f"{name}.parquet", path / name):
            if form.exists() and (found := _first_file(form)) is not None:
                return found
    parts = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith((".", "_")))
    return parts[0] if parts else None


def option_flags(options: dict) -> list[str]:
    """The command-line flags that give ``options`` (a provenance's options), defaults left out:
    ``["--mode", "ordinary", "--no-std"]``."""
    defaults = Options().to_json()  # in the fields' order, whatever order ``options`` has
    flags: list[str] = []
    for key in defaults:
        value = options.get(key, defaults[key])
        if value == defaults[key]:
            continue
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [] if value is False else [flag, str(value)]
    return flags


def describe(prov: dict | None) -> str:
    """One line for people: ``mode cc, plan linear, ..., input 3 files 1.2 MB fingerprint
    0123456789ab`` (``input Arrow tables`` without an input record); a version other than this
    chainrows' is named first."""
    if not prov:
        return "unknown (no chainrows provenance)"
    parts = []
    options = prov.get("options") or {}
    order = [f.name for f in dataclasses.fields(Options) if f.name in options]
    for key, value in [(k, options[k]) for k in order] + sorted(
            (k, v) for k, v in options.items() if k not in order):
        name = key.replace("_", " ")
        if isinstance(value, bool):
            if name == "no std":
                parts.append("advantage not divided by the std" if value else "advantage divided by the std")
            else:
                parts.append(name if value else f"no {name}")
        else:
            parts.append(f"{name} {value}")
    inp = prov.get("input")
    if inp:
        parts.append(f"input {inp.get('files', 0):,} files {human_bytes(inp.get('bytes', 0))} "
                     f"fingerprint {str(inp.get('fingerprint', ''))[:12]}")
    else:
        parts.append("input Arrow tables")
    version = prov.get("chainrows")
    return (f"chainrows {version}: " if version != __version__ else "") + ", ".join(parts)
