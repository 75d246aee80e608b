"""chainrows.formats.gym: NeMo Gym dumps (docs/gym.md): byte layouts, verification, import, export."""

from __future__ import annotations

import gzip
import json
import random
import re
import shutil
import struct
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chainrows
from chainrows.cli import main
from chainrows.errors import InputError
from chainrows.formats.gym import export_gym, import_gym
from chainrows.formats.gym import verify as V
from chainrows.formats.gym import wire as W
from chainrows.formats.gym.fingerprints import fingerprint
from chainrows.formats.jsonl import import_jsonl_to_dataset
from chainrows.formats.native.dataset import read_dataset
from tests.support.json_numbers import float_literals
from tests.support.jsonl_doc import doc_files
from tests.support.paths import REPO
from tests.support.peaks import at_smallest_budget
from tests.support.profiles import examples

ROOT = REPO
VECTORS = Path(__file__).resolve().parent / "vectors"
EXAMPLE = ROOT / "examples" / "gym"


# ----------------------------------------------------------------------------- helpers

def _doc_raw(tmp_path: Path) -> dict:
    """The docs/jsonl.md example (the README's worked example, rollout r1) as raw files."""
    return doc_files(tmp_path)


def _export(tmp_path: Path, raw: dict, name: str = "dump") -> Path:
    dump = tmp_path / name
    export_gym(raw["ledger"], raw["tokens"], raw["results"], dump)
    return dump


def _read(dump: Path, name: str) -> list:
    return [json.loads(line) for line in (dump / f"{name}.jsonl").read_text().splitlines() if line.strip()]


def _write(dump: Path, name: str, lines: list) -> None:
    (dump / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def _digest(staged: dict) -> str:
    """The staging digest of a staged line as it now is."""
    ns = SimpleNamespace(**staged)
    tokens = np.array(staged["token_ids_delta"], dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        lp = np.array(staged["generation_log_probs_delta"], np.float64).astype(np.float32)
    parts = W.digest_payload(ns, W.ids_body(tokens), W.f32_body(np.array(staged["token_mask_delta"], np.float32)),
                             W.f32_body(lp))
    return W.hash_parts(W.CALL_TAG, parts)


def _edit(dump: Path, call: str, staged_fn=None, record_fn=None, redigest=True) -> None:
    """Change call ``call``'s staged line and/or CallRecord; ``redigest``: recompute the staging
    digest after the edit and store it in both, so only the edited check can fail."""
    staged = _read(dump, "staged")
    receipts = _read(dump, "receipts")
    st = next(s for s in staged if s["model_call_id"] == call)
    rec = next(r for rc in receipts for r in rc["manifest"] if r["model_call_id"] == call)
    if staged_fn:
        staged_fn(st)
    if record_fn:
        record_fn(rec)
    if redigest:
        st["digest"] = rec["digest"] = _digest(st)
    _write(dump, "staged", staged)
    _write(dump, "receipts", receipts)


def _report(dataset: Path, **options) -> dict:
    _, report = chainrows.reassemble(str(dataset), **options)
    return {r["rollout_id"]: r for r in report.to_pylist()}


def _outcome(dataset: Path, **options):
    """Everything reassemble decides: report (minus nothing) and rows, sorted."""
    rows, report = chainrows.reassemble(str(dataset), **options)
    return report.to_pylist(), rows.to_pylist()


# ----------------------------------------------------------------------------- byte layouts

@pytest.mark.parametrize("schema", [2, 3])
def test_golden_vectors(schema):
    g = json.loads((VECTORS / f"golden_vectors_schema{schema}.json").read_text())
    assert W.extras_digest(g["extras"]) == g["extras_digest"]
    st = g["staged_call"]
    assert st["schema_version"] == schema
    assert _digest(st) == g["staged_call_digest"]
    # and through the verifier: only the (fake) chain and cumulative hashes can fail
    assert _digest(dict(st, schema_version=5 - schema)) != g["staged_call_digest"]


def _two_call_staged():
    c1 = dict(schema_version=3, digest_version=2, extras_digest_version=1, rollout_id="g7_r0",
              model_call_id="c1", parent_call_id=None, mode="text", prev_len=0, delta_len=4, cum_len=4,
              weight_version=4, token_ids_delta=[10, 11, 12, 13], token_mask_delta=[0.0, 0.0, 1.0, 1.0],
              generation_log_probs_delta=[0.0, 0.0, -0.1, -0.2])
    c2 = dict(c1, model_call_id="c2", parent_call_id="c1", mode="token_in", prev_len=4, delta_len=3,
              cum_len=7, token_ids_delta=[20, 21, 22], token_mask_delta=[0.0, 1.0, 1.0],
              generation_log_probs_delta=[0.0, -0.3, -0.4])
    return c1, c2


def test_two_call_example_of_nemo_gym_section_2():
    c1, c2 = _two_call_staged()
    t1, t2 = (np.array(c["token_ids_delta"], dtype=np.uint64) for c in (c1, c2))
    ch1 = W.hash_parts(W.CHAIN_TAG, W.chain_payload(None, W.ids_body(t1), 4))
    ch2 = W.hash_parts(W.CHAIN_TAG, W.chain_payload(ch1, W.ids_body(t2), 3))
    cum1 = W.hash_parts(W.PREFIX_TAG, [W.u64(4), W.ids_body(t1)])
    cum2 = W.hash_parts(W.PREFIX_TAG, [W.u64(7), W.ids_body(t1), W.ids_body(t2)])
    assert ch1 == "3b35e8ac08b0631708e2f37850057145e3bd449817ea66f71fe0ed310d218473"
    assert cum1 == "3a9f2bfa5638908f07d82e5f3cd5bb2eca6f4fe122a89f62946ba6d01c9ffe07"
    assert ch2 == "8a4f4bb09c51870015a9404320b9a1bfded4ff20c802662a5865ac9a742c6643"
    assert cum2 == "ef8f87ef531c256298e99f8998e2a1c0c4f374cdb71ddbe21c7abbf9f9c5a795"
    extras = W.extras_digest(None)
    for c, ch, cum in ((c1, ch1, cum1), (c2, ch2, cum2)):
        c.update(extras_digest=extras, chain_hash=ch, cumulative_hash=cum)
    assert _digest(c1) == "b7fbd2781e2a4f2ee8a0041ed3957ec012cd47736d63152e66c50d30e7e7fd53"
    assert _digest(c2) == "d70b37c954cde92db732c632212bad78229ff73a84888fe33da0aed737819a56"


def test_two_call_example_imports_verified(tmp_path):
    """The same two calls as a hand-written dump: both verify, and the row is their deltas."""
    c1, c2 = _two_call_staged()
    extras = W.extras_digest(None)
    c1.update(extras_digest=extras, chain_hash="3b35e8ac08b0631708e2f37850057145e3bd449817ea66f71fe0ed310d218473",
              cumulative_hash="3a9f2bfa5638908f07d82e5f3cd5bb2eca6f4fe122a89f62946ba6d01c9ffe07",
              digest="b7fbd2781e2a4f2ee8a0041ed3957ec012cd47736d63152e66c50d30e7e7fd53")
    c2.update(extras_digest=extras, chain_hash="8a4f4bb09c51870015a9404320b9a1bfded4ff20c802662a5865ac9a742c6643",
              cumulative_hash="ef8f87ef531c256298e99f8998e2a1c0c4f374cdb71ddbe21c7abbf9f9c5a795",
              digest="d70b37c954cde92db732c632212bad78229ff73a84888fe33da0aed737819a56")
    answer = {"type": "message", "role": "assistant", "id": "m2", "content": [{"type": "output_text", "text": "A"}]}
    step = {"type": "function_call", "call_id": "tool", "name": "step", "arguments": "{}"}
    fp = {"m1": fingerprint(step), "m2": fingerprint(answer)}
    keep = ("schema_version", "digest_version", "extras_digest_version", "model_call_id", "parent_call_id",
            "mode", "prev_len", "delta_len", "cum_len", "weight_version", "digest", "extras_digest",
            "chain_hash", "cumulative_hash")
    manifest = [dict({k: c[k] for k in keep}, staging_key=f"g7_r0/{c['model_call_id']}",
                     response_id=f"resp-{c['model_call_id']}",
                     output_items=[{"id": item, "fingerprint": fp[item]}])
                for c, item in ((c1, "m1"), (c2, "m2"))]
    dump = tmp_path / "dump"
    dump.mkdir()
    _write(dump, "receipts", [dict(rollout_id="g7_r0", reward=1.0, manifest=manifest,
                                   terminal_model_call_id="c2", pending_call_ids=[], capture_poisoned=False,
                                   failure_reason=None)])
    _write(dump, "staged", [c2, c1])
    _write(dump, "results", [dict(rollout_id="g7_r0", group_id="g7",
                                  response={"id": "resp-c2", "output": [dict(step, id="m1"), answer]})])
    summary = import_gym(dump, tmp_path / "ds")
    assert (summary.verified, dict(summary.failures)) == (2, {})
    rows, report = chainrows.reassemble(str(tmp_path / "ds"))
    assert report.column("status").to_pylist() == ["ok"]
    assert rows.column("input_ids").to_pylist() == [[10, 11, 12, 13, 20, 21, 22]]
    assert rows.column("loss_mask").to_pylist() == [[0, 0, 1, 1, 0, 1, 1]]
    assert np.allclose(rows.column("logprobs").to_pylist()[0], np.float32([0, 0, -0.1, -0.2, 0, -0.3, -0.4]))


def test_fingerprint_samples_of_nemo_gym_section_3():
    """Section 3's samples (an independent reading of Gym, not yet checked against its runtime)."""
    message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A"}]}
    assert fingerprint(message) == "9c28815070fefb9258ced57b2cc37a77ac63648220bef3336440d19f49c7c5c1"
    assert fingerprint(dict(message, content="A", id="msg_1", status="completed")) == fingerprint(message)
    call = {"type": "function_call", "call_id": "tool", "name": "step", "arguments": "{}"}
    assert fingerprint(call) == "ba8d0a8f6f5d8ee27174d15f887b183bbe33e1a2918e81dc9afa439865c6ec76"
    assert fingerprint(dict(call, arguments={})) == fingerprint(call)  # canonical arguments
    assert fingerprint(dict(call, namespace="ns")) != fingerprint(call)
    reasoning = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]}
    assert fingerprint(reasoning) == "4b3255a4d475d16096c5077c1134075f45c53b6178fec7e4d1ff62f975f6b05a"
    assert fingerprint(dict(reasoning, id="rs_1", generation_token_ids=[1, 2], encrypted_content=None)) \
        == fingerprint(reasoning)


