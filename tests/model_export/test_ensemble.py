"""lara_serve.model_export.training.ensemble.ProbabilityMean against a float64 reference, and research.news_ensemble end to
end on two tiny cross-validation fold models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from lara_serve.model_export.training.ensemble import ProbabilityMean
from research import news_ensemble, news_kfold


class Fixed(nn.Module):
    """A 'classifier' that returns the logits it was built with, whatever the input."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.logits


def reference(logits: list[np.ndarray]) -> np.ndarray:
    """log of the mean of the members' softmax probabilities, in float64."""
    probs = []
    for z in logits:
        z = z.astype(np.float64)
        e = np.exp(z - z.max(-1, keepdims=True))
        probs.append(e / e.sum(-1, keepdims=True))
    return np.log(np.mean(probs, axis=0))


def test_matches_float64_reference_and_never_underflows() -> None:
    gen = torch.Generator().manual_seed(0)
    members = [torch.randn(6, 5, generator=gen) * s for s in (1.0, 4.0, 10.0)]
    members[2][0] = torch.tensor([300.0, -300.0, 0.0, 0.0, 0.0])  # a confident member: softmax underflows to 0
    ids = torch.zeros(6, 8, dtype=torch.long)
    out = ProbabilityMean([Fixed(z) for z in members])(ids, torch.ones_like(ids))
    ref = reference([z.numpy() for z in members])
    assert torch.isfinite(out).all()  # the log-sum-exp keeps classes that one member rules out finite
    # float32 log-softmax and log-sum-exp of values up to a few hundred: relative error ~1e-7, so 1e-5
    # absolute on log-probabilities of order 1-300 is tight; the reference itself is float64.
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6, atol=1e-5)
    # the output is a proper log-distribution: its softmax is the members' mean probability
    np.testing.assert_allclose(torch.softmax(out, -1).sum(-1).numpy(), 1.0, atol=1e-6)


def test_an_ensemble_of_one_model_twice_is_that_model() -> None:
    z = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    ids = torch.zeros(4, 2, dtype=torch.long)
    out = ProbabilityMean([Fixed(z), Fixed(z)])(ids, ids)
    torch.testing.assert_close(out, torch.log_softmax(z, -1), rtol=0, atol=1e-6)


def test_fewer_than_two_members_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 2 members"):
        ProbabilityMean([Fixed(torch.zeros(1, 2))])


def test_news_ensemble_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (news_kfold, news_ensemble):
        monkeypatch.setattr(module, "RUNS_ROOT", tmp_path / "runs")
        monkeypatch.setattr(module, "RESULTS_DIR", tmp_path)
    base = ["--folds", "3", "--budget", "0.01", "--score-limit", "12"]
    news_kfold.main(base)
    news_kfold.main([*base, "--seed", "2", "--name", "s2"])
    members = ["0.01min", "0.01min-s2"]
    with pytest.raises(SystemExit, match=r"no rows for folds \[4\]"):  # fold 4 was never run
        news_ensemble.main(["--members", *members, "--folds", "4", "--name", "pair"])
    with pytest.raises(SystemExit, match="news_kfold --folds 4"):  # no model: the message says how to train it
        news_ensemble.member_dir("0.01min", 4)
    news_ensemble.main(
        ["--members", *members, "--folds", "3", "--name", "pair", "--score-limit", "12"]
        + ["--against", str(tmp_path / "news_kfold_0.01min.json")]
    )
    result = json.loads((tmp_path / "news_ensemble_pair.json").read_text())
    (row,) = result["rows"]
    assert row["fold"] == 3 and row["n_test"] == 12 and result["members"] == members

    # the ensemble's whole-document verdicts, recomputed from the two fold models in float64
    from lara_serve.model_export.training.tasks import fold_split, text_docs

    dirs = [str(tmp_path / "runs" / f"news-kfold-{tag}" / "fold-3") for tag in members]
    texts, labels = text_docs("news", fold_split(3, 5, "test"))
    votes = reference_votes(dirs, texts[:12])
    assert row["right"]["full"] == "".join("1" if v == y else "0" for v, y in zip(votes, labels[:12], strict=True))

    # each member alone, on the same documents, is the member's own news_kfold result
    for tag in members:
        own = json.loads((tmp_path / f"news_kfold_{tag}.json").read_text())["summary"]["truncation"]
        assert result["summary"]["parts"][tag]["truncation"] == own
    assert result["summary"]["against"]["documents"] == 12
    assert (tmp_path / "news_ensemble_pair.png").stat().st_size > 1000

    # the same two models as "final fits" on the holdout: the ensemble and each member alone
    news_ensemble.main(["--final", *dirs, "--split", "val", "--per-class", "1", "--score-limit", "6", "--name", "pair"])
    final = json.loads((tmp_path / "news_ensemble_pair_final_val.json").read_text())
    assert final["members"] == dirs and sorted(final["alone"]) == sorted(dirs)
    ens = final["ensemble"]
    assert ens["split"] == "val" and ens["n_val"] == 6 and set(ens["composites"]) == {"8192", "16384", "32768", "65536"}
    texts, labels = text_docs("news", "val")
    assert ens["truncation"]["full"] == np.mean(reference_votes(dirs, texts[:6]) == np.array(labels[:6]))
    with pytest.raises(SystemExit):  # one directory is not an ensemble
        news_ensemble.main(["--final", dirs[0], "--name", "pair"])


def reference_votes(dirs: list[str], texts: list[str]) -> np.ndarray:
    """The class an ensemble of the models in `dirs` should pick for each whole text (float64 mean)."""
    from lara_serve.model_export.models.hub import load_pretrained

    logits = []
    for d in dirs:
        model = load_pretrained(d).eval()
        with torch.no_grad():
            logits.append(np.stack([model(*encode(t)).numpy()[0] for t in texts]))
    return reference(logits).argmax(-1)


def encode(text: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One document as the text models read it: UTF-8 bytes + 1, no padding."""
    ids = torch.tensor([[b + 1 for b in text.encode("utf-8")]], dtype=torch.long)
    return ids, torch.ones_like(ids)


def test_member_without_a_results_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(news_ensemble, "RESULTS_DIR", tmp_path)
    with pytest.raises(SystemExit, match="no results file"):
        news_ensemble.member_rows("9ep-nothing", [0])
    with pytest.raises(SystemExit):
        news_ensemble.main(["--members", "a", "a", "--name", "x"])  # one experiment twice is not an ensemble
