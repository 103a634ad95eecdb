"""The shipped `lara-text-news`: its files (under 50 MB each; float16 weights that load to float32, an int8
served graph), its graph (one LaraAttention node per layer, the 36 encoder projections int8), the int8 graph
against the float weights, the server's word pieces equal to the teacher's tokenizer, and its accuracy on a
fixed slice of the BBC test split through onnxruntime, as the server runs it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from lara_serve.kernels import onnx_export
from lara_serve.model_export.export.exporter import make_session
from lara_serve.server.preprocess import IDS, text_item
from lara_serve.server.repository import TextPreprocessing, read_config

MODEL = Path(__file__).resolve().parents[2] / "model_repository" / "lara-text-news"
MB = 2**20


def test_files_and_graph() -> None:
    conf = json.loads((MODEL / "config.json").read_text())
    assert conf["model"]["arch"] == "bert_lara" and conf["attention"]["kind"] == "lara"
    # the served int8 graph's (95.82%) and the float weights' (96.29%): BBC test split, whole
    assert conf["metrics"]["test_accuracy"] >= 0.955 and conf["metrics"]["n_test"] == 431
    assert conf["metrics"]["float_graph"]["test_accuracy"] >= 0.95  # the unquantized weights (95.36%)
    for name in ("1/model.onnx", "1/model.safetensors", "tokenizer.json"):
        assert (MODEL / name).stat().st_size < 50 * MB, name
    proto = onnx.load(str(MODEL / "1" / "model.onnx"), load_external_data=False)
    assert onnx_export.count_lara_nodes(proto) == conf["model"]["depth"] == 6
    # v, out, up, down of every layer: int8, q and k float32 (model_export/pretrained/int8.py); the word and position
    # embedding tables stay float16, widened by a Cast
    assert (
        sum(n.op_type == "MatMulInteger" for n in proto.graph.node)
        == 6 * 4
        == conf["export"]["quantization"]["quantized_matmuls"]
    )
    halves = {i.name for i in proto.graph.initializer if i.data_type == onnx.TensorProto.FLOAT16}
    assert "model.encoder.embeddings.words.weight__float16" in halves, halves  # 23 MB of the file's 38
    casts = {n.output[0] for n in proto.graph.node if n.op_type == "Cast"}
    float_projections = [n for n in proto.graph.node if n.op_type == "MatMul" and n.input[1] in casts]
    assert len(float_projections) == 6 * 2 == conf["export"]["quantization"]["float_matmuls"]  # q and k
    temperature = next(i for i in proto.graph.initializer if i.name == "temperature")
    assert float(onnx.numpy_helper.to_array(temperature)) == pytest.approx(conf["calibration"]["temperature"], abs=1e-4)


def test_server_word_pieces_equal_the_teachers_tokenizer() -> None:
    teacher = pytest.importorskip("lara_serve.model_export.pretrained.teacher")
    try:
        tok = teacher.WordPieces.from_dir(teacher.teacher_dir())
    except teacher.TeacherUnavailable as exc:
        pytest.skip(str(exc))
    prep = read_config(MODEL).preprocessing
    assert isinstance(prep, TextPreprocessing) and prep.kind == "wordpiece"
    text = 'Shares in Ünïcode Corp. rose 12% on Monday; the CEO said: "We\'re pleased."\n\nMore later.'
    assert text_item(text.encode(), prep, None).arrays[IDS].tolist() == tok.encode(text)


@pytest.mark.timeout(300)
def test_accuracy_on_every_tenth_test_document(news_test) -> None:
    """Every tenth BBC test document (44), whole: all but at most three right (the whole split: 95.82%, so 1.8
    wrong expected here; the model trained with other sources gets 41)."""
    prep = read_config(MODEL).preprocessing
    session = make_session(MODEL / "1" / "model.onnx", threads=2)
    docs = news_test[::10]
    right = 0
    for doc in docs:
        ids = text_item(doc.text.encode(), prep, "head").arrays[IDS][None]
        logits, ood = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        right += int(logits.argmax() == doc.label)
        assert np.isfinite(ood).all()
    assert len(docs) == 44 and right >= len(docs) - 3


@pytest.mark.timeout(300)
def test_an_article_inside_unrelated_text_keeps_its_topic(news_test) -> None:
    """Every twentieth BBC test document (22) with 10 KB of the trainer's filler before or after it: read in
    510-piece windows with a filler-trained attention pool, the article still decides (the build's holdout:
    90.0% at 10 KB, n=60; the mean pool read whole scored 26% on the robustness suite's filler)."""
    import random

    from lara_serve.model_export.training.augment import FillerBank, insert_filler

    prep = read_config(MODEL).preprocessing
    session = make_session(MODEL / "1" / "model.onnx", threads=2)
    bank, rng = FillerBank.installed(), random.Random(7)
    right = 0
    for doc in news_test[::20]:
        raw = insert_filler(doc.text.encode(), bank.sample(rng, 10 * 1024), rng.choice(["start", "end"]), rng)
        ids = text_item(raw.decode("utf-8", "ignore").encode(), prep, "head").arrays[IDS][None]
        right += int(
            session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0].argmax() == doc.label
        )
    assert right >= 17, f"{right} of 22 right"


