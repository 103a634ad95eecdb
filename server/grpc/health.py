"""`grpc.health.v1.Health` (Kubernetes gRPC probes, grpc_health_probe) read from the app's state.

Service names: "" and the KServe service name answer for the whole server (SERVING when it is ready);
a model's name answers for that model: SERVING while it serves, NOT_SERVING while the server loads or
drains and while the model is unloaded or failed. An unknown name is NOT_FOUND for Check and
SERVICE_UNKNOWN for Watch, as the health protocol says.

The status is computed from AppState on each call rather than pushed: loads and unloads happen over HTTP
and gRPC alike and the drain starts in lara_serve.server.serving, so reading the state is the one way to
never miss a change. Watch looks again every WATCH_POLL_S and writes only when the status changed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lara_serve.server.grpc.access import note_model
from lara_serve.server.repository import RepositoryError, discover
from lara_serve.server.routes.common import AppState

SERVICE_NAME = "grpc.health.v1.Health"
WATCH_POLL_S = 0.5  # how stale a watcher's view may get; one dict lookup per watcher per tick
_Status = health_pb2.HealthCheckResponse.ServingStatus
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


def serving_status(state: AppState, service: str, server_names: frozenset[str]) -> _Status | None:
    """The status of `service` now; None for a name that is neither the server nor a known model."""
    if service in server_names:
        return SERVING if state.ready else NOT_SERVING
    serving = state.started and not state.draining and service in state.registry.models
    if serving:
        return SERVING
    if service in state.registry.models or service in state.registry.failed:
        return NOT_SERVING
    try:  # not loaded yet (start-up, or --model-control explicit before a load): known if in the repository
        known = service in discover(state.settings.model_repository)
    except RepositoryError:
        known = False
    return NOT_SERVING if known else None


class HealthService(health_pb2_grpc.HealthServicer):
    """No API key: probes carry none, like /v2/health/*."""

    def __init__(self, state: AppState, server_names: frozenset[str]) -> None:
        self.state, self.server_names = state, server_names

    async def Check(self, request: health_pb2.HealthCheckRequest, context: Any) -> health_pb2.HealthCheckResponse:
        note_model(request.service)
        status = serving_status(self.state, request.service, self.server_names)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, self._unknown(request.service))
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: Any) -> None:
        note_model(request.service)
        last: _Status | None = None
        while True:  # ends when the client cancels, or once the drain's NOT_SERVING is written
            draining = self.state.draining  # read before the status: a drain that starts during write() is
            status = serving_status(self.state, request.service, self.server_names)  # seen on the next turn
            status = UNKNOWN if status is None else status
            if status != last:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
            if draining:  # an open stream would hold the server's stop for its whole grace period
                return
            await asyncio.sleep(WATCH_POLL_S)

    def _unknown(self, service: str) -> str:
        models = sorted({*self.state.registry.models, *self.state.registry.failed})
        return f"unknown service {service!r}: ask for '' (the server) or a model name, one of {models}"


def add_health(server: grpc.aio.Server, state: AppState, server_names: frozenset[str]) -> None:
    health_pb2_grpc.add_HealthServicer_to_server(HealthService(state, server_names), server)
