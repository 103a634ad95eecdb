"""Front doors for clients of other servers: text-embeddings-inference (TEI) and TorchServe.

They translate into the calls the v1 routes make (items -> model.classify -> scores) and answer in the
other server's shapes; errors go through the one status table like everywhere else (413 for a text
over max_length without truncation, 422 for bad input). ood_score / in_distribution have no place in
these shapes, so they travel as headers (`X-OOD-Score`, `X-In-Distribution`, comma-separated per item).

TEI decisions: these models read one sequence, so a list of strings is a batch (TEI would read two
strings as a sentence pair); TEI's batch form `[["a"], ["b"]]` works too, a real pair is a 422.
`raw_scores: true` gives log-softmax scores: the logits up to a per-item constant, so order and
differences are the logits'.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse
from pydantic import BaseModel, ConfigDict, Field

from lara_serve.server.content_types import FORM_TYPES
from lara_serve.server.errors import invalid, too_large
from lara_serve.server.inputs import parse_content_type
from lara_serve.server.models import Scored, ServedModel
from lara_serve.server.preprocess import Item, truncation_side
from lara_serve.server.routes.common import (
    AppState,
    State,
    read_body,
    require_api_key,
    timing_headers,
    track,
    upload_bytes,
)
from lara_serve.server.routes.v1 import _form_files, _to_items
from lara_serve.server.schemas import ErrorBody, parse_large

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 404, 413, 415, 422, 429, 503, 504)
}
public = APIRouter(tags=["TEI and TorchServe"])
router = APIRouter(tags=["TEI and TorchServe"], dependencies=[Depends(require_api_key)], responses=_ERRORS)


class TEIPredictRequest(BaseModel):
    """TEI's /predict body (fields of TEI's other routes are ignored, as v1 ignores unknown fields)."""

    model_config = ConfigDict(extra="ignore")

    inputs: str | list[str | list[str]] = Field(description='One text, or a batch: ["a", "b"] or [["a"], ["b"]]')
    raw_scores: bool = Field(False, description="true: log-softmax scores instead of probabilities")
    truncate: bool = Field(False, description="false: a text over max_length is a 413; true: it is cut")
    truncation_direction: Literal["Right", "Left", "right", "left"] = Field(
        "Right", description="Right cuts the end (keeps the head), Left cuts the start (keeps the tail)"
    )


class TEIScore(BaseModel):
    label: str
    score: float


# -- the browser at the bare address, and health as TEI and TorchServe ask for it -----------------------


@public.get("/", include_in_schema=True, summary="Redirect to the /ui page")
async def root() -> RedirectResponse:
    return RedirectResponse("/ui")


@public.get("/health", responses={503: {"model": ErrorBody}}, summary="TEI health: 200 when ready")
async def health(state: State) -> JSONResponse:
    if not state.ready:
        return JSONResponse({"error": "not ready: models are loading or the server is draining"}, status_code=503)
    return JSONResponse({"status": "ok"})


@public.get("/ping", responses={503: {"description": '{"status": "Unhealthy"}'}}, summary="TorchServe health")
async def ping(state: State) -> JSONResponse:
    return JSONResponse({"status": "Healthy" if state.ready else "Unhealthy"}, status_code=200 if state.ready else 503)


# -- TEI ---------------------------------------------------------------------------------------------------


def _default_text_model(state: AppState) -> str:
    if state.settings.tei_model:
        return state.settings.tei_model
    texts = sorted(n for n, m in state.registry.models.items() if m.config.task == "text")
    if len(texts) != 1:
        raise invalid(f"name the model with ?model=<name> (text models: {texts}) or start with --tei-model")
    return texts[0]


def _tei_texts(inputs: str | list[str | list[str]]) -> tuple[list[bytes], bool]:
    """(texts, batched): one string, or a batch of strings or of one-string lists."""
    if isinstance(inputs, str):
        return [inputs.encode("utf-8", "surrogatepass")], False
    texts = []
    for index, entry in enumerate(inputs):
        if isinstance(entry, list):
            if len(entry) != 1:
                raise invalid(f"inputs[{index}] has {len(entry)} texts; these models read one sequence (no pairs)")
            entry = entry[0]
        texts.append(entry.encode("utf-8", "surrogatepass"))
    if not texts:
        raise invalid("inputs must hold at least one text")
    return texts, True


@router.post("/predict", response_model=list[TEIScore] | list[list[TEIScore]], summary="TEI /predict")
async def tei_predict(
    request: Request,
    state: State,
    model: Annotated[str | None, Query(description="Model name; default: tei_model or the only text model")] = None,
) -> JSONResponse:
    """TEI's classification route: `{"inputs": "..."}` gives every label with its score, best first; a
    list of inputs gives one such list per text."""
    name = model or _default_text_model(state)
    with track(state, name):
        served = state.model(name)
        if served.config.task != "text":
            raise invalid(f"POST /predict serves text models; {name!r} is an image model (use :classify)")
        body = await parse_large(TEIPredictRequest, await read_body(request), "body must be TEI's {'inputs': ..., ...}")
        texts, batched = _tei_texts(body.inputs)
        if len(texts) > state.settings.max_queue_size:
            raise too_large(f"{len(texts)} inputs; at most max_queue_size={state.settings.max_queue_size}")
        side = ("head" if body.truncation_direction.lower() == "right" else "tail") if body.truncate else None
        items = await _to_items(served, texts, side, state.settings.max_image_pixels)
        scored, headers = await _run(state, served, items)
        rows = [_tei_scores(served, s, body.raw_scores) for s in scored]
        return JSONResponse(rows if batched else rows[0], headers=headers)


def _tei_scores(model: ServedModel, scored: Scored, raw: bool) -> list[dict[str, Any]]:
    values = np.log(np.maximum(scored.probabilities, np.finfo(np.float32).tiny)) if raw else scored.probabilities
    order = np.argsort(-scored.probabilities, kind="stable")
    return [{"label": model.config.labels[i], "score": float(values[i])} for i in order]


async def _run(state: AppState, model: ServedModel, items: list[Item]) -> tuple[list[Scored], dict[str, str]]:
    results = await model.classify(items, state.settings.request_timeout_s)
    state.metrics.observe_items(model.name, [i.length for i in items], [r.queue_s + r.inference_s for r in results])
    scored = [r.value for r in results]
    headers = timing_headers(state, model.name, results)
    if any(s.ood_score is not None for s in scored):
        headers["X-OOD-Score"] = ",".join(f"{s.ood_score:.6g}" for s in scored)
    if any(s.in_distribution is not None for s in scored):
        headers["X-In-Distribution"] = ",".join(str(s.in_distribution).lower() for s in scored)
    if model.config.task == "text":
        headers["X-Truncated"] = ",".join(str(i.truncated).lower() for i in items)
    return scored, headers


# -- TorchServe --------------------------------------------------------------------------------------------

_TS_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "multipart/form-data": {
                "schema": {"type": "object", "properties": {"data": {"type": "string", "format": "binary"}}}
            },
        },
    }
}


@router.post("/predictions/{name}", openapi_extra=_TS_DOC, summary="TorchServe predictions")
@router.post("/predictions/{name}/{version}", openapi_extra=_TS_DOC, summary="TorchServe predictions (version)")
async def torchserve_predict(
    name: str,
    request: Request,
    state: State,
    version: str | None = None,
    truncate: Annotated[str | None, Query(description="Long texts: see :classify")] = None,
    top_k: Annotated[int | None, Query(ge=1, description="Labels in the answer (default: default_top_k)")] = None,
) -> JSONResponse:
    """As `curl -T kitten.png .../predictions/<model>` or `-F data=@kitten.png`: the file's top labels as
    `{label: probability}`, best first, as TorchServe's classifier handlers answer. Several files in one
    multipart body: a list of such objects, in upload order."""
    with track(state, name):
        model = state.model(name, version)
        content_type = request.headers.get("content-type")
        if parse_content_type(content_type)[0] in FORM_TYPES:
            files = [data for _, data in await _form_files(request, model, state.settings.max_queue_size)]
        else:
            files = [await upload_bytes(model, request)]
        items = await _to_items(model, files, truncation_side(truncate), state.settings.max_image_pixels)
        scored, headers = await _run(state, model, items)
        k = min(top_k or state.settings.default_top_k, len(model.config.labels))
        rows = []
        for s in scored:
            order = np.argsort(-s.probabilities, kind="stable")[:k]
            rows.append({model.config.labels[i]: float(s.probabilities[i]) for i in order})
        return JSONResponse(rows[0] if len(rows) == 1 else rows, headers=headers)
