"""What every command's argparse shares: the epilog, the size and count argument types, the
``--overwrite`` help, and the one-line list of what a command wrote. Light on purpose (argparse
and the standard library; :func:`wrote` imports :mod:`chainrows.progress` when called) so that
``chainrows --help`` imports neither numba nor pyarrow."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

EPILOG = ("exit codes: 0 ran (masked rollouts included), 2 unusable input or arguments (one line), "
          "1 internal error or out of memory or disk (CHAINROWS_DEBUG=1 shows the traceback), 130 interrupted, 143 terminated, "
          "141 stdout closed by its reader (e.g. | head). Commands run without transparent huge pages "
          "(CHAINROWS_HUGE_PAGES=system keeps the system's setting; docs/limits.md). "
          "The input format is docs/format.md, the reason codes docs/reasons.md.")
OVERWRITE_HELP = "replace the result OUT already holds (without it such an OUT is refused)"

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1 << 10, "mib": 1 << 20,
          "gib": 1 << 30, "tib": 1 << 40}


LARGEST_SIZE = 1 << 60  # 1 EiB: far beyond any machine, and every sum of budgets stays in an int64
LARGEST_COUNT = (1 << 63) - 1  # an int64


def parse_size(text: str) -> int:
    """'4GiB', '512MB', '1e9' -> bytes; at least 1 MiB, at most LARGEST_SIZE (1e400 and
    1e400GiB, which a float holds as infinity, are refused like any other size too large)."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 4GiB or 512MB)")
    try:
        value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 4GiB or 512MB)") from None
    if value < 1 << 20:
        raise argparse.ArgumentTypeError(f"memory budget {text!r} is below 1 MiB")
    if not value <= LARGEST_SIZE:  # inf, and nan were it ever parsed
        raise argparse.ArgumentTypeError(f"memory budget {text!r} is above 1 EiB")
    return int(value)


def path_arg(text: str) -> str:
    """argparse type of every path argument: refuses an empty or blank one (taken as is, it
    would be the current directory, and a command would write there)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"an empty or blank path: {text!r}")
    return text


def int_at_least(lowest: int, below: int | None = None):
    """argparse type: an integer >= lowest and < below (default: what an int64 holds)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        top = LARGEST_COUNT + 1 if below is None else below
        if value < lowest or value >= top:
            raise argparse.ArgumentTypeError(f"must be >= {lowest} and < {top}")
        return value

    return parse


at_least_one = int_at_least(1)


def add_decision_options(r) -> None:
    """The options that decide rollouts and weigh rows (``chainrows.options.Options``), as
    reassemble, explain and stats take them."""
    from chainrows import options

    r.add_argument("--mode", choices=options.MODES, default="cc",
                   help="cc: train the calls the final output names, a new row at every root "
                        "(compactions kept); ordinary: one chain back from the terminal call, as "
                        "plain capture gives")
    r.add_argument("--plan", choices=options.PLANS, default="linear",
                   help="cc: how accepted calls become rows: linear (one chain per root) or forest "
                        "(one row per endpoint, shared calls trained once)")
    r.add_argument("--placeholders", action="store_true",
                   help="write one zero-weight placeholder row per masked rollout")
    r.add_argument("--baseline", choices=options.BASELINES, default="mean",
                   help="GRPO baseline: the group's mean reward, or leave-one-out (loo)")
    r.add_argument("--no-std", action="store_true", help="A = r - baseline (no std division)")
    r.add_argument("--baseline-population", choices=options.POPULATIONS, default="all",
                   help="rollouts the baseline is taken over: all with a finite reward, or ok ones only")
    r.add_argument("--row-weight", choices=options.ROW_WEIGHTS, default="rollout",
                   help="rollout: 1 / rows of the rollout (each rollout counts once); row: 1.0")


def decision_options(a: argparse.Namespace):
    """The parsed decision options as one ``Options``; a combination argparse cannot reject
    (``--plan forest --mode ordinary``) is a usage error: one line, exit 2."""
    from chainrows import options

    try:
        return options.Options(mode=a.mode, plan=a.plan, placeholders=a.placeholders,
                               baseline=a.baseline, no_std=a.no_std,
                               baseline_population=a.baseline_population, row_weight=a.row_weight)
    except ValueError as exc:
        print(f"chainrows: error: {' '.join(str(exc).split())} (see chainrows {a.command} --help)",
              file=sys.stderr)
        raise SystemExit(2) from None


def wrote(out, names) -> str:
    """``OUT/rows/ (5.1 MB), OUT/report.parquet (20 KB)``: the outputs ``names`` as they
    now are in ``out`` (a ``<name>/`` directory of parts counted whole)."""
    from chainrows.progress import human_bytes

    parts = []
    for name in names:
        for path in (Path(out) / f"{name}.parquet", Path(out) / name):
            if path.exists():
                parts.append(f"{path}{'/' if path.is_dir() else ''} ({human_bytes(tree_bytes(path))})")
                break
    return ", ".join(parts)


def tree_bytes(path) -> int:
    """Bytes of a file, or of every file under a directory."""
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


COMPILING = "compiling kernels (first run; later runs load them from the cache)..."


class CompileNotice:
    """While installed, says COMPILING once on stderr when Numba starts compiling a kernel,
    i.e. only on a cold or stale kernel cache: loading cached kernels raises no compile event.
    Said whether or not stderr is a terminal (a CI or batch log would otherwise show seconds of
    silence); ``enabled=False`` (``--no-progress``) silences it. ``seconds``: time spent
    compiling (outermost compiles only)."""

    def __init__(self, enabled: bool | None):
        from numba.core import event

        class Listener(event.Listener):
            def on_start(_, ev):
                self._depth += 1
                if self._depth == 1:
                    self._t0 = time.perf_counter()
                    if not self.said:
                        from chainrows.progress import Progress

                        self.said = True
                        Progress.say(COMPILING, enabled=self.enabled)

            def on_end(_, ev):
                self._depth -= 1
                if self._depth == 0:
                    self.seconds += time.perf_counter() - self._t0

        self.enabled, self.said, self.seconds = enabled is not False, False, 0.0
        self._depth, self._t0 = 0, 0.0
        self._cm = event.install_listener("numba:compile", Listener())

    def __enter__(self) -> CompileNotice:
        self._cm.__enter__()
        return self

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)
