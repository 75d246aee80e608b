"""A seeded simulator of agent harnesses: realistic SPEC §2 datasets as Arrow tables.

Each rollout is one simulated harness loop. Call 1 is a root whose delta is the system + user
prompt (carry) followed by the model's generation; every later call's delta is the observation
since the previous accepted call (tool output, template glue: carry) followed by the generation.
Every call produces 1-3 model-authored Responses-API items (reasoning, then an assistant message
or a function_call); their fingerprints (SPEC §2.1) are the call's ``item_keys``. On top of that:

- **compaction** (probability ``compaction_rate`` per rollout, possibly several): the next call is
  a new root whose delta is a fresh, shorter prompt (system prompt + summary) + generation;
- **rejected retries** (probability ``retry_rate`` per accepted call): a sibling call with the same
  parent and the same carry tokens, different generation and items, captured just before the
  accepted one and absent from the final output;
- the final output is the model-authored items of the accepted calls in order;
  ``terminal_response_id`` names the last accepted call (null for ~15 % of rollouts);
  ``accepted_response_ids`` is present for a share ``accepted_rate``; some item ids are null.
- **corruption** (probability ``corrupt_rate`` per rollout): exactly one corruption, chosen
  uniformly from ``corrupt_kinds``. Kind names are the SPEC §3 reason codes they are built to
  trigger; ``CORRUPT_TARGETS`` gives the mode in which each one triggers its reason
  (``multiple_roots``, ``ambiguous_terminal`` and ``walk_mismatch`` are ordinary-mode reasons:
  the first two are clean in cc mode, ``walk_mismatch`` is ``broken_chain`` there).

Determinism: rollout ``i`` draws everything from generators seeded with XXH3-128 of
``(seed, i)`` (a counter-based scheme); the GRPO group's prompt and success rate from
``SeedSequence(seed, spawn_key=(1, group))``; the system prompt, shared by all rollouts, from
``(3,)``. Ledger rows of the rollouts of one *block* of ``BLOCK`` consecutive rollouts interleave
a little (capture order kept within a rollout) and token rows are shuffled within a block, with
a generator seeded by ``(2, block)``. Batches are whole blocks (``batch_rollouts`` is rounded up
to a multiple of ``BLOCK``), so the concatenation of all batches is the same for any batch size
or worker count, and a rollout's rows do not depend on ``n_rollouts`` (only the interleaving of
the last, partial block does).

Speed: roughly 1 GB of int32 tokens (~250 M, logprobs on top) per minute and core, Parquet
writing included (Python per call, numpy per rollout); ``workers`` builds batches in several
processes. ``python -m chainrows.synth OUT --rollouts N`` writes a dataset.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import struct
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from chainrows.io.schema import ACCEPTED_FIELD, LEDGER_SCHEMA, LOGPROBS_FIELD, ROLLOUTS_SCHEMA, TOKENS_SCHEMA

__all__ = [
    "BLOCK",
    "CORRUPT_KINDS",
    "CORRUPT_TARGETS",
    "iter_synth_batches",
    "synth_tables",
    "tables_schemas",
    "write_synth_dataset",
]

# Rollouts per interleave/shuffle block; batches are whole blocks.
BLOCK = 16
DEFAULT_BATCH_ROLLOUTS = 1024

# Every reason code of SPEC §3, each produced by one corruption kind of the same name.
CORRUPT_KINDS = (
    "no_rollout_record",
    "no_calls",
    "capture_failed",
    "reward_invalid",
    "duplicate_call",
    "length_mismatch",
    "no_output",
    "unmatched_output",
    "ambiguous_output",
    "out_of_order",
    "terminal_mismatch",
    "accepted_mismatch",
    "broken_chain",
    "multiple_roots",
    "ambiguous_terminal",
    "walk_mismatch",
    "missing_tokens",
    "hash_mismatch",
    "logprob_invalid",
)
_ORDINARY_KINDS = ("multiple_roots", "ambiguous_terminal", "walk_mismatch")
# kind -> (mode, reason it triggers in that mode). Every rollout of a kind triggers that reason.
CORRUPT_TARGETS = {k: ("ordinary" if k in _ORDINARY_KINDS else "cc", k) for k in CORRUPT_KINDS}

_WORDS = tuple(
    """the a an of to in for on with by from at as is are was be this that it its we our you
    file line test error value result function call list table row column token model agent tool
    check fix read write run build parse return output input data path config index query search
    first next last each every some all only now then because so but and or not if when while
    looks seems need should will can must let me try again see found missing expected actual type
    python numpy arrow parquet json schema hash chain root leaf parent child length offset buffer
    reward group batch kernel loop branch retry compaction summary history context step plan done
    ok good fine wrong bug issue patch diff commit update method class module package import""".split()
)

def _phrase_pool(n: int = 4096) -> tuple[str, ...]:
    r = random.Random(20240601)
    return tuple(" ".join(r.choices(_WORDS, k=r.randint(2, 5))) for _ in range(n))


# Item texts are joined random phrases of this fixed pool (a 12-bit draw each): fast, and
# with 2+ phrases per text (and a random call_id in every function_call) equal content
# within a rollout happens only where a corruption puts it.
_PHRASES = _phrase_pool()


def _text(r: random.Random, k: int) -> str:
    bits, p = r.getrandbits, _PHRASES
    return " ".join([p[bits(12)] for _ in range(k)])


_TOOLS = (
    ("bash", "command"),
    ("read_file", "path"),
    ("search", "query"),
    ("python", "code"),
    ("edit_file", "patch"),
    ("web_fetch", "url"),
)
_HEX = "0123456789abcdef"

# Call fields (a call is a small list, mutated by corruptions).
_CID, _PARENT, _RID, _PREV, _DELTA, _GEN, _HASH, _KEYS, _IDS, _FAILED = range(10)


# --------------------------------------------------------------------------------------------
# Items. The canonical JSON (SPEC §2.1) of each item kind is written directly (fast path);
# _item_dict builds the full Responses-API dict, and the tests check both agree.
# Texts use only the ASCII words above, so they need no JSON escaping.


def _reasoning_canonical(text: str) -> str:
    return '{"summary":[{"text":"' + text + '","type":"summary_text"}],"type":"reasoning"}'


def _message_canonical(text: str) -> str:
    return (
        '{"content":[{"annotations":[],"text":"' + text + '","type":"output_text"}],'
        '"role":"assistant","type":"message"}'
    )


def _function_call_canonical(call_id: str, name: str, arguments: str) -> str:
    return (
        '{"arguments":' + json.dumps(arguments) + ',"call_id":"' + call_id + '","name":"' + name + '",'
        '"type":"function_call"}'
    )


def _item_dict(kind: str, item_id: str | None, *fields: str) -> dict:
    """The Responses-API item the fast path fingerprints (for tests and notebooks)."""
    if kind == "reasoning":
        (text,) = fields
        return {"type": "reasoning", "id": item_id, "summary": [{"type": "summary_text", "text": text}]}
    if kind == "message":
        (text,) = fields
        return {
            "type": "message",
            "id": item_id,
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    call_id, name, arguments = fields
    return {
        "type": "function_call",
        "id": item_id,
        "status": "completed",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def _key(canonical: str) -> int:
    return xxhash.xxh3_64_intdigest(canonical.encode())


def _hex(r: random.Random, n: int = 16) -> str:
    return f"{r.getrandbits(4 * n):0{n}x}"


def _items(r: random.Random, final: bool, with_ids: float) -> tuple[list[int], list]:
    """item_keys and item_ids of one call: [reasoning?] [message?] (function_call | message)."""
    keys, ids = [], []
    rand = r.random
    if rand() < 0.75:
        keys.append(_key(_reasoning_canonical(_text(r, 2 + r.getrandbits(2)))))
        ids.append("rs_" + _hex(r) if rand() < with_ids else None)
    if final:
        keys.append(_key(_message_canonical(_text(r, 2 + r.getrandbits(3)))))
        ids.append("msg_" + _hex(r) if rand() < with_ids else None)
        return keys, ids
    if rand() < 0.12:
        keys.append(_key(_message_canonical(_text(r, 1 + r.getrandbits(2)))))
        ids.append("msg_" + _hex(r) if rand() < with_ids else None)
    name, arg = _TOOLS[r.randrange(len(_TOOLS))]
    arguments = '{"' + arg + '":"' + _text(r, 1 + r.getrandbits(1)) + '"}'
    keys.append(_key(_function_call_canonical("call_" + _hex(r, 12), name, arguments)))
    ids.append("fc_" + _hex(r) if rand() < with_ids else None)
    return keys, ids


def _lognormal_len(r: random.Random, mean: float, sigma: float, cap: float) -> int:
    """A length >= 1, lognormal with the given mean, capped at cap * mean (long tail)."""
    if mean <= 1:
        return 1
    x = r.lognormvariate(math.log(mean) - 0.5 * sigma * sigma, sigma)
    return max(1, min(int(x + 0.5), int(cap * mean)))


# --------------------------------------------------------------------------------------------
# One rollout.


class _Cfg:
    def __init__(
        self,
        seed,
        group_size,
        compaction_rate,
        retry_rate,
        corrupt_rate,
        logprobs,
        accepted_rate,
        mean_calls,
        mean_gen_tokens,
        mean_obs_tokens,
        prompt_tokens,
        vocab,
        corrupt_kinds,
    ):
        if not 0 <= int(seed) < 2**64:
            raise ValueError("seed must be in [0, 2**64)")
        if group_size < 1:
            raise ValueError("group_size must be >= 1")
        if mean_calls < 1:
            raise ValueError("mean_calls must be >= 1")
        if not 2 <= vocab <= 2**31 - 1:
            raise ValueError("vocab must be in [2, 2**31 - 1]")
        for name, v in (
            ("compaction_rate", compaction_rate),
            ("retry_rate", retry_rate),
            ("corrupt_rate", corrupt_rate),
            ("accepted_rate", accepted_rate),
        ):
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1]")
        if corrupt_kinds is None:
            kinds = tuple(k for k in CORRUPT_KINDS if logprobs or k != "logprob_invalid")
        else:
            kinds = tuple(corrupt_kinds)
            unknown = [k for k in kinds if k not in CORRUPT_KINDS]
            if unknown:
                raise ValueError(f"unknown corrupt kinds {unknown}; known: {CORRUPT_KINDS}")
            if not logprobs and "logprob_invalid" in kinds:
                raise ValueError("corrupt kind 'logprob_invalid' needs logprobs=True")
            if corrupt_rate > 0 and not kinds:
                raise ValueError("corrupt_kinds is empty but corrupt_rate > 0")
        self.seed = int(seed)
        self.group_size = int(group_size)
        self.compaction_rate = float(compaction_rate)
        self.retry_rate = float(retry_rate)
        self.corrupt_rate = float(corrupt_rate)
        self.logprobs = bool(logprobs)
        self.accepted_rate = float(accepted_rate)
        self.mean_calls = float(mean_calls)
        self.mean_gen = float(mean_gen_tokens)
        self.mean_obs = float(mean_obs_tokens)
        self.prompt_tokens = max(2, int(prompt_tokens))
        self.vocab = int(vocab)
        self.kinds = kinds
        # The system prompt, shared by every rollout (and kept by compactions).
        self.sys_len = max(1, self.prompt_tokens // 2)
        rng = _rng(self.seed, 3)
        self.sys_prompt = rng.integers(0, self.vocab, self.sys_len, dtype=np.int32)
        self._groups: dict[int, tuple[np.ndarray, float]] = {}
        self._bitgen = np.random.PCG64(0)
        self._gen = np.random.Generator(self._bitgen)
        self._py = random.Random(0)

    def rollout_rngs(self, i: int) -> tuple[np.random.Generator, random.Random]:
        """The numpy and Python generators of rollout i: counter-based, a pure function of
        (seed, i). The PCG64 state and the Python seed are XXH3-128 of (seed, i); both objects
        are reused (a config is not shared between threads)."""
        h = xxhash.xxh3_128_intdigest(_PACK(self.seed, i))
        self._bitgen.state = {
            "bit_generator": "PCG64",
            "state": {"state": h, "inc": ((h >> 64) * 0x9E3779B97F4A7C15 | 1) & _MASK128},
            "has_uint32": 0,
            "uinteger": 0,
        }
        self._py.seed(h)
        return self._gen, self._py

    def group(self, g: int) -> tuple[np.ndarray, float]:
        """The group's prompt tokens (system + user) and its success rate."""
        hit = self._groups.get(g)
        if hit is None:
            if len(self._groups) > 4096:
                self._groups.clear()
            rng = _rng(self.seed, 1, g)
            r = random.Random(int(rng.integers(2**63)))
            user_len = _lognormal_len(r, max(1.0, self.prompt_tokens - self.sys_len), 0.4, 8)
            user = rng.integers(0, self.vocab, user_len, dtype=np.int32)
            hit = (np.concatenate([self.sys_prompt, user]), r.betavariate(1.2, 1.2))
            self._groups[g] = hit
        return hit


