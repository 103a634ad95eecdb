"""KServe v1 routes (`:predict`) and the curl-friendly `:classify` (raw image or text body)."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.convertors import Convertor, register_url_convertor

from lara_serve.server.content_types import ANY_TYPES, FORM_TYPES, IMAGE_TYPES, TEXT_LIKE_TYPES, TEXT_TYPES
from lara_serve.server.errors import ErrorKind, ServeError, invalid
from lara_serve.server.inputs import model_bytes, parse_content_type
from lara_serve.server.model_card import describe
from lara_serve.server.models import ServedModel, refuse_unsupported
from lara_serve.server.preprocess import Item, truncation_side
from lara_serve.server.routes.common import (
    State,
    predictions,
    read_body,
    require_api_key,
    timing_headers,
    track,
    upload_bytes,
)
from lara_serve.server.schemas import (
    B64Instance,
    ClassifyResponse,
    ErrorBody,
    V1PredictRequest,
    V1PredictResponse,
    parse_large,
    run_sized,
)

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 404, 413, 415, 422, 429, 503, 504)
}
router = APIRouter(tags=["v1"], dependencies=[Depends(require_api_key)], responses=_ERRORS)


class _ModelName(Convertor[str]):
    """A model name in a GET path: no ':', so `GET /v1/models/m:predict` is not model m's status (404 for a
    model named "m:predict") but the :predict route's 405 with `Allow: POST`."""

    regex = "[^/:]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("model_name", _ModelName())


@router.get("/v1/models")
async def list_models(state: State) -> dict[str, list[str]]:
    return {"models": sorted(state.registry.models) if state.ready else []}


@router.get("/v1/models/{name:model_name}")
async def model_status(name: str, state: State) -> dict[str, Any]:
    model = state.model(name)
    return {**model.limits(), **describe(model), "ready": True}


_PREDICT_DOC: dict[str, Any] = {
    "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/V1PredictRequest"}}}}
}


_TRUNCATE_QUERY = Query(
    description="Long texts: false = 413; true/head keeps the first max_length bytes, tail the last, head+tail "
    "half of each"
)


@router.post("/v1/models/{name}:predict", openapi_extra=_PREDICT_DOC, responses={200: {"model": V1PredictResponse}})
async def predict(
    name: str, request: Request, state: State, truncate: Annotated[str | None, _TRUNCATE_QUERY] = None
) -> JSONResponse:
    """Instances in, predictions out, in request order. Texts as strings, images as {"b64": ...}.

    Truncation: `parameters.truncate` in the body, else the `truncate` query parameter."""
    settings = state.settings
    with track(state, name):
        model = state.model(name)
        expected = "body must be {'instances': [...], 'parameters': {...}}"
        raw_body = await read_body(request)
        if raw_body.lstrip()[:1] not in (b"{", b"["):  # a file or plain text: that is what :classify takes
            expected += f"; to send a raw text or image file as the body, POST it to /v1/models/{name}:classify"
        body = await parse_large(V1PredictRequest, raw_body, expected)
        refuse_unsupported(body.parameters.model_dump(exclude_none=True))
        if len(body.instances) > settings.max_queue_size:
            raise ServeError(
                ErrorKind.TOO_LARGE,
                f"{len(body.instances)} instances; at most max_queue_size={settings.max_queue_size}",
            )
        raw = await run_sized(len(raw_body), _instances_bytes, model, body.instances)  # 16 MB of base64: ~20 ms
        side = truncation_side(body.parameters.truncate, truncate, default=model.default_truncation)
        items = await _to_items(model, raw, side, settings.max_image_pixels)
        results = await model.classify(items, settings.request_timeout_s)
        top_k = body.parameters.top_k or settings.default_top_k
        preds = predictions(model, [r.value for r in results], top_k)
        for prediction, item in zip(preds, items, strict=True):
            prediction.truncated = item.truncated
        state.metrics.observe_items(model.name, [i.length for i in items], [r.queue_s + r.inference_s for r in results])
        response = V1PredictResponse(predictions=preds)
        return JSONResponse(response.model_dump(), headers=timing_headers(state, name, results))