@pytest.mark.parametrize("seed", range(20))
def test_batch_array_checks_match_their_per_call_definition(seed):
    """verify._Arrays decides the id, mask and logprob checks of a whole batch in numpy passes;
    each flag must equal its plain per-call definition (random calls, empty ones and
    mismatched lengths included)."""
    rng = random.Random(seed)
    calls = []
    for _ in range(rng.randint(0, 12)):
        n = rng.choice((0, 1, 2, 5, 9))
        shape = rng.choice(("ok", "ok", "zeros", "ones", "mixed", "junk"))
        carry = rng.randint(0, n)
        mask = {"ok": [0.0] * carry + [1.0] * (n - carry), "zeros": [0.0] * n, "ones": [1.0] * n,
                "mixed": [rng.choice((0.0, 1.0)) for _ in range(n)],
                "junk": [rng.choice((0.0, 1.0, 0.5, -1.0)) for _ in range(n)]}[shape]
        if rng.random() < 0.15:
            mask = mask + [1.0]
        lp = [0.0 if m == 0.0 and rng.random() < 0.8 else rng.choice((-0.5, 0.0, float("nan"), -1e39))
              for m in mask]
        if rng.random() < 0.15:
            lp = lp[:-1]
        ids = [rng.choice((3, 7, 2**31 - 1, 2**31, 2**40)) for _ in range(n)]
        calls.append(SimpleNamespace(tokens=np.array(ids, np.uint64), mask=np.array(mask, np.float64),
                                     logprobs=np.array(lp, np.float64)))
    arrays = V._Arrays(calls)
    for i, c in enumerate(calls):
        gen = int(np.count_nonzero(c.mask == 1.0))
        carry = len(c.mask) - gen
        valid = gen > 0 and list(c.mask) == [0.0] * carry + [1.0] * gen
        with np.errstate(over="ignore", invalid="ignore"):
            lp32 = c.logprobs.astype(np.float32)
        assert arrays.gen_len[i] == gen
        assert arrays.mask_bad[i] == (not valid)
        assert arrays.beyond_int32[i] == bool(np.any(c.tokens > 2**31 - 1))
        assert arrays.lp_nonfinite[i] == (not np.isfinite(lp32).all())
        if len(c.mask) == len(c.logprobs):
            assert arrays.lp_carry[i] == bool(np.any(lp32[:carry] != 0.0)) or not valid
        assert list(arrays.checked(i, None).tokens) == list(c.tokens.astype(np.uint32).view(np.int32))
        body, mask_body, lp_body = arrays.digest_bodies(i)
        assert bytes(body) == W.ids_body(c.tokens) and bytes(lp_body) == W.f32_body(lp32)
        assert bytes(mask_body) == W.f32_body(c.mask.astype(np.float32))


def test_extras_encoding():
    assert W.enc({"b": [True, None], "a": 1.5}) == (
        b"D" + W.u64(2) + W.text("a") + b"F" + struct.pack(">d", 1.5)
        + W.text("b") + b"L" + W.u64(2) + b"B\x01" + b"N")
    assert W.enc(-2) == b"I" + (-2).to_bytes(8, "big", signed=True)
    for bad in (float("nan"), 1 << 63, (1, 2)):
        with pytest.raises(W.ExtrasError):
            W.enc(bad)


# ----------------------------------------------------------------------------- import

def test_exported_worked_example_imports_verified(tmp_path):
    raw = _doc_raw(tmp_path)
    dump = _export(tmp_path, raw)
    summary = import_gym(dump, tmp_path / "ds")
    assert (summary.receipts, summary.results, summary.calls, summary.staged) == (1, 1, 5, 5)
    assert (summary.verified, sum(summary.failures.values()), summary.orphan_staged, summary.without_result) == (5, 0, 0, 0)
    report = _report(tmp_path / "ds")
    assert (report["r1"]["status"], report["r1"]["num_rows"], report["r1"]["num_selected"]) == ("ok", 2, 4)


