"""The dataset runner: Parquet in, Parquet out, on each of its three paths (in memory,
streaming windows, spill buckets), resumable, under a memory budget."""

import dataclasses
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chainrows import reference
from chainrows.api import run_tables
from chainrows.errors import InputError
from chainrows.memory.process import process_rss
from chainrows.options import Options
from chainrows.runners import bulk
from chainrows.runners.bulk import plan as planner
from chainrows.runners.bulk import windows
from chainrows.runners.bulk.windows import plan_windows, scan
from chainrows.synth import write_synth_dataset
from tests.support.compare import compare_outputs
from tests.support.outputs import OUTPUT_ENTRIES, no_outputs, output_bytes, output_bytes_but_input, read_outputs
from tests.support.peaks import at_smallest_budget, peak_run
from tests.support.profiles import examples

MEMORY = bulk.Route("memory", 1, "test")
SMALLER = planner.DEFAULT_BUDGET - (1 << 30)  # a budget below the default, still a stream's


def stream(steps, resident=(), hold=0):
    """A stream of ``steps`` windows; ``hold``: its runs' bytes held in memory (0: every run
    written to disk, None: what the default budget leaves, which holds all of this data's)."""
    return bulk.Route("stream", steps, "test", resident=resident, hold=hold)


SOME_HELD = 2_000_000  # about a third of this dataset's runs (checked where it matters)


def spill(buckets):
    return bulk.Route("spill", buckets, "test")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("synth") / "data"
    write_synth_dataset(path, 240, seed=7, corrupt_rate=0.25)
    return path


@pytest.fixture(scope="module")
def shuffled(dataset, tmp_path_factory):
    """The same dataset with token rows shuffled over the whole table, the ledger split into
    three files of small row groups (multi-chunk columns)."""
    root = tmp_path_factory.mktemp("shuffled") / "data"
    (root / "ledger").mkdir(parents=True)
    tok = pq.read_table(dataset / "tokens.parquet")
    perm = np.random.default_rng(0).permutation(tok.num_rows)
    pq.write_table(tok.take(pa.array(perm)), root / "tokens.parquet", row_group_size=97)
    led = pq.read_table(dataset / "ledger.parquet")
    third = led.num_rows // 3
    for i, (a, b) in enumerate([(0, third), (third, 2 * third), (2 * third, led.num_rows)]):
        pq.write_table(led.slice(a, b - a), root / "ledger" / f"part-{i}.parquet", row_group_size=40)
    pq.write_table(pq.read_table(dataset / "rollouts.parquet"), root / "rollouts.parquet")
    return root


def _read(out):
    return read_outputs(out)


def _bytes(out):
    got = output_bytes(out)
    assert set(got) == OUTPUT_ENTRIES, got.keys()
    return got


class Counted:
    """A reassemble seam: counts the batches it decides and raises on call ``crash_at``."""

    def __init__(self, crash_at=None):
        self.calls, self.crash_at = 0, crash_at

    def __call__(self, *tables):
        self.calls += 1
        if self.calls == self.crash_at:
            raise RuntimeError(f"simulated crash in batch {self.crash_at}")
        return run_tables(*tables)


def test_round_trip_agrees_with_reference(dataset, tmp_path):
    """synth -> reassemble -> read rows: every rollout as the oracle decides it."""
    summary = bulk.run(dataset, tmp_path / "out", route=MEMORY)
    rows, report = _read(tmp_path / "out")
    ledger, tokens, rollouts = (pq.read_table(dataset / f"{n}.parquet").to_pylist()
                                for n in ("ledger", "tokens", "rollouts"))
    want_rows, want_report = reference.reassemble(ledger, tokens, rollouts)
    compare_outputs("round trip", rows.to_pylist(), report.to_pylist(), want_rows, want_report)
    assert summary.rollouts == len(want_report)
    assert summary.ok == sum(r["status"] == "ok" for r in want_report)
    assert summary.rows == len(want_rows) == rows.num_rows
    assert summary.path == "memory"


ROUTES = [spill(2), spill(5), stream(2), stream(7), stream(40), stream(5, ("tokens",)),
          stream(3, ("ledger", "rollouts")), stream(7, hold=None), stream(7, hold=SOME_HELD),
          stream(5, ("tokens",), hold=None), stream(3, ("ledger", "rollouts"), hold=SOME_HELD)]


def _route_id(route) -> str:
    held = {None: "-held", 0: ""}.get(route.hold, "-some-held") if route.path == "stream" else ""
    return f"{route.path}-{route.batches}" + "".join(f"-{n}" for n in route.resident) + held


def _same_bytes_as_in_memory(src, dataset, tmp_path, route):
    bulk.run(dataset, tmp_path / "one", route=MEMORY)
    summary = bulk.run(src, tmp_path / "many", route=route)
    if src == dataset:
        assert _bytes(tmp_path / "many") == _bytes(tmp_path / "one")
    else:  # other input files: the same data pages, another input fingerprint
        _bytes(tmp_path / "many")
        assert output_bytes_but_input(tmp_path / "many") == output_bytes_but_input(tmp_path / "one")
    assert not (tmp_path / "many" / bulk.WORK_DIR).exists()
    assert summary.path == route.path and summary.rollouts == 240
    held, written = summary.held_runs, summary.written_runs
    assert held + written >= 2
    hold = route.hold if route.path == "stream" else 0  # a spill holds nothing
    assert {None: written == 0, 0: held == 0}.get(hold, held and written), (held, written)


@pytest.mark.slow
@pytest.mark.parametrize("route", ROUTES, ids=_route_id)
@pytest.mark.parametrize("layout", ["capture order", "shuffled"])
def test_every_path_writes_the_same_bytes(dataset, shuffled, tmp_path, route, layout):
    _same_bytes_as_in_memory(dataset if layout == "capture order" else shuffled, dataset, tmp_path, route)


@pytest.mark.slow
@pytest.mark.parametrize("route", [r for r in ROUTES if r.path == "stream"], ids=_route_id)
@pytest.mark.parametrize("layout", ["capture order", "shuffled"])
def test_every_stream_writes_the_same_bytes_with_window_rows_sliced(dataset, shuffled, tmp_path, monkeypatch,
                                                                     route, layout):
    """A window's decided rows are zero-copy slices of what was read whatever their size (the
    small test tables never reach the real threshold)."""
    monkeypatch.setattr(windows, "MIN_BUFFER_BYTES", 1)
    _same_bytes_as_in_memory(dataset if layout == "capture order" else shuffled, dataset, tmp_path, route)


@pytest.mark.slow
@pytest.mark.parametrize("options", [Options(mode="ordinary", placeholders=True),
                                     Options(baseline="loo", no_std=True, baseline_population="ok",
                                             row_weight="row", placeholders=True)])
