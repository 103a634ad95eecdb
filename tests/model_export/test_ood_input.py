"""Input-space ood scores (lara_serve.model_export.models.ood_input) against float64 references from their definitions, their
padding and batch invariance, and the combined serving head saved, reloaded and exported with parity."""

from __future__ import annotations

import math

import pytest
import torch

from lara_serve.model_export import create_model
from lara_serve.model_export.export import exporter as ex
from lara_serve.model_export.models.hub import load_pretrained
from lara_serve.model_export.models.ood import MahalanobisScore, ServingModel, pooled_features
from lara_serve.model_export.models.ood_input import ByteBigramNLL, PixelNLL, image_input_scores, text_input_scores

DOCS = [b"the cat sat on the mat", b"The Dog ate the cat's dinner", b"a mat, a cat, a hat"]


def reference_bigram(docs: list[bytes], query: bytes, k: float, fold: bool) -> float:
    """Float64, from the definition: P(b | a) = (count(a, b) + k) / (count(a, .) + 257 k) over ids byte + 1."""

    def ids(d: bytes) -> list[int]:
        return [(c + 32 if fold and 65 <= c <= 90 else c) + 1 for c in d]

    counts: dict[tuple[int, int], int] = {}
    row: dict[int, int] = {}
    for d in docs:
        x = ids(d)
        for a, b in zip(x, x[1:], strict=False):
            counts[a, b] = counts.get((a, b), 0) + 1
            row[a] = row.get(a, 0) + 1
    q = ids(query)
    nll = [-math.log((counts.get((a, b), 0) + k) / (row.get(a, 0) + 257 * k)) for a, b in zip(q, q[1:], strict=False)]
    return sum(nll) / len(nll)


@pytest.mark.parametrize("fold", [True, False])
def test_bigram_score_matches_a_float64_reference(fold: bool) -> None:
    score = ByteBigramNLL.fit(DOCS, case_fold=fold, smoothing=0.1)
    for q in (b"the mat", b"THE MAT", b"zzqx!", DOCS[1]):
        got = float(score.score_raw([q])[0])
        assert got == pytest.approx(reference_bigram(DOCS, q, 0.1, fold), rel=1e-5)  # float32 table, ~1e-7
    upper, lower = (float(score.score_raw([q])[0]) for q in (b"THE MAT", b"the mat"))
    assert (upper == lower) == fold  # folded as the encoder folds, or case kept


def test_bigram_score_ignores_padding_and_batch_company() -> None:
    score = ByteBigramNLL.fit(DOCS, case_fold=True)
    alone = score.score_raw([b"the cat", b"a hat on a mat", b"a"])
    ids = torch.zeros(3, 20, dtype=torch.long)
    mask = torch.zeros(3, 20, dtype=torch.long)
    for i, d in enumerate([b"the cat", b"a hat on a mat", b"a"]):
        start = 20 - len(d) if i == 1 else 0  # left padding for one of them
        ids[i, start : start + len(d)] = torch.tensor(list(d)) + 1
        ids[i, start + len(d) :] = 99  # garbage under the mask must not count
        mask[i, start : start + len(d)] = 1
    torch.testing.assert_close(score(ids, mask), alone, rtol=0, atol=0)
    assert float(alone[2]) == float(score.table.max())  # one byte: no pair, the most surprising value