@pytest.mark.timeout(300)
def test_int8_graph_against_the_float_weights(news_test) -> None:
    """Every fortieth BBC test document (11), whole, through the served int8 graph and the float32 PyTorch model
    of 1/model.safetensors: same class, probabilities within 0.15 (int8 weights with a scale per output channel
    keep about 2.5 significant digits of each weight, and the uint8 activations about as many; six layers add
    the errors up. The build measured a mean |dp| of 0.010 on 1,724 test items and at most 0.38, on ten-piece
    headlines; a whole article pools hundreds of pieces, whose errors partly cancel: config.json
    export.quantization), ood_score within 15% relative (the build: a median rise of 2%, which the refitted
    threshold absorbs)."""
    import torch

    from lara_serve.model_export.models.hub import load_pretrained

    prep = read_config(MODEL).preprocessing
    session = make_session(MODEL / "1" / "model.onnx", threads=2)
    reference = load_pretrained(MODEL, serving=True)
    conf = json.loads((MODEL / "config.json").read_text())
    float_temperature = float(reference.temperature)
    scale = float_temperature / conf["calibration"]["temperature"]  # the int8 head's refitted temperature
    for doc in news_test[::40]:
        ids = text_item(doc.text.encode(), prep, "head").arrays[IDS][None]
        logits, ood = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        with torch.no_grad():
            ref_logits, ref_ood = reference(
                input_ids=torch.from_numpy(ids), attention_mask=torch.ones_like(torch.from_numpy(ids))
            )
        p_int8 = torch.softmax(torch.from_numpy(logits).double() / scale, -1)
        p_ref = torch.softmax(ref_logits.double(), -1)
        assert int(p_int8.argmax()) == int(p_ref.argmax())
        assert float((p_int8 - p_ref).abs().max()) < 0.15
        assert abs(float(ood[0]) / float(ref_ood[0]) - 1) < 0.15


def test_the_torch_backend_reads_the_float_weights_at_their_own_calibration(news_test) -> None:
    """The torch backend serves the float weights. Their stored temperature (1.049) is the float head's from
    before the int8 step gave other sources half the say; config.json calibration.temperature_float_graph (that
    say, without the int8 ratio: 0.9395) is the one it applies, and its ood threshold is the float head's. So
    the two backends agree as closely as int8 and float weights do: on every twentieth test document (22) a
    median max |dp| of 3e-4 (1.049 gave 3.1e-3 on the first 40)."""
    from lara_serve.server.backends.onnx_runtime import OnnxRuntimeBackend
    from lara_serve.server.backends.pytorch import TorchBackend
    from lara_serve.server.preprocess import collate

    config = read_config(MODEL)
    conf = json.loads((MODEL / "config.json").read_text())
    torch_backend = TorchBackend(MODEL, config, "cpu")
    assert float(torch_backend.module.temperature) == pytest.approx(conf["calibration"]["temperature_float_graph"])
    assert config.ood_threshold_of("torch") == conf["ood"]["threshold_float_graph"]
    onnx_backend = OnnxRuntimeBackend(MODEL, config, "cpu", num_threads=2)
    diffs = []
    for doc in news_test[::20]:
        batch = collate([text_item(doc.text.encode(), config.preprocessing, None)], config)
        p = [np.exp(z - z.max()) / np.exp(z - z.max()).sum()
             for z in (b.run_outputs(batch).logits[0] for b in (torch_backend, onnx_backend))]  # fmt: skip
        diffs.append(float(np.abs(p[0] - p[1]).max()))
    assert float(np.median(diffs)) < 1e-3


