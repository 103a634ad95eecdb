"""Byte-level text encoder: byte (+ hashed n-gram and word) embeddings, positions, masked mean or attention pooling.

Positions are either sinusoidal (absolute; accuracy falls past the trained length) or a masked depthwise
convolution (relative, so the same weights read a 64 KB document as they read a 1 KB one).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from lara_serve.kernels.landmarks import tracing
from lara_serve.model_export.models.config import TextConfig
from lara_serve.model_export.models.layers import Block, init_weights
from lara_serve.model_export.models.text_embeddings import (
    _WORD_MOD,
    ConvPositions,
    NgramEmbedding,
    WordEmbedding,
    fold_case,
    sinusoidal,
    word_hashes,
)

_BIGRAM_MUL = 1_048_573
_BIGRAM_SALT = 7_919
# Adam moves each weight about lr per step whatever its gradient's scale, and an L2-normalized document's
# features are small (~0.05 each for a few hundred grams), so at the encoder's lr the wide logits would grow
# too slowly to matter within a run; the gain multiplies the wide logits (as a 10x lr for this head would).
TFIDF_GAIN = 10.0


def smoothed_idf(df: Tensor, n: int, min_df: int = 2) -> Tensor:
    """ln((1 + n) / (1 + df)) + 1 for grams in at least min_df of the n documents, else 0 (dropped)."""
    return torch.where(df >= min_df, torch.log((1.0 + n) / (1.0 + df)) + 1.0, 0.0)


class TfidfHead(nn.Module):
    """The wide path (Wide & Deep) beside the encoder: a linear classifier over the document's hashed word
    1-2-gram tf-idf vector (sublinear tf 1 + ln count, idf from the training documents, L2 norm), computed
    in the graph from input_ids: [B, N] -> logits [B, C].

    Why: by cross-validation on BBC a bag of words with idf keeps its accuracy from the first KB to whole
    documents where a mean of token vectors does not (research.anchor_parts); idf is what a byte model's
    mean pooling lacks. `idf` is a buffer set once by `fit_idf` before training (0 for grams in fewer than
    2 training documents, as min_df=2 drops them), saved and exported with the weights.

    Words are the text encoder's (ASCII letters and digits, case-folded, `word_hashes`); a bigram is two
    words in a row with anything but word bytes between them. Per document the words are packed into
    word order by a scatter (ONNX ScatterElements; there is no exportable cummax), and the tf-idf vector is
    never built densely: each occurrence of a gram carries 1/count of its gram's normalized weight, so a sum
    over occurrences is the dot product with the weight rows (only the counts are a [B, buckets] tensor).

    Measured on BBC (docs/long-documents.md, rule P): trained jointly with the encoder, this path learned most
    of the classification and the sum's 1 KB gap did not shrink (CV 1.64 points); no shipped model uses it.
    """

    def __init__(self, buckets: int, num_classes: int, utf8: bool = False) -> None:
        super().__init__()
        if buckets < 2:
            raise ValueError(f"tfidf_buckets must be 0 (no wide path) or at least 2, got {buckets}")
        self.buckets, self.utf8 = buckets, utf8
        self.weight = nn.Parameter(torch.zeros(buckets, num_classes))  # zero: the wide path starts silent
        self.register_buffer("idf", torch.zeros(buckets))

    def grams(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """ids [B, N] -> (bucket [B, 2N] int64, real [B, 2N] bool): unigrams in word order, then bigrams."""
        h, end = word_hashes(ids, self.utf8)  # [B, N] each
        b, n = ids.shape
        order = torch.where(end > 0, end.cumsum(1) - 1, n)  # the k-th word's end -> slot k; others -> slot n
        words = torch.zeros(b, n + 1, dtype=h.dtype, device=h.device).scatter_add(1, order, h * end)[:, :n]
        k = torch.arange(n, device=ids.device)[None]  # [1, N]
        uni = k < end.sum(1, keepdim=True)  # [B, N]
        prev = nn.functional.pad(words[:, :-1], (1, 0))  # the (k-1)-th word's hash
        code = (prev * _BIGRAM_MUL + words + _BIGRAM_SALT) % _WORD_MOD  # [B, N]
        bucket = torch.cat([words % self.buckets, code % self.buckets], 1)
        return bucket, torch.cat([uni, uni & (k >= 1)], 1)

    @torch.no_grad()
    def fit_idf(self, docs: Iterable[Tensor], min_df: int = 2) -> None:
        """Smoothed idf from training documents (1-D id tensors, byte + 1): `smoothed_idf`."""
        df = torch.zeros(self.buckets, dtype=torch.float64)
        n = 0
        for ids in docs:
            bucket, real = self.grams(ids.reshape(1, -1).to(self.idf.device))
            df[torch.unique(bucket[real])] += 1
            n += 1
        self.idf.copy_(smoothed_idf(df, n, min_df).to(self.idf.dtype))

    def forward(self, ids: Tensor) -> Tensor:
        bucket, real = self.grams(ids)  # [B, M] each
        r = real.to(self.weight.dtype)
        counts = torch.zeros(ids.shape[0], self.buckets, dtype=r.dtype, device=r.device).scatter_add(1, bucket, r)
        c = counts.gather(1, bucket).clamp_min(1.0)  # [B, M] occurrences of this gram in its document
        x = (1.0 + torch.log(c)) * self.idf[bucket] * r  # [B, M] the gram's tf-idf value, at each occurrence
        norm = ((x * x / c).sum(1, keepdim=True)).sqrt().clamp_min(1e-12)  # [B, 1] ||tf-idf|| over distinct grams
        w = (x / (c * norm)).unsqueeze(1)  # [B, 1, M]
        return TFIDF_GAIN * (w @ self.weight[bucket]).squeeze(1)  # [B, C]


def wide_logits(head: TfidfHead | None, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """A model's forward_wide: its wide head's logits [B, C] over the rows' real ids (padding zeroed), float32."""
    if head is None:
        raise ValueError("forward_wide needs a model with a wide path (config tfidf_buckets > 0); this one has none")
    valid = attention_mask > 0
    ids = input_ids * valid.long()
    if not ids.is_cpu or tracing():
        return head(ids).float()
    # Eager on CPU: each document's own ids (as forward_head does), so batching cannot change a sum's order.
    return torch.cat([head(ids[i][valid[i]][None]) for i in range(ids.shape[0])]).float()


