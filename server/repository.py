"""The model repository contract: `<repo>/<name>/config.json` and `<repo>/<name>/<version>/` artifacts.

`config.json` is written by model_export; it is validated here once, at start-up, so a bad repository
is refused before the server reports ready.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ONNX_FILE = "model.onnx"
TORCH_FILE = "model.safetensors"
OOD_OUTPUT = "ood_score"  # optional second output: [batch] FP32, higher = less like the training data


class TensorSpec(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    datatype: str
    shape: list[int]


class TextPreprocessing(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    kind: Literal["bytes"]
    max_length: int = Field(gt=0)
    pad_id: int = 0
    byte_offset: int = 1


class ImagePreprocessing(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    kind: Literal["image"]
    height: int = Field(gt=0)
    width: int = Field(gt=0)
    channels: Literal[1, 3] = 1  # 1: grayscale (L), 3: RGB
    mean: float = 0.0
    std: float = Field(1.0, gt=0.0)


class ModelConfig(BaseModel):
    """The part of config.json the server needs; the rest (architecture, metrics) is passed through."""

    model_config = ConfigDict(extra="allow", frozen=True, protected_namespaces=())

    name: str
    version: str = "1"
    task: Literal["text", "image"]
    labels: list[str] = Field(min_length=1)
    inputs: list[TensorSpec] = Field(min_length=1)
    outputs: list[TensorSpec] = Field(min_length=1)
    preprocessing: Annotated[TextPreprocessing | ImagePreprocessing, Field(discriminator="kind")]

    @property
    def vocab_size(self) -> int:
        """Largest token id + 1 the embedding accepts (the architecture config may state it)."""
        arch = getattr(self, "model", None)
        if isinstance(arch, dict) and isinstance(arch.get("vocab_size"), int):
            return int(arch["vocab_size"])
        assert isinstance(self.preprocessing, TextPreprocessing)
        return 256 + self.preprocessing.byte_offset

    @property
    def has_ood_output(self) -> bool:
        return any(spec.name == OOD_OUTPUT for spec in self.outputs)

    @property
    def ood_threshold(self) -> float | None:
        """config.json's ood.threshold: an item is in distribution when its ood_score <= threshold."""
        ood = (self.model_extra or {}).get("ood")
        return float(ood["threshold"]) if isinstance(ood, dict) and "threshold" in ood else None


class RepositoryError(RuntimeError):
    """The repository is unusable; raised at start-up."""


def read_config(model_dir: Path) -> ModelConfig:
    path = model_dir / "config.json"
    try:
        config = ModelConfig.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError, ValidationError) as exc:
        raise RepositoryError(f"{path}: unusable model config: {exc}") from exc
    expected = {"text": "bytes", "image": "image"}[config.task]
    if config.preprocessing.kind != expected:
        raise RepositoryError(f"{path}: task {config.task!r} needs preprocessing kind {expected!r}")
    _check_ood(path, config)
    return config


def _check_ood(path: Path, config: ModelConfig) -> None:
    """An `ood` section needs a finite threshold and an ood_score output to compare it with."""
    ood = (config.model_extra or {}).get("ood")
    if ood is None:
        return
    threshold = ood.get("threshold") if isinstance(ood, dict) else None
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not math.isfinite(threshold):
        raise RepositoryError(f"{path}: ood.threshold must be a finite number, got {threshold!r}")
    if not config.has_ood_output:
        raise RepositoryError(
            f"{path}: ood.threshold is set but outputs {[s.name for s in config.outputs]} have no {OOD_OUTPUT!r}"
        )


def discover(repository: Path, names: list[str] | None = None) -> dict[str, Path]:
    """Model name -> model folder, for every folder holding a config.json (or only `names`)."""
    found = {p.parent.name: p.parent for p in sorted(repository.glob("*/config.json"))}
    if names:
        missing = [n for n in names if n not in found]
        if missing:
            raise RepositoryError(f"models {missing} not in {repository} (it has {sorted(found)})")
        found = {n: found[n] for n in names}
    if not found:
        raise RepositoryError(f"no model (folder with config.json) in {repository}")
    return found
