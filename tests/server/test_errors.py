"""Every error code, with the {"error": ...} body; and fuzzed bodies never produce a 500."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import struct
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from server_helpers import IMAGE, MAX_LENGTH, TEXT, png_bytes, serve

from lara_serve.server import Settings
from lara_serve.server.backends.onnx_runtime import OnnxRuntimeBackend
from lara_serve.server.batcher import BatchPolicy
from lara_serve.server.models import ServedModel
from lara_serve.server.repository import read_config

pytestmark = pytest.mark.anyio
V2, V1 = f"/v2/models/{TEXT}/infer", f"/v1/models/{TEXT}:predict"
IMG_V2 = f"/v2/models/{IMAGE}/infer"
HL = "Inference-Header-Content-Length"


def v2(*inputs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"json": {"inputs": list(inputs), **extra}}


def raw(*texts: str) -> dict[str, Any]:
    return {"name": "raw", "datatype": "BYTES", "shape": [len(texts)], "data": list(texts)}


def ids(data: Any, shape: list[int], datatype: str = "INT64", name: str = "input_ids") -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def pixels(value: float) -> dict[str, Any]:
    return {"name": "pixel_values", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [value] * 784}


def binary_raw(element: bytes, prefix: int | None = None, extra: bytes = b"") -> dict[str, Any]:
    """One BYTES `raw` element in the binary extension (optionally with a lying length prefix)."""
    blob = struct.pack("<I", len(element) if prefix is None else prefix) + element
    spec = {"name": "raw", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(blob)}}
    head = json.dumps({"inputs": [spec]}).encode()
    return {"content": head + blob + extra, "headers": {HL: str(len(head))}}


def binary_tensor(name: str, datatype: str, shape: list[int], blob: bytes, size: Any = None) -> dict[str, Any]:
    """One input in the binary extension; `size` overrides its binary_data_size (a lying header)."""
    params = {"binary_data_size": len(blob) if size is None else size}
    head = json.dumps({"inputs": [{"name": name, "datatype": datatype, "shape": shape, "parameters": params}]})
    return {"content": head.encode() + blob, "headers": {HL: str(len(head.encode()))}}


def text_body(content: bytes, media: str = "text/plain") -> dict[str, Any]:
    return {"content": content, "headers": {"content-type": media}}


CASES: list[tuple[str, str, str, dict[str, Any], int, str]] = [
    # (id, method, path, httpx kwargs, status, words in the error)
    ("bad-json-v1", "POST", V1, {"content": b"{not json"}, 400, "instances"),
    ("instances-not-list", "POST", V1, {"json": {"instances": "x"}}, 400, "instances"),
    ("no-instances", "POST", V1, {"json": {"instances": []}}, 400, "instances"),
    (
        "truncate-not-bool-v1",
        "POST",
        V1,
        {"json": {"instances": ["a"], "parameters": {"truncate": "yes"}}},
        400,
        "parameters.truncate",
    ),
    ("bad-json-v2", "POST", V2, {"content": b"[1, 2"}, 400, "JSON"),
    ("no-inputs", "POST", V2, {"json": {"inputs": []}}, 400, "inputs"),
    ("no-data", "POST", V2, v2({"name": "raw", "datatype": "BYTES", "shape": [1]}), 400, "binary_data_size"),
    ("header-length-too-big", "POST", V2, {"content": b"{}", "headers": {HL: "99"}}, 400, HL),
    ("header-length-not-int", "POST", V2, {"content": b"{}", "headers": {HL: "x"}}, 400, HL),
    ("truncate-not-bool-v2", "POST", V2, v2(raw("a"), parameters={"truncate": 1}), 400, "truncate"),
    ("bad-query", "POST", f"/v1/models/{TEXT}:classify?top_k=0", text_body(b"a"), 400, "top_k"),
    ("unknown-model-v1", "POST", "/v1/models/nope:predict", {"json": {"instances": ["a"]}}, 404, "tiny-text"),
    ("unknown-model-v2", "GET", "/v2/models/nope", {}, 404, "available"),
    ("unknown-version", "POST", f"/v2/models/{TEXT}/versions/7/infer", v2(raw("a")), 404, "version"),
    ("unknown-route", "GET", "/v3/everything", {}, 404, "no route"),
    ("wrong-method", "GET", V2, {}, 405, "not allowed"),
    ("text-too-long-v1", "POST", V1, {"json": {"instances": ["x" * (MAX_LENGTH + 1)]}}, 413, "truncat"),
    ("text-too-long-v2", "POST", V2, v2(raw("x" * (MAX_LENGTH + 1))), 413, str(MAX_LENGTH)),
    ("text-too-long-classify", "POST", f"/v1/models/{TEXT}:classify", text_body(b"x" * 999), 413, "truncate"),
    ("ids-too-long", "POST", V2, v2(ids([[5] * 300], [1, 300])), 413, "input_ids"),
    ("wrong-media-type", "POST", f"/v1/models/{TEXT}:classify", text_body(b"a", "application/pdf"), 415, "text/plain"),
    # No Content-Type: the body is sniffed (issue 12); bytes that are neither text nor an image are refused.
    ("no-media-type", "POST", f"/v1/models/{IMAGE}:classify", {"content": bytes(range(256))}, 415, "image/png"),
    (
        "image-to-text-model",
        "POST",
        f"/v1/models/{TEXT}:classify",
        text_body(png_bytes(), "image/png"),
        415,
        "'image/png' of the body not accepted by text model",
    ),
    # Declared charsets are decoded (issue 12); an unknown one is refused.
    (
        "bad-charset",
        "POST",
        f"/v1/models/{TEXT}:classify",
        text_body(b"a", "text/plain; charset=klingon"),
        415,
        "klingon",
    ),
    ("empty-text", "POST", V1, {"json": {"instances": [""]}}, 422, "empty"),
    ("surrogate-v1", "POST", V1, {"content": b'{"instances": ["\\ud800"]}'}, 400, "JSON"),
    # one JSON parser for v1 and v2: a lone surrogate is not valid JSON text for either (400)
    ("surrogate-v2", "POST", V2, {"content": json.dumps(v2(raw("\ud800"))["json"]).encode()}, 400, "JSON"),
    ("bad-utf8", "POST", V2, binary_raw(b"\xff"), 422, "UTF-8"),
    ("bytes-prefix-overrun", "POST", V2, binary_raw(b"ab", prefix=9), 422, "runs past"),
    ("blob-left-over", "POST", V2, binary_raw(b"ab", extra=b"zz"), 400, "after the last"),
    (
        "one-element-for-two",
        "POST",
        V2,
        binary_tensor("raw", "BYTES", [2], struct.pack("<I", 1) + b"a"),
        422,
        "needs 2 BYTES elements, got 1",
    ),
    ("short-prefix", "POST", V2, binary_tensor("raw", "BYTES", [1], b"\x01\x00"), 422, "truncated BYTES length"),
    (
        "ids-size-mismatch",
        "POST",
        V2,
        binary_tensor("input_ids", "INT64", [1, 2], b"\x05" + b"\x00" * 7),
        422,
        "needs 16 bytes, got 8",
    ),
    (
        "binary-size-bool",
        "POST",
        V2,
        binary_tensor("raw", "BYTES", [1], struct.pack("<I", 1) + b"a", size=True),
        400,
        "binary_data_size=True",
    ),
    ("binary-size-negative", "POST", V2, binary_tensor("raw", "BYTES", [1], b"", size=-1), 400, "binary_data_size=-1"),
    ("float-ids", "POST", V2, v2(ids([[5.0]], [1, 1])), 422, "integers"),
    ("wrong-input-name", "POST", V2, v2({**raw("a"), "name": "text"}), 422, "raw"),
    ("raw-plus-ids", "POST", V2, v2(raw("a"), ids([[5]], [1, 1])), 422, "alone"),
    ("wrong-dtype", "POST", V2, v2(ids([[5]], [1, 1], "INT32")), 422, "INT64"),
    ("shape-mismatch", "POST", V2, v2(ids([[5, 6]], [1, 3])), 422, "needs 3"),
    ("negative-dim", "POST", V2, v2(ids([], [1, -1])), 422, "negative"),
    ("ids-out-of-vocab", "POST", V2, v2(ids([[999]], [1, 1])), 422, "[0, 257)"),
    ("mask-not-binary", "POST", V2, v2(ids([[5]], [1, 1]), ids([[2]], [1, 1], name="attention_mask")), 422, "0 and 1"),
    ("mask-all-zero", "POST", V2, v2(ids([[5]], [1, 1]), ids([[0]], [1, 1], name="attention_mask")), 422, "real"),
    ("strings-as-ints", "POST", V2, v2(ids([["5"]], [1, 1])), 422, "integers"),
    ("unsupported-dtype", "POST", V2, v2(ids([[5]], [1, 1], "BF16")), 422, "supported"),
    ("empty-batch", "POST", V2, v2(raw()), 422, "at least one"),
    ("unknown-output", "POST", V2, v2(raw("a"), outputs=[{"name": "logits"}]), 422, "probabilities"),
    ("bytes-as-numbers", "POST", V2, v2({**raw("a"), "data": [1]}), 422, "strings"),
    ("nan-pixels", "POST", IMG_V2, {"content": json.dumps(v2(pixels(float("nan")))["json"])}, 422, "finite"),
    ("pixels-shape", "POST", IMG_V2, v2({**pixels(0.0), "shape": [1, 28, 28], "data": [0.0] * 784}), 422, "28"),
    ("not-an-image", "POST", f"/v1/models/{IMAGE}:classify", text_body(b"\x89PNG nope", "image/png"), 422, "decode"),
    ("text-to-image", "POST", f"/v1/models/{IMAGE}:predict", {"json": {"instances": ["a"]}}, 422, "b64"),
    ("bad-b64", "POST", f"/v1/models/{IMAGE}:predict", {"json": {"instances": [{"b64": "!!"}]}}, 422, "base64"),
]


@pytest.fixture(scope="module")
async def shared_client(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(Settings(model_repository=repo, max_queue_delay_ms=0.5)) as c:
        yield c


@pytest.mark.parametrize(("method", "path", "kwargs", "status", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
async def test_error_table(
    shared_client: httpx.AsyncClient, method: str, path: str, kwargs: dict[str, Any], status: int, words: str
) -> None:
    response = await shared_client.request(method, path, **kwargs)
    assert response.status_code == status, response.text
    body = response.json()
    assert words, "every case names words its message must contain"
    assert set(body) == {"error"} and words in body["error"]


async def test_limits_body_and_pixels(make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings(max_body_bytes=2048, max_image_pixels=32 * 32, max_queue_size=4,
                                   max_batch_size=2)) as c:  # fmt: skip
        big = await c.post(V1, json={"instances": ["x" * 4096]})
        assert big.status_code == 413 and "max_body_bytes" in big.json()["error"]

        async def chunks() -> Any:  # no Content-Length: the limit applies while streaming
            for _ in range(4):
                yield b"x" * 1024

        streamed = await c.post(V1, content=chunks())
        assert streamed.status_code == 413
        huge = await c.post(
            f"/v1/models/{IMAGE}:classify", content=flat_png(64, 64), headers={"content-type": "image/png"}
        )
        assert huge.status_code == 413 and "pixels" in huge.json()["error"]
        many = await c.post(V1, json={"instances": ["a"] * 5})
        assert many.status_code == 413 and "max_queue_size" in many.json()["error"]


def flat_png(width: int, height: int) -> bytes:
    """A one-colour PNG: tiny file, many pixels."""
    buffer = io.BytesIO()
    Image.new("L", (width, height), color=128).save(buffer, format="PNG")
    return buffer.getvalue()


class SlowBackend:
    """Wraps a real backend; sleeps first (queue-full and timeout tests), or fails."""

    def __init__(self, inner: OnnxRuntimeBackend, delay_s: float, fail: bool = False) -> None:
        self.inner, self.delay_s, self.fail = inner, delay_s, fail
        self.name, self.device, self.calls = "slow", "cpu", 0

    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        self.calls += 1
        time.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("device on fire")
        return self.inner.run(inputs)

    def close(self) -> None:
        pass


def slow_text_model(repo: Path, delay_s: float, fail: bool = False, **policy: Any) -> ServedModel:
    config = read_config(repo / TEXT)
    backend = SlowBackend(OnnxRuntimeBackend(repo / TEXT, config, "cpu"), delay_s, fail)
    return ServedModel(config, backend, BatchPolicy(**policy))  # type: ignore[arg-type]


async def test_queue_full_is_429_with_retry_after(repo: Path, make_settings: Callable[..., Settings]) -> None:
    model = slow_text_model(repo, 0.3, max_batch_size=1, max_queue_size=1, max_queue_delay_s=0.0)
    async with serve(make_settings(), [model]) as c:
        responses = await asyncio.gather(*(c.post(V1, json={"instances": [f"doc {i}"]}) for i in range(4)))
    statuses = sorted(r.status_code for r in responses)
    assert 429 in statuses and 200 in statuses
    refused = next(r for r in responses if r.status_code == 429)
    assert int(refused.headers["retry-after"]) >= 1 and "full" in refused.json()["error"]


async def test_timeout_is_504_and_backend_failure_reaches_the_client(
    repo: Path, make_settings: Callable[..., Settings]
) -> None:
    model = slow_text_model(repo, 0.5, max_batch_size=1, max_queue_delay_s=0.0)
    async with serve(make_settings(request_timeout_s=0.1), [model]) as c:
        responses = await asyncio.gather(*(c.post(V1, json={"instances": [f"doc {i}"]}) for i in range(3)))
        # The first is computing when its timeout passes: it finishes (dropping it would waste the work).
        # The two queued behind it time out: 504, never computed.
        assert sorted(r.status_code for r in responses) == [200, 504, 504]
        assert "request_timeout_s" in next(r for r in responses if r.status_code == 504).json()["error"]
        await asyncio.sleep(0.6)
    assert model.backend.calls == 1  # type: ignore[attr-defined]  # the timed-out queued items were skipped

    failing = slow_text_model(repo, 0.0, fail=True, max_batch_size=4, max_queue_delay_s=0.02)
    async with serve(make_settings(), [failing]) as c:
        responses = await asyncio.gather(*(c.post(V1, json={"instances": [f"doc {i}"]}) for i in range(3)))
    assert all(r.status_code == 500 and "device on fire" in r.json()["error"] for r in responses)


# -- fuzzing: no input may produce a 500 -------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_tensor = st.fixed_dictionaries(
    {"name": st.sampled_from(["raw", "input_ids", "attention_mask", "pixel_values", "x"]),
     "datatype": st.sampled_from(["BYTES", "INT64", "INT32", "FP32", "BOOL", "FP16", "nope"]),
     "shape": st.lists(st.integers(-1, 4), max_size=4), "data": _json},
    optional={"parameters": st.fixed_dictionaries({"binary_data_size": st.integers(-2, 64) | _json})},
)  # fmt: skip


@pytest.fixture(scope="module")
def portal_client(repo: Path) -> Iterator[tuple[BlockingPortal, httpx.AsyncClient]]:
    """A served app on a background event loop, for the (synchronous) hypothesis test."""
    with start_blocking_portal() as portal:
        settings = Settings(model_repository=repo, max_queue_delay_ms=0.5)
        with portal.wrap_async_context_manager(serve(settings)) as client:
            yield portal, client


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.sampled_from([V2, IMG_V2, V1, f"/v1/models/{IMAGE}:predict", f"/v1/models/{TEXT}:classify"]),
    body=st.one_of(
        st.binary(max_size=64),
        _json.map(lambda v: json.dumps(v).encode()),
        st.lists(_tensor, min_size=1, max_size=3).map(lambda t: json.dumps({"inputs": t}).encode()),
        st.lists(
            st.text(max_size=300)
            | st.builds(dict, b64=st.binary(max_size=30).map(lambda b: base64.b64encode(b).decode())),
            max_size=3,
        ).map(lambda i: json.dumps({"instances": i}).encode()),
    ),  # fmt: skip
    header_length=st.none() | st.integers(-1, 80).map(str),
)
def test_fuzzed_bodies_never_500(
    portal_client: tuple[BlockingPortal, httpx.AsyncClient], path: str, body: bytes, header_length: str | None
) -> None:
    portal, client = portal_client
    headers = {HL: header_length} if header_length is not None else {}
    headers["content-type"] = "text/plain"
    response = portal.call(lambda: client.post(path, content=body, headers=headers))
    assert response.status_code < 500, (response.status_code, response.text)
    if response.status_code >= 400:
        assert set(response.json()) == {"error"}


# Binary bodies whose header agrees with the data (so decoding reaches the per-tensor checks), valid for the
# served models, then at most one corruption. Valid ones must be answered 200, corrupted ones a 4xx.
_CORRUPT = ["none", "none", "drop_last_byte", "extra_byte", "size_plus_one", "size_minus_one", "one_more_element"]


@st.composite
def _binary_request(draw: st.DrawFn) -> tuple[str, list[tuple[dict[str, Any], bytes]]]:
    kind = draw(st.sampled_from(["raw", "ids", "pixels"]))
    rows = draw(st.integers(1, 3))
    if kind == "raw":
        texts = draw(st.lists(st.text(min_size=1, max_size=12), min_size=rows, max_size=rows))
        blob = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)
        return V2, [({"name": "raw", "datatype": "BYTES", "shape": [rows]}, blob)]
    if kind == "ids":
        length = draw(st.integers(1, 8))
        values = draw(st.lists(st.integers(0, 256), min_size=rows * length, max_size=rows * length))
        inputs = [
            (
                {"name": "input_ids", "datatype": "INT64", "shape": [rows, length]},
                struct.pack(f"<{len(values)}q", *values),
            )
        ]
        if draw(st.booleans()):
            mask = [1] + draw(st.lists(st.integers(0, 1), min_size=length - 1, max_size=length - 1))
            inputs.append(({"name": "attention_mask", "datatype": "INT64", "shape": [rows, length]},
                           struct.pack(f"<{rows * length}q", *(mask * rows))))  # fmt: skip
        return V2, inputs
    pixels = np.random.default_rng(draw(st.integers(0, 2**32))).uniform(-3, 3, 784).astype("<f4")  # [784]
    return IMG_V2, [({"name": "pixel_values", "datatype": "FP32", "shape": [1, 1, 28, 28]}, pixels.tobytes())]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=_binary_request(), corruption=st.sampled_from(_CORRUPT), data=st.data())
def test_fuzzed_consistent_binary_bodies_are_answered_or_refused_never_500(
    portal_client: tuple[BlockingPortal, httpx.AsyncClient],
    request: tuple[str, list[tuple[dict[str, Any], bytes]]],
    corruption: str,
    data: st.DataObject,
) -> None:
    portal, client = portal_client
    path, inputs = request
    specs = [{**spec, "parameters": {"binary_data_size": len(blob)}} for spec, blob in inputs]
    victim = specs[data.draw(st.integers(0, len(specs) - 1))]
    if corruption in ("size_plus_one", "size_minus_one"):
        victim["parameters"]["binary_data_size"] += 1 if corruption == "size_plus_one" else -1
    elif corruption == "one_more_element":
        victim["shape"] = [*victim["shape"][:-1], victim["shape"][-1] + 1]
    head = json.dumps({"inputs": specs}).encode()
    content = head + b"".join(blob for _, blob in inputs)
    content = {"drop_last_byte": content[:-1], "extra_byte": content + b"\x00"}.get(corruption, content)
    response = portal.call(lambda: client.post(path, content=content, headers={HL: str(len(head))}))
    if corruption == "none":
        assert response.status_code == 200, response.text
        assert len(response.json()["outputs"][0]["data"]) > 0
    else:
        assert response.status_code in (400, 422), (corruption, response.status_code, response.text)
        assert set(response.json()) == {"error"}
