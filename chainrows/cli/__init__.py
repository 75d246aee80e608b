"""The ``chainrows`` command line: reassemble, synth, import-jsonl, import-calls, import-gym, export-gym, stats, pack.

Exit codes: 0 ran (masked rollouts included), 2 unusable input or bad arguments, 1 an internal
error or the machine out of memory or disk (one line; set CHAINROWS_DEBUG=1 for the traceback;
a failed write names the file), 130 interrupted, 143 terminated
(SIGTERM, handled as an interrupt), 141 stdout closed by its reader (``| head``), as a tool killed
by SIGPIPE; a summary that cannot be written to stdout otherwise (a full disk) is 1, one line
saying the output is committed (chainrows.cli.stdout). Every command that
writes follows one overwrite policy (chainrows.outdir.atomic.check_destination): an OUT holding a
complete result is refused unless ``--overwrite``; what an interrupted run left is resumed or
replaced; OUT and the input never nest.
"""

from __future__ import annotations

import argparse
import atexit
import errno
import os
import signal
import sys
import threading
import time
from pathlib import Path

from chainrows import options
from chainrows.cli.calls import COMMANDS as CALLS_COMMANDS  # argparse only, no heavy imports
from chainrows.cli.calls import add_parser as add_calls_parser  # import-calls
from chainrows.cli.common import (
    COMPILING,  # noqa: F401  (COMPILING: re-exported)
    EPILOG,
    OVERWRITE_HELP,
    CompileNotice,
    add_decision_options,
    at_least_one,
    decision_options,
    int_at_least,
    parse_size,
    path_arg,
    tree_bytes,
    wrote,
)
from chainrows.cli.explain import COMMANDS as EXPLAIN_COMMANDS  # argparse only, no heavy imports
from chainrows.cli.explain import add_parsers as add_explain_parsers  # explain, inspect
from chainrows.cli.gym import COMMANDS as GYM_COMMANDS  # argparse only, no heavy imports
from chainrows.cli.gym import add_parsers as add_gym_parsers  # import-gym, export-gym
from chainrows.cli.pack import COMMANDS as PACK_COMMANDS  # argparse only, no heavy imports
from chainrows.cli.pack import add_parser as add_pack_parser  # pack
from chainrows.cli.stdout import StdoutError, detach_stdout, print_summary

DESCRIPTION = "Turn captured LLM-agent model calls into token-exact RL training rows."

_positive = int_at_least(0)
_seed = int_at_least(0, 1 << 64)  # numpy's seed range


