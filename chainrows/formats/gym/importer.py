"""``import_gym``: a NeMo Gym dump -> a verified SPEC §2 dataset (docs/gym.md).

Memory stays bounded by ``memory_budget`` whatever the dump's size: when the staged file is
larger than a bucket's share of the budget, a first pass parses every line once to route it by
a hash of its rollout_id into one of K bucket files (in the output's temp directory, with the
line's original number), and each bucket is then imported alone and written as one part file
per table. A rollout's receipt, staged calls and result always land in the same bucket, so
staged lines may come in any order. Everything is written through AtomicOutput: a malformed
line (InputError), a failed write (a WriteError naming the file: a full disk) or an interrupt
leaves no dataset behind.
"""

from __future__ import annotations

import math
import os
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from chainrows.errors import InputError
from chainrows.formats.gym.fast import load_kernels
from chainrows.formats.gym.records import (
    NAMES,
    Receipt,
    StagedCall,
    dump_files,
    iter_raw,
    parse_line,
    parse_receipt,
    parse_result,
    parse_staged_line,
    staged_key,
    staged_lines,
)
from chainrows.formats.gym.verify import Checked, Verifier
from chainrows.formats.native.hashing import chain_hash
from chainrows.formats.native.schema import (
    ACCEPTED_FIELD,
    INTEGRITY_FIELD,
    LEDGER_SCHEMA,
    LOGPROBS_FIELD,
    ROLLOUTS_SCHEMA,
    TOKENS_SCHEMA,
)
from chainrows.memory.budget import check_budget, footprint_after
from chainrows.outdir.atomic import AtomicOutput
from chainrows.outdir.outfile import OutFile

DEFAULT_BUDGET = 2 << 30
GZ_RATIO = 5  # assumed expansion of a .gz staged file, for sizing buckets
PEAK_FACTOR = 8  # a bucket's peak above the baseline over its staged JSON, with margin (docs/gym.md)
SHARE = 0.75  # of the room above the baseline, what a bucket's estimated peak may use
VERIFY_BATCH_TOKENS = 1 << 22  # tokens handed to the verifier at a time
MAX_BUCKETS = 512  # open files of the partition pass (one table at a time)
FAST_STAGED = True  # staged lines through chainrows.formats.gym.fast (False: json.loads of every line)
LEDGER = LEDGER_SCHEMA.append(INTEGRITY_FIELD)
TOKENS = TOKENS_SCHEMA.append(LOGPROBS_FIELD)


@dataclass
class GymSummary:
    """What an import found. ``failures``: integrity failures by check text."""

    receipts: int = 0
    results: int = 0
    calls: int = 0  # ledger rows written (poison rows of pending calls included)
    staged: int = 0  # staged lines
    verified: int = 0  # staged calls that passed every check
    failures: Counter = field(default_factory=Counter)
    orphan_staged: int = 0  # staged lines naming no call of any receipt
    without_result: int = 0  # receipts whose rollout has no results line
    buckets: int = 1

    def format(self) -> str:
        lines = [f"{'receipts':<22} {self.receipts:,}", f"{'results':<22} {self.results:,}",
                 f"{'calls':<22} {self.calls:,}", f"{'staged calls':<22} {self.staged:,}",
                 f"{'verified':<22} {self.verified:,}",
                 f"{'integrity failures':<22} {sum(self.failures.values()):,}"]
        lines += [f"  {check:<40} {n:,}" for check, n in sorted(self.failures.items())]
        lines += [f"{'orphan staged calls':<22} {self.orphan_staged:,}",
                  f"{'rollouts w/o result':<22} {self.without_result:,}"]
        if self.buckets > 1:
            lines.append(f"{'buckets':<22} {self.buckets:,}")
        return "\n".join(lines)


def import_gym(dump_dir: str | os.PathLike, dataset_dir: str | os.PathLike, *,
               memory_budget: int = DEFAULT_BUDGET, threads: int | None = None,
               buckets: int | None = None) -> GymSummary:
    """Read the dump (``receipts.jsonl``, ``staged.jsonl``, ``results.jsonl``, each may be
    ``.gz``), verify every staged call against its record and write the dataset (tables
    ``ledger``, ``tokens``, ``rollouts``; single files, or part directories when bucketed).
    Raises InputError (file, line, field) on a malformed line; nothing is written then.

    ``memory_budget`` sizes the buckets (:func:`bucket_count`); a budget below what the process
    itself needs is an InputError naming the smallest that works (chainrows.memory.budget, as
    ``reassemble`` refuses it). ``buckets``: force that many (tests, measurements)."""
    files = dump_files(dump_dir)
    footprint = footprint_after(load_kernels)
    check_budget(memory_budget, footprint)
    summary = GymSummary()
    staged_size = files["staged"].stat().st_size * (GZ_RATIO if files["staged"].suffix == ".gz" else 1)
    k = buckets or bucket_count(staged_size, footprint.room(memory_budget))
    summary.buckets = k
    with Verifier(threads) as verifier, AtomicOutput(dataset_dir, names=("ledger", "tokens", "rollouts")) as out:
        if k == 1:
            sources = {name: iter_raw(files[name], name) for name in NAMES}
            for name, table in _import_bucket(files, sources, verifier, summary).items():
                out.write_table(name, table)
        else:
            buckets = _partition(files, k, Path(out.tmp_dir) / "gym-buckets")
            for b in range(k):
                sources = {name: _iter_bucket(buckets[name][b]) for name in NAMES}
                for name, table in _import_bucket(files, sources, verifier, summary).items():
                    out.write_part(name, table)
    return summary


