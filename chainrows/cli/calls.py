"""The ``import-calls`` command (docs/calls.md); chainrows.cli registers it.

Errors follow chainrows.cli: one line, nothing written; an InputError exits 2.
"""

from __future__ import annotations

import argparse

from chainrows.cli.common import EPILOG, OVERWRITE_HELP, CompileNotice, at_least_one, parse_size, path_arg, wrote


def add_parser(sub) -> None:
    """Add ``import-calls`` to chainrows.cli's subparsers."""
    c = sub.add_parser("import-calls", help="full-sequence call logs -> a dataset (docs/calls.md)",
                       description="Turn a log of model calls that holds each call's whole prompt and its "
                                   "completion (token ids) into a dataset (docs/format.md): every call's "
                                   "parent is inferred by exact token prefix, its delta and chain hash "
                                   "computed, and every place the tokens drifted reported in "
                                   "OUT/import_report.parquet (docs/calls.md).", epilog=EPILOG)
    c.add_argument("calls", type=path_arg, help="the call log: JSON Lines (.jsonl, .jsonl.gz), a Parquet file or a "
                                 "directory of Parquet files; one record per call, in capture order")
    c.add_argument("results", type=path_arg, help="one JSON object per rollout: group, reward, final output (as "
                                   "import-jsonl reads it, docs/jsonl.md)")
    c.add_argument("out", type=path_arg, help="output dataset directory (created if missing)")
    c.add_argument("--on-drift", choices=("root", "mask"), default="root",
                   help="a call whose prompt departs inside an earlier call's generated tokens: root "
                        "(train it as a new row) or mask (its rollout is masked hash_mismatch)")
    c.add_argument("--memory-budget", type=parse_size, default=None,
                   help="peak memory to stay under, e.g. 2GiB (default 4GiB)")
    c.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars on stderr (default: when stderr is a terminal); "
                        "--no-progress also silences the note said while kernels compile")
    c.add_argument("--buckets", type=at_least_one, default=None, help=argparse.SUPPRESS)  # tests, measurements
    c.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def cmd_import_calls(a: argparse.Namespace) -> int:
    from chainrows.cli.stdout import print_summary
    from chainrows.outdir.atomic import check_destination
    from chainrows.runners.calls.job import DEFAULT_BUDGET, import_calls_to_dataset
    from chainrows.runners.calls.outputs import NAMES

    check_destination(a.out, NAMES, inputs=[a.calls, a.results], overwrite=a.overwrite)
    with CompileNotice(a.progress):
        summary = import_calls_to_dataset(a.calls, a.results, a.out, on_drift=a.on_drift,
                               memory_budget=a.memory_budget or DEFAULT_BUDGET, progress=a.progress,
                               buckets=a.buckets)
    print_summary(f"chainrows import-calls {a.calls} -> {a.out}", f"wrote {wrote(a.out, NAMES)}",
                  summary.format())
    return 0


COMMANDS = {"import-calls": cmd_import_calls}
