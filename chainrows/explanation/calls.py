"""Per call of one rollout: where its items sit in the output, whether it was selected and why
not, its chains and the loss tokens its rows train."""

from __future__ import annotations

from chainrows.engine.batch import MISSING, ROOT
from chainrows.explanation.facts import RolloutFacts


def output_positions(f: RolloutFacts) -> dict[int, list[int]]:
    """Selected call -> the output positions it matched (selection order, item counts; a call
    selected twice, which step 7 masks, lists both windows)."""
    out: dict[int, list[int]] = {}
    p = 0
    for c in f.selection:
        n = len(f.item_keys[c])
        out.setdefault(c, []).extend(range(p, p + n))
        p += n
    return out


def occurrences(keys: tuple[int, ...], output: tuple[int, ...]) -> list[int]:
    """Every output position where ``keys`` (non-empty) appear as a contiguous window."""
    n = len(keys)
    return [p for p in range(len(output) - n + 1) if output[p:p + n] == keys] if n else []


def why_not(f: RolloutFacts, c: int, matched: dict[int, list[int]], mode: str, reason: str | None) -> str:
    """Why call ``c`` (not selected) is not trained, in one phrase."""
    if f.failed[c]:
        return "capture failed (failed = true)"
    if mode == "ordinary":
        return "not on the terminal call's chain" if f.selection else \
            f"no chain was chosen: the rollout was masked ({reason}) before the terminal walk ended"
    if not f.selection:
        return f"no selection: the rollout was masked ({reason}) before selection completed"
    if not f.item_keys[c]:
        return "produced no output items"
    at = occurrences(f.item_keys[c], f.output_keys)
    if not at:
        return "its items are not in the agent's output (a rejected retry or an unreturned sub-agent)"
    owner = {p: s for s, ps in matched.items() for p in ps}
    taken = [f"position {p} went to call {f.calls[owner[p]]}" for p in at if p in owner]
    return "its items match the output, but " + "; ".join(taken) if taken else \
        "its items match the output at positions " + ", ".join(map(str, at))


def parent_label(f: RolloutFacts, c: int, raw_parent: str | None) -> str | None:
    """The parent_id as the ledger holds it (None for a root)."""
    p = f.parent[c]
    if p == ROOT:
        return None
    if p == MISSING:
        return raw_parent
    return f.calls[p]


def loss_per_call(row_calls: list[list[str]], row_masks: list[list[int]], f: RolloutFacts) -> dict[str, int]:
    """call_id -> tokens with loss_mask 1 in the rows written, summed over its rows (each call's
    delta is delta_len tokens of its row, root first)."""
    length = dict(zip(f.calls, f.delta_len))
    out: dict[str, int] = {}
    for calls, mask in zip(row_calls, row_masks):
        pos = 0
        for cid in calls:
            n = length[cid]
            out[cid] = out.get(cid, 0) + sum(mask[pos:pos + n])
            pos += n
    return out


def call_records(f: RolloutFacts, raw_parents: list[str | None], mode: str, reason: str | None,
                 row_calls: list[list[str]], row_masks: list[list[int]]) -> list[dict]:
    """One dict per call in capture order (the ``calls`` of an explanation); ``reason``: the
    rollout's reason code (None when ok)."""
    matched = output_positions(f) if mode == "cc" else {}
    selected = set(f.selection)
    chain_of: dict[int, list[int]] = {}
    for k, chain in enumerate(f.chains):
        for c in chain:
            chain_of.setdefault(c, []).append(k)
    loss = loss_per_call(row_calls, row_masks, f)
    records = []
    for c, cid in enumerate(f.calls):
        chains = chain_of.get(c, [])
        records.append({
            "position": c, "call_id": cid, "parent_id": parent_label(f, c, raw_parents[c]),
            "root": f.parent[c] == ROOT, "parent_missing": f.parent[c] == MISSING,
            "delta_len": f.delta_len[c], "gen_len": f.gen_len[c], "failed": f.failed[c],
            "items": len(f.item_keys[c]), "output_positions": matched.get(c, []),
            "selected": c in selected, "why_not": None if c in selected else why_not(f, c, matched, mode, reason),
            "chain": chains[0] if chains else None, "chains": chains,
            "loss_tokens": loss.get(cid, 0),
        })
    return records