def test_ood_score_flags_one_piece_texts_and_machine_text_not_articles(news_test) -> None:
    """ "a" (one word piece: config min_pieces 2) and a server log are out of distribution; wrapped and plain
    test articles are in (research/minilm_ood_probe.py: logs, JSON dumps, base64, chat logs, random bytes,
    lorem, non-English 100% flagged, code 92.5%; wrapped articles 97.5-100% in)."""
    conf = json.loads((MODEL / "config.json").read_text())
    threshold = conf["ood"]["threshold"]
    prep = read_config(MODEL).preprocessing
    session = make_session(MODEL / "1" / "model.onnx", threads=2)

    def score(text: str) -> float:
        ids = text_item(text.encode(), prep, "head").arrays[IDS][None]
        return float(session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[1][0])

    log = "".join(
        f"2026-03-0{i % 9 + 1} 10:{i:02d}:07,311 INFO [worker-{i % 4}] GET /api/v1/items/{1000 + 37 * i} "
        f"status=200 latency_ms={i * 7 % 300}\n"
        for i in range(40)
    )
    assert conf["model"]["min_pieces"] == 2
    assert score("a") > threshold and score(log) > threshold
    assert score("Shares in the bank rose after profits beat forecasts.") < 1e6  # two or more pieces: its features
    articles = [score(doc.text) for doc in news_test[::40]]
    assert sum(s <= threshold for s in articles) >= len(articles) - 1


# Written for this test: a speech and a debate report (politics from outside BBC's style), and software
# descriptions (tech as package indexes write it). The model before --topic-sources called the third speech
# business (0.50); research/new_sources_probe.py measures the same on hundreds of installed texts.
OTHER_SOURCES = {
    "politics": [
        "My fellow citizens, tonight I ask this Congress to pass a budget that protects working families, secures "
        "our borders and keeps faith with the men and women who serve in uniform. Together we can build a stronger "
        "union for our children.",
        "The senator told the chamber that the bill would be voted on before the recess, and the opposition promised "
        "to fight every amendment that cut funding for schools and hospitals.",
        "We have cut taxes for the middle class, and I urge the Congress to make those cuts permanent. We must also "
        "reform our immigration laws and protect Social Security for the next generation.",
    ],
    "tech": [
        "A lightweight command-line utility for synchronising files between directories over SSH. It supports "
        "incremental transfers, compression and exclusion patterns, and is written in portable C.",
        "This library provides a fast JSON parser and serializer with streaming support, schema validation and "
        "bindings for Python and Rust. Install it with pip and import it in your application.",
        "An open-source web server designed for high concurrency. It features an event-driven architecture, TLS "
        "termination, HTTP/2 support and a plugin system for custom modules.",
    ],
}


def test_speeches_and_software_descriptions_keep_their_topic() -> None:
    from lara_serve.model_export.models.registry import NEWS_LABELS

    conf = json.loads((MODEL / "config.json").read_text())
    assert conf["training"]["topic_sources"]["sotu"] > 0 and conf["training"]["topic_sources"]["python_description"] > 0
    prep = read_config(MODEL).preprocessing
    session = make_session(MODEL / "1" / "model.onnx", threads=2)
    for label, texts in OTHER_SOURCES.items():
        for text in texts:
            ids = text_item(text.encode(), prep, "head").arrays[IDS][None]
            logits = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0][0]
            assert NEWS_LABELS[int(np.argmax(logits))] == label, text


