"""`lara train --init <word-piece model>` (lara_serve.model_export.your_data.pretrained_init): the encoder kept frozen,
a head fitted on its mean embeddings, the folder served as a word-piece model.

A tiny bert_lara classifier with its own tokenizer.json stands in for lara-text-news as --init DIR; one run per
module, served once by a live server. The shipped name is checked to resolve and load without reading any data
through it (its budget is refused before any work).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import torch
from safetensors.torch import load_file
from user_samples import VOCAB, write_images, write_texts

from lara_serve.clients.client import LaraClient
from lara_serve.model_export.models.config import AttentionConfig, BertTextConfig
from lara_serve.model_export.models.hub import load_pretrained, make_config_dict
from lara_serve.model_export.models.registry import build_model
from lara_serve.model_export.pretrained.classifier import round_to_half, save_half
from lara_serve.model_export.pretrained.teacher import WordPieces
from lara_serve.model_export.your_data import pretrained_init
from lara_serve.model_export.your_data.command import SHIPPED, add_arguments, main, prepare
from lara_serve.server.testing import server_process
from tests.model_export.test_pretrained_teacher import write_tokenizer

WORDS = sorted({w for words in VOCAB.values() for w in words} | {"the", "a", "of"})
LETTERS = "abcdefghijklmnopqrstuvwxyz"
TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *LETTERS, *(f"##{c}" for c in LETTERS)]
TINY = BertTextConfig(
    vocab_size=len(TOKENS), dim=32, depth=2, heads=4, mlp_dim=64, max_positions=16, max_length=128, num_classes=2,
    attention=AttentionConfig(kind="lara", num_landmarks=8, landmark_module="none"),
    readout="attention", window=14, cls_id=2, sep_id=3,  # as the shipped one: windows and a pool, not inherited
)  # fmt: skip
MAX_PIECES = 64  # --max-length of the run (the least the export takes): texts of 8-80 words, some cut
RUN = [
    "--threads",
    "1",
    "--quiet",
    "--time-budget",
    "10",
    "--clock",
    "wall",
]  # wall: in-process, the CPU clock counts the whole test session


def tiny_word_piece_dir(folder: Path) -> Path:
    """A random tiny bert_lara classifier folder (2 classes, float16 storage) with its tokenizer.json."""
    torch.manual_seed(0)
    model = build_model(TINY, seed=0)
    with torch.no_grad():  # weights of a realistic scale (the defaults leave LayerNorms at identity)
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    save_half(model.eval(), make_config_dict(folder.name, TINY, ["x", "y"], seed=0), folder)
    write_tokenizer(folder / "tokenizer.json", TOKENS)
    return folder


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("usertrain_pretrained")
    write_texts(root / "news.jsonl")
    tiny_word_piece_dir(root / "tiny-wp")
    rc = main([str(root / "news.jsonl"), "--out", str(root / "repo" / "news"), "--init", str(root / "tiny-wp"),
               "--max-length", str(MAX_PIECES), *RUN])  # fmt: skip
    assert rc == 0
    return root


@pytest.fixture(scope="module")
def live_url(work: Path) -> Iterator[str]:
    env = {"LARA_MODEL_REPOSITORY": str(work / "repo"), "LARA_NUM_THREADS": "1", "LARA_MAX_QUEUE_DELAY_MS": "1"}
    with server_process(["--log-level", "warning"], env=env) as url:
        yield url


def test_a_run_reading_past_the_whole_graph_serves_long_documents_on_its_sliced_program(work: Path) -> None:
    """--max-length above the --init model's own (128 pieces here, 16,384 for lara-text-news): the documents are
    read in windows of its learned positions, the whole graph keeps that length, a sliced program
    (export.sliced_windows, float) reads the longer documents, and the server's onnxruntime backend gives the
    torch model's answer for a document past the whole graph."""
    from lara_serve.server.backends.onnx_runtime import OnnxRuntimeBackend
    from lara_serve.server.preprocess import collate, text_item
    from lara_serve.server.repository import read_config

    out = work / "repo" / "long"
    rc = main([str(work / "news.jsonl"), "--out", str(out), "--init", str(work / "tiny-wp"), "--max-length", "400",
               *RUN])  # fmt: skip
    assert rc == 0
    conf = json.loads((out / "config.json").read_text())
    assert conf["model"]["max_length"] == conf["export"]["max_length"] == TINY.max_length == 128
    assert conf["preprocessing"]["max_length"] == 400 and conf["export"]["sliced"]["long_from"] == 128
    assert conf["model"]["window"] == TINY.max_positions - 2
    config = read_config(out)
    backend = OnnxRuntimeBackend(out, config, "cpu", num_threads=1)
    assert backend._sliced is not None and backend._sliced.long_from == 128
    text = " ".join(["goal", "match", "team", "bank", "profit"] * 60)  # 300 pieces: past the whole graph
    item = text_item(text.encode(), config.preprocessing, None)
    assert 128 < item.length <= 400 and not item.truncated
    got = backend.run_outputs(collate([item], config))
    with torch.inference_mode():
        logits, ood = load_pretrained(out, serving=True)(**_ids(out, text, 400))
    np.testing.assert_allclose(got.logits, logits.numpy(), rtol=0, atol=1e-4)
    assert float(got.ood_score[0]) == pytest.approx(float(ood[0]), rel=1e-3)


