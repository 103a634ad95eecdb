"""The served classifier on a converted BERT (models.bert_lara.LaraBertClassifier): config round trip, padding
and batch invariance, float16 storage that changes no value, the ONNX export with one LaraAttention node per
layer and parity with PyTorch, and the forms an article arrives in (pretrained.wrappers)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from lara_serve.model_export.export.exporter import export_model_dir, half_storage, make_session
from lara_serve.model_export.models.bert import mean_pool
from lara_serve.model_export.models.bert_lara import LaraBertClassifier, window_layout
from lara_serve.model_export.models.config import AttentionConfig, BertTextConfig, config_from_dict, config_to_dict
from lara_serve.model_export.models.hub import load_pretrained, make_config_dict, model_io_spec
from lara_serve.model_export.models.ood import SHORT_TEXT_SCORE, MahalanobisScore, ServingModel
from lara_serve.model_export.models.registry import build_model
from lara_serve.model_export.pretrained.classifier import round_to_half, save_half, with_forms
from lara_serve.model_export.pretrained.wrappers import FORMS, wrapped

TINY = BertTextConfig(
    vocab_size=300, dim=32, depth=2, heads=4, mlp_dim=64, max_positions=16, max_length=2048, num_classes=3,
    attention=AttentionConfig(kind="lara", num_landmarks=8, landmark_module="none"),
)  # fmt: skip
TINY_POOL = dataclasses.replace(TINY, readout="attention")
TINY_WIN = dataclasses.replace(TINY_POOL, window=14, cls_id=2, sep_id=3)  # windows of [CLS] + 14 + [SEP]
TINY_WIDE = dataclasses.replace(TINY_WIN, tfidf_buckets=64)  # with a word-piece wide path (lara train --init)
# landmarks of 4 tokens at least (lara-text-news's rule since 2026-12-05): every text here is under 8 x 4 pieces
TINY_MC = dataclasses.replace(TINY_WIN, attention=dataclasses.replace(TINY.attention, min_chunk=4))
TINY_LAYERS = dataclasses.replace(TINY, readout="layers", tfidf_buckets=64)  # lara train --init's frozen readout
TINY_GATE = dataclasses.replace(TINY_MC, window_gate=4.0)  # windows, pool, and the probe's gate on each window
CONFIGS = pytest.mark.parametrize(
    "cfg",
    [TINY, TINY_POOL, TINY_WIN, TINY_WIDE, TINY_MC, TINY_LAYERS, TINY_GATE],
    ids=["mean", "attention", "windows", "wide", "min_chunk", "layers", "gate"],
)
ARTICLE = "Shares rose on Monday\n\nThe market closed higher. Traders said demand was strong.\n\nMore later."


def tiny_model(seed: int = 0, cfg: BertTextConfig = TINY) -> LaraBertClassifier:
    torch.manual_seed(seed)
    model = build_model(cfg, seed=seed)
    with torch.no_grad():  # random weights of a realistic scale (the defaults leave LayerNorms at identity)
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        if model.gate is not None:  # a probe direction of a realistic size (the buffers start at 0: no gate)
            model.gate.weight.copy_(3.0 * torch.randn_like(model.gate.weight))
        if model.tfidf is not None:  # an idf of 0 would silence the wide path
            model.tfidf.idf.uniform_(0.5, 2.0)
            model.tfidf.weight.mul_(20.0)  # wide logits of the encoder head's scale
    return model.eval()


def test_config_round_trip_and_io_spec() -> None:
    d = config_to_dict(TINY)
    assert config_from_dict(d, dict(vars(TINY.attention))) == TINY
    spec = model_io_spec(TINY)
    assert spec["preprocessing"] == {
        "kind": "wordpiece",
        "max_length": 2048,
        "pad_id": 0,
        "tokenizer": "tokenizer.json",
    }
    with pytest.raises(ValueError, match="reads through LARA"):
        BertTextConfig(attention=AttentionConfig(kind="softmax"))


@CONFIGS
def test_padding_and_batch_invariance(cfg: BertTextConfig) -> None:
    """A document's logits do not depend on its neighbours or its padding (eval at w = mu)."""
    model = tiny_model(cfg=cfg)
    g = torch.Generator().manual_seed(1)
    docs = [torch.randint(4, 300, (n,), generator=g) for n in (5, 40, 700)]
    alone = [model(d[None], torch.ones(1, len(d), dtype=torch.long)) for d in docs]
    n = max(len(d) for d in docs)
    ids = torch.zeros(len(docs), n, dtype=torch.long)
    mask = torch.zeros(len(docs), n, dtype=torch.long)
    for i, d in enumerate(docs):
        ids[i, : len(d)], mask[i, : len(d)] = d, 1
    together = model(ids, mask)
    for i, a in enumerate(alone):
        torch.testing.assert_close(together[i], a[0], atol=2e-5, rtol=0)  # float32 sums in another order


