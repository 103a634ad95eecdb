"""Log output: text for people, or one JSON object per line for a log pipeline (`--log-format json`).

Every record carries the current request's id (lara_serve.server.request_context), so the lines of one
request can be found together; access lines (lara_serve.server.middleware) add method, path, status and
duration_ms.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from typing import Any

from lara_serve.server import request_context

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_ACCESS_FIELDS = ("method", "path", "status", "duration_ms")


class RequestIdFilter(logging.Filter):
    """Puts the current request's id on the record (None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_context.request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
        }
        entry.update({k: getattr(record, k) for k in _ACCESS_FIELDS if hasattr(record, k)})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str, fmt: str) -> None:
    """The root handler for the server's process: text or JSON lines on stderr, request ids on both."""
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    if fmt == "json":
        # gRPC's C core writes its own (not JSON) lines to stderr, e.g. one per failed TLS handshake: only
        # its errors then (read when grpc is imported, i.e. later). An explicit GRPC_VERBOSITY wins.
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
