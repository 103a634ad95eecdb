""":explain (v1) and parameters.explain (v2): passages split at sentence ends, contributions by occlusion that
:predict reproduces, the top passage of an article hidden in filler lies in the article, and bad requests."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_helpers import png_bytes, serve

from lara_serve.server import Settings
from lara_serve.server.explain import MIN_PASSAGE_BYTES, split_passages
from lara_serve.server.synthetic import TEXT_LABELS, make_image_model, make_text_model

pytestmark = pytest.mark.anyio
MODEL, IMAGE = "explain-text", "explain-image"
TRIGGER, LABEL = b"zqxj", 2  # bytes that vote for TEXT_LABELS[2] ("sports")
# Filler words never hold a trigger byte; the article's words are full of them.
FILLER_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "on",
    "with",
    "as",
    "was",
    "by",
    "at",
    "an",
    "be",
    "this",
    "from",
    "or",
    "had",
    "not",
    "are",
    "but",
    "have",
]
ARTICLE_WORDS = ["zq", "jazz", "quiz", "xj", "quixote", "zax", "jinx", "quartz", "fizz", "equinox"]


def sentences(words: list[str], n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(" ".join(rng.choice(words) for _ in range(9)).capitalize() + "." for _ in range(n))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("explain_repository")
    make_text_model(root, MODEL, max_length=16384, trigger=TRIGGER, trigger_label=LABEL)
    make_image_model(root, IMAGE)
    return root


@pytest.fixture
def settings(repo: Path) -> Settings:
    return Settings(model_repository=repo, max_queue_delay_ms=2.0)


def composite() -> tuple[str, int, int]:
    """Filler, an article paragraph, filler: (text, article start byte, article end byte). The paragraph break
    after the article counts as the article's (a passage ends after the whitespace that ends it)."""
    before = sentences(FILLER_WORDS, 30, seed=1) + "\n\n"
    article = sentences(ARTICLE_WORDS, 16, seed=2) + "\n\n"
    text = before + article + sentences(FILLER_WORDS, 30, seed=3)
    start = len(before.encode())
    return text, start, start + len(article.encode())


# -- splitting -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [2, 3, 16, 64])
def test_passages_cover_the_text_within_limits(k: int) -> None:
    rng = random.Random(k)
    for n in (1, 63, 64, 200, 1000, 5003):
        words = ["Hello", "world.", "This", "is", "a", "test!\n\nNew", "paragraph?", "yes.", "é", "ü", "漢字", ""]
        doc = " ".join(rng.choice(words) for _ in range(n)).encode()[: n * 3]
        passages = split_passages(doc, k)
        assert 1 <= len(passages) <= k
        assert passages[0].start == 0 and passages[-1].end == len(doc)
        assert all(a.end == b.start for a, b in zip(passages, passages[1:], strict=False))  # contiguous
        assert all(p.end - p.start >= MIN_PASSAGE_BYTES for p in passages[:-1]) and (
            len(passages) == 1 or passages[-1].end - passages[-1].start >= MIN_PASSAGE_BYTES
        )


def test_passages_end_at_sentence_ends_and_never_split_a_character() -> None:
    doc = ("A first sentence that is long enough to stand alone as one passage. " * 4).encode()
    for passage in split_passages(doc, 4)[:-1]:
        assert doc[: passage.end].endswith(b". ")
    unbroken = "漢字かな" * 400  # no sentence end, no whitespace: forced cuts at character boundaries
    raw = unbroken.encode()
    passages = split_passages(raw, 8)
    assert len(passages) > 1
    assert "".join(raw[p.start : p.end].decode("utf-8") for p in passages) == unbroken  # decodes: no split char


# -- the route ---------------------------------------------------------------------------------------


async def _predict_label_score(client: httpx.AsyncClient, text: str, label: str) -> float:
    r = await client.post(f"/v1/models/{MODEL}:predict", json={"instances": [text], "parameters": {"top_k": 4}})
    assert r.status_code == 200, r.text
    return next(t["score"] for t in r.json()["predictions"][0]["top_k"] if t["label"] == label)


