"""KServe v2 / Open Inference Protocol REST routes (JSON and the binary tensor data extension)."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from server.errors import invalid, too_large
from server.inputs import b64_elements
from server.model_card import describe
from server.models import RAW_INPUT, ServedModel
from server.preprocess import Item, image_items_from_tensors, text_items_from_tensors, truncation_side
from server.routes.common import State, bool_param, require_api_key, timing_headers, track
from server.routes.triton import EXTENSIONS, class_count, classification
from server.schemas import ErrorBody, V2InferResponse
from server.settings import Settings
from server.v2_codec import (
    HEADER_LENGTH,
    DecodedRequest,
    Tensor,
    decode_request_off_loop,
    encode_response,
    parse_header_length,
)

SERVER_NAME = "lara-serve"
SERVER_VERSION = "0.1.0"
OUTPUTS = ("probabilities", "label")
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 404, 413, 415, 422, 429, 503, 504)
}

health = APIRouter(tags=["v2 health"])
router = APIRouter(tags=["v2"], dependencies=[Depends(require_api_key)], responses=_ERRORS)


@health.get("/v2/health/live")
@health.head("/v2/health/live", include_in_schema=False)  # load balancers probe with HEAD
async def live() -> dict[str, bool]:
    return {"live": True}


@health.get("/v2/health/ready", responses={503: {"description": "models are loading"}})
@health.head("/v2/health/ready", include_in_schema=False)
async def ready(state: State) -> JSONResponse:
    return JSONResponse({"ready": state.ready}, status_code=200 if state.ready else 503)


@router.get("/v2")
async def server_metadata() -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS}


@router.get("/v2/models/{name}")
@router.get("/v2/models/{name}/versions/{version}")
async def model_metadata(name: str, state: State, version: str | None = None) -> dict[str, Any]:
    model = state.model(name, version)
    metadata = model.v2_metadata()
    metadata["parameters"] = {**metadata.get("parameters", {}), **describe(model)}
    return metadata


@router.get("/v2/models/{name}/ready")
@router.get("/v2/models/{name}/versions/{version}/ready")
async def model_ready(name: str, state: State, version: str | None = None) -> dict[str, Any]:
    model = state.model(name, version)
    return {"name": model.name, "version": model.version, "ready": True}


# The body is parsed by hand (it may be binary), so its schema is declared for /docs here;
# server.app adds the referenced component schemas.
_INFER_DOC: dict[str, Any] = {
    "requestBody": {
        "description": f"JSON, or a JSON header of `{HEADER_LENGTH}` bytes followed by binary tensors.",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/V2InferRequest"}}},
    },
}
_INFER_RESPONSES: dict[int | str, dict[str, Any]] = {200: {"model": V2InferResponse}}


@router.post("/v2/models/{name}/infer", openapi_extra=_INFER_DOC, responses=_INFER_RESPONSES)
@router.post("/v2/models/{name}/versions/{version}/infer", openapi_extra=_INFER_DOC, responses=_INFER_RESPONSES)
async def infer(name: str, request: Request, state: State, version: str | None = None) -> Response:
    """Inputs: `raw` (BYTES, one element per item: UTF-8 text, or an image file) or the model's tensors.

    An image in a JSON body is a base64 string with the input's `parameters.content_type = "base64"`:
    `{"name": "raw", "datatype": "BYTES", "shape": [1], "data": ["iVBORw0..."], "parameters":
    {"content_type": "base64"}}`. Binary bodies (the binary tensor extension) carry the file bytes as they are.
    Parameters: `truncate` (false | true | head | tail | head+tail); per output `binary_data` and
    `classification: k` (Triton's "score:index:label" strings of the top k, on `probabilities`)."""
    settings = state.settings
    with track(state, name):
        model = state.model(name, version)
        body = await request.body()
        decoded = await decode_request_off_loop(body, parse_header_length(request.headers.get(HEADER_LENGTH)))
        params = decoded.request.parameters
        tensors = _base64_inputs(decoded)
        items = await _items(model, tensors, truncation_side(params.get("truncate")), settings)
        results = await model.classify(items, settings.request_timeout_s)
        state.metrics.observe_items(model.name, [i.length for i in items], [r.queue_s + r.inference_s for r in results])

        probabilities = np.stack([r.value for r in results])  # [B, n_labels]
        label_ids = probabilities.argmax(axis=1)  # [B]
        labels = np.empty(len(items), dtype=object)
        labels[:] = [model.config.labels[i].encode() for i in label_ids]
        tensors = {"probabilities": ("FP32", probabilities), "label": ("BYTES", labels)}

        binary_default = bool_param(params, "binary_data_output")
        wanted = decoded.request.outputs
        if wanted is None:
            selected = [(n, *tensors[n], binary_default) for n in OUTPUTS]
        else:
            unknown = [o.name for o in wanted if o.name not in tensors]
            if unknown:
                raise invalid(f"unknown outputs {unknown}; this model has {list(OUTPUTS)}")
            selected = []
            for o in wanted:
                binary = bool_param({"binary_data_output": binary_default, **o.parameters}, "binary_data_output")
                k = class_count(o.parameters, o.name)  # Triton's classification extension
                tensor = ("BYTES", classification(probabilities, model.config.labels, k)) if k else tensors[o.name]
                selected.append((o.name, *tensor, binary))
        header: dict[str, Any] = {"model_name": model.name, "model_version": model.version}
        if model.config.task == "text":  # per item, in request order: was the text cut to max_length?
            header["parameters"] = {"truncated": [item.truncated for item in items]}
        if decoded.request.id is not None:
            header["id"] = decoded.request.id
        content, headers = encode_response(header, selected)
        return Response(content, headers={**headers, **timing_headers(state, name, results)})


def _base64_inputs(decoded: DecodedRequest) -> list[Tensor]:
    """BYTES inputs with parameters.content_type="base64" (an image file in a JSON body) -> decoded bytes."""
    out = []
    for spec, tensor in zip(decoded.request.inputs, decoded.tensors, strict=True):
        if spec.parameters.get("content_type") == "base64" and tensor.datatype == "BYTES":
            array = np.empty(tensor.array.size, dtype=object)
            array[:] = b64_elements(list(tensor.array.reshape(-1)), tensor.name)
            tensor = Tensor(tensor.name, tensor.datatype, array.reshape(tensor.array.shape))
        out.append(tensor)
    return out


async def _items(model: ServedModel, tensors: list[Tensor], truncate: str | None, settings: Settings) -> list[Item]:
    """Either one BYTES `raw` input, or the model's preprocessed tensor inputs."""
    by_name = {t.name: t for t in tensors}
    if len(by_name) != len(tensors):
        raise invalid("each input name may appear once")
    specs = {spec.name: spec for spec in model.config.inputs}
    allowed = f"either {RAW_INPUT!r} (BYTES) alone, or {sorted(specs)}"
    unknown = sorted(set(by_name) - set(specs) - {RAW_INPUT})
    if unknown:
        raise invalid(f"unknown inputs {unknown}; model {model.name!r} takes {allowed}")

    if RAW_INPUT in by_name:
        raw = by_name[RAW_INPUT]
        if len(tensors) != 1 or raw.datatype != "BYTES" or raw.array.ndim not in (1, 2):
            raise invalid(f"input {RAW_INPUT!r} must be BYTES [batch] (or [batch, 1]), alone; {allowed}")
        if raw.array.ndim == 2 and raw.array.shape[1] != 1:
            raise invalid(f"input {RAW_INPUT!r} must be [batch] or [batch, 1], got {list(raw.array.shape)}")
        elements = list(raw.array.reshape(-1))
        _check_count(len(elements), settings)

        return await model.items_from_bytes(elements, truncate, settings.max_image_pixels)  # off-loop if slow

    for tensor in tensors:
        if tensor.datatype != specs[tensor.name].datatype:
            raise invalid(f"input {tensor.name!r} must be {specs[tensor.name].datatype}, got {tensor.datatype}")
    arrays = {t.name: t.array for t in tensors}
    if model.config.task == "text":
        if "input_ids" not in arrays:
            raise invalid(f"missing input 'input_ids'; model {model.name!r} takes {allowed}")
        _check_count(arrays["input_ids"].shape[0] if arrays["input_ids"].ndim else 0, settings)
        return text_items_from_tensors(arrays, model.config, truncate)
    missing = sorted(set(specs) - set(arrays))
    if missing:
        raise invalid(f"missing inputs {missing}; model {model.name!r} takes {allowed}")
    _check_count(arrays["pixel_values"].shape[0] if arrays["pixel_values"].ndim else 0, settings)
    return image_items_from_tensors(arrays, model.config)


def _check_count(count: int, settings: Settings) -> None:
    if count == 0:
        raise invalid("the batch must hold at least one item")
    if count > settings.max_queue_size:
        raise too_large(f"request has {count} items; at most max_queue_size={settings.max_queue_size}")