_MASK128 = (1 << 128) - 1
_PACK = struct.Struct("<QQ").pack


def _rng(*key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(key[0], spawn_key=key[1:])))


class _Rollout:
    __slots__ = ("calls", "tok_rows", "ro_rows", "tok", "lp", "kind")


def _needs(kind: str | None) -> dict:
    """Structure a corruption kind needs from the clean rollout it corrupts."""
    if kind in ("out_of_order",):
        return {"min_acc": 2}
    if kind == "broken_chain":
        return {"min_acc": 2, "link": True}
    if kind == "multiple_roots":
        return {"min_acc": 2, "compaction": "force"}
    if kind == "ambiguous_terminal":
        return {"min_acc": 2, "compaction": "never", "retry": "force_nonroot", "terminal": "null"}
    if kind == "walk_mismatch":
        return {"min_acc": 2, "compaction": "never", "retry": "never", "terminal": "set"}
    if kind == "ambiguous_output":
        return {"terminal": "null", "accepted": "null"}
    if kind == "accepted_mismatch":
        return {"accepted": "set"}
    return {}


def _simulate(cfg: _Cfg, i: int) -> _Rollout:
    rng, r = cfg.rollout_rngs(i)
    kind = r.choice(cfg.kinds) if (cfg.kinds and r.random() < cfg.corrupt_rate) else None
    need = _needs(kind)

    # ---- structure: accepted calls, compactions, retries
    p_stop = 1.0 / cfg.mean_calls
    n_acc = 1
    while r.random() >= p_stop and n_acc < 400:
        n_acc += 1
    n_acc = max(n_acc, need.get("min_acc", 1))
    compact = set()
    mode = need.get("compaction")
    if n_acc >= 2 and mode != "never" and (mode == "force" or r.random() < cfg.compaction_rate):
        k = 1
        while r.random() < 0.35 and k < n_acc - 1:
            k += 1
        compact = set(r.sample(range(1, n_acc), k))
        if need.get("link") and len(compact) == n_acc - 1:
            compact.discard(r.choice(sorted(compact)))
    retry_mode = need.get("retry")
    retries = [0] * n_acc
    if retry_mode != "never":
        for j in range(n_acc):
            if r.random() < cfg.retry_rate:
                retries[j] = 2 if r.random() < 0.1 else 1
        if retry_mode == "force_nonroot":
            retries[0] = 0
            if not any(retries):
                retries[r.randrange(1, n_acc)] = 1

    # ids: ~15 % of harnesses drop every item id; the others keep ~92 % of them.
    with_ids = 0.0 if r.random() < 0.15 else 0.92

    # ---- calls in capture order: [retries of j..., j] for each accepted j
    group_prompt, p_success = cfg.group(i // cfg.group_size)
    calls = []  # lists indexed by _CID...
    spans = []  # (start, carry_len, gen_len, kind_of_carry, copy_from) per call, capture order
    acc = []  # capture positions of the accepted calls, in order
    pos = 0
    parent_cid = None
    parent_full = 0
    k_call = 0
    for j in range(n_acc):
        root = j == 0 or j in compact
        if j == 0:
            carry, carry_kind = len(group_prompt), 1
        elif root:
            sum_len = _lognormal_len(r, max(1.0, 0.3 * cfg.prompt_tokens), 0.5, 6)
            carry, carry_kind = cfg.sys_len + sum_len, 2
        else:
            carry, carry_kind = _lognormal_len(r, cfg.mean_obs, 1.0, 20), 0
        parent = None if root else parent_cid
        prev = 0 if root else parent_full
        final = j == n_acc - 1
        first_of_j = len(spans)
        for t in range(retries[j] + 1):
            gen = _lognormal_len(r, cfg.mean_gen, 0.9, 16)
            keys, ids = _items(r, final, with_ids)
            if with_ids == 0.0 and r.random() < 0.5:
                ids = None  # a null id list: every id null
            k_call += 1
            cid = f"c{k_call:03d}"
            calls.append([cid, parent, "resp_" + _hex(r), prev, carry + gen, gen, 0, keys, ids, False])
            spans.append((pos, carry, gen, carry_kind, first_of_j if t else -1))
            pos += carry + gen
        acc.append(len(calls) - 1)
        parent_cid = cid
        parent_full = prev + carry + gen

    # ---- tokens and logprobs (one draw per rollout), then chain hashes in capture order
    total = pos
    tok = rng.integers(0, cfg.vocab, total, dtype=np.int32)
    gens = sum(s[2] for s in spans)
    lp = None
    if cfg.logprobs:
        lp = np.zeros(total, dtype=np.float32)
        noise = (-(rng.exponential(0.6, gens) + 1e-4)).astype(np.float32)
        g0 = 0
    hashes = {}
    for c, (start, carry, gen, carry_kind, copy_from) in zip(calls, spans):
        if copy_from >= 0:  # same request as the first call of its retry group (captured earlier)
            src = spans[copy_from][0]
            tok[start : start + carry] = tok[src : src + carry]
        elif carry_kind == 1:
            tok[start : start + carry] = group_prompt
        elif carry_kind == 2:
            tok[start : start + cfg.sys_len] = cfg.sys_prompt
        end = start + carry + gen
        parent = c[_PARENT]
        h = xxhash.xxh3_64_intdigest(tok[start:end].tobytes(), hashes[parent] if parent is not None else 0)
        c[_HASH] = h
        hashes[c[_CID]] = h
        if lp is not None:
            lp[start + carry : end] = noise[g0 : g0 + gen]
            g0 += gen
    tok_rows = [[c[_CID], s[0], s[0] + s[1] + s[2], s[0], s[0] + s[1] + s[2]] for c, s in zip(calls, spans)]

    # ---- the rollouts row
    out_keys, out_ids = [], []
    for a in acc:
        c = calls[a]
        out_keys.extend(c[_KEYS])
        out_ids.extend(c[_IDS] if c[_IDS] is not None else [None] * len(c[_KEYS]))
    if (r.random() < 0.1 or not any(x is not None for x in out_ids)) and r.random() < 0.5:
        out_ids = None  # a null output_ids list: every id null
    term_mode = need.get("terminal")
    if term_mode == "set" or (term_mode is None and r.random() < 0.85):
        terminal = calls[acc[-1]][_RID]
    else:
        terminal = None
    acc_mode = need.get("accepted")
    if acc_mode == "set" or (acc_mode is None and r.random() < cfg.accepted_rate):
        accepted = [calls[a][_RID] for a in acc]
    else:
        accepted = None
    u = r.random()
    base = 1.0 if u < p_success else (0.5 if u < p_success + 0.25 * (1 - p_success) else 0.0)
    reward = base + r.gauss(0.0, 0.02)
    rid = f"r{i:08d}"
    ro_rows = [[rid, f"g{i // cfg.group_size}", reward, out_keys, out_ids, terminal, accepted]]

    ro = _Rollout()
    ro.calls, ro.tok_rows, ro.ro_rows, ro.tok, ro.lp, ro.kind = calls, tok_rows, ro_rows, tok, lp, kind
    if kind is not None:
        _corrupt(ro, kind, r, acc, spans, cfg)
    return ro


# --------------------------------------------------------------------------------------------
# Corruptions: exactly one per corrupt rollout; the kind name is the reason it triggers.


def _corrupt(ro: _Rollout, kind: str, r: random.Random, acc: list[int], spans, cfg: _Cfg) -> None:
    calls, tok_rows, row = ro.calls, ro.tok_rows, ro.ro_rows[0]
    rejected = [k for k in range(len(calls)) if k not in set(acc)]
    sel = acc[r.randrange(len(acc))]  # a random selected call (capture position)

    def bogus(prefix: str) -> str:
        return prefix + "missing_" + _hex(r, 8)

    if kind == "no_rollout_record":
        ro.ro_rows = []
    elif kind == "no_calls":
        ro.calls, ro.tok_rows = [], []
    elif kind == "capture_failed":
        calls[r.randrange(len(calls))][_FAILED] = True
    elif kind == "reward_invalid":
        row[2] = r.choice((None, math.nan, math.inf, -math.inf))
    elif kind == "duplicate_call":
        variants = ["call_id", "token_row", "rollouts_row"] + (["response_id"] if len(calls) > 1 else [])
        v = r.choice(variants)
        if v == "call_id":  # the same call captured twice
            k = r.randrange(len(calls))
            calls.insert(k + 1, list(calls[k]))
        elif v == "response_id":
            a, b = sorted(r.sample(range(len(calls)), 2))
            calls[b][_RID] = calls[a][_RID]
        elif v == "token_row":
            tok_rows.append(list(tok_rows[r.randrange(len(tok_rows))]))
        else:  # the rollouts row written twice, the second with another reward
            dup = list(row)
            dup[2] = 1.0 - (row[2] or 0.0)
            ro.ro_rows.append(dup)
    elif kind == "length_mismatch":
        variants = ["item_ids", "output_ids", "delta_len", "prev_len", "gen_len"]
        if cfg.logprobs:
            variants.append("logprobs")
        v = r.choice(variants)
        c = calls[sel]
        if v == "item_ids":
            c = calls[r.randrange(len(calls))]
            ids = c[_IDS] if c[_IDS] is not None else [None] * len(c[_KEYS])
            c[_IDS] = ids[:-1] if r.random() < 0.5 else ids + ["rs_" + _hex(r)]
        elif v == "output_ids":
            ids = row[4] if row[4] is not None else [None] * len(row[3])
            row[4] = ids[:-1] if r.random() < 0.5 else ids + [None]
        elif v == "delta_len":
            c[_DELTA] += 1
        elif v == "prev_len":
            c[_PREV] += r.choice((1, -1)) if c[_PREV] > 0 else 1
        elif v == "gen_len":
            c[_GEN] = r.choice((0, c[_DELTA] + 1))
        else:  # one logprob short
            tok_rows[sel][4] -= 1
    elif kind == "no_output":
        row[3], row[4] = [], ([] if r.random() < 0.5 else None)
    elif kind == "unmatched_output":
        p = r.randrange(len(row[3]))
        row[3] = list(row[3])
        row[3][p] = r.getrandbits(64)
    elif kind == "ambiguous_output":
        # The last accepted call served twice, identically (temperature 0), with no ids, no
        # terminal and no accepted list to tell the two apart.
        last = acc[-1]
        c = calls[last]
        n = len(c[_KEYS])
        c[_IDS] = None
        if row[4] is not None:
            row[4] = row[4][: len(row[3]) - n] + [None] * n
        row[5] = row[6] = None
        twin = list(c)
        twin[_CID] = c[_CID] + "a"
        twin[_RID] = "resp_" + _hex(r)
        calls.insert(last, twin)
        tok_rows.insert(last, [twin[_CID]] + tok_rows[last][1:])
    elif kind == "out_of_order":
        k = r.randrange(len(acc) - 1)
        a, b = acc[k], acc[k + 1]
        calls[a], calls[b] = calls[b], calls[a]
    elif kind == "terminal_mismatch":
        options = [bogus("resp_")]
        if len(acc) > 1:
            options.append(calls[acc[r.randrange(len(acc) - 1)]][_RID])
        if rejected:
            options.append(calls[r.choice(rejected)][_RID])
        row[5] = r.choice(options)
    elif kind == "accepted_mismatch":
        extra = calls[r.choice(rejected)][_RID] if rejected and r.random() < 0.5 else bogus("resp_")
        row[6] = list(row[6]) + [extra]
    elif kind == "broken_chain":
        # The output skips an accepted call whose child is the next accepted call.
        links = [k for k in range(len(acc) - 1) if calls[acc[k + 1]][_PARENT] == calls[acc[k]][_CID]]
        k = r.choice(links)
        skip = calls[acc[k]]
        start = sum(len(calls[a][_KEYS]) for a in acc[:k])
        n = len(skip[_KEYS])
        row[3] = row[3][:start] + row[3][start + n :]
        if row[4] is not None:
            row[4] = row[4][:start] + row[4][start + n :]
        if row[6] is not None:
            row[6] = [x for x in row[6] if x != skip[_RID]]
    elif kind == "walk_mismatch":
        k = r.randrange(1, len(acc))
        calls[acc[k]][_PARENT] = bogus("c")
    elif kind in ("multiple_roots", "ambiguous_terminal"):
        pass  # structural only (see _needs): clean in cc mode
    elif kind == "missing_tokens":
        del tok_rows[sel]
    elif kind == "hash_mismatch":
        if r.random() < 0.75:  # a token flipped after capture
            t = r.randrange(tok_rows[sel][1], tok_rows[sel][2])
            ro.tok[t] = (int(ro.tok[t]) + 1 + r.randrange(cfg.vocab - 1)) % cfg.vocab
        else:  # a bit flipped in the recorded hash
            calls[sel][_HASH] ^= 1 << r.randrange(64)
    elif kind == "logprob_invalid":
        start, carry, gen = spans[sel][0], spans[sel][1], spans[sel][2]
        if r.random() < 0.5:
            ro.lp[start + carry + r.randrange(gen)] = r.choice((math.nan, math.inf, -math.inf))
        else:
            ro.lp[start + r.randrange(carry)] = -round(r.uniform(0.01, 3.0), 3)
    else:  # pragma: no cover
        raise AssertionError(kind)


# --------------------------------------------------------------------------------------------
# Batches of blocks -> Arrow tables.


def _list_array(offsets: list[int] | np.ndarray, values: pa.Array, nulls: list[bool] | None = None) -> pa.Array:
    offs = pa.array(np.asarray(offsets, dtype=np.int32))
    mask = pa.array(nulls, type=pa.bool_()) if nulls is not None and any(nulls) else None
    return pa.ListArray.from_arrays(offs, values, mask=mask)


def _gather(buf: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate buf[starts[k] : starts[k] + lens[k]] for every k; returns (values, offsets)."""
    offsets = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    idx = np.repeat(starts - offsets[:-1], lens) + np.arange(total, dtype=np.int64)
    return buf[idx], offsets


def _build_batch(cfg: _Cfg, first: int, stop: int) -> tuple[tuple[pa.Table, pa.Table, pa.Table], dict]:
    # ledger columns
    l_ro, l_cid, l_par, l_rid = [], [], [], []
    l_prev, l_delta, l_gen, l_hash, l_failed = [], [], [], [], []
    k_offs, k_vals, i_offs, i_vals, i_null = [0], [], [0], [], []
    l_key = []  # interleave sort key
    # tokens rows
    t_ro, t_cid, t_start, t_stop, t_lstart, t_lstop, t_key = [], [], [], [], [], [], []
    toks, lps = [], []
    base = 0
    # rollouts columns
    r_ro, r_gid, r_rew, r_term = [], [], [], []
    ok_offs, ok_vals, oi_offs, oi_vals, oi_null = [0], [], [0], [], []
    a_offs, a_vals, a_null = [0], [], []
    n_corrupt = 0

    for b0 in range(first, stop, BLOCK):
        b1 = min(b0 + BLOCK, stop)
        brng = _rng(cfg.seed, 2, b0 // BLOCK)
        overlap = brng.uniform(0.0, 2.5, BLOCK)
        n_tok_rows_before = len(t_ro)
        for i in range(b0, b1):
            ro = _simulate(cfg, i)
            n_corrupt += ro.kind is not None
            rid = f"r{i:08d}"
            local = (i - b0) + (b0 // BLOCK) * (BLOCK + 8)
            n = len(ro.calls)
            ov = overlap[i - b0] / max(n, 1)
            for pos, c in enumerate(ro.calls):
                l_ro.append(rid)
                l_cid.append(c[_CID])
                l_par.append(c[_PARENT])
                l_rid.append(c[_RID])
                l_prev.append(c[_PREV])
                l_delta.append(c[_DELTA])
                l_gen.append(c[_GEN])
                l_hash.append(c[_HASH])
                l_failed.append(c[_FAILED])
                keys = c[_KEYS]
                k_vals.extend(keys)
                k_offs.append(len(k_vals))
                ids = c[_IDS]
                if ids is None:
                    i_null.append(True)
                else:
                    i_null.append(False)
                    i_vals.extend(ids)
                i_offs.append(len(i_vals))
                l_key.append(local + pos * ov)
            for tr in ro.tok_rows:
                t_ro.append(rid)
                t_cid.append(tr[0])
                t_start.append(base + tr[1])
                t_stop.append(base + tr[2])
                t_lstart.append(base + tr[3])
                t_lstop.append(base + tr[4])
            toks.append(ro.tok)
            if ro.lp is not None:
                lps.append(ro.lp)
            base += len(ro.tok)
            for row in ro.ro_rows:
                r_ro.append(row[0])
                r_gid.append(row[1])
                r_rew.append(row[2])
                ok_vals.extend(row[3])
                ok_offs.append(len(ok_vals))
                if row[4] is None:
                    oi_null.append(True)
                else:
                    oi_null.append(False)
                    oi_vals.extend(row[4])
                oi_offs.append(len(oi_vals))
                r_term.append(row[5])
                if row[6] is None:
                    a_null.append(True)
                else:
                    a_null.append(False)
                    a_vals.extend(row[6])
                a_offs.append(len(a_vals))
        # token rows: shuffled within the block
        nt = len(t_ro) - n_tok_rows_before
        t_key.extend((brng.permutation(nt) + n_tok_rows_before).tolist())

    ledger = pa.Table.from_arrays(
        [
            pa.array(l_ro, pa.string()),
            pa.array(l_cid, pa.string()),
            pa.array(l_par, pa.string()),
            pa.array(l_rid, pa.string()),
            pa.array(np.array(l_prev, dtype=np.int64)),
            pa.array(np.array(l_delta, dtype=np.int64)),
            pa.array(np.array(l_gen, dtype=np.int64)),
            pa.array(np.array(l_hash, dtype=np.uint64)),
            _list_array(k_offs, pa.array(np.array(k_vals, dtype=np.uint64))),
            _list_array(i_offs, pa.array(i_vals, pa.string()), i_null),
            pa.array(np.array(l_failed, dtype=bool)),
        ],
        schema=LEDGER_SCHEMA,
    )
    if len(l_key):
        ledger = ledger.take(pa.array(np.argsort(np.array(l_key), kind="stable")))

    order = np.array(t_key, dtype=np.int64)  # t_key[j] = source row of output row j
    tok_buf = np.concatenate(toks) if toks else np.zeros(0, np.int32)
    starts = np.array(t_start, dtype=np.int64)[order] if len(order) else np.zeros(0, np.int64)
    lens = (np.array(t_stop, dtype=np.int64) - np.array(t_start, dtype=np.int64))[order] if len(order) else starts
    tvals, toffs = _gather(tok_buf, starts, lens)
    if len(toffs) and toffs[-1] >= 2**31:
        raise ValueError("a batch holds 2**31 tokens or more: pass a smaller batch_rollouts")
    t_ro_arr = pa.array(t_ro, pa.string()).take(pa.array(order))
    t_cid_arr = pa.array(t_cid, pa.string()).take(pa.array(order))
    cols = [t_ro_arr, t_cid_arr, _list_array(toffs, pa.array(tvals))]
    schema = TOKENS_SCHEMA
    if cfg.logprobs:
        lp_buf = np.concatenate(lps) if lps else np.zeros(0, np.float32)
        lstarts = np.array(t_lstart, dtype=np.int64)[order] if len(order) else starts
        llens = (np.array(t_lstop, dtype=np.int64) - np.array(t_lstart, dtype=np.int64))[order] if len(order) else lens
        lvals, loffs = _gather(lp_buf, lstarts, llens)
        cols.append(_list_array(loffs, pa.array(lvals)))
        schema = schema.append(LOGPROBS_FIELD)
    tokens = pa.Table.from_arrays(cols, schema=schema)

    rollouts = pa.Table.from_arrays(
        [
            pa.array(r_ro, pa.string()),
            pa.array(r_gid, pa.string()),
            pa.array(r_rew, pa.float64()),
            _list_array(ok_offs, pa.array(np.array(ok_vals, dtype=np.uint64))),
            _list_array(oi_offs, pa.array(oi_vals, pa.string()), oi_null),
            pa.array(r_term, pa.string()),
            _list_array(a_offs, pa.array(a_vals, pa.string()), a_null),
        ],
        schema=ROLLOUTS_SCHEMA.append(ACCEPTED_FIELD),
    )
    stats = {"rollouts": stop - first, "corrupt": n_corrupt, "calls": ledger.num_rows, "tokens": int(len(tvals))}
    return (ledger, tokens, rollouts), stats


def tables_schemas(logprobs: bool = True) -> tuple[pa.Schema, pa.Schema, pa.Schema]:
    """The (ledger, tokens, rollouts) schemas synth produces."""
    tok = TOKENS_SCHEMA.append(LOGPROBS_FIELD) if logprobs else TOKENS_SCHEMA
    return LEDGER_SCHEMA, tok, ROLLOUTS_SCHEMA.append(ACCEPTED_FIELD)


_DEFAULTS = dict(
    group_size=4,
    compaction_rate=0.3,
    retry_rate=0.15,
    corrupt_rate=0.05,
    logprobs=True,
    accepted_rate=0.2,
    mean_calls=6,
    mean_gen_tokens=200,
    mean_obs_tokens=120,
    prompt_tokens=800,
    vocab=150_000,
    corrupt_kinds=None,
)


def _make_cfg(seed, kw) -> _Cfg:
    unknown = set(kw) - set(_DEFAULTS)
    if unknown:
        raise TypeError(f"unexpected keyword arguments {sorted(unknown)}")
    return _Cfg(seed, **{**_DEFAULTS, **kw})


_WORKER_CFG: dict = {}


def _batch_job(seed: int, kw_items: tuple, first: int, stop: int):
    """One batch, in a worker process (the config is built once per worker)."""
    key = (seed, kw_items)
    cfg = _WORKER_CFG.get(key)
    if cfg is None:
        _WORKER_CFG.clear()
        cfg = _WORKER_CFG[key] = _make_cfg(seed, dict(kw_items))
    return _build_batch(cfg, first, stop)


def _resolve_workers(workers: int | None) -> int:
    if workers is None or workers <= 0:
        return max(1, os.cpu_count() or 1)
    return int(workers)


def _iter(n_rollouts: int, seed: int, batch_rollouts: int, kw: dict, workers: int = 1) -> Iterator[tuple[tuple, dict]]:
    if n_rollouts < 0:
        raise ValueError("n_rollouts must be >= 0")
    if batch_rollouts < 1:
        raise ValueError("batch_rollouts must be >= 1")
    if kw.get("corrupt_kinds") is not None:
        kw = {**kw, "corrupt_kinds": tuple(kw["corrupt_kinds"])}
    cfg = _make_cfg(seed, kw)  # validates the arguments here, in the caller's process
    step = max(BLOCK, -(-int(batch_rollouts) // BLOCK) * BLOCK)
    ranges = [(a, min(a + step, n_rollouts)) for a in range(0, n_rollouts, step)]
    workers = _resolve_workers(workers)
    if workers == 1 or len(ranges) < 2:
        for a, b in ranges:
            yield _build_batch(cfg, a, b)
        return
    # Worker processes build batches (pure Python + numpy: threads would not help); the caller
    # consumes them in order. "spawn": safe whatever threads the caller runs (numba, Arrow).
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    kw_items = tuple(sorted(kw.items()))
    ex = ProcessPoolExecutor(max_workers=min(workers, len(ranges)), mp_context=multiprocessing.get_context("spawn"))
    try:
        pending = []
        todo = iter(ranges)
        for a, b in todo:
            pending.append(ex.submit(_batch_job, int(seed), kw_items, a, b))
            if len(pending) >= 2 * workers:
                break
        while pending:
            result = pending.pop(0).result()
            for a, b in todo:
                pending.append(ex.submit(_batch_job, int(seed), kw_items, a, b))
                break
            yield result
    finally:
        ex.shutdown(wait=True, cancel_futures=True)


def iter_synth_batches(
    n_rollouts: int,
    seed: int = 0,
    *,
    batch_rollouts: int = DEFAULT_BATCH_ROLLOUTS,
    workers: int | None = 1,
    **kw,
) -> Iterator[tuple[pa.Table, pa.Table, pa.Table]]:
    """Yield (ledger, tokens, rollouts) tables for consecutive chunks of rollouts.

    ``batch_rollouts`` is rounded up to a multiple of ``BLOCK``. The concatenation of all chunks
    is the same for every batch size and worker count and equals ``synth_tables(n_rollouts, seed,
    **kw)``. Each chunk holds every row of its rollouts. ``workers`` > 1 (None or 0: one per CPU)
    builds batches in that many ``spawn``ed processes. Other keyword arguments are those of
    ``synth_tables``.
    """
    for tables, _ in _iter(n_rollouts, seed, batch_rollouts, kw, workers):
        yield tables


def synth_tables(
    n_rollouts: int,
    seed: int = 0,
    *,
    group_size: int = 4,
    compaction_rate: float = 0.3,
    retry_rate: float = 0.15,
    corrupt_rate: float = 0.05,
    logprobs: bool = True,
    accepted_rate: float = 0.2,
    mean_calls: float = 6,
    mean_gen_tokens: float = 200,
    mean_obs_tokens: float = 120,
    prompt_tokens: int = 800,
    vocab: int = 150_000,
    corrupt_kinds=None,
) -> tuple[pa.Table, pa.Table, pa.Table]:
    """A synthetic SPEC §2 dataset: (ledger, tokens, rollouts) Arrow tables.

    ``mean_calls`` is the mean number of *accepted* calls per rollout (geometric; retries come
    on top). ``corrupt_kinds`` defaults to every kind of ``CORRUPT_KINDS`` (without
    ``logprob_invalid`` when ``logprobs`` is False). The tokens table has the ``logprobs`` column
    when ``logprobs``; the rollouts table always has ``accepted_response_ids`` (null when the
    harness kept no record).
    """
    kw = dict(
        group_size=group_size,
        compaction_rate=compaction_rate,
        retry_rate=retry_rate,
        corrupt_rate=corrupt_rate,
        logprobs=logprobs,
        accepted_rate=accepted_rate,
        mean_calls=mean_calls,
        mean_gen_tokens=mean_gen_tokens,
        mean_obs_tokens=mean_obs_tokens,
        prompt_tokens=prompt_tokens,
        vocab=vocab,
        corrupt_kinds=corrupt_kinds,
    )
    parts = [t for t, _ in _iter(n_rollouts, seed, DEFAULT_BATCH_ROLLOUTS, kw)]
    if not parts:
        return tuple(s.empty_table() for s in tables_schemas(logprobs))  # type: ignore[return-value]
    if len(parts) == 1:
        return parts[0]
    return tuple(pa.concat_tables([p[k] for p in parts]) for k in range(3))  # type: ignore[return-value]


def write_synth_dataset(
    out_dir,
    n_rollouts: int,
    seed: int = 0,
    *,
    batch_rollouts: int = DEFAULT_BATCH_ROLLOUTS,
    workers: int | None = 1,
    overwrite: bool = False,
    compression: str = "snappy",
    **kw,
) -> dict:
    """Write ``ledger.parquet``, ``tokens.parquet`` and ``rollouts.parquet`` under ``out_dir``.

    Batches are streamed (one row group per batch and table) into a temporary directory next to
    ``out_dir``, renamed into place at the end: an interrupted run leaves nothing behind. An
    existing non-empty ``out_dir`` is an error unless ``overwrite`` (then it is replaced whole).
    ``workers``: see ``iter_synth_batches``. Other keyword arguments are those of ``synth_tables``.
    Returns a summary: rollouts, corrupt, calls, tokens, bytes (of the three files), seconds, path.
    """
    t0 = time.perf_counter()
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out} exists and is not empty (pass overwrite=True)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.synth-{os.getpid()}-{random.getrandbits(32):08x}"
    tmp.mkdir()  # not mkdtemp: the dataset gets the usual umask permissions
    summary = {"rollouts": 0, "corrupt": 0, "calls": 0, "tokens": 0}
    names = ("ledger", "tokens", "rollouts")
    writers: list = []
    try:
        schemas = tables_schemas(kw.get("logprobs", True))
        writers = [pq.ParquetWriter(tmp / f"{n}.parquet", s, compression=compression) for n, s in zip(names, schemas)]
        for tables, stats in _iter(n_rollouts, seed, batch_rollouts, kw, workers):
            for w, t in zip(writers, tables):
                w.write_table(t)
            for k in summary:
                summary[k] += stats[k]
        for w in writers:
            w.close()
        writers = []
        nbytes = sum((tmp / f"{n}.parquet").stat().st_size for n in names)
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}-{random.getrandbits(32):08x}"
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        for w in writers:
            try:
                w.close()
            except Exception:
                pass
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    summary.update(bytes=nbytes, seconds=round(time.perf_counter() - t0, 3), path=str(out))
    return summary


def main(argv=None) -> int:
    """``python -m chainrows.synth OUT --rollouts N [--seed S] ...``: write a synthetic dataset."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m chainrows.synth", description=main.__doc__)
    ap.add_argument("out")
    ap.add_argument("--rollouts", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1, help="processes building batches (0: one per CPU)")
    ap.add_argument("--batch-rollouts", type=int, default=DEFAULT_BATCH_ROLLOUTS)
    ap.add_argument("--corrupt-rate", type=float, default=_DEFAULTS["corrupt_rate"])
    ap.add_argument("--no-logprobs", action="store_true")
    ap.add_argument("--overwrite", action="store_true")
    a = ap.parse_args(argv)
    summary = write_synth_dataset(
        a.out,
        a.rollouts,
        a.seed,
        batch_rollouts=a.batch_rollouts,
        workers=a.workers,
        overwrite=a.overwrite,
        corrupt_rate=a.corrupt_rate,
        logprobs=not a.no_logprobs,
    )
    print(
        f"wrote {summary['path']}: {summary['rollouts']} rollouts ({summary['corrupt']} corrupt), "
        f"{summary['calls']} calls, {summary['tokens']} tokens, {summary['bytes'] / 1e6:.1f} MB "
        f"in {summary['seconds']:.1f} s"
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