async def test_top_passage_lies_in_the_article_and_removing_it_moves_the_score(settings: Settings) -> None:
    text, art_start, art_end = composite()
    raw = text.encode()
    async with serve(settings) as client:
        r = await client.post(f"/v1/models/{MODEL}:explain", json={"instances": [text]})
        assert r.status_code == 200, r.text
        (exp,) = r.json()["explanations"]
        assert exp["label"] == TEXT_LABELS[LABEL] and exp["method"] == "occlusion" and exp["length"] == len(raw)
        passages = exp["passages"]
        assert 2 < len(passages) <= settings.explain_passages
        assert all(raw[p["start"] : p["end"]].decode() == p["text"] for p in passages)
        top = max(passages, key=lambda p: p["contribution"])
        low = min(passages, key=lambda p: p["contribution"])
        assert art_start <= top["start"] and top["end"] <= art_end, (art_start, art_end, top)
        assert top["contribution"] > 0 > low["contribution"]  # filler dilutes: removing it raises the label
        whole = await _predict_label_score(client, text, exp["label"])
        assert whole == pytest.approx(exp["score"], abs=1e-6)
        for passage in (top, low):  # what the explanation says removing the passage does, :predict does
            rest = (raw[: passage["start"]] + raw[passage["end"] :]).decode()
            without = await _predict_label_score(client, rest, exp["label"])
            assert without == pytest.approx(passage["score_without"], abs=1e-5)
            assert whole - without == pytest.approx(passage["contribution"], abs=1e-5)
        assert (await _predict_label_score(client, (raw[: top["start"]] + raw[top["end"] :]).decode(),
                                           exp["label"])) < whole  # fmt: skip


async def test_ranges_refer_to_the_text_after_truncation(repo: Path) -> None:
    text, _, _ = composite()
    raw = text.encode()
    async with serve(Settings(model_repository=repo)) as client:
        too_long = text * 7  # > 16384 bytes
        refused = await client.post(f"/v1/models/{MODEL}:explain", json={"instances": [too_long]})
        assert refused.status_code == 413
        r = await client.post(f"/v1/models/{MODEL}:explain?truncate=tail", json={"instances": [too_long, "short."]})
        assert r.status_code == 200, r.text
    cut, short = r.json()["explanations"]
    kept = (raw * 7)[-16384:]
    assert cut["truncated"] is True and cut["length"] == len(kept)
    assert b"".join(kept[p["start"] : p["end"]] for p in cut["passages"]) == kept
    # A text of one passage: nothing is left without it, so no contribution is claimed.
    assert short["passages"] == [
        {"start": 0, "end": 6, "text": "short.", "contribution": None, "log_odds": None, "score_without": None}
    ]


async def test_v2_explain_parameter_matches_v1(settings: Settings) -> None:
    text, _, _ = composite()
    body = {"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [1], "data": [text]}],
            "parameters": {"explain": True, "max_passages": 8}}  # fmt: skip
    async with serve(settings) as client:
        v1 = (await client.post(f"/v1/models/{MODEL}:explain", json={"instances": [text],
                                                                      "parameters": {"max_passages": 8}})).json()  # fmt: skip
        v2 = (await client.post(f"/v2/models/{MODEL}/infer", json=body)).json()
        named = {**body, "parameters": {"max_passages": 8}, "outputs": [{"name": "explanation"}]}
        only = (await client.post(f"/v2/models/{MODEL}/infer", json=named)).json()
        plain = (await client.post(f"/v2/models/{MODEL}/infer", json={**body, "parameters": {}})).json()
    outputs = {o["name"]: o for o in v2["outputs"]}
    assert list(outputs) == ["probabilities", "label", "explanation"]
    assert outputs["explanation"]["datatype"] == "BYTES" and outputs["explanation"]["shape"] == [1]
    doc = json.loads(outputs["explanation"]["data"][0])
    assert doc["passages"] == v1["explanations"][0]["passages"] and len(doc["passages"]) <= 8
    assert [o["name"] for o in only["outputs"]] == ["explanation"]  # asking for the output implies explain
    assert json.loads(only["outputs"][0]["data"][0]) == doc
    assert [o["name"] for o in plain["outputs"]] == ["probabilities", "label"]  # no explain: unchanged


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        (f"/v1/models/{IMAGE}:explain", {"instances": [{"b64": "AA=="}]}, 422, "only text models explain"),
        (f"/v1/models/{MODEL}:explain", {"instances": ["x"], "parameters": {"max_passages": 1}}, 400, "integer in [2, 64]"),
        (f"/v1/models/{MODEL}:explain", {"instances": ["x"], "parameters": {"max_passages": 65}}, 400, "integer in [2, 64]"),
        (f"/v1/models/{MODEL}:explain", {"instances": ["x"], "parameters": {"max_passages": "8"}}, 400, "integer in [2, 64]"),
        (f"/v1/models/{MODEL}:explain", {"instances": ["x"], "parameters": {"max_passages": True}}, 400, "integer in [2, 64]"),
        (f"/v2/models/{IMAGE}/infer", {"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [1], "data": ["x"]}],
                                       "parameters": {"explain": True}}, 422, "only text models explain"),
        (f"/v2/models/{MODEL}/infer", {"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [1], "data": ["x"]}],
                                       "parameters": {"explain": "yes"}}, 400, "'explain' must be true or false"),
        (f"/v2/models/{MODEL}/infer", {"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [1], "data": ["x"]}],
                                       "parameters": {"explain": True, "max_passages": 0}}, 400, "integer in [2, 64]"),
    ],
)  # fmt: skip
async def test_bad_explain_requests_say_what_is_allowed(
    settings: Settings, path: str, body: dict[str, object], status: int, words: str
) -> None:
    async with serve(settings) as client:
        r = await client.post(path, json=body)
    assert r.status_code == status and words in r.json()["error"], r.text


