"""The fidelity report: what it compares at each length, and its command line on a run folder and zero-shot."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from lara_serve.model_export.pretrained import fidelity
from lara_serve.model_export.pretrained.student import StudentConfig, save_student, student_from_teacher
from lara_serve.model_export.pretrained.teacher import SoftmaxMixer, TeacherUnavailable, load_teacher
from lara_serve.model_export.training.brown import BrownUnavailable
from lara_serve.model_export.training.data import DataUnavailable
from tests.model_export.test_pretrained_teacher import tiny_bert_dir

WORDS = ["the", "fox", "and", "dog", "of", "bank", "market", "rates", "case", "is", "in", "to"]


@pytest.fixture
def tiny(tmp_path: Path):
    return load_teacher(tiny_bert_dir(tmp_path / "tiny"))


def _docs(tok, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(0)
    return [tok.pieces(" ".join(rng.choices(WORDS, k=n)))[:n] for n in lengths]


def test_exact_attention_scores_one_and_short_texts_are_left_out(tiny) -> None:
    teacher, tok = tiny
    student = student_from_teacher(teacher, StudentConfig(num_landmarks=4))
    for layer in student.layers:
        layer.attn.mixer = SoftmaxMixer()
    docs = _docs(tok, [20, 80, 80, 80])
    row = fidelity.fidelity_at(teacher, student, tok, docs, 64, max_docs=2)
    assert row["docs"] == 2 and row["teacher"] == "whole window"  # the 20-piece text is too short for 64
    assert row["mean_cosine"] == pytest.approx(1.0, abs=1e-5) and row["min_cosine"] == pytest.approx(1.0, abs=1e-5)
    assert fidelity.fidelity_at(teacher, student, tok, docs, 500)["mean_cosine"] is None


def test_past_the_teacher_positions_it_reads_in_chunks(tiny) -> None:
    teacher, tok = tiny
    student = student_from_teacher(teacher, StudentConfig(num_landmarks=4)).eval()
    row = fidelity.fidelity_report(teacher, student, tok, _docs(tok, [300, 300]), (32, 150))
    assert row["150"]["teacher"] == "512-piece windows, mean" and row["150"]["docs"] == 2
    assert -1.0 <= row["150"]["min_cosine"] <= row["150"]["mean_cosine"] <= row["150"]["max_cosine"] <= 1.0
    assert row["32"]["teacher"] == "whole window"


def _needs_heldout() -> None:
    try:
        fidelity.heldout_texts()
    except (DataUnavailable, BrownUnavailable) as e:
        pytest.skip(f"held-out corpora not installed: {e}")


def test_command_line_on_a_run_folder(tmp_path: Path, tiny) -> None:
    _needs_heldout()
    teacher, _ = tiny
    save_student(
        tmp_path / "run", student_from_teacher(teacher, StudentConfig(num_landmarks=4)), StudentConfig(num_landmarks=4)
    )
    argv = ["--student", str(tmp_path / "run"), "--teacher-dir", str(tmp_path / "tiny"), "--lengths", "48", "100"]
    fidelity.main([*argv, "--max-docs", "3"])
    report = json.loads((tmp_path / "run" / "fidelity.json").read_text())
    assert report["student_config"]["num_landmarks"] == 4
    assert [r["docs"] for r in report["fidelity"].values()] == [3, 3]


def test_zero_shot_on_the_real_teacher(tmp_path: Path) -> None:
    _needs_heldout()
    try:
        load_teacher()
    except TeacherUnavailable as e:
        pytest.skip(str(e))
    out = tmp_path / "zs.json"
    fidelity.main(
        ["--zero-shot", "--out", str(out), "--lengths", "64", "600", "--max-docs", "2", "--num-landmarks", "8"]
    )
    rows = json.loads(out.read_text())["fidelity"]
    assert rows["600"]["teacher"] == "512-piece windows, mean"
    # the untrained swap keeps much of the teacher (data.md: ~0.5-0.6) but is far from it
    assert all(r["docs"] == 2 and 0.2 < r["mean_cosine"] < 0.99 for r in rows.values())


def test_the_kept_stage_2_student_reads_like_its_teacher_at_256_pieces() -> None:
    """research/students/c64-stage2-256 (issue 53's third try at the fidelity target: stage 2 only, on 256-piece
    windows, from the shipped encoder): on the first 16 held-out texts at 256 pieces its mean cosine to the
    teacher is 0.9553, as measured when it was kept (its run's closing fidelity on all 166 texts: 0.9503 at 256,
    0.9526 at 512, its fidelity.json). Deterministic: the estimator reads at w = mu, so the same weights give
    the same number up to float rounding."""
    from lara_serve.model_export.pretrained.student import load_student

    folder = Path(__file__).resolve().parents[2] / "research" / "students" / "c64-stage2-256"
    try:
        teacher, tok = load_teacher()
        docs = fidelity.heldout_pieces(tok)
    except TeacherUnavailable as e:
        pytest.skip(str(e))
    except (DataUnavailable, BrownUnavailable) as e:
        pytest.skip(f"held-out corpora not installed: {e}")
    row = fidelity.fidelity_at(teacher, load_student(folder, teacher), tok, docs, 256, max_docs=16)
    assert row["docs"] == 16 and row["mean_cosine"] == pytest.approx(0.9553, abs=2e-4)
    kept = json.loads((folder / "fidelity.json").read_text())["fidelity"]
    assert kept["256"]["mean_cosine"] >= 0.95 and kept["512"]["mean_cosine"] >= 0.95