INTEGRITY_FAILURES = {
    # check text: (call, staged edit, record edit, redigest)
    V.DIGEST: ("c5", lambda s: s.update(digest="ab" * 32), lambda r: r.update(digest="ab" * 32), False),
    V.CHAIN: ("c5", lambda s: s.update(chain_hash="cd" * 32), lambda r: r.update(chain_hash="cd" * 32), True),
    V.CUMULATIVE: ("c2", lambda s: s.update(cumulative_hash="ef" * 32),
                   lambda r: r.update(cumulative_hash="ef" * 32), True),
    V.EXTRAS: ("c5", lambda s: s.update(extras={"routed_experts": [[1, 2]]}), None, True),
    V.MASK: ("c5", lambda s: s.update(token_mask_delta=[1.0, 0.0, 1.0]), None, True),
    V.LOGPROB_CARRY: ("c5", lambda s: s["generation_log_probs_delta"].__setitem__(0, -0.5), None, True),
    V.DISAGREE.format("weight_version"): ("c5", lambda s: s.update(weight_version=9), None, False),
    V.TOKEN_INT32: ("c5", lambda s: s["token_ids_delta"].__setitem__(1, 2**31), None, True),
}


@pytest.mark.parametrize("check", list(INTEGRITY_FAILURES))
def test_each_integrity_failure_masks_the_rollout_naming_the_check(tmp_path, check):
    call, staged_fn, record_fn, redigest = INTEGRITY_FAILURES[check]
    dump = _export(tmp_path, _doc_raw(tmp_path))
    _edit(dump, call, staged_fn, record_fn, redigest)
    summary = import_gym(dump, tmp_path / "ds")
    assert dict(summary.failures) == {check: 1}
    assert summary.verified == 4
    r1 = _report(tmp_path / "ds")["r1"]
    assert (r1["status"], r1["reason"]) == ("masked", "hash_mismatch")
    assert r1["detail"] == f"integrity_error is set: call {call}: {check}"


def test_unselected_corrupt_call_masks_nothing(tmp_path):
    """c4 is the rejected retry: its failed digest is counted, the rollout stays ok."""
    dump = _export(tmp_path, _doc_raw(tmp_path))
    _edit(dump, "c4", lambda s: s["token_ids_delta"].__setitem__(0, 7), None, redigest=False)
    summary = import_gym(dump, tmp_path / "ds")
    assert dict(summary.failures) == {V.CHAIN: 1}
    assert _report(tmp_path / "ds")["r1"]["status"] == "ok"


def _edited_raw(tmp_path: Path, name: str, edit) -> dict:
    """The docs/jsonl.md example with ``edit`` applied to the first record of file ``name``."""
    raw = _doc_raw(tmp_path)
    records = [json.loads(line) for line in raw[name].read_text().splitlines() if line.strip()]
    edit(records[0])
    raw[name].write_text("".join(json.dumps(x) + "\n" for x in records))
    return raw


@pytest.mark.parametrize("field, check", [("prev_len", V.RANGE), ("delta_len", V.LENGTHS)])
def test_a_negative_length_is_exported_and_fails_its_import_check(tmp_path, field, check):
    """import-jsonl takes a negative length (the engine masks the rollout); the exporter writes
    it too (its digest packs the length wrapped, as a negative token id is) and the import
    names the check the call fails, instead of the export stopping on an internal error."""
    dump = _export(tmp_path, _edited_raw(tmp_path, "ledger", lambda call: call.update({field: -1})))
    assert dict(import_gym(dump, tmp_path / "ds").failures) == {check: 1}


def _nested(depth: int) -> dict:
    value: object = 1
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("name, edit, what", [
    ("results", lambda r: r.update(output=[1]), "field 'output' item 0 must be an object"),
    ("results", lambda r: r["output"][1].update(deep=_nested(500)),
     "field 'output' cannot be fingerprinted: nested too deeply"),
    ("ledger", lambda c: c["output_items"][0].update(id=5), "has an id that is not a string: the number 5"),
    ("ledger", lambda c: c["output_items"][1].update(extra=float("nan")),  # a message: Gym hashes its content only
     "field 'output_items' cannot be fingerprinted"),
])
def test_export_refuses_the_items_import_jsonl_refuses(tmp_path, name, edit, what):
    """An export that succeeded here gave a dump the import refused, naming the dump instead of
    the user's file."""
    raw = _edited_raw(tmp_path, name, edit)
    for convert in (lambda: import_jsonl_to_dataset(raw["ledger"], raw["tokens"], raw["results"], tmp_path / "ds"),
                    lambda: _export(tmp_path, raw)):
        with pytest.raises(InputError, match=re.escape(what)) as err:
            convert()
        assert f"{name}: line 1:" in str(err.value) and str(raw[name]) in str(err.value)
    assert not any((tmp_path / "dump").glob("*.jsonl"))


def test_export_refuses_an_item_id_import_gym_would_refuse(tmp_path):
    """Gym reads a user-role function_call as model-authored, chainrows' SPEC does not: import-jsonl
    takes its numeric id, the dump's import would not (review of the fuzzing fixes)."""
    item = {"role": "user", "type": "function_call", "id": 5}
    raw = _edited_raw(tmp_path, "results", lambda r: r["output"].append(item))
    import_jsonl_to_dataset(raw["ledger"], raw["tokens"], raw["results"], tmp_path / "ds")
    with pytest.raises(InputError, match="as NeMo Gym reads them. has an id that is not a string") as err:
        _export(tmp_path, raw)
    assert "results: line 1: field 'output'" in str(err.value)


def test_export_refuses_lengths_whose_sum_leaves_int64(tmp_path):
    """cum_len = prev_len + delta_len must be an int64 for the dump's import to read it at all."""
    raw = _edited_raw(tmp_path, "ledger", lambda call: call.update(prev_len=2**63 - 1, delta_len=5))
    with pytest.raises(InputError, match="field 'delta_len' and prev_len add up beyond the int64 range") as err:
        _export(tmp_path, raw)
    assert "ledger: line 1:" in str(err.value)


def test_more_structural_failures(tmp_path):
    """Lengths, root shape, u64 range and the staging key, one call each (fresh dump per edit)."""
    cases = {
        V.LENGTHS: lambda s: s.update(token_mask_delta=s["token_mask_delta"][:-1]),
        V.CUM_LEN: lambda s: s.update(cum_len=s["cum_len"] + 1),
        V.ROOT_SHAPE: lambda s: s.update(mode="text"),
        V.TOKEN_U64: lambda s: s["token_ids_delta"].__setitem__(0, -1),
        V.LOGPROB_FINITE: lambda s: s["generation_log_probs_delta"].__setitem__(2, -1e39),
    }
    for k, (check, fn) in enumerate(cases.items()):
        dump = _export(tmp_path, _doc_raw(tmp_path), f"dump{k}")
        _edit(dump, "c2", fn, lambda r, fn=fn: fn(r) if check in (V.CUM_LEN, V.ROOT_SHAPE) else None)
        summary = import_gym(dump, tmp_path / f"ds{k}")
        assert dict(summary.failures) == {check: 1}, check
    dump = _export(tmp_path, _doc_raw(tmp_path), "dump-key")
    _edit(dump, "c2", None, lambda r: r.update(staging_key="r1/other"), redigest=False)
    assert dict(import_gym(dump, tmp_path / "ds-key").failures) == {V.STAGING_KEY: 1}


