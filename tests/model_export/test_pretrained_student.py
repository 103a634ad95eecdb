"""The LARA student: its attention against the float64 spec, start-up identities, padding and batch invariance,
positions past the teacher's, adapters, and the saved converted state."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from lara_serve.kernels import chunk_means_1d, reference
from lara_serve.model_export.pretrained import student as S
from lara_serve.model_export.pretrained.teacher import SoftmaxMixer, load_teacher, pad_pieces
from tests.model_export.test_pretrained_teacher import tiny_bert_dir


def _perturb(module: torch.nn.Module, scale: float, seed: int = 1) -> None:
    """Move identity-initialised landmark modules and zero adapters off their start, so tests see them act."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "landmarks." in name or "lora_b" in name:
                p.add_(scale * torch.randn(p.shape, generator=g))


@pytest.fixture
def tiny(tmp_path: Path):
    return load_teacher(tiny_bert_dir(tmp_path / "tiny"))


def _reference_lara(mixer: S.LaraMixer, q, k, v, pad, dtype: torch.dtype) -> torch.Tensor:
    """The spec's float reference (kernels.reference) fed with landmarks computed in `dtype` throughout."""
    m = copy.deepcopy(mixer).to(dtype)
    c = m.cfg.num_landmarks
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    ql, kl = m.q_landmarks(chunk_means_1d(q, c, pad)), m.k_landmarks(chunk_means_1d(k, c, pad))
    noise = m.eval_noise if m.cfg.eval_noise == "fixed" else None
    return reference.lara_attention_ref(q, k, v, ql, kl, pad, m.cfg.alpha_coeff, noise)


