"""/docs (Swagger UI) and /redoc from assets served by the server itself: they work with no internet.

FastAPI's own pages load their JavaScript from a CDN, so in a machine or container without internet they
stay blank. The assets come from the PyPI package fastapi-offline (it bundles swagger-ui and redoc);
the routes are public, like FastAPI's (the schema holds no secret; the API key still guards the API).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC_URL = "/docs-static"
# The pages may load nothing from outside this server: ReDoc's sidebar would otherwise fetch its vendor's
# logo from a CDN (it hides the image when that fails). Inline script and style are the pages' own.
_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; worker-src 'self' blob:; connect-src 'self'; font-src 'self' data:"
)


def _page(response: HTMLResponse) -> HTMLResponse:
    response.headers["Content-Security-Policy"] = _CSP
    return response


def _asset_dir() -> Path | None:
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent / "static"
    return folder if (folder / "swagger-ui-bundle.js").is_file() else None


def install(app: FastAPI) -> None:
    """Add /docs, /docs/oauth2-redirect, /redoc and their assets. Create the app with docs_url=None, redoc_url=None."""
    assets = _asset_dir()
    title = f"{app.title} - API"

    if assets is not None:
        app.mount(STATIC_URL, StaticFiles(directory=assets), name="docs-static")

    def missing() -> HTMLResponse:
        # The server still serves; only the pages are missing (an install without the package).
        return HTMLResponse(
            "<h1>API docs unavailable</h1><p>The package fastapi-offline is not installed "
            "(<code>pip install fastapi-offline</code>). The schema is at <a href='/openapi.json'>/openapi.json</a>.</p>",
            status_code=503,
        )

    def page(render: Callable[..., HTMLResponse], **urls: str | bool) -> HTMLResponse:
        """One renderer's page of this app's schema, or the 503 above when the assets are missing."""
        if assets is None:
            return missing()
        return _page(render(openapi_url=app.openapi_url or "/openapi.json", title=title, **urls))

    @app.get("/docs", include_in_schema=False)
    async def swagger() -> HTMLResponse:
        return page(
            get_swagger_ui_html,
            oauth2_redirect_url="/docs/oauth2-redirect",
            swagger_js_url=f"{STATIC_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{STATIC_URL}/swagger-ui.css",
            swagger_favicon_url=f"{STATIC_URL}/favicon.png",
        )

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def swagger_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return page(
            get_redoc_html,
            redoc_js_url=f"{STATIC_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{STATIC_URL}/favicon.png",
            with_google_fonts=False,  # a font from the internet would be the one thing that does not load
        )
