"""Small labelled data sets in every form `lara train` reads, and the served model's probabilities in torch,
shared by the `lara train` tests (test_usertrain*.py)."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lara_serve.model_export.models.hub import load_pretrained

TINY_TEXT = ["--arch", "tiny-text", "--init", "none", "--max-length", "1024", "--threads", "1", "--quiet"]
TINY_IMAGE = ["--arch", "tiny-vit", "--threads", "1", "--quiet", "--image-size", "12"]
VOCAB = {
    "sport": ["goal", "match", "team", "win", "score", "league", "coach"],
    "tech": ["chip", "software", "computer", "data", "cloud", "phone"],
    "money": ["bank", "market", "stock", "price", "profit", "trade"],
}


def text_rows(per_label: int = 16, seed: int = 0) -> list[tuple[str, str]]:
    """(text, label) rows, labels in turn, each text 8-80 words of its label's vocabulary and stop words."""
    rng = random.Random(seed)
    rows = []
    for i in range(per_label * len(VOCAB)):
        label = list(VOCAB)[i % len(VOCAB)]
        words = [rng.choice(VOCAB[label] + ["the", "a", "of"]) for _ in range(rng.randint(8, 80))]
        rows.append((" ".join(words), label))
    return rows


def write_texts(path: Path, per_label: int = 16, seed: int = 0) -> None:
    with path.open("w") as f:
        for text, label in text_rows(per_label, seed):
            f.write(json.dumps({"text": text, "label": label}) + "\n")


def write_text_form(path: Path, form: str, per_label: int = 16, seed: int = 0) -> None:
    """The rows of write_texts as a .csv / .tsv table (header "label,text": columns are found by name) or
    as a folder of .txt files, one subfolder per label."""
    rows = text_rows(per_label, seed)
    if form in ("csv", "tsv"):
        with path.open("w", newline="") as f:
            w = csv.writer(f, delimiter="," if form == "csv" else "\t")
            w.writerow(["label", "text"])
            w.writerows((label, text) for text, label in rows)
    elif form == "folder":
        for i, (text, label) in enumerate(rows):
            (path / label).mkdir(parents=True, exist_ok=True)
            (path / label / f"{i:03d}.txt").write_text(text)
    else:
        raise ValueError(f"form must be csv, tsv or folder, got {form!r}")


def write_images(root: Path, per_label: int = 12) -> None:
    """Two labels: the bright half is the left or the right one; RGB, two sizes (the model resizes)."""
    rng = np.random.default_rng(0)
    for label, side in (("left", 0), ("right", 1)):
        (root / label).mkdir(parents=True)
        for i in range(per_label):
            w, h = (16, 16) if i % 2 else (20, 14)
            x = rng.integers(0, 60, size=(h, w, 3), dtype=np.uint8)
            x[:, side * w // 2 : (side + 1) * w // 2] += 180
            Image.fromarray(x, mode="RGB").save(root / label / f"{i}.png")


def torch_probs(model_dir: Path, inputs: dict[str, torch.Tensor]) -> np.ndarray:
    """The served model in torch: (logits / temperature, ood_score) -> probabilities of the one item."""
    with torch.inference_mode():
        logits, _ = load_pretrained(model_dir, serving=True)(**inputs)
        return torch.softmax(logits, -1)[0].numpy()


def text_inputs(text: str) -> dict[str, torch.Tensor]:
    """A text as the server's byte preprocessing makes it (byte + 1, no padding)."""
    ids = torch.tensor([[b + 1 for b in text.encode()]])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
