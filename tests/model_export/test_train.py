"""Training smoke: a tiny model's loss goes down; the CLI writes the artifact and resumes."""

from __future__ import annotations

import json
import shlex

import pytest
import torch

from lara_serve import model_export as me
from lara_serve.model_export.training import train


def test_tiny_training_loss_goes_down():
    torch.manual_seed(0)
    model = me.create_model("tiny-text", attention="lara").train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 257, (8, 64), generator=g)
    labels = torch.arange(8) % 5
    ids[:, 0] = labels + 10  # a learnable signal
    mask = torch.ones_like(ids)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(model(ids, mask), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5


def test_train_cli_writes_artifact_and_resumes(tmp_path, fashion_test):
    out, run = tmp_path / "art", tmp_path / "ckpt"
    argv = [
        "--model",
        "tiny-vit",
        "--epochs",
        "1",
        "--limit",
        "64",
        "--batch-size",
        "16",
        "--eval-limit",
        "32",
        "--out",
        str(out),
        "--run-dir",
        str(run),
        "--threads",
        "1",
    ]
    metrics = train.train(train.parse_args(argv))
    assert metrics["epochs"] == 1 and metrics["n_test"] == 32 and 0.0 <= metrics["test_accuracy"] <= 1.0
    conf = json.loads((out / "config.json").read_text())
    assert conf["metrics"]["test_accuracy"] == metrics["test_accuracy"] and conf["task"] == "image"
    assert (run / "state.json").is_file() and (out / "1" / "model.safetensors").is_file()
    model = me.load_pretrained(out)
    resumed = train.train(train.parse_args([*argv[:3], "2", *argv[4:], "--resume"]))
    assert resumed["epochs"] == 2 and resumed["steps"] == 2 * metrics["steps"]
    assert model.cfg == me.load_pretrained(out).cfg


def test_a_resumed_run_ends_bitwise_where_an_uninterrupted_one_does(tmp_path, fashion_test, monkeypatch):
    """Drop-path (block 2 of 2) draws from torch's global RNG; the checkpoint carries it, so resuming changes nothing."""
    argv = ["--model", "tiny-vit", "--epochs", "2", "--limit", "64", "--batch-size", "16", "--eval-limit", "16"]
    argv += ["--no-test", "--threads", "1", "--override", '{"drop_path": 0.3, "depth": 2}']

    def weights(name: str, *extra: str) -> dict[str, torch.Tensor]:
        run = ["--out", str(tmp_path / name), "--run-dir", str(tmp_path / f"ckpt-{name}")]
        train.train(train.parse_args([*argv, *run, *extra]))
        return me.load_pretrained(tmp_path / name).state_dict()

    straight = weights("straight")
    save = train._save_ckpt

    def save_then_die(*args, **kwargs):  # the process is killed right after its first epoch's checkpoint
        save(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "_save_ckpt", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        weights("halted")
    monkeypatch.setattr(train, "_save_ckpt", save)
    torch.manual_seed(1234)  # whatever a new process draws before resuming must not reach the resumed epoch
    resumed = weights("halted", "--resume")
    assert straight.keys() == resumed.keys()
    for k in straight:
        torch.testing.assert_close(resumed[k], straight[k], rtol=0, atol=0, msg=k)


def test_time_budget_on_the_cpu_clock_stops_mid_run(tmp_path, fashion_test):
    budget_min = 0.01  # 0.6 s of this process's CPU time
    argv = ["--model", "tiny-vit", "--epochs", "200", "--limit", "64", "--batch-size", "16", "--eval-limit", "16"]
    argv += ["--time-budget", str(budget_min), "--clock", "cpu", "--no-test", "--threads", "1"]
    argv += ["--out", str(tmp_path / "art"), "--run-dir", str(tmp_path / "ckpt")]
    metrics = train.train(train.parse_args(argv))
    assert metrics["train_time_s"] >= budget_min * 60 * 0.99  # counted in CPU seconds, stopped at the budget
    assert metrics["epochs_done"] < 200 and metrics["steps"] == round(metrics["epochs_done"] * 4)
    conf = json.loads((tmp_path / "art" / "config.json").read_text())
    assert conf["training"]["clock"] == "cpu" and conf["training"]["time_budget_min"] == budget_min


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "lara-text-news-bytes", "--length-mix", '{"head_prob": 0.5}', "--time-budget", "65", "--seed", "1"],
        ["--model", "lara-text-news-bytes", "--length-mix", "--override", '{"ngram_orders": [2, 3]}', "--resume"],
        ["--model", "lara-vit-fashion", "--epochs", "3", "--no-augment", "--out", "runs/a b"],
    ],
)
def test_recorded_command_reads_back_to_the_same_settings(argv: list[str]) -> None:
    """config.json's training.command is a shell line: split and parsed, it gives the run's own settings."""
    args = train.parse_args(argv)
    words = shlex.split(train.command_line(args))
    assert words[:3] == ["python", "-m", "lara_serve.model_export.training.train"]
    again = vars(train.parse_args(words[3:]))
    expected = vars(args)
    if args.length_mix is not None:  # left out of the line: windows come from the mix, not --train-length
        assert "--train-length" not in words
        again.pop("train_length"), expected.pop("train_length")
    assert again == expected


def test_init_from_names_unused_tensors_and_differing_settings(capsys) -> None:
    """The shipped news model reads passages with case folding; initialising the registry's (mean-pooling)
    architecture, or an attention-pooling one, from it must say so, not load silently."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "model_repository" / "lara-text-news-bytes"
    train._init_from(me.create_model("lara-text-news-bytes"), src)
    out = capsys.readouterr().out
    assert "case_fold True -> False" in out and "pooling 'passages' -> 'mean'" in out
    train._init_from(me.create_model("lara-text-news-bytes", case_fold=True, pooling="attention"), src)
    out = capsys.readouterr().out
    assert "fresh: ['pool.score.bias', 'pool.score.weight']" in out and "pooling 'passages' -> 'attention'" in out
    train._init_from(me.create_model("lara-text-news-bytes", case_fold=True, pooling="passages"), src)
    assert "warning" not in capsys.readouterr().out
