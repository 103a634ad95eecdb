"""`lara train` end to end at tiny sizes: data -> model folder -> served by a live server -> classified.

One text model (JSONL) and one image model (a folder of RGB PNGs of two sizes, added to the running server
with --load-into) are trained once per module; the other tests reuse them or fail before training.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from user_samples import TINY_IMAGE, TINY_TEXT, VOCAB, text_inputs, torch_probs, write_images, write_texts

from lara_serve.clients.__main__ import main as lara
from lara_serve.clients.client import LaraClient
from lara_serve.model_export.models.registry import build_model, get_config
from lara_serve.model_export.training.long_docs import LengthMixTask
from lara_serve.model_export.your_data import fit as userfit
from lara_serve.model_export.your_data.command import main as train_main
from lara_serve.server.testing import server_process
from tests.digests import sha256


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("usertrain")
    write_texts(root / "news.jsonl")
    write_images(root / "images")
    rc = train_main([str(root / "news.jsonl"), "--out", str(root / "repo" / "news"), *TINY_TEXT, "--epochs", "3",
                     "--lr", "3e-3"])  # fmt: skip
    assert rc == 0
    return root


@pytest.fixture(scope="module")
def live_url(work: Path) -> Iterator[str]:
    env = {"LARA_MODEL_REPOSITORY": str(work / "repo"), "LARA_MODEL_CONTROL": "explicit", "LARA_NUM_THREADS": "1",
           "LARA_MAX_QUEUE_DELAY_MS": "1"}  # fmt: skip
    with server_process(["--log-level", "warning"], env=env) as url:
        yield url


def test_text_model_folder_is_complete(work: Path) -> None:
    out = work / "repo" / "news"
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "1", "split.json", "report.json", "report.md", "confusion.png", "reliability.png",
            "training.png", "accuracy_by_length.png"} <= files  # fmt: skip
    assert {p.name for p in (out / "1").iterdir()} == {"model.onnx", "model.safetensors"}
    conf = json.loads((out / "config.json").read_text())
    assert conf["name"] == "news" and conf["labels"] == ["money", "sport", "tech"] and conf["task"] == "text"
    assert conf["preprocessing"]["max_length"] == 1024 and conf["export"]["lara_nodes"] == 1
    assert conf["split"]["counts"] == {"train": 36, "holdout": 3, "test": 9}
    assert conf["calibration"]["temperature"] > 0 and len(conf["metrics"]["history"]) == 3
    assert conf["export"]["output_names"] == ["logits", "ood_score"] and conf["ood"]["threshold"] > 0
    # The robust text recipe (lara_serve.model_export.your_data.recipe), as the shipped lara-text-news-bytes was trained.
    assert conf["model"]["pooling"] == "attention" and conf["model"]["case_fold"] is True
    training = conf["training"]
    assert training["augment"] is True and training["text_augment"]["filler_prob"] == 0.5
    assert training["text_augment"]["max_total"] == 1024 and training["init"] == "none"
    # The wide path (lara_serve.model_export.your_data.wide): in the graph, fitted, blended; each part scored alone.
    assert conf["model"]["tfidf_buckets"] >= 2**16 and conf["model"]["tfidf_utf8"] is True
    parts = conf["metrics"]["parts"]
    assert parts["blend"]["encoder"] + parts["blend"]["wide"] > 0 and training["wide_fit_s"] >= 0
    assert 0.0 <= parts["encoder"]["test_accuracy"] <= 1.0 and 0.0 <= parts["wide"]["test_accuracy"] <= 1.0
    assert "wide path" in (out / "report.md").read_text()
    split = json.loads((out / "split.json").read_text())
    assert len(split["ids"]["test"]) == 9 and split["ids"]["test"][0].startswith("line ")
    report = json.loads((out / "report.json").read_text())
    assert report["baseline"]["name"].startswith("TF-IDF") and 0.0 <= report["lara"]["accuracy"] <= 1.0
    assert not (work / "repo" / ".news.lara-train").exists()  # the work folder goes once the model is in place


def test_served_text_model_matches_torch(work: Path, live_url: str) -> None:
    text = "the bank and the market: stock price and profit"
    with LaraClient(live_url) as client:
        got = client.classify("news", text.encode(), "text/plain", top_k=3)
        shouted = client.classify("news", text.upper().encode(), "text/plain", top_k=3)
    probs = torch_probs(work / "repo" / "news", text_inputs(text))
    labels = ["money", "sport", "tech"]
    assert got.label == labels[int(probs.argmax())]
    assert {t.label: t.score for t in got.top_k} == pytest.approx(
        dict(zip(labels, probs.tolist(), strict=True)), abs=1e-4
    )
    # The recipe's case folding is in the exported graph: the upper-cased text is the same input.
    assert {t.label: t.score for t in shouted.top_k} == pytest.approx({t.label: t.score for t in got.top_k}, abs=1e-6)


def test_served_text_model_reads_a_long_document_as_training_did(work: Path, live_url: str) -> None:
    """Training read each document's first max_length bytes; so does the served model when the request does
    not say (config.json preprocessing.truncate), while an explicit truncate=false keeps the 413."""
    import httpx

    long = ("the bank and the market " * 100).encode()  # 2,400 bytes > max_length 1024
    with LaraClient(live_url) as client:
        head = client.classify("news", long[:1024], "text/plain", truncate="head", top_k=3)
    with httpx.Client(base_url=live_url, timeout=30) as http:
        silent = http.post("/v1/models/news:predict", json={"instances": [long.decode()]})
        refused = http.post(
            "/v1/models/news:predict", json={"instances": [long.decode()], "parameters": {"truncate": False}}
        )
    assert silent.status_code == 200 and silent.json()["predictions"][0]["truncated"] is True
    assert silent.json()["predictions"][0]["score"] == pytest.approx(head.score, abs=1e-6)
    assert refused.status_code == 413 and "truncate" in refused.json()["error"]


def test_image_folder_trained_and_loaded_into_a_live_server(work: Path, live_url: str) -> None:
    out = work / "repo" / "shapes"
    rc = lara(["train", str(work / "images"), "--out", str(out), *TINY_IMAGE, "--epochs", "2",
               "--load-into", live_url])  # fmt: skip
    assert rc == 0
    conf = json.loads((out / "config.json").read_text())
    assert conf["preprocessing"] == {"kind": "image", "height": 12, "width": 12, "channels": 3,
                                     "mean": conf["preprocessing"]["mean"], "std": conf["preprocessing"]["std"]}  # fmt: skip
    png = work / "images" / "left" / "0.png"
    with LaraClient(live_url) as client:
        assert "shapes" in client.models()
        got = client.classify("shapes", png.read_bytes(), "image/png", top_k=2)
    pix = np.asarray(Image.open(png).convert("RGB").resize((12, 12), Image.Resampling.BILINEAR), np.float32) / 255
    pix = (pix - conf["preprocessing"]["mean"]) / conf["preprocessing"]["std"]
    probs = torch_probs(out, {"pixel_values": torch.from_numpy(pix.transpose(2, 0, 1)[None].copy())})
    assert {t.label: t.score for t in got.top_k} == pytest.approx({"left": probs[0], "right": probs[1]}, abs=1e-4)
    # `lara load` reloads it; a name the server's repository does not hold is refused with where to put it.
    assert lara(["--url", live_url, "load", "shapes"]) == 0
    assert lara(["load", "elsewhere", "--url", live_url]) == 1


def test_lara_load_names_the_servers_repository(work: Path, live_url: str, capsys: pytest.CaptureFixture) -> None:
    assert lara(["load", "nowhere", "--url", live_url]) == 1
    assert "only from its own --model-repository" in capsys.readouterr().err


def test_a_folder_with_a_model_is_refused_and_left_alone(work: Path, capsys: pytest.CaptureFixture) -> None:
    out = work / "repo" / "news"
    before = (out / "1" / "model.safetensors").read_bytes()
    assert train_main([str(work / "news.jsonl"), "--out", str(out), *TINY_TEXT, "--epochs", "1"]) == 2
    assert "already holds a model; pass --overwrite" in capsys.readouterr().err
    assert sha256(out / "1" / "model.safetensors") == sha256(before)


def test_bad_data_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n{"text": "c" "label": "y"}\n')
    assert train_main([str(data), "--out", str(tmp_path / "m"), *TINY_TEXT]) == 2
    assert "d.jsonl line 3: not valid JSON" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl"]


def test_a_budget_below_one_epoch_says_the_minimum(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_texts(tmp_path / "d.jsonl", per_label=40)
    args = [str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "m"), *TINY_TEXT, "--time-budget", "0.0001"]
    assert train_main(args) == 2
    err = capsys.readouterr().err
    assert "too small to finish one epoch" in err and "use --time-budget" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl"]  # no model, no work folder


def _text_task(tmp_path: Path) -> tuple[LengthMixTask, list[bytes]]:
    write_texts(tmp_path / "d.jsonl", per_label=10)
    rows = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    raws = [r["text"].encode() for r in rows]
    labels = torch.tensor([list(VOCAB).index(r["label"]) for r in rows])
    task = LengthMixTask(raws, labels, 1024, min_length=32, max_length=512, composite_prob=0.2,
                         composite_min=64, composite_max=512, tokens_per_batch=1024)  # fmt: skip
    return task, raws


@pytest.mark.parametrize("clock", ["wall", "cpu"])
def test_the_budget_counts_the_clock_it_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: str) -> None:
    """--clock cpu: a budget counts process CPU seconds, so time the process spends waiting does not count."""
    task, _ = _text_task(tmp_path)
    cfg = get_config("tiny-text", num_classes=3, max_length=1024)
    fake = {"wall": 0.0, "cpu": 0.0}

    def tick(name: str, per_call: float):
        def now() -> float:
            fake[name] += per_call
            return fake[name]

        return now

    # Each reading of the wall clock moves 10 s (a busy machine); the CPU clock 1 s.
    monkeypatch.setattr(userfit.time, "perf_counter", tick("wall", 10.0))
    monkeypatch.setattr(userfit.time, "process_time", tick("cpu", 1.0))
    settings = userfit.FitSettings(lr=3e-3, weight_decay=0.01, label_smoothing=0.1, batch_size=0, epochs=None,
                                   time_budget_s=30.0, seed=3, clock=clock)  # fmt: skip
    monkeypatch.setattr(userfit, "_check_budget", lambda s, epoch_s: None)  # this test is about stopping
    state = userfit.fit(build_model(cfg, seed=3), task, lambda m: 0.5, settings, tmp_path / "c", {}, progress="quiet")
    steps_epoch = task.steps_per_epoch(0)
    if clock == "wall":
        assert state.step <= 3  # 10 s a reading: the 30 s budget is gone within three steps
    else:
        assert state.step >= min(2 * steps_epoch, 25)  # 1 s a step: ~30 steps fit
    # stopped at the budget on the clock it counts; the per-epoch holdout evaluations count in it too
    assert 30.0 <= state.train_time_s + state.eval_time_s <= 40.0
    with pytest.raises(ValueError, match="clock must be"):
        userfit.clock_fn("gpu")


def test_resume_after_ctrl_c_gives_the_uninterrupted_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    task, _ = _text_task(tmp_path)
    cfg = get_config("tiny-text", num_classes=3, max_length=1024, dropout=0.2)  # dropout: the global RNG matters
    settings = userfit.FitSettings(lr=3e-3, weight_decay=0.01, label_smoothing=0.1, batch_size=0, epochs=2,
                                   time_budget_s=None, seed=3)  # fmt: skip
    steps_epoch = task.steps_per_epoch(0)
    assert steps_epoch >= 3

    def run(ckpt: Path, resume: bool = False) -> tuple[torch.nn.Module, userfit.FitState]:
        torch.manual_seed(3)  # as `lara train` does before building: the init draws from the global RNG
        model = build_model(cfg, seed=3)
        state = userfit.fit(model, task, lambda m: 0.5, settings, ckpt, {"run": 1}, resume=resume, progress="quiet")
        return model, state

    whole, whole_state = run(tmp_path / "a")
    calls = {"n": 0}
    real_step = userfit.Reporter.step

    def step_then_ctrl_c(self, *a, **k):  # the 2nd step of the second epoch: mid-epoch
        real_step(self, *a, **k)
        calls["n"] += 1
        if calls["n"] == 1 + whole_state.history[0]["steps"] + 2:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(userfit.Reporter, "step", step_then_ctrl_c)
    with pytest.raises(userfit.TrainingStopped, match="checkpoint saved"):
        run(tmp_path / "b")
    monkeypatch.setattr(userfit.Reporter, "step", real_step)
    state = json.loads((tmp_path / "b" / "state.json").read_text())["state"]
    # Ctrl-C during step 2's report is seen (by every process of a group at once) at the end of step 3.
    assert (state["epoch"], state["step_in_epoch"]) == (1, 3)
    resumed, resumed_state = run(tmp_path / "b", resume=True)
    assert resumed_state.step == whole_state.step and resumed_state.epoch == 2
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert [h["train_loss"] for h in resumed_state.history] == pytest.approx(
        [h["train_loss"] for h in whole_state.history]
    )
    with pytest.raises(userfit.ResumeError, match="other settings"):
        userfit.fit(build_model(cfg, seed=3), task, lambda m: 0.5, settings, tmp_path / "b", {"run": 2}, resume=True,
                    progress="quiet")  # fmt: skip
    shutil.rmtree(tmp_path / "a")


def test_ctrl_c_then_resume_through_the_command(work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture) -> None:  # fmt: skip
    args = [str(work / "images"), *TINY_IMAGE, "--epochs", "2", "--no-baseline", "--seed", "5"]
    assert train_main([*args, "--out", str(tmp_path / "whole")]) == 0
    calls = {"n": 0}
    real_step = userfit.Reporter.step

    def step_then_ctrl_c(self, *a, **k):
        real_step(self, *a, **k)
        calls["n"] += 1
        if calls["n"] == 3:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(userfit.Reporter, "step", step_then_ctrl_c)
    assert train_main([*args, "--out", str(tmp_path / "cut")]) == 130
    assert "rerun the same command with --resume" in capsys.readouterr().err
    assert not (tmp_path / "cut").exists() and (tmp_path / ".cut.lara-train" / "ckpt" / "state.json").is_file()
    monkeypatch.setattr(userfit.Reporter, "step", real_step)
    assert train_main([*args, "--out", str(tmp_path / "cut"), "--resume"]) == 0
    weights = "1/model.safetensors"
    assert sha256(tmp_path / "cut" / weights) == sha256(tmp_path / "whole" / weights)


def test_text_starts_from_the_shipped_encoder_with_a_new_head(work: Path) -> None:
    from safetensors.torch import load_file

    from lara_serve.model_export.your_data.command import SHIPPED, add_arguments, prepare

    shipped = SHIPPED / "lara-text-news-bytes" / "1" / "model.safetensors"
    if not shipped.is_file():
        pytest.skip(f"{shipped} is not here")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    # the byte encoder by name (without --init and without an option of its training, lara-text-news is the
    # default: test_usertrain_pretrained); an option of its training picks it too
    args = [str(work / "news.jsonl"), "--out", str(work / "unused")]
    prep = prepare(parser.parse_args([*args, "--init", "lara-text-news-bytes"]))
    assert prep.hp["init_choice"] == "--init"
    assert prepare(parser.parse_args([*args, "--lr", "1e-3"])).hp["init_choice"].startswith("--lr train(s)")
    source, own = load_file(str(shipped)), prep.model.state_dict()
    assert prep.cfg.dim == 128 and prep.cfg.num_classes == 3 and prep.hp["arch"] == "lara-text-news-bytes"
    assert torch.equal(own["embed.weight"], source["embed.weight"])
    assert own["head.weight"].shape == (3, 128) != source["head.weight"].shape
    assert not (work / "unused").exists()


@pytest.mark.slow
def test_two_processes_under_torchrun_match_one(work: Path, tmp_path: Path) -> None:
    """Data-parallel over 2 CPU processes (gloo): the same per-epoch losses as one process, within float
    summation order; process 0 alone writes the model folder."""
    import subprocess
    import sys

    from lara_serve.server.testing import free_port

    args = [str(work / "news.jsonl"), *TINY_TEXT, "--epochs", "2", "--lr", "3e-3", "--no-baseline", "--seed", "4"]
    assert train_main([*args, "--out", str(tmp_path / "one")]) == 0
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), "-m", "lara_serve.clients", "train", *args, "--out", str(tmp_path / "two")]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stderr[-3000:]
    confs = [json.loads((tmp_path / d / "config.json").read_text()) for d in ("one", "two")]
    # The filler text is read per run (not cached from the module's first run): a pip install between the
    # runs would show here, not as a 0.45% loss mismatch.
    assert confs[0]["training"]["filler_sha256"] == confs[1]["training"]["filler_sha256"]
    one, two = (c["metrics"] for c in confs)
    assert [h["steps"] for h in one["history"]] == [h["steps"] for h in two["history"]]
    for a, b in zip(one["history"], two["history"], strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
        assert b["train_acc"] == pytest.approx(a["train_acc"], abs=0.05)
    assert two["test_accuracy"] == pytest.approx(one["test_accuracy"], abs=0.12)  # at most one test doc of 9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "two"]


def test_an_error_free_holdout_does_not_sharpen_the_temperature() -> None:
    from types import SimpleNamespace

    from lara_serve.model_export.your_data.artifact import serving_head

    g = torch.Generator().manual_seed(0)
    feats, labels = torch.randn(40, 8, generator=g), torch.arange(40) % 2
    right = torch.nn.functional.one_hot(labels, 2).float() * 3.0  # every holdout item right
    wrong = right.clone()
    wrong[:8] = wrong[:8].flip(1)  # 8 of 40 wrong, with the same confidence: the fit softens (T > 1)

    def prep_with(z: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(outputs=lambda m, part: (z, feats, labels), data=SimpleNamespace(task="image"),
                               input_scores=None)  # fmt: skip

    model = build_model(get_config("tiny-vit", num_classes=2), seed=0)
    _, cal, ood, _ = serving_head(model, prep_with(right))
    assert cal["temperature"] == 1.0 and "no holdout errors" in cal["note"]
    _, cal, _, _ = serving_head(model, prep_with(wrong))
    assert cal["temperature"] > 1.0 and "note" not in cal
    assert ood["threshold"] > 0


def test_config_names_a_shipped_init_by_its_name_not_this_checkouts_path(tmp_path: Path) -> None:
    from lara_serve.model_export.your_data.artifact import SHIPPED, init_record

    assert init_record(None) == "none"
    assert init_record(SHIPPED / "lara-text-news-bytes") == "lara-text-news-bytes"
    own = tmp_path / "my-model"
    assert init_record(own) == str(own)
    assert init_record(Path("runs/my-model")) == "runs/my-model"
