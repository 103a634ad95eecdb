"""The out-of-distribution score: Mahalanobis distance against a float64 reference, the holdout threshold,
and the serving model (temperature + score) saved, reloaded and exported with parity."""

from __future__ import annotations

import pytest
import torch

from lara_serve.model_export import create_model
from lara_serve.model_export.export import exporter as ex
from lara_serve.model_export.models.hub import load_pretrained
from lara_serve.model_export.models.ood import MahalanobisScore, ServingModel, pooled_features, threshold_at


def reference_score(features: torch.Tensor, labels: torch.Tensor, queries: torch.Tensor, shrink: float) -> torch.Tensor:
    """Float64 from the definitions: class means, pooled within-class covariance (n - C), shrunk toward
    (trace / D) I, inverted; the smallest (q - mu)^T S^-1 (q - mu) over classes."""
    f = features.double()
    classes = sorted(set(labels.tolist()))
    mus = {c: f[labels == c].mean(0) for c in classes}
    d = f.shape[1]
    cov = torch.zeros(d, d, dtype=torch.float64)
    for x, y in zip(f, labels.tolist(), strict=True):
        r = (x - mus[y])[:, None]
        cov += r @ r.T
    cov /= len(f) - len(classes)
    cov = (1 - shrink) * cov + shrink * torch.trace(cov) / d * torch.eye(d, dtype=torch.float64)
    inv = torch.linalg.inv(cov)
    out = []
    for q in queries.double():
        out.append(min(float((q - mus[c]) @ inv @ (q - mus[c])) for c in classes))
    return torch.tensor(out, dtype=torch.float64)


def test_score_matches_a_float64_reference() -> None:
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(300, 8, generator=g) * torch.linspace(0.2, 3.0, 8)  # unequal variances
    labels = torch.randint(0, 3, (300,), generator=g)
    feats[labels == 1] += 4.0
    queries = torch.randn(20, 8, generator=g) * 5
    score = MahalanobisScore.fit(feats, labels, shrinkage=0.1)
    # float32 buffers and a float32 [B, C, D] product: about 1e-6 relative on distances of order 1-100
    torch.testing.assert_close(
        score(queries).double(), reference_score(feats, labels, queries, 0.1), rtol=2e-5, atol=1e-4
    )


def test_far_points_score_higher_than_training_points() -> None:
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(500, 6, generator=g)
    labels = torch.randint(0, 2, (500,), generator=g)
    score = MahalanobisScore.fit(feats, labels)
    assert score(feats).median() < score(feats + 10.0).min()


def test_threshold_lets_the_asked_share_pass() -> None:
    scores = torch.arange(1, 101, dtype=torch.float32)  # 1..100
    t = threshold_at(scores, 0.95)
    assert (scores <= t).float().mean() == pytest.approx(0.95, abs=0.011)
    with pytest.raises(ValueError, match="pass_rate"):
        threshold_at(scores, 1.5)


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"means \[C, D\]"):
        MahalanobisScore(torch.zeros(3, 4), torch.eye(5))
    with pytest.raises(ValueError, match="temperature"):
        ServingModel.wrap(create_model("tiny-text"), 0.0, MahalanobisScore(torch.zeros(2, 32), torch.eye(32)))


def _fitted(model: torch.nn.Module, temperature: float) -> ServingModel:
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 257, (40, 50), generator=g)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        feats = pooled_features(model.eval(), {"input_ids": ids, "attention_mask": mask})
    return ServingModel.wrap(model, temperature, MahalanobisScore.fit(feats, torch.arange(40) % 2))


def test_serving_model_divides_logits_and_adds_the_score() -> None:
    model = create_model("tiny-text").eval()
    serving = _fitted(model, 2.0).eval()
    ids = torch.randint(1, 257, (3, 30))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        logits, score = serving(ids, mask)
        torch.testing.assert_close(logits, model(ids, mask) / 2.0, rtol=0, atol=0)
        feats = pooled_features(model, {"input_ids": ids, "attention_mask": mask})
        torch.testing.assert_close(score, serving.ood(feats), rtol=0, atol=0)
    assert score.shape == (3,) and bool((score >= 0).all())


