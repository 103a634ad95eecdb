"""Operations: request ids and JSON logs, CORS, metrics by protocol and of out-of-distribution answers (in
process); TLS on the HTTP and gRPC ports with a self-signed certificate, against a live server."""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from server_helpers import TEXT, serve

from lara_serve.server import Settings, create_app
from lara_serve.server.log_format import JsonFormatter, RequestIdFilter
from lara_serve.server.synthetic import ENGLISH, TEXT_LABELS, make_text_model
from lara_serve.server.testing import free_port

PREDICT = f"/v1/models/{TEXT}:predict"
ORIGIN = "https://app.example.com"


@pytest.mark.anyio
async def test_request_id_is_taken_when_valid_else_made(make_settings: Callable[..., Settings]) -> None:
    async with serve(make_settings()) as client:
        given = await client.get("/v2/health/live", headers={"X-Request-ID": "trace-42/abc"})
        assert given.headers["x-request-id"] == "trace-42/abc"
        made = {(await client.get("/v2/health/live")).headers["x-request-id"] for _ in range(2)}
        assert len(made) == 2 and all(len(r) == 32 and int(r, 16) >= 0 for r in made)
        for bad in ("x" * 129, "has space", "tab\there", "é"):
            r = await client.get("/v2/health/live", headers={"X-Request-ID": bad.encode()})
            assert r.status_code == 200 and len(r.headers["x-request-id"]) == 32, bad  # replaced, not refused
        error = await client.post(PREDICT, content=b"{nope", headers={"X-Request-ID": "err-1"})
        assert error.status_code == 400 and error.headers["x-request-id"] == "err-1"


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """The root logger's output as the server writes it with --log-format json."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield stream
    root.removeHandler(handler)
    root.setLevel(old_level)


@pytest.mark.anyio
async def test_json_logs_carry_the_request_id_on_every_line(
    make_settings: Callable[..., Settings], json_log: io.StringIO
) -> None:
    app = create_app(make_settings(log_format="json"))

    @app.get("/boom", include_in_schema=False)
    async def boom() -> None:
        logging.getLogger("lara_serve.test").warning("about to fail")
        raise RuntimeError("boom")

    async with serve_app(app) as client:
        ok = await client.post(PREDICT, json={"instances": ["hello"]}, headers={"X-Request-ID": "req-ok"})
        failed = await client.get("/boom", headers={"X-Request-ID": "req-boom"})
    assert ok.status_code == 200 and failed.status_code == 500 and failed.headers["x-request-id"] == "req-boom"
    lines = [json.loads(line) for line in json_log.getvalue().splitlines()]
    by_id: dict[str, list[dict[str, object]]] = {}
    for line in lines:
        assert {"time", "level", "message", "request_id"} <= line.keys()
        by_id.setdefault(str(line["request_id"]), []).append(line)
    (access,) = [line for line in by_id["req-ok"] if line["logger"] == "lara_serve.access"]
    assert access["method"] == "POST" and access["path"] == PREDICT and access["status"] == 200
    assert isinstance(access["duration_ms"], float) and access["duration_ms"] > 0
    logged = {str(line["level"]): line for line in by_id["req-boom"]}  # the route's line, the access line, the error
    assert sorted(logged) == ["error", "info", "warning"] and len(by_id["req-boom"]) == 3
    assert "RuntimeError: boom" in str(logged["error"]["exception"]) and logged["info"]["status"] == 500


@asynccontextmanager
async def serve_app(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """The in-process client of an app the test built (a 500 comes back as a response, not raised)."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


@pytest.mark.anyio
async def test_cors_allows_listed_origins_only(make_settings: Callable[..., Settings]) -> None:
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    async with serve(make_settings(cors_allow_origins=f"{ORIGIN}/, https://other.example.com")) as client:
        allowed = await client.options(PREDICT, headers={"Origin": ORIGIN, **preflight})
        assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == ORIGIN
        assert "POST" in allowed.headers["access-control-allow-methods"]
        refused = await client.options(PREDICT, headers={"Origin": "https://evil.example.com", **preflight})
        assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers
        assert "origin" in refused.json()["error"] and ORIGIN in refused.json()["error"]
        simple = await client.post(PREDICT, json={"instances": ["x"]}, headers={"Origin": ORIGIN})
        assert simple.headers["access-control-allow-origin"] == ORIGIN
        assert "x-request-id" in simple.headers["access-control-expose-headers"].lower()
    async with serve(make_settings()) as client:  # off by default: no CORS headers at all
        r = await client.options(PREDICT, headers={"Origin": ORIGIN, **preflight})
        assert r.status_code == 405 and "access-control-allow-origin" not in r.headers


