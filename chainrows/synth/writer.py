"""The dataset writer: ``ledger.parquet``, ``tokens.parquet`` and ``rollouts.parquet``, streamed
batch by batch and committed together (chainrows.outdir.atomic.AtomicOutput, the one atomic write of
the project); and ``python -m chainrows.synth``."""

from __future__ import annotations

import time
from collections import Counter
from contextlib import ExitStack

import pyarrow.parquet as pq

from chainrows.errors import writing
from chainrows.formats.native.dataset import TABLES
from chainrows.outdir.atomic import AtomicOutput, check_destination
from chainrows.synth.batches import iter_tables
from chainrows.synth.params import DEFAULT_BATCH_ROLLOUTS, DEFAULTS
from chainrows.synth.tables import tables_schemas


def write_synth_dataset(
    out_dir,
    n_rollouts: int,
    seed: int = 0,
    *,
    batch_rollouts: int = DEFAULT_BATCH_ROLLOUTS,
    workers: int | None = 1,
    overwrite: bool = False,
    compression: str = "snappy",
    **kw,
) -> dict:
    """Write ``ledger.parquet``, ``tokens.parquet`` and ``rollouts.parquet`` under ``out_dir``.

    Batches are streamed (one row group per batch and table) into files staged inside
    ``out_dir`` and committed together at the end: an interrupted run leaves no table behind. An
    ``out_dir`` already holding a dataset is refused (``OutputExistsError``, a FileExistsError)
    unless ``overwrite`` (then its three tables are replaced; other entries stay): the one policy
    of every command that writes, chainrows.outdir.atomic.check_destination.
    ``workers``: see ``iter_synth_batches``. Other keyword arguments are the fields of
    :class:`SynthParams`.
    Returns a summary: rollouts, corrupt, calls, tokens, bytes (of the three files), seconds,
    path, and ``kinds`` (corruption kind -> rollouts; ``CORRUPT_TARGETS`` says what each does).
    """
    t0 = time.perf_counter()
    out = check_destination(out_dir, TABLES, overwrite=overwrite)
    summary = {"rollouts": 0, "corrupt": 0, "calls": 0, "tokens": 0}
    kinds: Counter = Counter()
    schemas = tables_schemas(kw.get("logprobs", DEFAULTS.logprobs))
    with AtomicOutput(out, names=TABLES) as staged:
        paths = [staged.reserve_file(n) for n in TABLES]
        with writing(out), ExitStack() as stack:  # closing a writer writes its footer
            writers = []
            for path, schema in zip(paths, schemas):
                with writing(path):
                    writers.append(stack.enter_context(pq.ParquetWriter(path, schema, compression=compression)))
            for tables, stats in iter_tables(n_rollouts, seed, batch_rollouts, kw, workers):
                for path, w, t in zip(paths, writers, tables):
                    with writing(path):
                        w.write_table(t)
                for k in summary:
                    summary[k] += stats[k]
                kinds.update(stats["kinds"])
        nbytes = sum(path.stat().st_size for path in paths)
    summary.update(bytes=nbytes, seconds=round(time.perf_counter() - t0, 3), path=str(out), kinds=dict(kinds))
    return summary


def main(argv=None) -> int:
    """``python -m chainrows.synth OUT --rollouts N [--seed S] ...``: write a synthetic dataset."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m chainrows.synth", description=main.__doc__)
    ap.add_argument("out")
    ap.add_argument("--rollouts", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1, help="processes building batches (0: one per CPU)")
    ap.add_argument("--batch-rollouts", type=int, default=DEFAULT_BATCH_ROLLOUTS)
    ap.add_argument("--corrupt-rate", type=float, default=DEFAULTS.corrupt_rate)
    ap.add_argument("--worker-rate", type=float, default=DEFAULTS.worker_rate)
    ap.add_argument("--fork-rate", type=float, default=DEFAULTS.fork_rate)
    ap.add_argument("--no-logprobs", action="store_true")
    ap.add_argument("--overwrite", action="store_true")
    a = ap.parse_args(argv)
    from chainrows.errors import InputError
    from chainrows.outdir.atomic import OutputExistsError

    try:
        summary = _write(a)
    except (OSError, ValueError, InputError) as exc:  # an unusable OUT, a bad parameter value
        hint = " (use --overwrite)" if isinstance(exc, OutputExistsError) else ""
        ap.exit(2, f"{ap.prog}: error: {' '.join(str(exc).split())}{hint}\n")
    print(
        f"wrote {summary['path']}: {summary['rollouts']} rollouts ({summary['corrupt']} corrupt), "
        f"{summary['calls']} calls, {summary['tokens']} tokens, {summary['bytes'] / 1e6:.1f} MB "
        f"in {summary['seconds']:.1f} s"
    )
    return 0


def _write(a) -> dict:
    return write_synth_dataset(
        a.out,
        a.rollouts,
        a.seed,
        batch_rollouts=a.batch_rollouts,
        workers=a.workers,
        overwrite=a.overwrite,
        corrupt_rate=a.corrupt_rate,
        worker_rate=a.worker_rate,
        fork_rate=a.fork_rate,
        logprobs=not a.no_logprobs,
    )
