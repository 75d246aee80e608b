"""Random SPEC §2 inputs for property tests: compactions, rejected retries, multi-item calls,
item ids, duplicated content, and corruptions of every kind, as dict lists.

Small alphabets on purpose: item keys and ids collide often, so selection meets ambiguity,
id filters and ancestor disambiguation; lengths are tiny so hashing covers all short paths.
"""

from __future__ import annotations

import random

import numpy as np
import xxhash

CORRUPTIONS = (
    "delta_len", "gen_len_zero", "gen_len_big", "prev_len", "root_prev_len", "chain_hash",
    "token_flip", "drop_tokens", "dup_tokens", "orphan_tokens", "lp_nan", "lp_carry", "lp_len",
    "lp_null", "dup_call_id", "dup_response_id", "item_ids_len", "output_ids_len", "no_record",
    "dup_record", "tokens_only", "failed", "reward_nan", "reward_null", "reward_inf",
    "parent_missing", "parent_self", "output_extra", "output_drop", "output_swap", "empty_output",
    "terminal_random", "accepted_wrong", "accepted_extra", "no_calls", "null_lists",
    "integrity_error",
)


def _hash(tokens, seed):
    return xxhash.xxh3_64_intdigest(np.asarray(tokens, dtype="<i4").tobytes(), seed)


def random_rollout(rng: random.Random, rid: str, group, *, logprobs: bool, accepted_col: bool,
                   corrupt: float):
    """(ledger rows, token rows, rollouts rows) for one rollout."""
    n = rng.randint(1, 7)
    calls = []
    for i in range(n):
        cid = f"c{i}"
        if i == 0 or rng.random() < 0.25:
            parent = None
        elif rng.random() < 0.6:
            parent = calls[-1]["call_id"]
        else:
            parent = rng.choice(calls)["call_id"]
        carry = [rng.randint(-3, 50) for _ in range(rng.choice((0, 1, 2, 5, 17, 40)))]
        gen = [rng.randint(-3, 50) for _ in range(rng.choice((1, 1, 2, 3, 8, 33)))]
        nkeys = rng.choice((0, 1, 1, 2, 2, 3))
        keys = [rng.randint(1, 5) for _ in range(nkeys)]
        ids = [rng.choice((None, "a", "b", "c", f"{rid}-{cid}-{j}")) for j in range(nkeys)]
        calls.append(dict(call_id=cid, parent_id=parent, carry=carry, gen=gen, keys=keys, ids=ids))
    by_id = {c["call_id"]: c for c in calls}
    for c in calls:
        p = by_id.get(c["parent_id"]) if c["parent_id"] else None
        c["prev_len"] = 0 if p is None else p["prev_len"] + len(p["carry"]) + len(p["gen"])
        c["chain_hash"] = _hash(c["carry"] + c["gen"], 0 if p is None else p["chain_hash"])

    # the accepted history: walk forward picking calls that continue the previous one or roots
    accepted = []
    for c in calls:
        if not c["keys"]:
            continue
        if (c["parent_id"] is None or (accepted and c["parent_id"] == accepted[-1]["call_id"])) \
                and rng.random() < 0.85:
            accepted.append(c)
    if not accepted and rng.random() < 0.9:
        accepted = [c for c in calls if c["keys"]][:1]
    out_keys = [k for c in accepted for k in c["keys"]]
    out_ids = [i for c in accepted for i in c["ids"]]
    term = accepted[-1]["call_id"] if accepted and rng.random() < 0.6 else None

    ledger, tokens = [], []
    for c in calls:
        delta = c["carry"] + c["gen"]
        ledger.append(dict(rollout_id=rid, call_id=c["call_id"], parent_id=c["parent_id"],
                           response_id="resp-" + c["call_id"], prev_len=c["prev_len"],
                           delta_len=len(delta), gen_len=len(c["gen"]), chain_hash=c["chain_hash"],
                           item_keys=list(c["keys"]), item_ids=list(c["ids"]), failed=False))
        t = dict(rollout_id=rid, call_id=c["call_id"], tokens=delta)
        if logprobs:
            t["logprobs"] = [0.0] * len(c["carry"]) + [-round(rng.random(), 3) - 0.001 for _ in c["gen"]]
        tokens.append(t)
    rng.shuffle(tokens)
    ro = dict(rollout_id=rid, group_id=group, reward=rng.choice((0.0, 1.0, 0.5, 0.25, 1.0)),
              output_keys=out_keys, output_ids=out_ids if rng.random() < 0.7 else None,
              terminal_response_id=("resp-" + term) if term else None)
    if accepted_col:
        ro["accepted_response_ids"] = ["resp-" + c["call_id"] for c in accepted] if rng.random() < 0.4 else None
    rollouts = [ro]
    if rng.random() < corrupt:
        for _ in range(rng.choice((1, 1, 2))):
            _corrupt(rng, rng.choice(CORRUPTIONS), ledger, tokens, rollouts, logprobs, accepted_col)
    return ledger, tokens, rollouts


