"""/openapi.json is true to the responses: real requests over every documented route (successes and the
errors each can answer), each response checked against the document: status declared, content type
declared, JSON body valid against the declared schema ($refs resolved)."""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from server_helpers import IMAGE, TEXT, png_bytes, serve

from lara_serve.server import Settings

KEY = "conformance-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
V2_BODY = {"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [1], "data": ["some text"]}]}
BOMB = gzip.compress(bytes(64 * 1024 * 1024))  # 64 MiB decoded: over max_body_bytes once inflated
NO = object()  # "any status": a route whose answer depends on work in progress elsewhere

# (method, path, request kwargs, expected status). No `headers` in kwargs: AUTH is added unless "noauth".
CASES: list[tuple[str, str, dict[str, Any], int | object]] = [
    ("GET", "/", {}, 200),
    ("GET", "/", {"headers": {"Accept": "text/html"}}, 307),
    ("GET", "/health", {}, 200),
    ("GET", "/ping", {}, 200),
    ("GET", "/info", {}, 200),
    ("GET", "/metrics", {}, 200),
    ("GET", "/metrics", {"noauth": True}, 401),
    ("GET", "/v2/health/live", {}, 200),
    ("GET", "/v2/health/ready", {}, 200),
    ("GET", "/v2", {}, 200),
    ("GET", f"/v2/models/{TEXT}", {}, 200),
    ("GET", "/v2/models/nope", {}, 404),
    ("GET", f"/v2/models/{TEXT}/versions/1", {}, 200),
    ("GET", f"/v2/models/{TEXT}/versions/9", {}, 404),
    ("GET", f"/v2/models/{TEXT}/ready", {}, 200),
    ("GET", f"/v2/models/{TEXT}/versions/1/ready", {}, 200),
    ("GET", f"/v2/models/{TEXT}", {"noauth": True}, 401),
    ("POST", f"/v2/models/{TEXT}/infer", {"json": V2_BODY}, 200),
    ("POST", f"/v2/models/{TEXT}/versions/1/infer", {"json": V2_BODY}, 200),
    ("POST", f"/v2/models/{TEXT}/infer", {"json": {**V2_BODY, "parameters": {"binary_data_output": True}}}, 200),
    ("POST", f"/v2/models/{TEXT}/infer", {"content": b"{nope"}, 400),
    ("POST", f"/v2/models/{TEXT}/infer", {"content": gzip.compress(b"{}")[:-4], "gz": True}, 400),
    ("POST", "/v2/models/nope/infer", {"json": V2_BODY}, 404),
    ("POST", f"/v2/models/{TEXT}/infer", {"json": V2_BODY, "noauth": True}, 401),
    ("POST", f"/v2/models/{TEXT}/infer", {"content": BOMB, "gz": True}, 413),
    ("POST", f"/v2/models/{TEXT}/infer", {"content": b"{}", "headers": {"Content-Encoding": "br"}}, 415),
    ("GET", f"/v2/models/{TEXT}/infer", {}, 405),
    ("GET", f"/v2/models/{TEXT}/config", {}, 200),
    ("GET", f"/v2/models/{TEXT}/versions/1/config", {}, 200),
    ("GET", "/v2/models/nope/config", {}, 404),
    ("GET", f"/v2/models/{TEXT}/config", {"noauth": True}, 401),
    ("GET", "/v2/models/stats", {}, 200),
    ("GET", f"/v2/models/{TEXT}/stats", {}, 200),
    ("GET", f"/v2/models/{TEXT}/versions/1/stats", {}, 200),
    ("GET", "/v2/models/nope/stats", {}, 404),
    ("POST", "/v2/repository/index", {}, 200),
    ("POST", f"/v2/repository/models/{IMAGE}/unload", {}, 200),
    ("POST", f"/v2/repository/models/{IMAGE}/load", {}, 200),
    ("POST", "/v2/repository/models/nope/load", {}, NO),
    ("GET", "/v1/models", {}, 200),
    ("GET", f"/v1/models/{TEXT}", {}, 200),
    ("GET", "/v1/models/nope", {}, 404),
    ("POST", f"/v1/models/{TEXT}:predict", {"json": {"instances": ["a text"]}}, 200),
    ("POST", f"/v1/models/{TEXT}:predict", {"json": {"instances": ["x" * 999]}}, 413),
    ("POST", f"/v1/models/{TEXT}:predict", {"json": {"instances": [""]}}, 422),
    ("POST", f"/v1/models/{TEXT}:predict", {"json": {"nope": 1}}, 400),
    ("POST", "/v1/models/nope:predict", {"json": {"instances": ["a"]}}, 404),
    ("GET", f"/v1/models/{TEXT}:predict", {}, 405),
    ("POST", f"/v1/models/{TEXT}:classify", {"content": b"a text", "headers": {"Content-Type": "text/plain"}}, 200),
    ("POST", f"/v1/models/{IMAGE}:classify", {"content": png_bytes(), "headers": {"Content-Type": "image/png"}}, 200),
    ("POST", f"/v1/models/{IMAGE}:classify", {"content": bytes(range(256))}, 415),
    ("POST", f"/v1/models/{TEXT}:explain", {"json": {"instances": ["one. two. three. four."]}}, 200),
    ("POST", "/v1/models/nope:explain", {"json": {"instances": ["a"]}}, 404),
    ("POST", "/predict", {"json": {"inputs": "a text"}}, 200),
    ("POST", "/predict", {"json": {"nope": 1}}, 400),
    ("POST", "/", {"json": {"inputs": "a text"}}, 200),
    ("POST", "/invocations", {"json": {"inputs": ["a", "b"]}}, 200),
    ("POST", f"/predictions/{TEXT}", {"content": b"a text", "headers": {"Content-Type": "text/plain"}}, 200),
    ("PUT", f"/predictions/{TEXT}", {"content": b"a text", "headers": {"Content-Type": "text/plain"}}, 200),
    ("POST", f"/predictions/{TEXT}/1", {"content": b"a text", "headers": {"Content-Type": "text/plain"}}, 200),
    ("PUT", f"/predictions/{TEXT}/1", {"content": b"a text", "headers": {"Content-Type": "text/plain"}}, 200),
    ("POST", "/predictions/nope", {"content": b"a text"}, 404),
    ("POST", f"/explanations/{TEXT}", {"content": b"one. two. three.", "headers": {"Content-Type": "text/plain"}}, NO),
    ("PUT", f"/explanations/{TEXT}", {"content": b"one. two. three.", "headers": {"Content-Type": "text/plain"}}, NO),
    ("POST", f"/explanations/{TEXT}/1", {"content": b"one. two.", "headers": {"Content-Type": "text/plain"}}, NO),
    ("PUT", f"/explanations/{TEXT}/1", {"content": b"one. two.", "headers": {"Content-Type": "text/plain"}}, NO),
    ("GET", "/models", {}, 200),
    ("GET", "/models", {"params": {"limit": "0"}}, 400),
    ("GET", f"/models/{TEXT}", {}, 200),
    ("GET", f"/models/{TEXT}/all", {}, 200),
    ("GET", "/models/nope", {}, 404),
    ("DELETE", f"/models/{IMAGE}", {}, NO),
    ("DELETE", f"/models/{IMAGE}/1", {}, NO),
    ("POST", "/models", {"params": {"url": IMAGE}}, NO),
    ("POST", "/models", {}, 400),
]


def _operation(doc: dict[str, Any], method: str, path: str) -> tuple[str, dict[str, Any] | None]:
    """(path template, the operation for `method`, or None when the template has no such method)."""
    matches = [t for t in doc["paths"] if re.fullmatch(re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(t)), path)]
    assert matches, f"{method} {path}: no path of /openapi.json matches"
    template = max(matches, key=lambda t: len(re.sub(r"\{[^}]+\}", "", t)))  # the most literal one
    return template, doc["paths"][template].get(method.lower())


