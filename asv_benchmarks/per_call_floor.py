"""A floor for the API that counts calls as well as bytes: the reads SPEC §3 requires of every
call, each in its plainest kernel, against one copy of the output list bytes.

``bulk_shapes`` holds ``chainrows.reassemble`` to one ``np.copyto`` of all output list bytes.
On many short calls that copy is small and the work is per call, so this measures, on one
thread, into memory already touched, with nothing stored, no table built and no lookup made:

- ``copy``: the floor itself, one copy of all output list bytes;
- ``hash``: XXH3-64 of every token row (check 14 hashes each call's delta);
- ``logprobs``: the max over every logprob's bits (check 15 reads each);
- ``ids``: every non-null id string of the three tables (``bulk_shapes.id_string_columns``)
  hashed once by the engine's string-join hash (checks 4-9 and the joins read each: call,
  parent and response ids, item and output ids, rollout, group, terminal and accepted ids).

``copy + hash + logprobs + ids`` estimates the least time any implementation of the SPEC takes
on the data before it looks up a single id; ``hash + logprobs + ids`` grants that a fused pass
hides the copy entirely. ::

    python -m asv_benchmarks.per_call_floor DATA [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from asv_benchmarks import common
from asv_benchmarks.bulk_shapes import id_string_columns, output_list_bytes
from chainrows.engine.jit import jit
from chainrows.engine.strjoin import _hash
from chainrows.engine.verify import _max_abs_bits
from chainrows.engine.xxh3 import xxh3_64_tokens


@jit
def hash_rows(off, tokens):
    """XOR of XXH3-64 (seed 0) of tokens[off[i]:off[i + 1]] over every row i."""
    acc = np.uint64(0)
    for i in range(len(off) - 1):
        acc ^= xxh3_64_tokens(tokens, off[i], off[i + 1], np.uint64(0))
    return acc


@jit
def max_bits(off, bits):
    """Max of ``verify._max_abs_bits`` over every row of the float32 bits ``bits``."""
    mx = np.uint32(0)
    for i in range(len(off) - 1):
        mx = max(mx, _max_abs_bits(bits[off[i]:off[i + 1]]))
    return mx


@jit
def hash_strings(off, data):
    """XOR of ``strjoin._hash`` over every string (``data`` padded by 8 bytes for word loads)."""
    acc = np.uint64(0)
    for i in range(len(off) - 1):
        acc ^= _hash(off, data, i)
    return acc


def _list_column(table, name):
    a = table[name].combine_chunks()
    return np.asarray(a.offsets).astype(np.int64), np.asarray(a.values)


def _strings(column):
    """(offsets int64, bytes padded by 8) of a column of strings' non-null strings (the engine
    skips null ids)."""
    a = pc.drop_null(column.combine_chunks()).cast(pa.large_string())
    _, off_buf, data_buf = a.buffers()
    off = np.frombuffer(off_buf, np.int64)[a.offset:a.offset + len(a) + 1]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return off, np.concatenate([data, np.zeros(8, np.uint8)])


def per_call_floor(tables, out_bytes: int, repeats: int = 5) -> dict:
    """Best seconds of each pass above on ``tables`` (ledger, tokens, rollouts) on the calling
    thread's share (run it with one Numba thread; the kernels are serial anyway), ``out_bytes``
    the output list bytes the copy moves; plus the counts they cover."""
    ledger, tokens, rollouts = tables
    tok_off, tok = _list_column(tokens, "tokens")
    if "logprobs" in tokens.column_names:
        lp_off, lp = _list_column(tokens, "logprobs")
    else:
        lp_off, lp = np.zeros_like(tok_off), np.zeros(0, np.float32)
    bits = lp.view(np.uint32)
    strings = [_strings(c) for c in id_string_columns(tables)]
    src = np.ones(out_bytes, np.uint8)
    dst = np.ones(out_bytes, np.uint8)
    passes = {
        "copy": lambda: np.copyto(dst, src),
        "hash": lambda: hash_rows(tok_off, tok),
        "logprobs": lambda: max_bits(lp_off, bits),
        "ids": lambda: [hash_strings(o, d) for o, d in strings],
    }
    result = {name: common.best_of(fn, repeats, min_repeats=2)[0] for name, fn in passes.items()}
    result.update(calls=len(tok_off) - 1, id_strings=sum(len(o) - 1 for o, _ in strings),
                  id_bytes=sum(int(o[-1] - o[0]) for o, _ in strings), out_bytes=out_bytes)
    return result


def line(r: dict) -> str:
    c = max(r["copy"], 1e-9)
    checks = r["hash"] + r["logprobs"] + r["ids"]
    return (f"{r['calls']:,} calls, {r['id_strings'] / 1e6:.1f} M id strings ({r['id_bytes'] / 1e6:.0f} MB), "
            f"{r['out_bytes'] / 1e9:.2f} GB of output lists: one copy {c:.3f} s; XXH3 of every token row "
            f"{r['hash']:.3f} s = {r['hash'] / c:.2f}x; every logprob checked {r['logprobs']:.3f} s = "
            f"{r['logprobs'] / c:.2f}x; every id string hashed {r['ids']:.3f} s = {r['ids'] / c:.2f}x; "
            f"with the copy {checks + c:.3f} s = {(checks + c) / c:.2f}x the copy, without it {checks / c:.2f}x "
            f"(under 4x the copy, with the copy hidden, {(4 * c - checks) / max(r['calls'], 1) * 1e9:.0f} ns "
            f"a call left for everything else)")


def main(argv=None) -> int:
    import numba

    import chainrows
    from chainrows.formats.native.dataset import read_dataset

    ap = argparse.ArgumentParser(prog="python -m asv_benchmarks.per_call_floor", description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("dataset", help="a dataset directory (SPEC §2), e.g. one asv_benchmarks.shapes wrote")
    ap.add_argument("--repeats", type=int, default=5, help="best of this many runs of each pass (default 5)")
    a = ap.parse_args(argv)
    ds = read_dataset(a.dataset)
    tables = (ds.ledger, ds.tokens, ds.rollouts)
    out_bytes = output_list_bytes(chainrows.reassemble(*tables))
    numba.set_num_threads(1)
    print(line(per_call_floor(tables, out_bytes, a.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
