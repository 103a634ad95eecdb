"""KServe v2 gRPC (Triton's `inference.GRPCInferenceService`) over the HTTP routes' own calls.

Every RPC is registered with raw bytes in, so a message that does not parse is INVALID_ARGUMENT with a
message (not grpc's generic INTERNAL); the API key is checked before that (lara_serve.server.grpc.limits,
with the connection, call and byte limits), then the same calls the HTTP routes make, and
ServeError kinds become gRPC codes through lara_serve.server.errors.GRPC_STATUS. Not served (UNIMPLEMENTED): the
streaming ModelStreamInfer, shared memory, trace and log settings. Beside it on the same port:
grpc.health.v1 (lara_serve.server.grpc.health), server reflection (.reflection) and one access-log line
per call (.access).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from lara_serve.server.errors import GRPC_STATUS, ErrorKind, ServeError, clean_message
from lara_serve.server.grpc import convert
from lara_serve.server.grpc.access import AccessLog, note_model
from lara_serve.server.grpc.limits import KEY_MESSAGE, PUBLIC, ByteBudget, CallGuard, channel_options, key_matches
from lara_serve.server.routes import triton, v2
from lara_serve.server.routes.common import AppState, timing_headers, track
from lara_serve.server.schemas import run_sized

log = logging.getLogger(__name__)
SERVICE = "inference.GRPCInferenceService"
# Messages over schemas.OFF_LOOP_BYTES are parsed and converted in the HTTP bodies' parser thread (run_sized):
# millions of typed values take seconds to become an array, and health checks must be answered meanwhile.

Rpc = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


class InferenceService:
    """One method per RPC, named as in the service definition; `app_state` is the FastAPI app's state
    (for the model-control lock the HTTP routes share)."""

    def __init__(self, state: AppState, app_state: Any) -> None:
        self.state, self.app_state = state, app_state

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.state.ready)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        try:
            self.state.model(request.name, request.version or None)
        except ServeError as exc:
            if exc.kind not in (ErrorKind.NOT_READY, ErrorKind.NOT_FOUND):
                raise
            # Loading, draining, unloaded, failed, or no such model or version: Triton answers ready=false
            # too, so `while not client.is_model_ready(m)` loops wait instead of crashing.
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name=v2.SERVER_NAME, version=v2.SERVER_VERSION, extensions=triton.EXTENSIONS)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        metadata = await v2.model_metadata(request.name, self.state, request.version or None)
        return convert.metadata_response(metadata)

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        config = await triton.model_config(request.name, self.state, request.version or None)
        return convert.from_json({"config": config}, pb.ModelConfigResponse())

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Any) -> pb.ModelStatisticsResponse:
        if request.name:
            stats = await triton.model_stats(request.name, self.state, request.version or None)
        else:
            stats = await triton.all_stats(self.state)
        return convert.from_json(stats, pb.ModelStatisticsResponse())

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Any) -> pb.RepositoryIndexResponse:
        models = triton.index(self.state, request.ready)
        return convert.from_json({"models": models}, pb.RepositoryIndexResponse())

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        params = convert.parameters(request.parameters)
        await triton.load(request.model_name, params, self.state, triton.control_lock(self.app_state))
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        await triton.unload(request.model_name, self.state, triton.control_lock(self.app_state))
        return pb.RepositoryModelUnloadResponse()

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        state = self.state
        with track(state, request.model_name):
            model = state.model(request.model_name, request.model_version or None)
            decoded = await run_sized(request.ByteSize(), convert.decoded_request, request)
            timeout_s = state.settings.request_timeout_s
            remaining = context.time_remaining()  # the client's deadline, if it set one
            if remaining is not None:
                if remaining <= 0:
                    raise ServeError(ErrorKind.TIMEOUT, "the call's deadline passed before inference")
                timeout_s = min(timeout_s, remaining)
            answer = await v2.run_infer(state, model, decoded, timeout_s)
            selected = v2.select(answer, decoded, model)
            timing = timing_headers(state, model.name, answer.results)  # also the statistics' queue/compute
            context.set_trailing_metadata(tuple((k.lower(), v) for k, v in timing.items()))
            return convert.infer_response(answer, selected)

    # -- plumbing ------------------------------------------------------------------------------------------

    def check_key(self, context: Any) -> None:
        key = self.state.settings.api_key
        if key is None:
            return
        if not key_matches(key.get_secret_value(), context.invocation_metadata()):
            raise ServeError(ErrorKind.UNAUTHENTICATED, KEY_MESSAGE)


class _Handler(grpc.GenericRpcHandler):
    """Routes `/inference.GRPCInferenceService/<Method>` to InferenceService.<Method>, bytes in."""

    def __init__(self, service: InferenceService) -> None:
        self._service = service
        settings = service.state.settings
        self._budget = ByteBudget(
            settings.max_large_bodies * settings.grpc_max_message_bytes, settings.large_body_bytes
        )
        names = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods_by_name
        self._handlers = {
            name: grpc.unary_unary_rpc_method_handler(
                self._wrap(name, getattr(service, name), getattr(pb, f"{name}Request")),
                request_deserializer=None,
                response_serializer=lambda message: message.SerializeToString(),
            )
            for name in names
            if hasattr(service, name)
        }

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        prefix, _, name = handler_call_details.method.rpartition("/")
        return self._handlers.get(name) if prefix == f"/{SERVICE}" else None

    def _wrap(self, name: str, rpc: Rpc, request_type: Any) -> Callable[[bytes, Any], Awaitable[Any]]:
        async def call(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            failure: tuple[grpc.StatusCode, str] | None = None
            taken = self._budget.take(len(raw))
            try:
                if taken < 0:
                    failure = self._over_budget(len(raw))
                else:
                    return await self._parsed_call(name, rpc, request_type, raw, context)
            except ServeError as exc:
                failure = (getattr(grpc.StatusCode, GRPC_STATUS[exc.kind]), clean_message(exc.message))
            except RecursionError:
                failure = (grpc.StatusCode.INVALID_ARGUMENT, "the request is nested too deeply")
            except Exception as exc:
                log.exception("unexpected error in gRPC %s", name)
                failure = (grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")
            finally:
                if taken > 0:
                    self._budget.give(taken)
            await context.abort(*failure)  # raises: the call ends with this status

        return call

    def _over_budget(self, size: int) -> tuple[grpc.StatusCode, str]:
        """RESOURCE_EXHAUSTED (retryable), counted as HTTP's large-body 503s are."""
        metrics = self._service.state.metrics
        metrics.large_bodies_refused.inc()
        metrics.requests.labels("", ErrorKind.NOT_READY.value, "grpc").inc()
        message = (
            f"this {size}-byte message would pass the {self._budget.limit} bytes of large messages in flight "
            "(max_large_bodies x grpc_max_message_bytes); retry"
        )
        return grpc.StatusCode.RESOURCE_EXHAUSTED, message

    async def _parsed_call(self, name: str, rpc: Rpc, request_type: Any, raw: bytes, context: Any) -> Any:
        try:
            request = await run_sized(len(raw), request_type.FromString, raw)
        except DecodeError:
            if name == "ModelInfer":  # counted like every other inference call, though it names no model
                self._service.state.metrics.requests.labels("", ErrorKind.MALFORMED.value, "grpc").inc()
            raise ServeError(ErrorKind.MALFORMED, f"the {name} request is not a valid {name}Request") from None
        note_model(getattr(request, "model_name", "") or getattr(request, "name", ""))
        if name not in PUBLIC:
            self._service.check_key(context)  # CallGuard checked it already; in-process callers come here
        return await rpc(request, context)


