"""The page's own files (server/static/): each read straight from the folder and sent with its type.

The page is some twenty small ES modules, all asked for as it opens. Starlette's StaticFiles hands
every stat, open and read of a file to a worker thread, which made each module cost about four
times an API answer and the page's first paint slower than the one script it replaced. These files
are a few KB each and in the page cache: a read in the event loop takes microseconds. The type is
fixed here, not guessed from the system's table, since a browser runs a module only when it is
served as JavaScript.
"""

from __future__ import annotations

from pathlib import Path

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

STATIC = Path(__file__).with_name("static")
TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".svg": "image/svg+xml",
}


async def asset(request: Request) -> Response:
    """GET /static/NAME: the file, or 304 when the browser's copy is current (by its ETag)."""
    return page_file(request.path_params["name"], request)


def page_file(name: str, request: Request) -> Response:
    """The file NAME of static/ as an answer to `request` (the page itself is one too)."""
    path = STATIC / name
    kind = TYPES.get(path.suffix)
    if kind is None or name.startswith(".") or not path.is_file():
        raise HTTPException(404, f"no file {name!r}")
    stat = path.stat()
    etag = f'"{stat.st_mtime_ns:x}-{stat.st_size:x}"'
    headers = {"ETag": etag, "Cache-Control": "no-cache"}  # revalidated on each load: never stale
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    return Response(path.read_bytes(), media_type=kind, headers=headers)
