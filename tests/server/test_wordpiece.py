"""Word-piece text models (preprocessing kind "wordpiece"): the tokenizer file read from the model folder,
[CLS] + pieces + [SEP], length in pieces (413 or truncation), byte offsets that :explain maps passages with,
and the repository's checks of the tokenizer file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from server_helpers import serve

from lara_serve.server import Settings
from lara_serve.server.errors import ServeError
from lara_serve.server.explain import Passage, plan, positions, without
from lara_serve.server.preprocess import IDS, text_item, wordpiece_tokenizer
from lara_serve.server.repository import RepositoryError, TextPreprocessing, read_config
from lara_serve.server.synthetic import TEXT_LABELS, make_text_model

WORDS = [
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "markets",
    "shares",
    "rose",
    "fell",
    "match",
    "goal",
    "team",
    "film",
    "music",
    "vote",
    "minister",
    "phone",
    "software",
]
NAME = "tiny-wordpiece"


def write_tokenizer(path: Path) -> None:
    """A BERT-style uncased WordPiece tokenizer over WORDS (ids < 257: the synthetic graph's vocabulary)."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *WORDS, "##s", "##ed", ".", ","])}
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    tok.enable_truncation(8)  # as the teacher package's file ships it: the server must switch it off
    tok.save(str(path))


@pytest.fixture(scope="module")
def wp_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wp_repository")
    folder = make_text_model(root, NAME, max_length=64)
    write_tokenizer(folder / "tokenizer.json")
    conf = json.loads((folder / "config.json").read_text())
    conf["preprocessing"] = {"kind": "wordpiece", "max_length": 64, "pad_id": 0, "tokenizer": "tokenizer.json"}
    (folder / "config.json").write_text(json.dumps(conf))
    return root


def prep_of(repo: Path) -> TextPreprocessing:
    prep = read_config(repo / NAME).preprocessing
    assert isinstance(prep, TextPreprocessing)
    return prep


def test_ids_are_cls_pieces_sep_with_the_files_truncation_switched_off(wp_repo: Path) -> None:
    prep = prep_of(wp_repo)
    assert Path(prep.tokenizer or "").is_absolute()
    text = b"The markets rose and the shares fell in the match"
    item = text_item(text, prep, None)
    tok = wordpiece_tokenizer(prep.tokenizer)
    expected = tok.encode(text.decode(), add_special_tokens=False).ids
    assert len(expected) == 10  # more than the file's own truncation (8): it was switched off
    assert item.arrays[IDS].tolist() == [tok.token_to_id("[CLS]"), *expected, tok.token_to_id("[SEP]")]
    assert item.length == 12 and not item.truncated


def test_length_counts_pieces_413_unless_truncation_is_asked(wp_repo: Path) -> None:
    prep = prep_of(wp_repo)
    text = " ".join(["goal"] * 70).encode()  # 70 pieces + 2 > 64
    with pytest.raises(ServeError) as err:
        text_item(text, prep, None)
    assert err.value.kind == "too_large" and "72 tokens" in str(err.value)
    for side in ("head", "tail", "head+tail"):
        item = text_item(text, prep, side)
        assert item.length == 64 and item.truncated
        assert item.arrays[IDS][0] == 2 and item.arrays[IDS][-1] == 3  # [CLS] ... [SEP] kept


def test_byte_offsets_of_pieces_with_non_ascii_text(wp_repo: Path) -> None:
    prep = prep_of(wp_repo)
    text = "Ünïcode film, the café vote.".encode()
    item = text_item(text, prep, None)
    starts = item.piece_starts
    assert starts is not None and item.text == text
    assert starts[0] == -1 and starts[-1] == len(text) + 1
    for s in starts[1:-1]:  # every piece starts at a character boundary of the UTF-8 text
        assert 0 <= s < len(text) and (text[s] & 0xC0) != 0x80
    assert text.index(b"film") in starts.tolist() and text.index(b"vote") in starts.tolist()


def test_truncated_text_keeps_the_bytes_of_the_kept_pieces(wp_repo: Path) -> None:
    prep = prep_of(wp_repo)
    words = [WORDS[i % len(WORDS)] for i in range(100)]
    text = " ".join(words).encode()
    head = text_item(text, prep, "head")
    assert head.text == " ".join(words[:62]).encode()  # the first 62 pieces' words, whole
    tail = text_item(text, prep, "tail")
    assert tail.text == " ".join(words[-62:]).encode()
    both = text_item(text, prep, "head+tail")
    assert both.text == (" ".join(words[:31]) + " ".join(words[-31:])).encode()
    assert both.piece_starts is not None and len(both.piece_starts) == both.length


def test_explain_positions_are_the_pieces_inside_a_passage(wp_repo: Path) -> None:
    prep = prep_of(wp_repo)
    text = b"the film rose. the team fell."
    item = text_item(text, prep, None)
    cut = text.index(b"the team")
    first, second = positions(item, Passage(0, cut)), positions(item, Passage(cut, len(text)))
    assert first == (1, 5) and second == (5, item.length - 1)  # [CLS] and [SEP] are in no passage


def test_repository_checks_the_tokenizer_file(wp_repo: Path, tmp_path: Path) -> None:
    src = wp_repo / NAME
    for bad, message in (({"tokenizer": None}, "needs `tokenizer`"), ({"tokenizer": "../x.json"}, "a file name"),
                         ({"tokenizer": "missing.json"}, "not in")):  # fmt: skip
        folder = tmp_path / bad["tokenizer"].__str__().replace("/", "_").replace(".", "_")
        (folder / "1").mkdir(parents=True)
        conf = json.loads((src / "config.json").read_text())
        conf["preprocessing"] |= bad
        (folder / "config.json").write_text(json.dumps(conf))
        with pytest.raises(RepositoryError, match=message):
            read_config(folder, tmp_path)


@pytest.mark.anyio
async def test_served_classify_and_explain(wp_repo: Path) -> None:
    settings = Settings(model_repository=wp_repo, max_queue_delay_ms=2.0)
    first = "the markets rose and the shares fell in the markets, and the minister vote fell."
    second = "the team lost the match, and the goal of the film and the music in the software rose."
    text = first + " " + second
    async with serve(settings) as client:
        r = await client.post(f"/v1/models/{NAME}:predict", json={"instances": [text]})
        assert r.status_code == 200, r.text
        r = await client.post(f"/v1/models/{NAME}:predict", json={"instances": [text + " goal" * 60]})
        assert r.status_code == 413 and "tokens" in r.json()["error"]
        card = (await client.get(f"/v2/models/{NAME}")).json()["parameters"]
        # a word-piece model's card: its unit, and a headline is in its range (not the byte models' warning)
        assert card["length_unit"] == "word pieces" and "from a headline" in card["suited_inputs"]
        assert "out of distribution and get unreliable" not in card["suited_inputs"]
        r = await client.post(f"/v1/models/{NAME}:explain", json={"instances": [text], "max_passages": 2})
        assert r.status_code == 200, r.text
        (exp,) = r.json()["explanations"]
        passages = exp["passages"]
        assert [p["text"] for p in passages] == [first + " ", second]
        # faithful: the score without a passage is the model's answer to the text without it
        alone = await client.post(f"/v1/models/{NAME}:predict", json={"instances": [second], "top_k": 4})
        scores = {row["label"]: row["score"] for row in alone.json()["predictions"][0]["top_k"]}
        assert passages[0]["score_without"] == pytest.approx(scores[exp["label"]], abs=1e-6)


@pytest.fixture(scope="module")
def windowed_repo(wp_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model, its config saying it reads in windows of 8 pieces (as lara-text-news reads 510)."""
    root = tmp_path_factory.mktemp("wp_windowed")
    folder = root / NAME
    (folder / "1").mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "1/model.onnx"):
        (folder / name).write_bytes((wp_repo / NAME / name).read_bytes())
    conf = json.loads((folder / "config.json").read_text())
    conf["model"] = {**conf.get("model", {}), "window": 8}
    (folder / "config.json").write_text(json.dumps(conf))
    return root


def test_a_windowed_model_occludes_in_place(wp_repo: Path, windowed_repo: Path) -> None:
    assert read_config(wp_repo / NAME).read_window == 0 and read_config(windowed_repo / NAME).read_window == 8
    prep = prep_of(windowed_repo)
    item = text_item(b"the markets rose. the team lost the match.", prep, None)
    (whole_text,) = plan([item], prep, 2, window=0)
    (windowed,) = plan([item], prep, 2, window=8)
    passage = windowed.passages[0]
    start, end = positions(item, passage)
    removed = without(item, passage, whole_text.pad_in_place)
    kept = without(item, passage, windowed.pad_in_place)
    ids = item.arrays[IDS]
    assert removed.length == item.length - (end - start) and list(removed.arrays[IDS]) == [*ids[:start], *ids[end:]]
    # in place: the same length, the passage's pieces the pad id, every other piece where it was
    assert kept.length == item.length and list(kept.arrays[IDS]) == [*ids[:start], *[0] * (end - start), *ids[end:]]
    assert list(item.arrays[IDS]) == list(ids)  # the request's own item is not touched


@pytest.mark.anyio
async def test_a_windowed_models_score_without_is_v2_infer_of_the_padded_ids(windowed_repo: Path) -> None:
    settings = Settings(model_repository=windowed_repo, max_queue_delay_ms=2.0)
    first = "the markets rose and the shares fell in the markets, and the minister vote fell."
    text = first + " the team lost the match, and the goal of the film and the music in the software rose."
    prep = prep_of(windowed_repo)
    item = text_item(text.encode(), prep, None)
    async with serve(settings) as client:
        r = await client.post(f"/v1/models/{NAME}:explain", json={"instances": [text], "max_passages": 2})
        assert r.status_code == 200, r.text
        (exp,) = r.json()["explanations"]
        p = exp["passages"][0]
        assert p["text"] == first + " "
        start, end = positions(item, Passage(p["start"], p["end"]))
        ids = [int(i) for i in item.arrays[IDS]]
        padded = [*ids[:start], *[0] * (end - start), *ids[end:]]
        body = {"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, len(padded)], "data": padded}],
                "outputs": [{"name": "probabilities"}]}  # fmt: skip
        r = await client.post(f"/v2/models/{NAME}/infer", json=body)
        assert r.status_code == 200, r.text
        (probs,) = r.json()["outputs"]
        assert p["score_without"] == pytest.approx(probs["data"][TEXT_LABELS.index(exp["label"])], abs=1e-6)


@pytest.mark.anyio
async def test_tei_default_is_the_word_piece_model_beside_a_byte_model(wp_repo: Path, tmp_path: Path) -> None:
    """TEI's routes without ?model= answer with the word-piece model (a pretrained encoder reads the English
    TEI's clients send), although a byte text model comes first in name order."""
    shutil.copytree(wp_repo / NAME, tmp_path / NAME)
    make_text_model(tmp_path, "a-bytes", max_length=64, seed=3)  # sorts first
    doc = "the markets rose and the shares fell"
    async with serve(Settings(model_repository=tmp_path, max_queue_delay_ms=2.0)) as client:
        default = await client.post("/predict", json={"inputs": doc})
        pieces = await client.post(f"/predict?model={NAME}", json={"inputs": doc})
        byte = await client.post("/predict?model=a-bytes", json={"inputs": doc})
        assert default.status_code == pieces.status_code == byte.status_code == 200
        assert default.json() == pieces.json() != byte.json()
        assert (await client.get("/info")).json()["model_id"] == NAME


def test_the_card_says_an_int8_graph_is_served_and_only_where_it_is() -> None:
    """GET /v2/models/NAME's parameters (model_card.describe): `quantization` for the shipped int8 graph under
    onnxruntime; not under torch (it reads the float weights), nor for a float model. The ood threshold is the
    one fitted on the scores the backend computes: the int8 graph's, or the float head's under torch."""
    from types import SimpleNamespace

    from lara_serve.server.model_card import describe, weights_dtype

    repo = Path(__file__).resolve().parents[2] / "model_repository"
    cards, dtypes = {}, {}
    for name in ("lara-text-news", "lara-text-genre"):
        config = read_config(repo / name)
        for backend in ("onnxruntime", "torch"):
            model = SimpleNamespace(config=config, backend=SimpleNamespace(name=backend, device="cpu"),
                                    name=config.name, version=config.version)  # fmt: skip
            cards[name, backend] = describe(model)  # type: ignore[arg-type]
            dtypes[name, backend] = weights_dtype(model)  # type: ignore[arg-type]
    # TEI's /info model_dtype names the weights the backend computes with
    assert dtypes == {k: "int8" if k == ("lara-text-news", "onnxruntime") else "float32" for k in cards}
    int8 = cards["lara-text-news", "onnxruntime"]["quantization"]
    assert int8["weights"].startswith("int8") and int8["quantized_matmuls"] == 24 and int8["float_matmuls"] == 12
    assert all("quantization" not in cards[k] for k in cards if k != ("lara-text-news", "onnxruntime"))
    # in_distribution compares each backend's scores with the threshold fitted on them (ood_threshold_of)
    ood = json.loads((repo / "lara-text-news" / "config.json").read_text())["ood"]
    assert cards["lara-text-news", "onnxruntime"]["ood"]["threshold"] == ood["threshold"]
    assert cards["lara-text-news", "torch"]["ood"]["threshold"] == ood["threshold_float_graph"] != ood["threshold"]
    genre = json.loads((repo / "lara-text-genre" / "config.json").read_text())["ood"]["threshold"]
    assert (
        cards["lara-text-genre", "torch"]["ood"]["threshold"]
        == genre
        == cards["lara-text-genre", "onnxruntime"]["ood"]["threshold"]
    )
