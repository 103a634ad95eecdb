"""The wide path of the text model (TfidfHead): hashed word 1-2-gram tf-idf logits against a float64
Python reference, idf fitting, padding/batch invariance, export round trip, training fits idf, bad settings."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

from lara_serve.model_export import create_model, load_pretrained
from lara_serve.model_export.models.registry import get_config
from lara_serve.model_export.models.text import _BIGRAM_MUL, _BIGRAM_SALT, TFIDF_GAIN, TfidfHead
from lara_serve.model_export.models.text_embeddings import _BASE, _WORD_MOD, WORD_MAX_BYTES
from lara_serve.model_export.training import train
from lara_serve.model_export.training.tasks import document_ids, load_task
from research import news_kfold
from tests.model_export.conftest import export_round_trip

BUCKETS = 1009


def reference_grams(text: bytes, buckets: int = BUCKETS) -> list[int]:
    """Buckets of a document's word unigrams then bigrams, from Python integers and a regex."""
    hashes = []
    for word in re.findall(rb"[A-Za-z0-9]+", text):
        tail = word[-WORD_MAX_BYTES:].lower()  # a long word is hashed by its last 16 bytes
        hashes.append(sum((b + 1) * _BASE**back for back, b in enumerate(reversed(tail))) % _WORD_MOD)
    bigrams = [(p * _BIGRAM_MUL + h + _BIGRAM_SALT) % _WORD_MOD for p, h in zip(hashes, hashes[1:], strict=False)]
    return [h % buckets for h in hashes] + [c % buckets for c in bigrams]


def reference_idf(docs: list[bytes], buckets: int = BUCKETS) -> list[float]:
    df = Counter(g for d in docs for g in set(reference_grams(d, buckets)))
    n = len(docs)
    return [math.log((1 + n) / (1 + df[b])) + 1 if df[b] >= 2 else 0.0 for b in range(buckets)]


def reference_logits(head: TfidfHead, text: bytes, idf: list[float]) -> torch.Tensor:
    """Float64: sublinear tf x idf over distinct grams, L2-normalized, times the weight rows, times the gain."""
    x = {b: (1 + math.log(c)) * idf[b] for b, c in Counter(reference_grams(text)).items()}
    norm = math.sqrt(sum(v * v for v in x.values())) or 1.0
    w = head.weight.detach().double()
    out = torch.zeros(w.shape[1], dtype=torch.float64)
    for b, v in x.items():
        out += (v / norm) * w[b]
    return TFIDF_GAIN * out


CORPUS = [
    b"Honda's profits rose; Honda shares rose 2% in Tokyo. Profits, profits!",
    b"The film won awards. The FILM's star won again",
    b"Shares in Tokyo fell as profits fell",
    b"antidisestablishmentarianism and antidisestablishmentarianism again, the film again",
    b"",
    b"!!! ??? ...",
]


def ids_of(text: bytes) -> torch.Tensor:
    return torch.tensor([b + 1 for b in text], dtype=torch.int64)


@pytest.fixture
def head() -> TfidfHead:
    torch.manual_seed(0)
    h = TfidfHead(BUCKETS, 5)
    h.fit_idf(ids_of(d) for d in CORPUS)
    with torch.no_grad():
        h.weight.normal_()
    return h


def test_grams_and_idf_match_a_python_reference(head: TfidfHead) -> None:
    for text in CORPUS:
        bucket, real = head.grams(ids_of(text)[None])
        assert bucket[real].tolist() == reference_grams(text)
    # ln and a division in float32 against float64: about 1e-7 relative
    torch.testing.assert_close(
        head.idf.double(), torch.tensor(reference_idf(CORPUS), dtype=torch.float64), rtol=1e-6, atol=1e-6
    )
    assert (head.idf > 0).sum() >= 5  # grams seen in two documents ("profits", "the film", ...) are kept


def test_logits_match_a_float64_reference_alone_and_padded_in_a_batch(head: TfidfHead) -> None:
    idf = reference_idf(CORPUS)
    docs = [*CORPUS[:4], b"Profits rose, then fell: a Honda film", b"", b"!!!"]
    batch = torch.nn.utils.rnn.pad_sequence([ids_of(d) for d in docs], batch_first=True)
    with torch.no_grad():
        batched = head(batch)
        for i, text in enumerate(docs):
            alone = head(ids_of(text)[None])[0]
            # float32 over ~20 distinct grams, values of order TFIDF_GAIN x |w| ~ 10: a few 1e-6 absolute
            torch.testing.assert_close(alone.double(), reference_logits(head, text, idf), rtol=1e-5, atol=1e-4)
            torch.testing.assert_close(batched[i], alone, rtol=1e-6, atol=1e-5)
    assert torch.equal(batched[5], torch.zeros(5)) and torch.equal(batched[6], torch.zeros(5))  # no words: 0


