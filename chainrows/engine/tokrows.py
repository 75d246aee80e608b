"""Kernel: each call's token row, in two passes over the token rows and two over the calls.

A tokens table names its call per row (``of_token``: the call index, negative for a row that
names no call of the batch). :func:`token_rows` gives each call the last row naming it, that
row's buffer and ranges, whether several rows name it, the calls in the order of their kept
rows, and the count of rows naming no call. The numpy steps it replaces (a bincount, masked
gathers and scatters, each a fresh temporary over millions of calls) took 0.25 s on 3.85 M
calls at 1 thread, all of it on the thread that joins the ids (docs/decisions-engine.md
"Per-call passes around the joins").

Plain-Python definition (used by the tests): :func:`token_rows_py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from chainrows.engine.batch import NO_TOKENS
from chainrows.engine.jit import jit


@dataclass(frozen=True)
class TokenRows:
    """Per call c: ``duplicated`` (several rows name it), ``chunk`` / ``start`` / ``stop`` /
    ``lp_start`` / ``lp_stop`` of its kept row (the last naming it; 0 and NO_TOKENS without
    one); ``order``: the calls with a row, in the order of their kept rows; ``orphan_rows``:
    rows naming no call."""

    duplicated: np.ndarray
    chunk: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    lp_start: np.ndarray
    lp_stop: np.ndarray
    order: np.ndarray
    orphan_rows: int


@jit
def _token_rows(of_token, row_chunk, tok_start, tok_stop, has_lp, lp_start, lp_stop, duplicated,
                chunk, start, stop, out_lp_start, out_lp_stop, order):
    """Fills the outputs (length n_calls, ``order`` at least the calls with a row) as
    :func:`token_rows` describes; returns (calls with a row, rows naming no call).

    of_token int64[T]: each row's call, < n_calls, negative for none. row_chunk, tok_start,
    tok_stop int64[T]; lp_start, lp_stop int64[T] when ``has_lp`` (else not read). ``chunk``
    holds each call's kept row until the last pass turns it into that row's buffer (no scratch
    array: docs/decisions-engine.md "Per-call passes around the joins")."""
    kept = chunk
    for c in range(len(kept)):
        kept[c] = -1
        duplicated[c] = False
    orphans = 0
    for j in range(len(of_token)):
        c = of_token[j]
        if c < 0:
            orphans += 1
        else:
            if kept[c] >= 0:
                duplicated[c] = True
            kept[c] = j
    n = 0
    for j in range(len(of_token)):
        c = of_token[j]
        if c >= 0 and kept[c] == j:
            order[n] = c
            n += 1
    for c in range(len(kept)):
        r = kept[c]
        if r < 0:
            chunk[c] = 0
            start[c] = NO_TOKENS
            stop[c] = NO_TOKENS
            out_lp_start[c] = NO_TOKENS
            out_lp_stop[c] = NO_TOKENS
        else:
            chunk[c] = row_chunk[r]
            start[c] = tok_start[r]
            stop[c] = tok_stop[r]
            out_lp_start[c] = lp_start[r] if has_lp else NO_TOKENS
            out_lp_stop[c] = lp_stop[r] if has_lp else NO_TOKENS
    return n, orphans


def token_rows(of_token: np.ndarray, n_calls: int, row_chunk: np.ndarray, tok_start: np.ndarray,
               tok_stop: np.ndarray, lp_start: np.ndarray | None = None,
               lp_stop: np.ndarray | None = None) -> TokenRows:
    """Each call's token row (:class:`TokenRows`). ``of_token``: int64[T], each token row's
    call in [0, n_calls) or negative for none; the other arrays int64[T] per token row (the
    logprob ranges None without a logprobs column: NO_TOKENS for every call)."""
    of_token = np.ascontiguousarray(of_token, dtype=np.int64)
    has_lp = lp_start is not None
    given = (row_chunk, tok_start, tok_stop) + ((lp_start, lp_stop) if has_lp else ())
    if any(len(a) != len(of_token) for a in given) or (len(of_token) and int(of_token.max()) >= n_calls):
        raise AssertionError("token_rows: per-row arrays disagree with the rows or name no call")
    row_chunk, tok_start, tok_stop, lp_start, lp_stop = (
        np.ascontiguousarray(a, dtype=np.int64) for a in given + (() if has_lp else (np.zeros(0),) * 2))
    chunk, start, stop, out_lp_start, out_lp_stop, order = (np.empty(n_calls, dtype=np.int64) for _ in range(6))
    duplicated = np.empty(n_calls, dtype=bool)
    n, orphans = _token_rows(of_token, row_chunk, tok_start, tok_stop, has_lp, lp_start, lp_stop,
                             duplicated, chunk, start, stop, out_lp_start, out_lp_stop, order)
    # a prefix of its buffer, not a copy: usually every call has a row (n == n_calls)
    return TokenRows(duplicated, chunk, start, stop, out_lp_start, out_lp_stop, order[:n], int(orphans))


def token_rows_py(of_token, n_calls, row_chunk, tok_start, tok_stop, lp_start=None, lp_stop=None) -> dict:
    """Plain-Python :func:`token_rows`, as a dict of lists (orphan_rows an int)."""
    rows_of = {}
    for j, c in enumerate(of_token):
        if c >= 0:
            rows_of.setdefault(c, []).append(j)
    kept = {c: rows[-1] for c, rows in rows_of.items()}

    def per_call(values, none):
        return [values[kept[c]] if c in kept and values is not None else none for c in range(n_calls)]

    return dict(duplicated=[len(rows_of.get(c, [])) > 1 for c in range(n_calls)],
                chunk=per_call(row_chunk, 0), start=per_call(tok_start, NO_TOKENS),
                stop=per_call(tok_stop, NO_TOKENS), lp_start=per_call(lp_start, NO_TOKENS),
                lp_stop=per_call(lp_stop, NO_TOKENS),
                order=[c for j, c in enumerate(of_token) if c >= 0 and kept[c] == j],
                orphan_rows=sum(1 for c in of_token if c < 0))
