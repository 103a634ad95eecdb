"""Triton's extensions of the v2 protocol: model configuration, statistics, model repository, classification.

These routes read the model registry and the Prometheus metrics; they never touch a backend directly.
Shapes follow Triton's HTTP/REST extension documents so `tritonclient.http` works unchanged:
`get_model_config`, `get_inference_statistics`, `get_model_repository_index`, `load_model`,
`unload_model`, and `InferRequestedOutput(..., class_count=k)`.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from lara_serve.server.errors import ErrorKind, ServeError, clean_message, invalid, malformed, not_found
from lara_serve.server.model_card import describe
from lara_serve.server.models import RAW_INPUT, ServedModel, load_models
from lara_serve.server.repository import RepositoryError, discover
from lara_serve.server.routes.common import AppState, State, read_body, require_api_key
from lara_serve.server.schemas import run_sized

router = APIRouter(tags=["v2 (Triton extensions)"], dependencies=[Depends(require_api_key)])

# Triton's names for the extensions served here and in lara_serve.server.routes.v2 (GET /v2 lists exactly these).
EXTENSIONS = [
    "binary_tensor_data",
    "classification",
    "model_configuration",
    "model_repository",
    "parameters",
    "statistics",
]
_TRITON_TYPES = {"BYTES": "TYPE_STRING", "BOOL": "TYPE_BOOL", "FP16": "TYPE_FP16", "FP32": "TYPE_FP32",
                 "FP64": "TYPE_FP64", "INT8": "TYPE_INT8", "INT16": "TYPE_INT16", "INT32": "TYPE_INT32",
                 "INT64": "TYPE_INT64", "UINT8": "TYPE_UINT8"}  # fmt: skip


# -- model configuration -------------------------------------------------------------------------------


@router.get("/v2/models/{name}/config")
@router.get("/v2/models/{name}/versions/{version}/config")
async def model_config(name: str, state: State, version: str | None = None) -> dict[str, Any]:
    """Triton's model configuration (model_config.proto as JSON); dims leave out the batch axis."""
    model = state.model(name, version)
    settings, config = state.settings, model.config
    labels = len(config.labels)
    card = describe(model)
    inputs = [{"name": RAW_INPUT, "data_type": "TYPE_STRING", "format": "FORMAT_NONE", "dims": [1],
               "reshape": {"shape": []}, "optional": True}]  # fmt: skip
    inputs += [
        {
            "name": s.name,
            "data_type": _TRITON_TYPES.get(s.datatype, s.datatype),
            "format": "FORMAT_NONE",
            "dims": s.shape[1:],
            "optional": True,
        }  # fmt: skip
        for s in config.inputs
    ]
    gpu = model.backend.device == "cuda"
    return {
        "name": model.name,
        "platform": model.platform,
        "backend": "onnxruntime" if model.backend.name == "onnxruntime" else "pytorch",
        "version_policy": {"specific": {"versions": [model.version]}},
        "max_batch_size": settings.max_batch_size,
        "input": inputs,
        "output": [
            {"name": "probabilities", "data_type": "TYPE_FP32", "dims": [labels], "label_filename": ""},
            {"name": "label", "data_type": "TYPE_STRING", "dims": [1], "reshape": {"shape": []}},
            *(
                {"name": n, "data_type": f"TYPE_{t}", "dims": [1], "reshape": {"shape": []}}
                for n, t in model.ood_outputs().items()
            ),
        ],
        "dynamic_batching": {
            "preferred_batch_size": [],
            "max_queue_delay_microseconds": int(settings.max_queue_delay_ms * 1000),
            "preserve_ordering": True,
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": int(settings.request_timeout_s * 1e6),
                "allow_timeout_override": False,
                "max_queue_size": settings.max_queue_size,
            },
        },
        "instance_group": [{"name": f"{model.name}_0", "kind": "KIND_GPU" if gpu else "KIND_CPU", "count": 1}],
        # Triton's parameters are string maps: the model card's values as JSON strings.
        "parameters": {
            "max_batch_tokens": {"string_value": str(settings.max_batch_tokens)},
            **{k: {"string_value": v if isinstance(v, str) else json.dumps(v)} for k, v in card.items()},
        },
    }


# -- statistics ----------------------------------------------------------------------------------------


def _model_stats(state: AppState, model: ServedModel) -> dict[str, Any]:
    """Triton's statistics shape, from lara_serve.server.statistics (which says how each count is kept)."""
    return state.metrics.statistics.snapshot(model.name).as_triton(model.name, model.version)


@router.get("/v2/models/stats")
async def all_stats(state: State) -> dict[str, Any]:
    return {"model_stats": [_model_stats(state, state.model(n)) for n in sorted(state.registry.models)]}


@router.get("/v2/models/{name}/stats")
@router.get("/v2/models/{name}/versions/{version}/stats")
async def model_stats(name: str, state: State, version: str | None = None) -> dict[str, Any]:
    return {"model_stats": [_model_stats(state, state.model(name, version))]}


# -- model repository ----------------------------------------------------------------------------------

_UNLOADED = "unloaded (POST /v2/repository/models/{name}/load loads it)"


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await read_body(request)
    if not raw.strip():
        return {}
    try:
        body = await run_sized(len(raw), json.loads, raw)
    except (ValueError, UnicodeDecodeError):
        raise malformed("body must be a JSON object (or empty)") from None
    if not isinstance(body, dict):
        raise malformed("body must be a JSON object (or empty)")
    return body


@router.post("/v2/repository/index")
async def repository_index(request: Request, state: State) -> list[dict[str, Any]]:
    """Every model of the repository folder and every served one: READY, or UNAVAILABLE with the reason."""
    body = await _json_body(request)
    return index(state, bool(body.get("ready", False)))


