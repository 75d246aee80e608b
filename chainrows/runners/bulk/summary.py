"""What a bulk run did, for the person who ran it: counts, the path taken, time."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chainrows.outdir.provenance import describe, option_flags
from chainrows.progress import human_bytes

if TYPE_CHECKING:
    from chainrows.api import Result

UNTRAINED_WARN_SHARE = 0.05  # of the ok rollouts' generated tokens, untrained: the summary warns


@dataclass
class Summary:
    """Counts over every reassembled batch of a run, plus how the run was done.

    ``path``: ``memory`` (one batch), ``stream`` (windows of whole groups, read once) or
    ``spill`` (hash-partitioned to disk first); ``why``: the planner's reason. ``placeholder_rows``:
    rows written for masked rollouts (in ``rows`` beside the ``rows`` trained rows). ``input_bytes``
    / ``decoded_bytes``: the columns read, uncompressed as stored and estimated once decoded
    (what the plan sizes memory by), from the footers. ``held_runs`` / ``written_runs``: of a stream's
    windows with rows or a spill's buckets, those whose sorted runs (rows and report) were held
    in memory until the merge, and those whose runs were written to disk. ``generated_tokens`` /
    ``untrained_tokens``: of the ok rollouts, generated tokens and those no row trains
    (``chainrows.api.Result``); at UNTRAINED_WARN_SHARE of them or more the summary warns.
    ``provenance``: how the outputs were made (chainrows.outdir.provenance), shown as one line.
    """

    rollouts: int = 0
    ok: int = 0
    reasons: Counter = field(default_factory=Counter)
    rows: int = 0
    placeholder_rows: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    calls: int = 0
    unselected_calls: int = 0
    orphan_token_rows: int = 0
    generated_tokens: int = 0
    untrained_tokens: int = 0
    input_bytes: int = 0
    decoded_bytes: int = 0
    path: str = "memory"
    why: str = ""
    batches: int = 1
    held_runs: int = 0
    written_runs: int = 0
    peak_rss: int = 0
    budget: int = 0  # the --memory-budget the run was planned under (0: none, e.g. Ray)
    compile_seconds: float = 0.0
    seconds: float = 0.0
    provenance: dict | None = None
    dataset: str | None = None  # the input's path as given, for the commands the summary suggests

    def add(self, result: Result) -> None:
        """Count one reassembled batch."""
        rows, report = result
        status = report["status"].to_numpy(zero_copy_only=False)
        ok = status == "ok"
        self.rollouts += report.num_rows
        self.ok += int(ok.sum())
        for item in report["reason"].filter(pa.array(~ok)).value_counts().to_pylist():
            self.reasons[item["values"]] += item["counts"]
        trained = int(np.asarray(report["num_rows"]).sum())
        self.rows += trained
        self.placeholder_rows += rows.num_rows - trained
        if rows.num_rows:
            lengths = pc.list_value_length(rows["input_ids"]).filter(pc.greater(rows["weight"], 0))
            self.tokens += int(pc.sum(lengths).as_py() or 0)
        self.loss_tokens += int(np.asarray(report["loss_tokens"]).sum())
        calls = np.asarray(report["num_calls"])
        self.calls += int(calls.sum())
        self.unselected_calls += int((calls - np.asarray(report["num_selected"]))[ok].sum())
        self.orphan_token_rows += result.orphan_token_rows
        self.generated_tokens += result.generated_tokens
        self.untrained_tokens += result.untrained_tokens

    _COUNTS = ("rollouts", "ok", "rows", "placeholder_rows", "tokens", "loss_tokens", "calls",
               "unselected_calls", "orphan_token_rows", "generated_tokens", "untrained_tokens")

    def merge(self, other: Summary) -> None:
        """Add another batch's counts (the run's own fields stay)."""
        for name in self._COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.reasons.update(other.reasons)

    def counts_json(self) -> dict:
        """The counts alone, as a finished batch records them for --resume."""
        return {**{k: getattr(self, k) for k in self._COUNTS}, "reasons": dict(self.reasons)}

    @classmethod
    def from_counts(cls, d: dict) -> Summary:
        d = dict(d)
        return cls(reasons=Counter(d.pop("reasons", {})), **d)

    _UNITS = {"stream": "window", "spill": "bucket", "ray": "task"}

    def path_text(self) -> str:
        """``stream, 10 windows (groups complete in read order)``: the path, its batches (windows,
        buckets or tasks; an in-memory run has one), why."""
        unit = self._UNITS.get(self.path)
        count = f", {self.batches:,} {unit}{'s' if self.batches != 1 else ''}" if unit else ""
        return f"{self.path}{count}" + (f" ({self.why})" if self.why else "")

    def format(self) -> str:
        masked = self.rollouts - self.ok
        work = max(self.seconds - self.compile_seconds, 1e-9)
        lines = [("rollouts", f"{self.rollouts:,}"), ("  ok", f"{self.ok:,}"), ("  masked", f"{masked:,}")]
        for reason, n in sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0])):
            lines.append((f"    {reason}", f"{n:,}"))
        lines += [("rows", f"{self.rows + self.placeholder_rows:,} ({self.rows:,} trained, "
                           f"{self.placeholder_rows:,} placeholders)" if self.placeholder_rows else f"{self.rows:,}"),
                  ("tokens", f"{self.tokens:,}"),
                  ("loss tokens", f"{self.loss_tokens:,}"),
                  ("calls", f"{self.calls:,}"),
                  ("  unselected (ok rollouts)", f"{self.unselected_calls:,}"),
                  ("orphan token rows", f"{self.orphan_token_rows:,}"),
                  ("input (uncompressed)", human_bytes(self.input_bytes) + (
                      f", {human_bytes(self.decoded_bytes)} decoded" if self.decoded_bytes else "")),
                  ("path", self.path_text())]
        if self.provenance is not None:
            lines.append(("made with", describe(self.provenance)))
        if self.path in ("stream", "spill"):
            lines.append((f"  {self._UNITS[self.path]}s' runs", f"{self.held_runs:,} held in memory, "
                                                                f"{self.written_runs:,} written to disk"))
        if self.peak_rss:
            lines.append(("peak memory", f"{self.peak_rss / 2**20:,.0f} MiB" + (
                f" (budget {self.budget / 2**20:,.0f} MiB)" if self.budget else "")))
        kernels = "compiling" if self.compile_seconds >= 1 else "loading"
        lines.append(("time", f"{self.seconds:.2f} s" + (f" (of which {kernels} kernels {self.compile_seconds:.1f} s)"
                                                          if self.compile_seconds >= 0.05 else "")))
        lines.append(("throughput", f"{self.rollouts / work:,.0f} rollouts/s, {self.tokens / work / 1e6:,.1f} M tokens/s"))
        width = max(len(k) for k, _ in lines)
        warning = self.untrained_warning()
        return "\n".join([f"{k:<{width}}  {v}" for k, v in lines] + ([warning] if warning else []))

    def untrained_share(self) -> float:
        """Of the ok rollouts' generated tokens, the share no row trains (0 when none)."""
        return self.untrained_tokens / self.generated_tokens if self.generated_tokens else 0.0

    def untrained_warning(self) -> str | None:
        """The warning line when ``untrained_share`` is at least UNTRAINED_WARN_SHARE, else None:
        the share, what such calls usually are, and the ``explain`` command (with the run's
        options) that shows them."""
        if self.untrained_tokens <= 0 or self.untrained_share() < UNTRAINED_WARN_SHARE:
            return None
        command = " ".join(["chainrows explain", self.dataset or "DATA", "ROLLOUT_ID",
                            *option_flags((self.provenance or {}).get("options") or {})])
        return (f"warning: {self.untrained_share():.1%} of the ok rollouts' generated tokens "
                f"({self.untrained_tokens:,} of {self.generated_tokens:,}) are in no row: calls the "
                "agent's final output does not contain (rejected retries, sub-agent work it did not "
                "return; expected when the harness retries); see which with: "
                f"{command} (a rollout whose report row has num_selected < num_calls)")