def _ids(folder: Path, text: str, max_pieces: int) -> dict[str, torch.Tensor]:
    ids = torch.tensor([WordPieces.from_dir(folder).encode(text, max_pieces)])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def test_the_folder_is_a_word_piece_model_with_the_frozen_encoder(work: Path) -> None:
    out = work / "repo" / "news"
    conf = json.loads((out / "config.json").read_text())
    assert conf["model"]["arch"] == "bert_lara" and conf["model"]["readout"] == "layers"
    assert conf["model"]["num_classes"] == 3 and conf["labels"] == ["money", "sport", "tech"]
    assert conf["preprocessing"] == {"kind": "wordpiece", "max_length": MAX_PIECES, "pad_id": 0,
                                     "tokenizer": "tokenizer.json", "truncate": "head"}  # fmt: skip
    assert (out / "tokenizer.json").read_bytes() == (work / "tiny-wp" / "tokenizer.json").read_bytes()
    assert conf["export"]["lara_nodes"] == TINY.depth and conf["export"]["output_names"] == ["logits", "ood_score"]
    # Frozen: every encoder tensor is the --init model's, bit for bit; the head is new (3 classes, not 2).
    mine, init = (
        load_file(str(out / "1" / "model.safetensors")),
        load_file(str(work / "tiny-wp" / "1" / "model.safetensors")),
    )
    encoder = [k for k in init if k.startswith("encoder.")]
    assert encoder and all(torch.equal(mine[k].float(), init[k].float()) for k in encoder)
    # the head reads every hidden state's mean (embeddings + each layer); the ood score the last one's
    assert mine["head.weight"].shape == (3, TINY.dim * (TINY.depth + 1)) and "serving.ood_whiten" in mine
    assert mine["serving.ood_whiten"].shape[-1] == TINY.dim
    training = conf["training"]
    assert training["init"] == str(work / "tiny-wp") and training["augment"] is False
    assert training["schedule"].startswith("none") and training["head"]["C"] in pretrained_init.LAYERS_C_GRID
    assert training["pieces"]["longer_than_max_length"]["train"] > 0  # 8-80 words, read up to 64 pieces
    assert set(training["phases_s"]) >= {"probe", "wide", "baseline", "embedding", "head", "serving head", "export"}
    assert training["budget_plan_s"]["seconds_per_piece"] > 0 and training["run_s"] <= 600
    assert training["ood_fit"]["documents"] == 36 and conf["ood"]["threshold"] > 0


def test_the_report_names_the_served_part_and_scores_each(work: Path) -> None:
    out = work / "repo" / "news"
    conf, report = json.loads((out / "config.json").read_text()), json.loads((out / "report.json").read_text())
    parts = conf["metrics"]["parts"]
    served = parts["served"]
    assert served["part"] in ("blend", "wide", "encoder") and parts["wide"]["grams"] == "word-piece 1-2-grams"
    # The holdout's best part is served: no part scores above it there (ties go to the lower NLL).
    hold = {key: parts[key]["holdout_accuracy"] for key in ("blend", "wide", "encoder")}
    assert hold[served["part"]] == max(hold.values())
    # What is served is what the report scored on the test split (the temperature keeps argmax).
    assert parts[served["part"]]["test_accuracy"] == report["lara"]["accuracy"]
    # A served wide path is in the graph: config and weights say so; the encoder alone leaves none.
    state = load_file(str(out / "1" / "model.safetensors"))
    if served["wide_weight"]:
        assert conf["model"]["tfidf_buckets"] == parts["wide"]["buckets"] and "tfidf.weight" in state
    else:
        assert conf["model"]["tfidf_buckets"] == 0 and "tfidf.weight" not in state
    assert report["baseline"]["name"].startswith("TF-IDF")
    md = (out / "report.md").read_text()
    assert f"| {served['part'] if served['part'] != 'wide' else 'wide path'} (served) |" in md
    assert "word-piece 1-2-grams, hashed tf-idf" in md
    assert "Recipe: frozen tiny-wp encoder + logistic-regression head" in md


