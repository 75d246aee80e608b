"""Reassembly options: one frozen object, validated once, from the CLI to the engine and the
reference (SPEC §3 mode, §4 placeholders, §5 baseline, population and row weight)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

MODES = ("cc", "ordinary")
PLANS = ("linear", "forest")
BASELINES = ("mean", "loo")
POPULATIONS = ("all", "ok")
ROW_WEIGHTS = ("rollout", "row")


@dataclass(frozen=True)
class Options:
    """How to decide rollouts and weigh rows.

    ``mode``: ``cc`` (select the calls of the final output, cut at every root) or ``ordinary``
    (one chain from the terminal call). ``plan``: how cc cuts the selection into chains:
    ``linear`` (SPEC §3 step 10) or ``forest`` (§3.1: one chain per endpoint, shared calls
    trained once); ``forest`` needs ``mode="cc"``.
    ``placeholders``: one zero-weight row per masked rollout. ``baseline``: group ``mean`` or
    leave-one-out (``loo``). ``no_std``: A = r - baseline. ``baseline_population``: ``all``
    rollouts of a group with a finite reward, or only ``ok`` ones. ``row_weight``: ``rollout``
    (1 / num_segments) or ``row`` (1.0). A bad value raises ValueError at construction.
    """

    mode: str = "cc"
    plan: str = "linear"
    placeholders: bool = False
    baseline: str = "mean"
    no_std: bool = False
    baseline_population: str = "all"
    row_weight: str = "rollout"

    def __post_init__(self):
        for name, allowed in (("mode", MODES), ("plan", PLANS), ("baseline", BASELINES),
                              ("baseline_population", POPULATIONS), ("row_weight", ROW_WEIGHTS)):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
        if self.plan == "forest" and self.mode != "cc":
            raise ValueError(f"plan 'forest' applies to mode cc only; got mode {self.mode!r}")
        for name in ("placeholders", "no_std"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False; got {getattr(self, name)!r}")

    @classmethod
    def of(cls, options: Options | None = None, **changes) -> Options:
        """``options`` (default: the defaults) with ``changes`` applied, validated."""
        base = options if options is not None else cls()
        if not isinstance(base, cls):
            raise TypeError(f"options must be a chainrows Options, not {type(base).__name__}")
        return dataclasses.replace(base, **changes) if changes else base

    def to_json(self) -> dict:
        """The options as a plain dict (what a resumable run records)."""
        return dataclasses.asdict(self)
