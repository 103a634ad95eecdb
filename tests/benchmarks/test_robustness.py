"""benchmarks.robustness: filler placement, eval sources disjoint from training's, the statistics against
hand examples, and the suite end to end on a small slice of the shipped models."""

from __future__ import annotations

import difflib
import json
import random

import numpy as np
import pytest

from benchmarks.robustness import __main__ as suite
from benchmarks.robustness import cnn, perturb, sources, stats

ARTICLE = b"Headline here\n\nFirst paragraph. It has two sentences.\n\nSecond paragraph.\nThird line."


@pytest.mark.parametrize("position", perturb.POSITIONS)
def test_filler_is_placed_where_said(position):
    filler = bytes(range(65, 91)) * 4  # 104 bytes of capitals, none in the article's separators
    out = perturb.place_filler(ARTICLE, filler, position)
    if position == "append":
        assert out == ARTICLE + b"\n\n" + filler
    elif position == "prepend":
        assert out == filler + b"\n\n" + ARTICLE
    else:
        # every paragraph break of the article is followed by one run of filler and a blank line; removing
        # them gives the article back, and the runs in order are the whole filler
        cuts = perturb._paragraph_cuts(ARTICLE)
        assert len(cuts) == 3  # after "Headline here\n\n", "sentences.\n\n" and "paragraph.\n"
        pieces, runs, rest, prev = [], [], out, 0
        for cut in cuts:
            part = ARTICLE[prev:cut]
            assert rest.startswith(part)
            rest = rest[len(part) :]
            run, _, rest = rest.partition(b"\n\n")
            pieces.append(part)
            runs.append(run)
            prev = cut
        assert rest == ARTICLE[prev:]
        assert b"".join(runs) == filler
        assert max(map(len, runs)) - min(map(len, runs)) <= 1  # equal shares
        assert not out.startswith(filler[:10]) and not out.endswith(filler[-10:])


def test_interleave_without_breaks_appends_and_bad_position_is_named():
    assert perturb.place_filler(b"one", b"xx", "interleave") == b"one\n\nxx"
    with pytest.raises(ValueError, match="append, prepend, interleave"):
        perturb.place_filler(b"a", b"b", "middle")


def test_text_variants_keep_the_words():
    rng = random.Random(0)
    words = ARTICLE.decode().split()
    assert perturb.text_variant(ARTICLE, "upper", rng).decode().split() == [w.upper() for w in words]
    assert perturb.text_variant(ARTICLE, "ws_collapse", rng).decode().split() == words
    wrapped = perturb.text_variant(ARTICLE * 5, "ws_wrap", rng).decode()
    assert max(len(line) for line in wrapped.splitlines()) <= 64
    page = perturb.text_variant(ARTICLE, "markup", rng).decode()
    assert page.startswith("<!DOCTYPE html>") and "<p " in page and "Second paragraph." in page
    r = random.Random(2)  # random letters: the diff aligns them unambiguously
    text = " ".join("".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6)) for _ in range(600))
    letters = sum(c.isalpha() for c in text)
    edits = difflib.SequenceMatcher(None, text, perturb.typos(text, random.Random(1)), autojunk=False).get_opcodes()
    typos = sum(op != "equal" for op, *_ in edits)
    assert 0.5 * 0.02 * letters < typos < 1.5 * 0.02 * letters  # about 2% of letters, one edit each


def test_sources_sample_the_size_asked_and_are_seeded():
    for name in (*sources.FILLER_SOURCES, "random"):
        draw = sources.sampler(name)
        a, b = draw(random.Random(3), 5000), draw(random.Random(3), 5000)
        assert a == b, name
        assert 4500 <= len(a) <= 5000, (name, len(a))
        if name != "random":
            a.decode("utf-8")  # whole characters
    words = sources.lorem(random.Random(0), 2000).decode().lower().replace(".", " ").split()
    assert set(words[:-1]) <= set(sources.LOREM_WORDS)  # the last word may be cut at 2,000 bytes
    licences = [p.name for p in sources.licence_files()]
    assert "GPL-3" in licences and "Apache-2.0" in licences and "BSD" not in licences


def _long_lines(texts) -> set[str]:
    return {ln.strip() for t in texts for ln in t.decode("utf-8", "ignore").splitlines() if len(ln.strip()) >= 60}


def test_eval_sources_disjoint_from_training_filler():
    from lara_serve.model_export.training.augment import EVAL_LICENCE_FAMILIES, FillerBank

    bank = FillerBank.installed()
    for text in bank.sources["licence"]:  # augment keeps the evaluation's licence families out of training
        assert not any(f.lower() in text.decode("utf-8", "ignore").lower() for f in EVAL_LICENCE_FAMILIES)
    train = _long_lines([t for kind in ("code", "prose", "licence") for t in bank.sources[kind]])
    for name in ("licence", "code", "prose", "nonenglish"):
        lines = _long_lines(sources.pool(name))
        shared = lines & train
        # a few generic lines (a licence's "WITHOUT ANY WARRANTY" sentence quoted in a README) may recur
        assert len(shared) <= 0.01 * len(lines), (name, len(shared), len(lines), sorted(shared)[:3])
    lorem_lines = _long_lines([sources.lorem(random.Random(0), 20000)])
    assert not lorem_lines & train


