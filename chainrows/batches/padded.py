"""Padded numpy batches from a ``rows`` Parquet file or directory, for a trainer.

    from chainrows.batches import iter_batches

    for b in iter_batches("OUT/rows", max_tokens=65_536, seed=0):
        ids = torch.from_numpy(b.input_ids)          # (B, T) int64
        ...

Each :class:`Batch` holds right-padded ``(B, T)`` arrays: ``input_ids``, ``attention_mask``
(1 on real tokens), ``loss_mask`` (the response mask: 1 on generated tokens of the row,
float32), ``old_logprobs`` (float32, when the rows have ``logprobs``; 0 on padding),
``advantages`` (the row's advantage on its loss tokens, 0 elsewhere) and ``(B,)`` arrays
``weights``, ``advantage``, ``lengths``, ``prompt_lens``, plus the ``row_ids`` and
``rollout_ids`` of the batch's rows. All arrays are C-contiguous with standard dtypes, so
``torch.from_numpy`` and ``jax.numpy.asarray`` take them as they are. docs/trainers.md maps
them onto verl, NeMo RL, OpenRLHF and TRL.

Rows are streamed: row groups are read one at a time (in a seeded random order when
``shuffle``) into a window of about ``window`` rows; each window is sorted by length and cut
into batches, so rows of similar length share a batch and little padding is wasted; the
batches of a window are yielded in a seeded random order. Every row appears in exactly one
batch. The order depends only on the input and the arguments (``seed`` included), never on
the machine. numpy and pyarrow only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = ["Batch", "iter_batches", "collate", "plan_batches", "rows_files", "split_prompt_response"]

_COLUMNS = ("row_id", "rollout_id", "input_ids", "loss_mask", "prompt_len", "advantage", "weight")


@dataclass(frozen=True)
class Batch:
    """One padded batch of rows (see the module docstring for each field)."""

    input_ids: np.ndarray       # (B, T) ids_dtype, pad_id on padding
    attention_mask: np.ndarray  # (B, T) int64, 1 on real tokens
    loss_mask: np.ndarray       # (B, T) float32, 1 on generated (trained) tokens
    old_logprobs: np.ndarray | None  # (B, T) float32, 0 on padding; None without logprobs
    advantages: np.ndarray      # (B, T) float32, advantage * loss_mask
    advantage: np.ndarray       # (B,) float32, the row's advantage (0 where null)
    weights: np.ndarray         # (B,) float32, the row weight (SPEC §5)
    lengths: np.ndarray         # (B,) int64, real tokens per row
    prompt_lens: np.ndarray     # (B,) int64, carry tokens of the row's first call
    row_ids: list
    rollout_ids: list

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        """Real (unpadded) tokens in the batch."""
        return int(self.lengths.sum())

    @property
    def padded_tokens(self) -> int:
        """B * T."""
        return int(self.input_ids.size)

    def as_dict(self) -> dict:
        """The arrays by name (``old_logprobs`` left out when None)."""
        out = {k: getattr(self, k) for k in ("input_ids", "attention_mask", "loss_mask",
                                              "old_logprobs", "advantages", "advantage",
                                              "weights", "lengths", "prompt_lens")}
        if out["old_logprobs"] is None:
            del out["old_logprobs"]
        return out


def rows_files(path: str | os.PathLike) -> list[Path]:
    """The Parquet files of a rows table: the file itself, or a directory's files in
    lexicographic order of their names, skipping names that start with ``.`` or ``_``."""
    p = Path(path)
    if p.is_dir():
        return [p / n for n in sorted(os.listdir(p))
                if not n.startswith((".", "_")) and (p / n).is_file()]
    if p.is_file():
        return [p]
    raise FileNotFoundError(f"no rows table at {str(p)!r}")


def iter_batches(path: str | os.PathLike, *, max_tokens: int | None = None,
                 batch_size: int | None = None, seed: int = 0, shuffle: bool = True,
                 window: int = 4096, pad_id: int = 0, pad_to_multiple: int = 1,
                 ids_dtype=np.int64, logprobs: bool = True) -> Iterator[Batch]:
    """Stream padded batches from a rows Parquet file or directory (SPEC §4 ``rows``).

    ``max_tokens``: a batch holds at most this many *padded* tokens (B * T); a row longer than
    that gets a batch of its own (never truncated). ``batch_size``: at most this many rows per
    batch. Give either or both. ``seed``/``shuffle``: with ``shuffle`` (default) the order of
    row groups, of rows inside a window and of the batches of a window are drawn from
    ``numpy.random.default_rng(seed)``; without it rows keep file order within each length
    sort and batches come shortest first. ``window``: rows bucketed together (larger: less
    padding, more memory; whole row groups are read, so a window may exceed it by one row
    group). ``pad_to_multiple``: round T up (e.g. 8 for tensor cores). ``logprobs=False``
    skips the rows' logprobs column.
    """
    if max_tokens is None and batch_size is None:
        raise ValueError("give max_tokens or batch_size (or both)")
    for name, value in (("max_tokens", max_tokens), ("batch_size", batch_size)):
        if value is not None and (not isinstance(value, (int, np.integer)) or value < 1):
            raise ValueError(f"{name} must be a positive integer; got {value!r}")
    if window < 1 or pad_to_multiple < 1:
        raise ValueError("window and pad_to_multiple must be positive")
    rng = np.random.default_rng(seed)
    files = [pq.ParquetFile(f) for f in rows_files(path)]
    with_lp = logprobs and bool(files) and all("logprobs" in f.schema_arrow.names for f in files)
    columns = list(_COLUMNS) + (["logprobs"] if with_lp else [])
    units = [(i, g) for i, f in enumerate(files) for g in range(f.num_row_groups)]
    if shuffle and units:
        units = [units[k] for k in rng.permutation(len(units))]
    pending: list[pa.Table] = []
    rows = 0
    for fi, g in units:
        t = files[fi].read_row_group(g, columns=columns)
        if t.num_rows:
            pending.append(t)
            rows += t.num_rows
        if rows >= window:
            yield from _window(pa.concat_tables(pending), rng, shuffle, max_tokens, batch_size,
                               pad_id, pad_to_multiple, ids_dtype)
            pending, rows = [], 0
    if rows:
        yield from _window(pa.concat_tables(pending), rng, shuffle, max_tokens, batch_size,
                           pad_id, pad_to_multiple, ids_dtype)


def plan_batches(lengths: np.ndarray, max_tokens: int | None, batch_size: int | None,
                 pad_to_multiple: int = 1) -> list[np.ndarray]:
    """Cut rows, in the given order, into consecutive batches under the limits.

    Meant for rows sorted by length (ascending), so each new row sets the batch's T. Returns
    arrays of positions into ``lengths``.
    """
    out, start, longest = [], 0, 0
    for i, n in enumerate(lengths.tolist()):
        t = max(longest, _round_up(n, pad_to_multiple))
        size = i - start + 1
        over = ((max_tokens is not None and size * t > max_tokens)
                or (batch_size is not None and size > batch_size))
        if over and size > 1:
            out.append(np.arange(start, i))
            start, t = i, _round_up(n, pad_to_multiple)
        longest = t
    if start < len(lengths):
        out.append(np.arange(start, len(lengths)))
    return out


def _round_up(n: int, k: int) -> int:
    return -(-max(n, 1) // k) * k


def _window(table: pa.Table, rng, shuffle, max_tokens, batch_size, pad_id, pad_to_multiple,
            ids_dtype) -> Iterator[Batch]:
    lengths = pc.list_value_length(table.column("input_ids")).to_numpy(zero_copy_only=False)
    order = rng.permutation(len(lengths)) if shuffle else np.arange(len(lengths))
    order = order[np.argsort(lengths[order], kind="stable")]
    plans = plan_batches(lengths[order], max_tokens, batch_size, pad_to_multiple)
    if shuffle:
        plans = [plans[k] for k in rng.permutation(len(plans))]
    for pos in plans:
        yield collate(table.take(pa.array(order[pos])), pad_id=pad_id,
                      pad_to_multiple=pad_to_multiple, ids_dtype=ids_dtype)


def _flat(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(values, lengths) of a list column, slices and chunks respected."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    lengths = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False)
    values = pc.list_flatten(column).to_numpy(zero_copy_only=False)
    return values, lengths.astype(np.int64)


def collate(rows: pa.Table, *, pad_id: int = 0, pad_to_multiple: int = 1,
            ids_dtype=np.int64) -> Batch:
    """Pad the rows of one Arrow table (rows schema, SPEC §4) into a :class:`Batch`, in order."""
    ids, lengths = _flat(rows.column("input_ids"))
    mask, mask_len = _flat(rows.column("loss_mask"))
    if not np.array_equal(lengths, mask_len):
        raise ValueError("loss_mask and input_ids lengths differ")
    b = rows.num_rows
    t = _round_up(int(lengths.max()) if b else 1, pad_to_multiple)
    # Row r's tokens go to out[r, 0:lengths[r]]: one scatter for the whole batch.
    r_idx = np.repeat(np.arange(b), lengths)
    c_idx = np.arange(len(ids)) - np.repeat(np.cumsum(lengths) - lengths, lengths)

    def pad(values, dtype, fill):
        out = np.full((b, t), fill, dtype=dtype)
        out[r_idx, c_idx] = values
        return out

    input_ids = pad(ids, ids_dtype, pad_id)
    attention = pad(np.ones(len(ids), np.int64), np.int64, 0)
    loss_mask = pad(mask, np.float32, 0)
    adv = rows.column("advantage").to_numpy(zero_copy_only=False).astype(np.float32)
    adv = np.nan_to_num(adv, nan=0.0)  # null (placeholder rows) -> 0
    old = None
    if "logprobs" in rows.column_names:
        lp, lp_len = _flat(rows.column("logprobs"))
        if not np.array_equal(lp_len, lengths):
            raise ValueError("logprobs and input_ids lengths differ")
        old = pad(lp, np.float32, 0)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        old_logprobs=old,
        advantages=np.ascontiguousarray(loss_mask * adv[:, None], dtype=np.float32),
        advantage=adv,
        weights=rows.column("weight").to_numpy(zero_copy_only=False).astype(np.float32),
        lengths=lengths,
        prompt_lens=rows.column("prompt_len").to_numpy(zero_copy_only=False).astype(np.int64),
        row_ids=rows.column("row_id").to_pylist(),
        rollout_ids=rows.column("rollout_id").to_pylist(),
    )


def split_prompt_response(batch: Batch, *, pad_id: int = 0) -> dict:
    """The verl / OpenRLHF / TRL layout: prompts left-padded, responses right-padded.

    The prompt of a row is its first ``prompt_len`` tokens (the root call's carry); the
    response is everything after (generated tokens *and* later observation tokens, which
    ``response_mask`` marks 0). Returns ``prompts`` (B, P), ``prompt_mask``, ``responses``
    (B, R), ``response_attention_mask`` (1 on real response tokens), ``response_mask``
    (float32, the loss mask), ``old_logprobs`` (B, R) when present and ``advantages`` (B, R);
    ``input_ids = concat(prompts, responses)`` with ``attention_mask = concat(prompt_mask,
    response_attention_mask)``.
    """
    b = len(batch)
    plen = batch.prompt_lens
    rlen = batch.lengths - plen
    p_width = int(plen.max()) if b else 0
    r_width = max(int(rlen.max()) if b else 0, 1)
    cols = np.arange(batch.input_ids.shape[1])[None, :]
    # prompts: token j of row r lands at p_width - plen[r] + j
    in_prompt = cols < plen[:, None]
    pr, pc_ = np.nonzero(in_prompt)
    dest_p = p_width - plen[pr] + pc_
    in_resp = (cols >= plen[:, None]) & (cols < batch.lengths[:, None])
    rr, rc = np.nonzero(in_resp)
    dest_r = rc - plen[rr]

    def place(src, width, rows_, cols_, dest, dtype, fill):
        out = np.full((b, width), fill, dtype=dtype)
        out[rows_, dest] = src[rows_, cols_]
        return out

    out = {
        "prompts": place(batch.input_ids, p_width, pr, pc_, dest_p, batch.input_ids.dtype, pad_id),
        "prompt_mask": place(batch.attention_mask, p_width, pr, pc_, dest_p, np.int64, 0),
        "responses": place(batch.input_ids, r_width, rr, rc, dest_r, batch.input_ids.dtype, pad_id),
        "response_attention_mask": place(batch.attention_mask, r_width, rr, rc, dest_r, np.int64, 0),
        "response_mask": place(batch.loss_mask, r_width, rr, rc, dest_r, np.float32, 0),
        "advantages": place(batch.advantages, r_width, rr, rc, dest_r, np.float32, 0),
    }
    if batch.old_logprobs is not None:
        out["old_logprobs"] = place(batch.old_logprobs, r_width, rr, rc, dest_r, np.float32, 0)
    return out
