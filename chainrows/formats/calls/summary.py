"""What an import of a call log found, for the person who ran it: calls by relation, the
rollouts that drifted and where, input tokens against the delta tokens written."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from chainrows.formats.calls.infer import DECLARED_MISMATCH, DRIFT, NO_TOKEN, RELATIONS

SAMPLES = 10  # drift and mismatch places the summary lists


@dataclass
class CallsSummary:
    """Counts over every record imported. ``samples``: the first SAMPLES drift or
    declared-mismatch places in input order, as dicts (record, rollout_id, call_id, relation,
    against_call, diverge_at, diverge_token, against_token)."""

    records: int = 0
    relations: np.ndarray = field(default_factory=lambda: np.zeros(len(RELATIONS), np.int64))
    rollouts: int = 0  # distinct rollout ids among the records
    drifted_rollouts: int = 0
    input_tokens: int = 0  # prompt + completion tokens of the log
    delta_tokens: int = 0  # tokens written to the tokens table
    results: int = 0  # rows of the rollouts table written
    has_logprobs: bool = False
    samples: list = field(default_factory=list)
    path: str = "memory"
    seconds: float = 0.0
    peak_rss: int | None = None

    def relation(self, name: str) -> int:
        return int(self.relations[RELATIONS.index(name)])

    def format(self) -> str:
        """The summary lines the command prints."""
        from chainrows.progress import human_bytes

        w = 24
        lines = [f"{'calls':<{w}} {self.records:,} in {_count(self.rollouts, 'rollout')}"]
        lines += [f"  {name:<{w - 2}} {int(n):,}" for name, n in zip(RELATIONS, self.relations) if n]
        lines.append(f"{'rollouts with drift':<{w}} {self.drifted_rollouts:,}")
        for s in self.samples:
            lines.append("  " + describe(s))
        lines.append(f"{'results':<{w}} {_count(self.results, 'rollout')}")
        ratio = f" ({self.input_tokens / self.delta_tokens:.1f}x)" if self.delta_tokens else ""
        lines.append(f"{'tokens':<{w}} {self.input_tokens:,} in the log, {self.delta_tokens:,} "
                     f"written as deltas{ratio}")
        lines.append(f"{'logprobs':<{w}} {'yes' if self.has_logprobs else 'none in the log'}")
        lines.append(f"{'path':<{w}} {self.path}")
        if self.peak_rss:
            lines.append(f"{'peak memory':<{w}} {human_bytes(self.peak_rss)}")
        lines.append(f"{'time':<{w}} {self.seconds:.2f} s")
        return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def describe(s: dict) -> str:
    """One drift or mismatch place in words, with the token ids on both sides when known."""
    here = "" if s["diverge_token"] is None else f"{s['diverge_token']}"
    there = "" if s["against_token"] is None else f"{s['against_token']}"
    tokens = f": prompt has {here or 'nothing (its end)'}, {s['against_call']} had {there or 'nothing (its end)'}"
    what = {"drift": "drifted from", "declared_mismatch": "does not extend its declared parent",
            "rewrite": "rewrote"}[s["relation"]]
    return (f"rollout {s['rollout_id']} call {s['call_id']} {what} {s['against_call']} at token "
            f"{s['diverge_at']:,}{tokens}")


def collect(summary: CallsSummary, batch, dec, drifted: np.ndarray, names) -> np.ndarray:
    """Add one decided chunk's counts to ``summary``; ``drifted`` (per rollout code, grown and
    returned) marks the rollouts with a drift; ``names(codes)`` gives call ids of call codes."""
    rel = dec.relation
    summary.records += len(rel)
    summary.relations += np.bincount(rel, minlength=len(RELATIONS))
    summary.delta_tokens += int(dec.delta_off[-1])
    if len(drifted) <= int(dec.rollout.max(initial=-1)):
        grown = np.zeros(max(2 * len(drifted), int(dec.rollout.max()) + 1), bool)
        grown[:len(drifted)] = drifted
        drifted = grown
    hit = rel == DRIFT
    drifted[dec.rollout[hit]] = True
    want = SAMPLES - len(summary.samples)
    if want > 0:
        idx = np.flatnonzero(hit | (rel == DECLARED_MISMATCH) & (dec.against_rec >= 0))[:want]
        against = names(dec.against_call[idx]).to_pylist()
        for i, name in zip(idx.tolist(), against):
            summary.samples.append(_sample(batch, dec, i, name))
    return drifted


def _sample(batch, dec, i: int, against: str) -> dict:
    def tok(v):
        return None if v == NO_TOKEN else int(v)

    return dict(record=batch.column("record")[i].as_py(), rollout_id=batch.column("rollout_id")[i].as_py(), call_id=batch.column("call_id")[i].as_py(),
                relation=RELATIONS[dec.relation[i]], against_call=against, diverge_at=int(dec.diverge[i]),
                diverge_token=tok(dec.tok_here[i]), against_token=tok(dec.tok_there[i]))


__all__ = ["CallsSummary", "collect", "describe", "SAMPLES"]
