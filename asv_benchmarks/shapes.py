"""Datasets shaped like what users bring, not like ``chainrows synth``'s own files.

``write_shaped_dataset(out, shape, target_bytes, seed)`` builds a SPEC §2 dataset from synthetic
rollouts, then reshapes it the way historical dumps look:

- random hexadecimal rollout and group ids (capture order is not id order, so every output
  sort and merge does real work);
- rows in **capture order**: the rollouts of a GRPO group run side by side (their ledger rows
  interleave call by call), a call's token row lands within a few rows of its ledger row, a
  rollouts row follows its group's last call;
- small row groups and several part files per table, so pyarrow reads multi-chunk columns;
- logprobs on every token.

Shapes (``SHAPES``): ``capture`` (long calls, ~1,700 tokens each, as in a coding agent),
``shuffled`` (the same, token rows permuted over the whole table), ``short`` (many short calls,
~60 tokens each, so per-call costs dominate). Derived shapes (``DERIVED_SHAPES``) are made
from another shape's files: ``files``, the capture shape in 1,000 files per table, as many
workers or a Spark / Ray job leave a capture (``split_dataset``); ``wide``, the capture shape
with the columns a real capture carries beside the format's, each call's request text and each
rollout's transcript, ~1 GB of text that a run never reads (``widen_dataset``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

SHAPES = {
    "capture": dict(mean_calls=7, mean_gen_tokens=450, mean_obs_tokens=1200, prompt_tokens=3000,
                    shuffle_tokens=False),
    "shuffled": dict(mean_calls=7, mean_gen_tokens=450, mean_obs_tokens=1200, prompt_tokens=3000,
                     shuffle_tokens=True),
    "short": dict(mean_calls=40, mean_gen_tokens=30, mean_obs_tokens=30, prompt_tokens=300,
                  shuffle_tokens=False),
}
CHUNK_ROLLOUTS = 1024
MIN_CHUNK_ROLLOUTS = 32
GROUP_ROWS = {"ledger": 16384, "tokens": 2048, "rollouts": 4096}
FILES_PER_TABLE = 4
WIDE_CHARS_PER_TOKEN = 4  # request text per token of a call's delta
WIDE_TRANSCRIPT_CHARS = (2_000, 20_000)  # a rollout's transcript, uniform


def _hex_ids(rng: np.random.Generator, n: int) -> pa.Array:
    raw = rng.integers(0, 2**63 - 1, size=(n, 2), dtype=np.int64)
    return pa.array([f"{a:016x}{b:016x}" for a, b in raw], pa.string())


def _renamed(table: pa.Table, column: str, old: pa.Array, new: pa.Array) -> pa.Table:
    i = table.column_names.index(column)
    col = table.column(i)
    idx = pc.index_in(col, value_set=old)
    return table.set_column(i, column, pc.if_else(pc.is_null(col), col, pc.take(new, idx)).cast(col.type))


def _capture_order(ledger: pa.Table, tokens: pa.Table, rollouts: pa.Table, rng):
    """Rows reordered as a harness running each group's rollouts side by side writes them."""
    rid = ledger["rollout_id"].combine_chunks()
    codes = pc.dictionary_encode(rid).indices.to_numpy()
    by_rollout = np.argsort(codes, kind="stable")
    sorted_codes = codes[by_rollout]
    first = np.r_[True, sorted_codes[1:] != sorted_codes[:-1]]
    run_start = np.maximum.accumulate(np.where(first, np.arange(len(codes)), 0))
    ordinal = np.empty(len(codes), dtype=np.int64)
    ordinal[by_rollout] = np.arange(len(codes)) - run_start  # capture index within the rollout
    group_of = dict(zip(rollouts["rollout_id"].to_pylist(), rollouts["group_id"].to_pylist()))
    gnames = np.array([group_of.get(r) or r for r in pc.dictionary_encode(rid).dictionary.to_pylist()],
                      dtype=object)
    _, gcode = np.unique(gnames, return_inverse=True)
    order = np.lexsort((codes, ordinal, gcode[codes]))
    ledger = ledger.take(pa.array(order))
    # token rows: ledger order, each moved by a few rows
    key = pc.binary_join_element_wise(tokens["rollout_id"], tokens["call_id"], "\x00")
    lkey = pc.binary_join_element_wise(ledger["rollout_id"], ledger["call_id"], "\x00")
    pos = pc.index_in(key, value_set=lkey).to_numpy(zero_copy_only=False)
    pos = np.where(np.isnan(pos.astype(float)), len(lkey), pos).astype(np.float64)
    tokens = tokens.take(pa.array(np.argsort(pos + rng.uniform(0, 6, len(pos)), kind="stable")))
    rgroup = np.array([g or r for g, r in zip(rollouts["group_id"].to_pylist(),
                                               rollouts["rollout_id"].to_pylist())], dtype=object)
    _, rg = np.unique(rgroup, return_inverse=True)
    rollouts = rollouts.take(pa.array(np.argsort(rg, kind="stable")))
    return ledger, tokens, rollouts


