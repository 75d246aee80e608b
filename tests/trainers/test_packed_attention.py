"""Packed batches on a real attention layer (torch, CPU): a small causal language model run on
each row alone and on the packed batch, with the block-diagonal causal mask built from
``cu_seqlens`` and the packed ``position_ids``, gives the same per-token outputs; and a masked,
weighted, clipped policy-gradient loss over a pass of packed batches equals the same loss over a
pass of padded batches (``iter_batches``), under both normalisations docs/trainers.md gives.

Tolerances: float32 throughout; masked keys contribute exact zeros, so the outputs differ only
by summation order: ``atol=1e-5, rtol=1e-4`` per token, ``rtol=1e-5`` on the loss totals."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from chainrows.batches import iter_batches, iter_packed
from tests.support.rows import rows_table

torch = pytest.importorskip("torch")
F = torch.nn.functional
VOCAB, DIM, HEADS = 97, 32, 4


class TinyLM(torch.nn.Module):
    """Token and position embeddings, one multi-head attention layer, a vocabulary head."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.tok = torch.nn.Parameter(torch.randn(VOCAB, DIM, generator=g))
        self.pos = torch.nn.Parameter(torch.randn(512, DIM, generator=g))
        self.qkv = torch.nn.Parameter(torch.randn(DIM, 3 * DIM, generator=g) / DIM**0.5)
        self.head = torch.nn.Parameter(torch.randn(DIM, VOCAB, generator=g) / DIM**0.5)

    def forward(self, ids, pos, allowed):
        """log-probs (B, T, VOCAB) of ids (B, T) at positions pos (B, T); allowed (B, T, T) bool:
        query i may attend key j."""
        x = self.tok[ids % VOCAB] + self.pos[pos]
        b, t, _ = x.shape
        q, k, v = (x @ self.qkv).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])
        return (x + y.transpose(1, 2).reshape(b, t, DIM)) @ self.head


def packed_mask(cu: torch.Tensor, width: int) -> torch.Tensor:
    """(1, T, T): causal within each row of cu_seqlens; a padding token sees only itself."""
    tok = torch.arange(width)
    seg = torch.searchsorted(cu[1:].long(), tok, right=True)
    seg = torch.where(tok < cu[-1], seg, len(cu) + tok)  # padding: a segment of its own
    return ((seg[:, None] == seg[None, :]) & (tok[None, :] <= tok[:, None]))[None]


def new_logprobs(logp: torch.Tensor, ids: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """log-prob of each token under the logits of the token before it (0 where ``first``: a
    row's first token, which nothing before it in the row predicts)."""
    prev = torch.roll(logp.log_softmax(-1), 1, dims=-2)
    lp = prev.gather(-1, (ids % VOCAB)[..., None])[..., 0]
    return torch.where(first, torch.zeros_like(lp), lp)


def pg_token_loss(lp, old, adv):
    ratio = torch.exp(lp - old)
    return -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)


@pytest.fixture(scope="module")
def rows():
    lengths = np.random.default_rng(5).integers(4, 120, 24)
    return rows_table(lengths, 5)


def test_attention_on_a_packed_batch_equals_each_row_alone(rows):
    model = TinyLM()
    by_id = {r["row_id"]: r for r in rows.to_pylist()}
    checked = 0
    with torch.no_grad():
        for b in iter_packed(rows, max_tokens=512, pad_to_multiple=64, seed=3):
            cu = torch.from_numpy(b["cu_seqlens"])
            ids = torch.from_numpy(b["input_ids"])[None]
            out = model(ids, torch.from_numpy(b["position_ids"])[None], packed_mask(cu, ids.shape[1]))[0]
            for i, rid in enumerate(b["row_ids"]):
                row_ids = torch.tensor(by_id[rid]["input_ids"], dtype=torch.int64)[None]
                n = row_ids.shape[1]
                alone = model(row_ids, torch.arange(n)[None], torch.ones(n, n, dtype=torch.bool).tril()[None])[0]
                s, e = int(cu[i]), int(cu[i + 1])
                assert torch.allclose(out[s:e], alone, atol=1e-5, rtol=1e-4), rid
                checked += 1
    assert checked == rows.num_rows


def _packed_losses(model, rows):
    per_row = token_mean = 0.0
    for b in iter_packed(rows, max_tokens=512, seed=1):
        t = {k: torch.from_numpy(v) for k, v in b.items() if isinstance(v, np.ndarray)}
        width = len(t["input_ids"])
        logp = model(t["input_ids"][None], t["position_ids"][None], packed_mask(t["cu_seqlens"], width))[0]
        lp = new_logprobs(logp, t["input_ids"], t["position_ids"] == 0)
        m = t["loss_mask"]
        loss = pg_token_loss(lp, t["old_logprobs"], t["advantages"]) * m
        # per row: token mean within each row (segments of cu_seqlens), times the row weight
        seg = torch.searchsorted(t["cu_seqlens"][1:].long(), torch.arange(width), right=True)
        n_rows = len(b["row_ids"])
        sums = torch.zeros(n_rows + 1).index_add_(0, seg, loss)[:n_rows]
        counts = torch.zeros(n_rows + 1).index_add_(0, seg, m)[:n_rows]
        row_weight = t["weights"][t["cu_seqlens"][:-1].long()]
        per_row += float((row_weight * sums / counts.clamp(min=1)).sum())
        token_mean += float((t["weights"] * loss).sum())
    return per_row, token_mean


def _padded_losses(model, path):
    per_row = token_mean = 0.0
    for b in iter_batches(path, batch_size=7, seed=1):
        ids = torch.from_numpy(b.input_ids)
        bsz, width = ids.shape
        real = torch.from_numpy(b.attention_mask).bool()
        causal = torch.ones(width, width, dtype=torch.bool).tril()
        allowed = causal[None] & real[:, None, :] | torch.eye(width, dtype=torch.bool)[None]
        logp = model(ids, torch.arange(width).expand(bsz, width), allowed)
        first = torch.zeros_like(real)
        first[:, 0] = True
        lp = new_logprobs(logp, ids, first)
        m = torch.from_numpy(b.loss_mask)
        loss = pg_token_loss(lp, torch.from_numpy(b.old_logprobs), torch.from_numpy(b.advantages)) * m
        w = torch.from_numpy(b.weights)
        per_row += float((w * loss.sum(1) / m.sum(1).clamp(min=1)).sum())
        token_mean += float((w[:, None] * loss).sum())
    return per_row, token_mean


def test_policy_gradient_loss_from_packed_equals_padded(rows, tmp_path):
    pq.write_table(rows, tmp_path / "rows.parquet")
    model = TinyLM()
    with torch.no_grad():
        packed = _packed_losses(model, rows)
        padded = _padded_losses(model, tmp_path / "rows.parquet")
    loss_tokens = float(sum(sum(m) for m in rows.column("loss_mask").to_pylist()))
    assert packed[0] == pytest.approx(padded[0], rel=1e-5)
    assert packed[1] / loss_tokens == pytest.approx(padded[1] / loss_tokens, rel=1e-5)
    assert abs(packed[0]) > 1e-3  # the loss is not trivially zero
