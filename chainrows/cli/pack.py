"""The ``pack`` command (docs/cli.md, docs/trainers.md): a rows table -> packed batches staged on
disk, one directory of Parquet parts per data-parallel rank; chainrows.cli registers it.

Errors follow chainrows.cli: one line, nothing written; an InputError (no rows table, a row
longer than ``--max-tokens`` without ``--drop-long-rows``) exits 2.
"""

from __future__ import annotations

import argparse
import time

from chainrows.cli.common import EPILOG, OVERWRITE_HELP, at_least_one, int_at_least, path_arg, wrote

PART_TOKENS = 1 << 22  # a rank's part file is written once it holds this many tokens
SUMMARY = "packing"  # PACKED/packing.parquet, one row per rank; committed last


def rank_name(rank: int) -> str:
    """The directory of rank ``rank``'s parts in PACKED."""
    return f"rank-{rank:05d}"


def add_parser(sub) -> None:
    """Add ``pack`` to chainrows.cli's subparsers."""
    p = sub.add_parser("pack", help="OUT/rows -> packed batches with cu_seqlens, one directory per rank",
                       description="Pack the rows of OUT (a reassemble output, a rows directory or file) "
                                   "into batches of at most --max-tokens tokens: rows back to back, never "
                                   "split, with cu_seqlens and position ids restarting per row; each of "
                                   "--world-size ranks gets as many batches (docs/trainers.md). Writes "
                                   "PACKED/rank-NNNNN/part-*.parquet (one row per batch) and "
                                   "PACKED/packing.parquet (one row per rank).", epilog=EPILOG)
    p.add_argument("rows", type=path_arg, metavar="OUT", help="a reassemble output directory (its rows/), or a rows "
                                               "directory or Parquet file")
    p.add_argument("out", type=path_arg, metavar="PACKED", help="output directory (created if missing)")
    p.add_argument("--max-tokens", type=at_least_one, required=True,
                   help="token budget of a batch (rows are never split: a longer row is an error)")
    p.add_argument("--world-size", type=at_least_one, default=1, help="data-parallel ranks (default 1)")
    p.add_argument("--seed", type=int_at_least(0), default=0, help="the order (pass the epoch; default 0)")
    p.add_argument("--no-shuffle", action="store_true", help="file order, batches in packing order")
    p.add_argument("--window", type=at_least_one, default=4096,
                   help="rows packed together (default 4096): more fill fuller batches, hold more memory")
    p.add_argument("--drop-long-rows", action="store_true",
                   help="skip rows longer than --max-tokens (counted in the summary) instead of failing")
    p.add_argument("--pad-to-max", action="store_true", help="pad every batch to exactly --max-tokens")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def cmd_pack(a: argparse.Namespace) -> int:
    import numpy as np
    import pyarrow as pa

    from chainrows.batches.packed import PackedBatches, batches_table
    from chainrows.cli.stdout import print_summary
    from chainrows.outdir.atomic import AtomicOutput, check_destination
    from chainrows.progress import Progress

    names = [rank_name(r) for r in range(a.world_size)] + [SUMMARY]
    check_destination(a.out, names, inputs=[a.rows], overwrite=a.overwrite)
    t0 = time.perf_counter()
    packer = PackedBatches(a.rows, max_tokens=a.max_tokens, ranks=range(a.world_size),
                           world_size=a.world_size, seed=a.seed, shuffle=not a.no_shuffle,
                           window=a.window, long_rows="drop" if a.drop_long_rows else "error",
                           pad_to_max=a.pad_to_max, ids_dtype=np.int32)
    logprobs = "logprobs" in packer.columns
    bar = Progress("pack", packer.total_rows, enabled=a.progress, unit="rows")
    packer.on_window = bar.advance
    buffers: dict[int, list] = {r: [] for r in range(a.world_size)}
    steps = dict.fromkeys(range(a.world_size), 0)
    with AtomicOutput(a.out, names) as out:

        def flush(rank: int) -> None:
            held = buffers[rank]
            first = steps[rank] - len(held)
            out.write_part(rank_name(rank), batches_table(held, range(first, steps[rank]), logprobs=logprobs))
            buffers[rank] = []

        for rank, batch in packer.with_ranks():
            buffers[rank].append(batch)
            steps[rank] += 1
            if sum(b["num_tokens"] for b in buffers[rank]) >= PART_TOKENS:
                flush(rank)
        for rank in range(a.world_size):
            if buffers[rank] or not steps[rank]:
                flush(rank)
        stats = packer.stats
        out.write_table(SUMMARY, pa.table({
            "rank": pa.array(range(a.world_size), type=pa.int32()),
            "batches": pa.array([stats.bins_per_rank.get(r, 0) for r in range(a.world_size)], type=pa.int64()),
            "tokens": pa.array([stats.tokens_per_rank.get(r, 0) for r in range(a.world_size)], type=pa.int64()),
            "max_tokens": pa.array([a.max_tokens] * a.world_size, type=pa.int64()),
            "seed": pa.array([a.seed] * a.world_size, type=pa.int64())}))
    bar.close()
    print_summary(*_summary(a, names, packer.stats, time.perf_counter() - t0))
    return 0


def _summary(a: argparse.Namespace, names: list[str], stats, seconds: float) -> list[str]:
    per_rank = [stats.tokens_per_rank.get(r, 0) for r in range(a.world_size)]
    lines = [f"chainrows pack {a.rows} -> {a.out}",
             f"wrote {a.out}/rank-*/ ({a.world_size} rank{'s' if a.world_size > 1 else ''}), {wrote(a.out, names[-1:])}",
             f"{'rows':<18} {stats.rows:,}",
             f"{'tokens':<18} {stats.tokens:,}",
             f"{'batches':<18} {stats.bins:,} ({stats.bins // a.world_size:,} steps per rank)",
             f"{'fill':<18} {stats.fill:.1%} of {stats.bins:,} x {a.max_tokens:,} tokens"]
    if a.world_size > 1:
        lines.append(f"{'tokens per rank':<18} {min(per_rank):,} to {max(per_rank):,}")
    if stats.dropped_rows:
        lines.append(f"{'dropped (long)':<18} {stats.dropped_rows:,} rows, {stats.dropped_tokens:,} tokens "
                     f"(longer than --max-tokens)")
        share = stats.dropped_tokens / max(1, stats.dropped_tokens + stats.tokens)
        if share >= 0.05:
            lines.append(f"warning: --drop-long-rows dropped {share:.1%} of the tokens; a larger --max-tokens "
                         "keeps them")
    lines.append(f"{'time':<18} {seconds:.2f} s")
    return lines


COMMANDS = {"pack": cmd_pack}
