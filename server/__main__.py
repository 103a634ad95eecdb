"""`python -m lara_serve.server [--flag value ...]`: flags override LARA_* environment variables and defaults."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from lara_serve.server.log_format import configure_logging
from lara_serve.server.preflight import preflight
from lara_serve.server.settings import Settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lara-serve",  # the installed command; `python -m lara_serve.server` takes the same flags
        description="LARA Serve. Every flag also reads from the environment as LARA_<NAME>.",
    )
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        default = field.get_default(call_default_factory=True)
        help_text = f"{field.description} [env LARA_{name.upper()}; default: {default!r}]"
        help_text = help_text.replace("%", "%%")  # argparse %-formats help strings ("40% faster" broke --help)
        if field.annotation is bool:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=name, default=None, help=help_text, metavar=name.upper())
    return parser


def parse_settings(argv: Sequence[str] | None = None) -> Settings:
    args = build_parser().parse_args(argv)
    given: dict[str, Any] = {k: v for k, v in vars(args).items() if v is not None}
    return Settings(**given)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = parse_settings(argv)
    except ValidationError as exc:
        # Without input values: a rejected api_key must not reach the logs.
        errors = exc.errors(include_url=False, include_input=False, include_context=False)
        lines = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in errors)
        print(f"lara-serve: error: invalid settings: {lines}", file=sys.stderr)
        return 2
    # Before any model loads (uvicorn binds only after the lifespan): a busy port or a missing GPU is
    # one line now, not a traceback after a minute of loading.
    problem = preflight(settings) or _repository_problem(settings)
    if problem is not None:
        print(f"lara-serve: error: {problem}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)  # text or JSON lines, with request ids

    from lara_serve.server.app import create_app
    from lara_serve.server.serving import build_server

    app = create_app(settings)
    if settings.metrics_port:
        from prometheus_client import start_http_server

        # Its own thread and port, no key (Triton's --metrics-port); the app's /metrics stays as configured.
        start_http_server(settings.metrics_port, addr=settings.host, registry=app.state.lara.metrics.registry)
    guarded = _StartupFailure(app)
    try:
        build_server(guarded, app.state.lara).run()  # drains on SIGTERM/SIGINT (lara_serve.server.serving)
    except SystemExit:
        if guarded.error is None:
            raise
        # A model failed to load (strict_models) or none could: one line and exit 1, as documented.
        print(f"lara-serve: error: {' '.join(str(guarded.error).split())}", file=sys.stderr)
        return 1
    return 0


def _repository_problem(settings: Settings) -> str | None:
    """Unknown model names, an unreadable repository, unusable config.json or version folders: one line."""
    from lara_serve.server.repository import RepositoryError, check_repository

    try:
        check_repository(settings.model_repository, settings.models or None, settings.strict_models)
    except RepositoryError as exc:
        return " ".join(str(exc).split())
    return None


class _StartupFailure:
    """ASGI wrapper that keeps the lifespan's start-up exception and sends uvicorn no traceback to log
    (Starlette puts the whole traceback in `lifespan.startup.failed`); main prints it as one line."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.error: BaseException | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            return await self.app(scope, receive, send)

        async def short(message: Any) -> None:
            if message["type"] == "lifespan.startup.failed":
                message = {**message, "message": ""}
            await send(message)

        try:
            await self.app(scope, receive, short)
        except BaseException as exc:
            self.error = exc
            raise


if __name__ == "__main__":
    sys.exit(main())
