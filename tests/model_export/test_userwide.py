"""The wide path of `lara train` (lara_serve.model_export.your_data.wide): its sparse features against the head's own logits and a
float64 Python reference, UTF-8 words, the logistic-regression fit, the holdout blend, and the installed model
computing a * encoder + b * wide."""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import pytest
import torch

from lara_serve.model_export.models.registry import build_model, get_config
from lara_serve.model_export.models.text import _BIGRAM_MUL, _BIGRAM_SALT, TFIDF_GAIN, TfidfHead
from lara_serve.model_export.models.text_embeddings import _BASE, _WORD_MOD, WORD_MAX_BYTES
from lara_serve.model_export.your_data import wide as userwide

BUCKETS = 4093
DOCS = [
    b"Markets rallied as shares rose; shares of banks rose most.",
    b"The striker scored twice and the team won the cup.",
    "Акции банков выросли, акции выросли снова.".encode(),
    "Команда выиграла кубок, нападающий забил дважды.".encode(),
    b"Shares fell; the cup final was won by the team.",
    "東京 株価 上昇 株価".encode(),
]


def reference_features(text: bytes, idf: np.ndarray, utf8: bool) -> dict[int, float]:
    """Float64 from Python integers and a regex: normalized sublinear tf x idf per bucket."""
    pattern = rb"[A-Za-z0-9\x80-\xff]+" if utf8 else rb"[A-Za-z0-9]+"
    hashes = []
    for word in re.findall(pattern, text):
        tail = word[-WORD_MAX_BYTES:].lower()
        hashes.append(sum((b + 1) * _BASE**back for back, b in enumerate(reversed(tail))) % _WORD_MOD)
    bigrams = [(p * _BIGRAM_MUL + h + _BIGRAM_SALT) % _WORD_MOD for p, h in zip(hashes, hashes[1:], strict=False)]
    grams = Counter([h % BUCKETS for h in hashes] + [c % BUCKETS for c in bigrams])
    x = {b: (1 + math.log(c)) * idf[b] for b, c in grams.items() if idf[b] != 0}
    norm = math.sqrt(sum(v * v for v in x.values())) or 1.0
    return {b: v / norm for b, v in x.items()}