def test_a_model_with_a_wide_path_is_bitwise_the_same_alone_padded_or_batched() -> None:
    torch.manual_seed(0)
    model = create_model("tiny-text", tfidf_buckets=BUCKETS, attention={"eval_noise": "fixed"}).eval()
    model.tfidf.fit_idf(ids_of(d) for d in CORPUS)
    with torch.no_grad():
        model.tfidf.weight.normal_()
    docs = [ids_of(d) for d in CORPUS[:4]]
    n = max(len(d) for d in docs) + 5
    ids = torch.zeros(len(docs), n, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, d in enumerate(docs):
        ids[i, : len(d)], mask[i, : len(d)] = d, 1
    ids[0, -3:] = ord("a") + 1  # a word under the mask must not count
    with torch.no_grad():
        batched = model(ids, mask)
        for i, d in enumerate(docs):
            alone = model(d[None], torch.ones(1, len(d), dtype=torch.long))
            torch.testing.assert_close(batched[i : i + 1], alone, rtol=0, atol=0)
        wide = model.forward_wide(ids, mask)
        torch.testing.assert_close(batched, model.forward_deep(ids, mask) + wide, rtol=0, atol=0)
    assert wide.abs().max() > 0.1  # the wide path is really in the sum


def test_wide_path_round_trips_through_save_export_and_load(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = create_model("tiny-text", tfidf_buckets=BUCKETS, attention={"eval_noise": "fixed"}).eval()
    # random bytes hold many short words; fit idf on such documents so the graph carries non-zero features
    model.tfidf.fit_idf(torch.randint(1, 257, (200,)) for _ in range(50))
    with torch.no_grad():
        model.tfidf.weight.normal_()
    loaded = export_round_trip(model, tmp_path / "tiny-text")
    assert loaded.cfg.tfidf_buckets == BUCKETS and torch.equal(loaded.tfidf.idf, model.tfidf.idf)


def test_training_fits_idf_on_the_training_documents(tmp_path: Path) -> None:
    out = tmp_path / "m"
    argv = [
        "--model",
        "lara-text-news-bytes",
        "--length-mix",
        '{"head_prob": 0.5}',
        "--limit",
        "20",
        "--max-steps",
        "1",
    ]
    argv += ["--epochs", "1", "--eval-limit", "5", "--no-test", "--threads", "1", "--override"]
    argv += [json.dumps({"tfidf_buckets": BUCKETS, "ngram_buckets": 0, "depth": 1})]
    train.main([*argv, "--out", str(out), "--run-dir", str(tmp_path / "ckpt")])
    cfg = get_config("lara-text-news-bytes", tfidf_buckets=BUCKETS)
    expected = TfidfHead(BUCKETS, 5)
    expected.fit_idf(document_ids(load_task("news", "train", cfg, limit=20, length_mix={"head_prob": 0.5})))
    assert torch.equal(load_pretrained(out).tfidf.idf, expected.idf) and (expected.idf > 0).sum() > 100


def test_kfold_summary_scores_each_path_on_the_same_documents(tmp_path: Path) -> None:
    rows = [
        {
            "fold": 0,
            "n_test": 2,
            "right": {"1024": "10", "full": "11"},
            "parts": {"deep": {"1024": "00", "full": "10"}},
        },
        {
            "fold": 1,
            "n_test": 2,
            "right": {"1024": "11", "full": "11"},
            "parts": {"deep": {"1024": "01", "full": "11"}},
        },
    ]
    s = news_kfold.summarize(rows)
    assert s["truncation"] == {"1024": 0.75, "full": 1.0}
    assert s["parts"]["deep"]["truncation"] == {"1024": 0.25, "full": 0.75}
    assert s["parts"]["deep"]["gap_1024"]["points"] == 50.0 and s["parts"]["deep"]["documents"] == 4
    news_kfold.plot({"rows": [], "summary": s, "epochs": 1}, tmp_path / "p.png")  # pooled and per-path curves
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_a_model_without_a_wide_path_says_so() -> None:
    model = create_model("tiny-text").eval()
    ids = torch.randint(1, 257, (1, 20))
    with pytest.raises(ValueError, match="tfidf_buckets > 0"):
        model.forward_wide(ids, torch.ones_like(ids))
    assert model.tfidf is None and torch.equal(
        model(ids, torch.ones_like(ids)), model.forward_deep(ids, torch.ones_like(ids))
    )


@pytest.mark.parametrize("buckets", [1, -3])
def test_bad_bucket_counts_are_refused(buckets: int) -> None:
    with pytest.raises(ValueError, match="tfidf_buckets must be 0"):
        create_model("tiny-text", tfidf_buckets=buckets)