def test_stream_path_with_other_options(dataset, tmp_path, options):
    bulk.run(dataset, tmp_path / "one", options, route=MEMORY)
    bulk.run(dataset, tmp_path / "many", options, route=stream(6))
    assert _bytes(tmp_path / "many") == _bytes(tmp_path / "one")


@pytest.mark.slow
@pytest.mark.parametrize("route,done_glob", [(spill(4), "spill/*/done.json"),
                                             (stream(4), "windows/step-*.json"),
                                             (stream(4, ("tokens",)), "windows/step-*.json"),
                                             (stream(4, ("ledger", "rollouts")), "windows/step-*.json")],
                         ids=["spill", "stream", "stream-tokens-resident", "stream-ledger-rollouts-resident"])
def test_failed_run_leaves_no_output_and_resume_finishes(dataset, tmp_path, route, done_glob):
    reference_out = tmp_path / "ref"
    bulk.run(dataset, reference_out, route=MEMORY)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="simulated crash"):
        bulk.run(dataset, out, route=route, reassemble=Counted(crash_at=3))
    assert no_outputs(out)
    assert len(list((out / bulk.WORK_DIR).glob(done_glob))) == 2
    again = Counted()
    summary = bulk.run(dataset, out, route=route, resume=True, reassemble=again)
    assert again.calls == 2  # batches 2 and 3 only
    assert summary.rollouts == 240
    assert _bytes(out) == _bytes(reference_out)


@pytest.mark.slow
@pytest.mark.parametrize("hold", [None, SOME_HELD], ids=["all held", "some held"])
def test_resume_decides_again_the_windows_whose_runs_were_held(dataset, tmp_path, hold):
    """A held run dies with the process: --resume reuses the windows written to disk and
    decides the others again, to the same bytes."""
    bulk.run(dataset, tmp_path / "ref", route=MEMORY)
    out = tmp_path / "out"
    crash_at = 6
    with pytest.raises(RuntimeError, match="simulated crash"):
        bulk.run(dataset, out, route=stream(7, hold=hold), reassemble=Counted(crash_at=crash_at))
    assert no_outputs(out)
    written = len(list((out / bulk.WORK_DIR).glob("windows/step-*.json")))
    if hold is None:  # nothing --resume would reuse: no work dir kept
        assert written == 0 and not (out / bulk.WORK_DIR).exists()
    else:  # windows 1-5 finished: the first held, some written
        assert 0 < written < crash_at - 1
    again = Counted()
    summary = bulk.run(dataset, out, route=stream(7, hold=hold), resume=True, reassemble=again)
    assert again.calls == 7 - written
    assert summary.rollouts == 240 and summary.held_runs + summary.written_runs == 7
    assert _bytes(out) == _bytes(tmp_path / "ref")


def test_hold_allowance_is_what_the_share_of_the_room_leaves_beside_the_larger_need():
    room = 4 << 30
    merge = room // bulk.job.MERGE_SHARE + room // bulk.job.ENCODE_SHARE
    share = planner.SHARE * room

    class Plan:  # stream_peak reads these
        def __init__(self, decided):
            self.steps, self.held, self.read, self.copied = 2, np.zeros(2), np.zeros(2), None
            self.decided = np.array([decided, 0.0])

    small = Plan(merge / (2 * planner.MEMORY_FACTOR))  # a peak below the merge's buffers
    assert planner.stream_peak(small) < merge
    assert bulk.job._hold_allowance(room, small, tight=False) == int(share - merge)
    big = Plan(share / planner.MEMORY_FACTOR)
    peak = planner.stream_peak(big)
    assert merge < peak < share
    assert bulk.job._hold_allowance(room, big, tight=False) == int(share - peak)
    assert bulk.job._hold_allowance(room, Plan(share), tight=False) == 0  # a peak past the share
    assert bulk.job._hold_allowance(room, small, tight=True) == 0


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def _zero_middle(path, n=4096):
    """Zero ``n`` bytes from the middle of ``path`` on, starting at a byte that was not zero,
    its size and footer kept (what a page lost from the cache of an unsynced file reads back as)."""
    data = bytearray(path.read_bytes())
    mid = next(i for i in range(len(data) // 2, len(data)) if data[i])
    assert mid + n < len(data) * 3 // 4
    data[mid:mid + n] = bytes(n)
    path.write_bytes(bytes(data))


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["rows run cut short", "report run missing", "marker garbled",
                                    "rows run with a zeroed page"])
@pytest.mark.parametrize("route,done_glob,redone", [(spill(4), "spill/*/done.json", 4),
                                                    (stream(4), "windows/step-*.json", 3)],
                         ids=["spill", "stream"])
def test_resume_redoes_a_finished_batch_whose_run_is_damaged(dataset, tmp_path, route, done_glob,
                                                             redone, damage):
    """Runs are not fsynced: after a machine crash a marker may outlive its run's bytes. A
    stream step is decided again; a spill bucket (its inputs deleted) sends the job back to
    partitioning."""
    bulk.run(dataset, tmp_path / "ref", route=MEMORY)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="simulated crash"):
        bulk.run(dataset, out, route=route, reassemble=Counted(crash_at=3))
    marker = sorted((out / bulk.WORK_DIR).glob(done_glob))[0]
    stem = Path(json.loads(marker.read_text())["stem"])
    if damage == "rows run cut short":
        _truncate(stem.with_name(stem.name + ".rows.arrow"))
    elif damage == "rows run with a zeroed page":
        _zero_middle(stem.with_name(stem.name + ".rows.arrow"), 64)
    elif damage == "report run missing":
        stem.with_name(stem.name + ".report.arrow").unlink()
    else:
        marker.write_text("{not json")
    again = Counted()
    summary = bulk.run(dataset, out, route=route, resume=True, reassemble=again)
    assert again.calls == redone
    assert summary.rollouts == 240
    assert _bytes(out) == _bytes(tmp_path / "ref")


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 10_000, 12_288])
def test_file_digest_is_the_xxh3_of_the_whole_file_read_in_pieces(tmp_path, monkeypatch, size):
    import xxhash

    from chainrows.outdir import digest

    monkeypatch.setattr(digest, "PIECE_BYTES", 4096)
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    (tmp_path / "f").write_bytes(data)
    assert digest.file_digest(tmp_path / "f") == xxhash.xxh3_64(data).hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["a zeroed page", "a part missing", "no manifest", "a manifest line lost"])
