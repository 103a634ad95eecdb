"""The app factory: routes, one error handler per error family, middlewares, model lifespan."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lara_serve.server import openapi
from lara_serve.server.body_gate import LargeBodyGate
from lara_serve.server.errors import (
    HTTP_STATUS,
    ErrorKind,
    ServeError,
    clean_message,
    hide_paths_under,
    kind_for_status,
    too_large,
)
from lara_serve.server.middleware import CorsMiddleware, DecompressMiddleware, RequestContextMiddleware
from lara_serve.server.models import ServedModel, load_repository
from lara_serve.server.routes import compat, docs, explain, info, triton, ui, v1, v2
from lara_serve.server.routes.common import AppState, ClientWatch, client_watch, require_api_key
from lara_serve.server.settings import Settings

log = logging.getLogger(__name__)
SHUTDOWN_BATCH_GRACE_S = 2.0
GZIP_MIN_BYTES = 1024  # below this a gzip header and a compressor's work buy little
CORS_ALLOW_HEADERS = ("Authorization", "X-API-Key", "Content-Type", "Content-Encoding", "X-Request-ID",
                      "Inference-Header-Content-Length")  # fmt: skip
CORS_EXPOSE_HEADERS = ("X-Request-ID", "X-Total-Time-Ms", "X-Queue-Time-Ms", "X-Inference-Time-Ms", "X-Batch-Size",
                       "Inference-Header-Content-Length", "Retry-After")  # fmt: skip


def create_app(settings: Settings | None = None, models: list[ServedModel] | None = None) -> FastAPI:
    """Build the app. `models` (tests, embedding) replaces loading from settings.model_repository."""
    settings = settings or Settings()
    state = AppState(settings)
    for root in {settings.model_repository.absolute(), settings.model_repository.resolve()}:
        hide_paths_under(str(root))  # error bodies name model files relative to the repository

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if models is not None:
            loaded, failed = {m.name: m for m in models}, {}
        else:
            loaded, failed = await asyncio.to_thread(load_repository, settings, state.metrics)
        if not loaded:
            raise RuntimeError(f"no model could be loaded: {failed}")
        state.registry.models, state.registry.failed = loaded, failed
        for model in loaded.values():
            model.decode_budget = state.decode_budget
            model.batcher.start()
        state.started = True  # only now: every usable model is loaded and checked
        where = f"http://{settings.host}:{settings.port}"
        log.info("ready: %s; try them at %s/ui, API docs at %s/docs", ", ".join(sorted(loaded)), where, where)
        if failed:
            log.error("not serving (failed to load): %s", "; ".join(f"{n}: {r}" for n, r in sorted(failed.items())))
        grpc_server = None
        try:
            if settings.grpc_port:
                grpc_server = await _start_grpc(app, state)
            yield
        finally:
            state.draining = True
            if grpc_server is not None:  # in-flight calls finish first, like HTTP's drain
                await grpc_server.stop(settings.graceful_timeout_s)
            for model in loaded.values():
                # The drain (lara_serve.server.serving) already gave accepted work graceful_timeout_s: a batch still
                # running gets a short grace, then its items are answered 503 (never left hanging).
                await model.stop(grace_s=SHUTDOWN_BATCH_GRACE_S)

    app = FastAPI(
        title="LARA Serve",
        version=v2.SERVER_VERSION,
        description="KServe v1/v2 inference for LARA long-sequence text and image classifiers.",
        lifespan=lifespan,
        docs_url=None,  # served offline by lara_serve.server.routes.docs
        redoc_url=None,
    )
    app.state.lara = state
    app.include_router(v2.health)
    app.include_router(triton.router)  # before v2: /v2/models/stats is not a model named "stats"
    app.include_router(v2.router)
    app.include_router(v1.router)
    app.include_router(explain.router)
    app.include_router(info.router)
    app.include_router(ui.router)
    app.include_router(compat.public)  # TEI's and TorchServe's health, GET / -> /ui
    app.include_router(compat.router)
    docs.install(app)
    state.metrics.track_models(lambda: info.served_models(state))

    @app.get("/metrics", tags=["ops"], dependencies=[Depends(info.require_metrics_key)],
             response_class=PlainTextResponse, summary="Prometheus metrics (text exposition format)")  # fmt: skip
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    _add_error_handlers(app)
    openapi.install(app, key_checks=(require_api_key, info.require_metrics_key))
    # Innermost at request time: large bodies within the limit wait for one of max_large_bodies slots.
    app.add_middleware(
        LargeBodyGate,
        slots=settings.max_large_bodies,
        threshold=settings.large_body_bytes,
        wait_s=settings.large_body_wait_s,
        refused=state.metrics.large_bodies_refused.inc,
        respond=lambda e: error_response(e.kind, e.message, e.retry_after_s),
    )
    _add_operations_middleware(app, settings)
    return app


def _add_operations_middleware(app: FastAPI, settings: Settings) -> None:
    """Outside the large-body gate, from the inside out: compressed bodies decoded (bounded by
    max_body_bytes, so the gate and the routes see decoded bytes), the body limit on the bytes as sent,
    gzip responses, CORS, the client's connection, timing, and outermost the request id for every log line."""
    respond = lambda e: error_response(e.kind, e.message, e.retry_after_s)  # noqa: E731
    app.add_middleware(DecompressMiddleware, max_bytes=settings.max_body_bytes, respond=respond)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    if settings.compress_responses:
        app.add_middleware(GZipMiddleware, minimum_size=GZIP_MIN_BYTES, compresslevel=5)
    if settings.cors_allow_origins:
        app.add_middleware(
            CorsMiddleware,
            allow_origins=settings.cors_allow_origins,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=list(CORS_ALLOW_HEADERS),
            expose_headers=list(CORS_EXPOSE_HEADERS),
            max_age=600,
        )
    app.add_middleware(ClientMiddleware, state=app.state.lara)
    app.add_middleware(TimingMiddleware)
    app.add_middleware(RequestContextMiddleware, log_access=settings.log_format == "json")


