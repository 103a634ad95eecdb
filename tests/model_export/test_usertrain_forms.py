"""`lara train`'s robust text recipe, and every table/folder form of text end to end: CSV, TSV and a folder of
texts trained at a tiny budget, added to a live server with --load-into and classified through it. (JSONL and
a folder of images go the same road in test_usertrain.py.)"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from user_samples import TINY_TEXT, VOCAB, text_inputs, torch_probs, write_text_form, write_texts

from lara_serve.clients.__main__ import main as lara
from lara_serve.clients.client import LaraClient
from lara_serve.model_export.training.long_docs import SEPARATOR
from lara_serve.model_export.your_data import loader as ud
from lara_serve.model_export.your_data import wide as userwide
from lara_serve.model_export.your_data.command import SHIPPED, Prepared, add_arguments, prepare
from lara_serve.server.testing import server_process

FORMS = {"csv": "d.csv", "tsv": "d.tsv", "folder": "texts"}


def _prepare(argv: list[str]) -> Prepared:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return prepare(parser.parse_args(argv))


def _windows(prep: Prepared) -> list[bytes]:
    """One epoch of training windows as the trainer draws them (plan of epoch 0, seed 0)."""
    return [w for batch in prep.train_task._plan(0) for w, _, _ in batch]


def test_text_recipe_augments_windows_and_no_augment_turns_it_off(tmp_path: Path) -> None:
    write_texts(tmp_path / "d.jsonl")
    argv = [str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "m"), *TINY_TEXT]
    robust, plain = _prepare(argv), _prepare([*argv, "--no-augment"])
    for prep in (robust, plain):  # the architecture's half of the recipe stays either way
        assert prep.cfg.pooling == "attention" and prep.cfg.case_fold is True
    assert robust.hp["augment"] is True and robust.hp["text_augment"]["max_total"] == 1024
    assert plain.hp["augment"] is False and plain.hp["text_augment"] is None
    # The documents hold only lower-case letters and spaces: anything else in a window is the recipe's
    # noise (casing, markup, typos of other letters, filler), and without augmentation there is none.
    alphabet = set(b"".join(robust.data.texts) + SEPARATOR)
    foreign = [w for w in _windows(robust) if set(w) - alphabet]
    assert len(foreign) >= len(_windows(robust)) // 4
    assert all(set(w) <= alphabet for w in _windows(plain))
    assert max(len(w) for w in _windows(robust)) <= 1024
    assert not _prepare([*argv, "--no-case-fold"]).cfg.case_fold
    assert not (tmp_path / "m").exists()


def test_text_models_get_a_utf8_wide_path_unless_no_wide(tmp_path: Path) -> None:
    write_texts(tmp_path / "d.jsonl")
    argv = [str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "m"), *TINY_TEXT]
    wide, deep = _prepare(argv), _prepare([*argv, "--no-wide"])
    assert wide.cfg.tfidf_buckets == userwide.wide_buckets(3) and wide.cfg.tfidf_utf8 is True
    assert wide.model.tfidf is not None and wide.wide is not None
    # The wide path sees the same training documents as the encoder, the holdout and test apart.
    assert len(wide.wide.train) == len(wide.split.train) and len(wide.wide.test) == len(wide.test_y)
    assert set(wide.wide.train).isdisjoint(wide.wide.holdout)
    assert deep.cfg.tfidf_buckets == 0 and deep.model.tfidf is None and deep.wide is None
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("init", ["lara-text-news-bytes", "lara-text-genre"])
def test_init_from_a_shipped_encoder_with_the_recipes_pooling(tmp_path: Path, init: str) -> None:
    """Neither shipped model pools by attention (news reads passages, genre takes a mean): the recipe's
    pooling scores start fresh, as do the head and the wide path (fitted later); every other tensor is the
    shipped one."""
    from safetensors.torch import load_file

    shipped = SHIPPED / init / "1" / "model.safetensors"
    if not shipped.is_file():
        pytest.skip(f"{shipped} is not here")
    write_texts(tmp_path / "d.jsonl")
    prep = _prepare([str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "m"), "--init", init])
    assert prep.cfg.pooling == "attention" and prep.cfg.case_fold and prep.cfg.num_classes == 3
    fresh = ["head.bias", "head.weight", "pool.score.bias", "pool.score.weight"]
    fresh += ["tfidf.idf", "tfidf.weight"]
    assert prep.hp["init_tensors"]["fresh"] == fresh
    source, own = load_file(str(shipped)), prep.model.state_dict()
    assert prep.hp["init_tensors"]["copied"] == len(own) - len(fresh)
    for name in own:
        if name not in fresh:
            assert torch.equal(own[name], source[name]), name


def test_pooling_passages_takes_the_shipped_news_readout_whole(tmp_path: Path) -> None:
    """--pooling passages from lara-text-news-bytes (which reads passages): only the head and the wide path start
    fresh, the passage size is the shipped one, and config.json's recipe line names the readout."""
    if not (SHIPPED / "lara-text-news-bytes" / "1" / "model.safetensors").is_file():
        pytest.skip("the shipped lara-text-news-bytes is not here")
    write_texts(tmp_path / "d.jsonl")
    argv = [str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "m"), "--init", "lara-text-news-bytes"]
    prep = _prepare([*argv, "--pooling", "passages"])
    shipped = json.loads((SHIPPED / "lara-text-news-bytes" / "config.json").read_text())["model"]
    assert prep.cfg.pooling == "passages" and prep.cfg.passage_bytes == shipped["passage_bytes"]
    assert prep.model.passages is not None and prep.model.pool is None
    assert prep.hp["init_tensors"]["fresh"] == ["head.bias", "head.weight", "tfidf.idf", "tfidf.weight"]
    # the tiny texts are short: the short recipe, with the readout asked for
    assert prep.hp["recipe"].startswith("short text (lara_serve.model_export.your_data.recipe): passages pooling")
    assert _prepare([*argv, "--pooling", "mean"]).model.pool is None
    with pytest.raises(SystemExit):
        _prepare([*argv, "--pooling", "max"])  # argparse names the choices


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("forms")
    for form, name in FORMS.items():
        write_text_form(root / name, form)
    (root / "repo").mkdir()
    return root


