"""The ``import-gym`` and ``export-gym`` commands (docs/gym.md); chainrows.cli registers them.

Errors follow chainrows.cli: one line, nothing written; an InputError exits 2, a write that
fails for want of room (a WriteError naming the file: disk full, ``ulimit -f``) exits 1.
"""

from __future__ import annotations

import argparse
import time

from chainrows.cli.common import EPILOG, OVERWRITE_HELP, at_least_one, parse_size, path_arg, wrote


def add_parsers(sub) -> None:
    """Add both subcommands to chainrows.cli's subparsers."""
    i = sub.add_parser("import-gym", help="NeMo Gym dump -> a verified dataset (docs/gym.md)",
                       description="Verify every staged call of a NeMo Gym dump against its record "
                                   "(digests, hashes, mask) and write a dataset (docs/format.md); a "
                                   "call that fails a check gets ledger.integrity_error.", epilog=EPILOG)
    i.add_argument("dump", type=path_arg, help="directory with receipts.jsonl, staged.jsonl, results.jsonl (each may be .jsonl.gz)")
    i.add_argument("out", type=path_arg, metavar="DATASET", help="output dataset directory (created if missing)")
    i.add_argument("--memory-budget", type=parse_size, default=None,
                   help="peak memory to stay under, e.g. 4GiB (default 2GiB); a larger dump is "
                        "imported in buckets of rollouts")
    i.add_argument("--threads", type=at_least_one, default=None, help="hashing threads (default: all cores)")
    i.add_argument("--buckets", type=at_least_one, default=None, help=argparse.SUPPRESS)  # tests
    i.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    e = sub.add_parser("export-gym", help="raw JSON Lines (docs/jsonl.md) -> a NeMo Gym dump",
                       description="Read the three raw JSON Lines files that import-jsonl reads (docs/jsonl.md) "
                                   "and write them as a NeMo Gym dump, with real digests and fingerprints "
                                   "(docs/gym.md).",
                       epilog=EPILOG)
    e.add_argument("ledger", type=path_arg, help="one JSON object per model call")
    e.add_argument("tokens", type=path_arg, help="one JSON object per call: its delta tokens (and logprobs)")
    e.add_argument("results", type=path_arg, help="one JSON object per rollout: group, reward, final output")
    e.add_argument("out", type=path_arg, metavar="DUMP", help="output dump directory (created if missing)")
    e.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def cmd_import_gym(a: argparse.Namespace) -> int:
    from chainrows.formats.gym.importer import DEFAULT_BUDGET, import_gym
    from chainrows.formats.native.dataset import TABLES
    from chainrows.outdir.atomic import check_destination

    check_destination(a.out, TABLES, inputs=[a.dump], overwrite=a.overwrite)
    t0 = time.perf_counter()
    summary = import_gym(a.dump, a.out, memory_budget=a.memory_budget or DEFAULT_BUDGET, threads=a.threads,
                         buckets=a.buckets)
    from chainrows.cli.stdout import print_summary

    print_summary(f"chainrows import-gym {a.dump} -> {a.out}", f"wrote {wrote(a.out, TABLES)}", summary.format(),
                  f"{'time':<22} {time.perf_counter() - t0:.2f} s")
    return 0


def cmd_export_gym(a: argparse.Namespace) -> int:
    from pathlib import Path

    from chainrows.formats.gym.exporter import export_gym
    from chainrows.outdir.atomic import OutputExistsError, check_destination

    # receipts are written last: the commit marker, plain or gzip
    out = check_destination(a.out, ("receipts.jsonl",), inputs=[a.ledger, a.tokens, a.results],
                            overwrite=a.overwrite)
    if (out / "receipts.jsonl.gz").exists() and not a.overwrite:
        raise OutputExistsError(Path(a.out), out / "receipts.jsonl.gz")
    t0 = time.perf_counter()
    counts = export_gym(a.ledger, a.tokens, a.results, a.out)
    from chainrows.cli.stdout import print_summary
    from chainrows.progress import human_bytes

    print_summary(f"chainrows export-gym -> {a.out}",
                  "wrote " + ", ".join(f"{out / n} ({human_bytes((out / n).stat().st_size)})"
                                       for n in ("receipts.jsonl", "staged.jsonl", "results.jsonl")),
                  *(f"{key:<10} {counts[key]:,}" for key in ("rollouts", "calls", "staged")),
                  f"{'time':<10} {time.perf_counter() - t0:.2f} s")
    return 0


COMMANDS = {"import-gym": cmd_import_gym, "export-gym": cmd_export_gym}
