"""``export_gym``: the raw JSON Lines that ``import-jsonl`` reads (docs/jsonl.md) -> a NeMo Gym
dump with real digests, hashes and fingerprints (docs/gym.md).

Wire schema 3, digest version 2, extras digest version 1, no extras, weight_version 0. A
ledger record with ``failed: true`` becomes a pending call of its receipt (no CallRecord, no
staged line), so the import masks the rollout ``capture_failed``. The raw ``chain_hash`` is
not exported (Gym has its own hashes; the import recomputes the SPEC one from the tokens).
The whole capture is held in memory; the three files are staged in a hidden directory of the
dump and appear together at the end (receipts last). A failed write (a full disk) is a
WriteError naming the staged file, and leaves no new file in the dump.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from chainrows.formats.gym import wire as W
from chainrows.formats.gym.fingerprints import fingerprint, is_model_authored
from chainrows.formats.jsonl.lines import float_list, int32_list, item_keys, iter_records, kind, string_list
from chainrows.outdir.atomic import notify_committed
from chainrows.outdir.outfile import OutFile

SCHEMA_VERSION = 3
WEIGHT_VERSION = 0


@dataclass
class _Rollout:
    calls: list = field(default_factory=list)  # raw ledger records (dicts), line order
    failed: list = field(default_factory=list)  # call ids of poison records
    result: dict | None = None


def export_gym(ledger_path, tokens_path, results_path, dump_dir: str | os.PathLike) -> dict:
    """Write ``receipts.jsonl``, ``staged.jsonl``, ``results.jsonl`` into ``dump_dir`` (earlier
    files of those names are replaced, other files left alone). Raises
    chainrows.errors.InputError naming the file and line on a malformed record, and a
    WriteError naming the file on a failed write; either leaves the dump as it was. Returns
    counts (rollouts, calls, staged)."""
    rollouts: dict[str, _Rollout] = {}
    for r in iter_records(ledger_path, "ledger"):
        rid, cid = r.string("rollout_id"), r.string("call_id")
        ro = rollouts.setdefault(rid, _Rollout())
        if r.boolean("failed", False):
            ro.failed.append(cid)
            continue
        call = dict(call_id=cid, parent_id=r.string("parent_id", nullable=True, default=None),
                    response_id=r.string("response_id"), prev_len=r.integer("prev_len"),
                    delta_len=r.integer("delta_len"), gen_len=r.integer("gen_len"))
        if not -(1 << 63) <= call["prev_len"] + call["delta_len"] < 1 << 63:
            raise r.error("and prev_len add up beyond the int64 range (a NeMo Gym dump stores the sum as "
                          "cum_len)", "delta_len")
        call["output_items"] = _gym_items(r, "output_items")
        ro.calls.append(call)
    tokens: dict[tuple[str, str], tuple[list, list | None]] = {}
    for r in iter_records(tokens_path, "tokens"):
        key = (r.string("rollout_id"), r.string("call_id"))
        tokens.setdefault(key, (int32_list(r, "tokens") or [],
                                float_list(r, "logprobs") if "logprobs" in r.rec else None))
        rollouts.setdefault(key[0], _Rollout())
    results = []
    for r in iter_records(results_path, "results"):
        rid = r.string("rollout_id")
        result = dict(rollout_id=rid, group_id=r.string("group_id", nullable=True, default=None),
                      reward=r.number("reward"),
                      terminal_response_id=r.string("terminal_response_id", nullable=True, default=None),
                      accepted=string_list(r, "accepted_response_ids") if "accepted_response_ids" in r.rec else None)
        _gym_items(r, "output")  # checked; the raw items are what the dump carries
        result["output"] = r.get("output") or []
        results.append(result)
        ro = rollouts.setdefault(rid, _Rollout())
        ro.result = ro.result or results[-1]
    return _write(Path(dump_dir), rollouts, tokens, results)


def _gym_items(r, field: str) -> list[dict]:
    """``{id, fingerprint}`` of each model-authored item of ``field`` as Gym reads them, refused
    (naming the line and field) where ``import-jsonl`` refuses the items (``item_keys``:
    objects, fingerprints, string ids of the items it calls model-authored) or where
    ``import-gym`` would refuse the dump (Gym's fingerprint, and a string id of every item
    Gym calls model-authored, a user-role ``function_call`` included)."""
    item_keys(r, field)
    refs = []
    for item in r.get(field) or []:
        if not is_model_authored(item):
            continue
        try:
            fp = fingerprint(item)
        except (ValueError, TypeError) as exc:
            raise r.error(f"cannot be fingerprinted: {exc}", field) from exc
        except RecursionError:
            raise r.error("cannot be fingerprinted: nested too deeply", field) from None
        item_id = item.get("id")
        if item_id is not None and not isinstance(item_id, str):
            raise r.error(f"model-authored item {len(refs)} (as NeMo Gym reads them) has an id that is not a "
                          f"string: {kind(item_id)}", field)
        refs.append({"id": item_id, "fingerprint": fp})
    return refs


def _records(rid: str, ro: _Rollout, tokens: dict) -> tuple[list, list]:
    """(CallRecords, staged lines) of one rollout; hashes chained through the parents."""
    by_id = {c["call_id"]: c for c in ro.calls}
    done: dict[str, dict] = {}

    def build(call: dict, depth: int = 0) -> dict:
        if call["call_id"] in done:
            return done[call["call_id"]]
        parent = by_id.get(call["parent_id"]) if call["parent_id"] is not None else None
        p = build(parent, depth + 1) if parent is not None and depth < len(by_id) else None
        ids, lps = tokens.get((rid, call["call_id"]), ([], None))
        n = len(ids)
        gen = min(max(call["gen_len"], 0), n)
        arr = np.array(ids, dtype=np.int64).astype(np.uint64)
        mask = np.concatenate((np.zeros(n - gen), np.ones(gen))).astype(np.float32)
        lp = np.array(lps if lps is not None and len(lps) == n else [0.0] * n, dtype=np.float64)
        with np.errstate(over="ignore"):
            lp32 = lp.astype(np.float32)
        body = W.ids_body(arr)
        full = (p["_full"] if p else []) + [body]
        total = (p["_total"] if p else 0) + n
        root = call["parent_id"] is None
        rec = dict(schema_version=SCHEMA_VERSION, digest_version=W.DIGEST_VERSION,
                   extras_digest_version=W.EXTRAS_DIGEST_VERSION, model_call_id=call["call_id"],
                   parent_call_id=call["parent_id"], mode="text" if root else "token_in",
                   prev_len=call["prev_len"], delta_len=call["delta_len"],
                   cum_len=call["prev_len"] + call["delta_len"], weight_version=WEIGHT_VERSION,
                   extras_digest=W.extras_digest(None),
                   chain_hash=W.hash_parts(W.CHAIN_TAG, W.chain_payload(p["chain_hash"] if p else None, body, n)),
                   cumulative_hash=W.hash_parts(W.PREFIX_TAG, [W.u64(total)] + full))
        ns = SimpleNamespace(rollout_id=rid, **rec)
        rec["digest"] = W.hash_parts(W.CALL_TAG, W.digest_payload(ns, body, W.f32_body(mask), W.f32_body(lp32)))
        rec.update(_full=full, _total=total,
                   _staged=dict(token_ids_delta=list(ids), token_mask_delta=mask.astype(float).tolist(),
                                generation_log_probs_delta=lp32.astype(float).tolist()))
        done[call["call_id"]] = rec
        return rec

    manifest, staged = [], []
    for call in ro.calls:
        rec = build(call)
        shared = {k: v for k, v in rec.items() if not k.startswith("_")}
        manifest.append(dict(shared, staging_key=f"{rid}/{call['call_id']}", response_id=call["response_id"],
                             output_items=call["output_items"]))
        if (rid, call["call_id"]) in tokens:
            staged.append(dict(shared, rollout_id=rid, **rec["_staged"]))
    return manifest, staged


def _write(dump: Path, rollouts: dict, tokens: dict, results: list) -> dict:
    dump.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".chainrows-tmp-", dir=dump))
    counts = dict(rollouts=len(rollouts), calls=0, staged=0)
    token_calls: dict[str, list] = {}
    for rid, cid in tokens:
        token_calls.setdefault(rid, []).append(cid)
    try:
        with OutFile(tmp / "receipts.jsonl", "w", encoding="utf-8") as rf, \
                OutFile(tmp / "staged.jsonl", "w", encoding="utf-8") as sf:
            for rid, ro in rollouts.items():
                manifest, staged = _records(rid, ro, tokens)
                known = {c["call_id"] for c in ro.calls} | set(ro.failed)  # a pending call has no staged line
                for cid in token_calls.get(rid, ()):  # token rows naming no call: orphans
                    if cid not in known:
                        staged.append(_orphan(rid, cid, *tokens[(rid, cid)]))
                terminal = ro.result["terminal_response_id"] if ro.result else None
                term_call = next((c["call_id"] for c in ro.calls if c["response_id"] == terminal), None)
                receipt = dict(rollout_id=rid, reward=ro.result["reward"] if ro.result else None,
                               manifest=manifest, terminal_model_call_id=term_call,
                               pending_call_ids=ro.failed, capture_poisoned=False, failure_reason=None)
                rf.write(json.dumps(receipt) + "\n")
                for line in staged:
                    sf.write(json.dumps(line) + "\n")
                counts["calls"] += len(manifest) + len(ro.failed)
                counts["staged"] += len(staged)
        with OutFile(tmp / "results.jsonl", "w", encoding="utf-8") as out:
            for res in results:
                ro = rollouts[res["rollout_id"]]
                line = dict(rollout_id=res["rollout_id"], group_id=res["group_id"],
                            response={"id": res["terminal_response_id"], "output": res["output"]})
                if res["terminal_response_id"] is not None:
                    line["terminal_response_id"] = res["terminal_response_id"]
                if res["accepted"] is not None:
                    call_of = {c["response_id"]: c["call_id"] for c in ro.calls}
                    line["ng_trajectory"] = {"turns": [{"model_calls": [
                        {"response_id": a, "model_call_id": call_of.get(a)} for a in res["accepted"]]}]}
                out.write(json.dumps(line) + "\n")
        for name in ("staged.jsonl", "results.jsonl", "receipts.jsonl"):  # receipts last
            for old in (dump / name, dump / f"{name}.gz"):
                if old.exists():
                    old.unlink()
            os.replace(tmp / name, dump / name)
        notify_committed(dump)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(tmp, ignore_errors=True)
    return counts


def _orphan(rid: str, cid: str, ids: list, lps: list | None) -> dict:
    """A staged line for a token row no ledger record names (the import counts it an orphan)."""
    n = len(ids)
    lp = [float(np.float32(x)) for x in lps] if lps is not None and len(lps) == n else [0.0] * n
    return dict(schema_version=SCHEMA_VERSION, digest_version=W.DIGEST_VERSION,
                extras_digest_version=W.EXTRAS_DIGEST_VERSION, rollout_id=rid, model_call_id=cid,
                parent_call_id=None, mode="text", prev_len=0, delta_len=n, cum_len=n,
                weight_version=WEIGHT_VERSION, digest="0" * 64, extras_digest=W.extras_digest(None),
                chain_hash=None, cumulative_hash=None, token_ids_delta=list(ids),
                token_mask_delta=[0.0] * n, generation_log_probs_delta=lp)


__all__ = ["export_gym"]
