"""The simulator's parameters, each with its one default (the library and both command lines
read them here), and the corruption kinds one may ask for.

Light on purpose (no numpy or pyarrow): the ``chainrows`` parser reads the defaults."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from chainrows.reasons import REASONS

# Rollouts per interleave/shuffle block; batches are whole blocks.
BLOCK = 16
DEFAULT_BATCH_ROLLOUTS = 1024

# Every reason code of SPEC §3, each produced by one corruption kind of the same name.
CORRUPT_KINDS = tuple(r for r in REASONS if r)
_ORDINARY_KINDS = ("multiple_roots", "ambiguous_terminal", "walk_mismatch")
# kind -> (mode, reason it triggers in that mode). Every rollout of a kind triggers that reason.
CORRUPT_TARGETS = {k: ("ordinary" if k in _ORDINARY_KINDS else "cc", k) for k in CORRUPT_KINDS}


@dataclass(frozen=True)
class SynthParams:
    """What the simulated harnesses look like (everything but the seed and the size).

    ``group_size`` rollouts per GRPO group; per rollout, ``compaction_rate`` the chance of
    compactions and ``corrupt_rate`` of one corruption (a kind drawn uniformly from
    ``corrupt_kinds``; None: every kind of ``CORRUPT_KINDS``, without ``logprob_invalid`` when
    not ``logprobs``); ``retry_rate`` the chance of rejected retries per accepted call;
    ``accepted_rate`` the share of rollouts with ``accepted_response_ids``; ``mean_calls`` the
    mean number of accepted calls (geometric); mean generation and observation lengths, prompt
    length and vocabulary size in tokens. A bad value raises ValueError at construction.

    Forest shapes (SPEC §3.1), per rollout that is not corrupted, one draw for both:
    ``worker_rate`` the chance of several sub-agent *workers* (2-4, each its own root and
    chain, their calls interleaved in capture order, every accepted item in the output in
    capture order) and ``fork_rate`` of a *fork* (one call continued by two branches, both in
    the output). Both are ``broken_chain`` under the linear plan and ok under the forest plan.
    ``worker_rate + fork_rate`` must be <= 1. Both default to 0: with 0, no draw is made, so
    every dataset is byte-identical to the ones written before these shapes existed.
    """

    group_size: int = 4
    compaction_rate: float = 0.3
    retry_rate: float = 0.15
    corrupt_rate: float = 0.05
    logprobs: bool = True
    accepted_rate: float = 0.2
    mean_calls: float = 6
    mean_gen_tokens: float = 200
    mean_obs_tokens: float = 120
    prompt_tokens: int = 800
    vocab: int = 150_000
    corrupt_kinds: tuple[str, ...] | None = None
    worker_rate: float = 0.0
    fork_rate: float = 0.0

    def __post_init__(self):
        if self.corrupt_kinds is not None:
            object.__setattr__(self, "corrupt_kinds", tuple(self.corrupt_kinds))
        if self.group_size < 1:
            raise ValueError("group_size must be >= 1")
        if self.mean_calls < 1:
            raise ValueError("mean_calls must be >= 1")
        if not 2 <= self.vocab <= 2**31 - 1:
            raise ValueError("vocab must be in [2, 2**31 - 1]")
        for name in ("compaction_rate", "retry_rate", "corrupt_rate", "accepted_rate", "worker_rate", "fork_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1]")
        if self.worker_rate + self.fork_rate > 1.0:
            raise ValueError("worker_rate + fork_rate must be <= 1")
        kinds = self.corrupt_kinds
        if kinds is not None:
            unknown = [k for k in kinds if k not in CORRUPT_KINDS]
            if unknown:
                raise ValueError(f"unknown corrupt kinds {unknown}; known: {CORRUPT_KINDS}")
            if not self.logprobs and "logprob_invalid" in kinds:
                raise ValueError("corrupt kind 'logprob_invalid' needs logprobs=True")
            if self.corrupt_rate > 0 and not kinds:
                raise ValueError("corrupt_kinds is empty but corrupt_rate > 0")

    @property
    def kinds(self) -> tuple[str, ...]:
        """The corruption kinds drawn from."""
        if self.corrupt_kinds is None:
            return tuple(k for k in CORRUPT_KINDS if self.logprobs or k != "logprob_invalid")
        return self.corrupt_kinds


PARAM_NAMES = frozenset(f.name for f in dataclasses.fields(SynthParams))
DEFAULTS = SynthParams()
