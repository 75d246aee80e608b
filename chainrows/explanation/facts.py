"""One rollout's facts, as plain Python values cut from the engine's Batch and Decisions.

Explaining a rollout is a diagnostic of a few rollouts, not the hot path: the engine decides
(same kernels and options as ``reassemble``), then this module reads its arrays for the asked
rollouts into small Python lists the explanation is built from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from chainrows import reasons as R
from chainrows.engine.batch import MISSING, ROOT, Batch
from chainrows.engine.run import Decisions


@dataclass
class RolloutFacts:
    """What the engine knows of rollout ``r`` of a batch. Call positions are capture positions
    within the rollout (0 = first captured call); ``parent[i]`` is a position, ROOT or MISSING."""

    calls: list[str]  # call_id per position
    parent: list[int]
    delta_len: list[int]
    gen_len: list[int]
    failed: list[bool]
    has_tokens: list[bool]
    item_keys: list[tuple[int, ...]]
    output_keys: tuple[int, ...]
    selection: list[int]  # selected positions in selection order (cc) or root first (ordinary)
    chains: list[list[int]]  # the cut, chain by chain, root first (positions)
    detail: int
    bad_call: int  # position, -1 when the detail names none
    bad_pos: int


# Details of checks 11–15: the rollout was cut into chains before it failed, so its chains exist.
AFTER_CUT = frozenset(range(R.D_WALK_MISSING_PARENT, R.D_LOGPROB_CARRY + 1)) | {R.D_INTEGRITY}


def _positions(dec_sel: np.ndarray, start: int, stop: int, base: int) -> list[int]:
    return [int(c) - base for c in dec_sel[start:stop]]


def chains_of(dec: Decisions, r: int, base: int) -> list[list[int]]:
    """The chains ``dec`` holds for rollout r (positions), split where ``chain_start`` is 1."""
    a = int(dec.sel_off[r])
    slot = dec.sel[a:a + int(dec.sel_len[r])]
    starts = dec.chain_start[a:a + int(dec.sel_len[r])]
    chains: list[list[int]] = []
    for c, s in zip(slot, starts):
        if s or not chains:
            chains.append([])
        chains[-1].append(int(c) - base)
    return chains


def rollout_facts(b: Batch, call_ids: pa.Array, dec: Decisions, selection_dec: Decisions, r: int) -> RolloutFacts:
    """The facts of rollout ``r``. ``dec``: the decisions under the asked options (chains,
    detail); ``selection_dec``: under the linear plan of the same mode, whose slot keeps the
    selection in selection order (the forest cut rewrites it into chains)."""
    c0, c1 = int(b.call_off[r]), int(b.call_off[r + 1])
    par = [int(p) - c0 if p >= 0 else int(p) for p in b.parent[c0:c1]]
    keys = [tuple(int(k) for k in b.item_keys[b.key_off[c]:b.key_off[c + 1]]) for c in range(c0, c1)]
    a = int(selection_dec.sel_off[r])
    selection = _positions(selection_dec.sel, a, a + int(selection_dec.num_selected[r]), c0)
    bad = int(dec.bad_call[r])
    return RolloutFacts(
        calls=[str(x) for x in call_ids[c0:c1].to_pylist()],
        parent=[p if p in (ROOT, MISSING) or p >= 0 else MISSING for p in par],
        delta_len=[int(x) for x in b.delta_len[c0:c1]],
        gen_len=[int(x) for x in b.gen_len[c0:c1]],
        failed=[bool(x) for x in b.failed[c0:c1]],
        has_tokens=[bool(x >= 0) for x in b.tok_start[c0:c1]],
        item_keys=keys,
        output_keys=tuple(int(k) for k in b.out_keys[b.out_off[r]:b.out_off[r + 1]]),
        selection=selection,
        chains=chains_of(dec, r, c0) if dec.detail[r] == 0 or int(dec.detail[r]) in AFTER_CUT else [],
        detail=int(dec.detail[r]),
        bad_call=bad - c0 if bad >= 0 else -1,
        bad_pos=int(dec.bad_pos[r]),
    )