def _train(repo: Path, form: str, *extra: str) -> Path:
    out = repo / "repo" / f"{form}-model"
    argv = ["train", str(repo / FORMS[form]), "--out", str(out), *TINY_TEXT, "--epochs", "2", "--lr", "3e-3",
            "--no-baseline", *extra]  # fmt: skip
    assert lara(argv) == 0
    return out


@pytest.fixture(scope="module")
def models(repo: Path) -> dict[str, Path]:
    """The CSV model is trained before the server starts (a server needs one model to start) and is served
    from its start; the other forms are trained while it runs and added with --load-into."""
    return {"csv": _train(repo, "csv")}


@pytest.fixture(scope="module")
def live_url(repo: Path, models: dict[str, Path]) -> Iterator[str]:
    env = {"LARA_MODEL_REPOSITORY": str(repo / "repo"), "LARA_MODEL_CONTROL": "explicit", "LARA_NUM_THREADS": "1",
           "LARA_MAX_QUEUE_DELAY_MS": "1"}  # fmt: skip
    with server_process(["--log-level", "warning"], env=env) as url:
        yield url


@pytest.fixture(scope="module")
def trained(repo: Path, models: dict[str, Path], live_url: str) -> Callable[[str], Path]:
    """form -> its model folder, trained (once) at a tiny budget and served by the live server."""

    def train(form: str) -> Path:
        if form not in models:
            models[form] = _train(repo, form, "--load-into", live_url)
        return models[form]

    return train


@pytest.mark.slow
@pytest.mark.parametrize("form", list(FORMS))
def test_every_text_form_is_trained_served_and_classified(form: str, trained: Callable[[str], Path],
                                                          live_url: str) -> None:  # fmt: skip
    out = trained(form)
    conf = json.loads((out / "config.json").read_text())
    assert conf["labels"] == ["money", "sport", "tech"] and conf["task"] == "text"
    assert conf["split"]["counts"] == {"train": 36, "holdout": 3, "test": 9}
    split = json.loads((out / "split.json").read_text())
    first = split["ids"]["test"][0]
    assert first.startswith("line ") if form != "folder" else first.split("/")[0] in VOCAB
    text = "the team won the match with a late goal"
    with LaraClient(live_url) as client:
        assert f"{form}-model" in client.models()
        got = client.classify(f"{form}-model", text.encode(), "text/plain", top_k=3)
    probs = torch_probs(out, text_inputs(text))
    assert {t.label: t.score for t in got.top_k} == pytest.approx(
        dict(zip(conf["labels"], probs.tolist(), strict=True)), abs=1e-4
    )


@pytest.mark.slow
def test_the_split_is_stratified_and_the_same_for_the_same_rows_and_seed(trained: Callable[[str], Path],
                                                                         repo: Path) -> None:  # fmt: skip
    """The CSV and the TSV hold the same rows on the same lines: with the same seed they split alike, and
    split.json is what userdata.make_split gives for that seed (reproducible without the run)."""
    csv_split, tsv_split, folder_split = (json.loads((trained(f) / "split.json").read_text()) for f in FORMS)
    assert csv_split["ids"] == tsv_split["ids"]
    data = ud.load_data(repo / FORMS["csv"])
    again = ud.make_split(data, 0.2, 0.1, seed=0).record(data, data)
    assert again["ids"] == csv_split["ids"] and again["data_sha256"] == csv_split["data_sha256"]
    label_of = dict(zip(data.ids, data.labels, strict=True))
    assert Counter(label_of[i] for i in csv_split["ids"]["test"]) == {label: 3 for label in VOCAB}
    assert Counter(i.split("/")[0] for i in folder_split["ids"]["test"]) == {label: 3 for label in VOCAB}
    assert Counter(i.split("/")[0] for i in folder_split["ids"]["holdout"]) == {label: 1 for label in VOCAB}