def _corrupt(rng, kind, ledger, tokens, rollouts, logprobs, accepted_col):
    L = rng.choice(ledger) if ledger else None
    T = rng.choice(tokens) if tokens else None
    ro = rollouts[0] if rollouts else None
    if kind == "delta_len" and L:
        L["delta_len"] += rng.choice((-1, 1))
    elif kind == "gen_len_zero" and L:
        L["gen_len"] = 0
    elif kind == "gen_len_big" and L:
        L["gen_len"] = L["delta_len"] + 1
    elif kind == "prev_len" and L:
        L["prev_len"] = rng.choice((L["prev_len"] - 1, L["prev_len"] + 1, 2**62))
    elif kind == "root_prev_len" and L and L["parent_id"] is None:
        L["prev_len"] = 3
    elif kind == "chain_hash" and L:
        L["chain_hash"] ^= 1 << rng.randint(0, 63)
    elif kind == "token_flip" and T and T["tokens"]:
        T["tokens"][rng.randrange(len(T["tokens"]))] += 1
    elif kind == "drop_tokens" and T:
        tokens.remove(T)
    elif kind == "dup_tokens" and T:
        tokens.append(dict(T))
    elif kind == "orphan_tokens" and T:
        tokens.append(dict(T, call_id="nope"))
    elif kind == "lp_nan" and T and logprobs and T.get("logprobs"):  # not len(tokens): a defect may differ
        T["logprobs"][rng.randrange(len(T["logprobs"]))] = float(rng.choice(("nan", "inf", "-inf")))
    elif kind == "lp_carry" and T and logprobs and T.get("logprobs"):
        T["logprobs"][0] = -0.5
    elif kind == "lp_len" and T and logprobs and T.get("logprobs") is not None:
        T["logprobs"] = T["logprobs"] + [0.0]
    elif kind == "lp_null" and T and logprobs:
        T["logprobs"] = None
    elif kind == "dup_call_id" and len(ledger) > 1:
        ledger[-1]["call_id"] = ledger[0]["call_id"]
    elif kind == "dup_response_id" and len(ledger) > 1:
        ledger[-1]["response_id"] = ledger[0]["response_id"]
    elif kind == "item_ids_len" and L:
        L["item_ids"] = (L["item_ids"] or []) + ["x"]
    elif kind == "output_ids_len" and ro:
        ro["output_ids"] = (ro["output_ids"] or []) + ["x"]
    elif kind == "no_record":
        rollouts.clear()
    elif kind == "dup_record" and ro:
        rollouts.append(dict(ro, reward=0.125))
    elif kind == "tokens_only":
        ledger.clear()
        rollouts.clear()
    elif kind == "failed" and L:
        L["failed"] = True
    elif kind == "reward_nan" and ro:
        ro["reward"] = float("nan")
    elif kind == "reward_null" and ro:
        ro["reward"] = None
    elif kind == "reward_inf" and ro:
        ro["reward"] = float(rng.choice(("inf", "-inf")))
    elif kind == "parent_missing" and L:
        L["parent_id"] = "ghost"
    elif kind == "parent_self" and L:
        L["parent_id"] = L["call_id"]
    elif kind == "output_extra" and ro:
        ro["output_keys"] = ro["output_keys"] + [rng.randint(1, 5)]
        if ro["output_ids"] is not None:
            ro["output_ids"] = ro["output_ids"] + [None]
    elif kind == "output_drop" and ro and ro["output_keys"]:
        i = rng.randrange(len(ro["output_keys"]))
        ro["output_keys"] = ro["output_keys"][:i] + ro["output_keys"][i + 1:]
        if ro["output_ids"] is not None:
            ro["output_ids"] = ro["output_ids"][:i] + ro["output_ids"][i + 1:]
    elif kind == "output_swap" and ro and len(ro["output_keys"]) > 1:
        ro["output_keys"] = list(reversed(ro["output_keys"]))
        if ro["output_ids"] is not None:
            ro["output_ids"] = list(reversed(ro["output_ids"]))
    elif kind == "empty_output" and ro:
        ro["output_keys"], ro["output_ids"] = [], None
    elif kind == "terminal_random" and ro and ledger:
        ro["terminal_response_id"] = rng.choice([x["response_id"] for x in ledger] + ["resp-ghost"])
    elif kind == "accepted_wrong" and ro and accepted_col:
        ids = [x["response_id"] for x in ledger]
        ro["accepted_response_ids"] = rng.sample(ids, rng.randint(0, len(ids)))
    elif kind == "accepted_extra" and ro and accepted_col and ledger:
        ro["accepted_response_ids"] = list(ro.get("accepted_response_ids") or []) + [ledger[-1]["response_id"]]
    elif kind == "no_calls":
        ledger.clear()
    elif kind == "null_lists" and L:
        L["item_ids"] = None
    elif kind == "integrity_error" and L:  # an importer's own check failed (e.g. a NeMo Gym digest, docs/gym.md)
        L["integrity_error"] = rng.choice(("staging digest mismatch", "chain hash mismatch"))


