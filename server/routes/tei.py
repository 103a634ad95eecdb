"""text-embeddings-inference (TEI) front door: /predict, POST / and /invocations, and /info's TEI keys.

They translate into the calls the v1 routes make (items -> model.classify -> scores) and answer in TEI's
shapes; errors go through the one status table (413 for a text over max_length without truncation, 422 for
bad input). ood_score / in_distribution travel as headers (`X-OOD-Score`, `X-In-Distribution`,
comma-separated per item) and, when the body asks with `"return_ood": true`, in each score entry too (a
client such as huggingface_hub drops headers but keeps unknown fields).

Decisions: these models read one sequence, so a list of strings is a batch (TEI would read two strings as a
sentence pair); TEI's batch form `[["a"], ["b"]]` works too, a real pair is a 422. `raw_scores: true` gives
log-softmax scores: the logits up to a per-item constant, so order and differences are the logits'. With no
?model= the default text model answers: tei_model, else the first word-piece text model in repository (name)
order, else the first text model.
A body with a `parameters` object on POST / or /invocations is Hugging Face's Inference API task shape
(what `huggingface_hub.InferenceClient(model=url).text_classification` sends): the answer is then one list
per text even for one text, as that client expects, and parameters.top_k / function_to_apply apply.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from lara_serve.server.errors import ServeError, invalid, too_large
from lara_serve.server.model_card import weights_dtype
from lara_serve.server.models import Scored, ServedModel
from lara_serve.server.preprocess import Item
from lara_serve.server.routes.common import AppState, State, read_body, require_api_key, timing_headers, track
from lara_serve.server.routes.v1 import _ERRORS, _to_items
from lara_serve.server.schemas import parse_large

router = APIRouter(tags=["TEI and TorchServe"], dependencies=[Depends(require_api_key)], responses=_ERRORS)


class HFParameters(BaseModel):
    """Hugging Face's text-classification parameters (others are ignored)."""

    model_config = ConfigDict(extra="ignore")

    top_k: int | None = Field(None, ge=1, description="Labels per text (default: all)")
    function_to_apply: Literal["softmax", "none"] = Field(
        "softmax", description="softmax: probabilities; none: log-softmax scores (single-label models: no sigmoid)"
    )
    return_ood: bool = Field(False, description="As the top-level return_ood")


class TEIPredictRequest(BaseModel):
    """TEI's /predict body (fields of TEI's other routes are ignored, as v1 ignores unknown fields)."""

    model_config = ConfigDict(extra="ignore")

    inputs: str | list[str | list[str]] = Field(description='One text, or a batch: ["a", "b"] or [["a"], ["b"]]')
    raw_scores: bool = Field(False, description="true: log-softmax scores instead of probabilities")
    truncate: bool | None = Field(
        None,
        description="false: a text over max_length is a 413; true: it is cut; absent: the model's default "
        "(config.json preprocessing.truncate; false unless it says otherwise)",
    )
    truncation_direction: Literal["Right", "Left", "right", "left"] = Field(
        "Right", description="Right cuts the end (keeps the head), Left cuts the start (keeps the tail)"
    )
    return_ood: bool = Field(
        False, description="true: each score entry also carries the text's ood_score and in_distribution"
    )
    parameters: HFParameters | None = Field(
        None, description="Hugging Face Inference API form (POST / and /invocations): one list per text"
    )


class TEIScore(BaseModel):
    label: str
    score: float


def default_text_model(state: AppState) -> str:
    """tei_model, else the first word-piece text model in repository (folder name) order, else the first text
    model. A TEI client sends English sentences and documents of any length; a word-piece model reads them
    through a pretrained encoder (the shipped lara-text-news: 82.8% on headlines against the byte model's 62.6)."""
    if state.settings.tei_model:
        return state.settings.tei_model
    texts = sorted((n, m) for n, m in state.registry.models.items() if m.config.task == "text")
    if not texts:
        raise invalid(f"no text model is served (models: {sorted(state.registry.models)}); TEI routes serve text")
    pieces = [n for n, m in texts if getattr(m.config.preprocessing, "kind", None) == "wordpiece"]
    return (pieces or [texts[0][0]])[0]


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


