"""Frozen configuration dataclasses: attention, image ViT and byte-level text transformer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

AttentionKind = Literal["softmax", "performer", "ra", "lara"]
ATTENTION_KINDS: tuple[str, ...] = ("softmax", "performer", "ra", "lara")


# TextConfig.pooling's values (its Literal), for validation and for CLIs that offer them.
POOLINGS = ("mean", "attention", "passages")


def _one_of(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    """Literal fields are not checked at run time: a misspelt value in a config.json or an --override would
    otherwise fall through to the default branch of the code that reads it (e.g. positions "rope" ran as
    sinusoidal), so it is refused here, naming what is allowed."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


@dataclass(frozen=True)
class AttentionConfig:
    """How every attention layer of a model mixes tokens (spec sections 2-5, 7)."""

    kind: AttentionKind = "lara"
    num_landmarks: int = 49  # LARA proposals C (perfect square for images)
    landmark_module: Literal["light", "none"] = "light"  # spec 5.2: Linear+LayerNorm per head dim
    mixed: bool = False  # spec 5.2 `-mixed`: one softmax round among key landmarks (2-D only)
    alpha_coeff: float = 1.0
    performer_features: int = 64
    eval_noise: Literal["mean", "fixed"] = "mean"  # spec 7: deterministic eval modes
    qkv_bias: bool = True
    # 1-D chunk-mean landmarks hold at least this many tokens (kernels.chunk_assignment): a converted encoder
    # learned landmarks of several tokens, and reads a short text unlike its teacher with single-token ones.
    # Word-piece models only (bert_lara); 1 is the spec's rule.
    min_chunk: int = 1

    def __post_init__(self) -> None:
        if self.kind not in ATTENTION_KINDS:
            raise ValueError(f"attention kind must be one of {ATTENTION_KINDS}, got {self.kind!r}")
        if self.min_chunk < 1:
            raise ValueError(f"min_chunk must be >= 1, got {self.min_chunk}")
        _one_of("landmark_module", self.landmark_module, ("light", "none"))
        _one_of("eval_noise", self.eval_noise, ("mean", "fixed"))


@dataclass(frozen=True)
class ViTConfig:
    """ViT for 28x28 grayscale images: conv stem -> token grid -> pre-LN blocks -> GAP -> head."""

    arch: str = "vit"
    image_size: int = 28
    in_chans: int = 1
    patch_size: int = 2  # stride of the last stem conv: 2 -> 14x14 = 196 tokens, 1 -> 784
    stem_channels: int = 32  # 0: plain linear patch embedding (no conv stem)
    stem_layers: int = 2  # 3x3 convs at full resolution before the strided one
    stem_grid_layers: int = 0  # 3x3 convs at the token-grid resolution after the strided one
    dim: int = 96
    depth: int = 4
    heads: int = 3
    mlp_ratio: float = 2.0
    drop_path: float = 0.0
    mlp_dwconv: bool = False  # 3x3 depthwise conv inside each MLP (PVTv2-style locality; not in attention)
    num_classes: int = 10
    mean: float = 0.2860  # Fashion-MNIST train pixel mean of x/255
    std: float = 0.3530
    attention: AttentionConfig = field(default_factory=AttentionConfig)


@dataclass(frozen=True)
class TextConfig:
    """Byte-level (or small-vocabulary) encoder: one position per token, masked mean, attention or passage
    readout."""

    arch: str = "text"
    vocab_size: int = 257  # byte + 1, 0 = pad
    max_length: int = 8192
    dim: int = 128
    depth: int = 2
    heads: int = 4
    mlp_ratio: float = 2.0
    ngram_buckets: int = 0  # >0: hashed byte n-gram embeddings (ngram_orders) added at every position
    ngram_orders: tuple[int, ...] = (2, 3, 4)
    # >0: the n-gram table holds ngram_dim-wide rows and one bias-free Linear maps their sum to dim
    # (factorized, ALBERT-style): more buckets, so fewer colliding n-grams, for the same parameters.
    ngram_dim: int = 0
    # >0: hashed whole-word embeddings (ASCII letters/digits, case-folded), one row added at each word's
    # last byte; word_dim > 0 factorizes that table as ngram_dim does the n-gram one.
    word_buckets: int = 0
    word_dim: int = 0
    # "mean": the masked mean of the final token vectors; "attention": one learned score per token and
    # head group (heads groups of dim / heads channels), softmax over the document's tokens, weighted sum;
    # "passages": the head reads each passage of passage_bytes tokens (its tokens' mean) and the document's
    # logits are the log-mean-exp of the passages' logits (lara_serve.model_export.models.text.PassageReadout).
    pooling: Literal["mean", "attention", "passages"] = "mean"
    passage_bytes: int = 512
    # >0: a wide path beside the encoder (Wide & Deep): a linear head over hashed word 1-2-gram tf-idf
    # features in this many buckets, its logits added to the encoder's (lara_serve.model_export.models.text.TfidfHead).
    tfidf_buckets: int = 0
    # True: the wide path's words also take every byte >= 0x80 (words of any script, as UTF-8); False: ASCII
    # letters and digits only (the encoder's word definition).
    tfidf_utf8: bool = False
    # True: ASCII letters are case-folded in the graph before anything reads them, so a document and its
    # upper-cased copy are the same input (a byte model never sees every casing of every word in training).
    case_fold: bool = False
    # "sinusoidal": absolute positions (do not extrapolate past the trained length);
    # "conv": a masked depthwise Conv1d over the embeddings, relative and length-free (CPVT-style).
    positions: Literal["sinusoidal", "conv"] = "sinusoidal"
    conv_kernel: int = 9
    dropout: float = 0.1
    num_classes: int = 5
    attention: AttentionConfig = field(default_factory=lambda: AttentionConfig(num_landmarks=16))

    def __post_init__(self) -> None:
        _one_of("positions", self.positions, ("sinusoidal", "conv"))
        _one_of("pooling", self.pooling, POOLINGS)
        if self.passage_bytes < 1:
            raise ValueError(f"passage_bytes must be at least 1, got {self.passage_bytes}")


