"""KServe v1 `:explain` for text models: the passages that decided a label (lara_serve.server.explain does the work)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from lara_serve.server import explain as explainer
from lara_serve.server.models import refuse_unsupported
from lara_serve.server.preprocess import truncation_side
from lara_serve.server.routes.common import State, predictions, read_body, require_api_key, timing_headers, track
from lara_serve.server.routes.v1 import _ERRORS, _TRUNCATE_QUERY, _instance_bytes, _to_items
from lara_serve.server.schemas import Explanation, V1ExplainRequest, V1ExplainResponse, parse_large

router = APIRouter(tags=["v1"], dependencies=[Depends(require_api_key)], responses=_ERRORS)


_EXPLAIN_DOC: dict[str, Any] = {
    "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/V1ExplainRequest"}}}}
}


@router.post("/v1/models/{name}:explain", openapi_extra=_EXPLAIN_DOC, responses={200: {"model": V1ExplainResponse}})
async def explain(
    name: str, request: Request, state: State, truncate: Annotated[str | None, _TRUNCATE_QUERY] = None
) -> JSONResponse:
    """Text models: the prediction and, per passage (byte ranges of the text read), its contribution to the
    predicted label by occlusion: p(label | text) - p(label | text without the passage; a windowed model reads
    it as padding in place). Same body as :predict, plus `parameters.max_passages` (2-64)."""
    settings = state.settings
    with track(state, name):
        model = state.model(name)
        explainer.require_text(model)
        expected = "body must be {'instances': [...], 'parameters': {...}}"
        body = await parse_large(V1ExplainRequest, await read_body(request), expected)
        refuse_unsupported(body.parameters.model_dump(exclude_none=True))
        raw = [_instance_bytes(model, i, n) for n, i in enumerate(body.instances)]
        side = truncation_side(body.parameters.truncate, truncate, default=model.default_truncation)
        items = await _to_items(model, raw, side, settings.max_image_pixels)
        max_passages = body.parameters.max_passages or settings.explain_passages
        results, passages = await explainer.explain(
            model, items, max_passages, settings.request_timeout_s, settings.max_queue_size
        )
        preds = predictions(model, [r.value for r in results], body.parameters.top_k or settings.default_top_k)
        state.metrics.observe_items(model.name, [i.length for i in items], [r.queue_s + r.inference_s for r in results])
        explanations = [
            Explanation(
                **p.model_dump(exclude={"truncated"}), truncated=item.truncated, length=item.length, passages=rows
            )  # fmt: skip
            for p, item, rows in zip(preds, items, passages, strict=True)
        ]
        response = V1ExplainResponse(explanations=explanations)
        return JSONResponse(response.model_dump(), headers=timing_headers(state, name, results))
