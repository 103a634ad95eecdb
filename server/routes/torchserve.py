"""TorchServe front door: inference (`/predictions`, `/explanations`) and the management API's model calls
(`GET /models`, `GET /models/<m>`, `POST /models?url=`, `DELETE /models/<m>`), on the main port.

The body is classified as sent, as TorchServe hands it to its handler: `curl -T doc.txt` (PUT, no type),
`curl --data-binary @doc.txt` (curl's default x-www-form-urlencoded: the body is the text, `=` cuts nothing)
or any other type; only image types are read as images, and multipart/form-data as one file per part. A
JSON object with a `data` (or `body`) field, the key TorchServe's handlers read, sends that value: a text,
or for an image model the file in base64; a list of them is a batch. Any other JSON body is, for a text
model, the text itself. Versions compare as numbers: TorchServe's `1.0` is the model's version `1`.
Register and unregister are the v2 repository load/unload (lara_serve.server.routes.triton): the same
model_control rule, lock and API key.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, TypeVar

import numpy as np
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from lara_serve.server import explain as explainer
from lara_serve.server.content_types import IMAGE_TYPES, is_json
from lara_serve.server.errors import ErrorKind, ServeError, invalid, not_found
from lara_serve.server.inputs import OCTET_STREAM, model_bytes, parse_content_type, to_utf8
from lara_serve.server.models import ServedModel
from lara_serve.server.preprocess import truncation_side
from lara_serve.server.routes import common, triton
from lara_serve.server.routes.common import State, predictions, read_body, require_api_key, timing_headers, track
from lara_serve.server.routes.tei import run
from lara_serve.server.routes.v1 import _ERRORS, _form_files, _to_items
from lara_serve.server.schemas import run_sized

router = APIRouter(tags=["TEI and TorchServe"], dependencies=[Depends(require_api_key)], responses=_ERRORS)

_TS_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "application/json": {"schema": {"type": "object", "properties": {"data": {"type": "string"}}}},
            "multipart/form-data": {
                "schema": {"type": "object", "properties": {"data": {"type": "string", "format": "binary"}}}
            },
        },
    }
}
_TRUNCATE = Query(description="Long texts: see :classify")


def _model(state: common.AppState, name: str, version: str | None) -> ServedModel:
    """The model; a version equal as a number (TorchServe's archiver writes `1.0`) is the model's version."""
    model = state.model(name)
    if version is None or version == model.version:
        return model
    try:
        same = Decimal(version) == Decimal(model.version)
    except InvalidOperation:
        same = False
    if not same:
        raise not_found(f"model {name!r} has no version {version!r}; available: [{model.version!r}]")
    return model


async def _bodies(request: Request, model: ServedModel, max_files: int) -> list[bytes]:
    """The request's inputs, in the model's bytes: multipart parts, a JSON `data` field, or the raw body."""
    media, params = parse_content_type(request.headers.get("content-type"))
    if media == "multipart/form-data":
        return [data for _, data in await _form_files(request, model, max_files)]
    body = await read_body(request)
    if is_json(media):
        data = await run_sized(len(body), _json_data, body)
        if data is not None:
            return _data_values(model, data, max_files)
    task = model.config.task
    if task == "text" and media not in (*IMAGE_TYPES, "", OCTET_STREAM):
        return [await run_sized(len(body), to_utf8, body, params.get("charset"))]  # any other type is text
    content_type = request.headers.get("content-type") if media in IMAGE_TYPES else OCTET_STREAM
    return [await run_sized(len(body), model_bytes, task, model.name, body, content_type)]


def _json_data(body: bytes) -> Any:
    """TorchServe's `{"data": ...}` (or `{"body": ...}`) value; None when the body is not such an object."""
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(value, dict):
        for key in ("data", "body"):
            if key in value:
                return value[key]
    return None


def _data_values(model: ServedModel, data: Any, max_files: int) -> list[bytes]:
    values = data if isinstance(data, list) else [data]
    if not values or len(values) > max_files or not all(isinstance(v, str) for v in values):
        raise invalid(f"'data' must be a string or a list of 1-{max_files} strings (texts, or base64 image files)")
    if model.config.task == "text":
        return [v.encode("utf-8", "surrogatepass") for v in values]
    try:
        return [base64.b64decode(v, validate=True) for v in values]
    except (binascii.Error, ValueError):
        raise invalid(f"image model {model.name!r}: 'data' must hold base64 image files") from None


_Route = TypeVar("_Route", bound=Callable[..., Any])


def _inference_routes(kind: str) -> Callable[[_Route], _Route]:
    """POST, and PUT (`curl -T`), on /{kind}/{name} and /{kind}/{name}/{version}, as TorchServe serves them."""

    def register(route: _Route) -> _Route:
        for path, which in ((f"/{kind}/{{name}}", ""), (f"/{kind}/{{name}}/{{version}}", " (version)")):
            router.post(path, openapi_extra=_TS_DOC, summary=f"TorchServe {kind}{which}")(route)
            router.put(path, openapi_extra=_TS_DOC, summary=f"TorchServe {kind}{which} (curl -T)")(route)
        return route

    return register


@_inference_routes("predictions")
async def torchserve_predict(
    name: str,
    request: Request,
    state: State,
    version: str | None = None,
    truncate: Annotated[str | None, _TRUNCATE] = None,
    top_k: Annotated[int | None, Query(ge=1, description="Labels in the answer (default: default_top_k)")] = None,
) -> JSONResponse:
    """As `curl -T kitten.png .../predictions/<model>` or `-F data=@kitten.png`: the file's top labels as
    `{label: probability}`, best first, as TorchServe's classifier handlers answer. Several inputs (multipart
    parts, a `data` list): a list of such objects, in order."""
    with track(state, name):
        model = _model(state, name, version)
        files = await _bodies(request, model, state.settings.max_queue_size)
        items = await _to_items(
            model, files, truncation_side(truncate, default=model.default_truncation), state.settings.max_image_pixels
        )
        scored, headers = await run(state, model, items)
        k = min(top_k or state.settings.default_top_k, len(model.config.labels))
        rows = []
        for s in scored:
            order = np.argsort(-s.probabilities, kind="stable")[:k]
            rows.append({model.config.labels[i]: float(s.probabilities[i]) for i in order})
        return JSONResponse(rows[0] if len(rows) == 1 else rows, headers=headers)


@_inference_routes("explanations")
async def torchserve_explain(
    name: str,
    request: Request,
    state: State,
    version: str | None = None,
    truncate: Annotated[str | None, _TRUNCATE] = None,
    max_passages: Annotated[int | None, Query(ge=2, le=64, description="Passages (default: the server's)")] = None,
) -> JSONResponse:
    """Text models: the prediction and each passage's contribution to it (as :explain); the body as on
    /predictions. Several inputs: a list, in order."""
    settings = state.settings
    with track(state, name):
        model = _model(state, name, version)
        explainer.require_text(model)
        files = await _bodies(request, model, settings.max_queue_size)
        items = await _to_items(
            model, files, truncation_side(truncate, default=model.default_truncation), settings.max_image_pixels
        )
        results, passages = await explainer.explain(
            model, items, max_passages or settings.explain_passages, settings.request_timeout_s, settings.max_queue_size
        )
        preds = predictions(model, [r.value for r in results], settings.default_top_k)
        state.metrics.observe_items(model.name, [i.length for i in items], [r.queue_s + r.inference_s for r in results])
        rows = [
            {**p.model_dump(exclude={"truncated"}), "truncated": i.truncated, "length": i.length, "passages": rows}
            for p, i, rows in zip(preds, items, passages, strict=True)
        ]
        return JSONResponse(rows[0] if len(rows) == 1 else rows, headers=timing_headers(state, name, results))


# -- management API (TorchServe serves it on port 8081; here on the main port, behind the API key) ---------


@router.get("/models", summary="TorchServe: list registered models")
async def list_models(
    state: State,
    limit: Annotated[int, Query(ge=1, le=1000, description="Models per page")] = 100,
    next_page_token: Annotated[int, Query(ge=0, description="Where the page starts (from nextPageToken)")] = 0,
) -> dict[str, Any]:
    names = sorted(state.registry.models) if state.started else []
    page = names[next_page_token : next_page_token + limit]
    out: dict[str, Any] = {"models": [{"modelName": n, "modelUrl": n} for n in page]}
    if next_page_token + limit < len(names):
        out["nextPageToken"] = str(next_page_token + limit)
    return out


@router.get("/models/{name}", summary="TorchServe: describe a model")
@router.get("/models/{name}/{version}", summary="TorchServe: describe a model version (or all)")
async def describe_model(name: str, state: State, version: str | None = None) -> list[dict[str, Any]]:
    model = _registered(state, name, None if version == "all" else version)
    settings = state.settings
    worker = {"id": "0", "status": "READY", "pid": os.getpid(), "gpu": model.backend.device == "cuda"}
    return [
        {
            "modelName": model.name,
            "modelVersion": model.version,
            "modelUrl": model.name,
            "runtime": "python",
            "minWorkers": 1,
            "maxWorkers": 1,
            "batchSize": settings.max_batch_size,
            "maxBatchDelay": round(settings.max_queue_delay_ms),
            "responseTimeout": round(settings.request_timeout_s),
            "workers": [worker],
        }
    ]


@router.post("/models", summary="TorchServe: register a model (a folder of the model repository)")
async def register_model(
    request: Request,
    state: State,
    url: Annotated[str, Query(description="The model's folder name in the model repository")],
    model_name: Annotated[str | None, Query(description="Must equal url when given (no renaming)")] = None,
) -> dict[str, str]:
    """Loads the folder's model (model_control=explicit); TorchServe's other query parameters are ignored."""
    triton._check_control(state)
    if model_name is not None and model_name != url:
        raise invalid(f"model_name {model_name!r} must equal url {url!r}: a model is served under its folder name")
    if url in state.registry.models:
        raise ServeError(ErrorKind.CONFLICT, f"model {url!r} is already registered; DELETE /models/{url} first")
    await triton.load(url, {}, state, triton.control_lock(request.app.state))
    version = state.registry.models[url].version
    return {"status": f'Model "{url}" Version: {version} registered with 1 initial workers'}


@router.delete("/models/{name}", summary="TorchServe: unregister a model")
@router.delete("/models/{name}/{version}", summary="TorchServe: unregister a model version")
async def unregister_model(name: str, request: Request, state: State, version: str | None = None) -> dict[str, str]:
    triton._check_control(state)  # off (400) before unknown (404), as the v2 unload route answers
    _registered(state, name, version)
    await triton.unload(name, state, triton.control_lock(request.app.state))
    return {"status": f'Model "{name}" unregistered'}


def _registered(state: common.AppState, name: str, version: str | None) -> ServedModel:
    if state.started and not state.draining and name not in state.registry.models:
        raise not_found(f"model {name!r} is not registered; registered: {sorted(state.registry.models)}")
    return _model(state, name, version)
