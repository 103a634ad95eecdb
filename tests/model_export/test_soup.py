"""lara_serve.model_export.training.soup: weight averages of runs with one architecture, checked tensor by tensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lara_serve import model_export as me
from lara_serve.model_export.models.hub import make_config_dict, save_pretrained
from lara_serve.model_export.models.registry import LABELS, build_model, get_config
from lara_serve.model_export.training import soup


def _run_dir(path: Path, seed: int, command: str, **overrides) -> Path:
    cfg = get_config("tiny-text", **overrides)
    model = build_model(cfg, seed=seed)
    conf = make_config_dict(
        "tiny-text",
        cfg,
        LABELS["tiny-text"],
        seed=seed,
        data={"dataset": "news"},
        training={"command": command},
        metrics={"test_accuracy": 0.5},
    )
    return save_pretrained(model, conf, path)


def _weights(d: Path) -> dict[str, torch.Tensor]:
    return load_file(str(d / "1" / "model.safetensors"))


def test_weighted_soup_is_the_weighted_mean_of_every_tensor(tmp_path):
    a = _run_dir(tmp_path / "a", 1, "train a")
    b = _run_dir(tmp_path / "b", 2, "train b")
    out = soup.make_soup([a, b], tmp_path / "s", weights=[3, 1], command="soup a b")
    A, B, S = _weights(a), _weights(b), _weights(out)
    assert set(S) == set(A) and any(not torch.equal(A[k], B[k]) for k in A)
    for k in A:
        want = (0.75 * A[k].double() + 0.25 * B[k].double()).to(A[k].dtype)
        torch.testing.assert_close(S[k], want, rtol=0, atol=0)  # the same float64 sum, cast once
    conf = json.loads((out / "config.json").read_text())
    assert conf["training"]["soup"] == {
        "ingredients": [str(a), str(b)],
        "weights": [0.75, 0.25],
        "commands": ["train a", "train b"],
    }
    assert conf["training"]["command"] == "soup a b"
    assert conf["metrics"] == {}  # the ingredients' accuracies are not the soup's
    # It loads strictly as the ingredients' architecture.
    model = me.load_pretrained(out)
    ids = torch.randint(1, 257, (2, 40), generator=torch.Generator().manual_seed(0))
    assert model(ids, torch.ones_like(ids)).shape == (2, 5)


def test_soup_of_copies_is_the_model_itself(tmp_path):
    a = _run_dir(tmp_path / "a", 1, "train a")
    out = soup.make_soup([a, a, a], tmp_path / "s")
    A, S = _weights(a), _weights(out)
    for k in A:
        # float32 -> float64 mean of three equal values -> float32 is exact.
        assert torch.equal(S[k], A[k]), k


def test_soup_rejects_what_cannot_be_averaged(tmp_path):
    a = _run_dir(tmp_path / "a", 1, "x")
    wider = _run_dir(tmp_path / "w", 2, "x", dim=32)
    with pytest.raises(ValueError, match="config section 'model'"):
        soup.make_soup([a, wider], tmp_path / "s")
    with pytest.raises(ValueError, match="at least 2 ingredients"):
        soup.average_state_dicts([_weights(a)])
    with pytest.raises(ValueError, match="non-negative"):
        soup.average_state_dicts([_weights(a), _weights(a)], [1.0, -1.0])
    with pytest.raises(ValueError, match="2 weights for 3"):
        soup.average_state_dicts([_weights(a)] * 3, [1.0, 1.0])
    state = _weights(a)
    missing = {k: v for k, v in list(state.items())[1:]}
    with pytest.raises(ValueError, match="different tensors"):
        soup.average_state_dicts([state, missing])
    ints = {"n": torch.tensor([1, 2])}
    with pytest.raises(ValueError, match="non-floating tensor differs"):
        soup.average_state_dicts([ints, {"n": torch.tensor([1, 3])}])
    assert torch.equal(soup.average_state_dicts([ints, dict(ints)])["n"], ints["n"])
    # BatchNorm's step counters differ between runs of different lengths: the soup keeps the largest
    bn = "stem.body.1.num_batches_tracked"
    counters = soup.average_state_dicts([{bn: torch.tensor(5)}, {bn: torch.tensor(9)}, {bn: torch.tensor(7)}])
    assert counters[bn].item() == 9 and counters[bn].dtype == torch.int64


def test_cli_scores_the_holdout_and_records_its_command(tmp_path, capsys, news_test):
    a = _run_dir(tmp_path / "a", 1, "train a")
    b = _run_dir(tmp_path / "b", 2, "train b")
    out = tmp_path / "s"
    soup.main([str(a), str(b), "--out", str(out), "--eval", "val"])
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    conf = json.loads((out / "config.json").read_text())
    assert conf["metrics"] == {k: printed[k] for k in ("val_accuracy", "n_val")}
    assert conf["metrics"]["n_val"] == 150 and "test_accuracy" not in conf["metrics"]
    # The recorded accuracy is what evaluate gives for the written model on the holdout.
    from lara_serve.model_export.training.evaluate import evaluate_task
    from lara_serve.model_export.training.tasks import load_task

    task = load_task("news", "val", get_config("tiny-text"))
    assert evaluate_task(me.load_pretrained(out), task, 8)["accuracy"] == conf["metrics"]["val_accuracy"]
    assert conf["training"]["command"].startswith("python -m lara_serve.model_export.training.soup ")
    with pytest.raises(SystemExit):
        soup.main([str(a), str(b), "--out", str(out), "--weights", "1"])
    assert "1 weights for 2 ingredients" in capsys.readouterr().err
