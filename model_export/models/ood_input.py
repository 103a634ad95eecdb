"""Input-space out-of-distribution scores, beside the feature-space Mahalanobis score of lara_serve.model_export.models.ood.

The Mahalanobis distance of pooled features catches items the encoder maps away from every class (another
kind of English text, digits shown to a garment model) but is weak on inputs the encoder was never built to
read: random bytes, source code, another language, lorem ipsum, noise, an inverted picture. Those are far
from the training data in the input itself, which a density model of the input sees at once (measured:
bigram AUROC 0.999-1.0 on the text OOD sets, pixel AUROC 1.0 on noise and inverted images; both ~0.2-0.35
on the other kind: see docs/robustness.md). Both scores are cheap and linear in the input's size:

- text, `ByteBigramNLL`: the mean negative log-likelihood (nats per byte) of a document under a bigram model
  of the training documents' bytes (case-folded as the encoder folds them, add-k smoothing), read from a
  257 x 257 table by the token ids (byte + 1; 0 is padding); a document of fewer than two bytes gets the
  table's largest value ("a" is not a document);
- images, `PixelNLL`: the mean over pixels of (x - mu)^2 / var + log var under an independent Gaussian per
  pixel of the training images (normalized as the model sees them), the variance floored at 5% of its mean.

lara_serve.model_export.head.finalize combines them with the Mahalanobis score m as m / q_m + max(0, (s - q_s) / (q_s - med_s))
(q: 95% holdout quantiles, med: the holdout median): in-distribution inputs are ranked by the feature score
alone, and an input less likely than 95% of the holdout's gets a penalty that grows with its distance. On
validation sets (research/ood_combination.py) this kept the feature score's AUROC on English of another kind
(0.91 vs 0.92 alone) where the larger of the two scaled scores lost it (0.84), and reached 0.99-1.0 on code,
word salad and made-up language (0.94-0.95 for the feature score alone).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn

from lara_serve.model_export.models.text_embeddings import fold_case

VOCAB = 257  # token ids: byte + 1, 0 = padding
BIGRAM_SMOOTHING = 0.1
PIXEL_VAR_FLOOR = 0.05
INPUT_KEYS = {"text": ("serving.ood_bigram",), "image": ("serving.ood_pixel_mean", "serving.ood_pixel_var")}


class ByteBigramNLL(nn.Module):
    """input_ids [B, N] (byte + 1), attention_mask [B, N] -> mean bigram NLL per document [B] (float32)."""

    def __init__(self, table: Tensor, case_fold: bool) -> None:
        super().__init__()
        if table.shape != (VOCAB, VOCAB):
            raise ValueError(f"need a [{VOCAB}, {VOCAB}] table of -log P(next | previous), got {tuple(table.shape)}")
        self.register_buffer("table", table.float().reshape(-1))  # [VOCAB * VOCAB], flat: one Gather in ONNX
        self.case_fold = case_fold

    @classmethod
    def fit(cls, docs: Iterable[bytes], case_fold: bool, smoothing: float = BIGRAM_SMOOTHING) -> ByteBigramNLL:
        counts = torch.zeros(VOCAB * VOCAB, dtype=torch.float64)
        for doc in docs:
            ids = torch.frombuffer(bytearray(doc), dtype=torch.uint8).long() + 1
            if case_fold:
                ids = fold_case(ids)
            if len(ids) >= 2:
                counts += torch.bincount(ids[:-1] * VOCAB + ids[1:], minlength=VOCAB * VOCAB).double()
        c = counts.reshape(VOCAB, VOCAB) + smoothing
        return cls(-(c / c.sum(1, keepdim=True)).log(), case_fold)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        valid = attention_mask > 0
        ids = input_ids * valid.long()
        if self.case_fold:
            ids = fold_case(ids)
        pair_ok = (valid[:, :-1] & valid[:, 1:]).float()  # [B, N-1]: both bytes of the pair are real
        nll = self.table[ids[:, :-1] * VOCAB + ids[:, 1:]]  # [B, N-1]
        pairs = pair_ok.sum(-1)
        mean = (nll * pair_ok).sum(-1) / pairs.clamp_min(1.0)
        return torch.where(pairs > 0, mean, self.table.max().expand_as(mean))

    def score_raw(self, docs: Sequence[bytes]) -> Tensor:
        """The score of each raw document, one at a time (no padding), in order: [N]."""
        out = []
        for doc in docs:
            ids = (
                torch.frombuffer(bytearray(doc), dtype=torch.uint8).long()[None] + 1 if doc else torch.ones(1, 1).long()
            )
            mask = torch.ones_like(ids) if doc else torch.zeros_like(ids)
            out.append(self(ids, mask))
        return torch.cat(out)


class PixelNLL(nn.Module):
    """pixel_values [B, C, S, S] (normalized) -> mean per-pixel Gaussian NLL [B] (float32, constants dropped)."""

    def __init__(self, mean: Tensor, var: Tensor) -> None:
        super().__init__()
        if mean.shape != var.shape or mean.ndim != 3:
            raise ValueError(f"need mean and var [C, S, S], got {tuple(mean.shape)}, {tuple(var.shape)}")
        self.register_buffer("mean", mean.float())
        self.register_buffer("var", var.float())

    @classmethod
    def fit(cls, batches: Iterable[Tensor], floor: float = PIXEL_VAR_FLOOR) -> PixelNLL:
        """batches: normalized pixel_values [B, C, S, S] of training images (float64 sums: no drift)."""
        n, s1, s2 = 0, None, None
        for x in batches:
            x = x.double()
            s1 = x.sum(0) if s1 is None else s1 + x.sum(0)
            s2 = (x * x).sum(0) if s2 is None else s2 + (x * x).sum(0)
            n += len(x)
        if n == 0 or s1 is None or s2 is None:
            raise ValueError("no training images to fit the pixel model on")
        mean = s1 / n
        var = (s2 / n - mean * mean).clamp_min(0.0)
        return cls(mean, var + floor * var.mean())

    def forward(self, pixel_values: Tensor) -> Tensor:
        z = (pixel_values.float() - self.mean) ** 2 / self.var + self.var.log()
        return z.flatten(1).mean(-1)


def input_state(score: nn.Module) -> dict[str, Tensor]:
    if isinstance(score, ByteBigramNLL):
        return {"serving.ood_bigram": score.table.reshape(VOCAB, VOCAB)}
    if isinstance(score, PixelNLL):
        return {"serving.ood_pixel_mean": score.mean, "serving.ood_pixel_var": score.var}
    raise TypeError(f"not an input score: {type(score).__name__}")


def input_from_state(state: dict[str, Tensor], case_fold: bool) -> nn.Module | None:
    """The input score a serving head's tensors hold, or None (a head saved before input scores existed)."""
    if "serving.ood_bigram" in state:
        return ByteBigramNLL(state["serving.ood_bigram"], case_fold)
    if "serving.ood_pixel_mean" in state:
        return PixelNLL(state["serving.ood_pixel_mean"], state["serving.ood_pixel_var"])
    return None


def text_input_scores(
    train: Sequence[bytes], val: Sequence[bytes], test: Sequence[bytes], case_fold: bool
) -> tuple[ByteBigramNLL, Tensor, Tensor]:
    """The bigram model fitted on training documents, and its scores of the holdout and test documents."""
    score = ByteBigramNLL.fit(train, case_fold)
    with torch.inference_mode():
        return score, score.score_raw(val), score.score_raw(test)


def image_input_scores(train: object, val: object, test: object) -> tuple[PixelNLL, Tensor, Tensor]:
    """The pixel model fitted on a training ImageTask's images, and its scores of the holdout and test tasks."""

    def pixels(task: object) -> Iterable[Tensor]:
        return (inputs["pixel_values"] for inputs, _ in task.eval_batches(512))  # type: ignore[attr-defined]

    score = PixelNLL.fit(pixels(train))
    with torch.inference_mode():
        return score, torch.cat([score(x) for x in pixels(val)]), torch.cat([score(x) for x in pixels(test)])