def _rate(text: str) -> float:
    """argparse type: a share in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1]: {text!r}")
    return value


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless the help already names it or there is
    none worth naming (a flag that is off unless given, an unset value)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default is None or action.default is False or not action.option_strings:
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2), like every other error, and
    points at the help of the (sub)command it belongs to."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"chainrows: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def _usage_error(a, message: str):
    """A usage error found after parsing (a combination argparse cannot reject): exit 2."""
    _Parser(prog=f"chainrows {a.command}").error(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="chainrows", description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")

    r = sub.add_parser("reassemble", help="a dataset -> OUT/rows/ (training rows, Parquet parts) + OUT/report.parquet",
                       description="Reassemble a dataset (docs/format.md) into training rows "
                                   "(OUT/rows/, a directory of Parquet part files) and one report row per rollout "
                                   "(OUT/report.parquet).", epilog=EPILOG)
    r.add_argument("dataset", type=path_arg, help="dataset directory: ledger, tokens and rollouts tables")
    r.add_argument("out", type=path_arg, help="output directory (created if missing)")
    _reassemble_options(r)

    from chainrows.synth.params import DEFAULTS as synth_defaults  # light: no numpy or pyarrow

    s = sub.add_parser("synth", help="write a synthetic dataset (simulated agent harnesses)",
                       description="Write a synthetic dataset (docs/format.md) of simulated agent "
                                   "harnesses: compactions, rejected retries, GRPO groups and a share "
                                   "of corrupt rollouts covering every reason code.", epilog=EPILOG)
    s.add_argument("out", type=path_arg, help="output directory (created if missing)")
    s.add_argument("--rollouts", type=_positive, default=1000, help="rollouts to write")
    s.add_argument("--seed", type=_seed, default=0, help="the same seed writes the same bytes")
    s.add_argument("--group-size", type=at_least_one, default=synth_defaults.group_size,
                   help=f"rollouts per GRPO group (default {synth_defaults.group_size})")
    s.add_argument("--compaction-rate", type=_rate, default=synth_defaults.compaction_rate,
                   help=f"chance a rollout has compactions (default {synth_defaults.compaction_rate})")
    s.add_argument("--retry-rate", type=_rate, default=synth_defaults.retry_rate,
                   help=f"chance of rejected retries per accepted call (default {synth_defaults.retry_rate})")
    s.add_argument("--corrupt-rate", type=_rate, default=synth_defaults.corrupt_rate,
                   help=f"chance a rollout gets one corruption (default {synth_defaults.corrupt_rate})")
    s.add_argument("--mean-gen-tokens", type=int_at_least(1, 1 << 31), default=synth_defaults.mean_gen_tokens,
                   help=f"mean generated tokens per call (default {synth_defaults.mean_gen_tokens})")
    s.add_argument("--worker-rate", type=_rate, default=synth_defaults.worker_rate,
                   help="share of rollouts whose sub-agent workers interleave their calls "
                        f"(kept by --plan forest; default {synth_defaults.worker_rate})")
    s.add_argument("--fork-rate", type=_rate, default=synth_defaults.fork_rate,
                   help="share of rollouts where two branches continue one call (kept by --plan "
                        f"forest; default {synth_defaults.fork_rate}); with --worker-rate at most 1")
    s.add_argument("--no-logprobs", action="store_true", help="write no logprobs column")
    s.add_argument("--workers", type=_positive, default=1, help="generator processes (0: one per core; default 1)")
    s.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)

    j = sub.add_parser("import-jsonl", help="raw JSON Lines (docs/jsonl.md) -> a dataset",
                       description="Turn three JSON Lines files (docs/jsonl.md) into a dataset "
                                   "(docs/format.md) that reassemble reads.", epilog=EPILOG)
    j.add_argument("ledger", type=path_arg, help="one JSON object per model call")
    j.add_argument("tokens", type=path_arg, help="one JSON object per call: its delta tokens (and logprobs)")
    j.add_argument("results", type=path_arg, help="one JSON object per rollout: group, reward, final output")
    j.add_argument("out", type=path_arg, help="output dataset directory (created if missing)")
    j.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    add_gym_parsers(sub)
    add_calls_parser(sub)
    add_explain_parsers(sub)
    add_pack_parser(sub)

    st = sub.add_parser("stats", help="what a dataset holds, and what cc (linear and forest plan) recovers "
                                      "over ordinary capture",
                        description="Reassemble a dataset three ways (ordinary, cc linear, cc forest) "
                                    "into a temporary directory and compare what each keeps.",
                        epilog=EPILOG)
    st.add_argument("dataset", type=path_arg, help="dataset directory: ledger, tokens and rollouts tables")
    _run_options(st)
    return p


def _reassemble_options(r):
    add_decision_options(r)
    r.add_argument("--buckets", type=at_least_one, default=None, help=argparse.SUPPRESS)
    r.add_argument("--steps", type=at_least_one, default=None, help=argparse.SUPPRESS)
    r.add_argument("--hold-runs", type=int_at_least(0), default=None, help=argparse.SUPPRESS)  # bytes
    r.add_argument("--resume", action="store_true",
                   help="reuse the finished work an interrupted run of the same dataset and options "
                        "left in OUT/.chainrows-work")
    r.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    r.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run on Ray (pip install 'chainrows[ray]'); no ADDRESS starts a local Ray, "
                        "'auto' or ray://host:port joins a cluster; OUT gets rows/ and report/ parts "
                        "(see README 'Many machines')")
    _run_options(r)


def _run_options(r):
    r.add_argument("--memory-budget", type=parse_size, default=None,
                   help="peak memory of the whole process to stay under, e.g. 512MiB (default 4GiB)")
    r.add_argument("--threads", type=at_least_one, default=None, help="kernel threads (default: all cores)")
    r.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bars on stderr (default: when stderr is a terminal); "
                        "--no-progress also silences the note said while kernels compile")


def _options(a) -> options.Options:
    return decision_options(a)


def _forced_route(a):
    """--buckets / --steps (hidden, for tests and measurements) force a path; --hold-runs, the
    bytes of a forced stream's runs held in memory (default: what the budget leaves)."""
    from chainrows.runners.bulk import Route

    if a.hold_runs is not None and not a.steps:
        _usage_error(a, "--hold-runs needs --steps")
    if a.steps:
        return Route("stream", a.steps, "forced by --steps", hold=a.hold_runs)
    if a.buckets:
        return Route("memory", 1, "forced by --buckets 1") if a.buckets == 1 else \
            Route("spill", a.buckets, "forced by --buckets")
    return None


