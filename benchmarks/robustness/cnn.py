"""The image anchor: a small CNN trained on the same split with the ViT's augmentation, for a time budget.

Two 3x3 convolution blocks (32 and 64 channels, max-pooled) and a 128-unit hidden layer: what a practitioner
would try first on 28x28 images. It trains on the ViT's training split (train minus the seeded holdout) with
the same crop-and-flip augmentation (`lara_serve.model_export.training.tasks.ImageTask`) for `budget_s` seconds of wall time,
AdamW 2e-3 with cosine decay over the budget. When the ViT was trained with a photometric recipe
(config.json's training notes), the CNN gets the same recipe (`augment_image.ImagePhotometric`), so a
photometric case compares two models that saw the same kinds of change. The weights are cached under
runs/robustness/ by budget, seed and recipe, so a rerun of the suite does not retrain.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from benchmarks.robustness.runners import ROOT, Outputs
from benchmarks.robustness.stats import softmax

CACHE = ROOT / "runs" / "robustness"


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # [B, 32, 14, 14]
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # [B, 64, 7, 7]
            nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, num_classes),
        )  # fmt: skip

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.net(pixel_values)


class CnnAnchor:
    name = "small-cnn"

    def __init__(self, model: SmallCNN, mean: float, std: float, train_s: float, steps: int) -> None:
        self.model, self.mean, self.std, self.train_s, self.steps = model.eval(), mean, std, train_s, steps

    @classmethod
    def trained(
        cls, budget_s: float, mean: float, std: float, seed: int = 0, photometric: dict[str, Any] | None = None
    ) -> CnnAnchor:
        """photometric: ImagePhotometric settings to train with (None: geometric augmentation only)."""
        path = cache_path_for(budget_s, seed, photometric)
        model = SmallCNN()
        if path.is_file():
            state = torch.load(path, weights_only=True)
            model.load_state_dict(state["model"])
            return cls(model, mean, std, float(state["train_s"]), int(state["steps"]))
        train_s, steps = _train(model, budget_s, mean, std, seed, photometric)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.state_dict(), "train_s": train_s, "steps": steps}, path)
        return cls(model, mean, std, train_s, steps)

    @torch.inference_mode()
    def __call__(self, images: np.ndarray, batch_size: int = 512) -> Outputs:
        x = (torch.from_numpy(images).float()[:, None] / 255.0 - self.mean) / self.std  # [N, 1, 28, 28]
        logits = torch.cat([self.model(x[s : s + batch_size]) for s in range(0, len(x), batch_size)])
        return Outputs(softmax(logits.numpy()), None)


def _train(
    model: SmallCNN, budget_s: float, mean: float, std: float, seed: int, photometric: dict[str, Any] | None
) -> tuple[float, int]:
    from lara_serve.model_export.training.augment_image import ImagePhotometric
    from lara_serve.model_export.training.tasks import ImageTask, load_task

    torch.manual_seed(seed)
    task = load_task("fashion", "train", type("Cfg", (), {"mean": mean, "std": std})())
    assert isinstance(task, ImageTask)
    if photometric is not None:
        task.photometric = ImagePhotometric.from_json(json.dumps(photometric))
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    t0, steps = time.perf_counter(), 0
    while time.perf_counter() - t0 < budget_s:
        for inputs, y in task.train_batches(128, g):
            elapsed = time.perf_counter() - t0
            if elapsed >= budget_s:
                break
            for group in opt.param_groups:  # cosine over the time budget
                group["lr"] = 2e-3 * 0.5 * (1 + np.cos(np.pi * elapsed / budget_s))
            loss = loss_fn(model(inputs["pixel_values"]), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
    model.eval()
    return time.perf_counter() - t0, steps


def cache_path_for(budget_s: float, seed: int = 0, photometric: dict[str, Any] | None = None) -> Path:
    """Without a recipe: the name used before recipes existed (its cached weights stay valid)."""
    if photometric is None:
        return CACHE / f"cnn_{int(budget_s)}s_seed{seed}.pt"
    digest = hashlib.sha256(json.dumps(photometric, sort_keys=True).encode()).hexdigest()[:8]
    return CACHE / f"cnn_{int(budget_s)}s_seed{seed}_photometric-{digest}.pt"