@pytest.mark.anyio
async def test_requests_are_counted_by_protocol(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings()
    app = create_app(settings)
    async with serve_app(app) as client:
        assert (await client.post(PREDICT, json={"instances": ["a", "b"]})).status_code == 200
        v2 = {"inputs": [{"name": "raw", "datatype": "BYTES", "shape": [1], "data": ["c"]}]}
        assert (await client.post(f"/v2/models/{TEXT}/infer", json=v2)).status_code == 200
        assert (await client.post(f"/predict?model={TEXT}", json={"inputs": "d"})).status_code == 200
        ts = await client.post(f"/predictions/{TEXT}", content=b"e", headers={"Content-Type": "text/plain"})
        assert ts.status_code == 200
        assert (await client.post(f"/v2/models/{TEXT}/infer", json={"inputs": []})).status_code == 400
    m = app.state.lara.metrics.registry
    for protocol, outcome in [
        ("v1", "ok"),
        ("v2", "ok"),
        ("tei", "ok"),
        ("torchserve", "ok"),
        ("v2", "malformed_request"),
    ]:
        labels = {"model": TEXT, "outcome": outcome, "protocol": protocol}
        assert m.get_sample_value("lara_requests_total", labels) == 1, labels
        if outcome == "ok":
            assert m.get_sample_value("lara_request_seconds_count", {"model": TEXT, "protocol": protocol}) >= 1


@pytest.mark.anyio
async def test_out_of_distribution_answers_are_counted(tmp_path: Path) -> None:
    make_text_model(tmp_path, "ood-text", max_length=4096, ood=True)
    noise = bytes(np.random.default_rng(3).integers(0, 256, 600, dtype=np.uint8)).decode("latin-1")
    app = create_app(Settings(model_repository=tmp_path))
    async with serve_app(app) as client:
        r = await client.post("/v1/models/ood-text:predict", json={"instances": [ENGLISH[0].decode(), "a", noise]})
        assert [p["in_distribution"] for p in r.json()["predictions"]] == [True, False, False]
        r = await client.post("/v1/models/ood-text:predict", json={"instances": [ENGLISH[1].decode()]})
        assert r.json()["predictions"][0]["in_distribution"] is True
    text = app.state.lara.metrics.render().decode()
    assert 'lara_out_of_distribution_total{model="ood-text"} 2.0' in text


# -- TLS on both ports, JSON logs from the real process --


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def tls_server(repo: Path, certificate: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    cert, key = certificate
    port, grpc_port = free_port(), free_port()
    log_path = tmp_path_factory.mktemp("log") / "server.log"
    cmd = [sys.executable, "-m", "lara_serve.server", "--host", "127.0.0.1", "--port", str(port),
           "--grpc-port", str(grpc_port), "--ssl-certfile", str(cert), "--ssl-keyfile", str(key),
           "--log-format", "json", "--num-threads", "1"]  # fmt: skip
    context = ssl.create_default_context(cafile=str(cert))
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, env={**os.environ, "LARA_MODEL_REPOSITORY": str(repo)}, stdout=log, stderr=log)
        url = f"https://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
                try:
                    if httpx.get(f"{url}/v2/health/ready", verify=context, timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            yield {"url": url, "grpc": f"127.0.0.1:{grpc_port}", "cert": cert, "context": context, "log": log_path}
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_https_answers_with_the_certificate_and_plain_http_is_refused(tls_server: dict) -> None:
    url, context = tls_server["url"], tls_server["context"]
    r = httpx.post(f"{url}{PREDICT}", json={"instances": ["over tls"]}, verify=context, timeout=10)
    assert r.status_code == 200 and r.json()["predictions"][0]["label"] in TEXT_LABELS
    with pytest.raises(httpx.ConnectError):  # the certificate is not in the default trust store
        httpx.get(f"{url}/v2/health/live", timeout=5)
    with pytest.raises(httpx.HTTPError):  # no plain HTTP on a TLS port
        httpx.get(url.replace("https", "http") + "/v2/health/live", timeout=5)


def test_grpc_over_tls(tls_server: dict) -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc")
    client = grpcclient.InferenceServerClient(tls_server["grpc"], ssl=True, root_certificates=str(tls_server["cert"]))
    assert client.is_server_live()
    tensor = grpcclient.InferInput("raw", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"grpc over tls"], dtype=object))
    probabilities = client.infer(TEXT, [tensor]).as_numpy("probabilities")
    assert probabilities.shape == (1, len(TEXT_LABELS))
    client.close()
    metrics = httpx.get(f"{tls_server['url']}/metrics", verify=tls_server["context"], timeout=5).text
    assert f'lara_requests_total{{model="{TEXT}",outcome="ok",protocol="grpc"}} 1.0' in metrics
    plain = grpcclient.InferenceServerClient(tls_server["grpc"])  # no TLS: refused
    with pytest.raises(Exception, match="(?i)unavailable|handshake|ssl|connect"):
        plain.is_server_live(client_timeout=3)
    plain.close()


def test_the_process_logs_json_lines_with_request_ids(tls_server: dict) -> None:
    r = httpx.get(f"{tls_server['url']}/v2/health/live", headers={"X-Request-ID": "live-7"},
                  verify=tls_server["context"], timeout=5)  # fmt: skip
    assert r.headers["x-request-id"] == "live-7"
    deadline = time.monotonic() + 5
    while '"live-7"' not in tls_server["log"].read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = [json.loads(line) for line in tls_server["log"].read_text().splitlines() if line.strip()]
    assert lines and all({"time", "level", "message", "request_id"} <= line.keys() for line in lines)
    (access,) = [line for line in lines if line["request_id"] == "live-7"]
    assert (access["method"], access["path"], access["status"]) == ("GET", "/v2/health/live", 200)
    assert any("ready" in line["message"] for line in lines)  # uvicorn's and the app's own lines too


def test_tls_settings_are_checked_at_start_up(repo: Path, certificate: tuple[Path, Path]) -> None:
    cert, key = certificate
    with pytest.raises(ValueError, match="set both ssl_certfile and ssl_keyfile"):
        Settings(model_repository=repo, ssl_certfile=cert)
    with pytest.raises(ValueError, match="'missing.pem' does not exist"):
        Settings(model_repository=repo, ssl_certfile=cert, ssl_keyfile=cert.parent / "missing.pem")
    assert Settings(model_repository=repo, ssl_certfile=cert, ssl_keyfile=key).ssl_keyfile == key
    origins = Settings(
        model_repository=repo, cors_allow_origins=f" {ORIGIN}/ ,https://b.example.com"
    ).cors_allow_origins
    assert origins == [ORIGIN, "https://b.example.com"]