def index(state: AppState, ready_only: bool) -> list[dict[str, Any]]:
    try:
        names = set(discover(state.settings.model_repository))
    except RepositoryError:
        names = set()
    names |= set(state.registry.models) | set(state.registry.failed)
    out = []
    for name in sorted(names):
        model = state.registry.models.get(name)
        if model is not None:
            out.append({"name": name, "version": model.version, "state": "READY"})
        elif not ready_only:
            reason = state.registry.failed.get(name, _UNLOADED.format(name=name))
            out.append({"name": name, "state": "UNAVAILABLE", "reason": reason})
    return out


def control_lock(app_state: Any) -> asyncio.Lock:
    """One lock per app (its Starlette `app.state`): loads and unloads never interleave, whichever protocol
    (HTTP here, gRPC in lara_serve.server.grpc) asks."""
    lock = getattr(app_state, "lara_model_control", None)
    if lock is None:
        lock = app_state.lara_model_control = asyncio.Lock()
    return lock


def _check_control(state: AppState) -> None:
    if state.settings.model_control != "explicit":
        raise ServeError(
            ErrorKind.MALFORMED,
            "model load/unload is off (model_control=none); start the server with --model-control explicit",
        )


@router.post("/v2/repository/models/{name}/load")
async def load_model(name: str, request: Request, state: State) -> JSONResponse:
    """Load (or reload) a model from the repository folder; the old instance serves until the new one is ready."""
    params = (await _json_body(request)).get("parameters") or {}
    await load(name, params, state, control_lock(request.app.state))
    return JSONResponse({})


async def load(name: str, params: Any, state: AppState, lock: asyncio.Lock) -> None:
    _check_control(state)
    if not isinstance(params, dict) or any(k == "config" or k.startswith("file:") for k in params):
        raise invalid("load takes no config override or files: the model's config.json in the repository is used")
    if not state.started or state.draining:
        state.model(name)  # 503 with the reason: the server is loading or draining
    async with lock:
        try:
            discover(state.settings.model_repository, [name])
        except RepositoryError as exc:
            raise not_found(f"cannot load {name!r}: {exc}") from None
        settings = state.settings.model_copy(update={"models": [name]})
        try:
            new = (await asyncio.to_thread(load_models, settings, state.metrics))[name]
        except Exception as exc:
            reason = " ".join(clean_message(str(exc)).split())[:500] or type(exc).__name__
            state.metrics.model_load_failures.labels(name).inc()
            if name in state.registry.models:  # a failed reload: the old instance serves on, and says so
                serving = state.registry.models[name].version
                raise invalid(f"failed to reload {name!r} (version {serving} keeps serving): {reason}") from None
            state.registry.failed[name] = reason
            state.metrics.model_ready.labels(name).set(0)
            raise invalid(f"failed to load {name!r}: {reason}") from None
        new.decode_budget = state.decode_budget
        new.batcher.start()
        old = state.registry.models.get(name)
        state.registry.models[name] = new  # in place: the lifespan stops what this dict holds at shutdown
        state.registry.failed.pop(name, None)
        state.metrics.model_ready.labels(name).set(1)
        if old is not None:
            await _retire(old, state)


@router.post("/v2/repository/models/{name}/unload")
async def unload_model(name: str, request: Request, state: State) -> JSONResponse:
    """Stop serving a model: new requests get 503 at once; queued work finishes (up to graceful_timeout_s)."""
    _check_control(state)
    await _json_body(request)  # parameters.unload_dependents: there are no dependents (no ensembles)
    await unload(name, state, control_lock(request.app.state))
    return JSONResponse({})


async def unload(name: str, state: AppState, lock: asyncio.Lock) -> None:
    _check_control(state)
    async with lock:
        model = state.registry.models.pop(name, None)
        if model is None:
            if name in state.registry.failed:
                return  # already not serving
            raise not_found(f"unknown model {name!r}; served: {sorted(state.registry.models)}")
        state.registry.failed[name] = _UNLOADED.format(name=name)
        state.metrics.model_ready.labels(name).set(0)
        await _retire(model, state)


async def _retire(model: ServedModel, state: AppState) -> None:
    """Queued work finishes (up to graceful_timeout_s), then the model stops: what is still queued gets
    503, the running batch is answered, and nothing blocks the event loop (lara_serve.server.batcher.Batcher.stop)."""
    deadline = time.monotonic() + state.settings.graceful_timeout_s
    while model.batcher.depth and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await model.stop(grace_s=max(1.0, deadline - time.monotonic()))


# -- classification extension (used by lara_serve.server.routes.v2) ----------------------------------------------------


def class_count(parameters: dict[str, Any], output: str) -> int:
    """`parameters.classification` of a requested output (tritonclient's class_count); 0 when absent."""
    value = parameters.get("classification", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid(f"output {output!r}: parameters.classification must be an integer >= 0, got {value!r}")
    if value and output != "probabilities":
        raise invalid(f"classification applies to output 'probabilities', not {output!r}")
    return value


def classification(probabilities: np.ndarray, labels: list[str], k: int) -> np.ndarray:
    """[B, n_labels] -> BYTES [B, k] of Triton's "score:index:label" strings, best first (ties: label order)."""
    k = min(k, probabilities.shape[1])
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]  # [B, k]
    out = np.empty(order.shape, dtype=object)
    for b, row in enumerate(order):
        out[b, :] = [f"{probabilities[b, i]:f}:{i}:{labels[i]}".encode() for i in row]
    return out