@pytest.mark.parametrize("utf8", [False, True])
def test_features_match_a_float64_reference_and_the_heads_logits(utf8: bool) -> None:
    head = TfidfHead(BUCKETS, 3, utf8=utf8)
    head.fit_idf(userwide._ids(d) for d in DOCS * 2)  # every gram in >= 2 documents: all idf > 0
    feats = userwide.features(head, DOCS)
    idf = head.idf.double().numpy()
    for i, doc in enumerate(DOCS):
        ref = reference_features(doc, idf, utf8)
        row = feats.getrow(i)
        assert dict(zip(row.indices.tolist(), row.data.tolist(), strict=True)) == pytest.approx(ref, rel=1e-12)
    torch.nn.init.normal_(head.weight, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for i, doc in enumerate(DOCS):
            got = head(userwide._ids(doc)[None])[0].double()
            want = TFIDF_GAIN * torch.from_numpy(feats.getrow(i) @ head.weight.double().numpy())[0]
            # float32 sums of a few dozen products of O(1) terms: ~1e-6 relative
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_utf8_words_see_non_latin_scripts_that_ascii_words_miss() -> None:
    cyrillic = DOCS[2]
    ascii_head, utf8_head = TfidfHead(BUCKETS, 2), TfidfHead(BUCKETS, 2, utf8=True)
    for head in (ascii_head, utf8_head):
        head.fit_idf(userwide._ids(d) for d in DOCS * 2)
    assert userwide.features(ascii_head, [cyrillic]).nnz == 0
    # 5 words (акции twice) -> 4 distinct unigrams + 4 distinct bigrams, give or take a bucket collision
    assert userwide.features(utf8_head, [cyrillic]).nnz >= 7


def test_wide_buckets_keep_the_table_bounded() -> None:
    assert userwide.wide_buckets(2) == userwide.MAX_BUCKETS
    for classes in (2, 5, 9, 20, 100, 5000):
        b = userwide.wide_buckets(classes)
        assert b & (b - 1) == 0 and b * classes <= max(userwide.MAX_TABLE_FLOATS, 2 * classes)


@pytest.mark.parametrize("classes", [2, 3])
def test_fit_separates_its_training_set_and_maps_binary_to_two_columns(classes: int) -> None:
    head = TfidfHead(BUCKETS, classes, utf8=True)
    docs = DOCS * 3
    y = [i % classes for i in range(len(docs))]
    fit = userwide.fit_wide(head, docs, y, classes)
    assert fit.coef.shape == (classes, BUCKETS) and fit.intercept.shape == (classes,)
    z = fit.logits(userwide.features(head, docs))
    assert (z.argmax(1) == np.array(y)).mean() > 0.8  # separable words: the training set is fit
    if classes == 2:  # sklearn's one score column, split antisymmetrically: softmax equals its sigmoid
        np.testing.assert_allclose(fit.coef[0], -fit.coef[1])


def test_tfidf_from_counts_and_the_idf_rule_match_the_head() -> None:
    head = TfidfHead(BUCKETS, 2, utf8=True)
    docs = DOCS + DOCS[:2]  # the first two documents' grams occur twice: df 2
    c = userwide.counts(head, docs)
    for min_df in (1, 2):
        head.fit_idf((userwide._ids(d) for d in docs), min_df=min_df)
        np.testing.assert_allclose(userwide._idf(c, min_df), head.idf.double().numpy(), rtol=1e-6)
    assert (userwide._idf(c, 2) > 0).sum() < (userwide._idf(c, 1) > 0).sum()
    x = userwide.tfidf(c, userwide._idf(c, 2))
    np.testing.assert_allclose(np.sqrt(x.multiply(x).sum(1)).A.ravel()[:2], 1.0)
    assert x.getrow(3).nnz == 0  # a document whose grams all occur once: dropped by min_df 2, a zero row


def test_blend_follows_the_holdout() -> None:
    y = np.array([0, 1] * 20)
    good = np.eye(2)[y] * 3.0
    noise = np.random.default_rng(0).normal(size=good.shape)
    assert userwide.choose_blend(noise, good, y)[0] == 0.0  # a useless encoder is dropped
    a, b = userwide.choose_blend(good, noise, y)
    assert b == 0.0 and a == max(userwide.BLEND_GRID)  # a right and sharp encoder alone, sharpened
    assert userwide.choose_blend(good, good, y) != (0.0, 0.0)


def test_installed_model_computes_the_blend() -> None:
    cfg = get_config("tiny-text", num_classes=3, tfidf_buckets=BUCKETS, tfidf_utf8=True)
    model = build_model(cfg, seed=0).eval()
    y = [i % 3 for i in range(len(DOCS))]
    data = userwide.WideData(DOCS, y, DOCS[:3], y[:3], DOCS[3:], y[3:])
    head, fit = userwide.detach_and_fit(model, data)
    assert model.tfidf is None  # the encoder trains alone
    ids = torch.nn.utils.rnn.pad_sequence([userwide._ids(d) for d in DOCS], batch_first=True)
    mask = (ids > 0).long()
    with torch.no_grad():
        deep = model(ids, mask).double()

    def deep_logits(m: torch.nn.Module, docs: list[bytes]) -> np.ndarray:
        with torch.no_grad():
            return torch.cat([m(userwide._ids(d)[None], torch.ones(1, len(d), dtype=torch.long)) for d in docs]).numpy()

    parts = userwide.attach(model, head, fit, data, deep_logits)
    a, b = parts["served"]["encoder_weight"], parts["served"]["wide_weight"]  # the blend or a part alone
    assert model.tfidf is head
    want = a * deep + b * torch.from_numpy(fit.logits(userwide.features(head, DOCS)))
    with torch.no_grad():
        got = model(ids, mask).double()
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)  # float32 logits of size ~10: 1e-4 absolute
    assert parts["wide"]["buckets"] == BUCKETS and parts["wide"]["utf8_words"] is True
    assert 0.0 <= parts["encoder"]["test_accuracy"] <= 1.0