def _check(doc: dict[str, Any], method: str, path: str, response: httpx.Response) -> list[str]:
    template, operation = _operation(doc, method, path)
    where = f"{method} {path} -> {response.status_code}"
    if operation is None:  # 405: declared on the operations the path has
        operations = doc["paths"][template].values()
        declared = [op["responses"].get(str(response.status_code)) for op in operations]
        return [] if all(declared) else [f"{where}: not declared on {template}"]
    declared = operation["responses"].get(str(response.status_code))
    if declared is None:
        return [f"{where}: status not declared (declared: {sorted(operation['responses'])})"]
    media = response.headers.get("content-type", "").split(";")[0].strip().lower()
    content = declared.get("content", {})
    if not response.content:
        return [] if not content or media in content else [f"{where}: empty body, {sorted(content)} declared"]
    if media not in content:
        return [f"{where}: content type {media!r} not declared (declared: {sorted(content)})"]
    schema = content[media].get("schema")
    if media != "application/json" or not schema:
        return []
    validator = Draft202012Validator({"components": doc["components"], "allOf": [schema]})
    errors = [e.message for e in validator.iter_errors(response.json())]
    return [f"{where}: body does not match the schema: {errors[:3]}"] if errors else []


@pytest.mark.anyio
async def test_every_route_answers_as_openapi_json_declares(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(api_key=KEY, model_control="explicit", max_body_bytes=16 * 1024 * 1024)
    async with serve(settings) as client:
        doc = (await client.get("/openapi.json")).json()
        problems: list[str] = []
        covered: set[tuple[str, str]] = set()
        for method, path, kwargs, expected in CASES:
            kwargs = dict(kwargs)
            headers = dict(kwargs.pop("headers", {}))
            if not kwargs.pop("noauth", False):
                headers.update(AUTH)
            if kwargs.pop("gz", False):
                headers["Content-Encoding"] = "gzip"
            response = await client.request(method, path, headers=headers, timeout=30, **kwargs)
            if expected is not NO:
                assert response.status_code == expected, (method, path, response.status_code, response.text[:300])
            problems += _check(doc, method, path, response)
            template, operation = _operation(doc, method, path)
            if operation is not None:
                covered.add((method.lower(), template))
    assert not problems, "\n".join(problems)
    documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert documented <= covered, f"routes without a request here: {sorted(documented - covered)}"


def test_no_response_model_is_declared_that_is_never_sent() -> None:
    """FastAPI's 422 HTTPValidationError is never sent: validation errors are 400 in the error shape."""
    from lara_serve.server import create_app

    doc = json.loads(json.dumps(create_app(Settings()).openapi()))
    assert "HTTPValidationError" not in json.dumps(doc["paths"])
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    metrics = doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]