def test_the_head_was_fitted_on_what_the_served_graph_computes(work: Path) -> None:
    """The report's test predictions come from embeddings batched by length; the model read one document at a
    time must predict the same (the head would otherwise be fitted on other features than it is served)."""
    out = work / "repo" / "news"
    model = load_pretrained(out)
    split = json.loads((out / "split.json").read_text())
    rows = (work / "news.jsonl").read_text().splitlines()
    texts = [json.loads(rows[int(i.split()[1]) - 1])["text"] for i in split["ids"]["test"]]
    with torch.inference_mode():
        alone = [int(model(**_ids(out, t, MAX_PIECES)).argmax()) for t in texts]
    assert alone == json.loads((out / "report.json").read_text())["predictions"]["lara"]


def test_served_by_the_onnx_backend_as_torch_computes_it(work: Path, live_url: str) -> None:
    out = work / "repo" / "news"
    text = "the bank and the market: stock price and profit"
    long = " ".join(["goal", "match", "team"] * 30)  # 90 pieces > 64: read by its head, as in training
    with LaraClient(live_url) as client:
        got = client.classify("news", text, top_k=3)
        head = client.classify("news", long, truncate="head", top_k=3)
    with httpx.Client(base_url=live_url, timeout=30) as http:
        silent = http.post("/v1/models/news:predict", json={"instances": [long]}).json()["predictions"][0]
    with torch.inference_mode():
        logits, ood = load_pretrained(out, serving=True)(**_ids(out, text, MAX_PIECES))
    probs = torch.softmax(logits, -1)[0].numpy()
    labels = ["money", "sport", "tech"]
    assert got.label == labels[int(np.argmax(probs))]
    assert {t.label: t.score for t in got.top_k} == pytest.approx(
        dict(zip(labels, probs.tolist(), strict=True)), abs=1e-4
    )
    assert got.ood_score == pytest.approx(float(ood[0]), rel=1e-3)
    assert head.truncated and silent["truncated"] is True and silent["score"] == pytest.approx(head.score, abs=1e-6)


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_the_shipped_name_resolves_to_its_frozen_encoder(tmp_path: Path) -> None:
    if not (SHIPPED / "lara-text-news" / "1" / "model.safetensors").is_file():
        pytest.skip("lara-text-news is not in model_repository/")
    write_texts(tmp_path / "d.jsonl")
    argv = [str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "m")]
    assert pretrained_init.applies(_args([*argv, "--init", "lara-text-news"]))
    assert not any(pretrained_init.applies(_args([*argv, *more])) for more in ([], ["--init", "none"],
                                                                                 ["--init", "lara-text-news-bytes"]))  # fmt: skip
    prep = prepare(_args([*argv, "--init", "lara-text-news"]))
    assert isinstance(prep, pretrained_init.Frozen) and prep.init == SHIPPED / "lara-text-news"
    shipped = load_pretrained(SHIPPED / "lara-text-news")
    assert prep.cfg == dataclasses.replace(shipped.cfg, num_classes=3, readout="layers", window=0, window_gate=0.0)
    # past the shipped encoder's 16,384 pieces: windows of its 510 learned positions (a sliced program's unit)
    longer = prepare(_args([*argv, "--init", "lara-text-news", "--max-length", "65536"]))
    assert isinstance(longer, pretrained_init.Frozen)
    assert longer.cfg == dataclasses.replace(prep.cfg, window=510, max_length=65536)
    assert all(torch.equal(a, b) for a, b in zip(prep.model.encoder.state_dict().values(),
                                                   shipped.encoder.state_dict().values(), strict=True))  # fmt: skip
    assert not any(p.requires_grad for p in prep.model.parameters()) and not (tmp_path / "m").exists()
    # No --init: the default text encoder is this one; an option of the byte encoder's training picks that one.
    default = prepare(_args(argv))
    assert isinstance(default, pretrained_init.Frozen) and default.init == SHIPPED / "lara-text-news"
    assert default.hp["init_choice"].startswith("the default: lara-text-news frozen")
    byte = prepare(_args([*argv, "--epochs", "1"]))
    assert not isinstance(byte, pretrained_init.Frozen) and byte.hp["init_choice"].startswith("--epochs")