def test_ledger_mapping_and_chain_hash(tmp_path):
    """gen_len is the mask's 1.0 count; chain_hash the SPEC XXH3 chain over the tokens;
    item keys the fingerprints' first 8 bytes; the integrity_error column is written."""
    dump = _export(tmp_path, _doc_raw(tmp_path))
    import_gym(dump, tmp_path / "ds")
    ds = read_dataset(tmp_path / "ds")
    ledger = {r["call_id"]: r for r in ds.ledger.to_pylist()}
    tokens = {r["call_id"]: r["tokens"] for r in ds.tokens.to_pylist()}
    seed1 = xxhash.xxh3_64_intdigest(np.array(tokens["c1"], "<i4").tobytes(), 0)
    assert ledger["c1"]["chain_hash"] == seed1
    assert ledger["c2"]["chain_hash"] == xxhash.xxh3_64_intdigest(np.array(tokens["c2"], "<i4").tobytes(), seed1)
    assert [ledger[c]["gen_len"] for c in ("c1", "c2", "c3", "c4", "c5")] == [2, 2, 2, 2, 2]
    records = {r["model_call_id"]: r for r in _read(dump, "receipts")[0]["manifest"]}
    assert ledger["c3"]["item_keys"] == [int(i["fingerprint"][:16], 16) for i in records["c3"]["output_items"]]
    assert ledger["c3"]["item_ids"] == ["rs_3", "msg_3"]
    assert ledger["c1"]["integrity_error"] is None


def test_poisoned_receipts_and_pending_calls_give_capture_failed(tmp_path):
    raw = _doc_raw(tmp_path)
    lines = raw["results"].read_text().splitlines()
    base = json.loads(lines[0])
    raw["results"].write_text("".join(json.dumps(dict(base, rollout_id=r)) + "\n" for r in ("r1", "r2", "r3", "r4")))
    led = [json.loads(x) for x in raw["ledger"].read_text().splitlines()]
    tok = [json.loads(x) for x in raw["tokens"].read_text().splitlines()]
    raw["ledger"].write_text("".join(json.dumps(dict(x, rollout_id=r)) + "\n" for r in ("r1", "r2", "r3", "r4") for x in led))
    raw["tokens"].write_text("".join(json.dumps(dict(x, rollout_id=r)) + "\n" for r in ("r1", "r2", "r3", "r4") for x in tok))
    dump = _export(tmp_path, raw)
    receipts = _read(dump, "receipts")
    by = {rc["rollout_id"]: rc for rc in receipts}
    by["r2"].update(capture_poisoned=True, failure_reason="tokenizer drift")
    by["r3"]["pending_call_ids"] = ["c5"]  # a recorded call still pending
    by["r4"]["pending_call_ids"] = ["c9"]  # a call that never got a record
    _write(dump, "receipts", receipts)
    summary = import_gym(dump, tmp_path / "ds")
    assert summary.calls == 4 * 5 + 1
    report = _report(tmp_path / "ds")
    assert report["r1"]["status"] == "ok"
    for rid, call in (("r2", "c1"), ("r3", "c5"), ("r4", "c9")):
        assert (report[rid]["reason"], report[rid]["detail"]) == ("capture_failed", f"capture failed (failed = true): call {call}")


def test_orphans_and_rollouts_without_result(tmp_path):
    dump = _export(tmp_path, _doc_raw(tmp_path))
    staged = _read(dump, "staged")
    _write(dump, "staged", staged + [dict(staged[0], model_call_id="ghost"), dict(staged[0], rollout_id="r9")])
    receipts = _read(dump, "receipts")
    _write(dump, "receipts", receipts + [dict(receipts[0], rollout_id="r8")])
    summary = import_gym(dump, tmp_path / "ds")
    assert (summary.orphan_staged, summary.without_result, summary.staged) == (2, 1, 7)  # ghost, r9; r8
    report = _report(tmp_path / "ds")
    assert report["r8"]["reason"] == "no_rollout_record"  # its calls are kept, and explained
    assert report["r9"]["reason"] == "no_rollout_record"
    assert report["r1"]["status"] == "ok"  # the ghost token row is an ignored orphan


def test_any_staged_order_gzip_and_buckets_give_the_same_dataset(tmp_path):
    raw = _random_raw(tmp_path, seed=5, n_rollouts=30)
    dump = _export(tmp_path, raw)
    import_gym(dump, tmp_path / "plain")
    want = _outcome(tmp_path / "plain")
    assert sum(r["status"] == "ok" for r in want[0]) > 5
    shuffled = tmp_path / "shuffled"
    shutil.copytree(dump, shuffled)
    lines = (shuffled / "staged.jsonl").read_text().splitlines()
    random.Random(1).shuffle(lines)
    (shuffled / "staged.jsonl").write_text("\n".join(lines) + "\n")
    for name in ("receipts", "staged", "results"):
        src = shuffled / f"{name}.jsonl"
        with gzip.open(shuffled / f"{name}.jsonl.gz", "wb") as out:
            out.write(src.read_bytes())
        src.unlink()
    summary = import_gym(shuffled, tmp_path / "gz")
    assert summary.buckets == 1
    assert _outcome(tmp_path / "gz") == want
    summary = import_gym(shuffled, tmp_path / "bucketed", buckets=16, threads=2)
    assert summary.buckets == 16
    assert (tmp_path / "bucketed" / "ledger").is_dir()  # one part per bucket
    assert _outcome(tmp_path / "bucketed") == want


def test_hashing_on_the_pool_gives_what_hashing_inline_gives(tmp_path, monkeypatch):
    """Every hash on the pool in tiny chunks (threads 2) or all inline (threads 1): the same
    integrity_error per call, first failing check first (c5 below fails three hash checks)."""
    raw = _random_raw(tmp_path, seed=11, n_rollouts=12)
    dump = _export(tmp_path, raw)
    staged = _read(dump, "staged")
    for k, call in enumerate(staged[::3]):
        call["token_ids_delta"][0] += 1  # chain, cumulative and staging digest all fail
        if k % 2:
            call["extras"] = {"k": k}  # and the extras digest, queued first
    _write(dump, "staged", staged)
    from chainrows.formats.gym import verify

    import_gym(dump, tmp_path / "inline", threads=1)
    monkeypatch.setattr(verify, "POOL_MIN_BYTES", 0)
    monkeypatch.setattr(verify, "CHUNK_BYTES", 300)
    import_gym(dump, tmp_path / "pool", threads=2)
    errors = [read_dataset(tmp_path / d).ledger.column("integrity_error").to_pylist()
              for d in ("inline", "pool")]
    assert errors[0] == errors[1]
    assert {V.EXTRAS, V.CHAIN} <= set(errors[0])


# ----------------------------------------------------------------------------- malformed input

def _deep_output(line: str) -> str:
    """The line with 900 nested arrays inside its first model-authored output item's fields."""
    rec = json.loads(line)
    item = next(i for i in rec["response"]["output"] if i.get("type") == "reasoning")
    item["summary"] = item.get("summary", []) + ["N"]
    return json.dumps(rec).replace('"N"', "[" * 900 + "]" * 900)