def _set_threads(n):
    if n:
        import numba

        numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))


def _resuming(a) -> bool:
    """--resume with finished work of an interrupted run in OUT: that run may have been
    replacing a complete result, which the resumed run goes on replacing."""
    from chainrows.runners.bulk.job import WORK_DIR

    return a.resume and os.path.isdir(os.path.join(a.out, WORK_DIR))


def cmd_reassemble(a) -> int:
    from chainrows.outdir.atomic import OUTPUT_NAMES, check_destination
    from chainrows.runners import bulk

    opts = _options(a)
    if a.ray is not None:  # the same run on a Ray cluster
        from chainrows.cli.ray import cmd_reassemble_ray

        return cmd_reassemble_ray(a, opts)
    check_destination(a.out, OUTPUT_NAMES, inputs=[a.dataset], overwrite=a.overwrite or _resuming(a))
    _set_threads(a.threads)
    with CompileNotice(a.progress) as compiling:
        summary = bulk.run(a.dataset, a.out, opts, memory_budget=a.memory_budget or bulk.DEFAULT_BUDGET,
                           route=_forced_route(a), resume=a.resume, progress=a.progress)
    # kernels compiled after the warm-up (none known today) stay out of the throughput too
    summary.compile_seconds = max(summary.compile_seconds, compiling.seconds)
    print_summary(f"chainrows reassemble ({a.mode}) {a.dataset} -> {a.out}", f"wrote {wrote(a.out, OUTPUT_NAMES)}",
                  summary.format())
    return 0


def _synth_masks(kinds: dict) -> str:
    """What the corruptions of a synth run do: each kind triggers its reason in one mode
    (chainrows.synth.CORRUPT_TARGETS); the ordinary-mode kinds are clean in cc mode, except
    walk_mismatch, which cc masks as broken_chain."""
    from chainrows.synth import CORRUPT_TARGETS

    ordinary = {k: n for k, n in kinds.items() if CORRUPT_TARGETS[k][0] == "ordinary"}
    clean_in_cc = {k: n for k, n in ordinary.items() if k != "walk_mismatch"}
    cc = sum(kinds.values()) - sum(clean_in_cc.values())
    text = f"{cc:,} masked in cc mode"
    if clean_in_cc:
        text += (f", {sum(clean_in_cc.values()):,} only in --mode ordinary ("
                 + ", ".join(f"{k} {n:,}" for k, n in sorted(clean_in_cc.items())) + ")")
    return text + "; --mode ordinary also masks every clean rollout that compacted (multiple_roots)"