def test_a_budget_too_small_for_the_shipped_encoder_names_the_least(tmp_path: Path, capsys) -> None:
    if not (SHIPPED / "lara-text-news" / "1" / "model.safetensors").is_file():
        pytest.skip("lara-text-news is not in model_repository/")
    write_texts(tmp_path / "d.jsonl")
    rc = main([str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "m"), "--init", "lara-text-news",
               "--time-budget", "0.2", "--clock", "cpu", "--threads", "1", "--quiet"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "too small for the frozen lara-text-news encoder" in err and "word pieces" in err
    least = float(err.rsplit("use --time-budget ", 1)[1].split()[0])
    assert least >= pretrained_init.EXPORT_S / 60 and not (tmp_path / "m").exists()
    assert not (tmp_path / ".m.lara-train").exists()


@pytest.mark.parametrize(
    ("more", "message"),
    [
        (["--pooling", "passages"], "--pooling passages does not apply to --init lara-text-news"),
        (["--no-case-fold"], "--no-case-fold does not apply to --init lara-text-news: its word-piece tokenizer"),
        (["--epochs", "2"], "--epochs does not apply"),
        (["--resume"], "--resume does not apply"),
        (["--no-augment"], "--no-augment does not apply"),
        (["--max-length", "32"], "--max-length must be at least 64 (the export traces 64 tokens), got 32"),
        ("images", "is a word-piece text encoder and"),
    ],
)
def test_options_and_data_that_do_not_apply_are_usage_errors(tmp_path: Path, capsys, more, message: str) -> None:
    if more == "images":
        write_images(tmp_path / "data")
        data, more = tmp_path / "data", []
    else:
        data = tmp_path / "d.jsonl"
        write_texts(data)
    rc = main([str(data), "--out", str(tmp_path / "m"), "--init", "lara-text-news", "--quiet", *more])
    assert rc == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "m").exists() and not (tmp_path / ".m.lara-train").exists()


def test_a_binary_head_becomes_two_columns_with_the_same_probabilities() -> None:
    from sklearn.linear_model import LogisticRegression

    g = np.random.default_rng(0)
    x, y = g.standard_normal((40, 5)), np.arange(40) % 2
    clf = LogisticRegression().fit(x, y)
    w, b = pretrained_init.two_columns(torch.tensor(clf.coef_), torch.tensor(clf.intercept_), 2)
    assert w.shape == (2, 5) and b.shape == (2,)
    probs = torch.softmax(torch.from_numpy(x) @ w.T + b, -1).numpy()
    np.testing.assert_allclose(probs, clf.predict_proba(x), atol=1e-12)
    same = torch.ones(3, 5), torch.zeros(3)
    assert pretrained_init.two_columns(*same, 3) == same


def test_a_budget_too_small_to_read_whole_reads_each_documents_head(tmp_path: Path, monkeypatch, capsys) -> None:
    """No --max-length: the plan falls back to the longest of FIT_LENGTHS that fits, and the config reads as much;
    with --max-length given, or no length fitting, the budget is refused before any work."""
    write_texts(tmp_path / "d.jsonl")
    tiny = tiny_word_piece_dir(tmp_path / "tiny-wp")  # max_length 128 pieces; the texts are 10-90
    monkeypatch.setattr(pretrained_init, "FIT_LENGTHS", (64,))
    monkeypatch.setattr(pretrained_init, "probe_rate", lambda prep, clock: 0.5)  # s per piece: reading dominates
    argv = [str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "m"), "--init", str(tiny)]

    def planned(more: list[str], minutes: float) -> pretrained_init.Frozen:
        prep = prepare(_args([*argv, *more]))
        pretrained_init.plan(prep, pretrained_init.budget.Phases(clock=lambda: 0.0), minutes, "cpu")
        return prep

    probe = planned([], 1e6)  # everything fits: read whole
    assert probe.cfg.max_length == 128 and "length_fitted_to_budget" not in probe.hp
    whole, head = (pretrained_init._estimate_at(probe, 0.5, 0.0, n) for n in (128, 64))
    assert head < whole
    capsys.readouterr()
    prep = planned([], head)
    assert prep.cfg.max_length == 64 and prep.model.cfg.max_length == 64
    assert prep.hp["length_fitted_to_budget"] == {"max_length": 64, "whole": 128}
    assert all(len(s) <= 64 and s[-1] == TINY.sep_id for seqs in prep.seqs.values() for s in seqs)
    assert max(map(len, probe.seqs["train"])) > 64  # some documents were cut
    err = capsys.readouterr().err
    assert "reads each document's first 64 pieces" in err and f"--time-budget {whole:g} to read them whole" in err
    for more, minutes in (([], head - 0.1), (["--max-length", "128"], head)):
        with pytest.raises(pretrained_init.BudgetTooSmall):
            planned(more, minutes)


