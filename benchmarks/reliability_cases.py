"""The cases of `python -m benchmarks.reliability`, each on a fresh `python -m lara_serve.server` on 127.0.0.1 over
synthetic models. Each returns a `Row`: requests answered under load, faults survived, bad inputs tried,
requests lost (unanswered, hung, reset or a 5xx a client caused), and what was measured."""

from __future__ import annotations

import asyncio
import io
import json
import random
import socket
import string
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

from benchmarks.soak_scenarios import Server

TEXT, LONG, IMAGE = "rel-text", "rel-long", "rel-image"


@dataclass
class Row:
    case: str
    load_held: int = 0  # requests answered as intended under the case's load
    faults_survived: int = 0  # injected faults (reloads, tricklers, refused connections) the server got through
    bad_inputs: int = 0  # hostile or malformed requests sent
    lost: int = 0  # requests never answered, hung, reset, false 504s, or 5xx from client input
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


_PROBE = """
import json, sys, threading, time, httpx
url, times, stop = sys.argv[1], [], threading.Event()
with httpx.Client(timeout=60) as client:
    client.get(url + "/v2/health/live")  # connected and imported: the caller's clock starts after this line
    print("started", flush=True)
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.is_set():
        start = time.perf_counter()
        client.get(url + "/v2/health/live")
        times.append(time.perf_counter() - start)
        stop.wait(0.02)
print(json.dumps(times))
"""


class LivenessProbe:
    """GET /v2/health/live every 20 ms from a process of its own (the load generator's GIL must not count);
    `times` are the answer times in seconds, `worst` the slowest, `stats()` p50/p99/max."""

    def __init__(self, url: str) -> None:
        self.url, self.times = url, []

    def __enter__(self) -> LivenessProbe:
        self._proc = subprocess.Popen([sys.executable, "-c", _PROBE, self.url], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert self._proc.stdout is not None
        self._proc.stdout.readline()  # "started": probing from now on
        return self

    def __exit__(self, *exc: object) -> None:
        out, _ = self._proc.communicate(input="", timeout=120)
        self.times = json.loads(out.strip() or "[]")

    @property
    def worst(self) -> float:
        return max(self.times, default=float("nan"))

    def stats(self) -> dict[str, float]:
        ordered = sorted(self.times) or [float("nan")]
        pick = lambda q: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)  # noqa: E731
        return {"n": len(self.times), "p50_s": pick(0.5), "p99_s": pick(0.99), "max_s": round(ordered[-1], 3)}


# -- 1. deadlines ------------------------------------------------------------------------------------------


async def deadlines(repo: Path) -> Row:
    """Five "hi", then a 64 KB document and 64 concurrent 2 KB texts: no 504 for what can finish alone."""
    server = Server(repo, {"LARA_MODELS": LONG, "LARA_REQUEST_TIMEOUT_S": "5", "LARA_NUM_THREADS": "1"})
    row = Row("deadline estimate (5 x 'hi', then 64 KB + 64 x 2 KB)")
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            url = f"/v1/models/{LONG}:classify"
            statuses = [(await client.post(url, content=b"hi")).status_code for _ in range(5)]
            doc = await client.post(url, content=b"x" * 65536)
            statuses.append(doc.status_code)
            texts = await asyncio.gather(*(client.post(url, content=b"y" * 2048) for _ in range(64)))
            statuses += [r.status_code for r in texts]
        row.load_held = statuses.count(200)
        row.lost = sum(s != 200 for s in statuses)
        row.detail = {
            "false_504": statuses.count(504),
            "doc_inference_ms": float(doc.headers.get("x-inference-time-ms", 0)),
        }
    finally:
        server.stop()
    return row


# -- 2. unload / reload under load ------------------------------------------------------------------------


