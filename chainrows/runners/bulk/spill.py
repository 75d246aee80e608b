"""The spill pass, for input that no streaming window fits (e.g. token rows in random order):
hash-partition the three tables by group into buckets on disk (chainrows.runners.bulk.partition), then
reassemble bucket by bucket into sorted runs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from chainrows.api import Result
from chainrows.errors import writing
from chainrows.formats.native.dataset import TABLES
from chainrows.memory.process import release_memory
from chainrows.outdir.atomic import write_json_atomic
from chainrows.progress import Progress
from chainrows.runners.bulk.partition import SPILL_IPC, bucket_dir, partition, parts_intact, read_bucket
from chainrows.runners.bulk.runs import kept_record
from chainrows.runners.bulk.summary import Summary

FINISHED = "partitioned"


def partition_once(dataset_dir, work: Path, buckets: int, batch_rows: int, buffer_bytes: int,
                   total: int, progress, ipc=SPILL_IPC) -> Path:
    """The spill buckets under ``work/spill``, partitioned unless a resumed job already did, every
    bucket it finished kept whole runs (a finished bucket's inputs are deleted, so a damaged run
    means partitioning again), and every bucket left has the parts it was given."""
    spill = work / "spill"
    if (work / FINISHED).exists():
        dirs = [bucket_dir(spill, b) for b in range(buckets)]
        if any(kept_record(d / "done.json") is None for d in dirs if (d / "done.json").exists()):
            Progress.say("resume: a finished bucket's run is damaged; partitioning again", enabled=progress)
            (work / FINISHED).unlink()
        elif not all(parts_intact(d) for d in dirs if not (d / "done.json").exists()):
            Progress.say("resume: a spilled part is damaged; partitioning again", enabled=progress)
            (work / FINISHED).unlink()
    if not (work / FINISHED).exists():
        shutil.rmtree(spill, ignore_errors=True)
        bar = Progress("partition", total, enabled=progress)
        partition(dataset_dir, spill, buckets, batch_rows, bar, buffer_bytes=buffer_bytes, ipc=ipc)
        bar.close()
        with writing(work / FINISHED):
            (work / FINISHED).touch()
    return spill


def reassemble_buckets(spill: Path, buckets: int, reassemble: Callable[..., Result],
                       keep: Callable[[int, Result, Path], dict], progress) -> list[dict]:
    """Reassemble every bucket not finished yet; ``keep(b, result, dir)`` stores its outputs
    and returns its record. Returns every bucket's record (finished ones read back).

    A finished bucket's spilled parts are deleted on a thread of their own while the next
    bucket is read and decided: a tight budget spills thousands of small parts, and deleting
    a file took ~0.6 ms here (docs/decisions-io.md "Spill files"). A run stopped before they
    are gone leaves them to the work dir's removal; a finished bucket's parts are never read."""
    bar = Progress("reassemble", buckets, enabled=progress, unit="buckets")
    records = []
    with ThreadPoolExecutor(1, thread_name_prefix="chainrows-delete") as deleter:
        for b in range(buckets):
            d = bucket_dir(spill, b)
            done = d / "done.json"
            if not done.exists():
                ledger, tokens, rollouts = read_bucket(d)
                result = reassemble(ledger, tokens, rollouts)
                del ledger, tokens, rollouts
                record = keep(b, result, d)
                del result
                write_json_atomic(done, record)
                deleter.submit(_delete_inputs, d)
                release_memory()
            records.append(json.loads(done.read_text()))
            bar.advance(1)
    bar.close()
    return records


def _delete_inputs(bucket: Path) -> None:
    for name in TABLES:
        shutil.rmtree(bucket / name, ignore_errors=True)


def summary_of(records: list[dict]) -> Summary:
    total = Summary()
    for r in records:
        total.merge(Summary.from_counts(r["summary"]))
    return total
