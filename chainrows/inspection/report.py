"""``write_report``: the inspect page of a reassemble output, written atomically."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from chainrows.errors import InputError
from chainrows.explanation import explain
from chainrows.formats.native.dataset import TABLES, table_files
from chainrows.formats.native.footers import input_fingerprint
from chainrows.inspection import page as P
from chainrows.inspection.facts import generated_tokens, group_spread, read_report, sample
from chainrows.options import Options
from chainrows.outdir.atomic import notify_committed
from chainrows.outdir.provenance import read_provenance
from chainrows.progress import human_bytes

MAX_DRAWN_CALLS = 400  # a rollout with more calls is listed, not drawn: the page stays a few MB


def options_of(prov: dict | None) -> Options:
    """The decision options the output was made with (defaults when it records none)."""
    recorded = (prov or {}).get("options") or {}
    names = {f.name for f in dataclasses.fields(Options)}
    return Options(**{k: v for k, v in recorded.items() if k in names})


def check_data(data, prov: dict | None, out) -> None:
    """Refuse a ``--data`` that is not the dataset ``out`` was made from (its recorded input
    fingerprint differs): its token counts and call trees would describe other rollouts. An
    output that records no input (made before outputs recorded it, or from Arrow tables) is
    taken on trust."""
    recorded = (prov or {}).get("input")
    if not recorded:
        return
    files = [f for name in TABLES for f in table_files(data, name)]
    found = input_fingerprint(files, data)
    if found["fingerprint"] != recorded.get("fingerprint"):
        raise InputError(f"--data {data} is not the dataset {out} was made from: its files' fingerprint "
                         f"{found['fingerprint'][:12]} ({found['files']} files) differs from the one the "
                         f"output records, {str(recorded.get('fingerprint'))[:12]} ({recorded.get('files')} "
                         "files); pass the dataset reassemble read")


def _counts(report) -> list[tuple[str, int]]:
    status = report.column("status").to_pylist()
    reason = report.column("reason").to_pylist()
    keys = [s if r is None else f"{s}: {r}" for s, r in zip(status, reason)]
    uniq, n = np.unique(np.array(keys, dtype=object), return_counts=True) if keys else ([], [])
    return sorted(zip(uniq, (int(x) for x in n)), key=lambda p: (-p[1], p[0]))


def _token_rows(report, generated: np.ndarray | None) -> list[tuple]:
    ok = np.array([s == "ok" for s in report.column("status").to_pylist()], dtype=bool)
    loss = report.column("loss_tokens").to_numpy()
    rows = [("loss tokens (trained)", f"{int(loss.sum()):,}")]
    if generated is not None:
        gen_ok = int(generated[ok].sum())
        untrained = gen_ok - int(loss[ok].sum())
        rows += [("generated tokens", f"{int(generated.sum()):,}"),
                 ("generated tokens of masked rollouts", f"{int(generated[~ok].sum()):,}"),
                 ("generated tokens never trained in ok rollouts (calls the output does not contain)",
                  f"{untrained:,} ({100 * untrained / gen_ok if gen_ok else 0:.1f} % of theirs)")]
    return rows


def _split_rows(report) -> list[tuple]:
    ok = report.filter(pc.equal(report.column("status"), "ok"))
    n = ok.column("num_rows").to_numpy()
    rows = [(f"{k} row{'s' if k > 1 else ''}", int((n == k).sum())) for k in (1, 2, 3)]
    return rows + [("4 rows or more", int((n >= 4).sum())), ("rows in all", int(n.sum()))]


def _drawable(report, status_ok: bool, split: bool) -> tuple[list[str], list[str]]:
    t = report.filter(pc.less_equal(report.column("num_calls"), MAX_DRAWN_CALLS))
    if status_ok:
        t = t.filter(pc.and_(pc.equal(t.column("status"), "ok"), pc.greater(t.column("num_rows"), 1)))
        return t.column("rollout_id").to_pylist(), [str(x) for x in t.column("num_rows").to_pylist()]
    t = t.filter(pc.equal(t.column("status"), "masked"))
    return t.column("rollout_id").to_pylist(), t.column("reason").to_pylist()


def _drilldowns(report, data, options: Options, n: int) -> list[str]:
    if data is None:
        return [P.drilldowns_section("Drill-downs", [], "drill", "Pass --data DATA to draw the call trees "
                                     "of a sample of masked and split rollouts.")]
    masked = sample(*_drawable(report, False, False), n)
    split = sample(*_drawable(report, True, True), n)
    found = explain(data, masked + split, options) if masked or split else []
    note = (f"A deterministic sample (by a hash of the id, every reason first) of at most {n}; "
            f"rollouts of more than {MAX_DRAWN_CALLS} calls are not drawn (chainrows explain draws them).")
    return [P.drilldowns_section("Masked rollouts", found[:len(masked)], "masked", note),
            P.drilldowns_section("Split rollouts", found[len(masked):], "split", note)]


def write_report(out: str | os.PathLike, html_file: str | os.PathLike, *, data=None, sample: int = 24,
                 overwrite: bool = False) -> str:
    """Write the inspect page of the reassemble output ``out`` to ``html_file`` and return a
    one-line summary. ``data``: the dataset it was made from (call trees, token counts).
    Raises InputError on an unusable output or dataset, or an existing file without
    ``overwrite``; the file appears whole or not at all."""
    dest = Path(html_file)
    if dest.exists() and not overwrite:
        raise InputError(f"{dest} exists: pass --overwrite to replace it")
    report = read_report(out)
    prov = read_provenance(out)
    if data is not None:
        check_data(data, prov, out)
    options = options_of(prov)
    generated = generated_tokens(data, report.column("rollout_id")) if data is not None else None
    sections = [P.provenance_section(prov), P.status_section(_counts(report), report.num_rows),
                P.numbers_section("Rows per ok rollout", _split_rows(report), "splits"),
                P.numbers_section("Tokens", _token_rows(report, generated), "tokens"),
                P.numbers_section("Reward and advantage per group", group_spread(report), "groups")]
    sections += _drilldowns(report, data, options, sample)
    text = P.page(f"chainrows inspect: {out}", sections)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, dest)
        notify_committed(dest)  # an interrupt from here on leaves a complete page: the command exits 0
    finally:
        tmp.unlink(missing_ok=True)
    masked = sum(1 for s in report.column("status").to_pylist() if s == "masked")
    return f"wrote {dest} ({human_bytes(len(text.encode()))}): {report.num_rows:,} rollouts, {masked:,} masked"