_MODEL_QUERY = Query(
    description="Model name; default: tei_model, else the first word-piece text model, else the first text model"
)


@router.post("/predict", response_model=list[TEIScore] | list[list[TEIScore]], summary="TEI /predict")
async def tei_predict(
    request: Request, state: State, model: Annotated[str | None, _MODEL_QUERY] = None
) -> JSONResponse:
    """TEI's classification route: `{"inputs": "..."}` gives every label with its score, best first; a
    list of inputs gives one such list per text."""
    return await _predict(request, state, model, hf_form=False)


@router.post("/", response_model=list[TEIScore] | list[list[TEIScore]], summary="TEI POST / (as /predict)")
@router.post("/invocations", response_model=list[TEIScore] | list[list[TEIScore]], summary="SageMaker route")
async def tei_root(request: Request, state: State, model: Annotated[str | None, _MODEL_QUERY] = None) -> JSONResponse:
    """TEI's POST / and SageMaker's /invocations: /predict, and a body with `parameters` (Hugging Face's
    Inference API form) answers one list per text."""
    return await _predict(request, state, model, hf_form=True)


async def _predict(request: Request, state: State, model: str | None, hf_form: bool) -> JSONResponse:
    name = model or default_text_model(state)
    with track(state, name):
        served = state.model(name)
        if served.config.task != "text":
            raise invalid(f"TEI routes serve text models; {name!r} is an image model (use :classify)")
        body = await parse_large(TEIPredictRequest, await read_body(request), "body must be TEI's {'inputs': ..., ...}")
        texts, batched = _tei_texts(body.inputs)
        if len(texts) > state.settings.max_queue_size:
            raise too_large(f"{len(texts)} inputs; at most max_queue_size={state.settings.max_queue_size}")
        side = ("head" if body.truncation_direction.lower() == "right" else "tail") if body.truncate else None
        if body.truncate is None:  # TEI's auto-truncate: the model's own default side
            side = served.default_truncation
        items = await _to_items(served, texts, side, state.settings.max_image_pixels)
        scored, headers = await run(state, served, items)
        params = body.parameters if hf_form else None
        raw = body.raw_scores or (params is not None and params.function_to_apply == "none")
        ood = body.return_ood or (params is not None and params.return_ood)
        top_k = params.top_k if params is not None else None
        rows = [_tei_scores(served, s, raw, ood, top_k) for s in scored]
        return JSONResponse(rows if batched or params is not None else rows[0], headers=headers)


def _tei_scores(model: ServedModel, scored: Scored, raw: bool, ood: bool, top_k: int | None) -> list[dict[str, Any]]:
    values = np.log(np.maximum(scored.probabilities, np.finfo(np.float32).tiny)) if raw else scored.probabilities
    order = np.argsort(-scored.probabilities, kind="stable")[:top_k]
    extra = {"ood_score": scored.ood_score, "in_distribution": scored.in_distribution} if ood else {}
    return [{"label": model.config.labels[i], "score": float(values[i]), **extra} for i in order]


async def run(state: AppState, model: ServedModel, items: list[Item]) -> tuple[list[Scored], dict[str, str]]:
    """Classify the items, record them, and build the timing, OOD and truncation headers."""
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


def tei_info(state: AppState) -> dict[str, Any]:
    """TEI's /info keys for the default text model (GET /info carries them beside its own)."""
    try:
        model = state.registry.models.get(default_text_model(state)) if state.started else None
    except ServeError:  # no text model served: TEI's model keys are null
        model = None
    labels = model.config.labels if model is not None and model.config.task == "text" else None
    return {
        "model_id": model.name if labels else None,
        "model_sha": None,
        "model_dtype": weights_dtype(model) if labels else None,  # type: ignore[arg-type]
        "model_type": {
            "classifier": {
                "id2label": {str(i): str(v) for i, v in enumerate(labels or [])},
                "label2id": {str(v): i for i, v in enumerate(labels or [])},
            }
        },  # fmt: skip
        "max_batch_tokens": state.settings.max_batch_tokens,
        "auto_truncate": bool(labels) and model.default_truncation is not None,  # type: ignore[union-attr]
        "tokenization_workers": None,
        "sha": None,
        "docker_label": None,
    }
