"""What the current request is, for logs and metrics: its id and the protocol (front door) it came by.

Set once per HTTP request by lara_serve.server.middleware.RequestContextMiddleware; read by the log
formatter (lara_serve.server.log_format) and the request metrics (lara_serve.server.routes.common.track).
"""

from __future__ import annotations

from contextvars import ContextVar

request_id: ContextVar[str | None] = ContextVar("lara_request_id", default=None)
# HTTP requests set it from the path; gRPC, the one front door that bypasses the HTTP middleware, keeps
# the default.
protocol: ContextVar[str] = ContextVar("lara_protocol", default="grpc")

# Path prefix -> protocol label, first match wins (Triton's routes live under /v2 too: listed first).
_PROTOCOLS: tuple[tuple[str, str], ...] = (
    ("/v2/repository", "triton"),
    ("/v2/models/stats", "triton"),
    ("/v2", "v2"),
    ("/v1", "v1"),
    ("/predictions", "torchserve"),
    ("/explanations", "torchserve"),
    ("/models", "torchserve"),
    ("/ping", "torchserve"),
    ("/predict", "tei"),
    ("/invocations", "tei"),  # SageMaker's route, TEI's shape
    ("/health", "tei"),
    ("/ui", "ui"),
)


def protocol_of(path: str) -> str:
    """The protocol label of an HTTP path: v1, v2, triton, tei, torchserve, ui, or ops (metrics, docs, info)."""
    if path == "/":
        return "tei"  # POST / is TEI's predict; GET / (liveness) is never counted as a request
    if path.startswith("/v2/models/") and path.rstrip("/").endswith(("/config", "/stats")):
        return "triton"
    for prefix, name in _PROTOCOLS:
        if path == prefix or path.startswith(prefix + "/") or path.startswith(prefix + ":"):
            return name
    return "ops"