# ----------------------------------------------------------------------------- partitioning

def bucket_count(staged_bytes: int, room: int) -> int:
    """Buckets so that PEAK_FACTOR times a bucket's staged JSON is at most SHARE of ``room`` (the
    budget above the process's measured baseline), at most MAX_BUCKETS."""
    per_bucket = max(1.0, SHARE * room / PEAK_FACTOR)
    return min(MAX_BUCKETS, max(1, math.ceil(staged_bytes / per_bucket)))


def _bucket_of(rollout_id: str, k: int) -> int:
    return zlib.crc32(rollout_id.encode("utf-8")) % k


def _partition(files: dict, k: int, folder: Path) -> dict:
    """Route every line by rollout into k bucket files per table; name -> [paths]. A failed
    write (a full disk) is a WriteError naming the bucket file."""
    folder.mkdir()
    paths = {name: [folder / f"{name}-{b}.txt" for b in range(k)] for name in NAMES}
    for name in NAMES:
        with ExitStack() as files_open:
            handles = [files_open.enter_context(OutFile(p)) for p in paths[name]]
            if name == "staged":
                lines = ((n, raw, _key(n, raw, line, files[name]))
                         for n, raw, line, _ in staged_lines(iter_raw(files[name], name), files[name], FAST_STAGED))
            else:
                lines = ((n, raw, parse_line(raw, files[name], n, name).string("rollout_id"))
                         for n, raw in iter_raw(files[name], name))
            for number, raw, rid in lines:
                h = handles[_bucket_of(rid, k)]
                h.write(b"%d\t" % number)
                h.write(raw if raw.endswith(b"\n") else raw + b"\n")
    return paths


def _key(number: int, raw: bytes, line, file: Path) -> str:
    """A staged line's rollout_id; a form error is the exact parser's own."""
    try:
        return staged_key(line)[0]
    except InputError:
        return staged_key(parse_line(raw, file, number, "staged"))[0]


def _iter_bucket(path: Path) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as handle:
        for raw in handle:
            number, _, rest = raw.partition(b"\t")
            yield int(number), rest


# ----------------------------------------------------------------------------- one bucket

def _import_bucket(files: dict, sources: dict, verifier: Verifier, summary: GymSummary) -> dict:
    receipts = [parse_receipt(parse_line(raw, files["receipts"], n, "receipts"))
                for n, raw in sources["receipts"]]
    staged: dict[tuple[str, str], list[StagedCall]] = {}
    for n, raw, line, parsed in staged_lines(sources["staged"], files["staged"], FAST_STAGED):
        st = parse_staged_line(n, raw, line, parsed, files["staged"])
        staged.setdefault((st.rollout_id, st.model_call_id), []).append(st)
    results = [parse_result(parse_line(raw, files["results"], n, "results")) for n, raw in sources["results"]]
    summary.receipts += len(receipts)
    summary.results += len(results)
    summary.staged += sum(len(v) for v in staged.values())

    manifests: dict[str, list] = {}  # rollout -> records of all its receipts, in line order
    for rc in receipts:
        manifests.setdefault(rc.rollout_id, []).extend(rc.manifest)
    checked = _verify(manifests, staged, verifier)
    for item in checked.values():
        if item.error is None:
            summary.verified += 1
        else:
            summary.failures[item.error] += 1
    recorded = {(rid, rec.model_call_id) for rid, recs in manifests.items() for rec in recs}
    summary.orphan_staged += sum(len(v) for key, v in staged.items() if key not in recorded)
    result_ids = {r.rollout_id for r in results}
    summary.without_result += len({rc.rollout_id for rc in receipts} - result_ids)

    ledger = _ledger(receipts, checked)
    summary.calls += ledger.num_rows
    return {"ledger": ledger, "tokens": _tokens(staged, checked), "rollouts": _rollouts(results, receipts, manifests)}


def _verify(manifests: dict, staged: dict, verifier: Verifier) -> dict:
    """(rollout_id, call_id) -> Checked for every record with a staged call, in batches of
    about VERIFY_BATCH_TOKENS tokens."""
    out: dict = {}
    batch, tokens = [], 0
    for rid, records in manifests.items():
        mine = {rec.model_call_id: staged[(rid, rec.model_call_id)][0]
                for rec in records if (rid, rec.model_call_id) in staged}
        batch.append((rid, records, mine))
        tokens += sum(len(st.tokens) for st in mine.values())
        if tokens >= VERIFY_BATCH_TOKENS:
            _collect(verifier, batch, out)
            batch, tokens = [], 0
    _collect(verifier, batch, out)
    return out


