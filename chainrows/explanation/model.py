"""``explain``: one rollout decided by the engine, laid out call by call.

The answer is ``reassemble``'s by construction: the rollout's status, reason, detail, rows and
advantage come from ``chainrows.api.run_tables`` on its rollouts' tables (the asked rollouts and
their groups) with the same options; the per-call layout reads the engine's own decisions
(``chainrows.engine.run.decide``) of the same batch.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from chainrows.api import run_tables
from chainrows.engine.run import decide
from chainrows.errors import InputError
from chainrows.explanation.calls import call_records
from chainrows.explanation.compare import compare
from chainrows.explanation.facts import rollout_facts
from chainrows.explanation.read import read_for_rollouts
from chainrows.explanation.render import explanation_html, explanation_text
from chainrows.lowering.columnar import build_batch
from chainrows.options import Options


class Explanation(dict):
    """One rollout explained: a dict (the ``--json`` object) that prints as a tree and renders
    as HTML in a notebook. Keys: rollout_id, group_id, status, reason, detail, mode, plan,
    reward, advantage, num_calls, num_selected, calls (one dict per call in capture order:
    position, call_id, parent_id, root, delta_len, gen_len, failed, items, output_positions,
    selected, why_not, chain, chains, loss_tokens), chains (call ids per chain), rows (row_id,
    call_ids, num_tokens, loss_tokens, prompt_len, weight; a placeholder row has weight 0),
    failed_check (check, call_id, call_position, position, expected, found, fix; None when ok)."""

    def __str__(self) -> str:
        return explanation_text(self)

    def _repr_html_(self) -> str:
        return explanation_html(self)


def _float(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _rows_of(rows: pa.Table, rid: str) -> list[dict]:
    mine = rows.filter(pc.equal(rows.column("rollout_id"), rid))
    return mine.select(["row_id", "call_ids", "input_ids", "loss_mask", "prompt_len", "weight"]).to_pylist()


def _raw_parents(ledger: pa.Table, rid: str) -> dict[str, str | None]:
    mine = ledger.filter(pc.equal(ledger.column("rollout_id"), rid)).select(["call_id", "parent_id"])
    out: dict[str, str | None] = {}
    for row in mine.to_pylist():
        out.setdefault(row["call_id"], row["parent_id"])
    return out


def explain_tables(ledger: pa.Table, tokens: pa.Table, rollouts: pa.Table, rollout_ids: Sequence[str],
                   options: Options | None = None, **option_values) -> list[Explanation]:
    """Explain ``rollout_ids`` given SPEC §2 tables that hold them and their groups whole.
    Raises InputError for an id in no table."""
    options = Options.of(options, **option_values)
    result = run_tables(ledger, tokens, rollouts, options)
    batch, labels = build_batch(ledger, tokens, rollouts)
    dec = decide(batch, options)
    sel_dec = decide(batch, dataclasses.replace(options, plan="linear")) if options.plan != "linear" else dec
    index = {rid: i for i, rid in enumerate(labels.rollout_ids.to_pylist())}
    report = {row["rollout_id"]: row for row in result.report.to_pylist()}
    out = []
    for rid in rollout_ids:
        if rid not in index:
            raise InputError(f"rollout {rid!r} is in no table of the input")
        r = index[rid]
        facts = rollout_facts(batch, labels.call_ids, dec, sel_dec, r)
        rows = _rows_of(result.rows, rid)
        raw = _raw_parents(ledger, rid)
        rep = report[rid]
        calls = call_records(facts, [raw.get(c) for c in facts.calls], options.mode, rep["reason"],
                             [row["call_ids"] for row in rows], [row["loss_mask"] for row in rows])
        out.append(Explanation(
            rollout_id=rid, group_id=rep["group_id"], status=rep["status"], reason=rep["reason"],
            detail=rep["detail"], mode=options.mode, plan=options.plan,
            reward=_float(rep["reward"]), advantage=_float(rep["advantage"]),
            num_calls=rep["num_calls"], num_selected=rep["num_selected"], num_roots=rep["num_roots"],
            loss_tokens=rep["loss_tokens"], calls=calls,
            chains=[[facts.calls[c] for c in chain] for chain in facts.chains],
            rows=[{"row_id": row["row_id"], "call_ids": row["call_ids"], "num_tokens": len(row["input_ids"]),
                   "loss_tokens": sum(row["loss_mask"]), "prompt_len": row["prompt_len"],
                   "weight": row["weight"]} for row in rows],
            failed_check=compare(batch, facts, r),
        ))
    return out


def explain(data, rollout_id: str | Sequence[str], options: Options | None = None,
            **option_values) -> Explanation | list[Explanation]:
    """Explain one rollout (or several) as ``reassemble`` with the same options decides it.

    ``data``: a dataset directory (only the rows of the asked rollouts and their groups are
    read) or a ``(ledger, tokens, rollouts)`` tuple of Arrow tables. ``rollout_id``: one id
    (returns one :class:`Explanation`) or a list of ids (returns a list). Raises InputError on
    unusable input or an id in no table."""
    ids = [rollout_id] if isinstance(rollout_id, str) else list(rollout_id)
    if isinstance(data, (str, os.PathLike)):
        tables = read_for_rollouts(data, ids)
    else:
        tables = tuple(data)
    out = explain_tables(*tables, ids, options, **option_values)
    return out[0] if isinstance(rollout_id, str) else out
