"""``python -m tests.fuzz [--cases N] [--seed S] [--families a,b] [--work DIR] [--replay-dir DIR]``:
run the campaign and print its counts by family (exit 1 if any case failed);
``python -m tests.fuzz --replay DIR``: run a saved failing case again."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tests.fuzz.campaign import FAMILIES, campaign, replay, summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=56)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--replay-dir", type=Path, default=Path("fuzz-failures"), help="where failing cases are kept")
    ap.add_argument("--replay", type=Path, default=None, help="run the saved case in this directory again")
    a = ap.parse_args(argv)
    if a.replay:
        res = replay(a.replay)
        print(res)
        return 0
    families = tuple(f for f in a.families.split(",") if f)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="chainrows-fuzz-") as tmp:
        tally = campaign(a.cases, a.seed, a.work or Path(tmp), a.replay_dir, families, progress=500)
    print(summary(tally))
    print(f"seed {a.seed}, {time.perf_counter() - t0:.0f} s")
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