_CLASSIFY_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            **{
                t: {"schema": {"type": "string", "format": "binary"}}
                for t in (*IMAGE_TYPES, *TEXT_TYPES, *TEXT_LIKE_TYPES[:4], ANY_TYPES[1])
            },
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {"file": {"type": "array", "items": {"type": "string", "format": "binary"}}},
                }
            },
        },
    }
}


@router.post("/v1/models/{name}:classify", openapi_extra=_CLASSIFY_DOC, responses={200: {"model": ClassifyResponse}})
async def classify(
    name: str,
    request: Request,
    state: State,
    truncate: Annotated[str | None, _TRUNCATE_QUERY] = None,
    top_k: Annotated[int | None, Query(ge=1, description="Labels in top_k")] = None,
) -> JSONResponse:
    """The body is one image (image/png, ...) or one text (text/plain; any charset is decoded), raw bytes
    (application/octet-stream: the kind is sniffed), or a multipart/form-data upload (`curl -F file=@a.png`).
    A text model reads text/* (html, markdown, csv, ...), application/json, application/xml and
    message/rfc822 bodies as the text itself, under text/plain's charset rules.

    Always `predictions`: one per file in upload order, each with its `filename` (null for a raw body).
    One file: its prediction's fields also at the top level (label, score, top_k, ...), as before."""
    settings = state.settings
    with track(state, name):
        model = state.model(name)
        content_type = request.headers.get("content-type")
        if parse_content_type(content_type)[0] in FORM_TYPES:
            named = await _form_files(request, model, settings.max_queue_size)
        else:
            named = [(None, await upload_bytes(model, request))]
        items = await _to_items(
            model,
            [data for _, data in named],
            truncation_side(truncate, default=model.default_truncation),
            settings.max_image_pixels,
        )
        results = await model.classify(items, settings.request_timeout_s)
        preds = predictions(model, [r.value for r in results], top_k or settings.default_top_k)
        for prediction, item in zip(preds, items, strict=True):
            prediction.truncated = item.truncated
        state.metrics.observe_items(model.name, [i.length for i in items], [r.queue_s + r.inference_s for r in results])
        head = {"model_name": model.name, "model_version": model.version}
        # `predictions` is there for one file as for several, so a client reads one shape; one file also
        # keeps its fields at the top level, as before, so older clients keep working.
        files = [{"filename": f, **p.model_dump()} for (f, _), p in zip(named, preds, strict=True)]
        top = preds[0].model_dump() if len(preds) == 1 else {}
        body: dict[str, Any] = {**head, **top, "predictions": files}
        return JSONResponse(body, headers=timing_headers(state, name, results))


async def _form_files(request: Request, model: ServedModel, max_files: int) -> list[tuple[str | None, bytes]]:
    """Each file part (its own Content-Type and charset), and for text models each plain text field."""
    try:
        form = await request.form(max_files=max_files, max_fields=max_files)
    except AssertionError:  # Starlette's way of saying python-multipart is missing
        raise ServeError(
            ErrorKind.UNSUPPORTED_MEDIA_TYPE, "this server cannot parse multipart (python-multipart is not installed)"
        ) from None
    named: list[tuple[str | None, bytes]] = []
    try:
        for key, value in form.multi_items():
            if isinstance(value, str):
                if model.config.task != "text":
                    raise invalid(f"form field {key!r} is not a file; image model {model.name!r} takes file parts")
                named.append((key, value.encode("utf-8")))
                continue
            what = f"part {key!r} ({value.filename or 'no filename'})"
            data = await value.read()
            named.append((value.filename, model_bytes(model.config.task, model.name, data, value.content_type, what)))
    finally:
        await form.close()
    if not named:
        raise invalid("the multipart body has no file part; send e.g. -F file=@shoe.png")
    return named


def _instances_bytes(model: ServedModel, instances: list[str | B64Instance]) -> list[bytes]:
    return [_instance_bytes(model, instance, n) for n, instance in enumerate(instances)]


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


async def _to_items(model: ServedModel, raw: list[bytes], truncate: str | None, max_pixels: int) -> list[Item]:
    return await model.items_from_bytes(raw, truncate, max_pixels)  # off the event loop where it is slow


def _short(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()[:5])