@torch.no_grad()
def test_min_chunk_is_kept_by_the_folder_and_changes_short_texts_only(tmp_path: Path) -> None:
    model = tiny_model(cfg=TINY_MC)
    save_half(model, make_config_dict("tiny-mc", TINY_MC, ["a", "b", "c"]), tmp_path / "tiny-mc")
    back = load_pretrained(tmp_path / "tiny-mc")
    assert back.cfg.attention.min_chunk == 4 and back.encoder.layers[0].attn.mixer.cfg.min_chunk == 4
    plain = tiny_model(cfg=TINY_WIN)
    plain.load_state_dict(model.state_dict())  # the same weights, single-token landmarks
    g = torch.Generator().manual_seed(5)
    short = torch.cat([torch.tensor([2]), torch.randint(4, 300, (10,), generator=g), torch.tensor([3])])[None]
    assert not torch.allclose(model(short, torch.ones_like(short)), plain(short, torch.ones_like(short)))
    # 8 landmarks x 4 tokens: a window of 32+ pieces is read alike (windows of 40 here, no window)
    cfg = dataclasses.replace(TINY_MC, window=0)
    wide, wide_plain = tiny_model(cfg=cfg), tiny_model(cfg=dataclasses.replace(TINY, readout="attention"))
    wide_plain.load_state_dict(wide.state_dict())
    long = torch.cat([torch.tensor([2]), torch.randint(4, 300, (38,), generator=g), torch.tensor([3])])[None]
    torch.testing.assert_close(wide(long, torch.ones_like(long)), wide_plain(long, torch.ones_like(long)))


def test_layers_readout_against_each_hidden_state_in_float64() -> None:
    """Readout "layers": the head reads each hidden state's unit mean (the embeddings' output, then each layer's),
    concatenated at unit length; the ood score still reads the last layer's mean. Checked against the encoder's
    own layers run one by one, in float64, on a padded batch."""
    model = tiny_model(cfg=dataclasses.replace(TINY, readout="layers")).double()
    enc = model.encoder
    assert model.head.in_features == TINY.dim * (TINY.depth + 1)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(4, 300, (2, 50), generator=g)
    mask = torch.ones(2, 50, dtype=torch.long)
    mask[1, 30:] = 0
    with torch.no_grad():
        logits, pooled = model.forward_readout(model.forward_features(ids, mask), mask)
        for row, n in ((0, 50), (1, 30)):
            pad = torch.zeros(1, n, dtype=torch.bool)
            h = enc.embeddings(ids[row : row + 1, :n], pad)
            means = [h[0].mean(0)]
            for layer in enc.layers:
                h = layer(h, pad)
                means.append(h[0].mean(0))
            want = torch.cat([m / m.norm() for m in means]) / (TINY.depth + 1) ** 0.5
            torch.testing.assert_close(want.norm(), torch.tensor(1.0, dtype=torch.float64))
            torch.testing.assert_close(logits[row], model.head(want), rtol=0, atol=1e-10)
            torch.testing.assert_close(pooled[row], means[-1] / means[-1].norm(), rtol=0, atol=1e-10)


