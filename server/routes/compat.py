"""Front doors for clients of other servers: the bare address and health as TEI and TorchServe ask for it.

Their inference and management routes live in lara_serve.server.routes.tei and .torchserve; `router` joins
them, so the app registers this module's two routers only.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from lara_serve.server.routes import tei, torchserve
from lara_serve.server.routes.common import State
from lara_serve.server.schemas import ErrorBody

public = APIRouter(tags=["TEI and TorchServe"])
# Each joined router carries the API key and error responses itself.
router = APIRouter()
router.include_router(tei.router)
router.include_router(torchserve.router)


# -- the browser at the bare address, and health as TEI and TorchServe ask for it -----------------------


@public.get(
    "/",
    include_in_schema=True,
    summary='KServe v1 liveness {"status": "alive"}; a browser (Accept: text/html) is redirected to /ui',
)
async def root(request: Request) -> Response:
    # kserve's InferenceRESTClient(protocol v1).is_server_live GETs the base URL and reads `status`
    # (Accept: */*); only a client that asks for HTML first is a person at the bare address.
    if "text/html" in request.headers.get("accept", ""):
        return RedirectResponse("/ui")
    return JSONResponse({"status": "alive"})


@public.get("/health", responses={503: {"model": ErrorBody}}, summary="TEI health: 200 when ready")
async def health(state: State) -> JSONResponse:
    if not state.ready:
        return JSONResponse({"error": "not ready: models are loading or the server is draining"}, status_code=503)
    return JSONResponse({"status": "ok"})


@public.get("/ping", responses={503: {"description": '{"status": "Unhealthy"}'}}, summary="TorchServe health")
async def ping(state: State) -> JSONResponse:
    return JSONResponse({"status": "Healthy" if state.ready else "Unhealthy"}, status_code=200 if state.ready else 503)
