"""`lara train` keeps its promises (issues 50 and 54): text resume through the command, a full disk, file
modes, Ctrl-C anywhere, checks before any work, exact epochs and a named clock, the over-length warning,
the filler text read per run; `lara` global options after the subcommand.

One tiny text run (cut by Ctrl-C after its first epoch, then resumed) is compared with the uninterrupted
run; every other test fails before training or trains a few steps."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from user_samples import TINY_TEXT, write_texts

from lara_serve.clients.__main__ import main as lara
from lara_serve.model_export.models.registry import build_model, get_config
from lara_serve.model_export.training import augment
from lara_serve.model_export.your_data import fit as userfit
from lara_serve.model_export.your_data import recipe
from lara_serve.model_export.your_data import wide as userwide
from lara_serve.model_export.your_data.command import main as train_main
from lara_serve.server.testing import free_port
from tests.digests import sha256

LONG_DOC = "goal " * 700  # 3,500 bytes: longer than TINY_TEXT's --max-length 1024


def _data(root: Path) -> Path:
    data = root / "news.jsonl"
    write_texts(data, per_label=8)
    with data.open("a") as f:
        f.write(json.dumps({"text": LONG_DOC, "label": "sport"}) + "\n")
    return data


def _left(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The same text command run whole, and cut by Ctrl-C after its first step then resumed with --resume (the
    tiny data makes an epoch one or two token-budget batches)."""
    root = tmp_path_factory.mktemp("promises")
    data = _data(root)
    args = [str(data), *TINY_TEXT, "--epochs", "3", "--lr", "3e-3", "--no-baseline", "--seed", "2"]
    # One filler bank for the three runs: read from the installed packages, it changes when anyone runs pip
    # meanwhile (seen here: an editable reinstall rewrote lara_serve's METADATA between two runs).
    fixed = recipe.filler_bank()
    mp = pytest.MonkeyPatch()
    mp.setattr(recipe, "filler_bank", lambda share=None: fixed)
    whole = root / "whole"
    assert train_main([*args, "--out", str(whole)]) == 0
    calls = {"n": 0}
    real_step = userfit.Reporter.step

    def step_then_ctrl_c(self, *a, **k):  # the first report is the start, then one per step
        real_step(self, *a, **k)
        calls["n"] += 1
        if calls["n"] == 2:  # seen at the end of step 2, by every process of a group at once
            signal.raise_signal(signal.SIGINT)

    cut = root / "cut"
    with pytest.MonkeyPatch.context() as cut_short:
        cut_short.setattr(userfit.Reporter, "step", step_then_ctrl_c)
        rc_cut = train_main([*args, "--out", str(cut)])
    state = root / ".cut.lara-train" / "ckpt" / "state.json"
    kept = state.is_file() and json.loads(state.read_text())["state"]["step"] == 2
    # The very command the tool prints after Ctrl-C.
    rc_resume = train_main([*args, "--out", str(cut), "--resume"])
    mp.undo()
    return {"root": root, "whole": whole, "cut": cut, "rc": (rc_cut, rc_resume), "kept": kept}


def test_text_resume_through_the_command_gives_the_uninterrupted_model(runs: dict) -> None:
    assert runs["rc"] == (130, 0) and runs["kept"]
    weights = "1/model.safetensors"
    assert sha256(runs["cut"] / weights) == sha256(runs["whole"] / weights)  # bit-identical
    one, two = (json.loads((runs[k] / "config.json").read_text())["metrics"] for k in ("whole", "cut"))
    assert [h["train_loss"] for h in one["history"]] == [h["train_loss"] for h in two["history"]]
    assert not (runs["root"] / ".cut.lara-train").exists()


def test_model_files_are_readable_by_others(runs: dict) -> None:
    mask = os.umask(0)
    os.umask(mask)
    for f in (runs["whole"] / "1").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~mask, f  # 0644 under the usual umask 022