def test_window_gate_against_each_window_read_alone_in_float64() -> None:
    """WindowGate: every slot of window j gets strength x log sigmoid(-g_j) added to its pool score, g_j the
    probe's logit on window j's unit mean. Checked against the encoder reading each window alone (float64), and
    a text of one window reads exactly as without the gate (softmax ignores a constant)."""
    model = tiny_model(cfg=TINY_GATE).double()
    plain = tiny_model(cfg=dataclasses.replace(TINY_GATE, window_gate=0.0)).double()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("gate.")}, strict=True)
    g = torch.Generator().manual_seed(3)
    body = torch.randint(4, 300, (33,), generator=g)  # 33 pieces: windows of 14, 14, 5
    ids = torch.cat([torch.tensor([2]), body, torch.tensor([3])])[None]
    mask = torch.ones_like(ids)
    with torch.no_grad():
        got = model(ids, mask)[0]
        vectors, scores = [], []
        for w in (body[:14], body[14:28], body[28:]):
            wid = torch.cat([torch.tensor([2]), w, torch.tensor([3])])[None]
            h = model.encoder(wid, torch.ones_like(wid))[0]  # [len, D], the window read alone
            mean = h.mean(0) / h.mean(0).norm()
            gate = TINY_GATE.window_gate * torch.nn.functional.logsigmoid(-(mean @ model.gate.weight + model.gate.bias))
            vectors.append(h)
            scores.append(model.pool.score(h).squeeze(-1) + gate)
        weights = torch.softmax(torch.cat(scores), 0)
        read = weights @ torch.cat(vectors)
        want = model.head(read / read.norm())
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
        assert not torch.allclose(got, plain(ids, mask)[0], atol=1e-6)  # the gate moved this three-window text
        short = ids[:, :12]  # one window: the gate's bias is one constant
        torch.testing.assert_close(model(short, torch.ones_like(short)), plain(short, torch.ones_like(short)),
                                   rtol=0, atol=1e-12)  # fmt: skip
    with pytest.raises(ValueError, match="window_gate"):
        dataclasses.replace(TINY_POOL, window_gate=1.0)  # no windows: nothing to gate


def test_window_layout_by_hand() -> None:
    """[CLS]=2 a b c d e [SEP]=3 in windows of 2, beside a row of one piece: each window its own [CLS] .. [SEP]."""
    ids = torch.tensor([[2, 11, 12, 13, 14, 15, 3], [2, 21, 3, 0, 0, 0, 0]])
    mask = (ids > 0).long()
    w_ids, w_mask, read = window_layout(ids, mask, 2, cls_id=2, sep_id=3)
    # J = ceil(7 / 2) = 4 windows a row; a window with no pieces reads [CLS] [SEP] and is not pooled
    assert w_ids.tolist() == [[2, 11, 12, 3], [2, 13, 14, 3], [2, 15, 3, 0], [2, 3, 0, 0],
                              [2, 21, 3, 0], [2, 3, 0, 0], [2, 3, 0, 0], [2, 3, 0, 0]]  # fmt: skip
    assert w_mask.tolist()[:4] == [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]
    assert read.tolist() == [[1] * 8 + [1, 1, 1, 0] + [0] * 4, [1, 1, 1, 0] + [0] * 12]
    # no pieces at all: the first window's [CLS] [SEP] is read, as a whole read would
    _, _, empty = window_layout(torch.tensor([[2, 3]]), torch.ones(1, 2, dtype=torch.long), 2, 2, 3)
    assert empty.tolist() == [[1, 1, 0, 0]]
    # a batch no longer than a window is one window of its own length, not padded to the window's
    short = torch.tensor([[2, 11, 12, 3], [2, 21, 3, 0]])
    w_ids, w_mask, read = window_layout(short, (short > 0).long(), 8, cls_id=2, sep_id=3)
    assert w_ids.tolist() == [[2, 11, 12, 3, 0, 0], [2, 21, 3, 0, 0, 0]]
    assert w_mask.tolist() == read.tolist() == [[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]]


@torch.no_grad()
def test_windowed_reading_equals_each_window_read_alone_in_float64() -> None:
    """The batched layout against its definition: every window wrapped and read alone by the encoder (float64),
    one attention pool over all their vectors."""
    model = tiny_model(cfg=TINY_WIN).double()
    g = torch.Generator().manual_seed(3)
    for length in (40, 14, 12, 1):  # windows of 14; exactly one; shorter than one (its own length); one piece
        body = torch.randint(4, 300, (length,), generator=g)
        ids = torch.cat([torch.tensor([2]), body, torch.tensor([3])])[None]
        got = model(ids, torch.ones_like(ids))
        rows = []
        for i in range(0, len(body), 14):
            win = torch.cat([torch.tensor([2]), body[i : i + 14], torch.tensor([3])])[None]
            rows.append(model.encoder(win, torch.ones_like(win))[0])
        flat = torch.cat(rows)[None]
        want = model.head(model.pool(flat, torch.ones(flat.shape[:2], dtype=torch.long)))
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_half_rounding_and_storage_keep_every_value(tmp_path: Path) -> None:
    model = tiny_model()
    rounded = round_to_half(model, min_elements=1024)
    assert rounded > 0
    big = [p for p in model.parameters() if p.numel() >= 1024]
    assert all(torch.equal(p.half().float(), p) for p in big)
    conf = make_config_dict("tiny", TINY, ["a", "b", "c"])
    save_half(model, conf, tmp_path / "tiny")
    back = load_pretrained(tmp_path / "tiny")
    for (k, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items(), strict=True):
        assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b), k


