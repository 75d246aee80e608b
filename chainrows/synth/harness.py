"""The simulated harness: one rollout at a time, a pure function of (seed, rollout index).

Call 1 is a root whose delta is the system + user prompt (carry) followed by the model's
generation; every later call's delta is the observation since the previous accepted call (carry)
followed by the generation. Compactions start a new root (system prompt + summary); rejected
retries are siblings of an accepted call with the same carry. A corrupt rollout is first built
with the structure its kind needs (``corrupt.needed_structure``), then corrupted (``corrupt.corrupt_rollout``).
"""

from __future__ import annotations

import math
import random
import struct

import numpy as np
import xxhash

from chainrows.formats.native.hashing import chain_hash
from chainrows.synth.calls import CID, HASH, IDS, KEYS, PARENT, RID, Rollout, call_items, hex_id
from chainrows.synth.corrupt import corrupt_rollout, needed_structure
from chainrows.synth.params import PARAM_NAMES, SynthParams


def _lognormal_len(r: random.Random, mean: float, sigma: float, cap: float) -> int:
    """A length >= 1, lognormal with the given mean, capped at cap * mean (long tail)."""
    if mean <= 1:
        return 1
    x = r.lognormvariate(math.log(mean) - 0.5 * sigma * sigma, sigma)
    return max(1, min(int(x + 0.5), int(cap * mean)))


