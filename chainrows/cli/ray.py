"""``chainrows reassemble DATASET OUT --ray [ADDRESS]``: the command-line glue of the Ray path."""

from __future__ import annotations

import contextlib
import logging
import os
import sys

# single-process knobs with no meaning on Ray (each task holds whole groups; Ray schedules)
_NOT_WITH_RAY = (("memory_budget", "--memory-budget"), ("steps", "--steps"), ("hold_runs", "--hold-runs"),
                 ("resume", "--resume"), ("threads", "--threads"))


def usage_problem(a) -> str | None:
    """Why these reassemble arguments cannot go with --ray, or None (an option left unset is
    None or False; ``--hold-runs 0`` is set)."""
    for attr, flag in _NOT_WITH_RAY:
        value = getattr(a, attr, None)
        if value is not None and value is not False:
            return f"{flag} does not apply with --ray"
    return None


def check_out(dataset: str, out: str, overwrite: bool) -> None:
    """The single-process overwrite policy (chainrows.outdir.atomic.check_destination) for a local
    OUT; for a URI OUT, a committed ``report`` is refused unless ``overwrite``."""
    from chainrows.outdir.atomic import OUTPUT_NAMES, OutputExistsError, check_destination
    from chainrows.runners.ray.source import locate

    dst = locate(out)
    if dst.local:
        check_destination(out, OUTPUT_NAMES, inputs=[] if "://" in dataset else [dataset], overwrite=overwrite)
        return
    from pathlib import PurePosixPath

    import pyarrow.fs as pafs

    marker = OUTPUT_NAMES[-1]
    for form in (f"{marker}.parquet", marker):
        if not overwrite and dst.fs.get_file_info(dst.join(form)).type != pafs.FileType.NotFound:
            raise OutputExistsError(out, PurePosixPath(dst.join(form)))


@contextlib.contextmanager
def quiet_logs():
    """Inside, no Python log record at ERROR or below is emitted (CHAINROWS_DEBUG=1: all are).

    Ray logs a failed task's error with its traceback before the exception reaches the CLI,
    which prints its own one line: the InputError a task raised
    (chainrows.runners.ray.cluster.input_error_in), or a one-line internal error for a genuine Ray
    failure. Ray configures its loggers and handlers when it starts, so their levels would not
    hold; ``logging.disable`` does. For the CLI's process only: the API leaves the
    caller's logging alone. The workers' output (e.g. a raylet's note that a task the abort
    cut short will be retried) is not logging: ``worker_logs`` keeps it off too."""
    if _debug():
        yield
        return
    previous = logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        yield
    finally:
        logging.disable(previous)


def _debug() -> bool:
    return bool(os.environ.get("CHAINROWS_DEBUG"))


def cmd_reassemble_ray(a, options) -> int:
    """Run the Ray path for parsed ``reassemble`` arguments ``a``; print the summary."""
    from chainrows.runners.ray.job import run

    problem = usage_problem(a)
    if problem:
        print(f"chainrows: error: {problem} (see chainrows reassemble --help)", file=sys.stderr)
        return 2
    try:
        check_out(a.dataset, a.out, a.overwrite)
        # the stage lines under the single-process rule: by default only on a terminal
        progress = a.progress if a.progress is not None else sys.stderr.isatty()
        with quiet_logs():
            summary = run(a.dataset, a.out, options, address=a.ray or None, buckets=a.buckets,
                          progress=progress, worker_logs=_debug())
    except ImportError as exc:
        print(f"chainrows: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    from chainrows.cli.stdout import print_summary

    print_summary(f"chainrows reassemble ({options.mode}) {a.dataset} -> {a.out}", summary.format())
    return 0
