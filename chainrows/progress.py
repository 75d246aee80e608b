"""A dependency-free progress line on stderr (only when stderr is a terminal, unless forced)."""

from __future__ import annotations

import sys
import time


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


class Progress:
    """``advance(n)`` units of ``total``; redraws at most 10 times a second."""

    def __init__(self, label: str, total: float, *, enabled: bool | None = None, unit: str = "bytes",
                 stream=None):
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label, self.total, self.unit = label, max(total, 1), unit
        self.done = 0.0
        self.start = time.perf_counter()
        self._last = 0.0

    def _fmt(self, n):
        return human_bytes(n) if self.unit == "bytes" else f"{int(n):,}"

    def advance(self, n: float) -> None:
        self.done += n
        now = time.perf_counter()
        if self.enabled and (now - self._last > 0.1 or self.done >= self.total):
            self._last = now
            frac = min(self.done / self.total, 1.0)
            bar = "#" * int(frac * 30)
            self.stream.write(f"\r{self.label:<12} [{bar:<30}] {frac:6.1%} "
                              f"{self._fmt(self.done)} / {self._fmt(self.total)} "
                              f"{now - self.start:6.1f} s")
            self.stream.flush()

    @staticmethod
    def say(text: str, *, enabled: bool | None = None, stream=None) -> None:
        """One line on stderr, under the same rule as the bars (a terminal, unless forced)."""
        stream = stream or sys.stderr
        if stream.isatty() if enabled is None else enabled:
            stream.write(f"{text}\n")
            stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