class AttentionPool(nn.Module):
    """Per head group, a softmax over the document's tokens of one learned score each, then the weighted sum
    of the group's channels: [B, N, D] -> [B, D]. A mean gives every token 1/N of the vote, so the pooled
    vector of a short head and of its whole document differ by how much filler each holds; learned weights
    can follow the few tokens that name a topic (an idf-like weighting, learned from the data). Measured on BBC
    (docs/long-documents.md, rule O): it lifted whole documents, not the first KB. The shipped lara-text-news-bytes
    has it, but fine-tuned from a mean-pooling model its scores stayed near zero (std 0.04 over an article plus
    8 KB of lorem ipsum; the article's weight equals its byte share): a mean in effect. `train --pool-lr-mult`
    moved the scores (std 0.1-0.7) but not the article's share (docs/robustness.md)."""

    def __init__(self, dim: int, groups: int) -> None:
        super().__init__()
        if groups < 1 or dim % groups:
            raise ValueError(f"attention pooling needs dim divisible by heads, got dim {dim} and heads {groups}")
        self.groups = groups
        self.score = nn.Linear(dim, groups)

    def forward(self, x: Tensor, valid: Tensor) -> Tensor:
        """x [B, N, D], valid [B, N] bool -> [B, D]; a document of no tokens pools to zeros (as a mean of
        nothing does in the mean path), not NaN: a finite fill, then the weights are masked again."""
        b, n, d = x.shape
        keep = valid[..., None]  # [B, N, 1]
        s = self.score(x).masked_fill(~keep, torch.finfo(x.dtype).min)  # [B, N, G]
        w = (torch.softmax(s, dim=1) * keep.to(x.dtype)).permute(0, 2, 1).unsqueeze(2)  # [B, G, 1, N]
        xs = x.view(b, n, self.groups, d // self.groups).permute(0, 2, 1, 3)  # [B, G, N, D/G]
        return (w @ xs).reshape(b, d)  # [B, D]


class PassageReadout(nn.Module):
    """A readout that filler cannot dilute: the document is cut into passages of `size` tokens from its
    first token, each passage is its tokens' mean, the classifier head scores every passage, and the
    document's logits are the log-mean-exp of its passages' logits (per class, over real passages).

    Why: with a mean (or near-uniform attention) over tokens, 20 KB of filler after a 3 KB article gives the
    article an eighth of the vote. Here a passage that supports no class (all logits low) adds almost
    nothing to any class's sum of exponentials, and the - log(passages) term moves every class alike, so it
    leaves the probabilities unchanged: a passage that names its topic strongly speaks for the document
    whatever surrounds it (a soft maximum over passages, as in multiple-instance learning). Parameter-free:
    the head is the model's own. A document of no tokens reads one all-zero passage (the head's bias), as
    the mean path's empty mean does.
    """

    def __init__(self, size: int) -> None:
        super().__init__()
        if size < 1:
            raise ValueError(f"passage size must be at least 1, got {size}")
        self.size = size

    def split(self, x: Tensor, valid: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, N, D], valid [B, N] bool -> (passage means [B, J, D], real [B, J] bool), J = ceil(N / size).

        The batched form (traced graphs, GPU): rows must be right-padded, as the server pads them, so
        that every row's grid starts at its first token (eager CPU cuts each document's own rows: `own`)."""
        b, n, d = x.shape
        pad = (self.size - n % self.size) % self.size
        m = valid.to(x.dtype)
        sums = nn.functional.pad(x * m[..., None], (0, 0, 0, pad)).reshape(b, -1, self.size, d).sum(2)
        counts = nn.functional.pad(m, (0, pad)).reshape(b, -1, self.size).sum(2)  # [B, J]
        real = counts > 0
        real = torch.cat([torch.ones_like(real[:, :1]), real[:, 1:]], 1)  # the first passage always counts
        return sums / counts.clamp_min(1.0)[..., None], real

    def own(self, x: Tensor) -> Tensor:
        """One document's own rows x [n, D] -> passage means [max(1, ceil(n / size)), D], by views (a 1 MiB
        document's rows are 512 MiB: padding them would copy them)."""
        n, d = x.shape
        full = n // self.size
        parts = [x[: full * self.size].view(full, self.size, d).mean(1)] if full else []
        if n % self.size or not full:
            tail = x[full * self.size :]
            parts.append(tail.sum(0, keepdim=True) / max(tail.shape[0], 1))
        return torch.cat(parts)

    @staticmethod
    def combine(z: Tensor, real: Tensor) -> Tensor:
        """Passage logits z [B, J, C], real [B, J] -> document logits [B, C]: log-mean-exp over real passages."""
        z = z.masked_fill(~real[..., None], torch.finfo(z.dtype).min)
        return torch.logsumexp(z, 1) - torch.log(real.sum(1, keepdim=True).to(z.dtype))

    @staticmethod
    def weights(z: Tensor, real: Tensor) -> Tensor:
        """Each passage's share of the document's evidence [B, J]: softmax over passages of logsumexp over
        classes (the pooled feature of the out-of-distribution score weights passages by it)."""
        s = torch.logsumexp(z, -1).masked_fill(~real, torch.finfo(z.dtype).min)
        return torch.softmax(s, 1) * real.to(z.dtype)


