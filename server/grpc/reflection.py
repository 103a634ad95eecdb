"""gRPC server reflection, so grpcurl, grpcui and Postman can list and call the services without a proto.

grpcio-reflection serves `grpc.reflection.v1alpha.ServerReflection`; current grpcurl and grpcui ask for
`grpc.reflection.v1` first (falling back to v1alpha). The two protocols' messages are the same on the wire,
so the same servicer answers under both names. The listed services are the ones in `service_names` plus
v1alpha reflection itself: v1's descriptors are not in the Python package, so it is served, not listed.
"""

from __future__ import annotations

import grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

V1_SERVICE = "grpc.reflection.v1.ServerReflection"


def add_reflection(server: grpc.aio.Server, service_names: list[str]) -> None:
    servicer = reflection.aio.ReflectionServicer([*service_names, reflection.SERVICE_NAME])
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(reflection.SERVICE_NAME, {"ServerReflectionInfo": handler}),
            grpc.method_handlers_generic_handler(V1_SERVICE, {"ServerReflectionInfo": handler}),
        )
    )