def test_resume_partitions_again_when_a_spilled_part_is_damaged(dataset, tmp_path, monkeypatch, damage):
    """A bucket not finished yet is read from its spilled parts: a part that is not the one
    written (uncompressed, a zeroed page would be read as tokens) sends the job back to
    partitioning, like a damaged run."""
    from chainrows.runners.bulk.partition import PARTS_MANIFEST, PLAIN_IPC

    monkeypatch.setattr(planner, "spill_format", lambda *a: PLAIN_IPC)
    bulk.run(dataset, tmp_path / "ref", route=MEMORY)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="simulated crash"):
        bulk.run(dataset, out, route=spill(4), reassemble=Counted(crash_at=3))
    spill_dir = out / bulk.WORK_DIR / "spill"
    left = [d for d in sorted(spill_dir.glob("bucket-*")) if not (d / "done.json").exists()]
    part = max((left[0] / "tokens").glob("part-*.arrow"), key=lambda p: p.stat().st_size)
    if damage == "a zeroed page":
        _zero_middle(part)
    elif damage == "a part missing":
        part.unlink()
    elif damage == "no manifest":
        (left[0] / PARTS_MANIFEST).unlink()
    else:
        lines = (left[0] / PARTS_MANIFEST).read_text().splitlines()
        (left[0] / PARTS_MANIFEST).write_text("\n".join(lines[:-1]) + "\n")
    again = Counted()
    summary = bulk.run(dataset, out, route=spill(4), resume=True, reassemble=again)
    assert again.calls == 4  # partitioned again: every bucket reassembled
    assert summary.rollouts == 240
    assert _bytes(out) == _bytes(tmp_path / "ref")


def test_resume_reads_intact_spilled_parts_without_partitioning_again(dataset, tmp_path, monkeypatch):
    from chainrows.runners.bulk import spill as spill_module

    bulk.run(dataset, tmp_path / "ref", route=MEMORY)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="simulated crash"):
        bulk.run(dataset, out, route=spill(4), reassemble=Counted(crash_at=3))

    def no_partition(*args, **kwargs):
        raise AssertionError("partitioned again")

    monkeypatch.setattr(spill_module, "partition", no_partition)
    again = Counted()
    bulk.run(dataset, out, route=spill(4), resume=True, reassemble=again)
    assert again.calls == 2
    assert _bytes(out) == _bytes(tmp_path / "ref")


def test_a_finished_buckets_spilled_parts_are_gone_by_the_time_the_run_stops(dataset, tmp_path):
    """They are deleted on a thread of their own while the next bucket is decided; a run that
    stops waits for those deletions (the unfinished buckets keep theirs for --resume)."""
    from chainrows.formats.native.dataset import TABLES

    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="simulated crash"):
        bulk.run(dataset, out, route=spill(4), reassemble=Counted(crash_at=3))
    buckets = sorted((out / bulk.WORK_DIR / "spill").glob("bucket-*"))
    done = [d for d in buckets if (d / "done.json").exists()]
    assert len(done) == 2 and len(buckets) == 4
    assert not any((d / name).exists() for d in done for name in TABLES)
    assert all(any((d / "tokens").glob("part-*.arrow")) for d in buckets if d not in done)