def cmd_synth(a) -> int:
    from chainrows.formats.native.dataset import TABLES
    from chainrows.outdir.atomic import check_destination
    from chainrows.progress import human_bytes
    from chainrows.synth import write_synth_dataset

    if a.worker_rate + a.fork_rate > 1.0:
        _usage_error(a, "--worker-rate plus --fork-rate must be at most 1")
    check_destination(a.out, TABLES, overwrite=a.overwrite)
    t0 = time.perf_counter()
    info = write_synth_dataset(a.out, a.rollouts, a.seed, group_size=a.group_size,
                               compaction_rate=a.compaction_rate, retry_rate=a.retry_rate,
                               corrupt_rate=a.corrupt_rate, mean_gen_tokens=a.mean_gen_tokens,
                               worker_rate=a.worker_rate, fork_rate=a.fork_rate,
                               logprobs=not a.no_logprobs, workers=a.workers or None,
                               overwrite=a.overwrite)
    dt = time.perf_counter() - t0
    lines = [f"chainrows synth -> {a.out}", f"wrote {wrote(a.out, TABLES)}", f"{'rollouts':<10} {info['rollouts']:,}",
             f"{'corrupt':<10} {info['corrupt']:,}" + (f": {_synth_masks(info['kinds'])}" if info["corrupt"] else "")]
    if a.worker_rate or a.fork_rate:
        lines.append(f"{'':<10} workers and forks: broken_chain under --plan linear, ok under --plan forest")
    lines += [f"{k:<10} {info[k]:,}" for k in ("calls", "tokens")]
    lines += [f"{'size':<10} {human_bytes(info['bytes'])}", f"{'time':<10} {dt:.2f} s"]
    print_summary(*lines)
    return 0


def cmd_import_jsonl(a) -> int:
    from chainrows.formats.jsonl import import_jsonl
    from chainrows.formats.native.dataset import TABLES
    from chainrows.formats.native.write import write_dataset_atomic
    from chainrows.outdir.atomic import check_destination

    check_destination(a.out, TABLES, inputs=[a.ledger, a.tokens, a.results], overwrite=a.overwrite)
    t0 = time.perf_counter()
    ledger, tokens, rollouts = import_jsonl(a.ledger, a.tokens, a.results)
    write_dataset_atomic(a.out, ledger, tokens, rollouts)
    print_summary(f"chainrows import-jsonl -> {a.out}", f"wrote {wrote(a.out, TABLES)}",
                  f"{'rollouts':<10} {rollouts.num_rows:,}\n{'calls':<10} {ledger.num_rows:,}\n"
                  f"{'tokens':<10} {tokens.num_rows:,} rows\n{'time':<10} {time.perf_counter() - t0:.2f} s")
    return 0