def _collect(verifier: Verifier, batch: list, out: dict) -> None:
    for (rid, _, staged), checked in zip(batch, verifier.verify(batch)):
        for cid, item in checked.items():
            out[(rid, cid)] = item
            st = staged[cid]  # its table data is in item now: free the parsed arrays early
            st.tokens = st.mask = st.logprobs = None


def _ledger(receipts: list[Receipt], checked: dict) -> pa.Table:
    cols: dict[str, list] = {f.name: [] for f in LEDGER}

    def add(**row):
        for name, values in cols.items():
            values.append(row[name])

    for rc in receipts:
        pending = set(rc.pending_call_ids)
        by_id = {rec.model_call_id: rec for rec in rc.manifest}
        hashes: dict[str, int] = {}
        for rec in rc.manifest:
            item = checked.get((rc.rollout_id, rec.model_call_id))
            add(rollout_id=rc.rollout_id, call_id=rec.model_call_id, parent_id=rec.parent_call_id,
                response_id=rec.response_id, prev_len=rec.prev_len, delta_len=rec.delta_len,
                gen_len=item.gen_len if item else 0,
                chain_hash=_xxh3_of(rc.rollout_id, rec, by_id, checked, hashes),
                item_keys=rec.item_keys, item_ids=rec.item_ids,
                failed=rc.capture_poisoned or rec.model_call_id in pending,
                integrity_error=item.error if item else None)
        for pid in rc.pending_call_ids:  # a pending call may have no record yet: a poison row
            if pid not in by_id:
                add(rollout_id=rc.rollout_id, call_id=pid, parent_id=None, response_id="", prev_len=0,
                    delta_len=0, gen_len=0, chain_hash=0, item_keys=[], item_ids=[], failed=True,
                    integrity_error=None)
    return pa.Table.from_pydict(cols, schema=LEDGER)


def _xxh3_of(rid: str, rec, by_id: dict, checked: dict, memo: dict) -> int:
    """SPEC §2 chain_hash from the staged tokens, seeded with the parent's computed one (0 when
    the call or its parent has no staged call: the engine reports missing_tokens first)."""
    if rec.model_call_id in memo:
        return memo[rec.model_call_id]
    memo[rec.model_call_id] = 0  # guards a parent cycle
    item = checked.get((rid, rec.model_call_id))
    if item is None:
        return 0
    parent = by_id.get(rec.parent_call_id) if rec.parent_call_id is not None else None
    seed = _xxh3_of(rid, parent, by_id, checked, memo) if parent is not None else 0
    memo[rec.model_call_id] = value = chain_hash(item.tokens, seed)
    return value


def _tokens(staged: dict, checked: dict) -> pa.Table:
    """Every staged line as a token row (orphans and repeats included: the engine counts them)."""
    rids, cids, toks, lps = [], [], [], []
    for (rid, cid), calls in staged.items():
        for i, st in enumerate(calls):
            item = checked.get((rid, cid)) if i == 0 else None
            if item is None:
                with np.errstate(over="ignore", invalid="ignore"):
                    item = Checked(None, st.tokens.astype(np.uint32).view(np.int32),
                                   st.logprobs.astype(np.float32), 0)
            rids.append(rid)
            cids.append(cid)
            toks.append(item.tokens)
            lps.append(item.logprobs)
    return pa.table({
        "rollout_id": pa.array(rids, pa.string()),
        "call_id": pa.array(cids, pa.string()),
        "tokens": _list_column(toks, np.int32, pa.int32()),
        "logprobs": _list_column(lps, np.float32, pa.float32()),
    }, schema=TOKENS)


def _list_column(parts: list, dtype, arrow_type) -> pa.Array:
    lengths = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)
    if offsets[-1] >= 2**31:
        raise ValueError("a bucket's token column exceeds 2**31 values; lower --memory-budget")
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, arrow_type))


def _rollouts(results: list, receipts: list[Receipt], manifests: dict) -> pa.Table:
    reward: dict = {}
    for rc in receipts:
        reward.setdefault(rc.rollout_id, rc.reward)
    accepted = any(r.accepted_response_ids is not None for r in results)
    schema = ROLLOUTS_SCHEMA.append(ACCEPTED_FIELD) if accepted else ROLLOUTS_SCHEMA
    rows = []
    for r in results:
        served = {rec.response_id for rec in manifests.get(r.rollout_id, ())}
        terminal = r.terminal_response_id
        if terminal is None and r.response_id in served:
            terminal = r.response_id
        row = dict(rollout_id=r.rollout_id, group_id=r.group_id, reward=reward.get(r.rollout_id),
                   output_keys=r.output_keys, output_ids=r.output_ids, terminal_response_id=terminal)
        if accepted:
            row["accepted_response_ids"] = r.accepted_response_ids
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=schema)