MALFORMED = [
    ("receipts", 1, lambda lines: ["{not json"] + lines[1:], "invalid JSON"),
    ("staged", 3, lambda lines: lines[:2] + ["[1, 2]"] + lines[3:], "expected a JSON object"),
    ("staged", 2, lambda lines: lines[:1] + [json.dumps({k: v for k, v in json.loads(lines[1]).items()
                                                         if k != "model_call_id"})] + lines[2:],
     "field 'model_call_id' is missing"),
    ("staged", 4, lambda lines: lines[:3] + [json.dumps(dict(json.loads(lines[3]), token_ids_delta=[1, "2"]))]
     + lines[4:], "field 'token_ids_delta' entry 1 must be an integer"),
    ("staged", 5, lambda lines: lines[:4] + [json.dumps(dict(json.loads(lines[4]), token_ids_delta=[1, True]))]
     + lines[5:], "field 'token_ids_delta' entry 1 must be an integer, got a boolean"),
    ("staged", 5, lambda lines: lines[:4] + [json.dumps(dict(json.loads(lines[4]), token_ids_delta=[1, 2.0]))]
     + lines[5:], "field 'token_ids_delta' entry 1 must be an integer, got the number 2.0"),
    ("staged", 1, lambda lines: [json.dumps(dict(json.loads(lines[0]), token_mask_delta=[0, False]))] + lines[1:],
     "field 'token_mask_delta' entry 1 must be a number, got a boolean"),
    # nested arrays: numpy would read a rectangular one as 2-D and refuse a ragged one
    ("staged", 4, lambda lines: lines[:3] + [json.dumps(dict(json.loads(lines[3]), token_ids_delta=[[1, 2], [3, 4]]))]
     + lines[4:], "field 'token_ids_delta' entry 0 must be an integer"),
    ("staged", 4, lambda lines: lines[:3] + [json.dumps(dict(json.loads(lines[3]), token_ids_delta=[[1], [2, 3]]))]
     + lines[4:], "field 'token_ids_delta' entry 0 must be an integer"),
    ("staged", 2, lambda lines: lines[:1] + [json.dumps(dict(json.loads(lines[1]),
                                                             generation_log_probs_delta=[[0.0], [0.1, 0.2]]))]
     + lines[2:], "field 'generation_log_probs_delta' entry 0 must be a number"),
    ("staged", 2, lambda lines: lines[:1] + [json.dumps(dict(json.loads(lines[1]), token_mask_delta=[[0, 1]]))]
     + lines[2:], "field 'token_mask_delta' entry 0 must be a number"),
    # a line nested too deeply for json.loads (RecursionError): a form error like any other
    ("staged", 2, lambda lines: lines[:1] + ['{"a": ' + "[" * 200_000 + "]" * 200_000 + "}"] + lines[2:],
     "invalid JSON: nested too deeply"),
    ("receipts", 1, lambda lines: [json.dumps(dict(json.loads(lines[0]), reward="high"))], "field 'reward'"),
    # JSON that parses but that Python cannot carry on with (each was an internal error, exit 1)
    ("receipts", 1, lambda lines: [json.dumps(dict(json.loads(lines[0]), rollout_id="\ud800"))] + lines[1:],
     "invalid JSON: a string holds a lone UTF-16 surrogate (not Unicode text)"),
    ("receipts", 1, lambda lines: [json.dumps(dict(json.loads(lines[0]), reward="R")).replace('"R"', "1" + "0" * 400)]
     + lines[1:], "field 'reward' is beyond the float64 range"),
    ("results", 1, lambda lines: [_deep_output(lines[0])] + lines[1:], "output cannot be fingerprinted: nested too deeply"),
    ("results", 1, lambda lines: [json.dumps(dict(json.loads(lines[0]), response=[]))], "field 'response'"),
]


@pytest.mark.parametrize("bucketed", [False, True])
@pytest.mark.parametrize("name,line,edit,message", MALFORMED)
def test_malformed_line_exits_2_naming_file_and_line_and_writes_nothing(tmp_path, capsys, name, line, edit,
                                                                         message, bucketed):
    dump = _export(tmp_path, _doc_raw(tmp_path))
    path = dump / f"{name}.jsonl"
    path.write_text("\n".join(edit(path.read_text().splitlines())) + "\n")
    out = tmp_path / "ds"
    argv = ["import-gym", str(dump), str(out)] + (["--buckets", "4"] if bucketed else [])  # several on a tiny dump
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert "\n" not in err and f"line {line}:" in err and message in err and str(path) in err, err
    assert not out.exists()


def test_a_deep_line_does_not_hide_an_earlier_lines_error(tmp_path, capsys):
    """The fast reader parses a block of lines before handing any out: a later line too deep
    for json.loads must fall back, so the first bad line is still the one named."""
    dump = _export(tmp_path, _doc_raw(tmp_path))
    path = dump / "staged.jsonl"
    lines = path.read_text().splitlines()
    lines[0] = json.dumps(dict(json.loads(lines[0]), prev_len="0"))
    lines[1] = lines[1].rstrip()[:-1] + ', "a": ' + "[" * 200_000 + "]" * 200_000 + "}"  # arrays kept
    path.write_text("\n".join(lines) + "\n")
    assert main(["import-gym", str(dump), str(tmp_path / "ds")]) == 2
    err = capsys.readouterr().err
    assert "staged: line 1: field 'prev_len'" in err and "\n" not in err.strip(), err


