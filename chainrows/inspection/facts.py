"""The numbers an inspect report shows, read from a reassemble output (and its dataset).

Reads the report table whole (one row per rollout, no token lists), never the rows' token
columns; with the dataset, the ledger's rollout_id and gen_len columns only. So the report's
cost is a small fraction of the reassembly's whatever the token volume.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from chainrows.errors import InputError
from chainrows.formats.native.dataset import read_table

REPORT_COLUMNS = ["rollout_id", "group_id", "status", "reason", "num_rows", "num_calls", "num_selected",
                  "loss_tokens", "reward", "advantage"]


def read_report(out: str | os.PathLike) -> pa.Table:
    """OUT's report table (``report.parquet`` or ``report/``), the columns the page uses."""
    for form in (Path(out) / "report.parquet", Path(out) / "report"):
        if form.exists():
            try:
                return pq.read_table(form, columns=REPORT_COLUMNS)
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise InputError(f"unreadable report: {' '.join(str(exc).split())}", file=form) from exc
    root = Path(out)
    if not root.is_dir():
        raise InputError(f"output directory {str(root)!r} does not exist or is not a directory")
    if any((root / f"{n}{ext}").exists() for n in ("ledger", "tokens", "rollouts") for ext in ("", ".parquet")):
        raise InputError("this is a dataset, not a reassemble output: inspect takes OUT of "
                         "`chainrows reassemble DATA OUT` (and the dataset as --data)", directory=out)
    raise InputError("no report in the output directory (expected report.parquet or report/); "
                     "is it a reassemble output?", directory=out)


def generated_tokens(data: str | os.PathLike, rollout_ids: pa.Array) -> np.ndarray:
    """Σ gen_len over the non-failed ledger calls of each of ``rollout_ids`` (0 when none)."""
    ledger = read_table(data, "ledger", ["rollout_id", "gen_len", "failed"])
    kept = ledger.filter(pc.invert(pc.fill_null(ledger.column("failed"), False)))
    sums = kept.group_by("rollout_id").aggregate([("gen_len", "sum")])
    index = pc.index_in(rollout_ids, value_set=sums.column("rollout_id").cast(pa.string()))
    values = sums.column("gen_len_sum").to_numpy()
    idx = pc.fill_null(index, -1).to_numpy().astype(np.int64)
    out = np.zeros(len(rollout_ids), dtype=np.int64)
    found = idx >= 0
    out[found] = values[idx[found]]
    return out


def sample(ids: list[str], keys: list[str], n: int) -> list[str]:
    """A deterministic sample of at most ``n`` of ``ids``: ordered by XXH3 of the id, then taken
    round-robin over ``keys`` (e.g. the reason), so every key shows up before any repeats."""
    by_key: dict[str, list[str]] = {}
    for rid, key in sorted(zip(ids, keys), key=lambda p: xxhash.xxh3_64_intdigest(p[0].encode())):
        by_key.setdefault(key, []).append(rid)
    queues = [by_key[k] for k in sorted(by_key)]
    out: list[str] = []
    while len(out) < n and any(queues):
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop(0))
    return out


def group_spread(report: pa.Table) -> list[tuple[str, str]]:
    """Per group (rollouts with a group_id and a finite reward): size, reward standard deviation
    and advantage range, summarised as (label, value) lines for the page."""
    finite = pc.is_finite(pc.fill_null(report.column("reward"), float("nan")))
    t = report.filter(pc.and_(pc.is_valid(report.column("group_id")), finite))
    if t.num_rows == 0:
        return [("groups", "0")]
    g = t.group_by("group_id").aggregate([("reward", "stddev", pc.VarianceOptions(ddof=1)), ("reward", "count"),
                                         ("advantage", "min"), ("advantage", "max")])
    std = np.nan_to_num(g.column("reward_stddev").to_numpy(zero_copy_only=False))
    size = g.column("reward_count").to_numpy()
    q = np.quantile(std, [0.0, 0.25, 0.5, 0.75, 1.0])
    lo = np.nanmin(g.column("advantage_min").to_numpy(zero_copy_only=False))
    hi = np.nanmax(g.column("advantage_max").to_numpy(zero_copy_only=False))
    return [
        ("groups", f"{g.num_rows:,}"),
        ("rollouts per group (min / mean / max)", f"{size.min()} / {size.mean():.2f} / {size.max()}"),
        ("groups whose rewards are all equal (every advantage 0)", f"{int((std == 0).sum()):,}"),
        ("reward std per group (ddof 1): min / 25 % / median / 75 % / max", " / ".join(f"{x:.3g}" for x in q)),
        ("advantage range", f"{lo:.3g} to {hi:.3g}"),
    ]
