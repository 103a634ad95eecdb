"""Text augmentation: each perturbation keeps the article's words, filler goes where asked and comes from
the training sources only, runs are reproducible, case folding makes upper case the same input."""

from __future__ import annotations

import random

import pytest
import torch

from lara_serve.model_export import create_model
from lara_serve.model_export.models.text_embeddings import fold_case
from lara_serve.model_export.training import augment as au

ARTICLE = b"The central bank raised interest rates on Tuesday.\nMarkets fell sharply. Analysts expect more rises."


@pytest.fixture(scope="module")
def bank() -> au.FillerBank:
    return au.FillerBank.installed()


def test_bank_has_every_source_and_keeps_evaluation_licences_out(bank) -> None:
    for kind in ("code", "prose", "licence"):
        assert len(bank.sources[kind]) >= 5, kind
    for text in bank.sources["licence"]:
        low = text.decode().lower()
        assert not any(f.lower() in low for f in au.EVAL_LICENCE_FAMILIES)
    assert len(bank.words) > 1000


@pytest.mark.parametrize("kind", au.FILLER_KINDS)
def test_filler_samples_have_the_asked_length_and_are_utf8(bank, kind) -> None:
    rng = random.Random(0)
    for n in (1, 100, 5000):
        raw = bank.sample(rng, n, kind)
        raw.decode("utf-8")  # whole characters only
        assert n - 4 <= len(raw) <= n  # a cut multi-byte character at either end may be dropped


@pytest.mark.parametrize("where", ["start", "end", "both", "middle"])
def test_insert_filler_keeps_the_article_and_places_the_filler(where) -> None:
    filler = b"F" * 300
    out = au.insert_filler(ARTICLE, filler, where, random.Random(3))
    assert out.count(b"F") == 300
    assert out.replace(b"F", b"").replace(b"\n\n", b"") == ARTICLE.replace(b"\n\n", b"")
    if where == "start":
        assert out.startswith(filler) and out.endswith(ARTICLE)
    elif where == "end":
        assert out.startswith(ARTICLE) and out.endswith(filler)
    elif where == "middle":
        assert not out.startswith(b"F") and not out.endswith(b"F")
    with pytest.raises(ValueError, match="where must be"):
        au.insert_filler(ARTICLE, filler, "top", random.Random(0))


def _words(raw: bytes) -> list[str]:
    return raw.decode().lower().split()


def test_case_whitespace_and_markup_keep_the_words() -> None:
    rng = random.Random(0)
    for _ in range(12):
        assert _words(au.change_case(ARTICLE, rng)) == _words(ARTICLE)
        assert _words(au.change_whitespace(ARTICLE, rng)) == _words(ARTICLE)
    marked = au.add_markup(ARTICLE, rng).decode()
    assert "<article>" in marked and "The central bank raised interest rates on Tuesday." in marked


def test_typos_change_about_the_asked_share_of_letters() -> None:
    import difflib

    r = random.Random(9)
    text = " ".join("".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(9)) for _ in range(300)).encode()
    out = au.add_typos(text, random.Random(0), rate=0.02)
    # each typo costs 1-2 edits: about 60 typos leave a similarity near 1 - 60 x 1.5 / 3,300
    similarity = difflib.SequenceMatcher(None, text, out, autojunk=False).ratio()
    assert 0.95 < similarity < 0.995
    assert au.add_typos(text, random.Random(0), rate=0.0) == text
    assert au.add_typos(b"12345 ,.;", random.Random(0), rate=1.0) == b"12345 ,.;"  # letters only


def test_augment_is_reproducible_and_bounded(bank) -> None:
    aug = au.TextAugment(filler_prob=1.0, bank=bank, max_total=4000)
    a = [aug(ARTICLE, random.Random(s)) for s in range(20)]
    assert a == [aug(ARTICLE, random.Random(s)) for s in range(20)]
    assert all(len(x) <= 4000 + 8 for x in a)  # + separators
    assert sum(len(x) > 2 * len(ARTICLE) for x in a) >= 10  # filler was added to most
    assert len({x for x in a}) == 20
    none = au.TextAugment(0, 0, 0, 0, 0, bank=bank)
    assert none(ARTICLE, random.Random(0)) == ARTICLE
    with pytest.raises(ValueError, match="probability"):
        au.TextAugment(filler_prob=1.5)


def test_case_fold_makes_upper_case_the_same_input() -> None:
    ids = torch.tensor([[b + 1 for b in ARTICLE]])
    upper = torch.tensor([[b + 1 for b in ARTICLE.upper()]])
    assert torch.equal(fold_case(upper), torch.tensor([[b + 1 for b in ARTICLE.lower()]]))
    assert torch.equal(fold_case(torch.tensor([[0, 256, 1]])), torch.tensor([[0, 256, 1]]))  # pad, 0xFF, NUL
    model = create_model("tiny-text", case_fold=True).eval()
    mask = torch.ones_like(ids)
    with torch.no_grad():
        torch.testing.assert_close(model(ids, mask), model(upper, mask), rtol=0, atol=0)
        plain = create_model("tiny-text").eval()
        assert not torch.equal(plain(ids, mask), plain(upper, mask))


def test_pseudo_filler_is_a_new_language_per_call_and_reproducible() -> None:
    first = au._pseudo(random.Random(5), 3000)
    assert first == au._pseudo(random.Random(5), 3000)
    rng = random.Random(6)
    a, b = au._pseudo(rng, 3000).decode(), au._pseudo(rng, 3000).decode()
    words_a, words_b = set(a.lower().split()), set(b.lower().split())
    # Each call draws its own syllables and vocabulary: two samples share almost no words.
    assert len(words_a & words_b) < 0.2 * min(len(words_a), len(words_b))
    assert 3000 <= len(first) < 3200 and first.count(b".") + first.count(b"?") + first.count(b"!") >= 10