def test_half_storage_converts_only_exact_initializers() -> None:
    exact = (np.arange(70000) % 2048).astype(np.float32).reshape(350, 200)  # integers below 2^11: exact
    inexact = (np.arange(70000, dtype=np.float32).reshape(350, 200) + 1 / 3).astype(np.float32)
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 350])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 200])
    nodes = [onnx.helper.make_node("MatMul", ["x", "a"], ["h"]), onnx.helper.make_node("MatMul", ["x", "b"], ["h2"]),
             onnx.helper.make_node("Add", ["h", "h2"], ["y"])]  # fmt: skip
    inits = [onnx.numpy_helper.from_array(exact, "a"), onnx.numpy_helper.from_array(inexact, "b")]
    proto = onnx.helper.make_model(onnx.helper.make_graph(nodes, "g", [x], [y], inits))
    import onnxruntime as ort

    def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, {"x": x})[0]

    xv = np.random.default_rng(0).standard_normal((1, 350)).astype(np.float32)
    before = run(proto, xv)
    proto = half_storage(proto)
    onnx.checker.check_model(proto, full_check=True)
    dtypes = {i.name: i.data_type for i in proto.graph.initializer}
    assert dtypes == {"a__float16": onnx.TensorProto.FLOAT16, "b": onnx.TensorProto.FLOAT}
    np.testing.assert_array_equal(run(proto, xv), before)  # the same weights, so the same bits


@CONFIGS
def test_export_one_lara_node_per_layer_and_parity(tmp_path: Path, cfg: BertTextConfig) -> None:
    cfg = dataclasses.replace(cfg, min_pieces=2)
    model = tiny_model(cfg=cfg)
    round_to_half(model, min_elements=1024)
    g = torch.Generator().manual_seed(0)
    feats = torch.nn.functional.normalize(torch.randn(60, TINY.dim, generator=g), dim=-1)
    serving = ServingModel.wrap(model, 1.3, MahalanobisScore.fit(feats, torch.arange(60) % 3))
    save_half(model, make_config_dict("tiny-wp", cfg, ["a", "b", "c"]), tmp_path / "tiny-wp", serving)
    section = export_model_dir(tmp_path / "tiny-wp", max_length=2048)
    assert section["lara_nodes"] == TINY.depth
    assert section["parity"]["max_abs_diff"] <= 1e-4
    assert json.loads((tmp_path / "tiny-wp" / "config.json").read_text())["export"]["lara_nodes"] == 2
    sess = make_session(tmp_path / "tiny-wp" / "1" / "model.onnx")
    ids = np.array([[2, 17, 99, 250, 3]], dtype=np.int64)
    logits, ood = sess.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
    with torch.no_grad():
        ref_logits, ref_ood = serving(torch.from_numpy(ids), torch.ones(1, 5, dtype=torch.long))
    np.testing.assert_allclose(logits, ref_logits.numpy(), atol=1e-5)
    np.testing.assert_allclose(ood, ref_ood.numpy(), rtol=1e-3)
    assert float(ood[0]) < SHORT_TEXT_SCORE
    # min_pieces 2: one word piece ("a") is not a document, flagged whatever its one embedding says, in a
    # padded batch too; two pieces are scored as any text
    batch = np.array([[2, 17, 3, 0, 0], [2, 17, 99, 3, 0], [2, 3, 0, 0, 0]], dtype=np.int64)
    mask = (batch != 0).astype(np.int64)
    _, ood = sess.run(None, {"input_ids": batch, "attention_mask": mask})
    with torch.no_grad():
        _, ref_ood = serving(torch.from_numpy(batch), torch.from_numpy(mask))
    assert ood[0] == ood[2] == ref_ood[0] == ref_ood[2] == SHORT_TEXT_SCORE
    assert ood[1] < SHORT_TEXT_SCORE and abs(float(ood[1]) / float(ref_ood[1]) - 1) < 1e-3