def random_dataset(seed: int, n_rollouts: int | None = None, corrupt: float = 0.5):
    """(ledger, tokens, rollouts, options) for several rollouts in a few groups."""
    rng = random.Random(seed)
    n = n_rollouts if n_rollouts is not None else rng.randint(1, 10)
    logprobs = rng.random() < 0.6
    accepted_col = rng.random() < 0.4
    ledger, tokens, rollouts = [], [], []
    for i in range(n):
        group = rng.choice(("g0", "g1", "g2", None))
        ln, t, r = random_rollout(rng, f"r{i}", group, logprobs=logprobs, accepted_col=accepted_col,
                                  corrupt=corrupt)
        ledger += ln
        tokens += t
        rollouts += r
    # rows of different rollouts interleave; capture order within a rollout is kept
    ledger = _interleave(rng, ledger)
    rng.shuffle(tokens)
    rng.shuffle(rollouts)
    options = dict(
        mode=rng.choice(("cc", "cc", "ordinary")),
        placeholders=rng.random() < 0.3,
        baseline=rng.choice(("mean", "loo")),
        no_std=rng.random() < 0.3,
        baseline_population=rng.choice(("all", "ok")),
        row_weight=rng.choice(("rollout", "row")),
        logprobs=logprobs,
    )
    if accepted_col:
        for r in rollouts:
            r.setdefault("accepted_response_ids", None)
    return ledger, tokens, rollouts, options


def _interleave(rng, ledger):
    queues = {}
    for row in ledger:
        queues.setdefault(row["rollout_id"], []).append(row)
    out = []
    live = list(queues)
    while live:
        rid = rng.choice(live)
        out.append(queues[rid].pop(0))
        if not queues[rid]:
            live.remove(rid)
    return out
