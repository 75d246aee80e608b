"""The ``explain`` and ``inspect`` commands (docs/explain.md); chainrows.cli registers them.

Errors follow chainrows.cli: one line; an InputError (a bad rollout id, unusable data) exits 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from chainrows.cli.common import EPILOG, add_decision_options, at_least_one, decision_options, path_arg


def add_parsers(sub) -> None:
    """Add ``explain`` and ``inspect`` to chainrows.cli's subparsers."""
    e = sub.add_parser("explain", help="why rollouts came out as they did, call by call",
                       description="Decide rollouts as reassemble does (same engine, same options) and "
                                   "show each one's status and reason, every call in capture order "
                                   "(selected or not and why, its chain, its loss tokens), the rows, "
                                   "and for a masked rollout the failed check with what it compared "
                                   "and the fix. Reads only the asked rollouts and their groups.",
                       epilog=EPILOG)
    e.add_argument("dataset", type=path_arg, help="dataset directory: ledger, tokens and rollouts tables")
    e.add_argument("rollout_ids", nargs="+", metavar="ROLLOUT_ID", help="rollouts to explain")
    add_decision_options(e)
    e.add_argument("--json", action="store_true",
                   help="print one JSON object per rollout per line instead of the tree")

    i = sub.add_parser("inspect", help="an output as one self-contained HTML report",
                       description="Write one static HTML file (no server, no network) about a "
                                   "reassemble output: how the run was made, status and reason shares, "
                                   "rows and splits, loss tokens, reward and advantage spread per group; "
                                   "with --data, also generated tokens never trained and drill-downs of "
                                   "a sample of masked and split rollouts with their call trees.",
                       epilog=EPILOG)
    i.add_argument("source", type=path_arg, metavar="OUT", help="a reassemble output directory (rows and report)")
    i.add_argument("--data", type=path_arg, default=None, help="the dataset it was made from (for call trees and "
                                                "token counts); its options are read from OUT")
    i.add_argument("--html", dest="out", type=path_arg, required=True, metavar="FILE", help="the HTML file to write")
    i.add_argument("--sample", type=at_least_one, default=24,
                   help="masked and split rollouts drawn with their call trees, each (default 24)")
    i.add_argument("--overwrite", action="store_true", help="replace FILE when it exists")


def cmd_explain(a: argparse.Namespace) -> int:
    from chainrows.explanation import explain

    options = decision_options(a)
    for e in explain(a.dataset, list(a.rollout_ids), options):
        sys.stdout.write(json.dumps(e, sort_keys=False) + "\n" if a.json else str(e) + "\n\n")
    return 0


def cmd_inspect(a: argparse.Namespace) -> int:
    from chainrows.inspection import write_report

    summary = write_report(a.source, a.out, data=a.data, sample=a.sample, overwrite=a.overwrite)
    print(summary)
    return 0


COMMANDS = {"explain": cmd_explain, "inspect": cmd_inspect}