@pytest.mark.parametrize("form", list(FORMS))
def test_every_form_keeps_the_article_words(form: str) -> None:
    out = wrapped(ARTICLE, form, seed=3)
    assert out == wrapped(ARTICLE, form, seed=3)  # deterministic
    key = {"headline": "Shares rose", "lead": "The market closed higher."}.get(form, "Traders said demand")
    assert key in out


def test_with_forms_adds_headline_lead_and_one_long_form_per_text() -> None:
    texts, labels, forms = with_forms([ARTICLE, ARTICLE + " x"], [0, 1], seed=0)
    assert len(texts) == 8 and labels == [0, 1, 0, 0, 0, 1, 1, 1] and forms[:2] == ["whole", "whole"]
    assert forms[2:4] == ["headline", "lead"] and forms[5:7] == ["headline", "lead"]
    assert forms[4] in FORMS and forms[4] not in ("whole", "headline", "lead")
    with pytest.raises(ValueError, match="allowed"):
        wrapped(ARTICLE, "pdf", 0)


def test_without_min_pieces_a_one_piece_text_is_scored_by_its_features() -> None:
    """The default (a user's labels may be one word long): no text is flagged for its length alone."""
    model = tiny_model(cfg=TINY_WIN)
    feats = torch.nn.functional.normalize(torch.randn(60, TINY.dim, generator=torch.Generator().manual_seed(0)), dim=-1)
    serving = ServingModel.wrap(model, 1.0, MahalanobisScore.fit(feats, torch.arange(60) % 3))
    with torch.no_grad():
        _, ood = serving(torch.tensor([[2, 17, 3]]), torch.ones(1, 3, dtype=torch.long))
    assert TINY_WIN.min_pieces == 0 and float(ood[0]) < SHORT_TEXT_SCORE