def test_partitioning_writes_in_order_and_a_failed_write_is_never_lost():
    """Partitioning writes each flush on a thread of its own while the next fills
    (``partition._Flushes``): in order, one at a time; a failed write is raised by the next
    look at it, and by a pass the reader stopped later (an interrupt keeps its own exit)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from chainrows.errors import InputError, WriteError
    from chainrows.runners.bulk.partition import _Flushes

    written, failing, go = [], set(), threading.Event()

    def write_part(b, name, part, schema, tables):
        go.wait(10)
        if part in failing:
            raise WriteError(28, "No space left on device", f"bucket-{b:05d}/{name}/part-{part}")
        written.append((part, b, sum(t.num_rows for t in tables)))

    table = pa.table({"x": [1, 2, 3]})

    def filled(flushes, bucket):
        flushes.buffers[bucket].append(table)
        return flushes

    with ThreadPoolExecutor(1) as writer:
        flushes = _Flushes("tokens", table.schema, 2, write_part, writer)
        filled(flushes, 1).flush()  # part 1, held until go
        assert written == [] and not flushes.in_flight.done()
        go.set()
        filled(flushes, 0).flush()  # part 2 waits for part 1
        assert written == [(1, 1, 3)]
        flushes.wait()
        assert written == [(1, 1, 3), (2, 0, 3)]

        failing.add(3)
        filled(flushes, 0).flush()
        flushes.in_flight.exception()  # part 3 has failed by now
        with pytest.raises(WriteError, match="part-3"):
            flushes.poll()  # raised at the next look, not at the next flush only

        failing.add(4)
        filled(flushes, 1).flush()
        flushes.in_flight.exception()
        with pytest.raises(WriteError, match="part-4"):
            flushes.stopped(InputError("a later batch of the reader"))  # the failure came first

        failing.add(5)
        filled(flushes, 1).flush()
        flushes.in_flight.exception()
        assert flushes.stopped(KeyboardInterrupt()) is None and flushes.in_flight is None
    assert written == [(1, 1, 3), (2, 0, 3)]


@pytest.mark.slow
@pytest.mark.parametrize("route", [spill(3), stream(3)], ids=["spill", "stream"])
def test_runs_compressed_or_not_give_the_same_bytes(dataset, tmp_path, monkeypatch, route):
    from chainrows.runners.bulk.partition import PLAIN_IPC, SPILL_IPC

    bulk.run(dataset, tmp_path / "ref", route=MEMORY)
    kept = {}
    for name, ipc in (("lz4", SPILL_IPC), ("plain", PLAIN_IPC)):
        monkeypatch.setattr(planner, "spill_format", lambda *a, ipc=ipc: ipc)
        out = tmp_path / name
        bulk.run(dataset, out, route=route)
        assert _bytes(out) == _bytes(tmp_path / "ref")
        with pytest.raises(RuntimeError, match="simulated crash"):  # keep the runs to weigh them
            bulk.run(dataset, tmp_path / f"{name}-kept", route=route, reassemble=Counted(crash_at=3))
        kept[name] = sum(f.stat().st_size for f in (tmp_path / f"{name}-kept").rglob("*.arrow"))
    assert kept["plain"] > kept["lz4"] > 0  # each run written as chosen


@pytest.mark.parametrize("compressed", [False, True])
def test_mapped_runs_and_buckets_outlive_their_files(tmp_path, compressed):
    """Runs and spill parts are read through memory maps: what was read stays whole after the
    file is deleted (as spill buckets are, while their results still hold input strings) and
    after the file is overwritten by a later run of the same name."""
    from chainrows.runners.bulk.partition import PLAIN_IPC, SPILL_IPC, read_bucket
    from chainrows.runners.bulk.runs import run_batches, write_run

    ipc = SPILL_IPC if compressed else PLAIN_IPC
    table = pa.table({"rollout_id": [f"r{i:05d}" for i in range(5000)],
                      "input_ids": pa.array([list(range(i % 9)) for i in range(5000)], pa.list_(pa.int32()))})
    run = tmp_path / "a.rows.arrow"
    write_run(table, run, 700, ipc)
    before = pa.total_allocated_bytes()
    batches = list(run_batches(run))
    if not compressed:  # mapped: the batches are the file's pages, nothing in Arrow's pool
        assert pa.total_allocated_bytes() - before < table.nbytes // 4
    assert [b.num_rows for b in batches] == [700] * 7 + [100]
    write_run(table.slice(0, 10), run, 700, ipc)  # replaced: a new inode, the maps keep the old
    run.unlink()
    assert pa.Table.from_batches(batches).equals(table)

    bucket = _bucket_of(tmp_path / "bucket", [table.slice(0, 2000), table.slice(2000)], ipc)
    before = pa.total_allocated_bytes()
    read = read_bucket(bucket)
    if not compressed:
        assert pa.total_allocated_bytes() - before < table.nbytes // 4
    shutil.rmtree(bucket)
    assert all(t.equals(table) for t in read)


def test_runs_and_buckets_are_read_where_files_cannot_be_mapped(tmp_path, monkeypatch):
    from chainrows.runners.bulk.partition import PLAIN_IPC, read_bucket
    from chainrows.runners.bulk.runs import run_batches, write_run

    def no_mmap(path, *args, **kwargs):
        raise OSError(f"[Errno 19] No such device: {path}")
    monkeypatch.setattr(pa, "memory_map", no_mmap)
    table = pa.table({"rollout_id": [f"r{i:04d}" for i in range(900)], "n": pa.array(range(900), pa.int64())})
    write_run(table, tmp_path / "a.rows.arrow", 400, PLAIN_IPC)
    assert pa.Table.from_batches(list(run_batches(tmp_path / "a.rows.arrow"))).equals(table)
    assert all(t.equals(table) for t in read_bucket(_bucket_of(tmp_path / "b", [table], PLAIN_IPC)))


def _bucket_of(bucket: Path, parts: list[pa.Table], ipc) -> Path:
    """A spill bucket whose three tables are each ``parts``, one part file apiece."""
    from chainrows.runners.bulk.partition import _write_part

    for name in ("ledger", "tokens", "rollouts"):
        (bucket / name).mkdir(parents=True)
        for i, part in enumerate(parts):
            _write_part(bucket / name / f"part-{i:06d}.arrow", part.schema, [part], ipc)
    return bucket


def test_runs_are_compressed_only_when_the_disk_is_short(tmp_path, monkeypatch):
    from collections import namedtuple

    from chainrows.runners.bulk.partition import PLAIN_IPC, SPILL_IPC

    usage = namedtuple("usage", "total used free")
    for free, want in ((planner.RUN_DISK_FACTOR * 1000, PLAIN_IPC), (planner.RUN_DISK_FACTOR * 1000 - 1, SPILL_IPC)):
        monkeypatch.setattr(planner.shutil, "disk_usage", lambda path, free=free: usage(0, 0, free))
        assert planner.spill_format(tmp_path, 1000) is want

    def unreadable(path):
        raise OSError("no such device")
    monkeypatch.setattr(planner.shutil, "disk_usage", unreadable)
    assert planner.spill_format(tmp_path, 1000) is SPILL_IPC


def test_a_refused_run_leaves_the_running_runs_work_alone(dataset, tmp_path, monkeypatch, capsys):
    """The lock is taken after the planner's measurements: the first run may make its work dir
    while a second one starts, and the second, refused, must not delete it."""
    from chainrows.cli import main
    from chainrows.outdir.atomic import AtomicOutput

    out = tmp_path / "out"
    work = out / bulk.WORK_DIR
    measure = planner.measure_footprint

    def first_run_makes_its_work_meanwhile(*a):
        footprint = measure(*a)
        work.mkdir()
        (work / "manifest.json").write_text("{}")
        return footprint

    monkeypatch.setattr(planner, "measure_footprint", first_run_makes_its_work_meanwhile)
    with pytest.raises(KeyboardInterrupt):
        with AtomicOutput(out):  # the first run holds OUT
            assert main(["reassemble", str(dataset), str(out), "--buckets", "2", "--no-progress"]) == 2
            assert "another chainrows run is writing" in capsys.readouterr().err
            assert (work / "manifest.json").read_text() == "{}"
            raise KeyboardInterrupt


def test_unusable_input_found_mid_run_removes_the_work_it_started(dataset, tmp_path):
    out = tmp_path / "out"

    def unusable(*tables):
        raise InputError("tokens: simulated unusable row")

    with pytest.raises(InputError):
        bulk.run(dataset, out, route=spill(2), reassemble=unusable)
    assert not (out / bulk.WORK_DIR).exists()
    with pytest.raises(RuntimeError):  # work kept by an interrupted run ...
        bulk.run(dataset, out, route=spill(2), reassemble=Counted(crash_at=2))
    with pytest.raises(InputError):  # ... is not this run's to delete
        bulk.run(dataset, out, route=spill(2), resume=True, reassemble=unusable)
    assert (out / bulk.WORK_DIR / "manifest.json").exists()


def test_resume_ignores_work_of_other_options(dataset, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        bulk.run(dataset, out, route=spill(3), reassemble=Counted(crash_at=2))
    again = Counted()
    bulk.run(dataset, out, Options(mode="ordinary"), route=spill(3), resume=True, reassemble=again)
    assert again.calls == 3  # different options: nothing reused


@pytest.mark.parametrize("first,other", [(spill(4), spill(5)), (stream(4, ("tokens",)), stream(4))],
                         ids=["spill", "stream-tokens-resident"])
def test_resume_keeps_the_planned_route(dataset, tmp_path, monkeypatch, first, other):
    """The planned route depends on the measured baseline; a resumed job keeps its own (batch
    count and resident tables, read back from the manifest), so the finished batches count."""
    out = tmp_path / "out"
    monkeypatch.setattr(bulk.job, "choose_route", lambda *a: first)
    with pytest.raises(RuntimeError):
        bulk.run(dataset, out, reassemble=Counted(crash_at=3))
    monkeypatch.setattr(bulk.job, "choose_route", lambda *a: other)  # another baseline
    again = Counted()
    summary = bulk.run(dataset, out, resume=True, reassemble=again)
    assert summary.batches == 4 and again.calls == 2
    bulk.run(dataset, tmp_path / "ref", route=MEMORY)
    assert _bytes(out) == _bytes(tmp_path / "ref")


# ----------------------------------------------------------------------------- the planner

def test_spill_buckets_follow_the_room():
    size, room = 2_250_000_000, 300 << 20
    k = planner.spill_buckets(size, room)
    assert planner.SPILL_PEAK_FACTOR * size / k <= planner.BUCKET_SHARE * room
    assert planner.spill_buckets(size, room // 2) > k  # a bigger process leaves less room
    assert planner.spill_buckets(1, room) == 2


def test_budget_below_the_process_is_refused_naming_the_smallest():
    fp = planner.Footprint(baseline=250 << 20, compile_seconds=0.0)
    with pytest.raises(InputError, match=r"smallest budget that works here is 394 MiB"):
        planner.check_budget(300 << 20, fp)
    planner.check_budget(fp.smallest_budget, fp)  # exactly enough is accepted


def test_baseline_is_the_process_rss_after_loading_kernels():
    fp = planner.measure_footprint(Options(), True)
    rss = process_rss()
    if rss is None:  # no /proc: the constant
        assert fp.baseline == planner.BASE_RSS
    else:
        assert 0 < fp.baseline and abs(rss - fp.baseline) < 64 << 20


def _window_table():
    lists = pa.array([[i] * (i % 5) for i in range(50)], pa.list_(pa.int32()))
    table = pa.table({"id": pa.array(range(50), pa.int64()), "tokens": lists})
    return pa.concat_tables([table.slice(0, 20), table.slice(20)])  # two chunks, as read


# runs 0-12, 14-32 (two chunks: across the chunk boundary), 34-49: 48 of 50 rows
DECIDED = np.array([*range(0, 13), *range(14, 33), *range(34, 50)], dtype=np.int64)
SHORT_RUNS = DECIDED[DECIDED % 6 != 1]  # 40 of 50 rows, in shorter runs
FEW = DECIDED[(DECIDED < 30) | (DECIDED > 45)]  # 33 of 50 rows: too few to slice


@pytest.mark.parametrize("threshold,idx,sliced", [
    ("one byte", DECIDED, True),
    ("decided-1", DECIDED, True),       # runs one byte over the threshold on average
    ("decided+1", DECIDED, False),      # one byte short on average, though the total is far more
    ("decided-1", SHORT_RUNS, False),   # shorter runs on average: copied
    ("one byte", FEW, False),           # long enough runs, but too few of the rows
], ids=["sliced", "above-threshold", "below-threshold", "short-runs", "too-few-rows"])
def test_window_take_slices_long_runs_of_nearly_all_rows_and_copies_the_rest(monkeypatch, threshold, idx, sliced):
    table = _window_table()
    row_bytes = table.nbytes / table.num_rows

    def runs(rows):
        return int((np.diff(rows) != 1).sum()) + 1

    average = len(DECIDED) * row_bytes / runs(DECIDED)
    monkeypatch.setattr(windows, "MIN_BUFFER_BYTES",
                        {"one byte": 1, "decided-1": average - 1, "decided+1": average + 1}[threshold])
    got = windows.take(table, idx, slices=True)
    assert got.equals(table.take(pa.array(idx)))
    read = {c.values.buffers()[-1].address for c in table["tokens"].chunks}  # the values as read
    mine = {c.values.buffers()[-1].address for c in got["tokens"].chunks}
    if sliced:
        assert got["tokens"].num_chunks == runs(idx) + 1 and mine <= read  # + 1: the chunk boundary
    else:
        assert got["tokens"].num_chunks == 1 and not mine & read
    assert windows.take(table, idx).equals(got)  # without ``slices``: the same rows, copied


def test_streaming_windows_slice_what_they_can_and_write_the_same_bytes(dataset, tmp_path, monkeypatch):
    """The slicing branch runs on a real stream (threshold lowered: the test tables are small)."""
    calls = []
    real = windows._runs_as_slices
    monkeypatch.setattr(windows, "MIN_BUFFER_BYTES", 1)
    monkeypatch.setattr(windows, "_runs_as_slices", lambda *a: calls.append(1) or real(*a))
    bulk.run(dataset, tmp_path / "one", route=MEMORY)
    bulk.run(dataset, tmp_path / "many", route=stream(3))
    assert calls
    assert _bytes(tmp_path / "many") == _bytes(tmp_path / "one")


def test_window_plan_decides_each_group_once_all_its_rows_are_read(dataset, shuffled):
    """Every row is decided at a step no earlier than the one that reads it; all rows of a
    group at the same step; capture order decides groups early, shuffled tokens late."""
    for src in (dataset, shuffled):
        sc = scan(src, True)
        plan = plan_windows(sc, 8)
        group_done = {}
        for name, t in sc.tables.items():
            cuts, done = plan.cuts[name], plan.done[name]
            assert cuts[0] == 0 and cuts[-1] == len(t.group) and np.all(np.diff(cuts) >= 0)
            read_at = np.searchsorted(cuts, np.arange(len(t.group)), side="right") - 1
            assert np.all(done >= read_at)
            for g, d in zip(t.group.tolist(), done.tolist()):
                assert group_done.setdefault(g, d) == d
        assert plan.held.min() >= 0
        assert abs(plan.decided.sum() - sc.total_bytes) < 1e-6 * sc.total_bytes
    in_order = plan_windows(scan(dataset, True), 8)
    mixed = plan_windows(scan(shuffled, True), 8)
    assert planner.stream_peak(in_order) < planner.stream_peak(mixed)
    assert mixed.decided[-1] > 0.9 * mixed.decided.sum()  # shuffled: nearly all at the end


def test_a_resident_table_is_read_first_and_held_to_the_end(shuffled):
    """Tokens resident: all token rows are read at step 0 and counted as held at every step, so
    shuffled token rows no longer hold groups back; the other tables' plan is the same."""
    sc = scan(shuffled, True)
    streamed, resident = plan_windows(sc, 8), plan_windows(sc, 8, ("tokens",))
    tokens = sc.tables["tokens"].nbytes.sum()
    assert resident.resident == ("tokens",)
    assert list(resident.cuts["tokens"]) == [0] + [len(sc.tables["tokens"].group)] * 8
    assert np.all(resident.held >= tokens - 1e-6 * tokens)
    assert resident.read[0] >= tokens and np.all(resident.read[1:] < tokens)
    for name in ("ledger", "rollouts"):
        assert np.array_equal(resident.cuts[name], streamed.cuts[name])
    assert resident.decided[-1] < 0.5 * resident.decided.sum()  # groups decided along the way
    assert abs(resident.decided.sum() - sc.total_bytes) < 1e-6 * sc.total_bytes
    # a window's rows copied out of the resident table come on top of the table held
    assert abs(resident.copied.sum() - tokens) < 1e-6 * tokens and not streamed.copied.any()
    uncopied = dataclasses.replace(resident, copied=None)
    assert planner.stream_peak(resident) > planner.stream_peak(uncopied)


