"""Run the engine with the reference's signature: dict lists in, (rows, report) dict lists out."""

from __future__ import annotations

from chainrows import reassemble
from chainrows.formats.native.schema import tables_from_pylists
from chainrows.options import Options


def engine_reassemble(ledger, tokens, rollouts, options: Options | None = None, *, logprobs=None,
                      **option_values):
    if logprobs is None:
        logprobs = bool(tokens) and "logprobs" in tokens[0]
    accepted = any("accepted_response_ids" in r for r in rollouts)
    if not logprobs:
        tokens = [{k: v for k, v in t.items() if k != "logprobs"} for t in tokens]
    tables = tables_from_pylists(ledger, tokens, rollouts, logprobs=logprobs, accepted=accepted)
    result = reassemble(*tables, Options.of(options, **option_values))
    return result.rows.to_pylist(), result.report.to_pylist()
