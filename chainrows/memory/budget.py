"""The floor under every ``--memory-budget``: what the process measures it needs before any
data (interpreter, libraries, loaded kernels), plus the least room any command works in.

Light on purpose (no engine import): ``reassemble`` (chainrows.runners.bulk.plan) and ``import-gym``
(chainrows.formats.gym.importer) both refuse a budget below the floor through :func:`check_budget`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from chainrows.errors import InputError
from chainrows.memory.process import process_rss, release_memory

BASE_RSS = 320 << 20  # process baseline where it cannot be measured (no /proc)
MIN_ROOM = 144 << 20  # the least memory above the baseline any path works in (docs/limits.md)


@dataclass(frozen=True)
class Footprint:
    """What the process needs before any data: ``baseline`` bytes resident once the kernels are
    loaded, measured in ``compile_seconds`` (a cold Numba cache compiles them then)."""

    baseline: int
    compile_seconds: float

    @property
    def smallest_budget(self) -> int:
        return self.baseline + MIN_ROOM

    def room(self, budget: int) -> int:
        return budget - self.baseline


def footprint_after(load_kernels: Callable[[], object]) -> Footprint:
    """Call ``load_kernels`` (it runs every kernel a command uses once, compiling them on a
    cold cache), hand freed memory back, then read the process's resident set (BASE_RSS
    where /proc is missing)."""
    t0 = time.perf_counter()
    load_kernels()
    seconds = time.perf_counter() - t0
    release_memory()
    rss = process_rss()
    return Footprint(rss if rss is not None else BASE_RSS, seconds)


def check_budget(budget: int, footprint: Footprint, min_room: int = MIN_ROOM) -> None:
    """A budget below what the process itself needs, plus ``min_room`` to work in (a command's
    own least), cannot hold: unusable input (exit 2), naming the smallest budget that works."""
    if budget < footprint.baseline + min_room:
        raise InputError(
            f"--memory-budget {_mib(budget)} is below what this process needs: "
            f"{_mib(footprint.baseline)} measured for the interpreter, libraries and kernels, plus "
            f"{_mib(min_room)} to work in; the smallest budget that works here is "
            f"{_mib(footprint.baseline + min_room)}")


def _mib(n: int) -> str:
    return f"{math.ceil(n / (1 << 20)):,} MiB"
