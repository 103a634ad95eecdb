"""LARA Serve on Ray Serve. `ray` is imported only inside the builders, so this module imports (and is
tested) without it; install `ray[serve]` in a separate environment (about 500 MB) to run it.

Two applications:

* `ingress_app`: the project's whole FastAPI app (v1 + v2 routes, health, /metrics, its own dynamic
  batcher with token budget and length buckets) as a Ray Serve ingress deployment. The app is built on
  each replica (a builder function, so nothing with locks or threads is pickled) and Ray runs its lifespan,
  which loads and warms up the models. Ray adds replicas and placement; everything else is unchanged.
* `batched_app`: one model behind `@serve.batch`, with the batch bounded by a token budget through
  `batch_size_fn` (padded tokens = longest item x items, as in server/batcher.py) and by an item count.
  `POST /` takes a raw UTF-8 text or encoded image body (like the server's `:classify`); other deployments
  can call `handle.classify.remote(data)`.

Run locally (from the repository root, in a venv with the server's dependencies and `ray[serve]`):

    RAY_USAGE_STATS_ENABLED=0 python -m deploy.ray.serve_app ingress model_repository=model_repository
    RAY_USAGE_STATS_ENABLED=0 python -m deploy.ray.serve_app batched model=tiny-text max_batch_tokens=8192

or on a running Ray cluster: `serve run deploy.ray.serve_app:ingress_app key=value ...`. Keys are LARA
settings (server/settings.py field names) plus the Ray options `num_replicas` and `num_cpus` (per replica;
also the backend's thread count unless `num_threads` is given) and, for `batched_app`, `model`.

Checked with ray[serve] 2.60.0 on one machine: both apps answer health, v2 infer and concurrent requests
(batched), and return errors as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
RAY_KEYS = {"num_replicas", "num_cpus", "model"}


def split_args(args: dict[str, str] | None) -> tuple[dict[str, str], dict[str, str]]:
    """`serve run` key=value args -> (LARA settings overrides, Ray options); unknown keys are refused."""
    from lara_serve.server.settings import Settings

    settings, ray_options = {}, {}
    for key, value in (args or {}).items():
        if key in RAY_KEYS:
            ray_options[key] = value
        elif key in Settings.model_fields:
            settings[key] = value
        else:
            known = sorted(RAY_KEYS | set(Settings.model_fields))
            raise ValueError(f"unknown argument {key!r}; expected one of {known}")
    num_cpus = ray_options.get("num_cpus", "1")
    settings.setdefault("num_threads", str(max(1, int(float(num_cpus)))))
    return settings, ray_options


def _deployment_options(ray_options: dict[str, str], max_ongoing_requests: int) -> dict[str, Any]:
    # max_ongoing_requests: Ray's default (5) would cap a replica's batches at 5 requests.
    # PYTHONPATH: replicas on this machine import server/ from the checkout. On a multi-node cluster use a
    # runtime_env working_dir or an image that contains the code instead.
    return {
        "num_replicas": int(ray_options.get("num_replicas", "1")),
        "max_ongoing_requests": max_ongoing_requests,
        "ray_actor_options": {
            "num_cpus": float(ray_options.get("num_cpus", "1")),
            "runtime_env": {"env_vars": {"PYTHONPATH": str(REPO_ROOT)}},
        },
    }


def _serve() -> Any:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Set before Ray is imported: how long ray.init waits for the raylet to register with GCS. A busy machine
    # (CI on 2 cores) needs more than the default, or ray.init fails with "node timed out during startup".
    os.environ.setdefault("RAY_raylet_start_wait_time_s", "120")
    try:
        from ray import serve
    except ImportError as exc:
        raise SystemExit("ray[serve] is not installed here; use a separate venv: pip install 'ray[serve]'") from exc
    return serve


def ingress_app(args: dict[str, str] | None = None) -> Any:
    """The full LARA Serve FastAPI app as one Ray Serve deployment."""
    serve = _serve()
    overrides, ray_options = split_args(args)
    if "model" in ray_options:
        raise ValueError("ingress_app serves every model of the repository; restrict them with models=a,b")

    def build_app() -> Any:  # runs on each replica
        from lara_serve.server.app import create_app
        from lara_serve.server.settings import Settings

        return create_app(Settings(**overrides))

    # Requests past max_ongoing_requests wait in Ray's router; the app's own queue (max_queue_size) still applies.
    options = _deployment_options(ray_options, max_ongoing_requests=256)
    deployment = serve.deployment(serve.ingress(build_app)(), name="lara-serve", **options)
    return deployment.bind()


def padded_tokens(items: list[Any], budget: int, max_items: int) -> int:
    """`batch_size_fn` for `@serve.batch(max_batch_size=budget)`: padded tokens of the batch, counted so that
    it also exceeds the budget past `max_items` items. A lone item over the budget counts as the budget, so
    it still runs (alone), as in server/batcher.py; Ray would otherwise fail it."""
    n = len(items)
    if n == 0:
        return 0
    size = max(max(item.length for item in items) * n, -(-n * budget // max_items))
    return min(size, budget) if n == 1 else size


def batched_app(args: dict[str, str] | None = None) -> Any:
    """One model behind `@serve.batch` with a token budget."""
    serve = _serve()
    overrides, ray_options = split_args(args)
    model_name = ray_options.get("model")
    if not model_name:
        raise ValueError("batched_app needs model=<name> (a folder of the model repository)")

    from lara_serve.server.settings import Settings

    settings = Settings(**overrides)  # validated here, in the driver, before anything is deployed
    budget, max_items = settings.max_batch_tokens, settings.max_batch_size

    options = _deployment_options(ray_options, max_ongoing_requests=settings.max_queue_size)

    @serve.deployment(name=f"lara-{model_name}", **options)
    class LaraBatched:
        def __init__(self) -> None:
            from lara_serve.server.models import load_models

            self.settings = settings.model_copy(update={"models": [model_name]})
            (self.model,) = load_models(self.settings).values()  # loads, checks and warms up

        # max_batch_size is in padded tokens here, so Ray's warning that it exceeds max_ongoing_requests
        # (a request count) does not apply.
        @serve.batch(
            max_batch_size=budget,
            batch_wait_timeout_s=settings.max_queue_delay_ms / 1000.0,
            batch_size_fn=lambda items: padded_tokens(items, budget, max_items),
        )
        async def _classify(self, items: list[Any]) -> list[Any]:
            return await asyncio.to_thread(self._run, items)

        def _run(self, items: list[Any]) -> list[Any]:
            from lara_serve.server.preprocess import collate, softmax

            logits = self.model.backend.run(collate(items, self.model.config))
            return list(softmax(logits))

        async def classify(self, data: bytes, truncate: bool = False) -> dict[str, Any]:
            # The server takes a truncation side (None: refuse long texts); `head` keeps the start.
            side = "head" if truncate else None
            item = self.model.item_from_bytes(data, side, self.settings.max_image_pixels)
            probabilities = await self._classify(item)
            labels = self.model.config.labels
            best = int(probabilities.argmax())
            return {
                "model": self.model.name,
                "label": labels[best],
                "scores": {label: float(p) for label, p in zip(labels, probabilities, strict=True)},
            }

        async def __call__(self, request: Any) -> Any:
            from starlette.responses import JSONResponse

            from lara_serve.server.errors import HTTP_STATUS, ServeError

            truncate = request.query_params.get("truncate", "false").lower() in {"1", "true", "yes"}
            try:
                return JSONResponse(await self.classify(await request.body(), truncate))
            except ServeError as exc:
                return JSONResponse({"error": exc.message}, status_code=HTTP_STATUS[exc.kind])

    return LaraBatched.bind()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run LARA Serve on a local Ray Serve instance (127.0.0.1).")
    parser.add_argument("app", choices=["ingress", "batched"])
    parser.add_argument("args", nargs="*", metavar="KEY=VALUE", help="LARA settings and Ray options")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--num-cpus", type=int, default=os.cpu_count() or 1, help="CPUs Ray may use")
    parser.add_argument("--temp-dir", default=None, help="Ray's session folder (default /tmp/ray)")
    opts = parser.parse_args(argv)
    args = dict(kv.split("=", 1) for kv in opts.args)
    builder = ingress_app if opts.app == "ingress" else batched_app
    application = builder(args)  # checks the arguments before Ray starts

    import ray

    serve = _serve()
    # Binds what Ray lets us bind to loopback: the node's address and the HTTP proxy. GCS and the raylet
    # still listen on every interface (ray 2.60), so do not run this on a host with untrusted neighbours.
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=opts.num_cpus, _temp_dir=opts.temp_dir)
    # SIGTERM and SIGINT both stop the app, then the local Ray instance this driver started. Installed after
    # ray.init, whose core worker sets a SIGTERM handler that aborts the process (exit -6). A shell starts
    # background jobs with SIGINT ignored; this handler takes SIGINT back.
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": opts.port})
        serve.run(application, name="lara", route_prefix="/", blocking=False)  # returns once every replica runs
        replicas = int(args.get("num_replicas", "1"))
        print(f"ready: http://127.0.0.1:{opts.port} ({opts.app}, {replicas} replica(s))", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
