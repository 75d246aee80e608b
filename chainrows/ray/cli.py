"""``chainrows reassemble DATASET OUT --ray [ADDRESS]``: the command-line glue of the Ray path."""

from __future__ import annotations

import sys

# single-process knobs with no meaning on Ray (each task holds whole groups; Ray schedules)
_NOT_WITH_RAY = (("memory_budget", "--memory-budget"), ("steps", "--steps"), ("resume", "--resume"),
                 ("threads", "--threads"))


def usage_problem(a) -> str | None:
    """Why these reassemble arguments cannot go with --ray, or None."""
    for attr, flag in _NOT_WITH_RAY:
        if getattr(a, attr, None):
            return f"{flag} does not apply with --ray"
    return None


def check_out(dataset: str, out: str, overwrite: bool) -> None:
    """The single-process overwrite policy (chainrows.io.write.check_destination) for a local
    OUT; for a URI OUT, a committed ``report`` is refused unless ``overwrite``."""
    from chainrows.io.write import OUTPUT_NAMES, OutputExistsError, check_destination
    from chainrows.ray.source import locate

    dst = locate(out)
    if dst.local:
        check_destination(out, OUTPUT_NAMES, inputs=[] if "://" in dataset else [dataset], overwrite=overwrite)
        return
    import pyarrow.fs as pafs
    from pathlib import PurePosixPath

    marker = OUTPUT_NAMES[-1]
    for form in (f"{marker}.parquet", marker):
        if not overwrite and dst.fs.get_file_info(dst.join(form)).type != pafs.FileType.NotFound:
            raise OutputExistsError(out, PurePosixPath(dst.join(form)))


def cmd_reassemble_ray(a, options) -> int:
    """Run the Ray path for parsed ``reassemble`` arguments ``a``; print the summary."""
    from chainrows.ray.job import run

    problem = usage_problem(a)
    if problem:
        print(f"chainrows: error: {problem} (see chainrows reassemble --help)", file=sys.stderr)
        return 2
    try:
        check_out(a.dataset, a.out, a.overwrite)
        # Ray Data's bars under the single-process rule: by default only on a terminal
        progress = a.progress if a.progress is not None else sys.stderr.isatty()
        summary = run(a.dataset, a.out, options, address=a.ray or None, buckets=a.buckets,
                      progress=progress)
    except ImportError as exc:
        print(f"chainrows: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(f"chainrows reassemble ({options.mode}) {a.dataset} -> {a.out}")
    print(summary.format())
    return 0