def test_report_names_exact_epochs_and_the_clock(runs: dict) -> None:
    conf = json.loads((runs["whole"] / "config.json").read_text())
    assert conf["metrics"]["epochs"] == 3 and conf["metrics"]["clock"] == "wall"
    assert all(h["clock"] == "wall" and "epoch_fraction" not in h for h in conf["metrics"]["history"])
    assert conf["training"]["filler_sha256"] and len(conf["training"]["filler_sha256"]) == 64
    assert "Training: 3 epochs, " in (runs["whole"] / "report.md").read_text()
    assert " s wall-clock." in (runs["whole"] / "report.md").read_text()


def test_a_budget_cut_epoch_counts_as_a_fraction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lara_serve.model_export.training.long_docs import LengthMixTask
    from lara_serve.model_export.your_data.artifact import epochs_trained

    texts = [(" ".join(["goal"] * (20 + i)) if i % 2 else " ".join(["chip"] * (20 + i))).encode() for i in range(40)]
    task = LengthMixTask(texts, torch.tensor([i % 2 for i in range(40)]), 1024, min_length=32, max_length=256,
                         composite_prob=0.0, composite_min=64, composite_max=256, tokens_per_batch=256)  # fmt: skip
    steps_epoch = task.steps_per_epoch(0)
    ticks = {"cpu": 0.0}

    def cpu() -> float:  # one CPU second a reading: two readings a step
        ticks["cpu"] += 1.0
        return ticks["cpu"]

    monkeypatch.setattr(userfit.time, "process_time", cpu)
    monkeypatch.setattr(userfit, "_check_budget", lambda s, epoch_s: None)
    budget = 2.0 * (steps_epoch + steps_epoch // 2)  # one and a half epochs of steps
    settings = userfit.FitSettings(lr=1e-3, weight_decay=0.0, label_smoothing=0.0, batch_size=0, epochs=None,
                                   time_budget_s=budget, seed=1, clock="cpu")  # fmt: skip
    model = build_model(get_config("tiny-text", num_classes=2, max_length=1024), seed=1)
    state = userfit.fit(model, task, lambda m: 0.5, settings, tmp_path / "c", {}, progress="quiet")
    assert state.epoch - 1 < state.epochs_exact < state.epoch  # the old report said state.epoch epochs
    assert state.history[-1]["epoch_fraction"] == pytest.approx(state.epochs_exact - (state.epoch - 1), abs=1e-9)
    assert state.history[-1]["clock"] == "cpu" and all("epoch_fraction" not in h for h in state.history[:-1])
    assert epochs_trained(state) == state.epochs_exact
    from lara_serve.model_export.your_data.report import _CLOCKS

    assert "CPU" in _CLOCKS["cpu"] and "wall" in _CLOCKS["wall"]


def test_long_documents_are_named_in_a_warning(runs: dict, tmp_path: Path, capsys: pytest.CaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # The warning comes before any training: stop the run at its wide fit (Ctrl-C there).
    monkeypatch.setattr(userwide, "detach_and_fit", _ctrl_c)
    assert train_main([str(runs["root"] / "news.jsonl"), *TINY_TEXT, "--out", str(tmp_path / "m")]) == 130
    err = capsys.readouterr().err
    assert "warning: 1 of 25 documents" in err and "longer than the model's 1,024 bytes" in err
    assert (
        "3,500 bytes, line 25" in err and "so does the served model (config.json preprocessing.truncate = head" in err
    )


def _ctrl_c(*a, **k):
    raise KeyboardInterrupt


def test_ctrl_c_before_training_one_line_exit_130_nothing_left(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    data = _data(tmp_path)
    monkeypatch.setattr(userwide, "detach_and_fit", _ctrl_c)  # Ctrl-C while the wide path fits
    assert train_main([str(data), *TINY_TEXT, "--out", str(tmp_path / "m")]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "interrupted; nothing written" and not any("Traceback" in line for line in err)
    assert _left(tmp_path) == ["news.jsonl"]  # no hidden work folder


def _fail_if_fitted(monkeypatch: pytest.MonkeyPatch, why: str) -> None:
    """A check that must come before any work: fitting the wide path fails the test with `why`."""

    def no_fit(*a, **k):
        raise AssertionError(why)

    monkeypatch.setattr(userwide, "detach_and_fit", no_fit)


def test_resume_without_a_checkpoint_fails_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    data = _data(tmp_path)
    _fail_if_fitted(monkeypatch, "the wide path was fitted before --resume was checked")
    assert train_main([str(data), *TINY_TEXT, "--out", str(tmp_path / "m"), "--resume"]) == 2
    assert "--resume: no checkpoint in" in capsys.readouterr().err
    assert _left(tmp_path) == ["news.jsonl"]


def test_load_into_is_checked_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture,
                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    data = _data(tmp_path)
    _fail_if_fitted(monkeypatch, "trained before --load-into was checked")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    assert lara(["train", str(data), *TINY_TEXT, "--out", str(tmp_path / "m"), "--load-into", url]) == 2
    err = capsys.readouterr().err
    assert f"error: --load-into {url}: cannot connect" in err and "drop --load-into" in err
    assert _left(tmp_path) == ["news.jsonl"]


@contextlib.contextmanager
def _full_disk(where: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A 64 KiB tmpfs at `where` (as root), else every write of a checkpoint's optim.pt raises ENOSPC."""
    where.mkdir()
    mounted = False
    if os.geteuid() == 0:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True)
        mounted = done.returncode == 0
    if not mounted:
        real = Path.write_bytes

        def write_bytes(self: Path, data: bytes) -> int:
            if self.name == "optim.pt":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
            return real(self, data)

        monkeypatch.setattr(Path, "write_bytes", write_bytes)
    try:
        yield
    finally:
        if mounted:
            subprocess.run(["umount", str(where)], check=True)


def test_a_full_disk_says_so_and_leaves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    data = _data(tmp_path)
    disk = tmp_path / "disk"
    with _full_disk(disk, monkeypatch):
        rc = train_main([str(data), *TINY_TEXT, "--no-wide", "--epochs", "1", "--out", str(disk / "m")])
        err = capsys.readouterr().err.strip().splitlines()
        left = _left(disk)
    assert rc == 1
    assert err[-1].startswith("error: no space left on device: ") and str(disk) in err[-1]
    assert "unexpected pos" not in "\n".join(err) and left == []


def test_checkpoint_files_are_plain_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.save's own zip writer reports a full disk as "unexpected pos ..."; the checkpoint is serialized in
    memory and written with Path.write_bytes, so the OSError (and the file's name) reaches the user."""
    written: list[str] = []
    real = Path.write_bytes
    monkeypatch.setattr(Path, "write_bytes", lambda self, data: written.append(self.name) or real(self, data))
    model = build_model(get_config("tiny-text", num_classes=2, max_length=64), seed=0)
    opt = torch.optim.AdamW(model.parameters())
    userfit.save_checkpoint(tmp_path / "ckpt", model, opt, userfit.FitState(history=[]), {"a": (1, 2)})
    assert sorted(written) == ["model.safetensors", "optim.pt"]
    # A tuple in the settings equals the list state.json holds (the text config's tuples refused every resume).
    assert userfit.check_resume(tmp_path / "ckpt", {"a": (1, 2)})["meta"] == {"a": [1, 2]}
    with pytest.raises(userfit.ResumeError, match=r"other settings \(a\)"):
        userfit.check_resume(tmp_path / "ckpt", {"a": (1, 3)})
    # Other installed packages (other filler text) are a warning, not a refusal: the command stayed the same.
    userfit.save_checkpoint(tmp_path / "ckpt", model, opt, userfit.FitState(history=[]), {"filler_sha256": "1"})
    saved = userfit.check_resume(tmp_path / "ckpt", {"filler_sha256": "2"})
    assert "installed Python packages changed" in userfit.resume_notes(saved, {"filler_sha256": "2"})[0]
    assert userfit.resume_notes(saved, {"filler_sha256": "1"}) == []


def test_the_filler_text_is_read_per_run_and_shared_by_a_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The torchrun mismatch: the filler bank was cached for the life of a process, so a run compared with one
    made minutes later (a pip install in between) trained on other batches. Each run now reads it afresh
    and records its sha256; process 0's bank is the group's."""
    augment.FillerBank.installed()  # cached, as an earlier run in this process leaves it
    site = tmp_path / "site"
    (site / "pkg-1.0.dist-info").mkdir(parents=True)
    (site / "pkg-1.0.dist-info" / "METADATA").write_text("Name: pkg\n\n" + "fresh prose of a new package. " * 20)
    (site / "pkg-1.0.dist-info" / "LICENSE").write_text("Permission is granted to anyone. " * 20)
    real = augment.sysconfig.get_paths
    monkeypatch.setattr(augment.sysconfig, "get_paths", lambda: {**real(), "purelib": str(site)})
    bank, sha = recipe.filler_bank()
    assert [p[:20] for p in bank.sources["prose"]] == [b"fresh prose of a new"]
    shared, sha_shared = recipe.filler_bank(lambda local: ({"code": [b"x" * 300], "prose": [b"p" * 300],
                                                            "licence": [b"l" * 300]}, ["word"]))  # fmt: skip
    assert shared.sources["prose"] == [b"p" * 300] and sha_shared != sha
    monkeypatch.undo()
    augment.FillerBank.installed.cache_clear()


def test_global_options_after_the_subcommand(capsys: pytest.CaptureFixture) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: the error names the URL given after `info`
    assert lara(["info", "--url", url]) == 1
    assert f"cannot connect to {url}" in capsys.readouterr().err
    assert lara(["models", "--url", url, "--api-key", "k"]) == 1
    assert lara(["--url", url, "health"]) == 1
    assert f"cannot connect to {url}" in capsys.readouterr().err


def test_jsonl_lines_end_at_newline_only(tmp_path: Path) -> None:
    from lara_serve.model_export.your_data.loader import load_data

    texts = ["one\u2028two", "three\u2029four", "five\u0085six", "seven\x0beight\x0cnine\x1cten"]
    rows = [json.dumps({"text": t, "label": "ab"[i % 2]}, ensure_ascii=False) for i, t in enumerate(texts)]
    (tmp_path / "d.jsonl").write_text("\r\n".join(rows) + "\n", encoding="utf-8")  # CRLF too
    data = load_data(tmp_path / "d.jsonl")
    assert [t.decode() for t in data.texts] == texts and data.ids == ["line 1", "line 2", "line 3", "line 4"]


@pytest.mark.parametrize("delimiter", [";", "\t", "|", ","])
def test_csv_delimiter_is_sniffed(tmp_path: Path, delimiter: str) -> None:
    from lara_serve.model_export.your_data.loader import load_data

    body = f'label{delimiter}text\nx{delimiter}"a, b; c| d\te"\ny{delimiter}plain words\n'
    (tmp_path / "d.csv").write_text(body)
    data = load_data(tmp_path / "d.csv")
    assert data.labels == ["x", "y"] and data.texts == [b"a, b; c| d\te", b"plain words"]


def test_a_missing_column_names_the_delimiter(tmp_path: Path) -> None:
    from lara_serve.model_export.your_data.loader import DataError, load_data

    (tmp_path / "d.csv").write_text("category;body\nx;hello there\ny;more words\n")
    with pytest.raises(DataError, match=r"columns found: \['category', 'body'\] \(split at semicolon"):
        load_data(tmp_path / "d.csv")