def _topics(n_per_class: int, seed: int = 0) -> tuple[list[bytes], np.ndarray]:
    """Two classes told apart by their words, with shared filler words: learnable, not trivially."""
    rng = np.random.default_rng(seed)
    words = {0: [b"market", b"shares", b"bank", b"profit"], 1: [b"striker", b"goal", b"cup", b"match"]}
    filler = [b"the", b"of", b"said", b"today", b"news", b"week"]
    docs, y = [], []
    for label in (0, 1):
        for _ in range(n_per_class):
            picks = list(rng.choice(words[label], 2)) + list(rng.choice(filler, 4))
            rng.shuffle(picks)
            docs.append(b" ".join(picks))
            y.append(label)
    return docs, np.asarray(y)


def test_the_choice_is_the_best_cross_validated_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    # A grid whose default cannot learn (min_df above the number of documents: every idf 0, every feature
    # 0), so that the default-first tie rule alone would keep it.
    monkeypatch.setattr(userwide, "MIN_DF_GRID", (10_000, 1))
    monkeypatch.setattr(userwide, "C_GRID", (10.0, 30.0))
    monkeypatch.setattr(userwide, "MIN_DF", 10_000)
    docs, y = _topics(30)
    head = TfidfHead(BUCKETS, 2)
    choice = userwide.choose_settings(userwide.counts(head, docs), y)
    assert (choice.min_df, choice.C) == (1, 10.0)  # the first of the settings that learn (tied at the top)
    assert len(choice.cv_accuracy) == 4 and choice.cv_accuracy["min_df=1,C=10"] == max(choice.cv_accuracy.values())
    assert choice.cv_accuracy["min_df=10000,C=10"] == choice.cv_accuracy["min_df=10000,C=30"] == 0.5
    assert choice.record()["chosen_on"].startswith("3-fold CV")


def test_ties_go_to_the_defaults_and_tiny_sets_keep_them() -> None:
    docs, y = _topics(30)
    head = TfidfHead(BUCKETS, 2)
    choice = userwide.choose_settings(userwide.counts(head, docs), y)
    # Every real setting separates these topics: all tie, and the defaults stay.
    assert set(choice.cv_accuracy.values()) == {1.0}
    assert (choice.min_df, choice.C) == (userwide.MIN_DF, userwide.LOGREG_C)
    small = userwide.choose_settings(userwide.counts(head, docs[:2] + docs[-2:]), np.asarray([0, 0, 1, 1]))
    assert small.cv_accuracy == {} and (small.min_df, small.C) == (userwide.MIN_DF, userwide.LOGREG_C)
    assert "too few" in small.record()["chosen_on"]


def test_large_sets_are_chosen_on_a_subset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(userwide, "CV_MAX_EXAMPLES", 24)
    seen: list[int] = []
    real = userwide._logreg

    def counting(c_value: float):
        clf = real(c_value)
        fit = clf.fit
        clf.fit = lambda x, y: (seen.append(x.shape[0]), fit(x, y))[1]
        return clf

    monkeypatch.setattr(userwide, "_logreg", counting)
    docs, y = _topics(30)
    userwide.choose_settings(userwide.counts(TfidfHead(BUCKETS, 2), docs), y)
    assert seen and max(seen) == 16  # two of three folds of the 24 kept