# Eager inputs shorter than this are right-padded to it (bitwise batch invariance, see forward_features).
MIN_ROWS = 16


class TextEncoder(nn.Module):
    """forward(input_ids [B, N] int64, attention_mask [B, N] int64 1=real) -> logits [B, C] float32."""

    def __init__(self, cfg: TextConfig, seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim, padding_idx=0)
        self.ngrams = (
            NgramEmbedding(cfg.ngram_buckets, cfg.ngram_orders, cfg.dim, cfg.ngram_dim) if cfg.ngram_buckets else None
        )
        self.words = WordEmbedding(cfg.word_buckets, cfg.dim, cfg.word_dim) if cfg.word_buckets else None
        self.pos_conv = ConvPositions(cfg.dim, cfg.conv_kernel) if cfg.positions == "conv" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            Block(cfg.dim, cfg.heads, cfg.mlp_ratio, cfg.attention, i, dropout=cfg.dropout, seed=seed)
            for i in range(cfg.depth)
        )
        self.norm = nn.LayerNorm(cfg.dim)
        self.pool = AttentionPool(cfg.dim, cfg.heads) if cfg.pooling == "attention" else None
        self.passages = PassageReadout(cfg.passage_bytes) if cfg.pooling == "passages" else None
        self.head = nn.Linear(cfg.dim, cfg.num_classes)
        init_weights(self)
        # After init_weights, which would redraw the wide weights (they start at zero).
        self.tfidf = TfidfHead(cfg.tfidf_buckets, cfg.num_classes, cfg.tfidf_utf8) if cfg.tfidf_buckets else None
        nn.init.normal_(self.embed.weight, std=0.02)
        for table in (self.ngrams, self.words):
            if table is not None:
                table.reset_parameters(std=0.02)

    def forward_features(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        if not tracing() and input_ids.is_cpu and input_ids.shape[1] < MIN_ROWS:
            # CPU GEMM takes a different micro-kernel for fewer than ~12 rows, which rounds differently:
            # a very short document alone would not match its own rows inside a batch. Right padding
            # (which the model ignores exactly) keeps every Linear at >= 16 rows; the rows are cut after.
            n = input_ids.shape[1]
            pad = MIN_ROWS - n
            input_ids = nn.functional.pad(input_ids, (0, pad))
            attention_mask = nn.functional.pad(attention_mask, (0, pad))
            return self.forward_features(input_ids, attention_mask)[:, :n]
        valid = attention_mask > 0  # [B, N]
        ids = input_ids * valid.long()  # pad positions read id 0 whatever they hold
        if self.cfg.case_fold:
            ids = fold_case(ids)
        from lara_serve.model_export.models import long_forward  # here: long_forward imports this module

        if not tracing() and long_forward.applies(self, input_ids):
            return long_forward.features(self, ids, valid)  # documents above 64K tokens, in slices of rows
        x = self.embed(ids)  # [B, N, D]
        if self.ngrams is not None:
            x = x + self.ngrams(ids)
        if self.words is not None:
            x = x + self.words(ids)
        if self.pos_conv is not None:
            x = self.pos_conv(x, valid)
        else:
            # Positions count real tokens only, so left or right padding leaves them unchanged.
            pos = (valid.long().cumsum(-1) - 1).clamp_min(0)  # [B, N]
            x = x + sinusoidal(pos, self.cfg.dim) * 0.1
        x = self.drop(x)
        pad = ~valid
        for blk in self.blocks:
            x = blk(x, pad, None)
        return self.norm(x)  # [B, N, D]

    def forward_pooled(self, x: Tensor, attention_mask: Tensor) -> Tensor:
        """Final token vectors x [B, N, D] -> the document vector the head reads [B, D] (passage readout: the
        passages' means weighted by their share of the evidence, `PassageReadout.weights`)."""
        if self.passages is not None:
            return self.forward_readout(x, attention_mask)[1]
        valid = attention_mask > 0
        if not x.is_cpu or tracing():  # the batched form (GPU: no per-row host syncs)
            if self.pool is not None:
                return self.pool(x, valid)
            m = valid.to(x.dtype)[:, None, :]  # [B, 1, N]
            # A [1, N] x [N, D] product per document: onnxruntime's ReduceSum over the token axis of x * m
            # took 6% of the model at 32K tokens, the MatMul a fraction of that.
            return (m @ x).squeeze(1) / m.sum(-1).clamp_min(1.0)  # [B, D]
        # Eager on CPU: one document at a time (see forward_head), pooling exactly the document's own rows.
        rows = []
        for i in range(x.shape[0]):
            # [n_i, D], contiguous, as when the document is alone and unpadded (a view when nothing is padding:
            # a 1 MiB document's copy would be 512 MiB)
            own = x[i] if bool(valid[i].all()) else x[i][valid[i]]
            if self.pool is not None:
                rows.append(self.pool(own[None], torch.ones(1, own.shape[0], dtype=torch.bool, device=own.device)))
            else:
                rows.append(own.sum(0, keepdim=True) / max(own.shape[0], 1))  # [1, D]
        return torch.cat(rows)  # [B, D]

    def _passage_parts(self, x: Tensor, valid: Tensor) -> list[tuple[Tensor, Tensor]]:
        """(passage means [1, J, D], real passages [1, J]) per document; batched in traced graphs and
        on GPU (one entry for the whole batch, [B, J, .]), else each document's own rows (bitwise the same
        alone and in any padded batch, as forward_pooled's eager path)."""
        assert self.passages is not None
        if not x.is_cpu or tracing():
            p, real = self.passages.split(x, valid)
            return [(p, real)]
        out = []
        for i in range(x.shape[0]):
            own = x[i] if bool(valid[i].all()) else x[i][valid[i]]
            p = self.passages.own(own)[None]  # [1, J, D]
            out.append((p, torch.ones(p.shape[:2], dtype=torch.bool, device=p.device)))
        return out

    def forward_readout(self, x: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        """(logits [B, C] float32, the pooled document vector [B, D]) of final token vectors x [B, N, D]: what
        the serving head needs (the logits and the out-of-distribution score's feature) from one pass over the
        passages, whose means and head scores both read."""
        if self.passages is None:
            return self.forward_head(x, attention_mask), self.forward_pooled(x, attention_mask)
        logits, pooled = [], []
        for p, real in self._passage_parts(x, attention_mask > 0):
            z = self.head(p)  # [b, J, C]
            logits.append(self.passages.combine(z, real))
            w = self.passages.weights(z, real)  # [b, J]
            pooled.append((w[:, None, :] @ p).squeeze(1))  # [b, D]
        return torch.cat(logits).float(), torch.cat(pooled)

    def forward_head(self, x: Tensor, attention_mask: Tensor) -> Tensor:
        if self.passages is not None:
            return self.forward_readout(x, attention_mask)[0]
        pooled = self.forward_pooled(x, attention_mask)  # [B, D]
        if not x.is_cpu or tracing():
            return self.head(pooled).float()
        # Eager on CPU: so that a document's logits are bitwise the same alone and in any batch with any
        # padding. A batched masked sum reduces in an order set by the padded length (forward_pooled pools
        # each document's own rows), and the head runs as gemv for one row but gemm for several; both round
        # differently (~2e-7). A one-row head per document takes the path it takes alone.
        return torch.cat([self.head(pooled[i : i + 1]) for i in range(pooled.shape[0])]).float()

    def forward_wide(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The wide path's logits [B, C] (model config tfidf_buckets > 0)."""
        return wide_logits(self.tfidf, input_ids, attention_mask)

    def forward_deep(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The encoder's logits [B, C] (without the wide path, if there is one)."""
        return self.forward_head(self.forward_features(input_ids, attention_mask), attention_mask)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        logits = self.forward_deep(input_ids, attention_mask)
        if self.tfidf is not None:
            logits = logits + self.forward_wide(input_ids, attention_mask)
        return logits