def cmd_stats(a) -> int:
    import tempfile

    from chainrows.runners import bulk

    _set_threads(a.threads)
    budget = a.memory_budget or bulk.DEFAULT_BUDGET
    with tempfile.TemporaryDirectory(prefix="chainrows-stats-") as tmp, CompileNotice(a.progress):
        cc = bulk.run(a.dataset, os.path.join(tmp, "cc"), options.Options(mode="cc"), memory_budget=budget,
                      progress=a.progress)
        od = bulk.run(a.dataset, os.path.join(tmp, "ordinary"), options.Options(mode="ordinary"),
                      memory_budget=budget, progress=a.progress)
        fo = bulk.run(a.dataset, os.path.join(tmp, "forest"), options.Options(mode="cc", plan="forest"),
                      memory_budget=budget, progress=a.progress)
    lines = [f"chainrows stats {a.dataset}",
             f"input (uncompressed) {cc.input_bytes:,} bytes; rollouts {cc.rollouts:,}; calls {cc.calls:,}; "
             f"orphan token rows {cc.orphan_token_rows:,}"]
    # cc is the linear plan; the forest plan (SPEC §3.1) is compared with it and with ordinary
    runs = (od, cc, fo)
    measures = [("rollouts ok", lambda s: s.ok), ("rollouts masked", lambda s: s.rollouts - s.ok),
                ("rows", lambda s: s.rows), ("tokens", lambda s: s.tokens), ("loss tokens", lambda s: s.loss_tokens)]
    rows = [("", "ordinary", "cc", "cc - ordinary", "forest", "forest - cc", "forest - ordinary")]
    for name, get in measures:
        o, c, f = (get(s) for s in runs)
        rows.append((name, o, c, c - o, f, f - c, f - o))
    for name, *vals in rows:
        lines.append(f"{name:<16}" + "".join(f"{v:>19,}" if isinstance(v, int) else f"{v:>19}" for v in vals))
    reasons = sorted(set(cc.reasons) | set(od.reasons) | set(fo.reasons))
    if reasons:
        lines.append(f"masked by reason{'ordinary':>18}{'cc':>16}{'forest':>16}")
        lines += [f"  {reason:<22}{od.reasons.get(reason, 0):>10,}{cc.reasons.get(reason, 0):>16,}"
                  f"{fo.reasons.get(reason, 0):>16,}" for reason in reasons]
    print_summary(*lines)
    return 0


COMMANDS = {"reassemble": cmd_reassemble, "synth": cmd_synth, "import-jsonl": cmd_import_jsonl,
            "stats": cmd_stats}
COMMANDS.update(GYM_COMMANDS)
COMMANDS.update(CALLS_COMMANDS)
COMMANDS.update(EXPLAIN_COMMANDS)
COMMANDS.update(PACK_COMMANDS)



class Terminated(KeyboardInterrupt):
    """SIGTERM (what ``timeout``, Slurm, Docker and Kubernetes send), raised in the main thread
    so that a run stops and cleans up as it does on Ctrl-C."""


# Once the command's output is committed into its OUT (_committed), or its exit code is decided
# (_settled), SIGINT and SIGTERM are let go by: the run finishes (exit 0, or the code decided),
# never with the signal raised into its cleanup, its printing or the interpreter's shutdown.
_committed = threading.Event()
_settled = threading.Event()


def _let_go() -> bool:
    return _committed.is_set() or _settled.is_set()


def _on_sigint(signum, frame):
    if not _let_go() and not _defer(KeyboardInterrupt, frame):
        raise KeyboardInterrupt


def _on_sigterm(signum, frame):
    if _let_go() or _defer(Terminated, frame):
        return
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the cleanup short
    raise Terminated()


_deferred: list = []  # the interrupt waiting for Numba's compiler lock
_alarm: list = []  # SIGALRM's handler before _defer installed its own
RECHECK_S = 0.02


def _in_numba() -> bool:
    """The main thread holds Numba's compiler lock: it is compiling a kernel or loading one from
    the cache, in LLVM's bindings. (Only asked when numba is already imported; a module still
    being imported, as when the signal arrives during numba's own import, may not have the
    lock yet: then nothing holds it.)"""
    module = sys.modules.get("numba.core.compiler_lock")
    lock = getattr(module, "global_compiler_lock", None)
    return lock is not None and lock.is_locked()


def _in_finalizer(frame) -> bool:
    """The signal arrived inside a finalizer or a callback (``__del__``, an import lock's weakref
    callback), where Python swallows any exception ("Exception ignored in ..."): the interrupt
    would be lost."""
    for _ in range(12):
        if frame is None:
            return False
        if frame.f_code.co_name == "__del__" or frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _defer(kind, frame) -> bool:
    """Whether the interrupt ``kind`` waits: raised inside LLVM's bindings it leaves half-made
    objects whose finalizers then crash the process (SIGSEGV; found by the fuzz campaign), and
    raised inside a finalizer it is swallowed. :func:`_on_recheck` raises it once out of both."""
    if not _in_numba() and not _in_finalizer(frame):
        return False
    if not _deferred:
        _deferred.append(kind)
        previous = signal.signal(signal.SIGALRM, _on_recheck)
        if previous is not _on_recheck:
            _alarm.append(previous)
        signal.setitimer(signal.ITIMER_REAL, RECHECK_S)
    return True


