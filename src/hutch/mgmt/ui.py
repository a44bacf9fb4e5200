"""The management web UI: static files on the management port, `/` and `/ui/{file}`.

Owns: `add_routes(app)`, which serves `index.html` at `/` and the files beside it (`app.js`,
`app.css`, the other ES modules) at `/ui/{file}`, from the package data directory
`hutch/mgmt/ui/` (docs/web-ui.md).

Rules:
- The UI is a plain client of the HTTP API on the same origin (HTTP basic auth, JSON): no server-side
  state, no templating, no build step. Serving it needs no authentication, as in RabbitMQ; every API
  call the page makes is authenticated.
- Only the regular files found in the directory when the app is built are served, by exact name
  (one path segment, no traversal); anything else is the API's JSON 404.
- Cache: every reply carries a strong ETag and `Cache-Control: no-cache`, so a browser revalidates
  (a 304 costs a few bytes) and an upgraded node's files are picked up at the next load.
- A strict Content-Security-Policy: scripts, styles and API calls from this origin only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

UI_PACKAGE = "hutch.mgmt"
UI_DIRECTORY = "ui"
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".json": "application/json",
    ".txt": "text/plain; charset=utf-8",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; form-action 'none'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


@dataclass(frozen=True)
class StaticFile:
    body: bytes
    content_type: str
    etag: str  # quoted, as sent


def _content_type(name: str) -> str:
    dot = name.rfind(".")
    return CONTENT_TYPES.get(name[dot:].lower() if dot >= 0 else "", "application/octet-stream")


def load_files(directory: Traversable | None = None) -> dict[str, StaticFile]:
    """Every regular file of the UI directory, by name (read once: the files are small)."""
    root = directory if directory is not None else resources.files(UI_PACKAGE).joinpath(UI_DIRECTORY)
    files: dict[str, StaticFile] = {}
    if not root.is_dir():
        return files
    for entry in root.iterdir():
        if not entry.is_file() or entry.name.startswith("."):
            continue
        body = entry.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
        files[entry.name] = StaticFile(body, _content_type(entry.name), etag)
    return files


def _reply(request: web.Request, f: StaticFile) -> web.Response:
    headers = {"Cache-Control": "no-cache", "ETag": f.etag, **SECURITY_HEADERS}
    if f.etag in {tag.strip() for tag in request.headers.get("If-None-Match", "").split(",")}:
        return web.Response(status=304, headers=headers)
    return web.Response(body=f.body, headers={**headers, "Content-Type": f.content_type})


def add_routes(app: web.Application, directory: Traversable | None = None) -> None:
    """Serve the UI on `app`: GET (and HEAD) `/` and `/ui/{file}`."""
    files = load_files(directory)

    async def index(request: web.Request) -> web.StreamResponse:
        f = files.get("index.html")
        if f is None:
            raise web.HTTPNotFound()
        return _reply(request, f)

    async def static(request: web.Request) -> web.StreamResponse:
        f = files.get(request.match_info["file"])
        if f is None:
            raise web.HTTPNotFound()
        return _reply(request, f)

    app.router.add_get("/", index)
    app.router.add_get("/ui/{file}", static)


__all__ = ["CONTENT_TYPES", "StaticFile", "add_routes", "load_files"]
