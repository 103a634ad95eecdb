"""KServe v2 gRPC end to end with tritonclient.grpc against a live server (API key, explicit model control),
and bad messages answered with the right status and a message."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from server_helpers import IMAGE, MAX_LENGTH, TEXT, png_bytes

from lara_serve.server.synthetic import IMAGE_LABELS, TEXT_LABELS
from lara_serve.server.testing import free_port, server_process

grpcclient = pytest.importorskip("tritonclient.grpc")
grpc = pytest.importorskip("grpc")
from tritonclient.grpc import service_pb2 as pb  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

KEY = "grpc-test-key"
AUTH = {"authorization": f"Bearer {KEY}"}
LIMIT = 256 * 1024  # grpc_max_message_bytes of this server


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[tuple[str, str]]:
    port = free_port()
    env = {"LARA_MODEL_REPOSITORY": str(repo), "LARA_NUM_THREADS": "1", "LARA_API_KEY": KEY}
    args = ["--log-level", "warning", "--model-control", "explicit", "--grpc-port", str(port),
            "--grpc-max-message-bytes", str(LIMIT), "--max-queue-delay-ms", "5"]  # fmt: skip
    with server_process(args, env=env) as url:
        yield url, f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def client(server: tuple[str, str]) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(url=server[1])


def _texts(*texts: str | bytes) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("raw", [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() if isinstance(t, str) else t for t in texts], dtype=object))
    return tensor


def _status(call: object) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value.status(), info.value.message()


def test_health_and_server_metadata(client: grpcclient.InferenceServerClient, server: tuple[str, str]) -> None:
    assert client.is_server_live() and client.is_server_ready()  # probes need no key
    assert client.is_model_ready(TEXT, headers=AUTH)
    metadata = client.get_server_metadata(headers=AUTH)
    assert metadata.name == "lara-serve" and "model_repository" in metadata.extensions
    import httpx

    info = httpx.get(f"{server[0]}/info", headers=AUTH).json()
    assert info["protocols"]["v2_grpc"] == server[1]


def test_model_metadata_and_config(client: grpcclient.InferenceServerClient) -> None:
    metadata = client.get_model_metadata(TEXT, headers=AUTH, as_json=True)
    assert {i["name"] for i in metadata["inputs"]} >= {"raw", "input_ids"}
    config = client.get_model_config(IMAGE, headers=AUTH, as_json=True)["config"]
    assert config["platform"] == metadata["platform"] == "onnxruntime_onnx"
    assert float(config["parameters"]["std"]["string_value"]) > 0  # the preprocessing numbers
    assert json.loads(config["parameters"]["image_size"]["string_value"]) == [28, 28]
    text = client.get_model_config(TEXT, headers=AUTH, as_json=True)["config"]
    assert int(text["parameters"]["max_length"]["string_value"]) == MAX_LENGTH


def test_infer_raw_text_matches_http(client: grpcclient.InferenceServerClient, server: tuple[str, str]) -> None:
    import httpx

    texts = ["markets rallied today", "the striker scored twice"]
    result = client.infer(TEXT, [_texts(*texts)], headers=AUTH)
    probabilities = result.as_numpy("probabilities")  # [2, n_labels]
    assert probabilities.shape == (2, len(TEXT_LABELS))
    http_body = {"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [2], "data": texts}]}
    http = httpx.post(f"{server[0]}/v2/models/{TEXT}/infer", json=http_body, headers=AUTH).json()
    (http_probs,) = [o["data"] for o in http["outputs"] if o["name"] == "probabilities"]
    np.testing.assert_allclose(probabilities.reshape(-1), http_probs, atol=1e-6)
    assert [v.decode() for v in result.as_numpy("label")] == [TEXT_LABELS[i] for i in probabilities.argmax(1)]
    truncated = result.get_response().parameters["truncated"]
    assert truncated.WhichOneof("parameter_choice") == "bool_param" and truncated.bool_param is False
    assert result.get_response().parameters["truncated_count"].int64_param == 0


def test_infer_preprocessed_inputs_typed_and_raw(client: grpcclient.InferenceServerClient) -> None:
    text = b"same text, two encodings"
    ids = (np.frombuffer(text, dtype=np.uint8).astype(np.int64) + 1)[None]  # [1, L]
    raw_ids = grpcclient.InferInput("input_ids", list(ids.shape), "INT64")
    raw_ids.set_data_from_numpy(ids)  # raw_input_contents
    by_raw = client.infer(TEXT, [raw_ids], headers=AUTH).as_numpy("probabilities")
    by_text = client.infer(TEXT, [_texts(text)], headers=AUTH).as_numpy("probabilities")
    np.testing.assert_allclose(by_raw, by_text, atol=1e-6)
    # Typed contents (no raw_input_contents), built by hand: what non-Python clients often send.
    stub = grpcclient.service_pb2_grpc.GRPCInferenceServiceStub(client._channel)
    request = pb.ModelInferRequest(model_name=TEXT)
    tensor = request.inputs.add(name="input_ids", datatype="INT64", shape=list(ids.shape))
    tensor.contents.int64_contents.extend(ids.reshape(-1).tolist())
    response = stub.ModelInfer(request, metadata=tuple(AUTH.items()))
    typed = np.frombuffer(response.raw_output_contents[0], dtype=np.float32)
    np.testing.assert_allclose(typed, by_text.reshape(-1), atol=1e-6)


def test_infer_image_class_count_and_truncation(client: grpcclient.InferenceServerClient) -> None:
    image = grpcclient.InferInput("raw", [1], "BYTES")
    image.set_data_from_numpy(np.array([png_bytes(seed=2)], dtype=object))
    out = grpcclient.InferRequestedOutput("probabilities", class_count=2)
    top = client.infer(IMAGE, [image], outputs=[out], headers=AUTH).as_numpy("probabilities")
    assert top.shape == (1, 2)
    score, index, label = top[0, 0].decode().split(":")
    assert IMAGE_LABELS[int(index)] == label and 0 < float(score) <= 1
    long = "y" * (MAX_LENGTH + 10)
    status, message = _status(lambda: client.infer(TEXT, [_texts(long)], headers=AUTH))
    assert status == "StatusCode.RESOURCE_EXHAUSTED" and "truncate" in message
    flags = grpcclient.InferRequestedOutput("truncated")
    cut = client.infer(TEXT, [_texts(long, "short")], outputs=[flags], parameters={"truncate": "tail"}, headers=AUTH)
    assert cut.get_response().parameters["truncated"].bool_param is True
    assert cut.get_response().parameters["truncated_count"].int64_param == 1
    assert cut.as_numpy("truncated").tolist() == [True, False]  # per item, as an output on request


def test_key_is_required(client: grpcclient.InferenceServerClient) -> None:
    status, message = _status(lambda: client.infer(TEXT, [_texts("no key")]))
    assert status == "StatusCode.UNAUTHENTICATED" and "authorization" in message
    status, _ = _status(lambda: client.get_model_metadata(TEXT, headers={"x-api-key": "wrong-key-123"}))
    assert status == "StatusCode.UNAUTHENTICATED"
    assert client.get_model_metadata(TEXT, headers={"x-api-key": KEY}).name == TEXT


def test_statistics_and_repository(client: grpcclient.InferenceServerClient) -> None:
    client.infer(TEXT, [_texts("count me")], headers=AUTH)
    (stats,) = client.get_inference_statistics(TEXT, headers=AUTH, as_json=True)["model_stats"]
    success = int(stats["inference_stats"]["success"]["count"])
    assert success >= 1 and int(stats["inference_stats"]["queue"]["count"]) == success
    assert int(stats["last_inference"]) > 0 and stats["batch_stats"]
    every = client.get_inference_statistics(headers=AUTH, as_json=True)["model_stats"]
    assert {s["name"] for s in every} == {TEXT, IMAGE}
    index = client.get_model_repository_index(headers=AUTH, as_json=True)["models"]
    assert {m["name"]: m["state"] for m in index} == {TEXT: "READY", IMAGE: "READY"}


def test_unload_and_load_with_and_without_key(client: grpcclient.InferenceServerClient) -> None:
    status, _ = _status(lambda: client.unload_model(IMAGE))
    assert status == "StatusCode.UNAUTHENTICATED" and client.is_model_ready(IMAGE, headers=AUTH)
    client.unload_model(IMAGE, headers=AUTH)
    assert not client.is_model_ready(IMAGE, headers=AUTH)
    status, message = _status(lambda: client.infer(IMAGE, [_texts(b"x")], headers=AUTH))
    assert status == "StatusCode.UNAVAILABLE" and "load" in message
    assert _status(lambda: client.load_model(IMAGE))[0] == "StatusCode.UNAUTHENTICATED"
    client.load_model(IMAGE, headers=AUTH)
    assert client.is_model_ready(IMAGE, headers=AUTH)
    assert _status(lambda: client.load_model("no-such-model", headers=AUTH))[0] == "StatusCode.NOT_FOUND"


def test_deadline_and_cancellation(client: grpcclient.InferenceServerClient) -> None:
    # A deadline shorter than the batching delay plus compute: DEADLINE_EXCEEDED, not a hang.
    many = _texts(*["z" * MAX_LENGTH] * 64)
    status, _ = _status(lambda: client.infer(TEXT, [many], headers=AUTH, client_timeout=0.001))
    assert status == "StatusCode.DEADLINE_EXCEEDED"
    done = threading.Event()
    future = client.async_infer(TEXT, [many], callback=lambda result, error: done.set(), headers=AUTH)
    future.cancel()
    assert done.wait(10)  # the callback runs with CANCELLED; the server drops what it has queued
    assert client.infer(TEXT, [_texts("still serving")], headers=AUTH).as_numpy("probabilities").shape[0] == 1


def _raw_call(
    server: tuple[str, str], method: str, body: bytes, metadata: tuple = tuple(AUTH.items())
) -> grpc.RpcError:
    with grpc.insecure_channel(server[1]) as channel:
        call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
        with pytest.raises(grpc.RpcError) as info:
            call(body, metadata=metadata, timeout=30)
    return info.value


def test_bad_messages_get_the_right_status(client: grpcclient.InferenceServerClient, server: tuple[str, str]) -> None:
    garbage = _raw_call(server, "ModelInfer", b"\xff\xff\xff not a protobuf")
    assert garbage.code() == grpc.StatusCode.INVALID_ARGUMENT and "ModelInferRequest" in garbage.details()
    huge = _raw_call(server, "ModelInfer", b"\x00" * (LIMIT + 1))
    assert huge.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    stub = grpcclient.service_pb2_grpc.GRPCInferenceServiceStub(client._channel)
    meta = tuple(AUTH.items())

    def infer(request: pb.ModelInferRequest) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, metadata=meta, timeout=30)
        return info.value

    lying = pb.ModelInferRequest(model_name=TEXT)
    lying.inputs.add(name="input_ids", datatype="INT64", shape=[1, 1000])
    lying.raw_input_contents.append(np.ones(4, dtype=np.int64).tobytes())
    error = infer(lying)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "needs 8000 bytes" in error.details()
    negative = pb.ModelInferRequest(model_name=TEXT)
    negative.inputs.add(name="input_ids", datatype="INT64", shape=[-1, 4])
    negative.raw_input_contents.append(np.ones(4, dtype=np.int64).tobytes())
    assert infer(negative).code() == grpc.StatusCode.INVALID_ARGUMENT
    odd_type = pb.ModelInferRequest(model_name=TEXT)
    odd_type.inputs.add(name="input_ids", datatype="COMPLEX64", shape=[1, 1])
    error = infer(odd_type)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "COMPLEX64" in error.details()
    unknown = pb.ModelInferRequest(model_name="nope")
    unknown.inputs.add(name="raw", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"x")
    error = infer(unknown)
    assert error.code() == grpc.StatusCode.NOT_FOUND and "nope" in error.details()
    no_inputs = infer(pb.ModelInferRequest(model_name=TEXT))
    assert no_inputs.code() == grpc.StatusCode.INVALID_ARGUMENT
    streaming = _raw_call(server, "ModelStreamInfer", b"")
    assert streaming.code() == grpc.StatusCode.UNIMPLEMENTED
    time.sleep(0)  # the server is still up:
    assert client.is_server_live()


# -- the tooling around the service: ModelReady for any name, reflection, grpc.health.v1 ----------------


def test_model_ready_is_false_for_unknown_models_and_versions(client: grpcclient.InferenceServerClient) -> None:
    # Triton answers ready=false (not NOT_FOUND), so `while not client.is_model_ready(m)` loops wait.
    assert client.is_model_ready("no-such-model", headers=AUTH) is False
    assert client.is_model_ready(TEXT, model_version="999", headers=AUTH) is False
    assert client.is_model_ready(TEXT, model_version="1", headers=AUTH) is True
    assert _status(lambda: client.is_model_ready("no-such-model"))[0] == "StatusCode.UNAUTHENTICATED"


def test_reflection_lists_and_describes_the_services(server: tuple[str, str]) -> None:
    from google.protobuf.descriptor_pool import DescriptorPool

    pytest.importorskip("grpc_reflection", reason="grpcio-reflection (the grpc extra) is not installed")
    from grpc_reflection.v1alpha import reflection_pb2
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    with grpc.insecure_channel(server[1]) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)  # what grpcurl, grpcui and Postman do
        services = set(database.get_services())
        assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= services
        infer = DescriptorPool(database).FindServiceByName("inference.GRPCInferenceService")
        assert {"ModelInfer", "ModelReady", "RepositoryModelLoad"} <= {m.name for m in infer.methods}
        # grpcurl asks the v1 service first; its messages are v1alpha's on the wire.
        v1 = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        (answer,) = list(v1(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10))
    assert {s.name for s in answer.list_services_response.service} == services


def test_health_check_and_watch_follow_unload_and_load(
    client: grpcclient.InferenceServerClient, server: tuple[str, str]
) -> None:
    pytest.importorskip("grpc_health", reason="grpcio-health-checking (the grpc extra) is not installed")
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    with grpc.insecure_channel(server[1]) as channel:  # no API key: probes carry none
        health = health_pb2_grpc.HealthStub(channel)

        def check(service: str) -> int:
            return health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status

        assert check("") == check("inference.GRPCInferenceService") == check(TEXT) == check(IMAGE) == serving
        with pytest.raises(grpc.RpcError) as unknown:
            check("no-such-model")
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND and TEXT in unknown.value.details()
        watch = health.Watch(health_pb2.HealthCheckRequest(service=IMAGE), timeout=30)
        try:
            assert next(watch).status == serving
            client.unload_model(IMAGE, headers=AUTH)
            assert check(IMAGE) == not_serving and check("") == serving  # the other model still serves
            assert next(watch).status == not_serving
            client.load_model(IMAGE, headers=AUTH)
            assert next(watch).status == serving and check(IMAGE) == serving
        finally:
            watch.cancel()
        unknown_watch = health.Watch(health_pb2.HealthCheckRequest(service="no-such-model"), timeout=10)
        assert next(unknown_watch).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        unknown_watch.cancel()
