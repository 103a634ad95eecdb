"""Model construction for every attention kind, padding invariance, eval determinism, artifact round trip."""

from __future__ import annotations

import json

import pytest
import torch

from lara_serve import model_export as me
from lara_serve.model_export.training.data import pad_batch

KINDS = ["lara", "softmax", "performer", "ra"]


def _text_inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    lengths = [37, 5, 120, 1]
    seqs = [torch.randint(1, 257, (n,), generator=g).tolist() for n in lengths]
    ids, mask = pad_batch(seqs)
    return ids, mask, seqs


@pytest.mark.parametrize("kind", KINDS)
def test_create_model_all_kinds(kind):
    vit = me.create_model("tiny-vit", attention=kind).eval()
    text = me.create_model("tiny-text", attention=kind).eval()
    assert vit.cfg.attention.kind == kind and text.cfg.attention.kind == kind
    with torch.no_grad():
        logits = vit(torch.randn(3, 1, 28, 28))
        ids, mask, _ = _text_inputs()
        tl = text(ids, mask)
    assert logits.shape == (3, 10) and logits.dtype == torch.float32
    assert tl.shape == (4, 5) and tl.dtype == torch.float32
    assert torch.isfinite(logits).all() and torch.isfinite(tl).all()


@pytest.mark.parametrize("kind", KINDS)
def test_text_padding_never_changes_logits(kind):
    model = me.create_model("tiny-text", attention=kind).eval()
    ids, mask, seqs = _text_inputs()
    with torch.no_grad():
        batched = model(ids, mask)
        for i, s in enumerate(seqs):
            alone = model(torch.tensor([s]), torch.ones(1, len(s), dtype=torch.int64))
            torch.testing.assert_close(batched[i : i + 1], alone, atol=1e-5, rtol=0)
            # Extra trailing padding (different content under the mask) changes nothing either.
            padded = torch.tensor([s + [7] * 50])
            pmask = torch.tensor([[1] * len(s) + [0] * 50])
            torch.testing.assert_close(model(padded, pmask), alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_image_logits_independent_of_batch(kind):
    model = me.create_model("tiny-vit", attention=kind).eval()
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        batched = model(x)
        alone = torch.cat([model(x[i : i + 1]) for i in range(4)])
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["tiny-vit", "tiny-text"])
@pytest.mark.parametrize("kind", KINDS)
def test_eval_is_bitwise_deterministic(name, kind):
    model = me.create_model(name, attention=kind).eval()
    if name == "tiny-vit":
        inputs = {"pixel_values": torch.randn(2, 1, 28, 28)}
    else:
        ids, mask, _ = _text_inputs()
        inputs = {"input_ids": ids, "attention_mask": mask}
    with torch.no_grad():
        a, b = model(**inputs), model(**inputs)
    assert torch.equal(a, b)


def test_training_noise_is_fresh_and_seeded():
    x = torch.randn(2, 1, 28, 28)
    m1 = me.create_model("tiny-vit", seed=3).train()
    m2 = me.create_model("tiny-vit", seed=3).train()
    m2.load_state_dict(m1.state_dict())
    a1, a2 = m1(x), m1(x)
    assert not torch.equal(a1, a2)  # fresh noise per forward
    torch.testing.assert_close(m2(x), a1)  # same seed -> same noise stream


def test_fixed_noise_eval_mode_is_deterministic():
    model = me.create_model("tiny-vit", attention={"eval_noise": "fixed"}).eval()
    assert any("eval_noise" in k for k in model.state_dict())
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(model(x), model(x))


def test_vit_patch1_and_other_image_sizes():
    model = me.create_model("tiny-vit", patch_size=1).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 1, 28, 28)).shape == (1, 10)  # 784 tokens
        small = me.create_model("tiny-vit").eval()
        assert small(torch.randn(1, 1, 32, 32)).shape == (1, 10)  # 16x16 grid, interpolated positions


def test_text_accepts_max_length():
    model = me.create_model("tiny-text").eval()
    n = model.cfg.max_length
    assert n >= 8192
    with torch.no_grad():
        out = model(torch.randint(1, 257, (1, n)), torch.ones(1, n, dtype=torch.int64))
    assert torch.isfinite(out).all()


def test_unknown_model_lists_registered():
    with pytest.raises(KeyError, match="tiny-vit"):
        me.create_model("nope")


@pytest.mark.parametrize("name", ["tiny-vit", "tiny-text"])
def test_save_load_pretrained_round_trip(tmp_path, name):
    model = me.create_model(name, attention="performer").eval()
    cfg = me.get_config(name, attention="performer")
    labels = [str(i) for i in range(cfg.num_classes)]
    conf = me.make_config_dict(name, cfg, labels, seed=0, data={}, metrics={})
    me.save_pretrained(model, conf, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "config.json"]
    assert (tmp_path / "1" / "model.safetensors").is_file()
    on_disk = json.loads((tmp_path / "config.json").read_text())
    assert on_disk["version"] == "1" and on_disk["outputs"][0] == {
        "name": "logits",
        "datatype": "FP32",
        "shape": [-1, len(labels)],
    }
    loaded = me.load_pretrained(tmp_path)
    assert not loaded.training
    if name == "tiny-vit":
        assert on_disk["inputs"] == [{"name": "pixel_values", "datatype": "FP32", "shape": [-1, 1, 28, 28]}]
        assert on_disk["preprocessing"]["kind"] == "image"
        inputs = {"pixel_values": torch.randn(2, 1, 28, 28)}
    else:
        assert [i["name"] for i in on_disk["inputs"]] == ["input_ids", "attention_mask"]
        assert on_disk["preprocessing"] == {"kind": "bytes", "max_length": 8192, "pad_id": 0, "byte_offset": 1}
        ids, mask, _ = _text_inputs()
        inputs = {"input_ids": ids, "attention_mask": mask}
    with torch.no_grad():
        assert torch.equal(model(**inputs), loaded(**inputs))
