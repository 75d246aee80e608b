"""A SPEC §2 dataset written back as a full-sequence call log (docs/calls.md, "Trying it"):
what a harness that kept whole prompts would have logged for the same rollouts.

Each call's full sequence is its parent's plus its delta; its prompt is that less the last
``gen_len`` tokens, which are its completion. A ledger stores fingerprints of the items a call
produced, not the items, so each key becomes a stand-in item (an assistant message whose text
names the key, with the item's id); the results file's output items are mapped the same way,
so selection matches the same calls. Meant for consistent datasets (the hashes and lengths
right): the log has no place for a corrupt hash or a missing token row.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa

from chainrows.engine.jit import jit


@jit
def _full_lengths(parent, delta_len):
    n = len(parent)
    full = np.empty(n, np.int64)
    for i in range(n):
        full[i] = delta_len[i] + (full[parent[i]] if parent[i] >= 0 else 0)
    return full


@jit
def _full_sequences(parent, delta_off, delta, full_off, out):
    """out[full_off[i]:full_off[i+1]] = the parent's full sequence, then call i's delta
    (parents come before their children)."""
    for i in range(len(parent)):
        o = full_off[i]
        p = parent[i]
        if p >= 0:
            n = full_off[p + 1] - full_off[p]
            out[o:o + n] = out[full_off[p]:full_off[p + 1]]
            o += n
        out[o:full_off[i + 1]] = delta[delta_off[i]:delta_off[i + 1]]


def stand_in(key: int, item_id) -> dict:
    """The item a key stands for in an exported log: an assistant message naming the key."""
    item = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"k{key:016x}"}]}
    if item_id is not None:
        item["id"] = item_id
    return item


def _parents(ledger: pa.Table) -> np.ndarray:
    index = {(r, c): i for i, (r, c) in enumerate(zip(ledger.column("rollout_id").to_pylist(),
                                                      ledger.column("call_id").to_pylist()))}
    return np.array([index.get((r, p), -1) if p is not None else -1 for r, p in
                     zip(ledger.column("rollout_id").to_pylist(), ledger.column("parent_id").to_pylist())],
                    np.int64)


def export_calls(ledger: pa.Table, tokens: pa.Table, *, declare_parents: bool = False) -> pa.Table:
    """The call log (the Parquet form of docs/calls.md) of a consistent dataset's ledger and
    tokens: one row per ledger row, in ledger order; ``declare_parents`` adds the ledger's
    parent_id column (the harness's own word)."""
    token_row = {(r, c): i for i, (r, c) in enumerate(zip(tokens.column("rollout_id").to_pylist(),
                                                          tokens.column("call_id").to_pylist()))}
    rows = np.array([token_row[(r, c)] for r, c in zip(ledger.column("rollout_id").to_pylist(),
                                                      ledger.column("call_id").to_pylist())], np.int64)
    tok = tokens.column("tokens").combine_chunks().take(pa.array(rows))
    delta_off = tok.offsets.to_numpy().astype(np.int64)
    delta = tok.values.to_numpy().astype(np.int32)[delta_off[0]:]
    delta_off -= delta_off[0]
    parent = _parents(ledger)
    full = _full_lengths(parent, np.diff(delta_off))
    full_off = np.zeros(len(full) + 1, np.int64)
    np.cumsum(full, out=full_off[1:])
    out = np.empty(full_off[-1], np.int32)
    _full_sequences(parent, delta_off, delta, full_off, out)
    gen = ledger.column("gen_len").to_numpy()
    columns = _split(out, full_off, gen)
    if "logprobs" in tokens.column_names:
        lp = tokens.column("logprobs").combine_chunks().take(pa.array(rows))
        columns["completion_logprobs"] = _tails(lp, gen)
    columns["rollout_id"] = ledger.column("rollout_id")
    columns["call_id"] = ledger.column("call_id")
    columns["response_id"] = ledger.column("response_id")
    columns["output_items"] = pa.array([json.dumps([stand_in(k, i) for k, i in zip(keys or (), ids or [None] * len(keys or ()))])
                                        for keys, ids in zip(ledger.column("item_keys").to_pylist(),
                                                             ledger.column("item_ids").to_pylist())])
    if declare_parents:
        columns["parent_id"] = ledger.column("parent_id")
    order = ["rollout_id", "call_id", "response_id", "parent_id", "prompt_ids", "completion_ids",
             "completion_logprobs", "output_items"]
    return pa.table({k: columns[k] for k in order if k in columns})


def _split(full: np.ndarray, full_off: np.ndarray, gen: np.ndarray) -> dict:
    """Prompt i = full[full_off[i]:cut], completion i = full[cut:full_off[i+1]], cut = the end
    less gen[i]."""
    values = pa.array(full, pa.int32())
    cut = full_off[1:] - gen
    return {"prompt_ids": _ranges(values, full_off[:-1], cut), "completion_ids": _ranges(values, cut, full_off[1:])}


def _ranges(values: pa.Array, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """A list array whose entry i is values[starts[i]:ends[i]] (a copy, entries back to back)."""
    lengths = ends - starts
    off = np.zeros(len(starts) + 1, np.int64)
    np.cumsum(lengths, out=off[1:])
    idx = np.repeat(starts - off[:-1], lengths) + np.arange(off[-1])
    return pa.LargeListArray.from_arrays(pa.array(off), values.take(pa.array(idx))).cast(pa.list_(values.type))


def _tails(lists: pa.Array, gen: np.ndarray) -> pa.Array:
    off = lists.offsets.to_numpy().astype(np.int64)
    valid = np.asarray(lists.is_valid().to_numpy(zero_copy_only=False), bool)
    out = _ranges(lists.values, off[1:] - gen, off[1:])
    return pa.ListArray.from_arrays(out.offsets, out.values, mask=pa.array(~valid)) if not valid.all() else out


def results_records(rollouts: pa.Table) -> list[dict]:
    """The results file (as import-jsonl reads it) of a rollouts table, output keys as stand-ins."""
    out = []
    for r in rollouts.to_pylist():
        ids = r["output_ids"] if r["output_ids"] is not None else [None] * len(r["output_keys"] or ())
        rec = {"rollout_id": r["rollout_id"], "group_id": r["group_id"], "reward": r["reward"],
               "output": [stand_in(k, i) for k, i in zip(r["output_keys"] or (), ids)],
               "terminal_response_id": r["terminal_response_id"]}
        if "accepted_response_ids" in r:
            rec["accepted_response_ids"] = r["accepted_response_ids"]
        out.append(rec)
    return out


def write_results_jsonl(path: str | os.PathLike, rollouts: pa.Table) -> None:
    """:func:`results_records` as a JSON Lines file."""
    with open(path, "w", encoding="utf-8") as f:
        for rec in results_records(rollouts):
            f.write(json.dumps(rec, allow_nan=True) + "\n")


__all__ = ["export_calls", "results_records", "write_results_jsonl", "write_calls_jsonl", "stand_in"]


def write_calls_jsonl(calls: pa.Table, path: str | os.PathLike, *, batch_rows: int = 1024) -> None:
    """A call log table (the Parquet form) as JSON Lines: ``output_items`` as JSON, a null
    field left out (but ``parent_id``, whose null declares a root when the column exists)."""
    declares = "parent_id" in calls.column_names
    with open(path, "w", encoding="utf-8") as f:
        for batch in calls.to_batches(batch_rows):
            for row in batch.to_pylist():
                rec = {k: v for k, v in row.items() if v is not None or (k == "parent_id" and declares)}
                if "output_items" in rec:
                    rec["output_items"] = json.loads(rec["output_items"])
                f.write(json.dumps(rec, allow_nan=True) + "\n")