def test_route_choice_follows_the_input_order(dataset, shuffled, monkeypatch):
    total = sum(t.decoded for t in planner.input_totals(dataset).values())  # what routes are chosen by
    assert bulk.choose_route(dataset, total, 1 << 40, True).path == "memory"
    room = int(total * planner.MEMORY_FACTOR / planner.SHARE / 3)  # about a third fits
    monkeypatch.setattr(planner, "STREAM_MIN_ROOM", 0)  # the data is small; the rule is the point
    capture = bulk.choose_route(dataset, total, room, True)
    assert capture.path == "stream" and capture.resident == ()
    tokens = scan(shuffled, True).tables["tokens"].nbytes.sum()  # the plan's estimate
    roomy = int(1.5 * tokens / planner.SHARE)  # still far from fitting in memory
    assert not planner.fits_in_memory(total, roomy)
    mixed = bulk.choose_route(shuffled, total, roomy, True)
    assert mixed.path == "stream" and mixed.resident == ("tokens",) and "tokens" in mixed.why
    assert mixed.plan.resident == ("tokens",) and mixed.plan.kept is None  # 3 ledger files: too few to keep
    small = int(tokens / planner.SHARE) - 1  # the tokens table alone no longer fits
    assert bulk.choose_route(dataset, total, small, True).path == "stream"
    assert bulk.choose_route(shuffled, total, small, True).path == "spill"
    monkeypatch.setattr(planner, "STREAM_MIN_ROOM", room + 1)  # a tight budget always spills
    assert bulk.choose_route(dataset, total, room, True).path == "spill"


