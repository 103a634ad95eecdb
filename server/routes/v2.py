"""KServe v2 / Open Inference Protocol REST routes (JSON and the binary tensor data extension)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from lara_serve.server import explain as explainer
from lara_serve.server.batcher import BatchResult
from lara_serve.server.errors import invalid, too_large
from lara_serve.server.inputs import b64_elements
from lara_serve.server.model_card import describe
from lara_serve.server.models import RAW_INPUT, Scored, ServedModel, refuse_unsupported
from lara_serve.server.preprocess import Item, image_items_from_tensors, text_items_from_tensors, truncation_side
from lara_serve.server.routes.common import (
    AppState,
    State,
    bool_param,
    read_body,
    require_api_key,
    timing_headers,
    track,
)
from lara_serve.server.routes.triton import EXTENSIONS, class_count, classification
from lara_serve.server.schemas import ErrorBody, V2InferResponse
from lara_serve.server.settings import Settings
from lara_serve.server.v2_codec import (
    HEADER_LENGTH,
    DecodedRequest,
    Tensor,
    decode_request_off_loop,
    encode_response,
    parse_header_length,
)

SERVER_NAME = "lara-serve"
SERVER_VERSION = "0.1.0"
EXPLANATION = "explanation"  # v2 output of parameters.explain (text models)
TRUNCATED = "truncated"  # v2 output on request (text models): BOOL [batch], was each item cut?
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
# lara_serve.server.app adds the referenced component schemas.
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
    Parameters: `truncate` (false | true | head | tail | head+tail); `explain: true` (text models) adds the
    output `explanation`, BYTES [batch], one JSON document per item with its passages and their contributions
    as v1 :explain gives them (`max_passages`: 2-64); asking for the output `explanation` by name implies it.
    Per output `binary_data` and `classification: k` (Triton's "score:index:label" strings of the top k, on
    `probabilities`). Models with an ood_score output also give `ood_score` (FP32) and `in_distribution` (BOOL).
    Text models answer the scalar parameters `truncated` (any item cut to max_length) and `truncated_count`;
    the output `truncated` (BOOL [batch], on request by name) flags each item."""
    with track(state, name):
        model = state.model(name, version)
        body = await read_body(request)
        decoded = await decode_request_off_loop(body, parse_header_length(request.headers.get(HEADER_LENGTH)))
        params = decoded.request.parameters
        answer = await run_infer(state, model, decoded, state.settings.request_timeout_s)
        selected = _select(answer.outputs, decoded, bool_param(params, "binary_data_output"), model)
        content, headers = encode_response(answer.header, selected)
        return Response(content, headers={**headers, **timing_headers(state, name, answer.results)})


@dataclass(frozen=True)
class InferAnswer:
    header: dict[str, Any]  # model_name, model_version, id, parameters
    outputs: dict[str, tuple[str, np.ndarray]]  # every output the request may select, name -> (datatype, array)
    results: list[BatchResult[Scored]]


async def run_infer(state: AppState, model: ServedModel, decoded: DecodedRequest, timeout_s: float) -> InferAnswer:
    """The one v2 inference path, whatever the wire (HTTP JSON, HTTP binary, gRPC): decoded tensors in,
    every output out. The caller selects outputs (`select`) and encodes them."""
    settings = state.settings
    params = decoded.request.parameters
    refuse_unsupported(params)  # `priority`: a 400, not silently ignored (HTTP and gRPC alike)
    wanted = {o.name for o in decoded.request.outputs or []}
    explain = bool_param(params, "explain") or EXPLANATION in wanted
    if explain:
        explainer.require_text(model)
    max_passages = explainer.check_max_passages(params.get("max_passages", settings.explain_passages))
    tensors = _base64_inputs(decoded)
    items = await _items(
        model, tensors, truncation_side(params.get("truncate"), default=model.default_truncation), settings
    )
    results, explanations = await _run(model, items, explain, max_passages, settings, timeout_s)
    state.metrics.observe_items(model.name, [i.length for i in items], [r.queue_s + r.inference_s for r in results])
    outputs = _output_tensors(model, [r.value for r in results])
    if explanations is not None:
        outputs[EXPLANATION] = ("BYTES", explanations)
    header: dict[str, Any] = {"model_name": model.name, "model_version": model.version}
    if model.config.task == "text":
        # v2 parameters are scalars: whether any item was cut to max_length, and how many; the per-item
        # flags are the output `truncated`, given when asked for by name (the default outputs stay as they were).
        flags = [item.truncated for item in items]
        header["parameters"] = {"truncated": any(flags), "truncated_count": sum(flags)}
        if TRUNCATED in wanted:
            outputs[TRUNCATED] = ("BOOL", np.array(flags, dtype=np.bool_))  # [B]
    if decoded.request.id is not None:
        header["id"] = decoded.request.id
    return InferAnswer(header, outputs, results)


