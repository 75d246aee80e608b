"""The list of problem lines a reconciliation returns: the first ``limit`` kept, the rest counted."""

from __future__ import annotations

import numpy as np


class Problems:
    """Collects problem lines; keeps the first ``limit`` and counts the rest."""

    def __init__(self, limit: int):
        self.limit = limit
        self.lines: list[str] = []
        self.dropped = 0

    def add(self, line: str) -> None:
        if len(self.lines) < self.limit:
            self.lines.append(line)
        else:
            self.dropped += 1

    def each(self, where: np.ndarray, fmt) -> None:
        """Add ``fmt(i)`` for each index in ``where`` (a bool mask or index array)."""
        idx = np.flatnonzero(where) if where.dtype == bool else where
        for n, i in enumerate(idx):
            if len(self.lines) >= self.limit:
                self.dropped += len(idx) - n
                return
            self.lines.append(fmt(int(i)))

    def result(self) -> list[str]:
        out = list(self.lines)
        if self.dropped:
            out.append(f"... and {self.dropped} more problem(s)")
        return out