async def reloads(repo: Path, cycles: int = 50) -> Row:
    server = Server(repo, {"LARA_MODELS": LONG, "LARA_MODEL_CONTROL": "explicit", "LARA_WARMUP": "false",
                           "LARA_GRACEFUL_TIMEOUT_S": "5", "LARA_NUM_THREADS": "1"})  # fmt: skip
    row = Row(f"unload/reload x{cycles} under load")
    hung = 0
    done = asyncio.Event()
    statuses: list[int] = []

    async def client_loop(client: httpx.AsyncClient, seed: int) -> None:
        nonlocal hung
        while not done.is_set():
            try:
                response = await client.post(
                    f"/v1/models/{LONG}:classify", content=bytes([97 + seed]) * 16384, timeout=30
                )
                statuses.append(response.status_code)
            except httpx.TimeoutException:
                hung += 1
            except httpx.HTTPError:
                hung += 1  # reset or dropped: an accepted request that got no answer

    try:
        with LivenessProbe(server.url) as probe:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                clients = [asyncio.create_task(client_loop(client, s)) for s in range(4)]
                control_failures = 0
                for cycle in range(cycles):
                    await asyncio.sleep(0.05)
                    action = "unload" if cycle % 2 == 0 else "load"
                    answer = await client.post(f"/v2/repository/models/{LONG}/{action}")
                    control_failures += answer.status_code != 200
                if cycles % 2:
                    await client.post(f"/v2/repository/models/{LONG}/load")
                done.set()
                await asyncio.gather(*clients)
                # A failed reload: the old instance keeps serving and is reported ready.
                onnx = repo / LONG / "1" / "model.onnx"
                good = onnx.read_bytes()
                onnx.write_bytes(b"broken")
                failed = await client.post(f"/v2/repository/models/{LONG}/load")
                onnx.write_bytes(good)
                ready = (await client.get(f"/v2/models/{LONG}/ready")).status_code
                ready_metric = server.metric(f'lara_model_ready{{model="{LONG}"}}')
        row.load_held = statuses.count(200)
        row.faults_survived = cycles - control_failures + (failed.status_code == 422 and ready == 200)
        row.lost = hung + sum(s not in (200, 503) for s in statuses)
        row.detail = {"answered": len(statuses), "answered_503": statuses.count(503), "hung": hung,
                      "liveness_max_s": round(probe.worst, 3), "failed_reload_status": failed.status_code,
                      "ready_after_failed_reload": ready, "lara_model_ready_after": ready_metric}  # fmt: skip
    finally:
        server.stop()
    return row


# -- 3. hostile inputs and a v2 fuzzer -------------------------------------------------------------------