@pytest.mark.parametrize("n", [1, 5, 97])
@pytest.mark.parametrize("eval_noise", ["mean", "fixed"])
@pytest.mark.parametrize("landmarks", ["residual", "light"])
def test_converted_attention_matches_float64_reference(n: int, eval_noise: str, landmarks: str) -> None:
    """flash-attention's rule: the float32 path's error against float64 is at most ~2x that of the reference
    itself run in float32 (plus a 1e-6 floor for sizes where both are exact)."""
    cfg = S.StudentConfig(num_landmarks=8, landmark_module=landmarks, eval_noise=eval_noise, alpha_coeff=1.0)
    mixer = S.LaraMixer(heads=3, head_dim=8, cfg=cfg, layer_index=2).eval()
    _perturb(mixer, 0.2)
    g = torch.Generator().manual_seed(n)
    q, k, v = (1.5 * torch.randn(2, 3, n, 8, generator=g) for _ in range(3))
    pad = torch.zeros(2, n, dtype=torch.bool)
    pad[1, n - n // 3 :] = True  # tail padding on the second sequence
    with torch.no_grad():
        got = mixer(q, k, v, pad)
        r64 = _reference_lara(mixer, q, k, v, pad, torch.float64)
        r32 = _reference_lara(mixer, q, k, v, pad, torch.float32)
    err = (got.double() - r64).abs().max().item()
    base = (r32.double() - r64).abs().max().item()
    assert got.dtype == torch.float32 and got.shape == (2, 3, n, 8)
    assert err <= 2 * base + 1e-6, (err, base)
    assert torch.count_nonzero(got[1, :, n - n // 3 :]) == 0  # padded queries are zero


def test_at_start_the_student_is_the_plain_swap(tiny) -> None:
    """Residual landmarks start at identity and adapters at zero: exactly the zero-shot chunk-mean swap."""
    teacher, tok = tiny
    full = S.student_from_teacher(teacher, S.StudentConfig(num_landmarks=4)).eval()
    plain = S.student_from_teacher(teacher, S.StudentConfig(num_landmarks=4, landmark_module="none", lora_rank=0))
    ids, mask = pad_pieces([tok.encode("the fox and the dog", 64), tok.encode("bank rates", 64)])
    with torch.no_grad():
        torch.testing.assert_close(full(ids, mask), plain.eval()(ids, mask), atol=0, rtol=0)


def test_with_softmax_mixers_the_student_is_the_teacher(tiny) -> None:
    """Everything but the mixer is the teacher's weights (positions copied, adapters at zero)."""
    teacher, tok = tiny
    student = S.student_from_teacher(teacher, S.StudentConfig(positions="copy", max_positions=200)).eval()
    for layer in student.layers:
        layer.attn.mixer = SoftmaxMixer()
    ids, mask = pad_pieces([tok.encode("the market and the bank", 64)])
    with torch.no_grad():
        torch.testing.assert_close(student(ids, mask), teacher(ids, mask), atol=1e-6, rtol=0)


def _docs(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [[2, *torch.randint(5, vocab, (n - 2,), generator=g).tolist(), 3] for n in lengths]


# Alone vs padded in a batch, float32: the LARA kernel and chunk means read only a sequence's own pieces, but
# the Linear layers and LayerNorms run over a [B, N] block whose size changes how BLAS splits the work, which
# may round differently (~1e-7 relative per op); over two layers and the pooling that stays below 1e-5.
BATCH_TOL = 1e-5


@pytest.mark.parametrize("eval_noise", ["mean", "fixed"])
@pytest.mark.parametrize("positions", ["periodic", "copy"])
def test_a_document_alone_equals_it_padded_in_a_batch(tiny, eval_noise: str, positions: str) -> None:
    teacher, _ = tiny
    cfg = S.StudentConfig(num_landmarks=6, eval_noise=eval_noise, positions=positions, max_positions=256)
    student = S.student_from_teacher(teacher, cfg)
    _perturb(student, 0.05)
    student.eval()
    docs = _docs([3, 40, 150, 97], teacher.cfg.vocab_size)  # 150 > the teacher's 64 positions
    ids, mask = pad_pieces(docs)
    with torch.no_grad():
        batched = student(ids, mask)
        again = student(ids, mask)
        for i, d in enumerate(docs):
            alone = student(*pad_pieces([d]))
            torch.testing.assert_close(batched[i, : len(d)], alone[0], atol=BATCH_TOL, rtol=0)
    assert torch.equal(batched, again)  # eval is deterministic, bit for bit


def test_positions_past_the_teacher_repeat_its_table(tiny) -> None:
    teacher, _ = tiny
    table = teacher.embeddings.positions.table
    copied = S.ExtendedPositions(table, "copy", 150)
    periodic = S.ExtendedPositions(table, "periodic", 150)
    x = torch.zeros(1, 150, table.shape[1])
    pad = torch.zeros(1, 150, dtype=torch.bool)
    want = table[torch.arange(150) % 64]  # Longformer: rows copied end to end
    torch.testing.assert_close(copied(x, pad)[0], want, atol=0, rtol=0)
    torch.testing.assert_close(periodic(x, pad)[0], want, atol=0, rtol=0)
    assert periodic(torch.zeros(1, 1000, table.shape[1]), pad[:, :1]).shape == (1, 1000, table.shape[1])
    with pytest.raises(ValueError, match="raise max_positions"):
        copied(torch.zeros(1, 151, table.shape[1]), pad)
    assert copied.table.shape[0] == 150 and periodic.table.shape[0] == 64


def test_adapters_start_at_zero_and_merge_exactly() -> None:
    base = torch.nn.Linear(16, 12)
    lora = S.LoraLinear(base, rank=4, alpha=8.0)
    x = torch.randn(3, 5, 16)
    torch.testing.assert_close(lora(x), base(x), atol=0, rtol=0)
    with torch.no_grad():
        lora.lora_b.normal_()
    merged = lora.merged()
    torch.testing.assert_close(merged(x), lora(x), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(merged(x), base(x), atol=1e-3)


def test_only_converted_parts_train_and_round_trip(tiny, tmp_path: Path) -> None:
    teacher, tok = tiny
    cfg = S.StudentConfig(num_landmarks=4, eval_noise="fixed", lora_targets=("query", "value"))
    student = S.student_from_teacher(teacher, cfg)
    params = S.set_trainable(student)
    names = {n for n, p in student.named_parameters() if p.requires_grad}
    assert names and all(".mixer." in n or ".lora_" in n for n in names)
    assert len(params) == len(names) == teacher.cfg.depth * (2 * 2 + 2 * 2)  # 2 landmark modules, 2 adapters
    ids, mask = pad_pieces([tok.encode("the dog and the fox", 64)])
    student.train()
    student.embed(ids, mask).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in params)
    assert any(p.grad.abs().sum() > 0 for n, p in student.named_parameters() if ".mixer." in n and p.requires_grad)
    _perturb(student, 0.05)
    S.save_student(tmp_path / "run", student, cfg)
    again = S.load_student(tmp_path / "run", teacher)
    with torch.no_grad():
        torch.testing.assert_close(again(ids, mask), student.eval()(ids, mask), atol=0, rtol=0)
    assert all(S.is_converted(k) for k in S.converted_state(student))


def test_merging_adapters_keeps_the_outputs(tiny) -> None:
    teacher, tok = tiny
    student = S.student_from_teacher(teacher, S.StudentConfig(num_landmarks=4))
    _perturb(student, 0.05)
    student.eval()
    ids, mask = pad_pieces([tok.encode("rates of the bank", 64)])
    with torch.no_grad():
        before = student(ids, mask)
        after = S.merge_adapters(student)(ids, mask)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=0)
    assert not any(isinstance(m, S.LoraLinear) for m in student.modules())


def test_config_refuses_unknown_values() -> None:
    with pytest.raises(ValueError, match="landmark_module"):
        S.StudentConfig(landmark_module="dense")
    with pytest.raises(ValueError, match="positions"):
        S.StudentConfig(positions="rope")
    with pytest.raises(ValueError, match="unknown student config keys"):
        S.StudentConfig.from_dict({"num_landmark": 3})
    cfg = S.StudentConfig(lora_targets=("query",))
    assert S.StudentConfig.from_dict(cfg.to_dict()) == cfg


@torch.no_grad()
def test_a_built_model_dir_gives_back_its_encoder(tiny, tmp_path: Path) -> None:
    """classifier.load_encoder from a model directory (what is shipped, the run folder gone) rebuilds the same
    folded, float16-rounded encoder and the student config the build recorded; a folder without one is refused."""
    from lara_serve.model_export.models.bert_lara import LaraBertClassifier
    from lara_serve.model_export.models.hub import make_config_dict
    from lara_serve.model_export.models.registry import NEWS_LABELS
    from lara_serve.model_export.pretrained.classifier import load_encoder, round_to_half, save_half, served_config

    teacher, tok = tiny
    scfg = S.StudentConfig(num_landmarks=4, lora_rank=2)
    student = S.student_from_teacher(teacher, scfg)
    _perturb(student, 0.05)
    student = S.merge_adapters(student.eval())
    classifier = LaraBertClassifier(served_config(scfg, student, 256), seed=0)
    classifier.encoder.load_state_dict(student.state_dict(), strict=True)
    round_to_half(classifier.encoder, min_elements=64)  # some weights float16 in the file, as the build does
    training = {"student": scfg.to_dict(), "transfer_run": "runs/gone"}
    save_half(
        classifier, make_config_dict("tiny", classifier.cfg, list(NEWS_LABELS), training=training), tmp_path / "m"
    )
    encoder, back_cfg, run = load_encoder(tmp_path / "m", teacher)
    assert back_cfg == scfg and run == "runs/gone"
    ids, mask = pad_pieces([tok.encode("rates of the bank rose", 64), tok.encode("the match", 64)])
    torch.testing.assert_close(encoder(ids, mask), classifier.encoder.eval()(ids, mask), atol=0, rtol=0)
    training.pop("student")
    save_half(
        classifier, make_config_dict("tiny", classifier.cfg, list(NEWS_LABELS), training=training), tmp_path / "n"
    )
    with pytest.raises(ValueError, match="no converted student"):
        load_encoder(tmp_path / "n", teacher)


@torch.no_grad()
@pytest.mark.parametrize("rounded", [False, True], ids=["float32", "float16-rounded"])
def test_a_folded_encoder_unfolds_to_teacher_plus_adapters(tiny, rounded: bool) -> None:
    """unmerge_adapters gives back a trainable student whose outputs are the folded encoder's: exactly (to float32
    sums) when nothing was rounded, to the float16 rounding when the shipped weights were; a fold of another
    teacher is refused."""
    from lara_serve.model_export.pretrained.classifier import round_to_half

    teacher, tok = tiny
    cfg = S.StudentConfig(num_landmarks=4, lora_rank=2)
    student = S.student_from_teacher(teacher, cfg)
    _perturb(student, 0.05)
    want = copy.deepcopy(student).eval()
    folded = S.merge_adapters(copy.deepcopy(student)).eval()
    if rounded:
        round_to_half(folded, min_elements=64)
    back, residual = S.unmerge_adapters(teacher, cfg, folded.state_dict())
    assert any(isinstance(m, S.LoraLinear) for m in back.modules())  # trainable again
    assert residual < (1e-2 if rounded else 1e-5)
    ids, mask = pad_pieces([tok.encode("rates of the bank rose", 64), tok.encode("the match", 64)])
    tol = 5e-3 if rounded else 1e-5
    torch.testing.assert_close(back.eval()(ids, mask), want(ids, mask), atol=tol, rtol=0)
    torch.testing.assert_close(back(ids, mask), folded(ids, mask), atol=tol, rtol=0)
    other = copy.deepcopy(teacher)
    next(p for n, p in other.named_parameters() if ".attn." not in n and p.dim() == 2).add_(0.1)  # not adapted
    with pytest.raises(ValueError, match="not folded from this teacher"):
        S.unmerge_adapters(other, cfg, folded.state_dict())