# ----------------------------------------------------------------------------- larger than memory

def _peak(*args):
    """``chainrows reassemble ARGS`` in a fresh interpreter (tests/support/peaks.py): its summary and peak."""
    rc, peak, res = peak_run("reassemble", *args)
    assert rc == 0, res.stdout + res.stderr
    return "\n".join(res.stdout.strip().splitlines()[:-1]), peak


def _field(summary: str, name: str) -> str:
    return next(line[len(name):].strip() for line in summary.splitlines() if line.startswith(name))


def _runs_under(data, tmp_path, budgets_mib) -> list[str]:
    """The summary of each budget's run (a fresh process each), every run under its budget."""
    summaries = []
    for mib in budgets_mib:
        summary, peak = _peak(data, tmp_path / f"out{mib}", "--memory-budget", f"{mib}MiB")
        summaries.append(summary)
        assert peak < mib << 20, f"peak RSS {peak >> 20} MiB over the {mib} MiB budget\n{summary}"
    return summaries


def _paths_under(data, tmp_path, budgets_mib) -> list[str]:
    """The path each budget's run took, every run under its budget."""
    return [_field(s, "path") for s in _runs_under(data, tmp_path, budgets_mib)]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmHWM from /proc")
def test_larger_than_memory_stays_under_budget(tmp_path):
    """A dataset 4x the memory budget runs in batches with peak RSS under the budget.

    ``chainrows reassemble DATA OUT --memory-budget 512MiB`` on 2.2 GB (uncompressed) of
    synthetic data: a tight budget takes the spill path; about 3 minutes and up to 6 GB of
    temporary disk.
    (Byte-identity with an in-memory run is tested on small data above.)
    """
    data = tmp_path / "big"
    write_synth_dataset(data, 31_000, seed=3, mean_gen_tokens=900, prompt_tokens=3000, workers=2)
    budget = 512 << 20
    size = sum(t.stored for t in planner.input_totals(data).values())
    assert size >= 4 * budget, f"dataset {size} too small for the test"
    # warm Numba's on-disk cache first: a cold compile is a one-time cost, not data memory
    small = tmp_path / "small"
    write_synth_dataset(small, 16, seed=1)
    _peak(small, tmp_path / "warm", "--memory-budget", "512MiB", "--buckets", "2")
    summary, peak = _peak(data, tmp_path / "out", "--memory-budget", "512MiB")
    path = _field(summary, "path")
    rollouts = int(_field(summary, "rollouts").replace(",", ""))
    assert not path.startswith("memory"), summary
    assert rollouts == _distinct_rollout_ids(data)  # every rollout reported once
    assert peak < budget, f"peak RSS {peak >> 20} MiB over the {budget >> 20} MiB budget\n{summary}"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmHWM from /proc")
def test_small_data_stays_under_a_budget_near_the_in_memory_threshold(tmp_path):
    """Budgets around the one where the planner starts to read everything at once: every run
    stays under its budget, and the largest takes the in-memory path. (The in-memory estimate
    once left out the path's fixed working memory and the whole-file read's decoding buffers:
    this 62 MB dataset peaked at 635 MiB under a 540 MiB budget.)"""
    data = tmp_path / "data"
    write_synth_dataset(data, 3000, seed=1)
    _peak(data, tmp_path / "warm", "--memory-budget", "2GiB")  # Numba's cache warmed
    # the threshold from the planner's rule and the baseline such a process measures (its refusal says)
    _, _, refused = peak_run("reassemble", data, tmp_path / "no", "--memory-budget", "1MiB")
    baseline = int(re.search(r"([\d,]+) MiB measured", refused.stderr).group(1).replace(",", ""))
    decoded = sum(t.decoded for t in planner.input_totals(data).values())
    threshold = baseline + math.ceil((planner.MEMORY_FIXED + planner.MEMORY_FACTOR * decoded) / planner.SHARE / 2**20)
    paths = _paths_under(data, tmp_path, (threshold - 60, threshold - 20, threshold + 20, threshold + 80))
    assert paths[-1].startswith("memory") and not paths[0].startswith("memory"), paths


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmHWM from /proc")
def test_data_stored_far_below_its_decoded_size_stays_under_budget(tmp_path):
    """Token ids of a 16-token vocabulary: Parquet stores the dataset in about a seventh of what
    a read decodes (37 MB for 267 MB). Sized by the stored bytes, a 600 MiB budget took the in-memory
    path and peaked at 970 MB; sized by the decoded estimate, every budget holds, and one with
    room for the decoded bytes reads everything at once; one between streams, holding its
    windows' runs in memory (823 MiB at 1500 MiB measured)."""
    data = tmp_path / "data"
    write_synth_dataset(data, 4000, seed=1, vocab=16, logprobs=False, mean_gen_tokens=450,
                        mean_obs_tokens=1200, prompt_tokens=3000, mean_calls=7)
    sizes = planner.input_totals(data)
    assert sizes["tokens"].decoded > 6 * sizes["tokens"].stored
    _peak(data, tmp_path / "warm", "--memory-budget", "2GiB")  # Numba's cache warmed
    summaries = _runs_under(data, tmp_path, (600, 800, 1500, 2048))
    paths = [_field(x, "path") for x in summaries]
    assert paths[-1].startswith("memory") and not paths[0].startswith("memory"), paths
    assert paths[2].startswith("stream"), paths
    assert not _field(summaries[2], "  windows' runs").startswith("0 held"), summaries[2]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmHWM from /proc")