def test_the_served_part_is_never_worse_than_a_part_alone_on_the_holdout() -> None:
    """The blend's weights minimize the holdout NLL; a part alone can still be right more often (issue 54:
    served 1.7 points under its own wide path). Then that part is served, and the choice says why."""
    y = np.array([0, 1] * 50)
    wide = np.eye(2)[y] * 1.0  # right on 85 of 100, by a small margin
    wide[:15] = np.eye(2)[1 - y[:15]]
    deep = np.zeros((100, 2))
    deep[:15] = np.eye(2)[y[:15]] * 10.0  # the encoder fixes the wide path's 15 errors ...
    deep[15:40] = np.eye(2)[1 - y[15:40]] * 3.0  # ... and overrules it, wrongly, on 25 more
    weights = {"blend": (1.0, 1.0), "wide": (0.0, 1.0), "encoder": (1.0, 0.0)}
    served = userwide.choose_served(deep, wide, y, weights)
    assert {p: served["holdout"][p]["accuracy"] for p in weights} == {"blend": 0.75, "wide": 0.85, "encoder": 0.45}
    assert served["part"] == "wide" and (served["encoder_weight"], served["wide_weight"]) == (0.0, 1.0)
    assert served["why"].startswith("highest holdout accuracy (0.8500; blend 0.7500, encoder 0.4500)")
    # equal accuracy: the lower NLL wins (both right everywhere, the encoder sharper)
    same = {"blend": (0.0, 1.0), "wide": (0.0, 1.0), "encoder": (1.0, 0.0)}
    assert userwide.choose_served(np.eye(2)[y] * 5.0, np.eye(2)[y], y, same)["part"] == "encoder"
    assert userwide.choose_served(deep[:0], wide[:0], y[:0], weights)["part"] == "blend"  # no holdout


def reference_piece_features(seq: list[int], idf: np.ndarray, special: set[int]) -> dict[int, float]:
    """Float64 from Python integers: a word-piece document's 1-2-grams (runs of non-special ids)."""
    grams: Counter[int] = Counter()
    prev = None
    for t in seq:
        if t in special:
            prev = None
            continue
        grams[t % BUCKETS] += 1
        if prev is not None:
            grams[((prev * _BIGRAM_MUL + t + _BIGRAM_SALT) % _WORD_MOD) % BUCKETS] += 1
        prev = t
    x = {b: (1 + math.log(c)) * idf[b] for b, c in grams.items() if idf[b] != 0}
    norm = math.sqrt(sum(v * v for v in x.values())) or 1.0
    return {b: v / norm for b, v in x.items()}


def test_word_piece_grams_match_a_float64_reference_and_the_heads_logits() -> None:
    """bert_lara.PieceTfidfHead: [CLS] = 101, [SEP] = 102 and padding are no pieces; its sparse features equal a
    float64 reference, and its logits (padded rows in a batch too) equal TFIDF_GAIN x features @ weight."""
    from lara_serve.model_export.models.bert_lara import PieceTfidfHead
    from lara_serve.model_export.models.text import wide_logits

    special = (0, 101, 102)
    g = np.random.default_rng(0)
    seqs = [[101, *g.integers(1000, 30522, n).tolist(), 102] for n in (0, 1, 7, 60)]
    seqs.append([101, 2000, 2001, 2000, 2001, 2000, 102])  # repeats: tf 3 and 2 of a unigram, 2 of each bigram
    head = PieceTfidfHead(BUCKETS, 3, special)
    c = userwide.counts(head, seqs * 2)
    head.idf.copy_(torch.from_numpy(userwide._idf(c, 1)))
    feats = userwide.features(head, seqs)
    idf = head.idf.double().numpy()
    for i, seq in enumerate(seqs):
        row = feats.getrow(i)
        got = dict(zip(row.indices.tolist(), row.data.tolist(), strict=True))
        assert got == pytest.approx(reference_piece_features(seq, idf, set(special)), rel=1e-12)
    assert feats.getrow(0).nnz == 0  # [CLS] [SEP]: no grams
    torch.nn.init.normal_(head.weight, generator=torch.Generator().manual_seed(0))
    n = max(map(len, seqs))
    ids = torch.zeros(len(seqs), n, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, seq in enumerate(seqs):
        ids[i, : len(seq)], mask[i, : len(seq)] = torch.tensor(seq), 1
    ids[mask == 0] = 7  # what is past the mask is never read
    with torch.no_grad():
        for z in (wide_logits(head, ids, mask), head(ids * mask)):  # eager per row, and batched as traced
            want = TFIDF_GAIN * torch.from_numpy(feats @ head.weight.double().numpy())
            assert torch.allclose(z.double(), want, rtol=1e-5, atol=1e-5)  # float32 sums: ~1e-6 relative
