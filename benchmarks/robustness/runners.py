"""What the suite runs: a shipped model through onnxruntime (as the server does), and its anchor.

Every runner maps a batch of inputs to `Outputs`: class probabilities [N, C] and, where the model's graph
has it, `ood_score` [N] (higher = less like the training data). Today's graphs have `logits` only; after
`lara_serve.model_export.head.finalize` they also have `ood_score`, and their logits are already divided by the
calibration temperature, so softmax(logits) is the served probability either way.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.robustness.stats import softmax
from lara_serve.model_export.export.exporter import make_session
from lara_serve.model_export.training.long_docs import length_groups

ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = ROOT / "model_repository"


@dataclass
class Outputs:
    probs: np.ndarray  # [N, C] float64
    ood: np.ndarray | None  # [N] or None when the graph has no ood_score

    @property
    def pred(self) -> np.ndarray:
        return self.probs.argmax(axis=1)


def load_config(name: str) -> dict[str, Any]:
    return json.loads((REPOSITORY / name / "config.json").read_text())


class OnnxModel:
    """A shipped model's 1/model.onnx in an onnxruntime CPU session."""

    def __init__(self, name: str, threads: int = 1) -> None:
        self.name = name
        self.config = load_config(name)
        self.session = make_session(REPOSITORY / name / "1" / "model.onnx", threads=threads)
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.has_ood = "ood_score" in self.outputs
        self.threshold = float(self.config["ood"]["threshold"]) if self.has_ood and "ood" in self.config else None

    def _run(self, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
        out = dict(zip(self.outputs, self.session.run(None, feeds), strict=True))
        return out["logits"], out.get("ood_score")

    def _collect(self, n: int, batches: Any) -> Outputs:
        probs: np.ndarray | None = None
        ood = np.zeros(n) if self.has_ood else None
        for idx, (logits, score) in batches:
            if probs is None:
                probs = np.zeros((n, logits.shape[1]))
            probs[idx] = softmax(logits)
            if ood is not None:
                ood[idx] = score
        assert probs is not None, "no inputs"
        return Outputs(probs, ood)


class OnnxText(OnnxModel):
    """Byte documents -> Outputs; head-truncated at the model's max_length (the server's default), batched by
    length so padding stays small."""

    @property
    def max_length(self) -> int:
        return int(self.config["preprocessing"]["max_length"])

    def __call__(self, raws: Sequence[bytes], batch_size: int = 16) -> Outputs:
        from lara_serve.server.repository import read_config

        if read_config(REPOSITORY / self.name).rows_alone:
            batch_size = 1  # activations quantized per call: each row alone, as the server runs it
        if self.config["preprocessing"]["kind"] == "wordpiece":
            seqs = self._word_pieces(raws)
        else:  # bytes + 1, head-truncated; an empty document has no tokens: one space
            seqs = [np.frombuffer(r[: self.max_length] or b" ", dtype=np.uint8).astype(np.int64) + 1 for r in raws]

        def batches() -> Any:
            for idx in length_groups(seqs, batch_size):
                n = max(len(seqs[i]) for i in idx)
                ids = np.zeros((len(idx), n), dtype=np.int64)
                mask = np.zeros((len(idx), n), dtype=np.int64)
                for row, i in enumerate(idx):
                    ids[row, : len(seqs[i])] = seqs[i]
                    mask[row, : len(seqs[i])] = 1
                yield idx, self._run({"input_ids": ids, "attention_mask": mask})

        return self._collect(len(raws), batches())

    def _word_pieces(self, raws: Sequence[bytes]) -> list[np.ndarray]:
        """A word-piece model reads what the server gives it (server.preprocess.text_item, head-truncated);
        bytes that are not UTF-8 are replaced first, and a text without pieces is [CLS] [SEP]."""
        from lara_serve.server.errors import ServeError
        from lara_serve.server.preprocess import IDS, text_item, wordpiece_tokenizer
        from lara_serve.server.repository import read_config

        prep = read_config(REPOSITORY / self.name).preprocessing
        tok = wordpiece_tokenizer(prep.tokenizer)
        seqs = []
        for raw in raws:
            try:
                seqs.append(text_item(raw.decode("utf-8", "replace").encode(), prep, "head").arrays[IDS])
            except ServeError:  # empty, or only spaces and control characters
                seqs.append(np.array([tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")], dtype=np.int64))
        return seqs


class OnnxImage(OnnxModel):
    """uint8 images [N, 28, 28] -> Outputs, normalised with config.json's preprocessing mean/std."""

    def __call__(self, images: np.ndarray, batch_size: int = 256) -> Outputs:
        pre = self.config["preprocessing"]
        x = ((images.astype(np.float32) / 255.0 - pre["mean"]) / pre["std"])[:, None]  # [N, 1, 28, 28]

        def batches() -> Any:
            for s in range(0, len(x), batch_size):
                yield slice(s, s + batch_size), self._run({"pixel_values": np.ascontiguousarray(x[s : s + batch_size])})

        return self._collect(len(x), batches())


class TfidfAnchor:
    """TF-IDF word 1-2-grams + logistic regression (lara_serve.model_export.training.distill.tfidf_classifier) fit on the same
    training split as the model; it reads the same (truncated) bytes, decoded as UTF-8."""

    name = "tfidf-logreg"

    def __init__(self, texts: Sequence[str], labels: Sequence[int], num_classes: int) -> None:
        from lara_serve.model_export.training.distill import tfidf_classifier

        t0 = time.perf_counter()
        self.clf = tfidf_classifier().fit(list(texts), list(labels))
        self.fit_s = time.perf_counter() - t0
        self.num_classes = num_classes

    def __call__(self, raws: Sequence[bytes], max_length: int) -> Outputs:
        probs = np.zeros((len(raws), self.num_classes))
        p = self.clf.predict_proba([r[:max_length].decode("utf-8", errors="ignore") for r in raws])
        probs[:, self.clf.classes_] = p
        return Outputs(probs, None)


def ood_row(m: Outputs, a: Outputs, clean_m: Outputs, clean_a: Outputs, threshold: float | None) -> dict[str, Any]:
    """One out-of-domain set's figures: AUROC of 1 - top probability (model and anchor) against the clean
    test items, mean top probabilities, and, for a graph with ood_score, its AUROC and the share flagged out."""
    from benchmarks.robustness import stats

    row: dict[str, Any] = {
        "n": len(m.probs),
        "model_auroc_msp": stats.auroc(1 - clean_m.probs.max(1), 1 - m.probs.max(1)),
        "anchor_auroc_msp": stats.auroc(1 - clean_a.probs.max(1), 1 - a.probs.max(1)),
        "model_mean_top_prob": round(float(m.probs.max(1).mean()), 4),
        "anchor_mean_top_prob": round(float(a.probs.max(1).mean()), 4),
    }
    if m.ood is not None and clean_m.ood is not None:
        row["model_auroc_ood"] = stats.auroc(clean_m.ood, m.ood)
        if threshold is not None:
            row["flagged_out"] = stats.wilson(int((m.ood > threshold).sum()), len(m.probs))
    return row


def calibration_row(clean_m: Outputs, clean_a: Outputs, y: np.ndarray, threshold: float | None) -> dict[str, Any]:
    """Calibration on the clean test items: ECE and reliability bins of the model and the anchor, and, for a
    graph with ood_score, the share of them the threshold keeps in distribution."""
    from benchmarks.robustness import stats
    from lara_serve.model_export.head.calibration import calibration_bins

    row: dict[str, Any] = {
        "model_ece": stats.ece(clean_m.probs, y),
        "anchor_ece": stats.ece(clean_a.probs, y),
        "model_bins": calibration_bins(clean_m.probs, y),
        "anchor_bins": calibration_bins(clean_a.probs, y),
    }
    if clean_m.ood is not None and threshold is not None:
        row["test_in_distribution"] = stats.wilson(int((clean_m.ood <= threshold).sum()), len(y))
    return row
