"""Full-sequence call logs shaped like real agent rollouts, for benchmarking ``import-calls``.

Not built from ``chainrows.synth``: a rollout here is a conversation whose prompt grows by a tool
result and the model's answer per call, from a shared system prompt to 4k-32k tokens over
20-200 calls, with the harness's habits mixed in: context compactions (a new, shorter prompt),
rejected retries (the same prompt asked again), re-tokenized turns (one token of an earlier
answer written differently in the next prompt). Rollouts run side by side, so their calls
interleave in the log. Every call has logprobs and one output item. The log is written as
Parquet (row groups of ~``GROUP_BYTES``, so columns arrive in many chunks) or JSON Lines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from chainrows.engine.jit import jit

VOCAB = 150_000
SYSTEM_TOKENS = 2_000
ACTIVE = 32  # rollouts running side by side
GROUP_BYTES = 64 << 20


@dataclass
class Shape:
    """The habits of the simulated harness."""

    min_calls: int = 20
    max_calls: int = 200
    min_prompt: int = 4_000
    max_prompt: int = 32_000
    compaction_rate: float = 0.3  # per rollout: one compaction somewhere
    retry_rate: float = 0.05      # per call: a rejected retry before it
    drift_rate: float = 0.02      # per call: the next prompt re-tokenizes one of its tokens
    system_tokens: int = SYSTEM_TOKENS


def _rollout(rng: np.random.Generator, rid: str, system: np.ndarray, shape: Shape) -> list[dict]:
    """The calls of one rollout, in capture order, as dicts of numpy arrays and strings."""
    n = int(rng.integers(shape.min_calls, shape.max_calls + 1))
    target = int(rng.integers(shape.min_prompt, shape.max_prompt + 1))
    growth = max(8, (target - shape.system_tokens) // n)
    task = max(20, min(1000, target // 10))
    history = np.concatenate([system, rng.integers(0, VOCAB, int(rng.integers(task // 5, task)), np.int32)])
    compact_at = int(rng.integers(n // 3, n)) if rng.random() < shape.compaction_rate else -1
    calls = []
    for i in range(n):
        if i == compact_at or len(history) + growth > target:  # a compaction, or the context is full:
            # a new context of the system prompt, a summary and the last result
            history = np.concatenate([system, rng.integers(0, VOCAB, 500, np.int32), history[-200:]])
        if rng.random() < shape.retry_rate:
            calls.append(_call(rid, f"{rid}-r{i}", history, rng, growth, f"rejected {i}"))
        call = _call(rid, f"{rid}-c{i}", history, rng, growth, f"answer {i}")
        calls.append(call)
        completion = call["completion_ids"].copy()
        if rng.random() < shape.drift_rate and len(completion) > 2:
            completion[len(completion) // 2] = (completion[len(completion) // 2] + 1) % VOCAB
        obs = rng.integers(0, VOCAB, max(1, int(rng.lognormal(np.log(0.6 * growth), 0.5))), np.int32)
        history = np.concatenate([history, completion, obs])
    return calls


def _call(rid: str, cid: str, prompt: np.ndarray, rng, growth: int, text: str) -> dict:
    k = max(1, int(rng.lognormal(np.log(0.4 * growth), 0.5)))
    item = {"type": "message", "role": "assistant", "id": f"msg_{cid}",
            "content": [{"type": "output_text", "text": f"{text} of {rid}: " + "x" * int(rng.integers(20, 200))}]}
    return {"rollout_id": rid, "call_id": cid, "prompt_ids": prompt,
            "completion_ids": rng.integers(0, VOCAB, k, np.int32),
            "completion_logprobs": -rng.exponential(1.0, k).astype(np.float32),
            "output_items": json.dumps([item])}


def simulate(target_bytes: int, seed: int = 0, shape: Shape | None = None):
    """Yield (calls of the log in capture order with rollouts interleaved, as lists of dicts,
    about GROUP_BYTES of tokens at a time), and the results records, last."""
    shape = shape or Shape()
    rng = np.random.default_rng(seed)
    system = rng.integers(0, VOCAB, shape.system_tokens, np.int32)
    active: list[list] = []
    results, written, r = [], 0, 0
    pending, pending_bytes = [], 0
    while written < target_bytes or active:
        while len(active) < ACTIVE and written < target_bytes:
            rid = f"ro{r:06d}"
            calls = _rollout(rng, rid, system, shape)
            written += sum(4 * (len(c["prompt_ids"]) + 2 * len(c["completion_ids"])) for c in calls)
            results.append(_result(rid, r, calls, rng))
            active.append(calls[::-1])
            r += 1
        k = int(rng.integers(len(active)))
        call = active[k].pop()
        if not active[k]:
            active.pop(k)
        pending.append(call)
        pending_bytes += 4 * (len(call["prompt_ids"]) + 2 * len(call["completion_ids"]))
        if pending_bytes >= GROUP_BYTES:
            yield pending
            pending, pending_bytes = [], 0
    if pending:
        yield pending
    yield results


def _result(rid: str, r: int, calls: list, rng) -> dict:
    output = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "task"}]}]
    for c in calls:
        if "-r" not in c["call_id"]:
            output.extend(json.loads(c["output_items"]))
    return {"rollout_id": rid, "group_id": f"g{r // 8}", "reward": float(rng.random()), "output": output,
            "terminal_response_id": calls[-1]["call_id"]}


def _table(calls: list) -> pa.Table:
    def lists(name, dtype, arrow_type):
        arrays = [c[name] for c in calls]
        off = np.zeros(len(arrays) + 1, np.int64)
        np.cumsum([len(a) for a in arrays], out=off[1:])
        return pa.LargeListArray.from_arrays(pa.array(off), pa.array(np.concatenate(arrays).astype(dtype))).cast(
            pa.list_(arrow_type))

    return pa.table({
        "rollout_id": [c["rollout_id"] for c in calls], "call_id": [c["call_id"] for c in calls],
        "prompt_ids": lists("prompt_ids", np.int32, pa.int32()),
        "completion_ids": lists("completion_ids", np.int32, pa.int32()),
        "completion_logprobs": lists("completion_logprobs", np.float32, pa.float32()),
        "output_items": [c["output_items"] for c in calls],
    })


@jit
def _json_ints(values, offsets, out):
    """Each run values[offsets[i]:offsets[i+1]] as the bytes of a JSON array; returns the end."""
    o = 0
    digits = np.empty(12, np.uint8)
    for i in range(len(offsets) - 1):
        out[o] = 91  # [
        o += 1
        for j in range(offsets[i], offsets[i + 1]):
            if j > offsets[i]:
                out[o] = 44  # ,
                o += 1
            v = values[j]
            if v < 0:
                out[o] = 45
                o += 1
                v = -v
            n = 0
            while True:
                digits[n] = 48 + v % 10
                n += 1
                v //= 10
                if v == 0:
                    break
            for d in range(n - 1, -1, -1):
                out[o] = digits[d]
                o += 1
        out[o] = 93  # ]
        o += 1
    return o


def _ints_json(a: np.ndarray) -> str:
    out = np.empty(12 * len(a) + 2, np.uint8)
    end = _json_ints(a.astype(np.int64), np.array([0, len(a)], np.int64), out)
    return out[:end].tobytes().decode()


def write_call_log(folder: Path, target_bytes: int, seed: int = 0, fmt: str = "parquet",
                   shape: Shape | None = None) -> tuple[Path, Path]:
    """Write a log of about ``target_bytes`` of token and logprob values (and its results file)
    into ``folder``; returns (log path, results path)."""
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / ("calls.parquet" if fmt == "parquet" else "calls.jsonl")
    results_path = folder / "results.jsonl"
    writer = None
    with open(log, "w") if fmt == "jsonl" else _nothing() as text:
        for part in simulate(target_bytes, seed, shape):
            if part and "output" in part[0]:
                results = part
                break
            if fmt == "parquet":
                table = _table(part)
                writer = writer or pq.ParquetWriter(log, table.schema, compression="zstd")
                writer.write_table(table, row_group_size=table.num_rows)
            else:
                for c in part:
                    text.write(f'{{"rollout_id": "{c["rollout_id"]}", "call_id": "{c["call_id"]}", '
                               f'"prompt_ids": {_ints_json(c["prompt_ids"])}, '
                               f'"completion_ids": {_ints_json(c["completion_ids"])}, '
                               f'"completion_logprobs": {json.dumps(c["completion_logprobs"].tolist())}, '
                               f'"output_items": {c["output_items"]}}}\n')
    if writer is not None:
        writer.close()
    with open(results_path, "w") as f:
        for rec in results:
            f.write(json.dumps(rec) + "\n")
    return log, results_path


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False