async def _start_grpc(app: FastAPI, state: AppState) -> Any:
    from lara_serve.server.grpc.service import build_server  # grpcio is an optional extra: imported only when asked for

    server = build_server(state, app.state)
    await server.start()
    log.info("KServe v2 gRPC on %s:%d", state.settings.host, state.settings.grpc_port)
    return server


def error_response(
    kind: ErrorKind, message: str, retry_after_s: int | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    headers = dict(headers or {})
    if retry_after_s is not None:
        headers["Retry-After"] = str(retry_after_s)
    if kind is ErrorKind.UNAUTHENTICATED:
        headers["WWW-Authenticate"] = 'Bearer realm="lara-serve"'
    if kind is ErrorKind.REQUEST_TIMEOUT:
        headers["Connection"] = "close"  # the rest of a slow body would be read as the next request
    return JSONResponse({"error": clean_message(message)}, status_code=HTTP_STATUS[kind], headers=headers)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServeError)
    async def serve_error(request: Request, exc: ServeError) -> JSONResponse:
        return error_response(exc.kind, exc.message, exc.retry_after_s)

    @app.exception_handler(ClientDisconnect)
    async def client_left(request: Request, exc: ClientDisconnect) -> JSONResponse:
        # Hung up mid-upload: not a server error; the response goes nowhere (uvicorn drops it).
        return error_response(ErrorKind.CLIENT_CLOSED, "client disconnected while sending the request")

    @app.exception_handler(RecursionError)
    async def too_deep(request: Request, exc: RecursionError) -> JSONResponse:
        # Only parsing a client's body nests this deep (e.g. json.loads of [[[[...]]]]): a client error.
        return error_response(ErrorKind.MALFORMED, "request body is nested too deeply")

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        details = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        return error_response(ErrorKind.MALFORMED, f"invalid request: {details}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = kind_for_status(exc.status_code)
        message = str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}; see /docs"
        elif exc.status_code == 405:
            message = f"method {request.method} not allowed on {request.url.path}; see /docs"
        response = error_response(kind, message, headers=exc.headers)  # keeps 405's Allow
        response.status_code = exc.status_code
        return response

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Runs outside every middleware (Starlette's ServerErrorMiddleware): the request id comes from the scope.
        rid = getattr(request.state, "request_id", None)
        log.exception("unexpected error on %s %s", request.method, request.url.path, extra={"request_id": rid})
        # Sent outside ClientMiddleware, and uvicorn drops the connection after it: say so.
        headers = {"Connection": "close", **({"X-Request-ID": rid} if rid else {})}
        return error_response(ErrorKind.BACKEND_FAILURE, f"internal error: {type(exc).__name__}", headers=headers)


class BodyLimitMiddleware:
    """413 for bodies over the limit: early from Content-Length, or while streaming a chunked body."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        message = f"request body exceeds max_body_bytes={self.max_bytes}"
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await error_response(ErrorKind.TOO_LARGE, message)(scope, receive, send)
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    raise too_large(message)  # surfaces in the route's body read -> error handler
            return msg

        await self.app(scope, limited_receive, send)


class ClientMiddleware:
    """What the server owes a client connection, per request:

    - a body that does not arrive within body_timeout_s is a 408 (not a connection held forever);
    - once the body is in, a watcher waits for the client to hang up and then cancels the request, so
      its queued items are dropped (lara_serve.server.batcher) instead of computed for nobody;
    - while draining, responses carry `Connection: close` so keep-alive clients reconnect elsewhere;
    - a 5xx carries `Connection: close` once the request body is in (uvicorn drops the connection after an
      unexpected error: the client must not send its next request into it). A 5xx answered before the
      body arrived (e.g. 503 for a large body without a slot) keeps the connection until the client has
      sent its body, so the client reads the answer instead of a reset (lara_serve.server.serving bounds that time).
    """

    def __init__(self, app: ASGIApp, state: AppState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        loop = asyncio.get_running_loop()
        body_deadline = loop.time() + self.state.settings.body_timeout_s
        watch, task = ClientWatch(), asyncio.current_task()
        assert task is not None
        watcher: asyncio.Task[None] | None = None
        response_done = False

        async def watch_disconnect() -> None:
            message = await receive()  # after the body, the server's next message is the disconnect
            if message["type"] == "http.disconnect" and not response_done:
                watch.disconnected = True
                task.cancel()

        async def app_receive() -> Message:
            nonlocal watcher
            if watcher is not None:  # body already read: nothing more will come
                return {"type": "http.disconnect"} if watch.disconnected else await receive()
            self.state.uploading[task] = (
                watch  # the drain's end answers unfinished uploads 503 (lara_serve.server.serving)
            )
            try:
                async with asyncio.timeout_at(body_deadline):
                    message = await receive()
            except TimeoutError:
                self.state.metrics.client_timeouts.labels("body").inc()
                raise ServeError(
                    ErrorKind.REQUEST_TIMEOUT,
                    f"request body not received within body_timeout_s={self.state.settings.body_timeout_s:g}",
                ) from None
            except asyncio.CancelledError:
                if not watch.shutdown or task.cancelling() != 1:
                    raise
                task.uncancel()  # ours: the server is going away before the body came
                raise ServeError(
                    ErrorKind.NOT_READY, "server shut down before the request body arrived; retry", retry_after_s=1
                ) from None
            finally:
                self.state.uploading.pop(task, None)
            if message["type"] == "http.request" and not message.get("more_body", False):
                watcher = loop.create_task(watch_disconnect(), name="lara-disconnect-watch")
            return message

        async def app_send(message: Message) -> None:
            nonlocal response_done
            if message["type"] == "http.response.start":
                body_in = watcher is not None or not _has_body(scope)
                if self.state.draining or (message["status"] >= 500 and body_in):
                    message["headers"] = [*message.get("headers", []), (b"connection", b"close")]
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                response_done = True
            await send(message)

        token = client_watch.set(watch)
        try:
            await self.app(scope, app_receive, app_send)
        except asyncio.CancelledError:
            if not watch.disconnected or task.cancelling() != 1:
                raise  # a shutdown's cancellation, not ours
            task.uncancel()  # ours: the client is gone, there is no one to answer
        finally:
            client_watch.reset(token)
            if watcher is not None:
                watcher.cancel()


def _has_body(scope: Scope) -> bool:
    headers = dict(scope["headers"])
    return headers.get(b"content-length", b"0") not in (b"0", b"") or b"transfer-encoding" in headers


class TimingMiddleware:
    """X-Total-Time-Ms on every response: time from request start to response headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                total_ms = (time.perf_counter() - start) * 1000
                message["headers"] = [
                    *message.get("headers", []),
                    (b"x-total-time-ms", f"{total_ms:.3f}".encode()),
                ]
            await send(message)

        await self.app(scope, receive, timed_send)
