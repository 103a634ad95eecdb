"""The one map from error kind to HTTP status, and the small helpers around it (server/errors.py)."""

from __future__ import annotations

import pytest

from lara_serve.server.errors import (
    HTTP_STATUS,
    ErrorKind,
    ServeError,
    clean_message,
    invalid,
    kind_for_status,
    malformed,
    not_found,
    too_large,
)

# The contract clients rely on (retry on 429/503, give up on 4xx): written out here, not read from the map.
DOCUMENTED = {
    "malformed_request": 400, "unauthenticated": 401, "not_found": 404, "method_not_allowed": 405,
    "conflict": 409, "request_timeout": 408, "too_large": 413, "unsupported_media_type": 415, "invalid_input": 422,
    "queue_full": 429, "client_disconnected": 499, "backend_failure": 500, "not_ready": 503, "timeout": 504,
}  # fmt: skip


def test_every_kind_has_its_documented_status() -> None:
    assert {kind.value: status for kind, status in HTTP_STATUS.items()} == DOCUMENTED
    assert set(HTTP_STATUS) == set(ErrorKind)
    assert all(ServeError(kind, "m").status == DOCUMENTED[kind.value] for kind in ErrorKind)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (404, ErrorKind.NOT_FOUND),
        (405, ErrorKind.METHOD_NOT_ALLOWED),
        (413, ErrorKind.TOO_LARGE),
        (400, ErrorKind.MALFORMED),
        (418, ErrorKind.MALFORMED),  # a 4xx without a kind of its own: the client's fault
        (499, ErrorKind.CLIENT_CLOSED),
        (500, ErrorKind.BACKEND_FAILURE),
        (502, ErrorKind.BACKEND_FAILURE),  # a 5xx without a kind of its own: ours
        (599, ErrorKind.BACKEND_FAILURE),
        (399, ErrorKind.BACKEND_FAILURE),
    ],
)
def test_framework_statuses_map_back_to_kinds(status: int, kind: ErrorKind) -> None:
    assert kind_for_status(status) is kind


def test_object_reprs_are_cleaned_from_messages() -> None:
    raw = "cannot identify image file <_io.BytesIO object at 0x7f3a2b1c0d90> (see <PIL.Image object at 0xABC>)"
    assert clean_message(raw) == "cannot identify image file the data (see the data)"
    untouched = "shape <1, 2> at 0x10 is not <allowed>"
    assert clean_message(untouched) == untouched


def test_serve_error_carries_kind_message_and_retry_after() -> None:
    error = ServeError(ErrorKind.QUEUE_FULL, "queue is full", retry_after_s=3)
    assert (error.kind, error.message, error.retry_after_s, str(error)) == (
        ErrorKind.QUEUE_FULL, "queue is full", 3, "queue is full")  # fmt: skip
    assert repr(error) == "ServeError('queue_full', 'queue is full')"
    assert ServeError(ErrorKind.TIMEOUT, "x").retry_after_s is None


@pytest.mark.parametrize(
    ("helper", "kind"),
    [(malformed, ErrorKind.MALFORMED), (invalid, ErrorKind.INVALID_INPUT), (too_large, ErrorKind.TOO_LARGE),
     (not_found, ErrorKind.NOT_FOUND)],
)  # fmt: skip
def test_helpers_build_errors_of_their_kind(helper: object, kind: ErrorKind) -> None:
    error = helper("what was wrong")  # type: ignore[operator]
    assert isinstance(error, ServeError) and error.kind is kind and error.message == "what was wrong"
    assert error.retry_after_s is None