# --int8 needs projections stored as float16, as the shipped encoder's are: weights of 65,536 values at least
# (pretrained.classifier.HALF_MIN_ELEMENTS), so one layer of width 256.
WIDE = dataclasses.replace(TINY, dim=256, mlp_dim=256, depth=1, heads=4)


def wide_word_piece_dir(folder: Path) -> Path:
    """tiny_word_piece_dir's model at width 256, its weights rounded to float16 (as the converted encoder's are:
    exact in float16, so stored and exported so, and quantized); made once per folder."""
    if (folder / "config.json").is_file():
        return folder
    torch.manual_seed(0)
    model = build_model(WIDE, seed=0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    round_to_half(model)
    save_half(model.eval(), make_config_dict(folder.name, WIDE, ["x", "y"], seed=0), folder)
    write_tokenizer(folder / "tokenizer.json", TOKENS)
    return folder


def test_int8_serves_a_quantized_graph_whose_own_answers_are_reported(work: Path) -> None:
    """--int8: the graph's encoder projections are int8 but the query and key ones (as lara-text-news's), the
    temperature in the graph is the one config.json reports, and the reported test accuracy, predictions and ood
    pass rate are those of the served int8 graph, read here through the server's onnxruntime backend."""
    from lara_serve.model_export.export.quantize import scalar_initializer
    from lara_serve.server.backends.onnx_runtime import OnnxRuntimeBackend
    from lara_serve.server.preprocess import collate, text_item
    from lara_serve.server.repository import read_config

    init = wide_word_piece_dir(work / "wide-wp")
    out = work / "int8" / "news"
    rc = main([str(work / "news.jsonl"), "--out", str(out), "--init", str(init), "--max-length", str(MAX_PIECES),
               "--int8", *RUN])  # fmt: skip
    assert rc == 0
    conf = json.loads((out / "config.json").read_text())
    quant = conf["export"]["quantization"]
    assert quant["quantized_matmuls"] == 4 and quant["float_matmuls"] == 2  # v, o and the MLP's two; q and k float
    graph = onnx.load(out / "1" / "model.onnx")
    assert sum(n.op_type == "MatMulInteger" for n in graph.graph.node) == 4
    assert sum(n.op_type == "LaraAttention" for n in graph.graph.node) == WIDE.depth
    assert conf["calibration"]["temperature"] == pytest.approx(scalar_initializer(out / "1" / "model.onnx",
                                                                                  "temperature"), abs=1e-4)  # fmt: skip
    assert conf["metrics"]["graph"].startswith("int8") and "test_accuracy" in conf["metrics"]["float_graph"]
    assert conf["training"]["command"].endswith("--int8") or " --int8 " in conf["training"]["command"]

    rows = [json.loads(line) for line in (work / "news.jsonl").read_text().splitlines() if line.strip()]
    test_ids = json.loads((out / "split.json").read_text())["ids"]["test"]
    texts = [rows[int(i.split()[1]) - 1]["text"] for i in test_ids]
    config = read_config(out)
    backend = OnnxRuntimeBackend(out, config, "cpu", num_threads=1)
    got = [backend.run_outputs(collate([text_item(t.encode(), config.preprocessing, None)], config)) for t in texts]
    served = [int(np.argmax(g.logits[0])) for g in got]
    report = json.loads((out / "report.json").read_text())
    assert report["predictions"]["lara"] == served
    truth = report["predictions"]["true"]
    assert conf["metrics"]["test_accuracy"] == pytest.approx(np.mean(np.asarray(served) == np.asarray(truth)))
    passed = np.mean([float(g.ood_score[0]) <= conf["ood"]["threshold"] for g in got])
    assert conf["ood"]["test_in_distribution_rate"] == pytest.approx(passed, abs=1e-4)

    # benchmarks.train_int8_cost reads the same test documents (split.json) through a float run and this one
    from benchmarks.train_int8_cost import main as cost

    result = cost(["--float", str(work / "repo" / "news"), "--int8", str(out), "--data", str(work / "news.jsonl"),
                   "--lengths", "64", "--repeats", "2", "--out", str(work / "int8" / "cost.json")])  # fmt: skip
    assert result["test"]["n"] == len(texts) and result["test"]["int8"]["accuracy"] == conf["metrics"]["test_accuracy"]
    assert result["lengths"][0]["n"] == 2 and result["lengths"][0]["read"] == MAX_PIECES


def test_int8_past_the_whole_graph_reads_on_an_int8_program_with_the_graph_temperature(work: Path) -> None:
    """--int8 with --max-length above the --init model's: the sliced program is int8 as the whole graph is, its
    readout divides by the int8 graph's refitted temperature, and a document past the whole graph gets the label
    the whole graph gives it."""
    from lara_serve.model_export.export.quantize import scalar_initializer, set_initializer
    from lara_serve.model_export.pretrained.int8 import refresh_sliced_program
    from lara_serve.server.backends.onnx_runtime import OnnxRuntimeBackend
    from lara_serve.server.preprocess import collate, text_item
    from lara_serve.server.repository import read_config

    def readout_temperature(folder: Path) -> float:  # 1 where the export folded a division by 1 away
        try:
            return scalar_initializer(folder / "1" / "sliced" / "readout.onnx", "serving.temperature")
        except ValueError:
            return 1.0

    out = work / "int8" / "long"
    rc = main([str(work / "news.jsonl"), "--out", str(out), "--init", str(wide_word_piece_dir(work / "wide-wp")),
               "--max-length", "400", "--int8", *RUN])  # fmt: skip
    assert rc == 0
    conf = json.loads((out / "config.json").read_text())
    assert conf["export"]["sliced"]["int8"] is True and conf["export"]["sliced"]["long_from"] == WIDE.max_length
    graph_t = scalar_initializer(out / "1" / "model.onnx", "temperature")
    assert graph_t == pytest.approx(conf["calibration"]["temperature"], abs=1e-4)
    assert readout_temperature(out) == graph_t
    # a holdout this small has no errors (T kept at 1): another temperature in the graph, as a refit would set,
    # and the program re-exported for it (pretrained.int8.refresh_sliced_program) divides by it, int8 again
    set_initializer(out / "1" / "model.onnx", "temperature", 1.7)
    assert refresh_sliced_program(out) and readout_temperature(out) == pytest.approx(1.7)
    assert json.loads((out / "config.json").read_text())["export"]["sliced"]["int8"] is True
    config = read_config(out)
    backend = OnnxRuntimeBackend(out, config, "cpu", num_threads=1)
    assert backend._sliced is not None
    item = text_item(" ".join(["goal", "match", "team", "bank", "profit"] * 60).encode(), config.preprocessing, None)
    assert WIDE.max_length < item.length <= 400
    sliced = backend.run_outputs(collate([item], config)).logits[0]
    whole = backend.session.run(None, {"input_ids": item.arrays["input_ids"][None],
                                       "attention_mask": np.ones((1, item.length), dtype=np.int64)})[0][0]  # fmt: skip
    assert int(np.argmax(sliced)) == int(np.argmax(whole))


def test_int8_applies_only_to_a_frozen_word_piece_encoder(tmp_path: Path, capsys) -> None:
    write_texts(tmp_path / "d.jsonl")
    rc = main([str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "m"), "--init", "none", "--int8", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "--int8 quantizes a frozen word-piece encoder" in err and "drop --int8" in err
    assert not (tmp_path / "m").exists() and not (tmp_path / ".m.lara-train").exists()


def test_the_budget_counts_the_int8_step(work: Path, monkeypatch, capsys) -> None:
    """With --int8 the estimate of what follows the embedding grows by the quantization and the int8 graph's
    reading of the holdout and test documents; a budget too small says so."""
    monkeypatch.setattr(pretrained_init, "probe_rate", lambda prep, clock: 1e-3)  # the same rate for both runs
    after = {}
    for more in ([], ["--int8"]):
        rc = main([str(work / "news.jsonl"), "--out", str(work / "small"), "--init", str(work / "tiny-wp"),
                   "--time-budget", "0.01", "--threads", "1", "--quiet", *more])  # fmt: skip
        err = capsys.readouterr().err
        assert rc == 2 and ("the int8 step" in err) == bool(more)
        after[bool(more)] = float(err.split(" and report ")[1].split(" s)")[0])
    assert after[True] - after[False] >= pretrained_init.INT8_S - 1
