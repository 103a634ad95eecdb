"""/openapi.json as the server answers: the error statuses that the middlewares and handlers give on
every route, and no response FastAPI assumes but this server never sends.

FastAPI documents what a route function returns; the answers that come from around it are added here by
rule, once, so no route repeats them: a validation error is 400 in the error shape (never FastAPI's 422
HTTPValidationError), an unknown model or version in the path is 404, another method on a path is 405,
a route behind the API key can answer 401, and a route that reads a body can answer 400 (a corrupt
compressed body), 413 (max_body_bytes, also once decompressed), 415 (an unknown Content-Encoding) and
503 (max_large_bodies). tests/server/test_openapi_conformance.py checks real answers against it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.openapi.utils import get_openapi
from fastapi.routing import iter_route_contexts

from lara_serve.server.schemas import V1ExplainRequest, V1PredictRequest, V2InferRequest

_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
_BODY_ERRORS = {
    "400": "Malformed body: not JSON, not the request's shape, or a corrupt gzip/deflate stream",
    "413": "Body over max_body_bytes (as sent, or once decompressed)",
    "415": "Unsupported Content-Type or Content-Encoding",
    "503": "Not ready, draining, or max_large_bodies large bodies in flight (Retry-After)",
}
# Answers of a route that its function does not show (it returns a Response of its own).
_BINARY_INFER = {
    "application/octet-stream": {
        "schema": {"type": "string", "format": "binary"},
        "description": "Binary tensor extension (outputs with binary_data): the JSON header, its length in "
        "the Inference-Header-Content-Length header, then the raw tensors",
    }
}
_EXTRA: dict[tuple[str, str], dict[str, Any]] = {
    ("get", "/"): {"307": {"description": "A browser (Accept: text/html) is redirected to /ui"}},
    ("post", "/v2/models/{name}/infer"): {"200": {"content": _BINARY_INFER}},
    ("post", "/v2/models/{name}/versions/{version}/infer"): {"200": {"content": _BINARY_INFER}},
}


def install(app: FastAPI, key_checks: tuple[Callable[..., Any], ...]) -> None:
    """app.openapi builds the document once: FastAPI's, the hand-parsed bodies' schemas, the rules above.
    `key_checks`: the dependencies that answer 401 (the API key)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)  # fmt: skip
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in (V2InferRequest, V1PredictRequest, V1ExplainRequest):
                body = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(body.pop("$defs", {}))
                components[model.__name__] = body
            keyed = {
                (method.lower(), route.path_format)
                for route in iter_route_contexts(app.routes)  # included routers are flattened lazily
                if isinstance(getattr(route, "dependant", None), Dependant) and _uses(route.dependant, key_checks)
                for method in getattr(route, "methods", None) or ()
            }
            for path, operations in schema.get("paths", {}).items():
                for method, operation in operations.items():
                    _declare_errors(method, path, operation, (method, path) in keyed)
            for unused in ("HTTPValidationError", "ValidationError"):
                components.pop(unused, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _uses(dependant: Dependant, calls: tuple[Callable[..., Any], ...]) -> bool:
    return dependant.call in calls or any(_uses(d, calls) for d in dependant.dependencies)


def _declare_errors(method: str, path: str, operation: dict[str, Any], keyed: bool) -> None:
    responses: dict[str, Any] = operation.setdefault("responses", {})
    validation = responses.get("422", {}).get("content", {}).get("application/json", {}).get("schema", {})
    if validation.get("$ref", "").endswith("/HTTPValidationError"):
        del responses["422"]  # never sent: RequestValidationError is answered 400 (lara_serve.server.app)
        if any(p.get("in") == "query" for p in operation.get("parameters", [])):
            _add(responses, "400", "Invalid query parameters")
    if "{" in path:
        _add(responses, "404", "No such model, version or file")
    if keyed:
        _add(responses, "401", "Missing or wrong API key (Authorization: Bearer, or X-API-Key)")
    if method in ("post", "put"):
        for status, why in _BODY_ERRORS.items():
            _add(responses, status, why)
    _add(responses, "405", "Another method than this path serves (the Allow header lists them)")
    for status, extra in _EXTRA.get((method, path), {}).items():
        declared = responses.setdefault(status, {"description": extra.get("description", "")})
        declared.setdefault("content", {}).update(extra.get("content", {}))
        if not declared["content"]:
            del declared["content"]


def _add(responses: dict[str, Any], status: str, description: str) -> None:
    if status not in responses:
        responses[status] = {"description": description, "content": _ERROR}