class Cfg:
    """Validated parameters as the simulator reads them, the system prompt shared by every
    rollout, a cache of group prompts, and the reused generators (not shared between threads)."""

    def __init__(self, seed: int, params: SynthParams):
        self.seed = int(seed)
        self.params = params
        self.group_size = int(params.group_size)
        self.compaction_rate = float(params.compaction_rate)
        self.retry_rate = float(params.retry_rate)
        self.corrupt_rate = float(params.corrupt_rate)
        self.logprobs = bool(params.logprobs)
        self.accepted_rate = float(params.accepted_rate)
        self.worker_rate = float(params.worker_rate)
        self.forest_rate = self.worker_rate + float(params.fork_rate)
        self.mean_calls = float(params.mean_calls)
        self.mean_gen = float(params.mean_gen_tokens)
        self.mean_obs = float(params.mean_obs_tokens)
        self.prompt_tokens = max(2, int(params.prompt_tokens))
        self.vocab = int(params.vocab)
        self.kinds = params.kinds
        # The system prompt, shared by every rollout (and kept by compactions).
        self.sys_len = max(1, self.prompt_tokens // 2)
        rng = rng_for(self.seed, 3)
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
            rng = rng_for(self.seed, 1, g)
            r = random.Random(int(rng.integers(2**63)))
            user_len = _lognormal_len(r, max(1.0, self.prompt_tokens - self.sys_len), 0.4, 8)
            user = rng.integers(0, self.vocab, user_len, dtype=np.int32)
            hit = (np.concatenate([self.sys_prompt, user]), r.betavariate(1.2, 1.2))
            self._groups[g] = hit
        return hit


_MASK128 = (1 << 128) - 1
_PACK = struct.Struct("<QQ").pack


def rng_for(*key: int) -> np.random.Generator:
    """A numpy generator for ``key`` (seed first, then e.g. the rollout index): the same key
    draws the same numbers in any process and any batch split."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(key[0], spawn_key=key[1:])))


def make_cfg(seed, kw: dict) -> Cfg:
    """The config of ``seed`` and the SynthParams named in ``kw``: TypeError for an unknown
    name, ValueError for a seed outside [0, 2**64) or a bad parameter."""
    unknown = set(kw) - PARAM_NAMES
    if unknown:
        raise TypeError(f"unexpected keyword arguments {sorted(unknown)}")
    if not 0 <= int(seed) < 2**64:
        raise ValueError("seed must be in [0, 2**64)")
    return Cfg(seed, SynthParams(**kw))


def _forest(r: random.Random, shape: str, n_acc: int) -> tuple[list, list]:
    """The accepted calls of a forest rollout (SPEC §3.1) in capture order: each one's parent
    (an earlier accepted call's index, None for a root) and whether it ends its worker or branch
    (its items end with an assistant message).

    ``workers``: 2-4 workers, each its own root and chain; worker 0 starts (the group prompt),
    worker 1's root comes next, then the other calls interleave at random, so worker 0's second
    call never follows its first and the linear plan always sees ``broken_chain``.
    ``fork``: a trunk of one or more calls whose last call is continued by two branches of one
    or more calls each, interleaved at random (the second branch's first call never follows the
    fork call directly)."""
    if shape == "workers":
        w = 2
        while w < 4 and r.random() < 0.3:
            w += 1
        n = max(n_acc, w + 1)
        sizes = [2] + [1] * (w - 1)
        for _ in range(n - w - 1):
            sizes[r.randrange(w)] += 1
        rest = [0] * (sizes[0] - 1) + [1] * (sizes[1] - 1)
        for k in range(2, w):
            rest += [k] * sizes[k]
        r.shuffle(rest)
        order, trunk = [0, 1] + rest, None
    else:
        n = max(n_acc, 3)
        t = r.randint(1, n - 2)  # trunk calls
        a = r.randint(1, n - t - 1)  # calls of branch 1; the others are branch 2's
        rest = [1] * a + [2] * (n - t - a)
        r.shuffle(rest)
        order, trunk = [0] * t + rest, 0
    par, tip = [], {}
    for j, k in enumerate(order):
        par.append(tip.get(k, tip.get(trunk) if k != trunk else None))
        tip[k] = j
    last = [False] * n
    for k, j in tip.items():
        last[j] = k != trunk
    return par, last


def simulate(cfg: Cfg, i: int) -> Rollout:
    """Rollout ``i`` of the run ``cfg``: its calls, tokens and rollouts row, corrupted when its
    draw says so (a function of the seed and ``i`` alone)."""
    rng, r = cfg.rollout_rngs(i)
    kind = r.choice(cfg.kinds) if (cfg.kinds and r.random() < cfg.corrupt_rate) else None
    need = needed_structure(kind)
    shape = None
    if cfg.forest_rate > 0:  # no draw when both rates are 0: such datasets stay byte-identical
        u = r.random()
        if kind is None and u < cfg.forest_rate:
            shape = "workers" if u < cfg.worker_rate else "fork"
    par, last, retries = _structure(cfg, r, need, shape)
    # ids: ~15 % of harnesses drop every item id; the others keep ~92 % of them.
    with_ids = 0.0 if r.random() < 0.15 else 0.92
    group_prompt, p_success = cfg.group(i // cfg.group_size)
    calls, spans, acc = _capture(cfg, r, par, last, retries, with_ids, len(group_prompt))
    ro = Rollout()
    ro.tok, ro.lp = _tokens(cfg, rng, calls, spans, group_prompt)
    ro.calls, ro.kind = calls, kind
    ro.tok_rows = [[c[CID], s[0], s[0] + s[1] + s[2], s[0], s[0] + s[1] + s[2]] for c, s in zip(calls, spans)]
    ro.ro_rows = [_rollouts_row(cfg, r, i, calls, acc, need, p_success)]
    if kind is not None:
        corrupt_rollout(ro, kind, r, acc, spans, cfg)
    return ro


def _structure(cfg: Cfg, r: random.Random, need: dict, shape: str | None) -> tuple[list, list, list]:
    """The accepted calls: each one's parent among them (None for a root: the first call and
    each compaction), whether it ends its chain, and its rejected retries (0, 1 or 2)."""
    p_stop = 1.0 / cfg.mean_calls
    n_acc = 1
    while r.random() >= p_stop and n_acc < 400:
        n_acc += 1
    n_acc = max(n_acc, need.get("min_acc", 1))
    if shape is None:
        compact = set()
        mode = need.get("compaction")
        if n_acc >= 2 and mode != "never" and (mode == "force" or r.random() < cfg.compaction_rate):
            k = 1
            while r.random() < 0.35 and k < n_acc - 1:
                k += 1
            compact = set(r.sample(range(1, n_acc), k))
            if need.get("link") and len(compact) == n_acc - 1:
                compact.discard(r.choice(sorted(compact)))
        par = [None if (j == 0 or j in compact) else j - 1 for j in range(n_acc)]
        last = [j == n_acc - 1 for j in range(n_acc)]
    else:
        par, last = _forest(r, shape, n_acc)
        n_acc = len(par)
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
    return par, last, retries


def _capture(cfg: Cfg, r: random.Random, par: list, last: list, retries: list, with_ids: float,
             prompt_len: int) -> tuple[list, list, list]:
    """The calls in capture order (``[retries of j..., j]`` for each accepted j), their token
    spans ``(start, carry_len, gen_len, kind_of_carry, copy_from)`` and the capture positions of
    the accepted calls. Chain hashes are filled in later (``_tokens``)."""
    calls, spans, acc = [], [], []
    pos = 0
    acc_cid, acc_full = [], []  # per accepted call: call id, prev_len + delta_len
    k_call = 0
    for j in range(len(par)):
        root = par[j] is None
        if j == 0:
            carry, carry_kind = prompt_len, 1
        elif root:
            sum_len = _lognormal_len(r, max(1.0, 0.3 * cfg.prompt_tokens), 0.5, 6)
            carry, carry_kind = cfg.sys_len + sum_len, 2
        else:
            carry, carry_kind = _lognormal_len(r, cfg.mean_obs, 1.0, 20), 0
        parent = None if root else acc_cid[par[j]]
        prev = 0 if root else acc_full[par[j]]
        first_of_j = len(spans)
        for t in range(retries[j] + 1):
            gen = _lognormal_len(r, cfg.mean_gen, 0.9, 16)
            keys, ids = call_items(r, last[j], with_ids)
            if with_ids == 0.0 and r.random() < 0.5:
                ids = None  # a null id list: every id null
            k_call += 1
            cid = f"c{k_call:03d}"
            calls.append([cid, parent, "resp_" + hex_id(r), prev, carry + gen, gen, 0, keys, ids, False])
            spans.append((pos, carry, gen, carry_kind, first_of_j if t else -1))
            pos += carry + gen
        acc.append(len(calls) - 1)
        acc_cid.append(cid)
        acc_full.append(prev + carry + gen)
    return calls, spans, acc


def _tokens(cfg: Cfg, rng: np.random.Generator, calls: list, spans: list,
            group_prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The rollout's tokens and logprobs (one draw each), and each call's chain hash, set in
    capture order. A retry repeats its group's first request; a root starts with the prompt."""
    total = spans[-1][0] + spans[-1][1] + spans[-1][2] if spans else 0
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
        parent = c[PARENT]
        h = chain_hash(tok[start:end], hashes[parent] if parent is not None else 0)
        c[HASH] = h
        hashes[c[CID]] = h
        if lp is not None:
            lp[start + carry : end] = noise[g0 : g0 + gen]
            g0 += gen
    return tok, lp


def _rollouts_row(cfg: Cfg, r: random.Random, i: int, calls: list, acc: list, need: dict,
                  p_success: float) -> list:
    """The rollouts row: output items and ids (of the accepted calls), terminal response,
    accepted list and reward."""
    out_keys, out_ids = [], []
    for a in acc:
        c = calls[a]
        out_keys.extend(c[KEYS])
        out_ids.extend(c[IDS] if c[IDS] is not None else [None] * len(c[KEYS]))
    if (r.random() < 0.1 or not any(x is not None for x in out_ids)) and r.random() < 0.5:
        out_ids = None  # a null output_ids list: every id null
    term_mode = need.get("terminal")
    if term_mode == "set" or (term_mode is None and r.random() < 0.85):
        terminal = calls[acc[-1]][RID]
    else:
        terminal = None
    acc_mode = need.get("accepted")
    if acc_mode == "set" or (acc_mode is None and r.random() < cfg.accepted_rate):
        accepted = [calls[a][RID] for a in acc]
    else:
        accepted = None
    u = r.random()
    base = 1.0 if u < p_success else (0.5 if u < p_success + 0.25 * (1 - p_success) else 0.0)
    reward = base + r.gauss(0.0, 0.02)
    return [f"r{i:08d}", f"g{i // cfg.group_size}", reward, out_keys, out_ids, terminal, accepted]