def _png_header(side: int) -> bytes:
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def _hostile() -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, httpx request kwargs) of the hostile classes of the issue."""
    cases: list[tuple[str, str, dict[str, Any]]] = []
    for charset in (
        "rot13",
        "base64",
        "hex",
        "zlib",
        "uu",
        "bz2",
        "quopri",
        "undefined",
        "unicode_escape",
        "x;y",
        "utf-8\\",
    ):
        cases.append(("POST", f"/v1/models/{TEXT}:classify",
                      {"content": b"uryyb", "headers": {"content-type": f"text/plain; charset={charset}"}}))  # fmt: skip
    for shape in ([0, 4611686018427387904], [0, 2**70], [2**40, 0], [0] * 40, [-1], [3, -2]):
        for name, dtype in (("input_ids", "INT64"), ("raw", "BYTES"), ("pixel_values", "FP32")):
            body = {"inputs": [{"name": name, "datatype": dtype, "shape": shape, "data": []}]}
            cases.append(("POST", f"/v2/models/{TEXT}/infer", {"json": body}))
    for side in (10_000, 20_000, 70_000):
        cases.append(("POST", f"/v1/models/{IMAGE}:classify", {"content": _png_header(side)}))
    jpeg = io.BytesIO()
    Image.new("L", (4000, 4000), 128).save(jpeg, format="JPEG")
    cases.append(("POST", f"/v1/models/{IMAGE}:classify", {"content": jpeg.getvalue()[:335] + b"\xff\xd9"}))
    return cases


def _fuzz_v2(rng: random.Random) -> dict[str, Any]:
    dtypes = ["BYTES", "INT64", "INT32", "FP32", "FP16", "BOOL", "UINT8", "nope", 7]
    names = ["raw", "input_ids", "attention_mask", "pixel_values", "x", ""]

    def value() -> Any:
        return rng.choice([rng.randint(-(2**70), 2**70), rng.random() * 10**rng.randint(0, 40), "s" * rng.randint(0, 9),
                           None, True, [], {}, float("inf") if rng.random() < 0.1 else 1.5])  # fmt: skip

    tensors = []
    for _ in range(rng.randint(0, 3)):
        shape = [rng.choice([0, 1, 2, 3, 28, -1, 2**31, 2**62, 2**64]) for _ in range(rng.randint(0, 4))]
        tensor: dict[str, Any] = {"name": rng.choice(names), "datatype": rng.choice(dtypes), "shape": shape,
                                  "data": [value() for _ in range(rng.randint(0, 6))]}  # fmt: skip
        if rng.random() < 0.2:
            tensor["parameters"] = {"binary_data_size": rng.choice([-1, 0, 4, 2**40, "x"]),
                                    "content_type": rng.choice(["base64", "str", 3])}  # fmt: skip
        tensors.append(tensor)
    body: dict[str, Any] = {"inputs": tensors}
    if rng.random() < 0.3:
        body["parameters"] = {
            "truncate": rng.choice([True, "tail", "x", 3]),
            "binary_data_output": rng.choice([1, True]),
        }
    if rng.random() < 0.2:
        body["outputs"] = [{"name": rng.choice(["label", "probabilities", "z"]),
                            "parameters": {"classification": rng.choice([0, 3, -1, "a", 2**70])}}]  # fmt: skip
    return body


async def hostile_inputs(repo: Path, fuzz_cases: int = 1500) -> Row:
    server = Server(repo, {"LARA_MODELS": f"{TEXT},{IMAGE}"})
    row = Row(f"hostile inputs + v2 fuzzer ({fuzz_cases})")
    five_xx: list[str] = []
    without_close = 0
    rng = random.Random(36)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            requests = _hostile()
            paths = [f"/v2/models/{TEXT}/infer", f"/v2/models/{IMAGE}/infer"]
            requests += [("POST", rng.choice(paths), {"content": json.dumps(_fuzz_v2(rng)).encode(),
                                                       "headers": {"content-type": "application/json"}})
                         for _ in range(fuzz_cases)]  # fmt: skip  # json.dumps writes NaN/Infinity tokens too
            junk = "".join(rng.choice(string.printable) for _ in range(64)).encode()
            requests += [("POST", f"/v1/models/{TEXT}:predict", {"content": junk})] * 5
            for method, path, kwargs in requests:
                response = await client.request(method, path, **kwargs)
                if response.status_code >= 500:
                    five_xx.append(f"{path} {response.status_code} {response.text[:120]}")
                    without_close += response.headers.get("connection") != "close"
            nan = {
                "inputs": [{"name": "pixel_values", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [3e38] * 784}]
            }
            nonfinite = await client.post(f"/v2/models/{IMAGE}/infer", json=nan)
            json.loads(nonfinite.content)  # valid JSON (no NaN), whatever the status
        row.bad_inputs = len(requests) + 1
        row.lost = len(five_xx)
        row.detail = {"5xx_from_client_input": five_xx[:10], "5xx_without_connection_close": without_close,
                      "non_finite_output": {"status": nonfinite.status_code,
                                            "error": nonfinite.json().get("error", "")[:100]}}  # fmt: skip
    finally:
        server.stop()
    return row


# -- 5. connections ------------------------------------------------------------------------------------------


def _trickle(port: int, stop: threading.Event, closed: list[float]) -> None:
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"POST /no/such/route HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n\r\n")
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                sock.sendall(b"x")
                if sock.recv(65536) == b"":
                    break
            except TimeoutError:
                continue
            except OSError:
                break
    closed.append(time.monotonic() - start)


async def connections(repo: Path, cap: int = 50, body_timeout_s: float = 3.0) -> Row:
    server = Server(repo, {"LARA_MODELS": TEXT, "LARA_MAX_CONNECTIONS": str(cap),
                           "LARA_BODY_TIMEOUT_S": str(body_timeout_s)})  # fmt: skip
    row = Row(f"{cap} tricklers after a 404 vs max_connections={cap}; over-cap clients")
    stop, closed = threading.Event(), []
    threads = [threading.Thread(target=_trickle, args=(server.port, stop, closed)) for _ in range(cap)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(0.5)
        over_cap = await asyncio.to_thread(_over_cap, server.port, 20)
        freed_after = None
        start = time.monotonic()
        while time.monotonic() - start < body_timeout_s + 10:
            try:
                if httpx.get(f"{server.url}/v2/health/live", timeout=1).status_code == 200:
                    freed_after = time.monotonic() - start + 0.5
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        stop.set()
        for thread in threads:
            thread.join(10)
        row.faults_survived = sum(c <= body_timeout_s + 1.5 for c in closed) + over_cap["readable_503"]
        row.lost = over_cap["reset"] + sum(c > body_timeout_s + 1.5 for c in closed)
        row.detail = {"tricklers_closed_within_s": round(max(closed), 2) if closed else None,
                      "cap_free_again_after_s": round(freed_after, 2) if freed_after else None,
                      "over_cap": over_cap, "refused_metric": server.metric("lara_connections_refused_total")}  # fmt: skip
    finally:
        stop.set()
        server.stop()
    return row


def _over_cap(port: int, clients: int) -> dict[str, int]:
    readable, reset = 0, 0
    for _ in range(clients):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n")
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
            readable += answer.startswith(b"HTTP/1.1 503") and b"retry-after" in answer.lower()
        except OSError:
            reset += 1
    return {"clients": clients, "readable_503": readable, "reset": reset}