def shaped_tables(shape: str, target_bytes: int, seed: int = 0):
    """(ledger, tokens, rollouts) Arrow tables of about ``target_bytes`` of token+logprob values."""
    from chainrows.synth import synth_tables

    params = dict(SHAPES[shape])
    shuffle = params.pop("shuffle_tokens")
    rng = np.random.default_rng(seed)
    parts, got, k, per_chunk = [], 0, 0, CHUNK_ROLLOUTS
    while got < target_bytes:
        ledger, tokens, rollouts = synth_tables(per_chunk, seed * 100_003 + k, **params)
        if k == 0 and per_chunk == CHUNK_ROLLOUTS:
            # a target far below one chunk (a smoke run): the first chunk again, scaled to it
            chunk_bytes = 8 * int(pc.sum(pc.list_value_length(tokens["tokens"])).as_py() or 0)
            fewer = max(MIN_CHUNK_ROLLOUTS, -(-CHUNK_ROLLOUTS * target_bytes // max(chunk_bytes, 1)))
            if chunk_bytes > 2 * target_bytes and fewer < CHUNK_ROLLOUTS:
                per_chunk = fewer
                continue
        old = pc.unique(pa.concat_arrays([c.cast(pa.string()) for c in
                                          (ledger["rollout_id"].combine_chunks(),
                                           tokens["rollout_id"].combine_chunks(),
                                           rollouts["rollout_id"].combine_chunks())]))
        new = _hex_ids(rng, len(old))
        gold = pc.unique(rollouts["group_id"].combine_chunks().drop_null())
        gnew = _hex_ids(rng, len(gold))
        ledger, tokens = _renamed(ledger, "rollout_id", old, new), _renamed(tokens, "rollout_id", old, new)
        rollouts = _renamed(_renamed(rollouts, "rollout_id", old, new), "group_id", gold, gnew)
        parts.append(_capture_order(ledger, tokens, rollouts, rng))
        got += 8 * int(pc.sum(pc.list_value_length(tokens["tokens"])).as_py() or 0)
        k += 1
    tables = [pa.concat_tables([p[i] for p in parts]) for i in range(3)]
    if shuffle:
        tables[1] = tables[1].take(pa.array(rng.permutation(tables[1].num_rows)))
    return tuple(tables)


TABLE_NAMES = ("ledger", "tokens", "rollouts")


@contextmanager
def _replacing(out: Path) -> Iterator[Path]:
    """A fresh directory beside ``out``, a subdirectory per table, to write a dataset in; it
    replaces ``out`` when the block ends without an error."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for name in TABLE_NAMES:
        (tmp / name).mkdir(parents=True)
    yield tmp
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def _write_part(table: pa.Table, path: Path, **kw) -> None:
    """One part file, with chainrows' own codec and level (``outdir.parquet.WRITE_OPTIONS``)."""
    from chainrows.outdir.parquet import WRITE_OPTIONS

    pq.write_table(table, path, compression=WRITE_OPTIONS["compression"],
                   compression_level=WRITE_OPTIONS["compression_level"], **kw)


def write_shaped_dataset(out, shape: str, target_bytes: int, seed: int = 0) -> Path:
    """Write a shaped dataset to ``out`` (replaced): each table a directory of part files."""
    out = Path(out)
    with _replacing(out) as tmp:
        for name, table in zip(TABLE_NAMES, shaped_tables(shape, target_bytes, seed)):
            step = -(-table.num_rows // FILES_PER_TABLE) or 1
            for f in range(FILES_PER_TABLE):
                _write_part(table.slice(f * step, step), tmp / name / f"part-{f}.parquet",
                            row_group_size=GROUP_ROWS[name])
    return out


def split_dataset(src, out, files_per_table: int) -> Path:
    """Write ``src``'s tables to ``out`` (replaced) as ``files_per_table`` part files each (fewer
    for a table of fewer rows), rows in the same order (file names sort in read order)."""
    src, out = Path(src), Path(out)
    with _replacing(out) as tmp:
        for name in TABLE_NAMES:
            table = pq.read_table(src / name)
            n = table.num_rows
            files = max(1, min(files_per_table, n))
            for f in range(files):
                a, b = f * n // files, (f + 1) * n // files
                _write_part(table.slice(a, b - a), tmp / name / f"part-{f:05d}.parquet")
    return out


def _text(rng: np.random.Generator, pool: np.ndarray, lengths: np.ndarray, rows: int) -> pa.ChunkedArray:
    """Strings of the given lengths cut from random places of ``pool`` (text-like bytes, which
    compress about as prose does), built ``rows`` at a time (the index arrays are 8 bytes per
    character)."""
    lengths = np.asarray(lengths, np.int64)
    chunks = []
    for a in range(0, len(lengths), rows):
        n = lengths[a:a + rows]
        offsets = np.zeros(len(n) + 1, np.int64)
        np.cumsum(n, out=offsets[1:])
        starts = rng.integers(0, len(pool) - int(n.max(initial=0)), len(n))
        data = pool[np.repeat(starts - offsets[:-1], n) + np.arange(offsets[-1])]
        chunks.append(pa.LargeStringArray.from_buffers(len(n), pa.py_buffer(offsets), pa.py_buffer(data)))
    return pa.chunked_array(chunks, pa.large_string())


def widen_dataset(src, out, seed: int = 0) -> Path:
    """Write ``src``'s tables to ``out`` (replaced), file for file and row group for row group
    as ``GROUP_ROWS`` has them, with the columns a real capture carries beside the format's:
    ledger ``request_text`` (``WIDE_CHARS_PER_TOKEN`` characters per token of the call's delta)
    and ``model``, rollouts ``transcript_json`` (``WIDE_TRANSCRIPT_CHARS``)."""
    src, out = Path(src), Path(out)
    rng = np.random.default_rng(seed)
    words = np.array([b"w%x" % i for i in range(4096)])
    pool = np.frombuffer(b" ".join(rng.choice(words, 2_000_000)), np.uint8)
    with _replacing(out) as tmp:
        for name in TABLE_NAMES:
            for f in sorted((src / name).glob("*.parquet")):
                table = pq.read_table(f)
                if name == "ledger":
                    delta = table["delta_len"].to_numpy(zero_copy_only=False)
                    table = table.append_column("request_text", _text(rng, pool, delta * WIDE_CHARS_PER_TOKEN,
                                                                      GROUP_ROWS[name]))
                    table = table.append_column("model", pa.array(["policy-v3"] * table.num_rows))
                elif name == "rollouts":
                    table = table.append_column("transcript_json", _text(rng, pool, rng.integers(
                        *WIDE_TRANSCRIPT_CHARS, table.num_rows), GROUP_ROWS[name]))
                _write_part(table, tmp / name / f.name, row_group_size=GROUP_ROWS[name])
    return out


# shape -> (the shape it is made from, how: ``make(src, out)``)
DERIVED_SHAPES = {
    "files": ("capture", partial(split_dataset, files_per_table=1000)),
    "wide": ("capture", widen_dataset),
}


if __name__ == "__main__":
    import argparse
    import time

    ap = argparse.ArgumentParser(prog="python -m asv_benchmarks.shapes", description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the dataset directory to write")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="capture",
                    help="capture order, token rows shuffled, or many short calls (default capture)")
    ap.add_argument("--gb", type=float, default=2.0, help="token + logprob bytes, in GB (default 2.0)")
    ap.add_argument("--seed", type=int, default=0, help="the same seed writes the same dataset (default 0)")
    a = ap.parse_args()
    t0 = time.perf_counter()
    path = write_shaped_dataset(a.out, a.shape, int(a.gb * 1e9), a.seed)
    size = sum(p.stat().st_size for p in path.rglob("*.parquet"))
    print(f"wrote {path} ({a.shape}, {size / 1e9:.2f} GB on disk) in {time.perf_counter() - t0:.0f} s")
