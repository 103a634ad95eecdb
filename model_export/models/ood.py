""" "Not mine": an out-of-distribution score computed in the served graph, and the serving wrapper that adds it
(and the calibration temperature) to a trained model.

The score is the Mahalanobis distance of the model's pooled feature vector to the nearest class mean under one
shared covariance (Lee et al., 2018), fitted on training-set features: min_c (f - mu_c)^T S^-1 (f - mu_c),
written as min_c ||(f - mu_c) W||^2 with W = S^-1/2, so the graph needs only a matmul and a reduction. Higher
means less like the training data. The threshold that makes `in_distribution` true for 95% of holdout items
is chosen on the holdout (`threshold_at`), never on a test split.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

SERVING_KEYS = ("serving.temperature", "serving.ood_means", "serving.ood_whiten")
PROBE_KEYS = ("serving.probe_weight", "serving.probe_bias", "serving.probe_scales")
# A word-piece model with cfg.min_pieces > 0: a text of fewer pieces ("a", "The") is not a document; its pooled
# vector is one embedding, which may sit anywhere (measured: "a" scored 445 against the int8 lara-text-news
# threshold of 527, while "Shares rose." scored 581). Its ood_score is SHORT_TEXT_SCORE, beyond any threshold,
# as the byte models' input score does for a text of fewer than two bytes (models/ood_input.py).
SHORT_TEXT_SCORE = 1e6


class MahalanobisScore(nn.Module):
    """features [B, D] -> squared Mahalanobis distance to the nearest class mean [B] (float32)."""

    def __init__(self, means: Tensor, whiten: Tensor) -> None:
        super().__init__()
        if means.ndim != 2 or whiten.shape != (means.shape[1], means.shape[1]):
            raise ValueError(f"need means [C, D] and whiten [D, D], got {tuple(means.shape)}, {tuple(whiten.shape)}")
        self.register_buffer("means", means.float())  # [C, D]
        self.register_buffer("whiten", whiten.float())  # [D, D]

    @classmethod
    def fit(cls, features: Tensor, labels: Tensor, shrinkage: float = 0.05) -> MahalanobisScore:
        """Class means and the pooled within-class covariance of features [N, D] (labels [N]), shrunk toward
        its mean variance times I by `shrinkage` so that a few hundred items in 128 dimensions stay invertible."""
        f = features.double()
        classes = sorted(set(labels.tolist()))
        means = torch.stack([f[labels == c].mean(0) for c in classes])  # [C, D]
        centred = f - means[torch.tensor([classes.index(c) for c in labels.tolist()])]  # [N, D]
        cov = centred.T @ centred / max(len(f) - len(classes), 1)  # [D, D]
        d = cov.shape[0]
        cov = (1 - shrinkage) * cov + shrinkage * cov.trace() / d * torch.eye(d, dtype=cov.dtype)
        evals, evecs = torch.linalg.eigh(cov)
        whiten = evecs @ torch.diag(evals.clamp_min(1e-12).rsqrt()) @ evecs.T  # S^-1/2, symmetric
        return cls(means, whiten)

    def forward(self, features: Tensor) -> Tensor:
        z = (features.float()[:, None, :] - self.means[None]) @ self.whiten  # [B, C, D]
        return (z * z).sum(-1).min(dim=1).values  # [B]


class OutlierProbe(nn.Module):
    """features [B, D] -> a linear logit [B], higher for text unlike the training data: logistic regression of
    the training features against text of other kinds (outlier exposure, Hendrycks et al., 2019). The
    Mahalanobis score sees how far a vector is from the class means; text of another kind that lies near a
    class (English prose that is not news, near an article of the same words) needs a learned direction."""

    def __init__(self, weight: Tensor, bias: Tensor) -> None:
        super().__init__()
        if weight.ndim != 1 or bias.numel() != 1:
            raise ValueError(f"need weight [D] and bias [1], got {tuple(weight.shape)}, {tuple(bias.shape)}")
        self.register_buffer("weight", weight.float())  # [D]
        self.register_buffer("bias", bias.float().reshape(1))  # [1]

    def forward(self, features: Tensor) -> Tensor:
        return features.float() @ self.weight + self.bias  # [B]


def penalised(
    feature: Tensor, score: Tensor, q_m: Tensor | float, q_s: Tensor | float, med_s: Tensor | float
) -> Tensor:
    """The served combination of the Mahalanobis score with a second score (the input score or the outlier
    probe): m / q_m + max(0, (s - q_s) / (q_s - median_s)), q the 95% holdout quantiles: the feature score alone
    until the second score passes its own holdout quantile (research/ood_combination.py chose the rule)."""
    return feature / q_m + torch.relu((score - q_s) / (q_s - med_s))


def threshold_at(scores: Tensor, pass_rate: float = 0.95) -> float:
    """The score at or below which `pass_rate` of these (in-distribution holdout) items fall."""
    if not 0.0 < pass_rate <= 1.0 or len(scores) == 0:
        raise ValueError(f"need pass_rate in (0, 1] and at least one score, got {pass_rate}, {len(scores)} scores")
    return float(torch.quantile(scores.double(), pass_rate))


def pooled_features(model: nn.Module, inputs: dict[str, Tensor]) -> Tensor:
    """The vector the classifier head reads, [B, D], for a text encoder or a ViT."""
    if "pixel_values" in inputs:
        return model.forward_pooled(model.forward_features(inputs["pixel_values"]))
    x = model.forward_features(inputs["input_ids"], inputs["attention_mask"])
    return model.forward_pooled(x, inputs["attention_mask"])


class ServingModel(nn.Module):
    """A trained model as it is served: forward(**inputs) -> (logits / temperature [B, C], ood_score [B]).

    State dict: the base model's tensors under their own names, plus SERVING_KEYS, so one safetensors file
    holds both and `load_pretrained(..., serving=False)` still reads the base model alone."""

    output_names = ("logits", "ood_score")

    def __init__(
        self,
        model: nn.Module,
        temperature: float,
        ood: MahalanobisScore,
        input_score: nn.Module | None = None,
        scales: tuple[float, float, float] | None = None,
        probe: OutlierProbe | None = None,
        probe_scales: tuple[float, float, float] | None = None,
    ) -> None:
        super().__init__()
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if (input_score is None) != (scales is None) or (
            scales is not None and not (len(scales) == 3 and scales[0] > 0 and scales[1] > scales[2])
        ):
            raise ValueError(f"an input score needs scales (q_feature > 0, q_input > median_input), got {scales}")
        if (probe is None) != (probe_scales is None) or (
            probe_scales is not None
            and not (len(probe_scales) == 3 and probe_scales[0] > 0 and probe_scales[1] > probe_scales[2])
        ):
            raise ValueError(f"a probe needs scales (q_feature > 0, q_probe > median_probe), got {probe_scales}")
        if probe is not None and input_score is not None:
            raise ValueError("a serving head takes an input score or an outlier probe, not both")
        self.model = model
        self.cfg = model.cfg
        self.register_buffer("temperature", torch.tensor(float(temperature)))
        self.ood = ood
        # Optional (lara_serve.model_export.models.ood_input): the served score is then
        # m / q_m + max(0, (s - q_s) / (q_s - median_s)) with scales = (q_m, q_s, median_s): the feature score
        # alone unless the input is less likely than 95% of the holdout's (research/ood_combination.py).
        self.input_score = input_score
        self.register_buffer("ood_scales", None if scales is None else torch.tensor([float(v) for v in scales]))
        # Optional: the served score is then m / q_m + max(0, (g - q_g) / (q_g - median_g)), g the probe's logit,
        # with probe_scales = (q_m, q_g, median_g): the input score's rule, with the probe in its place.
        self.probe = probe
        self.register_buffer(
            "probe_scales", None if probe_scales is None else torch.tensor([float(v) for v in probe_scales])
        )

    @staticmethod
    def wrap(
        model: nn.Module,
        temperature: float,
        ood: MahalanobisScore,
        input_score: nn.Module | None = None,
        scales: tuple[float, float, float] | None = None,
        probe: OutlierProbe | None = None,
        probe_scales: tuple[float, float, float] | None = None,
    ) -> ServingModel:
        """The serving model of a text encoder or a ViT (forward's argument names are the graph's inputs)."""
        cls = ImageServingModel if hasattr(model.cfg, "image_size") else TextServingModel
        return cls(model, temperature, ood, input_score, scales, probe, probe_scales)

    def serving_state(self) -> dict[str, Tensor]:
        from lara_serve.model_export.models.ood_input import input_state

        state = {
            "serving.temperature": self.temperature.reshape(1),
            "serving.ood_means": self.ood.means,
            "serving.ood_whiten": self.ood.whiten,
        }
        if self.input_score is not None:
            state.update(input_state(self.input_score))
            state["serving.ood_scales"] = self.ood_scales
        if self.probe is not None:
            state["serving.probe_weight"] = self.probe.weight
            state["serving.probe_bias"] = self.probe.bias
            state["serving.probe_scales"] = self.probe_scales
        return state

    @classmethod
    def from_state(cls, model: nn.Module, state: dict[str, Tensor]) -> ServingModel:
        from lara_serve.model_export.models.ood_input import input_from_state

        ood = MahalanobisScore(state["serving.ood_means"], state["serving.ood_whiten"])
        inp = input_from_state(state, bool(getattr(model.cfg, "case_fold", False)))
        scales = None
        if inp is not None:
            if "serving.ood_scales" not in state:
                raise ValueError("the serving head has an input score but no serving.ood_scales")
            scales = tuple(float(v) for v in state["serving.ood_scales"])
        probe, probe_scales = None, None
        present = [k for k in PROBE_KEYS if k in state]
        if present:
            if len(present) != len(PROBE_KEYS):
                raise ValueError(f"an outlier probe needs all of {PROBE_KEYS}, found {present}")
            probe = OutlierProbe(state["serving.probe_weight"], state["serving.probe_bias"])
            probe_scales = tuple(float(v) for v in state["serving.probe_scales"])
        temperature = float(state["serving.temperature"].reshape(()))
        return ServingModel.wrap(model, temperature, ood, inp, scales, probe, probe_scales)  # type: ignore[arg-type]

    def combine(self, feature_score: Tensor, input_score: Tensor | None, probe_score: Tensor | None = None) -> Tensor:
        if probe_score is not None and self.probe_scales is not None:
            # explicit indexing, not unpacking: unpacking traces as another op and renames the exported nodes
            scales = self.probe_scales
            return penalised(feature_score, probe_score, scales[0], scales[1], scales[2])
        if input_score is None or self.ood_scales is None:
            return feature_score
        scales = self.ood_scales
        return penalised(feature_score, input_score, scales[0], scales[1], scales[2])


class TextServingModel(ServingModel):
    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        x = self.model.forward_features(input_ids, attention_mask)  # [B, N, D]
        logits, pooled = self.model.forward_readout(x, attention_mask)  # [B, C], [B, D]
        if getattr(self.model, "tfidf", None) is not None:
            logits = logits + self.model.forward_wide(input_ids, attention_mask)
        feature = self.ood(pooled)
        inp = None if self.input_score is None else self.input_score(input_ids, attention_mask)
        scaled = logits / self.temperature  # before the score: the shipped graphs' node order, byte for byte
        score = self.combine(feature, inp, None if self.probe is None else self.probe(pooled))
        min_pieces = getattr(self.cfg, "min_pieces", 0)
        if min_pieces:  # word pieces: the mask covers [CLS] + pieces + [SEP]
            pieces = attention_mask.sum(1) - 2
            score = torch.where(pieces < min_pieces, torch.full_like(score, SHORT_TEXT_SCORE), score)
        return scaled, score


class ImageServingModel(ServingModel):
    def forward(self, pixel_values: Tensor) -> tuple[Tensor, Tensor]:
        x = self.model.forward_features(pixel_values)  # [B, N, D]
        pooled = self.model.forward_pooled(x)
        feature = self.ood(pooled)
        inp = None if self.input_score is None else self.input_score(pixel_values)
        probe = None if self.probe is None else self.probe(pooled)
        return self.model.forward_head(x) / self.temperature, self.combine(feature, inp, probe)
