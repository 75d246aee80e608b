"""A two-call rollout that runs every kernel once: loads (or compiles) them before a run
measures its own memory baseline. Built by hand so the production path needs no generator."""

from __future__ import annotations

import pyarrow as pa

from chainrows.formats.native.hashing import chain_hash
from chainrows.formats.native.schema import tables_from_pylists


def tiny_tables(logprobs: bool) -> tuple[pa.Table, pa.Table, pa.Table]:
    """A root and its child, both selected by the rollout's output (one ok row)."""
    deltas = [[1, 2, 3, 4], [5, 6, 7]]
    ledger, tokens, seed, prev = [], [], 0, 0
    for i, delta in enumerate(deltas):
        seed = chain_hash(delta, seed)
        ledger.append(dict(rollout_id="w", call_id=f"c{i}", parent_id=f"c{i - 1}" if i else None,
                           response_id=f"r{i}", prev_len=prev, delta_len=len(delta), gen_len=2,
                           chain_hash=seed, item_keys=[100 + i], item_ids=[f"i{i}"], failed=False))
        prev += len(delta)
        row = dict(rollout_id="w", call_id=f"c{i}", tokens=delta)
        if logprobs:
            row["logprobs"] = [0.0] * (len(delta) - 2) + [-0.5, -0.25]
        tokens.append(row)
    rollouts = [dict(rollout_id="w", group_id="g", reward=1.0, output_keys=[100, 101],
                     output_ids=["i0", "i1"], terminal_response_id="r1")]
    return tables_from_pylists(ledger, tokens, rollouts, logprobs=logprobs, accepted=False)