def test_sliced_program_belongs_to_the_served_graph() -> None:
    """1/sliced/ (export.sliced_windows): exported for this model.onnx (the server refuses a program whose sha256
    differs, and a document past long_from would then run on the whole graph, GBs at 1 MiB), taking over where
    the whole graph's export ends, with its int8 windows graph under 50 MB."""
    from lara_serve.model_export.export.quantize import scalar_initializer
    from lara_serve.server.backends.pytorch import file_digests

    conf = json.loads((MODEL / "config.json").read_text())
    spec = json.loads((MODEL / "1" / "sliced" / "manifest.json").read_text())
    onnx_path = MODEL / "1" / "model.onnx"
    assert spec["model_onnx_sha256"] == file_digests([onnx_path])[onnx_path]
    assert spec["long_from"] == conf["export"]["max_length"] == 16384
    # the server accepts ~1 MiB of English; the model's own max_length stays the whole graph's (and training's)
    assert conf["preprocessing"]["max_length"] == 262144 and conf["model"]["max_length"] == 16384
    assert spec["chunk"] % conf["model"]["window"] == 0
    assert max(r["max_abs_diff"] for r in spec["parity"]["cases"]) < 1e-4  # the float program against torch
    assert spec["quantization"]["quantized_matmuls"] == 6 * 4
    # the program's probabilities are the whole graph's: the same temperature, the int8 head's refitted one (the
    # program was first exported with the float weights' 1.049 against the graph's 0.943)
    readout_t = scalar_initializer(MODEL / "1" / "sliced" / "readout.onnx", "serving.temperature")
    assert readout_t == scalar_initializer(onnx_path, "temperature")
    assert readout_t == pytest.approx(conf["calibration"]["temperature"], abs=1e-4)
    assert (MODEL / "1" / "sliced" / "windows.onnx").stat().st_size < 50 * MB


@pytest.mark.timeout(300)
def test_documents_past_the_whole_graph_run_on_the_program(news_test, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the server's onnxruntime backend: a document of at most long_from pieces runs on the whole graph,
    and the program reading it agrees (both int8; each computes its activation scales over what one call
    reads, so they differ by rounding: max class-probability difference 4.1e-4 over 40 composites of 48 KB in
    benchmarks/results/minilm_long.json, 2e-3 allowed); a longer one runs on the program, alone."""
    from lara_serve.server.backends.onnx_runtime import OnnxRuntimeBackend
    from lara_serve.server.preprocess import collate

    config = read_config(MODEL)
    backend = OnnxRuntimeBackend(MODEL, config, "cpu", num_threads=2)
    program = backend._sliced
    assert program is not None and program.long_from == 16384
    by_label = [d for d in news_test if d.label == 2][:12]
    short = "\n\n".join(d.text for d in by_label[:3]).encode()
    item = text_item(short, config.preprocessing, None)
    assert 1000 < item.length <= program.long_from
    whole = backend.run_outputs(collate([item], config))
    sliced = program.run(item.arrays[IDS])
    p_whole, p_sliced = (
        np.exp(z - z.max()) / np.exp(z - z.max()).sum() for z in (whole.logits[0], sliced["logits"][0])
    )
    assert np.abs(p_whole - p_sliced).max() < 2e-3
    assert abs(float(whole.ood_score[0]) - float(sliced["ood_score"][0])) < 0.01 * max(
        1.0, abs(float(whole.ood_score[0]))
    )

    calls: list[int] = []
    run = program.run
    monkeypatch.setattr(program, "run", lambda ids: calls.append(len(ids)) or run(ids))
    text = "\n\n".join(d.text for d in by_label).encode()
    long = text_item(text * (-(-4 * program.long_from // text_item(text, config.preprocessing, None).length)),
                     config.preprocessing, None)  # fmt: skip
    assert program.long_from < long.length <= config.preprocessing.max_length
    out = backend.run_outputs(collate([item, long], config))  # one batch: each row by its own length
    assert calls == [long.length]
    np.testing.assert_array_equal(out.logits[0], whole.logits[0])  # the short row: the whole graph, as before
    assert int(out.logits[1].argmax()) == 2  # twelve articles of one topic, repeated: that topic
