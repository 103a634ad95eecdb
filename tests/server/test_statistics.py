"""Triton statistics after a mixed workload: every count is kept and they add up (lara_serve.server.statistics)."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import httpx
import pytest
from server_helpers import IMAGE, MAX_LENGTH, TEXT, png_bytes, serve

from lara_serve.server import Settings

pytestmark = pytest.mark.anyio


async def _stats(client: httpx.AsyncClient, name: str) -> dict:
    response = await client.get(f"/v2/models/{name}/stats")
    assert response.status_code == 200
    (stats,) = response.json()["model_stats"]
    return stats


def _check_sums(stats: dict) -> None:
    inference = stats["inference_stats"]
    assert inference["success"]["count"] == inference["queue"]["count"] == inference["compute_infer"]["count"]
    assert stats["execution_count"] == sum(b["compute_infer"]["count"] for b in stats["batch_stats"])
    assert stats["inference_count"] == sum(b["batch_size"] * b["compute_infer"]["count"] for b in stats["batch_stats"])


async def test_statistics_add_up_after_a_mixed_workload(make_settings: Callable[..., Settings]) -> None:
    started_ms = int(time.time() * 1000)
    # A long queue delay so concurrent requests share batches: batch_stats gets sizes above 1.
    async with serve(make_settings(max_queue_delay_ms=50.0, max_batch_size=8)) as client:
        before = await _stats(client, TEXT)
        assert before["last_inference"] == 0 or before["last_inference"] <= started_ms + 60_000

        async def one_text(i: int) -> None:
            r = await client.post(f"/v1/models/{TEXT}:predict", json={"instances": [f"text number {i}"]})
            assert r.status_code == 200

        async with anyio.create_task_group() as group:
            for i in range(6):
                group.start_soon(one_text, i)
        two = await client.post(f"/v1/models/{TEXT}:predict", json={"instances": ["a", "b"]})
        assert two.status_code == 200
        too_long = await client.post(f"/v1/models/{TEXT}:predict", json={"instances": ["x" * (MAX_LENGTH + 1)]})
        assert too_long.status_code == 413
        bad_image = await client.post(f"/v1/models/{IMAGE}:predict", json={"instances": [{"b64": "bm90IGFuIGltYWdl"}]})
        assert bad_image.status_code == 422
        image = await client.post(
            f"/v1/models/{IMAGE}:classify", content=png_bytes(), headers={"content-type": "image/png"}
        )
        assert image.status_code == 200

        text = await _stats(client, TEXT)
        success, fail = text["inference_stats"]["success"], text["inference_stats"]["fail"]
        assert (success["count"], fail["count"]) == (7, 1)
        assert text["inference_count"] == 8  # six single texts and one pair, each computed once
        assert max(b["batch_size"] for b in text["batch_stats"]) > 1  # the concurrent ones were batched
        assert text["execution_count"] < text["inference_count"]
        assert text["last_inference"] >= started_ms
        assert text["inference_stats"]["queue"]["ns"] > 0 and text["inference_stats"]["compute_infer"]["ns"] > 0
        _check_sums(text)

        image_stats = await _stats(client, IMAGE)
        assert (
            image_stats["inference_stats"]["success"]["count"],
            image_stats["inference_stats"]["fail"]["count"],
        ) == (1, 1)
        _check_sums(image_stats)