@dataclass(frozen=True)
class BertTextConfig:
    """A pretrained word-piece BERT read through LARA in every layer (lara_serve.model_export.models.bert_lara):
    its shape (all-MiniLM-L6-v2's by default), the conversion's settings, and a linear head on the unit-length
    masked-mean embedding (readout "mean"), on a learned attention pool over the tokens (readout
    "attention": filler around an article cannot dilute it; bert_lara.AttentionPool), or on the unit-length means
    of the embeddings' output and of every layer's, concatenated (readout "layers": a frozen encoder's head sees
    the word pieces themselves as well as their context; bert_lara.layer_means). The server tokenizes
    with the model folder's tokenizer.json (preprocessing kind "wordpiece"); max_length counts word pieces,
    [CLS] and [SEP] included."""

    arch: str = "bert_lara"
    vocab_size: int = 30522
    dim: int = 384
    depth: int = 6
    heads: int = 12
    mlp_dim: int = 1536
    max_positions: int = 512  # the teacher's learned rows; read periodically (row n mod 512) past them
    type_vocab_size: int = 2
    norm_eps: float = 1e-12
    max_length: int = 65536
    # the student's landmark module (StudentConfig.landmark_module): "residual" is not one of AttentionConfig's
    landmark_module: Literal["none", "residual", "light"] = "residual"
    num_classes: int = 5
    readout: Literal["mean", "attention", "layers"] = "mean"
    # 0: the document is read whole, one pass. W > 0: its pieces are read in windows of W, each window alone
    # as [CLS] + W pieces + [SEP] (W = 510 is the teacher's own 512), the readout over every window's vectors:
    # text around an article can no longer mix into the article's vectors (bert_lara.window_layout).
    window: int = 0
    # > 0 (with windows and the attention pool): every piece of window j gets window_gate x log sigmoid(-g_j)
    # added to its pool score, g_j a window probe's logit on window j's mean (bert_lara.WindowGate): windows
    # that carry no article (documentation prose around it) lose their say; 0: none
    window_gate: float = 0.0
    cls_id: int = 101  # the tokenizer's [CLS] and [SEP]: what each window is wrapped in
    sep_id: int = 102
    # > 0: a wide path beside the encoder, a linear head over the document's hashed word-piece 1-2-gram tf-idf
    # (bert_lara.PieceTfidfHead, `lara train --init` fits it); 0: none (the shipped lara-text-news)
    tfidf_buckets: int = 0
    # > 0: a text of fewer word pieces is not a document and its ood_score is SHORT_TEXT_SCORE (models/ood.py;
    # 2 for lara-text-news, where "a" passed as news); 0: every text scored by its features (a user's labels
    # may be one word long)
    min_pieces: int = 0
    attention: AttentionConfig = field(
        default_factory=lambda: AttentionConfig(kind="lara", num_landmarks=64, landmark_module="none")
    )

    def __post_init__(self) -> None:
        _one_of("landmark_module", self.landmark_module, ("none", "residual", "light"))
        _one_of("readout", self.readout, ("mean", "attention", "layers"))
        if self.window < 0 or self.window == 1:
            raise ValueError(f"window must be 0 (whole documents) or at least 2 pieces, got {self.window}")
        if self.window_gate < 0 or (self.window_gate and not (self.window and self.readout == "attention")):
            raise ValueError(f"window_gate must be 0, or > 0 with a window and readout 'attention', got "
                             f"{self.window_gate} (window {self.window}, readout {self.readout!r})")  # fmt: skip
        if self.min_pieces < 0:
            raise ValueError(f"min_pieces must be 0 (none) or a number of pieces, got {self.min_pieces}")
        if self.attention.kind != "lara":
            raise ValueError(f"a bert_lara model reads through LARA; attention kind {self.attention.kind!r} given")
        if self.tfidf_buckets < 0 or self.tfidf_buckets == 1:
            raise ValueError(f"tfidf_buckets must be 0 (no wide path) or at least 2, got {self.tfidf_buckets}")


ModelConfig = ViTConfig | TextConfig | BertTextConfig


def config_to_dict(cfg: ModelConfig) -> dict[str, Any]:
    """Architecture dict for config.json ("model" + "attention" sections)."""
    d = dataclasses.asdict(cfg)
    d.pop("attention")
    if "ngram_orders" in d:
        d["ngram_orders"] = list(d["ngram_orders"])
    return d


def config_from_dict(model: dict[str, Any], attention: dict[str, Any]) -> ModelConfig:
    """Inverse of `config_to_dict`; unknown keys are an error so stale configs fail loudly."""
    arch = model.get("arch")
    cls = {"vit": ViTConfig, "text": TextConfig, "bert_lara": BertTextConfig}.get(arch)
    if cls is None:
        raise ValueError(f"unknown model arch {arch!r}; expected 'vit', 'text' or 'bert_lara'")
    kw = dict(model)
    if "ngram_orders" in kw:
        kw["ngram_orders"] = tuple(kw["ngram_orders"])
    return cls(**kw, attention=AttentionConfig(**attention))