def test_the_smallest_budget_the_process_accepts_holds(tmp_path):
    """A run at the smallest budget the process names (plus the few MiB another process's
    baseline may differ by) stays under it. With 96 MiB of room above the baseline the floor
    was below what a spill run's merge needs: 297 MiB accepted, 306 MiB peak."""
    data = tmp_path / "data"
    write_synth_dataset(data, 3000, seed=1)
    budget, peak, res = at_smallest_budget("reassemble", data, tmp_path)
    assert _field(res.stdout, "path").startswith("spill"), res.stdout
    assert peak < budget << 20, f"peak RSS {peak >> 20} MiB over the {budget} MiB budget\n{res.stdout}"


READ_PEAK_SCRIPT = r"""
import sys
from chainrows.formats.native.dataset import read_dataset
from chainrows.memory.process import process_rss
base = process_rss()
open("/proc/self/clear_refs", "w").write("5")  # VmHWM from here
ds = read_dataset(sys.argv[1])
hwm = int([l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0].split()[1]) * 1024
print(hwm - base, sum(t.nbytes for t in (ds.ledger, ds.tokens, ds.rollouts)))
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmHWM from /proc")
def test_reading_a_dataset_holds_little_beyond_its_tables(tmp_path):
    """read_dataset (the in-memory path's read) on one file of dictionary-encoded token lists
    and several row groups: the peak above the process's start stays under 3x the tables it
    returns (2.2x measured; pyarrow's whole-file read, 4.3x)."""
    data = tmp_path / "data"
    write_synth_dataset(data, 8000, seed=1)
    res = subprocess.run([sys.executable, "-c", READ_PEAK_SCRIPT, str(data)], capture_output=True,
                         text=True, check=True)
    extra, tables = map(int, res.stdout.split())
    assert extra < 3 * tables, f"read peak {extra >> 20} MiB for {tables >> 20} MiB of tables"


def _distinct_rollout_ids(data):
    ids = set()
    for name in ("ledger", "tokens", "rollouts"):
        ids |= set(pq.read_table(data / f"{name}.parquet", columns=["rollout_id"])["rollout_id"].unique().to_pylist())
    return len(ids)


@pytest.mark.slow
@pytest.mark.parametrize("route", [MEMORY, stream(3), spill(2)], ids=lambda r: r.path)
def test_progress_and_summary_say_which_path_and_why(dataset, tmp_path, capsys, route):
    summary = bulk.run(dataset, tmp_path / "out", route=route, progress=True)
    err = capsys.readouterr().err
    said = {"memory": "memory (test)", "stream": f"stream, {route.batches} windows (test)",
            "spill": f"spill, {route.batches} buckets (test)"}[route.path]
    assert f"path: {said}" in err
    assert f"path                        {said}" in summary.format()
    bars = {"memory": "reassemble", "stream": "stream", "spill": "partition"}
    assert bars[route.path] in err and "100.0%" in err


@pytest.mark.slow
def test_a_repeated_rollouts_row_follows_the_first_rows_group(dataset, tmp_path):
    """Only a rollout's first rollouts row counts (SPEC §3 step 4): a repeat naming another
    group (or none) must not carry the rollout into that group's window."""
    ro = pq.read_table(dataset / "rollouts.parquet")
    first = ro.slice(0, 1)
    other_group = ro.column("group_id")[ro.num_rows - 1].as_py()
    repeats = [first.set_column(first.schema.get_field_index("group_id"), "group_id",
                                pa.array([g], pa.string())) for g in (other_group, None)]
    src = tmp_path / "data"
    src.mkdir()
    for name in ("ledger", "tokens"):
        (src / f"{name}.parquet").write_bytes((dataset / f"{name}.parquet").read_bytes())
    pq.write_table(pa.concat_tables([ro, *repeats]), src / "rollouts.parquet")
    bulk.run(src, tmp_path / "one", route=MEMORY)
    for route in (stream(3), stream(7), spill(2)):
        out = tmp_path / f"{route.path}{route.batches}"
        bulk.run(src, out, route=route)
        assert _bytes(out) == _bytes(tmp_path / "one"), route


def test_rollout_ids_whose_routing_hashes_collide_are_refused(dataset, tmp_path, monkeypatch):
    """Two ids with one routing hash would split a group: the planner refuses them (exit 2)
    rather than write wrong rows. Simulated with a 2-bit first hash."""
    from chainrows.runners.bulk import partition, windows

    real = partition.string_hashes

    def narrow(col, second=False):
        h = real(col, second)
        return h if second else h & np.uint64(3)

    monkeypatch.setattr(windows, "string_hashes", narrow)
    with pytest.raises(InputError, match="share the 64-bit routing hash"):
        bulk.run(dataset, tmp_path / "out", route=stream(3))
    monkeypatch.setattr(partition, "string_hashes", narrow)
    with pytest.raises(InputError, match="share the 64-bit routing hash"):
        bulk.run(dataset, tmp_path / "out", route=spill(3))
    assert no_outputs(tmp_path / "out")


def test_collision_check_is_exact():
    first = np.array([5, 5, 7, 9, 9], dtype=np.uint64)
    partition_check = __import__("chainrows.runners.bulk.partition", fromlist=["x"]).check_no_collisions
    partition_check(first, np.array([1, 1, 2, 3, 3], dtype=np.uint64))  # same ids repeated: fine
    with pytest.raises(InputError):
        partition_check(first, np.array([1, 1, 2, 3, 4], dtype=np.uint64))


@pytest.mark.parametrize("seed", range(20))
def test_collision_check_is_its_plain_definition_on_unsorted_runs(seed):
    from chainrows.runners.bulk.partition import check_no_collisions

    rng = np.random.default_rng(seed)
    first = rng.integers(0, 6, 40).astype(np.uint64)
    second = (first * 7).astype(np.uint64)
    if seed % 2:  # one clash, anywhere in a run of equal first hashes
        second[rng.integers(0, 40)] += np.uint64(1)
    clashes = any(first[i] == first[j] and second[i] != second[j] for i in range(40) for j in range(40))
    if clashes:
        with pytest.raises(InputError):
            check_no_collisions(first, second)
    else:
        check_no_collisions(first, second)


@pytest.mark.parametrize("change", ["more", "fewer"])
def test_stream_refuses_a_table_that_changed_after_its_first_pass(dataset, tmp_path, change):
    from chainrows.formats.native.dataset import table_schema
    from chainrows.runners.bulk.stream import stream_windows

    plan = plan_windows(scan(dataset, True), 3)
    src = tmp_path / "data"
    src.mkdir()
    for name in ("ledger", "rollouts"):
        (src / f"{name}.parquet").write_bytes((dataset / f"{name}.parquet").read_bytes())
    tok = pq.read_table(dataset / "tokens.parquet")
    tok = pa.concat_tables([tok, tok.slice(0, 1)]) if change == "more" else tok.slice(1)
    pq.write_table(tok, src / "tokens.parquet")
    schemas = {n: table_schema(src, n) for n in ("ledger", "tokens", "rollouts")}
    with pytest.raises(InputError, match="changed while it was read"):
        stream_windows(src, plan, schemas, lambda k, window: None)


def test_resume_under_a_budget_too_small_for_the_interrupted_plan_starts_afresh(dataset, tmp_path, monkeypatch):
    """A stream's work resumed under a budget below a stream's room is not resumed (the peak
    its plan was sized for would not hold): the run plans afresh, says why, and writes the same
    bytes."""
    out = tmp_path / "out"
    monkeypatch.setattr(bulk.job, "choose_route", lambda *a: stream(4))
    with pytest.raises(RuntimeError):
        bulk.run(dataset, out, reassemble=Counted(crash_at=3))
    assert len(list((out / bulk.WORK_DIR).glob("windows/step-*.json"))) == 2
    monkeypatch.undo()
    tight = planner.measure_footprint(Options(), True).baseline + (512 << 20)
    again = Counted()
    summary = bulk.run(dataset, out, memory_budget=tight, resume=True, reassemble=again)
    assert summary.path == "memory" and again.calls == 1
    assert "was not resumed" in summary.why
    assert not (out / bulk.WORK_DIR).exists()
    bulk.run(dataset, tmp_path / "ref", route=MEMORY)
    assert _bytes(out) == _bytes(tmp_path / "ref")


def test_resume_keeps_spill_buckets_only_when_they_are_as_many_as_the_budget_needs(dataset, tmp_path,
                                                                                   monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr(bulk.job, "choose_route", lambda *a: spill(2))
    with pytest.raises(RuntimeError):
        bulk.run(dataset, out, reassemble=Counted(crash_at=2))
    monkeypatch.setattr(bulk.job, "choose_route", lambda *a: spill(3))
    monkeypatch.setattr(planner, "spill_buckets", lambda total, room: 3)  # what the smaller room needs
    again = Counted()
    summary = bulk.run(dataset, out, memory_budget=SMALLER, resume=True, reassemble=again)
    assert summary.batches == 3 and again.calls == 3  # partitioned afresh into 3
    assert "was not resumed" in summary.why
    bulk.run(dataset, tmp_path / "ref", route=MEMORY)
    assert _bytes(out) == _bytes(tmp_path / "ref")


def test_resume_under_a_budget_that_still_holds_the_plan_resumes(dataset, tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr(bulk.job, "choose_route", lambda *a: spill(3))
    with pytest.raises(RuntimeError):
        bulk.run(dataset, out, reassemble=Counted(crash_at=3))
    monkeypatch.setattr(planner, "spill_buckets", lambda total, room: 3)  # exactly as many
    again = Counted()
    summary = bulk.run(dataset, out, memory_budget=SMALLER, resume=True, reassemble=again)
    assert summary.batches == 3 and again.calls == 1 and summary.why.startswith("resumed")


@pytest.mark.parametrize("budget", [planner.DEFAULT_BUDGET, planner.DEFAULT_BUDGET * 2], ids=["same", "larger"])
def test_resume_under_the_same_or_a_larger_budget_keeps_the_plan(dataset, tmp_path, monkeypatch, budget):
    """The measured baseline moves a little between runs: under the budget the plan was made
    for (or more), the plan is kept even where this run's room would plan one more bucket."""
    out = tmp_path / "out"
    monkeypatch.setattr(bulk.job, "choose_route", lambda *a: spill(3))
    with pytest.raises(RuntimeError):
        bulk.run(dataset, out, reassemble=Counted(crash_at=3))
    monkeypatch.setattr(planner, "spill_buckets", lambda total, room: 4)
    again = Counted()
    summary = bulk.run(dataset, out, memory_budget=budget, resume=True, reassemble=again)
    assert summary.batches == 3 and again.calls == 1 and summary.why.startswith("resumed")


def test_resume_of_a_stream_whose_plan_no_longer_fits_starts_afresh(dataset, tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr(bulk.job, "choose_route", lambda *a: stream(4))
    with pytest.raises(RuntimeError):
        bulk.run(dataset, out, reassemble=Counted(crash_at=3))
    monkeypatch.setattr(bulk.job, "choose_route", lambda *a: spill(2))
    monkeypatch.setattr(planner, "stream_peak", lambda plan: float("inf"))  # what the smaller room sees
    again = Counted()
    summary = bulk.run(dataset, out, memory_budget=SMALLER, resume=True, reassemble=again)
    assert summary.path == "spill" and again.calls == 2 and "was not resumed" in summary.why
    bulk.run(dataset, tmp_path / "ref", route=MEMORY)
    assert _bytes(out) == _bytes(tmp_path / "ref")


@settings(max_examples=examples(2))
@given(ids=st.lists(st.text(alphabet=st.sampled_from(["a", "b", "\x00", "é", "\u20ac", "\U0001f600", "\uffff"]),
                            max_size=4), max_size=30),
       bound=st.text(alphabet=st.sampled_from(["a", "b", "\x00", "é", "\u20ac", "\U0001f600"]), max_size=4),
       chunks=st.integers(1, 3))
def test_rows_up_to_counts_what_arrow_compares_as_at_most_the_bound(ids, bound, chunks):
    # the merge's binary search compares ids as Python strings; a run is sorted by Arrow on
    # UTF-8 bytes: the count must be Arrow's, non-ASCII, NUL, prefixes and repeats included
    from chainrows.runners.bulk.runs import rows_up_to
    arr = pa.array(ids, pa.string())
    arr = arr.take(pc.sort_indices(arr))
    cut = [len(ids) * k // chunks for k in range(chunks + 1)]
    col = pa.chunked_array([arr[a:b] for a, b in zip(cut[:-1], cut[1:])], pa.string())
    want = int(pc.sum(pc.less_equal(col, bound)).as_py() or 0)
    assert rows_up_to(col, bound) == want
