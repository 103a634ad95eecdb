"""Attention transfer and distillation: the losses, the window sampler, learning, the run folder and an exact
resume; the training text never holds the BBC test split nor the fidelity set."""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from lara_serve.model_export.pretrained import corpus, transfer
from lara_serve.model_export.pretrained.student import StudentConfig, set_trainable, student_from_teacher
from lara_serve.model_export.pretrained.teacher import SoftmaxMixer, load_teacher, pad_pieces
from lara_serve.model_export.training.data import DataUnavailable, is_news_test
from tests.model_export.test_pretrained_teacher import tiny_bert_dir

WORDS = ["the", "fox", "and", "dog", "of", "bank", "market", "rates", "case", "is", "in", "to"]


@pytest.fixture
def tiny(tmp_path: Path):
    return load_teacher(tiny_bert_dir(tmp_path / "tiny"))


def _text_dir(folder: Path, n: int = 6) -> Path:
    folder.mkdir(parents=True)
    for i in range(n):
        rng = random.Random(i)
        (folder / f"{i}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(200 + 40 * i)))
    return folder


def test_windows_are_seeded_and_sized() -> None:
    bank = transfer.PieceBank([list(range(100)), list(range(1000, 1030)), [7] * 5])
    assert len(bank.docs) == 2  # the 5-piece text is dropped
    a = bank.windows(np.random.default_rng([0, 0, 3]), 4, 42)
    b = bank.windows(np.random.default_rng([0, 0, 3]), 4, 42)
    assert a == b and all(len(w) == 40 for w in a)
    assert all(w[0] < 1000 for w in a)  # only the 100-piece text is long enough for 40 pieces
    # no text is long enough: whole texts, shorter than asked
    assert {len(w) for w in bank.windows(np.random.default_rng(1), 8, 500)} == {100, 30}


def test_attention_loss_is_zero_for_exact_attention_and_positive_for_lara(tiny) -> None:
    teacher, tok = tiny
    student = student_from_teacher(teacher, StudentConfig(num_landmarks=4))
    ids, mask = pad_pieces([tok.encode(" ".join(WORDS * 3), 64), tok.encode("the dog", 64)])
    loss, per_layer = transfer.attention_loss(teacher, student, ids, mask)
    assert loss.item() > 1e-3 and len(per_layer) == teacher.cfg.depth
    for layer in student.layers:
        layer.attn.mixer = SoftmaxMixer()
    exact, _ = transfer.attention_loss(teacher, student, ids, mask)
    assert exact.item() < 1e-10


def test_attention_transfer_learns(tiny) -> None:
    """A few dozen steps on one batch cut the layer-wise error: the trainable parts reach the loss."""
    teacher, tok = tiny
    torch.manual_seed(0)
    student = student_from_teacher(teacher, StudentConfig(num_landmarks=4))
    params = set_trainable(student)
    opt = torch.optim.Adam(params, lr=3e-3)
    ids, mask = pad_pieces([tok.encode(" ".join(random.Random(i).choices(WORDS, k=40)), 64) for i in range(4)])
    first = None
    for _ in range(40):
        loss, _ = transfer.attention_loss(teacher, student, ids, mask)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.7 * first, (first, loss.item())


def test_embedding_loss_uses_the_chunked_teacher_past_its_positions(tiny) -> None:
    teacher, tok = tiny
    student = student_from_teacher(teacher, StudentConfig(num_landmarks=4)).eval()
    short = [tok.pieces(" ".join(WORDS))[:40]]
    long = [tok.pieces(" ".join(WORDS * 8))[:150]]  # 152 pieces > 64 positions
    with torch.no_grad():
        assert 0 < transfer.embedding_loss(teacher, student, tok, short).item() < 1
        assert 0 < transfer.embedding_loss(teacher, student, tok, long).item() < 1


def _cli(out: Path, teacher_dir: Path, texts: Path, *extra: str) -> list[str]:
    return [
        "--out", str(out), "--teacher-dir", str(teacher_dir), "--texts", str(texts), "--pieces", "32", "64",
        "--max-pieces", "100", "--long-fraction", "0.5", "--batch-size", "3", "--num-landmarks", "4",
        "--stage1-steps", "4", "--stage2-steps", "4", "--checkpoint-every", "2", "--log-every", "1",
        "--eval-docs", "0", "--final-eval", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize("crash", [(0, 3), (1, 0), (1, 3)], ids=["mid-stage-1", "stage-boundary", "mid-stage-2"])
def test_a_resumed_run_equals_an_uninterrupted_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, crash: tuple[int, int]
) -> None:
    """Killed at a step (after the checkpoint of step 2, or just after stage 1), then --resume: same weights."""
    teacher_dir, texts = tiny_bert_dir(tmp_path / "tiny"), _text_dir(tmp_path / "texts")
    whole = transfer.main(_cli(tmp_path / "whole", teacher_dir, texts))
    assert whole["steps"] == {"attention": 4, "embedding": 4}
    for name in ("student.json", "converted.safetensors", "checkpoint.pt", "log.jsonl", "summary.json"):
        assert (tmp_path / "whole" / name).is_file()

    real_step = transfer._step_loss

    def crashing(ctx, stage, step):
        if (stage, step) == crash:
            raise KeyboardInterrupt
        return real_step(ctx, stage, step)

    monkeypatch.setattr(transfer, "_step_loss", crashing)
    with pytest.raises(KeyboardInterrupt):
        transfer.main(_cli(tmp_path / "cut", teacher_dir, texts))
    monkeypatch.setattr(transfer, "_step_loss", real_step)
    transfer.main([*_cli(tmp_path / "cut", teacher_dir, texts), "--resume"])
    a = load_file(str(tmp_path / "whole" / "converted.safetensors"))
    b = load_file(str(tmp_path / "cut" / "converted.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=0, rtol=0, msg=k)
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in a.items() if "lora_b" in k)  # it trained


def test_a_finished_run_extended_by_resume_equals_a_longer_run(tmp_path: Path) -> None:
    teacher_dir, texts = tiny_bert_dir(tmp_path / "tiny"), _text_dir(tmp_path / "texts")
    longer = _cli(tmp_path / "longer", teacher_dir, texts)
    longer[longer.index("--stage2-steps") + 1] = "6"
    transfer.main(longer)
    transfer.main(_cli(tmp_path / "ext", teacher_dir, texts))
    extended = _cli(tmp_path / "ext", teacher_dir, texts)
    extended[extended.index("--stage2-steps") + 1] = "6"
    summary = transfer.main([*extended, "--resume"])
    assert summary["steps"] == {"embedding": 6}  # only the open last stage ran in the resumed session
    a = load_file(str(tmp_path / "longer" / "converted.safetensors"))
    b = load_file(str(tmp_path / "ext" / "converted.safetensors"))
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=0, rtol=0, msg=k)


def test_a_run_can_start_from_another_runs_student(tmp_path: Path) -> None:
    """--init: with no time to train, the new run's student is the source's; its student config wins over the
    command line's (here --num-landmarks 8 against the source's 4); with steps, it trains on from there."""
    teacher_dir, texts = tiny_bert_dir(tmp_path / "tiny"), _text_dir(tmp_path / "texts")
    transfer.main(_cli(tmp_path / "first", teacher_dir, texts))
    src = load_file(str(tmp_path / "first" / "converted.safetensors"))
    cli = _cli(tmp_path / "again", teacher_dir, texts, "--init", str(tmp_path / "first"), "--time-budget", "0")
    cli[cli.index("--num-landmarks") + 1] = "8"
    summary = transfer.main(cli)
    assert summary["steps"] == {"attention": 0, "embedding": 0}
    assert summary["student_config"]["num_landmarks"] == 4
    got = load_file(str(tmp_path / "again" / "converted.safetensors"))
    assert got.keys() == src.keys()
    for k in src:
        torch.testing.assert_close(got[k], src[k], atol=0, rtol=0, msg=k)
    more = _cli(tmp_path / "more", teacher_dir, texts, "--init", str(tmp_path / "first"), "--stage1-fraction", "0")
    assert transfer.main(more)["steps"] == {"attention": 0, "embedding": 4}
    trained = load_file(str(tmp_path / "more" / "converted.safetensors"))
    assert any(not torch.equal(trained[k], src[k]) for k in src if "lora_b" in k)


def test_training_text_holds_no_test_or_heldout_text() -> None:
    try:
        with warnings.catch_warnings():  # an optional source (SpamAssassin) may be missing: that is fine here
            warnings.simplefilter("ignore")
            texts = corpus.training_texts()
        held = corpus.heldout_texts()
    except (DataUnavailable, FileNotFoundError) as e:
        pytest.skip(f"corpora not installed: {e}")
    assert texts.get("bbc-train"), "the BBC train split is the largest source"
    assert not any(is_news_test(t) for t in texts["bbc-train"])
    train = {t for ts in texts.values() for t in ts}
    assert all(t not in train for ts in held.values() for t in ts)
    assert len(held["brown-test"]) == 109 and held["sotu-heldout"]
