"""No route dependency runs in FastAPI's thread pool: a plain `def` dependency costs every request two
thread hand-offs before its route runs (each a wait for a core on a loaded machine), so they are coroutines."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fastapi.routing import APIRoute

from lara_serve.server.app import create_app
from lara_serve.server.settings import Settings


def _calls(dependant: Any) -> Iterator[Callable[..., Any]]:
    for sub in dependant.dependencies:
        if sub.call is not None:
            yield sub.call
        yield from _calls(sub)


def _dependencies(routes: list[Any]) -> Iterator[tuple[str, Callable[..., Any]]]:
    """Every dependency callable of every route, also of included routers (FastAPI 0.16x keeps those apart)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield from ((route.path, call) for call in _calls(route.dependant))
            yield from ((route.path, d.dependency) for d in route.dependencies if d.dependency is not None)
        router = getattr(route, "original_router", None)
        if router is not None:
            yield from ((repr(router.prefix or router.tags), d.dependency) for d in router.dependencies)
            yield from _dependencies(list(router.routes))


def test_every_route_dependency_is_a_coroutine(repo: Path) -> None:
    app = create_app(Settings(model_repository=repo, warmup=False))
    found = list(_dependencies(list(app.routes)))
    names = {getattr(call, "__name__", "") for _, call in found}
    assert {"get_state", "require_api_key", "require_metrics_key"} <= names  # the walk reaches them
    sync = sorted({f"{where}: {getattr(call, '__qualname__', call)}" for where, call in found
                   if not inspect.iscoroutinefunction(call)})  # fmt: skip
    assert sync == [], f"dependencies FastAPI would run in its thread pool: {sync}"


def test_every_endpoint_is_a_coroutine(repo: Path) -> None:
    """A plain `def` endpoint also runs in the thread pool; blocking work goes through asyncio.to_thread."""
    app = create_app(Settings(model_repository=repo, warmup=False))

    def endpoints(routes: list[Any]) -> Iterator[APIRoute]:
        for route in routes:
            if isinstance(route, APIRoute):
                yield route
            router = getattr(route, "original_router", None)
            if router is not None:
                yield from endpoints(list(router.routes))

    found = list(endpoints(list(app.routes)))
    assert len(found) > 20
    assert [r.path for r in found if not inspect.iscoroutinefunction(r.endpoint)] == []
