"""KServe v1 routes (`:predict`) and the curl-friendly `:classify` (raw image or text body)."""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from server.errors import ErrorKind, ServeError, invalid, malformed
from server.models import ServedModel
from server.preprocess import Item
from server.routes.common import State, predictions, require_api_key, timing_headers, track
from server.schemas import B64Instance, ClassifyResponse, ErrorBody, V1PredictRequest, V1PredictResponse

IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp", "image/bmp", "image/gif")
TEXT_TYPES = ("text/plain",)
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 404, 413, 415, 422, 429, 503, 504)
}
router = APIRouter(tags=["v1"], dependencies=[Depends(require_api_key)], responses=_ERRORS)


@router.get("/v1/models")
async def list_models(state: State) -> dict[str, list[str]]:
    return {"models": sorted(state.registry.models) if state.ready else []}


@router.get("/v1/models/{name}")
async def model_status(name: str, state: State) -> dict[str, Any]:
    model = state.model(name)
    config = model.config
    return {"name": model.name, "version": model.version, "ready": True, "task": config.task,
            "labels": config.labels}  # fmt: skip


_PREDICT_DOC: dict[str, Any] = {
    "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/V1PredictRequest"}}}}
}


@router.post("/v1/models/{name}:predict", openapi_extra=_PREDICT_DOC, responses={200: {"model": V1PredictResponse}})
async def predict(name: str, request: Request, state: State) -> JSONResponse:
    """Instances in, predictions out, in request order. Texts as strings, images as {"b64": ...}."""
    settings = state.settings
    with track(state, name):
        model = state.model(name)
        try:
            body = V1PredictRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            raise malformed(f"body must be {{'instances': [...], 'parameters': {{...}}}}: {_short(exc)}") from None
        if len(body.instances) > settings.max_queue_size:
            raise ServeError(
                ErrorKind.TOO_LARGE,
                f"{len(body.instances)} instances; at most max_queue_size={settings.max_queue_size}",
            )
        raw = [_instance_bytes(model, i, n) for n, i in enumerate(body.instances)]
        items = await _to_items(model, raw, body.parameters.truncate, settings.max_image_pixels)
        results = await model.classify(items, settings.request_timeout_s)
        probabilities = np.stack([r.value for r in results])  # [B, n_labels]
        top_k = body.parameters.top_k or settings.default_top_k
        response = V1PredictResponse(predictions=predictions(model, probabilities, top_k))
        return JSONResponse(response.model_dump(), headers=timing_headers(state, name, results))


_CLASSIFY_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {t: {"schema": {"type": "string", "format": "binary"}} for t in (*IMAGE_TYPES, *TEXT_TYPES)},
    }
}


@router.post("/v1/models/{name}:classify", openapi_extra=_CLASSIFY_DOC, responses={200: {"model": ClassifyResponse}})
async def classify(
    name: str,
    request: Request,
    state: State,
    truncate: Annotated[bool, Query(description="Cut texts longer than the model's max_length")] = False,
    top_k: Annotated[int | None, Query(ge=1, description="Labels in top_k")] = None,
) -> JSONResponse:
    """The raw body is one image (image/png, image/jpeg, ...) or one UTF-8 text (text/plain)."""
    settings = state.settings
    with track(state, name):
        model = state.model(name)
        _check_media_type(model, request.headers.get("content-type"))
        items = await _to_items(model, [await request.body()], truncate, settings.max_image_pixels)
        results = await model.classify(items, settings.request_timeout_s)
        (prediction,) = predictions(model, results[0].value[None], top_k or settings.default_top_k)
        response = ClassifyResponse(model_name=model.name, model_version=model.version, **prediction.model_dump())
        return JSONResponse(response.model_dump(), headers=timing_headers(state, name, results))


def _check_media_type(model: ServedModel, content_type: str | None) -> None:
    allowed = TEXT_TYPES if model.config.task == "text" else IMAGE_TYPES
    media, *params = (content_type or "").split(";")
    media = media.strip().lower()
    if media not in allowed:
        raise ServeError(
            ErrorKind.UNSUPPORTED_MEDIA_TYPE,
            f"Content-Type {content_type!r} not accepted by {model.config.task} model {model.name!r}; "
            f"use one of {list(allowed)}",
        )
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
            "us-ascii",
        ):
            raise ServeError(ErrorKind.UNSUPPORTED_MEDIA_TYPE, f"charset {value.strip()!r} not accepted; send UTF-8")


def _instance_bytes(model: ServedModel, instance: str | B64Instance, index: int) -> bytes:
    if isinstance(instance, B64Instance):
        try:
            return base64.b64decode(instance.b64, validate=True)
        except (binascii.Error, ValueError):
            raise invalid(f"instances[{index}].b64 is not valid base64") from None
    if model.config.task == "image":
        raise invalid(f"instances[{index}]: image model {model.name!r} takes {{'b64': <base64 image file>}}")
    try:
        return instance.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from JSON escapes such as "\\ud800"
        raise invalid(f"instances[{index}] is not valid Unicode text") from None


async def _to_items(model: ServedModel, raw: list[bytes], truncate: bool, max_pixels: int) -> list[Item]:
    def convert() -> list[Item]:
        return [model.item_from_bytes(data, truncate, max_pixels) for data in raw]

    # Image decoding is CPU work: keep it off the event loop.
    return await asyncio.to_thread(convert) if model.config.task == "image" else convert()


def _short(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()[:5])