def build_server(state: AppState, app_state: Any) -> grpc.aio.Server:
    """A gRPC server bound to settings.host:settings.grpc_port (not started)."""
    from lara_serve.server.serving import fit_all

    settings = state.settings
    _, max_connections, _ = fit_all(settings)  # the same split of the open-file budget as the HTTP side's
    server = grpc.aio.server(
        options=channel_options(state, max_connections),
        interceptors=[AccessLog(), CallGuard(state, settings.grpc_max_concurrent_calls)],
    )
    server.add_generic_rpc_handlers((_Handler(InferenceService(state, app_state)),))
    _add_tooling(server, state)
    address = f"{settings.host}:{settings.grpc_port}"
    if settings.ssl_certfile is not None and settings.ssl_keyfile is not None:  # TLS as on the HTTP port
        pair = (settings.ssl_keyfile.read_bytes(), settings.ssl_certfile.read_bytes())
        bound = server.add_secure_port(address, grpc.ssl_server_credentials([pair]))
    else:
        bound = server.add_insecure_port(address)
    if bound == 0:
        raise RuntimeError(f"cannot listen for gRPC on {address}")
    return server


def _add_tooling(server: grpc.aio.Server, state: AppState) -> None:
    """grpc.health.v1 and reflection come with the `grpc` extra; an environment installed before they joined
    it still serves KServe v2, and says what is missing."""
    listed = [SERVICE]
    try:
        from lara_serve.server.grpc.health import SERVICE_NAME, add_health

        add_health(server, state, frozenset({"", SERVICE}))
        listed.append(SERVICE_NAME)
    except ImportError as exc:
        log.warning("gRPC health checking is off (%s): pip install 'lara-serve[grpc]'", exc)
    try:
        from lara_serve.server.grpc.reflection import add_reflection

        add_reflection(server, listed)
    except ImportError as exc:
        log.warning("gRPC server reflection is off (%s): pip install 'lara-serve[grpc]'", exc)