async def test_get_on_the_verbs_is_405_with_allow_post(settings: Settings) -> None:
    async with serve(settings) as client:
        for verb in ("explain", "predict", "classify"):
            r = await client.get(f"/v1/models/{MODEL}:{verb}")
            assert r.status_code == 405 and r.headers["allow"] == "POST", (verb, r.text)
        assert (await client.get(f"/v1/models/{MODEL}")).status_code == 200  # the model's status still answers


async def test_explaining_is_bounded_by_the_queue(repo: Path) -> None:
    text, _, _ = composite()
    runs = 1 + len(split_passages(text.encode(), 16))
    assert 2 * runs <= 40 < 3 * runs
    async with serve(Settings(model_repository=repo, max_queue_size=40, max_batch_size=8)) as client:
        r = await client.post(f"/v1/models/{MODEL}:explain", json={"instances": [text] * 3})
        ok = await client.post(f"/v1/models/{MODEL}:explain", json={"instances": [text] * 2})
    assert (
        r.status_code == 413
        and f"{3 * runs} model runs" in r.json()["error"]
        and "max_queue_size=40" in r.json()["error"]
    )
    assert ok.status_code == 200 and int(ok.headers["x-batch-size"]) > 1  # variants were batched together


async def test_image_explain_with_a_real_image_names_the_rule(settings: Settings) -> None:
    import base64

    async with serve(settings) as client:
        body = {"instances": [{"b64": base64.b64encode(png_bytes()).decode()}]}
        r = await client.post(f"/v1/models/{IMAGE}:explain", json=body)
    assert r.status_code == 422 and f"model {IMAGE!r} is an image model" in r.json()["error"]


async def test_v2_explain_of_token_ids_matches_the_raw_text(settings: Settings) -> None:
    text, _, _ = composite()
    ids = [b + 1 for b in text.encode()]  # byte_offset 1, as the server's own preprocessing
    raw = {"name": "raw", "datatype": "BYTES", "shape": [1], "data": [text]}
    tokens = {"name": "input_ids", "datatype": "INT64", "shape": [1, len(ids)], "data": ids}
    async with serve(settings) as client:
        docs = []
        for tensor in (raw, tokens):
            body = {"inputs": [tensor], "outputs": [{"name": "explanation"}]}
            r = await client.post(f"/v2/models/{MODEL}/infer", json=body)
            assert r.status_code == 200, r.text
            docs.append(json.loads(r.json()["outputs"][0]["data"][0]))
    assert docs[0] == docs[1] and docs[0]["length"] == len(ids)


class _Slow:
    """The real backend, 0.2 s per batch: an explanation of 1 + 15 runs of one item each takes ~3 s."""

    def __init__(self, model_dir: Path) -> None:
        from lara_serve.server.backends import create_backend
        from lara_serve.server.repository import read_config

        self.config = read_config(model_dir)
        self.inner = create_backend("onnxruntime", model_dir, self.config, "cpu")
        self.name, self.device, self.batches = "slow", "cpu", 0

    def run(self, inputs: dict[str, Any]) -> Any:
        return self.run_outputs(inputs).logits

    def run_outputs(self, inputs: dict[str, Any]) -> Any:
        time.sleep(0.2)
        self.batches += 1
        return self.inner.run_outputs(inputs)

    def close(self) -> None:
        self.inner.close()


async def test_the_request_timeout_covers_the_occluded_runs(repo: Path) -> None:
    from lara_serve.server.models import ServedModel, policy_from

    settings = Settings(model_repository=repo, max_batch_size=1, request_timeout_s=1.0, warmup=False)
    backend = _Slow(repo / MODEL)
    model = ServedModel(backend.config, backend, policy_from(settings))  # type: ignore[arg-type]
    text, _, _ = composite()
    async with serve(settings, [model]) as client:
        r = await client.post(f"/v1/models/{MODEL}:explain", json={"instances": [text]})
        await asyncio.sleep(0.5)  # a batch running at the timeout finishes; nothing after it starts
        ran = backend.batches
    assert r.status_code == 504 and "request_timeout_s" in r.json()["error"]
    assert 1 <= ran <= 7, ran  # of 16 runs: the queued ones were dropped, not computed for nobody
