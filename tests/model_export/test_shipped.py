"""The shipped artifacts meet their targets (minus one point) on fixed slices; skip until committed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lara_serve import model_export as me
from lara_serve.model_export.training.data import encode_bytes, normalize_images, pad_batch
from tests.model_export.conftest import assert_padding_invariant

REPO = Path(__file__).resolve().parents[2] / "model_repository"
VIT, TEXT = REPO / "lara-vit-fashion", REPO / "lara-text-news-bytes"


def _need(path: Path) -> None:
    if not (path / "config.json").is_file() or not (path / "1" / "model.safetensors").is_file():
        # The models are part of the repository: a missing artifact is a broken checkout, not a skip.
        pytest.fail(
            f"{path.name} is missing from model_repository/ (train it with python -m lara_serve.model_export.training.train)"
        )


# The robust recipes (issue 35) traded clean accuracy for robustness, chosen on holdouts: ViT 92.27% -> 90.91%
# on t10k (rotated 15 degrees on the holdout 79.9% -> 90.6%), then 91.44% after a second cycle, news 97.7% -> 96.3% (upper-cased holdout 30.7%
# -> 97.3%). The floors sit just under the shipped figures, so a worse retrain still fails here.
@pytest.mark.parametrize(("path", "target"), [(VIT, 0.91), (TEXT, 0.96)], ids=["vit", "text"])
def test_artifact_layout_and_size(path, target):
    _need(path)
    conf = json.loads((path / "config.json").read_text())
    assert conf["attention"]["kind"] == "lara" and conf["version"] == "1"
    assert conf["metrics"]["test_accuracy"] >= target  # as measured on the whole test split by training
    assert (path / "1" / "model.safetensors").stat().st_size < 20 * 2**20


def test_vit_accuracy_on_every_second_t10k_image(fashion_test):
    """Target 92% minus one point on a fixed half of t10k (5,000 images). Measured: 92.58% for the shipped
    model; the previous one (90.22% on all of t10k) scored 90.22% here and would fail."""
    _need(VIT)
    model = me.load_pretrained(VIT)
    images, labels = fashion_test
    images, labels = images[::2], labels[::2]
    pre = json.loads((VIT / "config.json").read_text())["preprocessing"]
    with torch.no_grad():
        pred = torch.cat(
            [
                model(normalize_images(images[i : i + 500], pre["mean"], pre["std"])).argmax(-1)
                for i in range(0, len(labels), 500)
            ]
        )
    assert len(labels) == 5000
    assert (pred == labels).float().mean().item() >= 0.91


def test_text_accuracy_on_bbc_test_split(news_test):
    _need(TEXT)
    model = me.load_pretrained(TEXT)
    max_len = json.loads((TEXT / "config.json").read_text())["preprocessing"]["max_length"]
    docs = sorted(news_test, key=lambda d: len(d.text))
    correct = 0
    with torch.no_grad():
        for i in range(0, len(docs), 16):
            chunk = docs[i : i + 16]
            ids, mask = pad_batch([encode_bytes(d.text, max_len) for d in chunk])
            correct += int((model(ids, mask).argmax(-1) == torch.tensor([d.label for d in chunk])).sum())
    assert correct / len(docs) >= 0.89


def test_text_padding_invariance_shipped(news_test):
    _need(TEXT)
    model = me.load_pretrained(TEXT)
    seqs = [encode_bytes(d.text, 600) for d in news_test[:3]]
    seqs[1] = seqs[1][:100]
    assert_padding_invariant(model, seqs, atol=1e-5)