@torch.no_grad()
def test_outlier_probe_adds_a_penalty_past_its_holdout_quantile_and_exports(tmp_path: Path) -> None:
    """The probe's rule by hand (m / q_m + max(0, (g - q_g) / (q_g - median_g))), the head saved and loaded
    back with it, the ONNX graph's score against PyTorch, and a head without it unchanged."""
    from lara_serve.model_export.models.ood import OutlierProbe

    model = tiny_model(cfg=TINY_WIN)
    g = torch.Generator().manual_seed(0)
    feats = torch.nn.functional.normalize(torch.randn(60, TINY.dim, generator=g), dim=-1)
    ood = MahalanobisScore.fit(feats, torch.arange(60) % 3)
    probe = OutlierProbe(torch.randn(TINY.dim, generator=g), torch.tensor([0.3]))
    scales = (40.0, 0.5, -0.5)
    serving = ServingModel.wrap(model, 1.0, ood, probe=probe, probe_scales=scales)
    plain = ServingModel.wrap(model, 1.0, ood)
    batch = torch.tensor([[2, 17, 99, 250, 3], [2, 40, 41, 3, 0]])
    mask = (batch != 0).long()
    pooled = model.forward_readout(model.forward_features(batch, mask), mask)[1]
    m, p = ood(pooled).double(), probe(pooled).double()
    want = m / 40.0 + torch.relu((p - 0.5) / 1.0)
    torch.testing.assert_close(serving(batch, mask)[1].double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(plain(batch, mask)[1], ood(pooled))  # no probe: the Mahalanobis score alone
    with pytest.raises(ValueError, match="probe needs scales"):
        ServingModel.wrap(model, 1.0, ood, probe=probe)
    with pytest.raises(ValueError, match="q_probe > median_probe"):
        ServingModel.wrap(model, 1.0, ood, probe=probe, probe_scales=(40.0, -1.0, 0.0))

    save_half(model, make_config_dict("tiny-probe", TINY_WIN, ["a", "b", "c"]), tmp_path / "p", serving)
    back = load_pretrained(tmp_path / "p", serving=True)
    assert back.probe is not None and back.probe_scales.tolist() == list(scales)
    torch.testing.assert_close(back(batch, mask)[1], serving(batch, mask)[1], rtol=1e-5, atol=1e-6)
    section = export_model_dir(tmp_path / "p", max_length=2048)
    assert section["parity"]["max_abs_diff"] <= 1e-4
    sess = make_session(tmp_path / "p" / "1" / "model.onnx")
    _, got = sess.run(None, {"input_ids": batch.numpy(), "attention_mask": mask.numpy()})
    np.testing.assert_allclose(got, serving(batch, mask)[1].numpy(), rtol=1e-4, atol=1e-5)


def test_window_gate_install_sets_the_window_probe_and_keeps_the_rest() -> None:
    """pretrained.window_gate.gated: the classifier gains a gate holding the given window probe, at the given
    strength; every other tensor, the temperature, the ood statistics and the serving head's own probe stay."""
    from lara_serve.model_export.models.ood import OutlierProbe
    from lara_serve.model_export.pretrained.window_gate import gated

    model = tiny_model(cfg=TINY_MC)
    g = torch.Generator().manual_seed(4)
    feats = torch.nn.functional.normalize(torch.randn(60, TINY.dim, generator=g), dim=-1)
    probe = OutlierProbe(3.0 * torch.randn(TINY.dim, generator=g), torch.tensor([0.5]))
    serving = ServingModel.wrap(model, 1.3, MahalanobisScore.fit(feats, torch.arange(60) % 3), probe=probe,
                                probe_scales=(10.0, 1.0, -1.0))  # fmt: skip
    window_probe = (3.0 * torch.randn(TINY.dim, generator=g), torch.tensor([-0.25]))
    new = gated(serving, 4.0, window_probe)
    assert new.model.cfg == dataclasses.replace(TINY_MC, window_gate=4.0)
    assert torch.equal(new.model.gate.weight, window_probe[0]) and torch.equal(new.model.gate.bias, window_probe[1])
    old_state, new_state = serving.state_dict(), new.state_dict()
    assert set(new_state) - set(old_state) == {"model.gate.weight", "model.gate.bias"}
    assert all(torch.equal(v, new_state[k]) for k, v in old_state.items())
    ids = torch.randint(4, 300, (1, 40), generator=g)
    ids[0, 0], ids[0, -1] = 2, 3
    with torch.no_grad():
        (z_old, s_old), (z_new, s_new) = serving(ids, torch.ones_like(ids)), new(ids, torch.ones_like(ids))
    torch.testing.assert_close(s_new, s_old, rtol=0, atol=0)  # the ood score reads the mean, not the pool
    assert not torch.allclose(z_new, z_old)  # three windows: the gate moved the logits


def test_window_probe_reads_each_window_and_separates_its_two_sets() -> None:
    """window_gate.window_means: one unit mean per real window, as the classifier's windows hold them;
    fit_window_probe: "other" windows score above "article" ones."""
    from lara_serve.model_export.pretrained.window_gate import fit_window_probe, window_means

    class Pieces:  # a tokenizer stand-in: one piece per character, [CLS] 2 and [SEP] 3 around them
        def encode(self, text: str, max_length: int) -> list[int]:
            return [2, *(4 + ord(ch) % 200 for ch in text)][: max_length - 1] + [3]

    model = tiny_model(cfg=TINY_MC)
    texts = ["a" * 5, "b" * (2 * TINY_MC.window + 3)]  # one window; three windows, the last of three pieces
    got = window_means(model, Pieces(), texts, "test")  # type: ignore[arg-type]
    assert got.shape == (4, TINY.dim)
    torch.testing.assert_close(got.norm(dim=-1), torch.ones(4))
    for i, text in enumerate(texts):
        ids = torch.tensor([Pieces().encode(text, 10_000)])
        x, rows = model.forward_features(ids, torch.ones_like(ids)), model.read_mask(torch.ones_like(ids))
        per = x.shape[1] // (1 if i == 0 else 3)
        want = mean_pool(x.reshape(-1, per, TINY.dim), rows.reshape(-1, per))
        torch.testing.assert_close(got[:1] if i == 0 else got[1:], want.detach(), rtol=1e-5, atol=1e-6)
    g = torch.Generator().manual_seed(5)
    axis = torch.nn.functional.normalize(torch.randn(TINY.dim, generator=g), dim=0)
    noise = 0.3 * torch.randn(80, TINY.dim, generator=g)
    feats = {"article": noise[:40] - axis, "other": noise[40:] + axis}
    w, b = fit_window_probe(feats, c=1.0)
    assert w.shape == (TINY.dim,) and b.shape == (1,)
    assert bool(((feats["other"] @ w + b) > 0).all()) and bool(((feats["article"] @ w + b) < 0).all())
