"""The stages of a text model's sliced program (lara_serve.model_export.export.sliced): each an nn.Module that
maps one slice of rows and the running state to the next state, exported as one small ONNX graph.

The math is kernels.reference's LARA (spec 5.2-5.4) split at its global statistics: chunk sums for the
landmarks (`SumsStage`); online softmaxes over keys and over queries (`KeysStage`); per query, the SNIS weights
and the rest of the block (`BlockStage`). Embedding, final norm and readout are the model's own modules.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from lara_serve.kernels.reference import lara_balance_heuristic, lara_mis_weights, lara_samples, log_features
from lara_serve.model_export.models.long_forward import embed_rows
from lara_serve.model_export.models.ood import ServingModel
from lara_serve.model_export.models.ood_input import VOCAB, ByteBigramNLL
from lara_serve.model_export.models.text_embeddings import fold_case

# The running maxima start here rather than at -inf: exp(MIN - finite) is 0, while -inf - (-inf) is NaN.
MIN = float(torch.finfo(torch.float32).min)


class EmbedStage(nn.Module):
    """ids [1, w] (a window: the slice plus its halo), rows [m] (the slice's rows in the window), offset []
    (the window's first position) -> x [1, m, D]; with an input score also its running sums over the
    byte pairs that end in the slice."""

    def __init__(self, serving: ServingModel) -> None:
        super().__init__()
        self.text, self.score = serving.model, serving.input_score

    def forward(
        self, ids: Tensor, rows: Tensor, offset: Tensor, nll: Tensor | None = None, pairs: Tensor | None = None
    ) -> tuple[Tensor, ...]:
        text = self.text
        folded = fold_case(ids) if text.cfg.case_fold else ids
        x = embed_rows(text, folded, offset).index_select(1, rows)  # [1, m, D]
        if nll is None or pairs is None:
            return (x,)
        return (x, *self._pairs(ids, rows, offset, nll, pairs))

    def _pairs(self, ids: Tensor, rows: Tensor, offset: Tensor, nll: Tensor, pairs: Tensor) -> tuple[Tensor, Tensor]:
        """ByteBigramNLL's sums, over the pairs (i - 1, i) with i in the slice and i >= 1: [1] float64 each."""
        score = self.score
        assert isinstance(score, ByteBigramNLL)
        cur = ids.index_select(1, rows)  # [1, m]
        prev = ids.index_select(1, (rows - 1).clamp_min(0))
        if score.case_fold:
            cur, prev = fold_case(cur), fold_case(prev)
        real = (offset + rows >= 1)[None].to(torch.float64)  # [1, m]: the document's first byte has no pair
        values = score.table[prev * VOCAB + cur].to(torch.float64) * real
        return nll + values.sum(1), pairs + real.sum(1)


def _chunk_bounds(n: Tensor, count: int) -> tuple[Tensor, Tensor]:
    """kernels.landmarks.chunk_assignment's chunks of an n-token document: first and end rank [C] each."""
    idx = torch.arange(count)
    start = idx * n // count
    return start, torch.maximum((idx + 1) * n // count, start + 1)


class LayerStage(nn.Module):
    """What the three passes of one block share: q, k, v of a slice and the landmarks from the chunk sums."""

    def __init__(self, block: nn.Module, serving: ServingModel) -> None:
        super().__init__()
        self.block, self.attn = block, block.attn
        self.count = self.attn.cfg.num_landmarks

    def heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v = self.attn._heads(self.block.norm1(x))  # [1, H, m, d] each
        return q, k, v

    def landmarks(self, n: Tensor, qsum: Tensor, ksum: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(q landmarks, proposal means mu, samples w) [1, H, C, d], as Attention._landmarks and
        kernels.lara_attention form them from the chunk means."""
        start, end = _chunk_bounds(n, self.count)
        size = (end - start).to(qsum.dtype)[:, None]  # [C, 1]
        ql, kl = qsum / size, ksum / size  # [1, H, C, d]
        cfg = self.attn.cfg
        if cfg.landmark_module == "light":
            ql, kl = self.attn.q_landmark(ql), self.attn.k_landmark(kl)
        if cfg.mixed:
            mix = torch.softmax(kl @ kl.transpose(-1, -2) / self.attn.head_dim**0.5, dim=-1)  # [1, H, C, C]
            kl = mix @ kl
        mu, w = lara_samples(ql, kl, getattr(self.attn, "eval_noise", None))
        return ql, mu, w


class SumsStage(LayerStage):
    """x [1, m, D], start [], n [], qsum, ksum [1, H, C, d] -> the sums with this slice's rows added."""

    def forward(self, x: Tensor, start: Tensor, n: Tensor, qsum: Tensor, ksum: Tensor) -> tuple[Tensor, Tensor]:
        q, k, _ = self.heads(x)
        first, end = _chunk_bounds(n, self.count)
        rank = start + torch.arange(x.shape[1])  # [m]
        member = ((rank[None] >= first[:, None]) & (rank[None] < end[:, None])).to(x.dtype)  # [C, m]
        return qsum + member @ q, ksum + member @ k


class KeysStage(LayerStage):
    """-> running (max, sum of exp, exp-weighted sum of v) of the samples' logits over keys
    [1, H, C] x2, [1, H, C, d]; running (max, sum of exp) of rho's logits over queries [1, H, C] x2."""

    def forward(
        self, x: Tensor, n: Tensor, qsum: Tensor, ksum: Tensor,
        kmax: Tensor, ksumexp: Tensor, kv: Tensor, qmax: Tensor, qsumexp: Tensor,
    ) -> tuple[Tensor, ...]:  # fmt: skip
        q, k, v = self.heads(x)
        ql, _, w = self.landmarks(n, qsum, ksum)
        lk = log_features(w, k)  # [1, H, C, m]: log xi(k_m, w_c)
        kmax2 = torch.maximum(kmax, lk.amax(-1))
        keep, p = torch.exp(kmax - kmax2), torch.exp(lk - kmax2[..., None])
        lq = ql @ q.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [1, H, C, m]: rho's logits
        qmax2 = torch.maximum(qmax, lq.amax(-1))
        qkeep = torch.exp(qmax - qmax2)
        return (
            kmax2,
            ksumexp * keep + p.sum(-1),
            kv * keep[..., None] + p @ v,
            qmax2,
            qsumexp * qkeep + torch.exp(lq - qmax2[..., None]).sum(-1),
        )


class BlockStage(LayerStage):
    """-> the block's output rows [1, m, D] (kernels.reference.lara_attention_ref's last stages per query)."""

    def forward(
        self, x: Tensor, n: Tensor, qsum: Tensor, ksum: Tensor,
        kmax: Tensor, ksumexp: Tensor, kv: Tensor, qmax: Tensor, qsumexp: Tensor,
    ) -> Tensor:  # fmt: skip
        q, _, _ = self.heads(x)
        ql, mu, w = self.landmarks(n, qsum, ksum)
        f, lse = kv / ksumexp[..., None], kmax + torch.log(ksumexp)  # F_c [1, H, C, d], lse_c [1, H, C]
        bh, own = lara_balance_heuristic(w, mu)
        lq = ql @ q.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [1, H, C, m]
        rho = torch.exp(lq - (qmax + torch.log(qsumexp))[..., None])
        alpha = lara_mis_weights(bh, rho, self.attn.cfg.alpha_coeff)
        log_r = log_features(w, q) + (lse - own)[..., None]  # [1, H, C, m]
        weights = torch.softmax(torch.log(alpha) + log_r, dim=-2)
        out = (weights.transpose(-1, -2) @ f).transpose(1, 2).flatten(2)  # [1, m, D]
        y = x + self.attn.proj(out)
        return y + self.block.mlp(self.block.norm2(y))


class TailStage(nn.Module):
    """x [1, m, D] -> the final norm's passage means of the slice [1, P, D] (passages), or the running row
    sum [1, D] plus this slice's (mean)."""

    def __init__(self, serving: ServingModel) -> None:
        super().__init__()
        self.text = serving.model

    def forward(self, x: Tensor, rowsum: Tensor | None = None) -> Tensor:
        xn = self.text.norm(x)
        if self.text.passages is not None:
            return self.text.passages.split(xn, torch.ones(xn.shape[:2], dtype=torch.bool))[0]
        assert rowsum is not None
        return rowsum + xn.sum(1)


class ReadoutStage(nn.Module):
    """n [], passages [1, J, D] or rowsum [1, D], (input score sums) -> logits [1, C], ood_score [1]."""

    def __init__(self, serving: ServingModel) -> None:
        super().__init__()
        self.serving, self.text = serving, serving.model

    def forward(
        self, n: Tensor, parts: Tensor, nll: Tensor | None = None, pairs: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        text, serving = self.text, self.serving
        if text.passages is not None:
            real = torch.ones(parts.shape[:2], dtype=torch.bool)  # [1, J]
            z = text.head(parts)  # [1, J, C]
            logits = text.passages.combine(z, real)
            pooled = (text.passages.weights(z, real)[:, None, :] @ parts).squeeze(1)  # [1, D]
        else:
            pooled = parts / n.to(parts.dtype)
            logits = text.head(pooled)
        inp = None
        if serving.input_score is not None and nll is not None and pairs is not None:
            table_max = serving.input_score.table.max().to(nll.dtype)
            inp = torch.where(pairs > 0, nll / pairs.clamp_min(1.0), table_max).to(logits.dtype)
        return logits / serving.temperature, serving.combine(serving.ood(pooled), inp)