def select(answer: InferAnswer, decoded: DecodedRequest, model: ServedModel) -> list[tuple[str, str, np.ndarray, bool]]:
    """The outputs the request asked for (all without `outputs`), with Triton's classification applied."""
    return _select(answer.outputs, decoded, False, model)


async def _run(
    model: ServedModel, items: list[Item], explain: bool, max_passages: int, settings: Settings, timeout_s: float
) -> tuple[list[BatchResult[Scored]], np.ndarray | None]:
    """The items' results and, with explain, the BYTES output `explanation`: per item one JSON document
    {"method", "length", "passages": [...]}, the passages as v1 :explain gives them."""
    if not explain:
        return await model.classify(items, timeout_s), None
    results, passages = await explainer.explain(model, items, max_passages, timeout_s, settings.max_queue_size)
    return results, _bytes_array(explainer.documents(items, passages))


def _output_tensors(model: ServedModel, scored: list[Scored]) -> dict[str, tuple[str, np.ndarray]]:
    """Every output this model can give, name -> (datatype, array with the batch first)."""
    probabilities = np.stack([s.probabilities for s in scored])  # [B, n_labels]
    labels = _bytes_array([model.config.labels[i].encode() for i in probabilities.argmax(axis=1)])
    tensors = {"probabilities": ("FP32", probabilities), "label": ("BYTES", labels)}
    ood = model.ood_outputs()
    if "ood_score" in ood:
        tensors["ood_score"] = ("FP32", np.array([s.ood_score for s in scored], dtype=np.float32))  # [B]
    if "in_distribution" in ood:
        tensors["in_distribution"] = ("BOOL", np.array([s.in_distribution for s in scored], dtype=np.bool_))  # [B]
    return tensors


def _bytes_array(values: list[bytes]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def _select(
    tensors: dict[str, tuple[str, np.ndarray]], decoded: DecodedRequest, binary_default: bool, model: ServedModel
) -> list[tuple[str, str, np.ndarray, bool]]:
    """No `outputs` in the request: every output. Else the ones named, in the order asked (v2's rule)."""
    wanted = decoded.request.outputs
    if wanted is None:
        return [(name, *tensor, binary_default) for name, tensor in tensors.items()]
    unknown = [o.name for o in wanted if o.name not in tensors]
    if unknown:
        on_request = [] if model.config.task != "text" else [n for n in (EXPLANATION, TRUNCATED) if n not in tensors]
        raise invalid(f"unknown outputs {unknown}; this model has {[*tensors, *on_request]}")
    selected = []
    probabilities = tensors["probabilities"][1]
    for o in wanted:
        binary = bool_param({"binary_data_output": binary_default, **o.parameters}, "binary_data_output")
        k = class_count(o.parameters, o.name)  # Triton's classification extension
        tensor = ("BYTES", classification(probabilities, model.config.labels, k)) if k else tensors[o.name]
        selected.append((o.name, *tensor, binary))
    return selected


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
