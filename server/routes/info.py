"""GET /info: what a client needs to know before sending, in one call (like text-embeddings-inference's /info).

The server's limits (batching, body size, longest text) and one model card per served model
(lara_serve.server.model_card): labels, media types, max_length, attention, measured accuracy.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from lara_serve.server.metrics import server_version
from lara_serve.server.model_card import describe
from lara_serve.server.routes.common import AppState, State, app_state, check_api_key, require_api_key
from lara_serve.server.routes.tei import tei_info
from lara_serve.server.routes.triton import EXTENSIONS

SERVER_NAME = "lara-serve"

router = APIRouter(tags=["ops"], dependencies=[Depends(require_api_key)])


@router.get("/info")
async def info(state: State) -> dict[str, Any]:
    settings = state.settings
    cards = [describe(m) for _, m in sorted(state.registry.models.items())] if state.started else []
    text_lengths = [c["max_length"] for c in cards if "max_length" in c]
    return {
        "server": SERVER_NAME,
        "version": server_version(),
        "ready": state.ready,
        "backend": settings.backend,
        "model_backends": dict(settings.model_backends),
        "device": settings.device,
        **tei_info(state),  # TEI's own keys (model_id, model_type, ...), for its clients
        # TEI's names where the meaning is the same
        "max_input_length": max(text_lengths) if text_lengths else None,
        "max_batch_total_tokens": settings.max_batch_tokens,
        "max_batch_requests": settings.max_batch_size,
        "max_client_batch_size": settings.max_queue_size,
        "max_concurrent_requests": settings.max_connections,
        "max_queue_delay_ms": settings.max_queue_delay_ms,
        "request_timeout_s": settings.request_timeout_s,
        "max_body_bytes": settings.max_body_bytes,
        "max_image_pixels": settings.max_image_pixels,
        "truncate": "false (413) | true | head | tail | head+tail: ?truncate= on :classify and :predict, "
        "parameters.truncate in v1 and v2 bodies",
        "protocols": {
            "v1": "/v1/models",
            "v2": "/v2",
            "v2_extensions": EXTENSIONS,
            # host:port of KServe v2 gRPC (Triton's GRPCInferenceService), or null when off (--grpc-port)
            "v2_grpc": f"{settings.host}:{settings.grpc_port}" if settings.grpc_port else None,
            "tei": "/predict",
            "torchserve": "/predictions/{model}",
        },
        "docs": {"swagger": "/docs", "redoc": "/redoc", "openapi": "/openapi.json", "ui": "/ui"},
        "models": cards,
        "unavailable": dict(sorted(state.registry.failed.items())),
    }


async def require_metrics_key(request: Request) -> None:
    """/metrics: the API key as everywhere, unless metrics_auth=false (a scraper on a trusted network)."""
    state = app_state(request)
    if state.settings.metrics_auth:
        check_api_key(request, state)


def served_models(state: AppState) -> list[tuple[str, str, str, str]]:
    """(model, version, backend, task) of each served model, for lara_model_info."""
    return [(m.name, m.version, m.backend.name, m.config.task) for m in list(state.registry.models.values())]
