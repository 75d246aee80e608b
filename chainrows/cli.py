"""The ``chainrows`` command line: reassemble, synth, import-jsonl, stats (SPEC §7).

Exit codes: 0 ran (masked rollouts included), 2 unusable input or bad arguments, 1 an internal
error (one line; set CHAINROWS_DEBUG=1 for the traceback), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

from chainrows import options

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1 << 10, "mib": 1 << 20,
          "gib": 1 << 30, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """'4GiB', '512MB', '1e9' -> bytes."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 4GiB or 512MB)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value < 1 << 20:
        raise argparse.ArgumentTypeError(f"memory budget {text!r} is below 1 MiB")
    return int(value)


def _int_at_least(lowest: int):
    """argparse type: an integer >= lowest."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < lowest:
            raise argparse.ArgumentTypeError(f"must be >= {lowest}")
        return value

    return parse


_positive = _int_at_least(0)
_at_least_one = _int_at_least(1)


def _rate(text: str) -> float:
    """argparse type: a share in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1]: {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2), like every other error."""

    def error(self, message):
        self.exit(2, f"chainrows: error: {' '.join(message.split())} (see chainrows --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="chainrows", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

    r = sub.add_parser("reassemble", help="dataset -> OUT/rows.parquet + OUT/report.parquet")
    r.add_argument("dataset")
    r.add_argument("out")
    _reassemble_options(r)

    from chainrows.synth.params import DEFAULTS as synth_defaults  # light: no numpy or pyarrow

    s = sub.add_parser("synth", help="write a synthetic SPEC §2 dataset")
    s.add_argument("out")
    s.add_argument("--rollouts", type=_positive, default=1000)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--group-size", type=_at_least_one, default=synth_defaults.group_size,
                   help=f"rollouts per GRPO group (default {synth_defaults.group_size})")
    s.add_argument("--compaction-rate", type=_rate, default=synth_defaults.compaction_rate,
                   help=f"chance a rollout has compactions (default {synth_defaults.compaction_rate})")
    s.add_argument("--retry-rate", type=_rate, default=synth_defaults.retry_rate,
                   help=f"chance of rejected retries per accepted call (default {synth_defaults.retry_rate})")
    s.add_argument("--corrupt-rate", type=_rate, default=synth_defaults.corrupt_rate,
                   help=f"chance a rollout gets one corruption (default {synth_defaults.corrupt_rate})")
    s.add_argument("--mean-gen-tokens", type=_at_least_one, default=synth_defaults.mean_gen_tokens,
                   help=f"mean generated tokens per call (default {synth_defaults.mean_gen_tokens})")
    s.add_argument("--worker-rate", type=_rate, default=synth_defaults.worker_rate,
                   help="share of rollouts whose sub-agent workers interleave (SPEC §3.1; "
                        f"default {synth_defaults.worker_rate})")
    s.add_argument("--fork-rate", type=_rate, default=synth_defaults.fork_rate,
                   help="share of rollouts where two branches continue one call (SPEC §3.1; "
                        f"default {synth_defaults.fork_rate}); with --worker-rate at most 1")
    s.add_argument("--no-logprobs", action="store_true")
    s.add_argument("--workers", type=_positive, default=1, help="generator processes (0: one per core; default 1)")
    s.add_argument("--overwrite", action="store_true", help="replace an existing dataset in OUT")

    j = sub.add_parser("import-jsonl", help="raw JSON Lines (docs/jsonl.md) -> SPEC §2 dataset")
    j.add_argument("ledger")
    j.add_argument("tokens")
    j.add_argument("results")
    j.add_argument("out")

    st = sub.add_parser("stats", help="what a dataset holds, and what cc (linear and forest plan) recovers "
                                      "over ordinary capture")
    st.add_argument("dataset")
    st.add_argument("--memory-budget", type=parse_size, default=None)
    st.add_argument("--threads", type=_at_least_one, default=None)
    st.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    return p


def _reassemble_options(r):
    r.add_argument("--mode", choices=options.MODES, default="cc")
    r.add_argument("--plan", choices=options.PLANS, default="linear",
                   help="cc: how accepted calls become rows: linear (one chain per root) or forest "
                        "(one row per endpoint, shared calls trained once; SPEC §3.1) (default: linear)")
    r.add_argument("--placeholders", action="store_true",
                   help="write one zero-weight placeholder row per masked rollout")
    r.add_argument("--baseline", choices=options.BASELINES, default="mean")
    r.add_argument("--no-std", action="store_true", help="A = r - baseline (no std division)")
    r.add_argument("--baseline-population", choices=options.POPULATIONS, default="all")
    r.add_argument("--row-weight", choices=options.ROW_WEIGHTS, default="rollout")
    r.add_argument("--memory-budget", type=parse_size, default=None,
                   help="peak memory to stay under, e.g. 4GiB (default 4GiB)")
    r.add_argument("--buckets", type=_at_least_one, default=None, help=argparse.SUPPRESS)
    r.add_argument("--steps", type=_at_least_one, default=None, help=argparse.SUPPRESS)
    r.add_argument("--resume", action="store_true",
                   help="reuse finished partitions of an interrupted run into the same OUT")
    r.add_argument("--threads", type=_at_least_one, default=None, help="kernel threads (default: all cores)")
    r.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")


def _options(a) -> options.Options:
    try:
        return options.Options(mode=a.mode, plan=a.plan, placeholders=a.placeholders,
                               baseline=a.baseline, no_std=a.no_std,
                               baseline_population=a.baseline_population, row_weight=a.row_weight)
    except ValueError as exc:  # a combination argparse cannot reject (--plan forest --mode ordinary)
        _Parser(prog="chainrows").error(str(exc))


def _forced_route(a):
    """--buckets / --steps (hidden, for tests and measurements) force a path."""
    from chainrows.bulk import Route

    if a.steps:
        return Route("stream", a.steps, "forced by --steps")
    if a.buckets:
        return Route("memory", 1, "forced by --buckets 1") if a.buckets == 1 else \
            Route("spill", a.buckets, "forced by --buckets")
    return None


def _set_threads(n):
    if n:
        import numba

        numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))


def cmd_reassemble(a) -> int:
    from chainrows import bulk

    _set_threads(a.threads)
    summary = bulk.run(a.dataset, a.out, _options(a), memory_budget=a.memory_budget or bulk.DEFAULT_BUDGET,
                       route=_forced_route(a), resume=a.resume, progress=a.progress)
    print(f"chainrows reassemble ({a.mode}) {a.dataset} -> {a.out}")
    print(summary.format())
    return 0


def cmd_synth(a) -> int:
    from chainrows.progress import human_bytes
    from chainrows.synth import write_synth_dataset

    if a.worker_rate + a.fork_rate > 1.0:
        _Parser(prog="chainrows").error("--worker-rate plus --fork-rate must be at most 1")
    t0 = time.perf_counter()
    info = write_synth_dataset(a.out, a.rollouts, a.seed, group_size=a.group_size,
                               compaction_rate=a.compaction_rate, retry_rate=a.retry_rate,
                               corrupt_rate=a.corrupt_rate, mean_gen_tokens=a.mean_gen_tokens,
                               worker_rate=a.worker_rate, fork_rate=a.fork_rate,
                               logprobs=not a.no_logprobs, workers=a.workers or None,
                               overwrite=a.overwrite)
    dt = time.perf_counter() - t0
    print(f"chainrows synth -> {a.out}")
    for k in ("rollouts", "corrupt", "calls", "tokens"):
        print(f"{k:<10} {info[k]:,}")
    print(f"{'size':<10} {human_bytes(info['bytes'])}")
    print(f"{'time':<10} {dt:.2f} s")
    return 0


def cmd_import_jsonl(a) -> int:
    from chainrows.io.jsonl import import_jsonl
    from chainrows.io.write import write_dataset_atomic

    t0 = time.perf_counter()
    ledger, tokens, rollouts = import_jsonl(a.ledger, a.tokens, a.results)
    write_dataset_atomic(a.out, ledger, tokens, rollouts)
    print(f"chainrows import-jsonl -> {a.out}")
    print(f"{'rollouts':<10} {rollouts.num_rows:,}\n{'calls':<10} {ledger.num_rows:,}\n"
          f"{'tokens':<10} {tokens.num_rows:,} rows\n{'time':<10} {time.perf_counter() - t0:.2f} s")
    return 0


def cmd_stats(a) -> int:
    import tempfile

    from chainrows import bulk

    _set_threads(a.threads)
    budget = a.memory_budget or bulk.DEFAULT_BUDGET
    with tempfile.TemporaryDirectory(prefix="chainrows-stats-") as tmp:
        cc = bulk.run(a.dataset, os.path.join(tmp, "cc"), options.Options(mode="cc"), memory_budget=budget,
                      progress=a.progress)
        od = bulk.run(a.dataset, os.path.join(tmp, "ordinary"), options.Options(mode="ordinary"),
                      memory_budget=budget, progress=a.progress)
        fo = bulk.run(a.dataset, os.path.join(tmp, "forest"), options.Options(mode="cc", plan="forest"),
                      memory_budget=budget, progress=a.progress)
    print(f"chainrows stats {a.dataset}")
    print(f"input (uncompressed) {cc.input_bytes:,} bytes; rollouts {cc.rollouts:,}; calls {cc.calls:,}; "
          f"orphan token rows {cc.orphan_token_rows:,}")
    # cc is the linear plan; the forest plan (SPEC §3.1) is compared with it and with ordinary
    runs = (od, cc, fo)
    measures = [("rollouts ok", lambda s: s.ok), ("rollouts masked", lambda s: s.rollouts - s.ok),
                ("rows", lambda s: s.rows), ("tokens", lambda s: s.tokens), ("loss tokens", lambda s: s.loss_tokens)]
    rows = [("", "ordinary", "cc", "cc - ordinary", "forest", "forest - cc", "forest - ordinary")]
    for name, get in measures:
        o, c, f = (get(s) for s in runs)
        rows.append((name, o, c, c - o, f, f - c, f - o))
    for name, *vals in rows:
        print(f"{name:<16}" + "".join(f"{v:>19,}" if isinstance(v, int) else f"{v:>19}" for v in vals))
    reasons = sorted(set(cc.reasons) | set(od.reasons) | set(fo.reasons))
    if reasons:
        print(f"masked by reason{'ordinary':>18}{'cc':>16}{'forest':>16}")
        for reason in reasons:
            print(f"  {reason:<22}{od.reasons.get(reason, 0):>10,}{cc.reasons.get(reason, 0):>16,}"
                  f"{fo.reasons.get(reason, 0):>16,}")
    return 0


COMMANDS = {"reassemble": cmd_reassemble, "synth": cmd_synth, "import-jsonl": cmd_import_jsonl,
            "stats": cmd_stats}


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.version:
        from chainrows import __version__

        print(f"chainrows {__version__}")
        return 0
    if args.command is None:
        print(f"chainrows: error: a command is required: {', '.join(COMMANDS)} (see chainrows --help)",
              file=sys.stderr)
        return 2
    from chainrows.io.errors import InputError

    try:
        return COMMANDS[args.command](args)
    except InputError as exc:
        print(f"chainrows: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path we cannot read or write: unusable input/output location
        where = f": {exc.filename}" if exc.filename else ""
        hint = " (use --overwrite)" if args.command == "synth" and isinstance(exc, FileExistsError) else ""
        print(f"chainrows: error: {exc.strerror or ' '.join(str(exc).split())}{where}{hint}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("chainrows: interrupted; no output written", file=sys.stderr)
        return 130
    except Exception as exc:  # one line, never a traceback at the CLI
        if os.environ.get("CHAINROWS_DEBUG"):
            raise
        msg = " ".join(str(exc).split())
        print(f"chainrows: internal error: {type(exc).__name__}: {msg}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
