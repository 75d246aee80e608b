"""What the import keeps from chunk to chunk, and one chunk decided against it.

:class:`ImportState` holds the interned rollout and call ids, every rollout's trie
(chainrows.formats.calls.trie) and, per record, where its full sequence ends in the trie, its
call id's code and its chain hash. :meth:`ImportState.decide` runs SPEC §8.3-§8.5 on one
records batch (chainrows.formats.calls.infer) and builds the deltas and hashes
(chainrows.formats.calls.deltas); everything a record needs of earlier records is in the state,
so chunks are decided one after the other in input order. Memory grows with the distinct
tokens of the rollouts seen (about the deltas written) plus a few dozen bytes per call:
:attr:`ImportState.nbytes` is what the import's memory plan watches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chainrows.arrays import grown
from chainrows.formats.calls import trie
from chainrows.formats.calls.deltas import build_deltas
from chainrows.formats.calls.infer import infer_chunk
from chainrows.formats.calls.intern import Interner
from chainrows.formats.calls.records import Lowered


@dataclass
class Decided:
    """One chunk decided: per record (chunk order) its rollout's code, the relation code, parent / against record
    numbers and their call-id codes (-1 for none), the lcp reported (-1), prev_len, delta_len,
    gen_len, chain hash, the tokens on both sides of the lcp (infer.NO_TOKEN past an end), and
    the deltas and their logprobs as offsets + flat buffers."""

    rollout: np.ndarray
    relation: np.ndarray
    parent_rec: np.ndarray
    parent_call: np.ndarray
    against_rec: np.ndarray
    against_call: np.ndarray
    diverge: np.ndarray
    prev_len: np.ndarray
    delta_len: np.ndarray
    gen_len: np.ndarray
    chain_hash: np.ndarray
    tok_here: np.ndarray
    tok_there: np.ndarray
    delta_off: np.ndarray
    delta: np.ndarray
    delta_logprobs: np.ndarray


class ImportState:
    """The import's memory of everything decided so far (see the module docstring)."""

    def __init__(self):
        self.rollouts = Interner()
        self.calls = Interner()
        self.nodes = trie.new_nodes()
        self.n_nodes = 0
        self.arena = np.zeros(1 << 16, np.int32)
        self.arena_len = 0
        self.roots = np.full(256, -1, np.int64)
        self.last_rec = np.full(256, -1, np.int64)
        self.latest_call = np.full(256, -1, np.int64)
        self.rec_fend = np.full(1024, -1, np.int64)
        self.rec_call = np.full(1024, -1, np.int64)
        self.rec_hash = np.zeros(1024, np.uint64)
        self.path = np.zeros(1024, np.int64)
        self.records = 0  # records decided so far; the next batch's first record number

    @property
    def nbytes(self) -> int:
        arrays = (self.nodes, self.arena, self.roots, self.last_rec, self.latest_call, self.rec_fend, self.rec_call,
                  self.rec_hash, self.path)
        return sum(a.nbytes for a in arrays) + self.rollouts.nbytes + self.calls.nbytes

    def decide(self, low: Lowered) -> Decided:
        """SPEC §8.3-§8.5 and the deltas for the next records (numbered from ``self.records``)."""
        n = len(low.record)
        base = self.records
        roll = self.rollouts.codes(np.zeros(n, np.int64), low.rollout_off, low.rollout_data)
        call = self.calls.codes(roll, low.call_off, low.call_data)
        parent_code = np.where(low.declares & low.parent_valid,
                               self.calls.codes(roll, low.parent_off, low.parent_data), -1)
        self.roots = grown(self.roots, self.rollouts.n_codes, -1)
        self.last_rec = grown(self.last_rec, self.rollouts.n_codes, -1)
        self.latest_call = grown(self.latest_call, self.calls.n_codes, -1)
        self.rec_fend = grown(self.rec_fend, base + n, -1)
        self.rec_call = grown(self.rec_call, base + n, -1)
        self.rec_hash = grown(self.rec_hash, base + n, 0)
        self.rec_call[base:base + n] = call
        out = {k: np.empty(n, np.int64) for k in ("parent_rec", "relation", "against_rec", "diverge",
                                                  "prev_len", "tok_here", "tok_there")}
        self.nodes, self.n_nodes, self.arena, self.arena_len, self.path = infer_chunk(
            roll, call, low.declares, parent_code, low.failed, low.prompt_off, low.prompt,
            low.completion_off, low.completion, base, self.nodes, self.n_nodes, self.arena,
            self.arena_len, self.roots, self.last_rec, self.rec_fend, self.latest_call, self.path,
            out["parent_rec"], out["relation"], out["against_rec"], out["diverge"], out["prev_len"],
            out["tok_here"], out["tok_there"])
        out["rollout"] = roll
        dec = self._deltas(low, base, out)
        self.records = base + n
        return dec

    def _deltas(self, low: Lowered, base: int, out: dict) -> Decided:
        n = len(low.record)
        prompt_len = np.diff(low.prompt_off)
        gen_len = np.where(low.failed, 0, np.diff(low.completion_off))
        delta_len = np.where(low.failed, 0, prompt_len - out["prev_len"] + gen_len)
        delta_off = np.zeros(n + 1, np.int64)
        np.cumsum(delta_len, out=delta_off[1:])
        delta = np.empty(delta_off[-1], np.int32)
        delta_lp = np.empty(delta_off[-1], np.float32)
        chain_hash = np.empty(n, np.uint64)
        build_deltas(low.failed, low.prompt_off, low.prompt, low.completion_off, low.completion,
                     low.logprobs, out["prev_len"], out["parent_rec"], base, self.rec_hash, delta_off,
                     delta, delta_lp, chain_hash)
        return Decided(
            rollout=out["rollout"], relation=out["relation"], parent_rec=out["parent_rec"],
            parent_call=self._call_of(out["parent_rec"]), against_rec=out["against_rec"],
            against_call=self._call_of(out["against_rec"]), diverge=out["diverge"],
            prev_len=out["prev_len"], delta_len=delta_len, gen_len=gen_len, chain_hash=chain_hash,
            tok_here=out["tok_here"], tok_there=out["tok_there"], delta_off=delta_off, delta=delta,
            delta_logprobs=delta_lp)

    def _call_of(self, rec: np.ndarray) -> np.ndarray:
        return np.where(rec >= 0, self.rec_call[np.maximum(rec, 0)], -1)
