"""Evaluation reports: confusion matrix, per-class recall, largest confusions, the PNG."""

from __future__ import annotations

import json

import torch

from lara_serve.model_export.training import evaluate
from lara_serve.model_export.training.tasks import ImageTask

LABELS = ["a", "b", "c"]


class _Constant(torch.nn.Module):
    """Predicts a fixed class per example index (to build a known confusion matrix)."""

    def __init__(self, preds: list[int]) -> None:
        super().__init__()
        self.preds = torch.tensor(preds)
        self.seen = 0

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        p = self.preds[self.seen : self.seen + len(pixel_values)]
        self.seen += len(pixel_values)
        return torch.nn.functional.one_hot(p, 3).float()


def test_confusion_per_class_and_top_confusions(tmp_path):
    gold = [0, 0, 0, 1, 1, 2, 2, 2]
    pred = [0, 1, 1, 1, 1, 2, 0, 2]
    task = ImageTask(torch.zeros(8, 28, 28, dtype=torch.uint8), torch.tensor(gold), 0.0, 1.0, augment=False)
    res = evaluate.evaluate_task(_Constant(pred), task, batch_size=3)
    assert res["n"] == 8 and res["accuracy"] == 5 / 8
    assert res["confusion"] == [[1, 2, 0], [0, 2, 0], [1, 0, 2]]  # [true][predicted]
    assert evaluate.per_class(res["confusion"], LABELS) == {"a": round(1 / 3, 4), "b": 1.0, "c": round(2 / 3, 4)}
    assert evaluate.top_confusions(res["confusion"], LABELS, n=2) == [
        {"true": "a", "predicted": "b", "count": 2},
        {"true": "c", "predicted": "a", "count": 1},
    ]
    out = tmp_path / "confusion.png"
    evaluate.plot_confusion(res["confusion"], LABELS, "t", out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_evaluate_cli_on_the_shipped_vit(tmp_path, capsys, fashion_test):
    out = tmp_path / "c.png"
    evaluate.main(["--model", "lara-vit-fashion", "--limit", "200", "--threads", "1", "--plot", str(out)])
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["n"] == 200 and sum(map(sum, res["confusion"])) == 200
    assert set(res["per_class"]) == set(
        json.loads((evaluate.resolve_model_dir("lara-vit-fashion") / "config.json").read_text())["labels"]
    )
    assert out.is_file()