def test_budget_below_the_process_is_refused_up_front(tmp_path, capsys):
    """As reassemble does (chainrows.memory.budget): a budget the process itself cannot fit is
    unusable input, exit 2, one line naming the smallest budget that works, and nothing
    written; a budget just above it is then accepted."""
    dump = EXAMPLE / "dump"
    out = tmp_path / "ds"
    assert main(["import-gym", str(dump), str(out), "--memory-budget", "1MiB"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "chainrows: error: --memory-budget 1 MiB is below what this process needs: "), err
    assert not out.exists()
    smallest = int(err.strip().rsplit(" is ", 1)[1].split()[0].replace(",", ""))
    # the process's RSS moves a few MiB between measures: leave it that margin
    assert main(["import-gym", str(dump), str(out), "--memory-budget", f"{smallest + 32}MiB"]) == 0
    with pytest.raises(InputError, match=r"the smallest budget that works here is"):
        import_gym(dump, tmp_path / "api", memory_budget=smallest << 19)  # half of it


def test_buckets_are_sized_by_the_room_above_the_baseline():
    """PEAK_FACTOR times a bucket's staged JSON within SHARE of the room (the budget above the
    process's own size): sized by the whole budget, a 366 MiB budget peaked at 435 MiB."""
    from chainrows.formats.gym.importer import MAX_BUCKETS, PEAK_FACTOR, SHARE, bucket_count

    room = 800 << 20
    share = int(SHARE * room / PEAK_FACTOR)
    assert bucket_count(share, room) == 1
    assert bucket_count(share + 1, room) == 2
    assert bucket_count(10 * share, room) == 10
    assert bucket_count(10 * share, room // 2) == 20  # half the room: twice the buckets
    assert bucket_count(1 << 40, room) == MAX_BUCKETS


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmHWM from /proc")
def test_import_at_the_smallest_budget_stays_under_it(tmp_path):
    """An agent-shaped dump of 91 MB of staged JSON imported at the smallest budget the process
    names (plus the few MiB another process's baseline may differ by), in a fresh process that
    reads its own VmHWM: the peak stays under. Buckets sized by an eighth of the whole budget
    put 45 MiB of JSON in each at 366 MiB and peaked at 435 MiB."""
    from asv_benchmarks.gym import _write_raw

    _write_raw(tmp_path, 800, 1)
    dump = tmp_path / "dump"
    export_gym(tmp_path / "ledger.jsonl", tmp_path / "tokens.jsonl", tmp_path / "results.jsonl", dump)

    budget, peak, res = at_smallest_budget("import-gym", dump, tmp_path)
    assert peak < budget << 20, f"peak RSS {peak >> 20} MiB over the {budget} MiB budget\n{res.stdout}"


def test_malformed_line_keeps_an_existing_dataset(tmp_path):
    dump = _export(tmp_path, _doc_raw(tmp_path))
    import_gym(dump, tmp_path / "ds")
    before = sorted(p.name for p in (tmp_path / "ds").iterdir())
    (dump / "results.jsonl").write_text("7\n")
    with pytest.raises(InputError, match="results: line 1: expected a JSON object"):
        import_gym(dump, tmp_path / "ds")
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == before
    assert _report(tmp_path / "ds")["r1"]["status"] == "ok"


def test_missing_or_doubled_dump_files(tmp_path):
    dump = _export(tmp_path, _doc_raw(tmp_path))
    (dump / "results.jsonl").rename(dump / "results.txt")
    with pytest.raises(InputError, match="missing results.jsonl"):
        import_gym(dump, tmp_path / "ds")
    (dump / "results.txt").rename(dump / "results.jsonl")
    (dump / "staged.jsonl.gz").write_bytes(gzip.compress((dump / "staged.jsonl").read_bytes()))
    with pytest.raises(InputError, match="both staged.jsonl and staged.jsonl.gz"):
        import_gym(dump, tmp_path / "ds")
    assert not (tmp_path / "ds").exists()


# ----------------------------------------------------------------------------- round trip

def _random_raw(tmp_path: Path, seed: int, n_rollouts: int) -> dict:
    """Random raw JSON (docs/jsonl.md) of clean captures: compactions, rejected retries,
    several item kinds from a small alphabet (ambiguity), ids, accepted lists, groups."""
    rng = random.Random(seed)
    ledger, tokens, results = [], [], []
    for r in range(n_rollouts):
        rid = f"r{r}"
        calls = []
        for i in range(rng.randint(1, 6)):
            parent = None if i == 0 or rng.random() < 0.25 else rng.choice([calls[-1]] * 3 + calls)
            carry = [rng.randint(0, 60) for _ in range(rng.choice((0, 1, 3, 9)))]
            gen = [rng.randint(0, 60) for _ in range(rng.choice((1, 2, 5)))]
            items = []
            for j in range(rng.choice((0, 1, 1, 2))):
                kind, text = rng.choice(("message", "reasoning", "function_call")), f"t{rng.randint(0, 3)}"
                item_id = rng.choice((None, f"{rid}-{i}-{j}"))
                if kind == "message":
                    item = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
                elif kind == "reasoning":
                    item = {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}
                else:
                    item = {"type": "function_call", "call_id": f"call-{text}", "name": "f", "arguments": "{}"}
                if item_id:
                    item["id"] = item_id
                items.append(item)
            prev = 0 if parent is None else parent["prev_len"] + parent["delta_len"]
            seed_hash = 0 if parent is None else parent["chain_hash"]
            delta = carry + gen
            c = dict(rollout_id=rid, call_id=f"c{i}", parent_id=parent["call_id"] if parent else None,
                     response_id=f"resp-{rid}-{i}", prev_len=prev, delta_len=len(delta), gen_len=len(gen),
                     chain_hash=xxhash.xxh3_64_intdigest(np.array(delta, "<i4").tobytes(), seed_hash),
                     output_items=items)
            calls.append(c)
            ledger.append(c)
            tokens.append(dict(rollout_id=rid, call_id=c["call_id"], tokens=delta,
                               logprobs=[0.0] * len(carry) + [-round(rng.random(), 3) - 0.01 for _ in gen]))
        accepted = []
        for c in calls:
            if c["output_items"] and (c["parent_id"] is None or (accepted and accepted[-1]["call_id"] == c["parent_id"])) \
                    and rng.random() < 0.85:
                accepted.append(c)
        output = [{"type": "message", "role": "user", "content": "go"}] + [i for c in accepted for i in c["output_items"]]
        res = dict(rollout_id=rid, group_id=rng.choice(("g0", "g1", None)), reward=rng.choice((0.0, 0.5, 1.0)),
                   output=output,
                   terminal_response_id=accepted[-1]["response_id"] if accepted and rng.random() < 0.6 else None)
        if rng.random() < 0.3:
            res["accepted_response_ids"] = [c["response_id"] for c in accepted]
        results.append(res)
    rng.shuffle(tokens)
    out = {}
    for name, rows in (("ledger", ledger), ("tokens", tokens), ("results", results)):
        out[name] = tmp_path / f"raw-{seed}-{name}.jsonl"
        out[name].write_text("".join(json.dumps(x) + "\n" for x in rows))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_round_trip_through_gym_gives_the_same_outcomes(tmp_path, seed):
    """raw -> import-jsonl -> reassemble == raw -> export-gym -> import-gym -> reassemble:
    item keys differ (SPEC vs Gym fingerprints), decisions, rows and advantages do not."""
    raw = _random_raw(tmp_path, seed, n_rollouts=40)
    import_jsonl_to_dataset(raw["ledger"], raw["tokens"], raw["results"], tmp_path / "via-jsonl")
    dump = _export(tmp_path, raw)
    summary = import_gym(dump, tmp_path / "via-gym")
    assert sum(summary.failures.values()) == 0 and summary.verified == summary.staged
    for options in (dict(mode="cc"), dict(mode="ordinary"), dict(mode="cc", plan="forest")):
        want, got = _outcome(tmp_path / "via-jsonl", **options), _outcome(tmp_path / "via-gym", **options)
        assert got == want, options
    reasons = {r["reason"] for r in want[0]}
    assert "ok" in {r["status"] for r in want[0]} and len(reasons) > 1  # the comparison saw both kinds


def test_cli_round_trip(tmp_path, capsys):
    raw = _doc_raw(tmp_path)
    assert main(["export-gym", str(raw["ledger"]), str(raw["tokens"]), str(raw["results"]), str(tmp_path / "dump")]) == 0
    assert main(["export-gym", str(raw["ledger"]), str(raw["tokens"]), str(raw["results"]), str(tmp_path / "dump")]) == 2
    assert main(["import-gym", str(tmp_path / "dump"), str(tmp_path / "ds")]) == 0
    out = capsys.readouterr().out
    assert "verified               5" in out and "integrity failures     0" in out
    assert _report(tmp_path / "ds")["r1"]["status"] == "ok"


@pytest.mark.parametrize("route", [[], ["--buckets", "3"], ["--steps", "3"]], ids=["memory", "spill", "stream"])
def test_every_reassemble_path_reads_integrity_error(tmp_path, route):
    import pyarrow.dataset as pads

    import_gym(EXAMPLE / "dump", tmp_path / "ds")
    assert main(["reassemble", str(tmp_path / "ds"), str(tmp_path / "out"), *route]) == 0
    out = tmp_path / "out"
    report = pads.dataset(out / "report.parquet" if (out / "report.parquet").exists() else out / "report").to_table()
    got = {r["rollout_id"]: r["detail"] for r in report.to_pylist()}
    assert got["r2"] == f"integrity_error is set: call c2: {V.CHAIN}" and got["r1"] is None


# ----------------------------------------------------------------------------- the shipped example

def test_example_dump_imports_and_is_what_the_exporter_writes(tmp_path):
    """examples/gym: export-gym of raw/ with one token of r2's c2 changed by hand afterwards
    (examples/gym/README.md); it imports with that one integrity failure."""
    dump = EXAMPLE / "dump"
    summary = import_gym(dump, tmp_path / "ds")
    assert (summary.staged, summary.verified, dict(summary.failures)) == (8, 7, {V.CHAIN: 1})
    report = _report(tmp_path / "ds")
    assert [(r, report[r]["status"], report[r]["reason"]) for r in ("r1", "r2", "r3")] == [
        ("r1", "ok", None), ("r2", "masked", "hash_mismatch"), ("r3", "masked", "capture_failed")]
    assert report["r2"]["detail"] == f"integrity_error is set: call c2: {V.CHAIN}"
    raw = {n: EXAMPLE / "raw" / f"{n}.jsonl" for n in ("ledger", "tokens", "results")}
    again = _export(tmp_path, raw, "again")
    for name in ("receipts", "results"):
        assert (again / f"{name}.jsonl").read_text() == (dump / f"{name}.jsonl").read_text()
    fresh, shipped = _read(again, "staged"), _read(dump, "staged")
    differ = [i for i, (a, b) in enumerate(zip(fresh, shipped)) if a != b]
    assert len(fresh) == len(shipped) and differ == [6]
    assert (shipped[6]["rollout_id"], shipped[6]["model_call_id"]) == ("r2", "c2")
    assert shipped[6]["token_ids_delta"] == [600] + fresh[6]["token_ids_delta"][1:]


# ----------------------------------------------------------------------------- the fast staged reader

from chainrows.formats.gym import fast as F  # noqa: E402
from chainrows.formats.gym import importer as I  # noqa: E402


def _tree_bytes(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _import_both(dump: Path, out: Path, monkeypatch, **options):
    """import_gym with the fast reader and with json.loads of every line: the same summary and
    the same dataset bytes, or the same InputError text. Returns (summary or error, fallbacks)."""
    results = []
    F.FALLBACKS.clear()
    for fast in (True, False):
        monkeypatch.setattr(I, "FAST_STAGED", fast)
        target = out / ("fast" if fast else "exact")
        try:
            summary = import_gym(dump, target, **options)
            results.append((summary, _tree_bytes(target)))
        except InputError as exc:
            assert not target.exists()
            results.append((str(exc), None))
        if fast:
            fallbacks = dict(F.FALLBACKS)
    assert results[0] == results[1]
    return results[0][0], fallbacks


@pytest.mark.parametrize("bucketed", [False, True])
def test_fast_reader_gives_the_exact_parsers_dataset_on_the_example_dumps(tmp_path, monkeypatch, bucketed):
    raw = _random_raw(tmp_path, seed=3, n_rollouts=25)
    dumps = [EXAMPLE / "dump", _export(tmp_path, _doc_raw(tmp_path), "doc"), _export(tmp_path, raw, "random")]
    for k, dump in enumerate(dumps):
        options = {}
        if bucketed:
            options["buckets"] = 3
        summary, fallbacks = _import_both(dump, tmp_path / f"out{k}", monkeypatch, **options)
        assert isinstance(summary, I.GymSummary) and summary.staged > 0
        assert fallbacks == {}  # every line of a clean dump is read by the kernel
        assert (summary.buckets > 1) == bucketed


@pytest.mark.parametrize("seed", range(3))
def test_fast_reader_rounds_every_float_literal_as_float_does(seed):
    """The kernel's exact fast path (Clinger) and Arrow's cast for the rest, against float()."""
    rng = random.Random(seed)
    literals = float_literals(rng, 6000)
    lines = []
    for i in range(0, len(literals), 500):
        part = literals[i:i + 500]
        lines.append(('{"token_ids_delta": [], "token_mask_delta": [' + ", ".join(part[::-1]) + '], '
                      '"generation_log_probs_delta": [' + ",".join(part) + ']}\n').encode())
    for raw, parsed in zip(lines, F.read_block(lines)):
        want = np.array(json.loads(raw)["generation_log_probs_delta"], dtype=np.float64)
        assert parsed is not None
        assert parsed.logprobs.view(np.uint64).tolist() == want.view(np.uint64).tolist()
        assert parsed.mask.view(np.uint64).tolist() == want[::-1].view(np.uint64).tolist()


def test_fast_reader_integers_match_the_exact_arrays():
    """Ids in and beyond int64 (wrapped, flagged), -0, integers in the float arrays."""
    ids = [0, -0, 7, 2**31, 2**63 - 1, 2**63, 10**19 - 1, -1, -(2**63), -(10**19 - 1)]
    floats = [0, -0, 1, -5, 10**15 - 1, -(10**15 - 1)]
    line = json.dumps({"token_ids_delta": ids, "token_mask_delta": floats, "generation_log_probs_delta": floats[::-1]})
    line = line.replace("[0, 0,", "[0, -0,")  # json.dumps writes -0 as 0
    (parsed,) = F.read_block([line.encode()])
    from chainrows.formats.gym import records as R
    from chainrows.formats.jsonl.lines import Line as _Line

    exact_arrays = R._int_array(_Line(json.loads(line), Path("x"), 1, "staged"), "token_ids_delta", True)
    assert parsed.tokens.tolist() == exact_arrays[0].tolist() and parsed.ids_in_u64 is exact_arrays[1] is False
    assert parsed.mask.view(np.uint64).tolist() == np.array(floats, np.float64).view(np.uint64).tolist()
    assert parsed.logprobs[-1] == 0.0 and not np.signbit(parsed.logprobs[-1])  # the integer -0 is 0
    (positive,) = F.read_block([line.replace("-1, ", "", 1).encode()])
    assert positive.ids_in_u64 is False  # -(2**63) and others are still there
    (beyond,) = F.read_block([line.replace("[0, -0,", f"[{2**64 - 1},", 1).encode()])
    assert beyond is None  # 20 digits: the exact parser's


FAST_FALLBACKS = {
    # reason: an edit of one staged line (the raw text) the kernel must leave to the exact parser
    "not an object": lambda t: "\ufeff" + t,  # a BOM: json.loads of bytes reads it
    "escaped top-level key": lambda t: t.replace('"token_ids_delta"', '"\\u0074oken_ids_delta"'),
    "array missing": lambda t: t.replace('"generation_log_probs_delta"', '"generation_log_probs"'),
    "array key repeated": lambda t: t[:-1] + ', "token_mask_delta": [1.0]}',
    "value is not an array": lambda t: t.replace('"token_ids_delta": [', '"token_ids_delta": {"x": [') .replace("], \"token_mask", "]}, \"token_mask", 1),
    "not a JSON number": lambda t: t.replace('"generation_log_probs_delta": [0.0', '"generation_log_probs_delta": [NaN', 1),
    "integer too long": lambda t: t.replace('"token_ids_delta": [', '"token_ids_delta": [12345678901234567890, ', 1),
    "non-integer id": lambda t: t.replace('"token_ids_delta": [', '"token_ids_delta": [1e0, ', 1),
    "json.loads rejects the rest": lambda t: t[:-1] + ', "ignored": 1' + "0" * 5000 + "}",  # int digit limit
    "unterminated": lambda t: t[:-1] + ', "x": "open}',
    "a lone surrogate": lambda t: t.replace('"model_call_id": "', '"model_call_id": "x\\ud800', 1),  # escaped
}


@pytest.mark.slow
@pytest.mark.parametrize("reason", list(FAST_FALLBACKS))
def test_each_fast_fallback_leaves_the_line_to_the_exact_parser(tmp_path, monkeypatch, reason):
    """Each doubt sends its line to json.loads (counted), with the same outcome: the same
    dataset bytes and summary, or the same one-line error, in one bucket and in several."""
    dump = _export(tmp_path, _doc_raw(tmp_path))
    path = dump / "staged.jsonl"
    lines = path.read_text().splitlines()
    assert '"generation_log_probs_delta": [0.0' in lines[1]
    lines[1] = FAST_FALLBACKS[reason](lines[1])
    path.write_bytes(("\n".join(lines) + "\n").encode())
    outcome, fallbacks = _import_both(dump, tmp_path / "one", monkeypatch)
    assert fallbacks == {reason: 1}
    again, fallbacks = _import_both(dump, tmp_path / "many", monkeypatch, buckets=2)
    assert set(fallbacks) == {reason}  # in the partition pass, and again in its bucket unless that pass failed
    if isinstance(outcome, str):
        assert "staged: line 2:" in outcome and str(path) in outcome


@pytest.mark.parametrize("written, fallbacks", [
    (b"x\xed\xa0\x80", {"a lone surrogate": 1}),  # its three UTF-8 bytes: json.loads decodes them too
    (b"x\\ud83d\\ude00", {}),  # a pair is text: read by the kernel
], ids=["lone-as-bytes", "pair-escaped"])
def test_surrogates_in_a_staged_id(tmp_path, monkeypatch, written, fallbacks):
    dump = _export(tmp_path, _doc_raw(tmp_path))
    path = dump / "staged.jsonl"
    path.write_bytes(path.read_bytes().replace(b'"model_call_id": "', b'"model_call_id": "' + written, 1))
    outcome, seen = _import_both(dump, tmp_path / "out", monkeypatch)
    assert seen == fallbacks
    if fallbacks:
        assert "staged: line 1: invalid JSON: a string holds a lone UTF-16 surrogate" in outcome
    else:
        assert isinstance(outcome, I.GymSummary)


def test_fast_reader_keeps_the_lines_before_a_truncated_gzip(tmp_path, monkeypatch):
    """A .gz cut short raises where the line-by-line reader would: after the lines before it,
    so an earlier malformed line is still the one named."""
    dump = _export(tmp_path, _doc_raw(tmp_path))
    lines = (dump / "staged.jsonl").read_text().splitlines()
    lines[0] = lines[0].replace('"token_ids_delta": [', '"token_ids_delta": ["x", ', 1)
    data = gzip.compress(("\n".join(lines) + "\n").encode())
    (dump / "staged.jsonl").unlink()
    (dump / "staged.jsonl.gz").write_bytes(data[:len(data) * 2 // 3])
    error, _ = _import_both(dump, tmp_path / "out", monkeypatch)
    assert "staged: line 1: field 'token_ids_delta' entry 0 must be an integer" in error


_REWRITES = [
    # same meaning, other text
    lambda t, r: t.replace(", ", r.choice([",", " , ", ",\t", ",\r "])),
    lambda t, r: t.replace("0.0", r.choice(["0", "0e0", "0.000", "0E+3", "-0.0", "-0"])),
    lambda t, r: t.replace("1.0", r.choice(["1", "1e0", "10e-1", "1.000000000000000000001", "0.1e1"])),
    lambda t, r: t.replace('"generation_log_probs_delta": [0.0', '"generation_log_probs_delta": [' + r.choice(
        ["-0.10000000149011612", "1e400", "-1e-400", "5e-324", "123456789012345678901234567890e-40"])),
    lambda t, r: t.replace('"token_ids_delta": [', '"token_ids_delta": [' + r.choice(
        ["-1, ", "9223372036854775808, ", "18446744073709551615, ", "-0, ", "2147483648, "])),
    lambda t, r: t[:-1] + r.choice([', "extras": {"k": [1, 2.5, null, true]}', ', "extras": null', ', "z": "\\u00e9\\"]"',
                                    ', "z": "é"', ', "z": {"token_ids_delta": "x"}', ', "z": [NaN]']) + "}",
    lambda t, r: t.replace('"rollout_id": "r1"', '"rollout_id": "\\u0072\\u0031"'),
    # corruptions: form errors, integrity failures, not JSON
    lambda t, r: t.replace('"token_ids_delta": [', '"token_ids_delta": [' + r.choice(
        ['"5", ', "true, ", "null, ", "1.5, ", "[1], ", "NaN, ", "1e2, "])),
    lambda t, r: t.replace('"token_mask_delta": [', '"token_mask_delta": [' + r.choice(
        ["false, ", "null, ", "0.5, ", "Infinity, ", "1" + "0" * 400 + ", ", '"0", '])),
    lambda t, r: t.replace('"prev_len": ', '"prev_len": ' + r.choice(['"', "1.0 + ", "-", "true, \"q\": "])),
    lambda t, r: t[:r.randrange(len(t))],
    lambda t, r: t[:-1] + ', "token_ids_delta": ' + r.choice(["[1]", "null", "[]"]) + "}",
    lambda t, r: r.choice(["[1, 2]", "\ufeff" + t, " " + t, t + " x", "null", "\t"]),
]


@settings(max_examples=examples(0.4), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, 4), st.integers(0, len(_REWRITES) - 1), st.integers(0, 2**16)),
                      max_size=4),
       bucketed=st.booleans())
def test_fast_reader_matches_the_exact_parser_on_random_edits(tmp_path_factory, monkeypatch, edits, bucketed):
    """Random rewrites (the same values in other text) and corruptions of staged lines: the
    fast reader and the exact parser give the same dataset bytes and summary, or the same error."""
    tmp = tmp_path_factory.mktemp("edits")
    dump = _export(tmp, _doc_raw(tmp))
    path = dump / "staged.jsonl"
    lines = path.read_text().splitlines()
    for line, rewrite, seed in edits:
        lines[line] = _REWRITES[rewrite](lines[line], random.Random(seed))
    path.write_bytes(("\n".join(lines) + "\n").encode())
    options = {}
    if bucketed:
        options["buckets"] = 3
    _import_both(dump, tmp / "out", monkeypatch, **options)


@pytest.mark.parametrize("bad", ["x", "abc", "ZZ" * 32])
def test_a_parents_malformed_chain_hash_fails_the_child_not_the_import(tmp_path, bad):
    """The child's chain hash is seeded with its parent's recorded one: malformed there, the
    parent fails its hex check and the child cannot be checked (it was an internal error,
    bytes.fromhex on the seed)."""
    dump = tmp_path / "dump"
    shutil.copytree(EXAMPLE / "dump", dump)
    receipts = _read(dump, "receipts")
    staged = _read(dump, "staged")
    for m in receipts[0]["manifest"]:
        if m["model_call_id"] == "c1":
            m["chain_hash"] = bad
    for s in staged:
        if s["rollout_id"] == receipts[0]["rollout_id"] and s["model_call_id"] == "c1":
            s["chain_hash"] = bad
    _write(dump, "receipts", receipts)
    _write(dump, "staged", staged)
    assert main(["import-gym", str(dump), str(tmp_path / "ds")]) == 0
    ledger = read_dataset(tmp_path / "ds").ledger.to_pylist()
    errors = {r["call_id"]: r["integrity_error"] for r in ledger if r["rollout_id"] == receipts[0]["rollout_id"]}
    assert errors["c1"] == V.HEX and errors["c2"] == V.PARENT_HEX, errors
