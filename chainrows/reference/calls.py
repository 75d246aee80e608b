"""The reference for SPEC §8: full-sequence call logs -> a §2 dataset, read literally.

This is the oracle the fast ``import-calls`` is tested against (``tests/calls_cases.py``). It
takes the call records of §8.1, already form-checked, as plain dicts in capture order (rollouts
may interleave), and returns the ledger, tokens and import_report rows as plain dicts. One small
function per §8 rule, named after it; nothing is clever, everything is quadratic per rollout
(every call is compared with every earlier call of its rollout), which is fine for an oracle.
It shares no code with the fast import: only ``chain_hash`` (§2) from the reassembly oracle and
the item fingerprints of ``chainrows.io.fingerprint``.

Input record keys (§8.1): ``rollout_id``, ``call_id``, ``prompt_ids``, ``completion_ids``,
``completion_logprobs`` (absent or None: none for that record), ``response_id`` (absent or None:
the call_id), ``output_items`` (absent or None: ``[]``), ``failed`` (absent or None: False). A
record *declares* its parent iff the dict has the key ``parent_id`` (a None value declares a
root). Records are never mutated.

Output: :class:`CallsImport`. ``ledger`` and ``report`` hold one row per record in capture order;
``tokens`` one row per non-failed record in capture order. The report has two columns beyond
§8.6: ``diverge_token`` = prompt_ids(c)[diverge_at] and ``against_token`` =
F(against_call)[diverge_at], each None when diverge_at is None or past the end of that sequence.

Readings of §8 chosen where the text leaves room (the cases in tests/calls_cases.py pin them):

- **Calls are records.** A call is one record, identified by its capture position, not by its
  call_id: with a repeated call_id (written as it is, §8.1) each record is its own call, and
  ``parent_id`` / ``against_call`` write the chosen record's call_id.
- **Every non-failed record is an earlier call of the later ones,** whatever its own relation:
  drift, retry, rewrite and declared_mismatch roots and declared children are compared and can
  be parents like any other call. Only failed records are skipped (§8.2).
- **first_root** means no non-failed earlier record in the rollout: a call that follows only
  failed records is a first_root.
- **A prompt that ends inside p's generation** (prompt_ids(c) a proper prefix of F(p), longer
  than prompt_ids(p)) does not *depart* (§8.2 requires lcp < len(prompt_ids(c))); without a
  candidate it is a retry or a rewrite like any other root, and its rewrite has diverge_at =
  len(prompt_ids(c)), so diverge_token is None.
- **An empty prompt** has lcp 0 with every call: never a child (F is never empty) nor a drift;
  a retry against the latest earlier empty prompt, else a rewrite at 0 against the latest
  earlier call.
- **retry** has no diverge_at (§8.6 names rewrite, drift and declared_mismatch only), and its
  against_call is the latest earlier call with the same prompt_ids.
- **Declared parents** (§8.4) are looked up as the latest earlier (non-failed, same rollout,
  before c) record with that call_id. A parent only in another rollout, only later, only
  failed, or c's own call_id with no earlier record of it, is "not an earlier, non-failed call".
  A record repeating an earlier call_id may declare that id: it names the earlier record. A
  declared parent needs only F(p) to be a prefix of prompt_ids(c); it need not be the longest
  candidate, and a declared record is never checked for drift (``on_drift`` leaves it alone).
- **declared_mismatch** is written as a root: ``parent_id`` None, prev_len 0, the whole prompt
  carried. When p is an earlier call, against_call = p and diverge_at = k = lcp(c, p), also
  when prompt_ids(c) is a proper prefix of F(p) (then k = len(prompt_ids(c))). The texts are
  ``TEXT_NOT_EXTEND`` and ``TEXT_NOT_EARLIER`` with the declared call_id as <p>.
- **Failed records** (§8.5): ``parent_id`` is the declared value as given, unchecked (None when
  undeclared); ``response_id`` defaults to the call_id as for any record; item_keys/item_ids
  come from output_items when given (else empty); integrity_error None; the report's
  prompt_len and completion_len are each None when that field is absent or None. A failed
  record is failed whatever else it declares.
- **has_logprobs** is true when any record, failed ones included, has a non-None
  completion_logprobs (§8.1: "any record"). Logprob values are written as given (Python floats;
  a writer rounds them to float32); carry tokens get 0.0.
- **chain_hash** of a child is seeded with its parent's computed chain_hash, whatever the
  parent's relation or integrity_error.
- ``--on-drift mask`` sets ``TEXT_DRIFT`` with <p> = against_call and <k> = diverge_at on drift
  roots only. Any other ``on_drift`` value is a ValueError.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import xxhash

from chainrows.reference.reassembly import chain_hash

__all__ = [
    "LEDGER_COLUMNS", "RELATIONS", "REPORT_COLUMNS", "TEXT_DRIFT", "TEXT_NOT_EARLIER",
    "TEXT_NOT_EXTEND", "CallsImport", "Parentage", "import_calls",
]

RELATIONS = ("first_root", "child", "retry", "rewrite", "drift", "declared", "declared_mismatch",
             "failed")
LEDGER_COLUMNS = ("rollout_id", "call_id", "parent_id", "response_id", "prev_len", "delta_len",
                  "gen_len", "chain_hash", "item_keys", "item_ids", "failed", "integrity_error")
REPORT_COLUMNS = ("rollout_id", "call_id", "parent_id", "relation", "against_call", "diverge_at",
                  "prompt_len", "completion_len", "diverge_token", "against_token")
ON_DRIFT = ("root", "mask")

TEXT_NOT_EXTEND = "prompt does not extend call {p}: first difference at token {k}"
TEXT_NOT_EARLIER = "declared parent {p} is not an earlier, non-failed call of the rollout"
TEXT_DRIFT = "token drift: differs from call {p}'s generated tokens at token {k}"


# --------------------------------------------------------------------------------------------
# SPEC §2.1, the item fingerprint, read again here: the oracle shares no code with the import
# --------------------------------------------------------------------------------------------

def without_ids_statuses_nulls(value):
    """Drop the keys ``id`` and ``status`` and every null-valued key at every level; nulls
    inside arrays stay."""
    if isinstance(value, dict):
        return {k: without_ids_statuses_nulls(v) for k, v in value.items()
                if k not in ("id", "status") and v is not None}
    if isinstance(value, list):
        return [without_ids_statuses_nulls(v) for v in value]
    return value


def fingerprint(item: dict) -> int:
    """XXH3-64 of the canonical JSON: sorted keys, separators (",", ":"), UTF-8, no NaN."""
    text = json.dumps(without_ids_statuses_nulls(item), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False)
    return xxhash.xxh3_64_intdigest(text.encode("utf-8"))


def is_keyed(item: dict) -> bool:
    """Model-authored: role assistant; without a role, a reasoning or function_call item."""
    if item.get("role") is not None:
        return item["role"] == "assistant"
    return item.get("type") in ("reasoning", "function_call")


def model_item_keys(items: list) -> tuple[list, list]:
    """(keys, ids) of the model-authored items, in order."""
    keyed = [item for item in items if is_keyed(item)]
    return [fingerprint(item) for item in keyed], [item.get("id") for item in keyed]


@dataclass
class CallsImport:
    ledger: list   # one per record, capture order: the §2 ledger columns + "integrity_error"
    tokens: list   # one per non-failed record: rollout_id, call_id, tokens (+ "logprobs")
    report: list   # one per record (import_report, §8.6, + diverge_token, against_token)
    has_logprobs: bool


@dataclass
class Parentage:
    """What §8.3/§8.4/§8.5 decide for one record. ``parent`` and ``against`` are records of the
    same rollout (dicts), or None."""

    relation: str
    parent: dict | None = None
    against: dict | None = None
    diverge_at: int | None = None
    integrity_error: str | None = None
    written_parent_id: str | None = None  # failed records only: the declared value as given


# --------------------------------------------------------------------------------------------
# Record fields (§8.1)
# --------------------------------------------------------------------------------------------

def is_failed(rec: dict) -> bool:
    return bool(rec.get("failed") or False)


def prompt_ids(rec: dict) -> list:
    return list(rec["prompt_ids"])


def completion_ids(rec: dict) -> list:
    return list(rec["completion_ids"])


def declares_parent(rec: dict) -> bool:
    """The record has the parent_id field (None declares a root)."""
    return "parent_id" in rec


def response_id(rec: dict) -> str:
    rid = rec.get("response_id")
    return rec["call_id"] if rid is None else rid


def has_logprobs_field(rec: dict) -> bool:
    return rec.get("completion_logprobs") is not None


# --------------------------------------------------------------------------------------------
# §8.2 terms
# --------------------------------------------------------------------------------------------

def full_sequence(p: dict) -> list:
    """F(p) = prompt_ids(p) + completion_ids(p)."""
    return prompt_ids(p) + completion_ids(p)


def lcp(c: dict, p: dict) -> int:
    """Length of the longest common prefix of prompt_ids(c) and F(p)."""
    a, b = prompt_ids(c), full_sequence(p)
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def earlier_calls(rollout: list, k: int) -> list:
    """The non-failed records of the rollout before position k, in capture order."""
    return [p for p in rollout[:k] if not is_failed(p)]


def is_candidate(c: dict, p: dict) -> bool:
    """F(p) is a prefix of prompt_ids(c)."""
    return lcp(c, p) == len(full_sequence(p))


def departs_inside_generation(c: dict, p: dict) -> bool:
    """lcp < len(prompt_ids(c)) and len(prompt_ids(p)) <= lcp < len(F(p))."""
    n = lcp(c, p)
    return n < len(prompt_ids(c)) and len(prompt_ids(p)) <= n < len(full_sequence(p))


def latest_best(calls: list, score) -> dict | None:
    """The call with the largest score; ties: the latest (calls are in capture order)."""
    best = None
    for p in calls:
        if best is None or score(p) >= score(best):
            best = p
    return best


# --------------------------------------------------------------------------------------------
# §8.3 parent inference
# --------------------------------------------------------------------------------------------

def longest_candidate(c: dict, earlier: list) -> dict | None:
    """P: the candidate with the longest F(P) (ties: the latest), or None."""
    candidates = [p for p in earlier if is_candidate(c, p)]
    return latest_best(candidates, lambda p: len(full_sequence(p)))


def drift_calls(c: dict, earlier: list, P: dict | None) -> list:
    """D: the earlier calls c departs inside of at lcp > len(F(P)) (> 0 without P)."""
    floor = len(full_sequence(P)) if P is not None else 0
    return [p for p in earlier if departs_inside_generation(c, p) and lcp(c, p) > floor]


def same_prompt_calls(c: dict, earlier: list) -> list:
    """The earlier calls with exactly the same prompt_ids."""
    return [p for p in earlier if prompt_ids(p) == prompt_ids(c)]


def infer_parent(c: dict, earlier: list) -> Parentage:
    """§8.3, the rules in their order: drift, child, first_root, retry, rewrite."""
    P = longest_candidate(c, earlier)
    D = drift_calls(c, earlier, P)
    if D:
        q = latest_best(D, lambda p: lcp(c, p))
        return Parentage("drift", against=q, diverge_at=lcp(c, q))
    if P is not None:
        return Parentage("child", parent=P)
    if not earlier:
        return Parentage("first_root")
    same = same_prompt_calls(c, earlier)
    if same:
        return Parentage("retry", against=same[-1])
    q = latest_best(earlier, lambda p: lcp(c, p))
    return Parentage("rewrite", against=q, diverge_at=lcp(c, q))


# --------------------------------------------------------------------------------------------
# §8.4 declared parents
# --------------------------------------------------------------------------------------------

def latest_earlier_with_id(earlier: list, call_id: str) -> dict | None:
    """The latest earlier call with that call_id, or None."""
    named = [p for p in earlier if p["call_id"] == call_id]
    return named[-1] if named else None


def check_declared_parent(c: dict, earlier: list) -> Parentage:
    """A declared null is a root; a declared earlier p whose F(p) is a prefix of prompt_ids(c)
    is the parent; anything else is a declared_mismatch root with its integrity_error."""
    declared = c["parent_id"]
    if declared is None:
        return Parentage("declared")
    p = latest_earlier_with_id(earlier, declared)
    if p is None:
        return Parentage("declared_mismatch",
                         integrity_error=TEXT_NOT_EARLIER.format(p=declared))
    if is_candidate(c, p):
        return Parentage("declared", parent=p)
    k = lcp(c, p)
    return Parentage("declared_mismatch", against=p, diverge_at=k,
                     integrity_error=TEXT_NOT_EXTEND.format(p=declared, k=k))


# --------------------------------------------------------------------------------------------
# §8.5 failed records
# --------------------------------------------------------------------------------------------

def failed_parentage(c: dict) -> Parentage:
    """A poison row: its declared parent as given if it declares one, else null."""
    return Parentage("failed", written_parent_id=c.get("parent_id"))


def parentage(rollout: list, k: int, on_drift: str) -> Parentage:
    """The relation of record k of its rollout (§8.3 to §8.5), with the on_drift option."""
    c = rollout[k]
    if is_failed(c):
        return failed_parentage(c)
    earlier = earlier_calls(rollout, k)
    if declares_parent(c):
        return check_declared_parent(c, earlier)
    result = infer_parent(c, earlier)
    if result.relation == "drift" and on_drift == "mask":
        result.integrity_error = TEXT_DRIFT.format(p=result.against["call_id"],
                                                   k=result.diverge_at)
    return result


# --------------------------------------------------------------------------------------------
# Rows (§8.3 "Then, per §2", §8.6)
# --------------------------------------------------------------------------------------------

def prev_len(parent: dict | None) -> int:
    """len(F(parent)); 0 for a root."""
    return 0 if parent is None else len(full_sequence(parent))


def delta(c: dict, parent: dict | None) -> list:
    """prompt_ids(c)[prev_len:] + completion_ids(c)."""
    return prompt_ids(c)[prev_len(parent):] + completion_ids(c)


def delta_logprobs(c: dict, parent: dict | None) -> list | None:
    """0.0 on the carry tokens, then completion_logprobs; None without them."""
    if not has_logprobs_field(c):
        return None
    carry = len(prompt_ids(c)) - prev_len(parent)
    return [0.0] * carry + list(c["completion_logprobs"])


def token_at(seq: list, i: int | None):
    """seq[i] when i is set and inside seq, else None."""
    return seq[i] if i is not None and i < len(seq) else None


def ledger_row(c: dict, rel: Parentage, parent_hash: int) -> dict:
    keys, ids = model_item_keys(c.get("output_items") or [])
    row = {
        "rollout_id": c["rollout_id"],
        "call_id": c["call_id"],
        "parent_id": rel.parent["call_id"] if rel.parent is not None else rel.written_parent_id,
        "response_id": response_id(c),
        "prev_len": 0, "delta_len": 0, "gen_len": 0, "chain_hash": 0,
        "item_keys": keys,
        "item_ids": ids,
        "failed": rel.relation == "failed",
        "integrity_error": rel.integrity_error,
    }
    if rel.relation != "failed":
        d = delta(c, rel.parent)
        row.update(prev_len=prev_len(rel.parent), delta_len=len(d),
                   gen_len=len(completion_ids(c)), chain_hash=chain_hash(d, parent_hash))
    return row


def tokens_row(c: dict, rel: Parentage, with_logprobs: bool) -> dict:
    row = {"rollout_id": c["rollout_id"], "call_id": c["call_id"], "tokens": delta(c, rel.parent)}
    if with_logprobs:
        row["logprobs"] = delta_logprobs(c, rel.parent)
    return row


def report_row(c: dict, rel: Parentage, written_parent_id: str | None) -> dict:
    prompt = c.get("prompt_ids")
    completion = c.get("completion_ids")
    against_seq = full_sequence(rel.against) if rel.against is not None else []
    return {
        "rollout_id": c["rollout_id"],
        "call_id": c["call_id"],
        "parent_id": written_parent_id,
        "relation": rel.relation,
        "against_call": rel.against["call_id"] if rel.against is not None else None,
        "diverge_at": rel.diverge_at,
        "prompt_len": None if prompt is None else len(prompt),
        "completion_len": None if completion is None else len(completion),
        "diverge_token": token_at(list(prompt or []), rel.diverge_at),
        "against_token": token_at(against_seq, rel.diverge_at) if rel.against is not None else None,
    }


def rollouts_in_order(records: list) -> dict:
    """rollout_id -> its records in capture order (the dicts themselves)."""
    out: dict = {}
    for rec in records:
        out.setdefault(rec["rollout_id"], []).append(rec)
    return out


def import_calls(records: list, *, on_drift: str = "root") -> CallsImport:
    """SPEC §8: the ledger, tokens and import_report rows of the call records."""
    if on_drift not in ON_DRIFT:
        raise ValueError(f"on_drift must be one of {ON_DRIFT}, got {on_drift!r}")
    records = [dict(rec) for rec in records]  # one distinct dict per record: id() names it
    with_logprobs = any(has_logprobs_field(rec) for rec in records)
    decided: dict = {}  # id(record) -> (Parentage, ledger row)
    for rollout in rollouts_in_order(records).values():
        for k, c in enumerate(rollout):
            rel = parentage(rollout, k, on_drift)
            parent_hash = decided[id(rel.parent)][1]["chain_hash"] if rel.parent is not None else 0
            decided[id(c)] = (rel, ledger_row(c, rel, parent_hash))
    ledger, tokens, report = [], [], []
    for c in records:
        rel, row = decided[id(c)]
        ledger.append(row)
        report.append(report_row(c, rel, row["parent_id"]))
        if rel.relation != "failed":
            tokens.append(tokens_row(c, rel, with_logprobs))
    return CallsImport(ledger, tokens, report, with_logprobs)
