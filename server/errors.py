"""The one error taxonomy of the server and the one map from error kind to HTTP status.

Everything below the routes (preprocessing, batcher, backends, codecs) raises `ServeError` with a kind;
only `lara_serve.server.app` turns a kind into a status code. Messages say what was wrong and what is allowed.
"""

from __future__ import annotations

import re
from enum import StrEnum


class ErrorKind(StrEnum):
    MALFORMED = "malformed_request"
    REQUEST_TIMEOUT = "request_timeout"  # the client was too slow sending the request (408)
    CLIENT_CLOSED = "client_disconnected"  # the client hung up; the answer goes nowhere (499)
    UNAUTHENTICATED = "unauthenticated"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"  # the request clashes with the server's state (registering a served model)
    METHOD_NOT_ALLOWED = "method_not_allowed"
    TOO_LARGE = "too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    INVALID_INPUT = "invalid_input"
    QUEUE_FULL = "queue_full"
    BACKEND_FAILURE = "backend_failure"
    NOT_READY = "not_ready"
    TIMEOUT = "timeout"


HTTP_STATUS: dict[ErrorKind, int] = {
    ErrorKind.MALFORMED: 400,
    ErrorKind.UNAUTHENTICATED: 401,
    ErrorKind.REQUEST_TIMEOUT: 408,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.METHOD_NOT_ALLOWED: 405,
    ErrorKind.CONFLICT: 409,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorKind.INVALID_INPUT: 422,
    ErrorKind.QUEUE_FULL: 429,
    # nginx's "client closed request": never seen by the client, but logs and metrics tell it apart.
    ErrorKind.CLIENT_CLOSED: 499,
    ErrorKind.BACKEND_FAILURE: 500,
    ErrorKind.NOT_READY: 503,
    ErrorKind.TIMEOUT: 504,
}

# The same kinds on gRPC (names of grpc.StatusCode: this module must not import grpc, an optional extra).
# Retryable kinds (queue full, not ready) are UNAVAILABLE, which gRPC clients retry by convention.
GRPC_STATUS: dict[ErrorKind, str] = {
    ErrorKind.MALFORMED: "INVALID_ARGUMENT",
    ErrorKind.UNAUTHENTICATED: "UNAUTHENTICATED",
    ErrorKind.REQUEST_TIMEOUT: "DEADLINE_EXCEEDED",
    ErrorKind.NOT_FOUND: "NOT_FOUND",
    ErrorKind.METHOD_NOT_ALLOWED: "UNIMPLEMENTED",
    ErrorKind.CONFLICT: "ALREADY_EXISTS",
    ErrorKind.TOO_LARGE: "RESOURCE_EXHAUSTED",
    ErrorKind.UNSUPPORTED_MEDIA_TYPE: "INVALID_ARGUMENT",
    ErrorKind.INVALID_INPUT: "INVALID_ARGUMENT",
    ErrorKind.QUEUE_FULL: "UNAVAILABLE",
    ErrorKind.CLIENT_CLOSED: "CANCELLED",
    ErrorKind.BACKEND_FAILURE: "INTERNAL",
    ErrorKind.NOT_READY: "UNAVAILABLE",
    ErrorKind.TIMEOUT: "DEADLINE_EXCEEDED",
}


# Pillow and the stdlib put object reprs in messages ("<_io.BytesIO object at 0x7f...>"): they say nothing
# to a client and leak addresses, so error bodies replace them.
_OBJECT_REPR = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>")


# Absolute file paths (a model file that failed to parse, a library's source file) tell a client how the
# host is laid out. Paths under a model repository keep their part inside it; others keep their last two
# parts. Only paths under usual top-level folders are touched, so route paths ("/v2/models/x") stay.
_ABS_PATH = re.compile(
    r"(?<![\w.~/])/(?:tmp|home|root|usr|opt|var|work|srv|mnt|data|app|etc|lib|lib64|run|nix|Users|private|"
    r"workspace|models?)(?:/[^\s/'\"<>:;,()]+)+"
)
_REPOSITORY_ROOTS: set[str] = set()


def hide_paths_under(root: str) -> None:
    """Paths under `root` (the model repository) show as <model_repository>/<rest> in error messages."""
    _REPOSITORY_ROOTS.add(root.rstrip("/"))


def _short_path(match: re.Match[str]) -> str:
    path = match.group(0)
    for root in sorted(_REPOSITORY_ROOTS, key=len, reverse=True):
        if path == root or path.startswith(root + "/"):
            return "<model_repository>" + path[len(root) :]
    return ".../" + "/".join(path.rsplit("/", 2)[-2:])


def clean_message(message: str) -> str:
    """An error text fit for a client: no object reprs (addresses), no absolute file paths."""
    return _ABS_PATH.sub(_short_path, _OBJECT_REPR.sub("the data", message))


def kind_for_status(status: int) -> ErrorKind:
    """The kind of a status raised by the framework itself (e.g. Starlette's 404/405)."""
    for kind, code in HTTP_STATUS.items():
        if code == status:
            return kind
    return ErrorKind.MALFORMED if 400 <= status < 500 else ErrorKind.BACKEND_FAILURE


class ServeError(Exception):
    """An error with a kind; `retry_after_s` is sent as Retry-After (queue full, not ready)."""

    def __init__(self, kind: ErrorKind, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after_s = retry_after_s

    @property
    def status(self) -> int:
        return HTTP_STATUS[self.kind]

    def __repr__(self) -> str:
        return f"ServeError({self.kind.value!r}, {self.message!r})"


def malformed(message: str) -> ServeError:
    return ServeError(ErrorKind.MALFORMED, message)


def invalid(message: str) -> ServeError:
    return ServeError(ErrorKind.INVALID_INPUT, message)


def too_large(message: str) -> ServeError:
    return ServeError(ErrorKind.TOO_LARGE, message)


def not_found(message: str) -> ServeError:
    return ServeError(ErrorKind.NOT_FOUND, message)
