"""The teacher: our plain torch BERT against transformers' BertModel, the tokenizer without transformers,
padding, pooling and the chunked reading of long texts.

Most tests use a tiny random BERT written to a folder in the package's layout (`tiny_bert_dir`, also used by
the other test_pretrained_* files); the comparisons on the real all-MiniLM-L6-v2 weights skip when its package
is not installed.
"""

from __future__ import annotations

import json
import string
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from lara_serve.model_export.pretrained import teacher as T

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Markets rallied on Tuesday after the central bank held rates, " * 6,
    "short",
    "An uncased WordPiece vocabulary reads UPPER and lower case alike; numbers like 2005 split into pieces.",
]


def _tiny_vocab() -> list[str]:
    chars = list(string.ascii_lowercase + string.digits + ".,;:!?'-()")
    words = ["the", "and", "of", "to", "in", "is", "market", "bank", "fox", "dog", "rates", "case"]
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars), *words]


def write_tokenizer(path: Path, vocab: list[str]) -> None:
    """A WordPiece tokenizer.json with BERT's uncased normaliser and template, built by `tokenizers` alone."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    ids = {tok: i for i, tok in enumerate(vocab)}
    tok = Tokenizer(models.WordPiece(ids, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])]
    )
    tok.enable_truncation(16)  # as the real package's file: the loader must switch this off
    tok.save(str(path))


def tiny_config(**kw) -> T.BertConfig:
    base = dict(vocab_size=len(_tiny_vocab()), dim=32, depth=2, heads=4, mlp_dim=64, max_positions=64)
    return T.BertConfig(**(base | kw))


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Weights large enough that attention is far from uniform (a zero-init table would hide position bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model


def tiny_bert_dir(folder: Path, seed: int = 0, **kw) -> Path:
    """config.json, model.safetensors (Hugging Face names) and tokenizer.json of a random tiny BERT."""
    cfg = tiny_config(**kw)
    model = randomize(T.BertEncoder(cfg), seed)
    names = T._hf_names(cfg.depth)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({names[k]: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    hf = {
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.dim, "num_hidden_layers": cfg.depth,
        "num_attention_heads": cfg.heads, "intermediate_size": cfg.mlp_dim, "max_position_embeddings": cfg.max_positions,
        "type_vocab_size": cfg.type_vocab_size, "layer_norm_eps": cfg.norm_eps, "hidden_act": "gelu",
        "model_type": "bert", "architectures": ["BertModel"], "pad_token_id": 0,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(hf))
    write_tokenizer(folder / "tokenizer.json", _tiny_vocab())
    return folder


def real_teacher():
    try:
        return T.load_teacher()
    except T.TeacherUnavailable as e:
        pytest.skip(str(e))


def _hf_bert(folder: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.BertModel.from_pretrained(str(folder), add_pooling_layer=False).eval()


# Float32 tolerance of the comparisons with transformers: both run the same float32 operations on the same
# weights, but not necessarily in the same order (SDPA backend, fused vs separate bias adds), and each op
# rounds at ~6e-8 relative; six post-LN layers with hidden values up to ~6 accumulate a few 1e-6 at most.
# 1e-5 leaves room for that and still catches any real difference (a wrong GELU or LayerNorm eps is ~1e-3).
HF_TOL = 1e-5


def _compare_with_hf(model: T.BertEncoder, tok: T.WordPieces, folder: Path) -> None:
    hf = _hf_bert(folder)
    ids, mask = T.pad_pieces([tok.encode(t, model.cfg.max_positions) for t in TEXTS], tok.pad_id)
    with torch.no_grad():
        ours = model(ids, mask)
        theirs = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    real = mask.bool()
    assert (ours - theirs)[real].abs().max().item() <= HF_TOL
    pooled = (T.mean_pool(ours, mask) - T.mean_pool(theirs, mask)).abs().max().item()
    assert pooled <= HF_TOL


def test_tiny_random_bert_matches_transformers(tmp_path: Path) -> None:
    folder = tiny_bert_dir(tmp_path / "tiny")
    model, tok = T.load_teacher(folder)
    _compare_with_hf(model, tok, folder)


def test_real_teacher_matches_transformers() -> None:
    model, tok = real_teacher()
    _compare_with_hf(model, tok, T.teacher_dir())


def test_real_teacher_embeddings_are_unit_and_meaningful() -> None:
    model, tok = real_teacher()
    texts = ["The bank raised interest rates.", "The central bank increased rates.", "A cat sat on the mat."]
    ids, mask = T.pad_pieces([tok.encode(t) for t in texts])
    with torch.no_grad():
        e = model.embed(ids, mask)
    torch.testing.assert_close(e.norm(dim=-1), torch.ones(3))
    assert (e[0] @ e[1]).item() > (e[0] @ e[2]).item() + 0.3  # paraphrases close, unrelated far


def test_tokenizer_needs_no_transformers() -> None:
    """The word pieces load with transformers made unimportable (the lean install has only `tokenizers`)."""
    real_teacher()
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "from lara_serve.model_export.pretrained.teacher import WordPieces, teacher_dir\n"
        "tok = WordPieces.from_dir(teacher_dir())\n"
        "print(tok.encode('Hello World'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[101, 7592, 2088, 102]"  # [CLS] hello world [SEP]


def test_word_pieces_are_uncased_wrapped_and_never_truncated(tmp_path: Path) -> None:
    tok = T.WordPieces.from_dir(tiny_bert_dir(tmp_path / "tiny"))
    text = "The fox and the dog. " * 20  # far past the file's 16-piece truncation
    assert tok.encode(text) == tok.encode(text.upper())
    ids = tok.encode(text)
    assert ids[0] == tok.cls_id and ids[-1] == tok.sep_id and len(ids) > 16
    assert tok.encode(text, max_pieces=10) == ids[:9] + [tok.sep_id]


def test_padding_changes_no_real_position(tmp_path: Path) -> None:
    model, tok = T.load_teacher(tiny_bert_dir(tmp_path / "tiny"))
    seqs = [tok.encode(t, 64) for t in TEXTS]
    ids, mask = T.pad_pieces(seqs, tok.pad_id)
    with torch.no_grad():
        batched = model.embed(ids, mask)
        for i, s in enumerate(seqs):
            alone = model.embed(*T.pad_pieces([s], tok.pad_id))
            torch.testing.assert_close(batched[i : i + 1], alone, atol=1e-6, rtol=0)


def test_chunked_reading_equals_whole_reading_when_it_fits(tmp_path: Path) -> None:
    model, tok = T.load_teacher(tiny_bert_dir(tmp_path / "tiny"))
    pieces = tok.pieces("the market and the bank. " * 4)  # < 62 pieces: one window of the 64 positions
    with torch.no_grad():
        whole = model.embed(*T.pad_pieces([tok.wrap(pieces)]))[0]
        chunked = T.embed_in_chunks(model, tok, pieces, window=64)
        # three windows: the mean of the three windows' embeddings, renormalised
        long = pieces * 3
        parts = [model.embed(*T.pad_pieces([tok.wrap(long[i : i + 62])]))[0] for i in range(0, len(long), 62)]
        want = torch.nn.functional.normalize(torch.stack(parts).mean(0), dim=-1)
        got = T.embed_in_chunks(model, tok, long, window=64, batch=2)
    torch.testing.assert_close(chunked, whole, atol=1e-6, rtol=0)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_too_many_pieces_for_learned_positions_is_an_error(tmp_path: Path) -> None:
    model, tok = T.load_teacher(tiny_bert_dir(tmp_path / "tiny"))
    ids, mask = T.pad_pieces([[5] * 65])
    with pytest.raises(ValueError, match="65 pieces but only 64 learned positions"):
        model(ids, mask)


def test_config_refuses_what_is_not_implemented() -> None:
    hf = {"vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
          "intermediate_size": 16, "max_position_embeddings": 8}  # fmt: skip
    assert T.BertConfig.from_hf(hf).head_dim == 4
    with pytest.raises(ValueError, match="GELU"):
        T.BertConfig.from_hf(hf | {"hidden_act": "relu"})
    with pytest.raises(ValueError, match="absolute"):
        T.BertConfig.from_hf(hf | {"position_embedding_type": "relative_key"})
