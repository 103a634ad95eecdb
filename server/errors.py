"""The one error taxonomy of the server and the one map from error kind to HTTP status.

Everything below the routes (preprocessing, batcher, backends, codecs) raises `ServeError` with a kind;
only `server.app` turns a kind into a status code. Messages say what was wrong and what is allowed.
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


def clean_message(message: str) -> str:
    return _OBJECT_REPR.sub("the data", message)


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
