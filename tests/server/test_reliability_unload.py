"""Unload and reload while batches run (issue 36, item 3): every accepted request is answered, never hung;
stopping does not block the event loop; a failed reload leaves the old instance serving and reported so."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path

import pytest
from server_helpers import serve

from lara_serve.server import Settings
from lara_serve.server.batcher import Batcher, BatchPolicy
from lara_serve.server.errors import ErrorKind, ServeError
from lara_serve.server.synthetic import make_text_model

pytestmark = pytest.mark.anyio
MODEL = "busy-text"


class HeldBackend:
    """Each batch waits for `gate` (at most `hold_s`); payloads come back as results."""

    def __init__(self, hold_s: float = 5.0) -> None:
        self.gate, self.started, self.hold_s = threading.Event(), threading.Event(), hold_s

    def __call__(self, payloads: list[int]) -> list[int]:
        self.started.set()
        self.gate.wait(self.hold_s)
        return payloads


async def max_loop_gap(stop: asyncio.Event) -> float:
    """The longest the event loop went without running this task (a blocked loop shows here)."""
    gap, last = 0.0, time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.005)
        now = time.perf_counter()
        gap, last = max(gap, now - last), now
    return gap


async def test_stop_answers_the_running_batch_and_fails_the_queue_without_blocking_the_loop() -> None:
    backend = HeldBackend()
    batcher: Batcher[int, int] = Batcher("m", backend, BatchPolicy(max_batch_size=1, max_queue_delay_s=0.0))
    batcher.start()
    running = batcher.submit([(1, 1)])[0]
    await asyncio.to_thread(backend.started.wait, 5)
    queued = batcher.submit([(2, 1)])[0]
    done = asyncio.Event()
    ticker = asyncio.create_task(max_loop_gap(done))
    stopper = asyncio.create_task(batcher.stop(grace_s=10.0))
    await asyncio.sleep(0.3)  # stop waits for the running batch, with the loop free
    assert not stopper.done()
    with pytest.raises(ServeError) as info:
        batcher.submit([(3, 1)])  # no new work once stopping
    assert info.value.kind is ErrorKind.NOT_READY and "stopped" in info.value.message
    backend.gate.set()
    await asyncio.wait_for(stopper, 5)
    done.set()
    assert (await running).value == 1
    with pytest.raises(ServeError) as queued_error:
        await queued
    assert queued_error.value.kind is ErrorKind.NOT_READY
    assert await ticker < 0.2


async def test_stop_past_its_grace_answers_the_running_batch_503() -> None:
    backend = HeldBackend(hold_s=2.0)
    batcher: Batcher[int, int] = Batcher("m", backend, BatchPolicy(max_batch_size=2, max_queue_delay_s=0.0))
    batcher.start()
    futures = batcher.submit([(1, 1), (2, 1)])
    await asyncio.to_thread(backend.started.wait, 5)
    t0 = time.perf_counter()
    await asyncio.wait_for(batcher.stop(grace_s=0.2), 5)
    assert time.perf_counter() - t0 < 1.5  # did not wait for the stuck thread
    assert batcher.busy  # the thread still computes; its owner must not close the backend under it
    for future in futures:
        with pytest.raises(ServeError) as info:
            await asyncio.wait_for(future, 1)
        assert info.value.kind is ErrorKind.NOT_READY and "while computing" in info.value.message
    backend.gate.set()


@pytest.fixture(scope="module")
def busy_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("busy_repository")
    make_text_model(root, MODEL, max_length=8192, dim=32, hidden=256)  # a few ms per long text
    return root


def busy_settings(repo: Path) -> Settings:
    return Settings(model_repository=repo, model_control="explicit", warmup=False, num_threads=1,
                    max_batch_size=4, graceful_timeout_s=2.0, request_timeout_s=10.0)  # fmt: skip


async def test_unload_reload_cycles_under_load_leave_no_request_hung(busy_repo: Path) -> None:
    cycles, per_client = 20, 12
    async with serve(busy_settings(busy_repo)) as client:
        url = f"/v1/models/{MODEL}:classify"
        stop = asyncio.Event()

        async def load_client(seed: int) -> list[int]:
            statuses = []
            for i in range(per_client):
                body = bytes([97 + (seed + i) % 26]) * 4096
                response = await asyncio.wait_for(client.post(url, content=body), 20)  # hung -> TimeoutError
                statuses.append(response.status_code)
                await asyncio.sleep(0.01)
            return statuses

        async def control() -> None:
            for cycle in range(cycles):
                await asyncio.sleep(0.02)
                action = "unload" if cycle % 2 == 0 else "load"
                answer = await asyncio.wait_for(client.post(f"/v2/repository/models/{MODEL}/{action}"), 20)
                assert answer.status_code == 200, answer.text
            await client.post(f"/v2/repository/models/{MODEL}/load")  # end loaded
            stop.set()

        ticker = asyncio.create_task(max_loop_gap(stop))
        results = await asyncio.gather(control(), *(load_client(s) for s in range(4)))
        statuses = [s for r in results[1:] for s in r]
        assert len(statuses) == 4 * per_client  # every request answered
        assert set(statuses) <= {200, 503}, statuses  # a result, or "not available, retry"
        assert statuses.count(200) > 0
        assert (await client.post(url, content=b"after")).status_code == 200
        # Loading parses files in a thread, and the GIL is shared: the loop must not stall for long.
        assert await ticker < 1.0


async def test_failed_reload_keeps_the_old_instance_serving_and_reported_ready(busy_repo: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(busy_repo, repo)
    async with serve(busy_settings(repo)) as client:
        onnx = repo / MODEL / "1" / "model.onnx"
        good = onnx.read_bytes()
        onnx.write_bytes(b"not an onnx file")
        failed = await client.post(f"/v2/repository/models/{MODEL}/load")
        assert failed.status_code == 422 and "keeps serving" in failed.json()["error"]
        assert str(repo) not in failed.text  # no absolute paths in error bodies
        assert (await client.get("/v2/health/ready")).status_code == 200
        assert (await client.get(f"/v2/models/{MODEL}/ready")).status_code == 200
        info = (await client.get("/info")).json()
        assert info["unavailable"] == {} and [m["name"] for m in info["models"]] == [MODEL]
        metrics = (await client.get("/metrics")).text
        assert f'lara_model_ready{{model="{MODEL}"}} 1.0' in metrics
        assert f'lara_model_load_failures_total{{model="{MODEL}"}} 1.0' in metrics
        assert (await client.post(f"/v1/models/{MODEL}:classify", content=b"still here")).status_code == 200
        onnx.write_bytes(good)
        assert (await client.post(f"/v2/repository/models/{MODEL}/load")).status_code == 200
