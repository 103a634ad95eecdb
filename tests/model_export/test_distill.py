"""The distillation teacher (lara_serve.model_export.training.distill) and `train --distill`: cross-fitting keeps each
document away from the teacher that scores it, windows get probabilities over every class, the soft loss
matches its float64 definition, and the training CLI records the teacher and refuses what it cannot do."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from lara_serve.model_export.training import train
from lara_serve.model_export.training.distill import fit_teacher, heads_too, soft_cross_entropy
from lara_serve.model_export.training.long_docs import LengthMixTask

WORDS = {0: ["goal", "match", "coach", "league"], 1: ["shares", "profit", "market", "bank"]}


def _corpus(n_per_class: int = 20) -> tuple[list[bytes], list[int]]:
    """Two-topic documents; each starts with a word of its own (`uniqN`) and repeats it at its end."""
    rng = random.Random(0)
    docs, labels = [], []
    for y, words in WORDS.items():
        for _ in range(n_per_class):
            tag = f"uniq{len(docs)}"
            body = " ".join(rng.choice(words + ["the", "a", "of"]) for _ in range(300))
            docs.append(f"{tag} {body} {tag}".encode())
            labels.append(y)
    return docs, labels


def test_cross_fitting_keeps_each_document_from_its_own_teacher() -> None:
    docs, labels = _corpus()
    teacher = fit_teacher(docs, labels, num_classes=2, parts=4, seed=3)
    assert sorted(set(teacher.part_of)) == [0, 1, 2, 3]
    for k, clf in enumerate(teacher.teachers):
        vocab = clf.named_steps["tfidfvectorizer"].vocabulary_
        # a document's own word is in the vocabulary of exactly the teachers that were fit on it (its
        # head copy makes min_df=2 hold), i.e. every teacher but the one of its own part
        for i, part in enumerate(teacher.part_of):
            assert (f"uniq{i}" in vocab) == (part != k), (i, part, k)


def test_window_probabilities_cover_every_class_and_favour_the_topic() -> None:
    docs, labels = _corpus()
    teacher = fit_teacher(docs, labels, num_classes=3, parts=2)  # class 2 is never seen: its column stays 0
    idx = list(range(len(docs)))
    probs = teacher([d[:200] for d in docs], idx)
    assert probs.shape == (len(docs), 3) and probs.dtype == torch.float32
    assert torch.allclose(probs.sum(-1), torch.ones(len(docs)), atol=1e-6) and (probs[:, 2] == 0).all()
    assert (probs.argmax(-1) == torch.tensor(labels)).all()
    # each window went to the teacher of its document's part
    for i in (0, len(docs) - 1):
        clf = teacher.teachers[teacher.part_of[i]]
        expected = clf.predict_proba([docs[i][:200].decode()])[0]
        assert probs[i, :2].double().numpy() == pytest.approx(expected, abs=1e-6)


def test_heads_too_adds_utf8_safe_heads() -> None:
    texts, ys = heads_too(["é" * 10, "ab"], [0, 1], (3,))
    assert texts == ["é" * 10, "ab", "é", "ab"] and ys == [0, 1, 0, 1]


def test_soft_cross_entropy_matches_float64_definition() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 5, generator=g)
    targets = torch.softmax(torch.randn(6, 5, generator=g), -1)
    ref = -(targets.double() * torch.log_softmax(logits.double(), -1)).sum(-1).mean()
    # float32 log-softmax of O(1) logits: about 1e-7 relative; 1e-6 leaves room for summation order
    assert soft_cross_entropy(logits, targets).item() == pytest.approx(ref.item(), rel=1e-6)
    one_hot = torch.nn.functional.one_hot(torch.arange(6) % 5, 5).float()
    hard = torch.nn.functional.cross_entropy(logits, torch.arange(6) % 5)
    assert soft_cross_entropy(logits, one_hot).item() == pytest.approx(hard.item(), rel=1e-6)


def test_length_mix_yields_teacher_targets_for_its_windows() -> None:
    docs, labels = _corpus(6)
    seen: list[tuple[list[bytes], list[int]]] = []

    def teacher(raws, idx):
        seen.append((list(raws), list(idx)))
        return torch.full((len(raws), 2), 0.5)

    task = LengthMixTask(docs, torch.tensor(labels), 4096, min_length=64, max_length=512, teacher=teacher)
    plain = LengthMixTask(docs, torch.tensor(labels), 4096, min_length=64, max_length=512)
    with_t = list(task.train_batches(0, torch.Generator().manual_seed(1)))
    without = list(plain.train_batches(0, torch.Generator().manual_seed(1)))
    assert len(with_t) == len(without) == len(seen)
    for (inp, y, soft), (inp0, y0), (raws, idx) in zip(with_t, without, seen, strict=True):
        # the teacher changes nothing about the batches, and sees each window with its own document
        assert torch.equal(inp["input_ids"], inp0["input_ids"]) and torch.equal(y, y0)
        assert soft.shape == (len(y), 2)
        assert all(raw in docs[i] for raw, i in zip(raws, idx, strict=True))
        assert [labels[i] for i in idx] == y.tolist()


def test_train_with_distill_records_the_teacher(tmp_path: Path) -> None:
    out = tmp_path / "m"
    argv = [
        "--model",
        "lara-text-news-bytes",
        "--length-mix",
        '{"head_prob": 0.5}',
        "--distill",
        "0.5",
        "--limit",
        "60",
    ]
    argv += ["--max-steps", "2", "--epochs", "1", "--eval-limit", "10", "--no-test", "--threads", "1"]
    train.main([*argv, "--out", str(out), "--run-dir", str(tmp_path / "ckpt")])
    conf = json.loads((out / "config.json").read_text())
    assert conf["training"]["distill"]["weight"] == 0.5
    assert "cross-fitted over 5" in conf["training"]["distill"]["teacher"]
    assert "--distill 0.5" in conf["training"]["command"]
    assert conf["metrics"]["steps"] == 2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--length-mix", "--distill", "0"], "weight in (0, 1]"),
        (["--length-mix", "--distill", "1.5"], "weight in (0, 1]"),
        (["--distill", "0.5"], "needs a text model trained with --length-mix"),
    ],
)
def test_distill_refusals(tmp_path: Path, extra: list[str], message: str) -> None:
    argv = ["--model", "lara-text-news-bytes", *extra, "--limit", "20", "--max-steps", "1", "--no-test"]
    with pytest.raises(SystemExit, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        train.main([*argv, "--out", str(tmp_path / "m"), "--run-dir", str(tmp_path / "ck")])