def test_pixel_score_matches_a_float64_reference() -> None:
    g = torch.Generator().manual_seed(0)
    train = torch.randn(500, 1, 4, 4, generator=g, dtype=torch.float64) * torch.linspace(0.1, 2, 16).reshape(1, 1, 4, 4)
    score = PixelNLL.fit([train[:200], train[200:]], floor=0.05)
    mu, var = train.mean(0), train.var(0, unbiased=False)
    var = var + 0.05 * var.mean()
    q = torch.randn(3, 1, 4, 4, generator=g, dtype=torch.float64)
    want = (((q - mu) ** 2 / var + var.log()).flatten(1)).mean(1)
    torch.testing.assert_close(score(q.float()).double(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="no training images"):
        PixelNLL.fit([])


def test_far_inputs_score_higher_than_near_ones() -> None:
    score, s_val, s_test = text_input_scores(DOCS * 5, [b"the cat sat"], [bytes(range(200, 256)) * 3], True)
    assert float(s_test[0]) > float(s_val[0]) + 1.0

    class Task:
        def __init__(self, x: torch.Tensor) -> None:
            self.x = x

        def eval_batches(self, n: int):
            for i in range(0, len(self.x), n):
                yield {"pixel_values": self.x[i : i + n]}, None

    g = torch.Generator().manual_seed(1)
    clean = torch.randn(300, 1, 6, 6, generator=g) * 0.1
    _, near, far = image_input_scores(Task(clean), Task(clean[:10]), Task(-clean[:10] + 3.0))
    assert float(far.min()) > float(near.max())


def _serving(model: torch.nn.Module) -> ServingModel:
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 257, (40, 50), generator=g)
    with torch.no_grad():
        feats = pooled_features(model.eval(), {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    bigram = ByteBigramNLL.fit(DOCS * 3, case_fold=bool(getattr(model.cfg, "case_fold", False)))
    return ServingModel.wrap(model, 1.5, MahalanobisScore.fit(feats, torch.arange(40) % 2), bigram, (50.0, 4.0, 3.0))


def test_the_served_score_is_the_larger_scaled_score() -> None:
    model = create_model("tiny-text").eval()
    serving = _serving(model)
    ids = torch.randint(1, 257, (3, 30))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        _, score = serving(ids, mask)
        feats = pooled_features(model, {"input_ids": ids, "attention_mask": mask})
        want = serving.ood(feats) / 50.0 + torch.relu(serving.input_score(ids, mask) - 4.0)  # spread 4 - 3 = 1
    torch.testing.assert_close(score, want, rtol=1e-6, atol=1e-6)
    for bad in (None, (50.0, 3.0, 4.0), (0.0, 4.0, 3.0)):
        with pytest.raises(ValueError, match="needs scales"):
            ServingModel.wrap(model, 1.0, serving.ood, serving.input_score, bad)


def test_combined_head_saves_loads_and_exports_with_parity(tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    from lara_serve.model_export.models.registry import LABELS

    model = create_model("tiny-text").eval()
    serving = _serving(model)
    ex.save_pretrained(model, ex.make_config_dict("tiny-text", model.cfg, LABELS["tiny-text"], seed=0, metrics={}),
                       tmp_path)  # fmt: skip
    weights = tmp_path / "1" / "model.safetensors"
    save_file({**load_file(str(weights)), **serving.serving_state()}, str(weights))
    served = load_pretrained(tmp_path, serving=True)
    assert isinstance(served.input_score, ByteBigramNLL) and served.ood_scales.tolist() == [50.0, 4.0, 3.0]
    assert not isinstance(load_pretrained(tmp_path), ServingModel)
    section = ex.export_model_dir(tmp_path)
    assert all(r["ood_max_rel_diff"] <= ex.OOD_PARITY_RTOL for r in section["parity"]["cases"])
    session = ex.make_session(tmp_path / "1" / ex.ONNX_FILE)
    ids = torch.randint(1, 257, (2, 77))
    mask = torch.ones_like(ids)
    mask[1, 60:] = 0
    got = session.run(["ood_score"], {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    with torch.no_grad():
        want = served(ids, mask)[1]
    torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-4, atol=1e-4)
    # a head saved without the input score (models finalized before it existed) still loads, feature-only
    state = {k: v for k, v in load_file(str(weights)).items() if k not in ("serving.ood_bigram", "serving.ood_scales")}
    save_file(state, str(weights))
    old = load_pretrained(tmp_path, serving=True)
    assert old.input_score is None and old.ood_scales is None


def test_serving_sections_set_the_threshold_on_the_combination() -> None:
    from lara_serve.model_export.head.finalize import PASS_RATE, serving_sections

    g = torch.Generator().manual_seed(3)

    def outputs(n: int):
        y = torch.randint(0, 3, (n,), generator=g)
        f = torch.randn(n, 6, generator=g) + 3.0 * torch.nn.functional.one_hot(y, 6).float()
        return 4.0 * f[:, :3], f, y

    val, train, test = outputs(400), outputs(1000), outputs(300)
    s_val, s_test = torch.rand(400, generator=g) + 2.0, torch.rand(300, generator=g) + 2.5  # test shifted
    ood, _, section = serving_sections(val, train, test, 1.0, "", None, (s_val, s_test))
    q_m, q_s, med_s = section["scales"]
    assert med_s == pytest.approx(float(s_val.median())) and q_s > med_s
    combined = ood(val[1]) / q_m + torch.relu((s_val - q_s) / (q_s - med_s))
    assert float((combined <= section["threshold"]).float().mean()) == pytest.approx(PASS_RATE, abs=0.01)
    assert section["test_pass_rate_by_component"]["input"] < 0.7  # the shifted input score, measured on test
    assert section["method"].startswith("mahalanobis / scales[0] + max(0,")