def test_auroc_and_wilson_against_hand_examples():
    # out 0.9 beats all 4 in-scores; 0.4 beats 0.1 and 0.35 and ties 0.4 (2.5); 0.6 beats 3: 9.5 / 12
    assert stats.auroc_value(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0.9, 0.4, 0.6])) == pytest.approx(9.5 / 12)
    assert stats.auroc_value(np.array([1.0, 2.0]), np.array([3.0, 4.0])) == 1.0
    assert stats.auroc_value(np.array([3.0, 4.0]), np.array([1.0, 2.0])) == 0.0
    f = stats.auroc(np.arange(50.0), np.arange(25.0, 75.0))
    assert f["lo"] < f["value"] < f["hi"] and f["n"] == 50 and f["n_in"] == 50
    w = stats.wilson(8, 10)  # textbook: 0.490 to 0.943
    assert (w["value"], round(w["lo"], 3), round(w["hi"], 3)) == (0.8, 0.49, 0.943)
    assert stats.wilson(0, 5)["lo"] == 0.0 and stats.wilson(5, 5)["hi"] == 1.0
    probs = np.array([[0.9, 0.1]] * 10)
    e = stats.ece(probs, np.array([0] * 8 + [1] * 2), resamples=50)
    assert e["value"] == pytest.approx(0.1) and e["lo"] <= 0.1 <= e["hi"]
    # exactly calibrated (ECE 0); nearly every resample is off by a little, so its percentiles lie above 0
    calibrated = stats.ece(np.array([[0.8, 0.2]] * 20000), np.array([0] * 16000 + [1] * 4000), resamples=100)
    assert calibrated["value"] == pytest.approx(0.0, abs=1e-12) and calibrated["lo"] <= calibrated["value"]


def _figures(node, path=""):
    if isinstance(node, dict):
        if {"value", "n", "lo", "hi"} <= node.keys():
            yield path, node
        for k, v in node.items():
            yield from _figures(v, f"{path}/{k}")


@pytest.mark.slow
@pytest.mark.timeout(1800)  # about 30 s of CPU; far longer in wall time on a machine shared with training runs
def test_suite_on_a_small_slice(tmp_path, monkeypatch):
    monkeypatch.setattr(cnn, "CACHE", tmp_path / "cnn")
    argv = ["--models", "lara-text-news-bytes", "lara-vit-fashion", "--limit", "16", "--filler-docs", "4",
            "--filler-sources", "lorem", "code", "--filler-kb", "1", "3", "--variants", "upper", "markup",
            "--ood-items", "6", "--sotu", "1", "--cnn-budget", "3", "--out", str(tmp_path), "--name", "t"]  # fmt: skip
    suite.main(argv)
    out = json.loads((tmp_path / "t.json").read_text())
    news, vit = out["models"]["lara-text-news-bytes"], out["models"]["lara-vit-fashion"]
    assert set(news["cases"]) == {"clean", "upper", "markup"}
    assert set(news["filler"]) == {f"{s}/{p}/{k}" for s in ("lorem", "code") for p in perturb.POSITIONS for k in (1, 3)}
    assert news["cases"]["clean"]["model"]["n"] == 16 and news["filler"]["lorem/append/3"]["model"]["n"] == 4
    assert set(news["ood"]) == {"random", "code", "nonenglish", "lorem", "brown_fiction", "a"}
    assert news["sotu"]["whole"]["model"]["n"] == 1
    assert vit["cases"]["clean"]["model"]["n"] == 16 and "rotate_15deg" in vit["cases"]
    assert set(vit["ood"]) == {"uniform_noise", "digits", "inverted"}
    figs = list(_figures(out))
    assert len(figs) > 60
    for path, f in figs:
        assert 0.0 <= f["lo"] <= f["value"] <= f["hi"] <= 1.0, path
    for r in (news, vit):  # OOD metrics exist exactly when the graph has an ood_score output
        assert all(("model_auroc_ood" in row) == r["has_ood_score"] for row in r["ood"].values())
    assert news["cases"]["clean"]["anchor"]["value"] >= 0.8  # a bag of words on its own test split
    md = (tmp_path / "t.md").read_text()
    assert "| lara-text-news-bytes | upper-cased |" in md and "| lara-vit-fashion | rotated 15 degrees |" in md
    assert (tmp_path / "t_filler.png").stat().st_size > 10_000 and (tmp_path / "t_calibration.png").is_file()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_genre_model_reads_bbc_news_as_press_from_a_new_source(tmp_path):
    """BBC News is the genre model's press class from another source: scored as a new-source case (first 2 KB
    and whole), its ood figures kept beside it, and not among the out-of-domain sets the worst AUROC reads."""
    argv = ["--models", "lara-text-genre", "--limit", "8", "--filler-docs", "0", "--variants", "upper",
            "--ood-items", "4", "--new-source", "6", "--out", str(tmp_path), "--name", "g"]  # fmt: skip
    suite.main(argv)
    genre = json.loads((tmp_path / "g.json").read_text())["models"]["lara-text-genre"]
    ns = genre["new_source"]
    assert ns["label"] == "press" and ns["first_2kb"]["model"]["n"] == ns["whole"]["model"]["n"] == 6
    assert ns["ood"]["n"] == 6 and "model_auroc_ood" in ns["ood"]
    assert "bbc_news" not in genre["ood"] and {"random", "lorem", "a"} <= set(genre["ood"])
    md = (tmp_path / "g.md").read_text()
    assert "| lara-text-genre | BBC News (new source), whole: press |" in md
    assert "BBC News (press from a new source; not counted)" in md and "model: bbc" not in md


def test_repository_option_reads_models_from_another_folder_and_restores_the_shipped_one(tmp_path):
    from benchmarks.robustness import runners

    shipped = runners.REPOSITORY
    (tmp_path / "candidate" / "1").mkdir(parents=True)
    (tmp_path / "candidate" / "1" / "model.onnx").write_bytes(b"")
    with pytest.raises(SystemExit, match=r"unknown model\(s\) \['lara-text-news-bytes'\]; shipped: \['candidate'\]"):
        suite.main(["--repository", str(tmp_path), "--models", "lara-text-news-bytes", "--out", str(tmp_path)])
    assert shipped == runners.REPOSITORY
