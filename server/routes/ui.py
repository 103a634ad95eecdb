"""GET /ui: a page to try the served models (static HTML/JS/CSS from server/ui/, no CDN, no build step).

The page itself is public like /docs; the API calls it makes carry the API key the user types in.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse

from lara_serve.server.errors import not_found

UI_DIR = Path(__file__).resolve().parent.parent / "ui"
_FILES = {"app.js": "text/javascript", "style.css": "text/css", "index.html": "text/html"}
# Everything comes from this server: a page that tried to load a CDN would break offline.
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' blob: data:; style-src 'self'; script-src 'self'",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


@router.get("/ui")
async def page() -> FileResponse:
    return FileResponse(UI_DIR / "index.html", media_type="text/html", headers=_HEADERS)


@router.get("/ui/")
async def page_slash() -> RedirectResponse:
    return RedirectResponse("/ui")


@router.get("/ui/{filename}")
async def asset(filename: str) -> FileResponse:
    media_type = _FILES.get(filename)
    if media_type is None:  # a fixed list: no path from the URL reaches the file system
        raise not_found(f"no file {filename!r} under /ui")
    return FileResponse(UI_DIR / filename, media_type=media_type, headers=_HEADERS)