def _on_recheck(signum, frame):
    if _in_numba() or _in_finalizer(frame):
        signal.setitimer(signal.ITIMER_REAL, RECHECK_S)
        return
    kind = _deferred.pop() if _deferred else None
    if kind is not None and not _let_go():
        raise kind()


def _catch_signals() -> dict:
    """Install :func:`_on_sigint` and :func:`_on_sigterm` where those signals still have
    Python's default handling (an embedding program's own handler stays); returns the handlers
    to restore."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for signum, default, handler in ((signal.SIGINT, signal.default_int_handler, _on_sigint),
                                     (signal.SIGTERM, signal.SIG_DFL, _on_sigterm)):
        if signal.getsignal(signum) is default:
            previous[signum] = signal.signal(signum, handler)
    return previous


def _interrupted_line(exc: KeyboardInterrupt) -> None:
    """The one line of an interrupt that found no command's handler (nothing was written)."""
    try:
        what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        print(f"chainrows: {what}; no output written", file=sys.stderr)
    except (KeyboardInterrupt, OSError):  # a second one, or stderr gone: the exit code says it
        pass


def _settle_on_commit(out):
    """An :func:`chainrows.outdir.atomic.on_commit` listener: a commit into the command's ``out``
    settles the run (a command's temporary outputs, as stats makes, do not)."""
    target = None if out is None else os.path.realpath(out)

    def listener(out_dir) -> None:
        if target is not None and os.path.realpath(out_dir) == target:
            _committed.set()

    return listener


def console_main() -> int:
    """The ``chainrows`` command and ``python -m chainrows``: :func:`main` in a process of its
    own. There pandas is kept out of the process: pyarrow imports it, when it is installed, on the first ``pa.array``
    call, only to ask whether the argument is a pandas object, and that import costs every
    command 0.2-0.4 s and ~30 MB of resident memory (docs/decisions-io.md "pandas"). The
    process also gets no transparent huge pages (:func:`_set_huge_pages`). Callers of
    :func:`main` in a process of their own (tests, notebooks) keep their pandas and huge pages.

    Once the command is done the process ends here, with SIGINT and SIGTERM ignored: the atexit
    handlers run, stdout and stderr are flushed, then ``os._exit``. The interpreter's own
    shutdown is skipped, where an interrupt the command handled (exit 130) could still end the
    process by SIGINT (Python remembers a KeyboardInterrupt that once left code it ran; seen
    about once in 40 late interrupts). Not with ``--ray``, whose session shuts down with the
    interpreter."""
    rc = main(own_process=True)
    if any(a == "--ray" or a.startswith("--ray=") for a in sys.argv[1:]):
        return rc
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed reader (| head), already said by the exit code
            pass
    os._exit(rc)


def _set_huge_pages() -> str | None:
    """In the command's own process: forbid transparent huge pages unless
    ``CHAINROWS_HUGE_PAGES=system`` (``memory.process.apply_huge_pages_choice``). Returns the
    error for any other value, else None. Huge pages faulting in dominated runs on virtual
    machines whose host reclaims free memory (docs/limits.md "Huge pages")."""
    from chainrows.memory.process import apply_huge_pages_choice

    return apply_huge_pages_choice()


