"""KServe v2 gRPC beside HTTP (settings.grpc_port; needs the `grpc` extra). See lara_serve.server.grpc.service."""