@pytest.mark.parametrize("readout", [{}, {"pooling": "passages", "passage_bytes": 16}])
def test_serving_head_saves_loads_and_exports_with_parity(tmp_path, readout: dict) -> None:
    from lara_serve.model_export.models.registry import LABELS

    model = create_model("tiny-text", **readout).eval()
    serving = _fitted(model, 1.7)
    conf = ex.make_config_dict("tiny-text", model.cfg, LABELS["tiny-text"], seed=0, metrics={})
    ex.save_pretrained(model, conf, tmp_path)
    from safetensors.torch import load_file, save_file

    weights = tmp_path / "1" / "model.safetensors"
    save_file({**load_file(str(weights)), **serving.serving_state()}, str(weights))
    plain = load_pretrained(tmp_path)  # the trained model alone: old callers keep getting logits
    served = load_pretrained(tmp_path, serving=True)
    assert not isinstance(plain, ServingModel) and isinstance(served, ServingModel)
    section = ex.export_model_dir(tmp_path)
    assert section["output_names"] == ["logits", "ood_score"]
    assert all(r["ood_max_rel_diff"] <= ex.OOD_PARITY_RTOL for r in section["parity"]["cases"])
    session = ex.make_session(tmp_path / "1" / ex.ONNX_FILE)
    ids = torch.randint(1, 257, (2, 77))
    mask = torch.ones_like(ids)
    mask[1, 60:] = 0
    got = session.run(["logits", "ood_score"], {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    with torch.no_grad():
        want = served(ids, mask)
    torch.testing.assert_close(torch.from_numpy(got[0]), want[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.from_numpy(got[1]), want[1], rtol=1e-4, atol=1e-3)


def test_a_weights_file_with_part_of_the_head_is_refused(tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    from lara_serve.model_export.models.registry import LABELS

    model = create_model("tiny-text").eval()
    ex.save_pretrained(model, ex.make_config_dict("tiny-text", model.cfg, LABELS["tiny-text"], seed=0), tmp_path)
    weights = tmp_path / "1" / "model.safetensors"
    save_file({**load_file(str(weights)), "serving.temperature": torch.ones(1)}, str(weights))
    with pytest.raises(ValueError, match="serving head needs all of"):
        load_pretrained(tmp_path, serving=True)


def test_serving_sections_fit_on_train_threshold_on_holdout_and_only_measure_test() -> None:
    from lara_serve.model_export.head.finalize import PASS_RATE, holdout_temperature, serving_sections

    g = torch.Generator().manual_seed(3)

    def outputs(n: int, shift: float = 0.0):
        y = torch.randint(0, 3, (n,), generator=g)
        f = torch.randn(n, 6, generator=g) + 3.0 * torch.nn.functional.one_hot(y, 6).float() + shift
        z = 4.0 * f[:, :3] + torch.randn(n, 3, generator=g)  # overconfident logits, mostly right
        return z, f, y

    val, train, test = outputs(400), outputs(2000), outputs(300, shift=5.0)  # the test split is far away
    temperature, note = holdout_temperature(val[0], val[2])
    ood, calibration, section = serving_sections(val, train, test, temperature, "")
    passed = float((ood(val[1]) <= section["threshold"]).float().mean())
    assert passed == pytest.approx(PASS_RATE, abs=0.01) and note is None
    assert section["test_in_distribution_rate"] < 0.2  # measured on test, not fitted to it
    assert calibration["ece"]["holdout_after"] <= calibration["ece"]["holdout_before"]
    assert section["fitted_on"] == "training split (2000 items)"
    z = torch.tensor([[5.0, 0.0], [0.0, 5.0]])
    assert holdout_temperature(z, torch.tensor([0, 1]))[0] == 1.0  # no holdout error: T kept at 1