def main(argv=None, *, own_process: bool = False) -> int:
    """Run one command; returns its exit code (0, 1, 2, 130 or 143, see the module docstring).
    ``own_process``: the process runs this one command (:func:`console_main`), so pandas may be
    kept out of it while the command runs, and huge pages forbidden; and once the exit code is
    decided SIGINT and SIGTERM are ignored for good, so that no signal during the interpreter's
    shutdown kills the process by the signal after the command has finished."""
    _committed.clear()
    _settled.clear()
    previous = _catch_signals()
    try:
        rc = _main(argv, own_process)
    except KeyboardInterrupt as exc:  # outside _main's handlers: parsing, importing, reporting
        rc = 0 if _committed.is_set() else 143 if isinstance(exc, Terminated) else 130
        if rc:
            _interrupted_line(exc)
    finally:
        _settled.set()
        _deferred.clear()
        if _alarm:  # the recheck's timer off, SIGALRM's handler back
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, _alarm.pop())
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_IGN if own_process else handler)
    return rc


def _main(argv, own_process: bool = False) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # the error points at the help of the command they were given to
        message = f"unrecognized arguments: {' '.join(extra)}"
        if args.command:
            _usage_error(args, message)
        parser.error(message)
    if args.version:
        command = _print_version
    elif args.command is None:
        print(f"chainrows: error: a command is required: {', '.join(COMMANDS)} (see chainrows --help)",
              file=sys.stderr)
        return 2
    else:
        command = COMMANDS[args.command]
    if own_process and not args.version:
        bad = _set_huge_pages()
        if bad:
            print(f"chainrows: error: {bad}", file=sys.stderr)
            return 2
    if own_process:
        from chainrows.memory.process import keep_pandas_out

        finder = keep_pandas_out()
    else:
        finder = None
    from chainrows.errors import InputError, WriteError, write_error
    from chainrows.outdir.atomic import OutputExistsError, on_commit

    out = getattr(args, "out", None)
    fresh = out is not None and not os.path.lexists(out)  # an OUT this run makes
    rc = 1
    try:
        with on_commit(_settle_on_commit(out)):
            rc = command(args)
        return rc
    except InputError as exc:
        print(f"chainrows: error: {exc}", file=sys.stderr)
        rc = 2
    except OutputExistsError as exc:
        print(f"chainrows: error: output {exc.out_dir} already holds a complete result "
              f"({exc.marker.name}): pass --overwrite to replace it, or choose another OUT", file=sys.stderr)
        rc = 2
    except BrokenPipeError:  # stdout's reader left (``| head``): end as a tool killed by SIGPIPE
        detach_stdout()
        rc = 128 + 13
    except StdoutError as exc:  # the summary, printed once the outputs are committed: not the input's fault
        detach_stdout()
        done = "" if args.version else f"; the run finished{f' and its output is in {out}' if out else ''}"
        print(f"chainrows: error: {exc}{done}", file=sys.stderr)
        rc = 1
    except WriteError as exc:  # an output or work file of this run could not be written
        rc = _write_failed(exc, args)
    except OSError as exc:  # a path we cannot read or write: unusable input/output location
        if exc.errno in _NO_ROOM:  # out of room making a directory or a lock file: a write too
            rc = _write_failed(write_error(exc, exc.filename or out or "the output"), args)
        else:
            where = f": {exc.filename}" if exc.filename else ""
            hint = f" ({_IN_THE_WAY[exc.errno]}{_file_in_the_way(exc)})" if exc.errno in _IN_THE_WAY else ""
            print(f"chainrows: error: {exc.strerror or ' '.join(str(exc).split())}{where}{hint}", file=sys.stderr)
            rc = 2
    except KeyboardInterrupt as exc:
        what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        print(f"chainrows: {what}{_no_output(args)}", file=sys.stderr)
        rc = 143 if isinstance(exc, Terminated) else 130
    except MemoryError as exc:  # the machine's limit, not the input's fault (pyarrow's ArrowMemoryError too)
        if os.environ.get("CHAINROWS_DEBUG"):
            raise
        detail = " ".join(str(exc).split())
        print(f"chainrows: error: out of memory{f' ({detail})' if detail else ''}: give the run a "
              f"--memory-budget within what this machine has free{_left_behind(args)}", file=sys.stderr)
        rc = 1
    except Exception as exc:  # one line, never a traceback at the CLI
        if os.environ.get("CHAINROWS_DEBUG"):
            raise
        msg = " ".join(str(exc).split())
        print(f"chainrows: internal error: {type(exc).__name__}: {msg}{_left_behind(args)}", file=sys.stderr)
        rc = 1
    finally:
        _settled.set()
        if rc != 0 and fresh:
            _remove_if_empty(out)
        if finder is not None and finder in sys.meta_path:
            sys.meta_path.remove(finder)
    return rc


# errnos of a write that failed for want of room (disk or quota full, file-size limit) or of
# the device (an I/O error), not because of the input or the place asked for: exit 1, not 2
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})  # only a write gets these
_OUT_OF_ROOM = _NO_ROOM | {errno.EIO}


_IN_THE_WAY = {  # what the bare strerror of a path in the way leaves the user to guess
    errno.EEXIST: "something already at this path is in the way: a file, a symbolic link to nothing, "
                  "or a directory that could not be removed",
    errno.EISDIR: "a directory is where chainrows needs a file",
    errno.ENOTDIR: "a file is where chainrows needs a directory",
}


def _file_in_the_way(exc: OSError) -> str:
    """For ENOTDIR: ``": FILE"``, the first component of ``exc.filename`` that is not a directory
    (the path named is under it); else ""."""
    if exc.errno != errno.ENOTDIR or not exc.filename:
        return ""
    path = Path(os.path.abspath(os.fsdecode(exc.filename)))
    for above in reversed(path.parents):  # from the root down
        if os.path.lexists(above) and not above.is_dir():
            return f": {above}"
    return ""


def _write_failed(exc, args) -> int:
    """The one line of a failed write (a WriteError) and its exit code: 1 when the machine is out
    of room or the disk failed (its limit, as out of memory), 2 otherwise (e.g. permission)."""
    if os.environ.get("CHAINROWS_DEBUG"):
        raise exc
    print(f"chainrows: error: {exc}{_no_output(args)}", file=sys.stderr)
    return 1 if exc.errno in _OUT_OF_ROOM else 2


def _print_version(a) -> int:
    from chainrows import __version__

    print_summary(f"chainrows {__version__}")
    return 0


def _no_output(a) -> str:
    """For a run that failed writing or was interrupted: nothing was committed, and the work
    kept for --resume."""
    return f"; no output written{_left_behind(a)}"


def _work_dir(a) -> str | None:
    """OUT/.chainrows-work of a single-process reassemble (where --resume finds its work)."""
    if a.command != "reassemble" or getattr(a, "ray", None) is not None:
        return None
    from chainrows.runners.bulk.job import WORK_DIR

    return os.path.join(a.out, WORK_DIR)


def _left_behind(a) -> str:
    """For the message of a run that stopped (interrupted, a failed write, out of memory, an
    internal error): the finished work a rerun with --resume reuses; nothing when there is none
    (the run removes its own work that holds none) or it cannot be looked at."""
    try:  # only extra words on the one line: whatever fails here (the disk, or the very import
        # that made the internal error) must not turn that line into a traceback
        work = _work_dir(a)
        if work is None:
            return ""
        from pathlib import Path

        from chainrows.progress import human_bytes
        from chainrows.runners.bulk.job import holds_finished_work

        if not holds_finished_work(Path(work)):
            return ""
        size = human_bytes(tree_bytes(work))
    except Exception:  # noqa: BLE001
        return ""
    return f"; {work} keeps {size} of finished work: run the same command with --resume to reuse it, or delete it"


def _remove_if_empty(path) -> None:
    """A failed or interrupted run leaves no empty OUT of its own making behind."""
    try:
        os.rmdir(path)
    except OSError:  # not empty (e.g. work kept for --resume), or gone
        pass


if __name__ == "__main__":
    sys.exit(console_main())
