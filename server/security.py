"""Who may use the server and which paths a request may reach.

- An API key, when set, is required on every request except the static page's assets: as
  `Authorization: Bearer KEY`, `X-API-Key`, the `run_agent_key` cookie, or once as `?key=` on the
  page's address (which sets the cookie and redirects to an address without it, so the key does
  not stay in the address bar or history). Keys are compared in constant time, never logged.
- A write (POST) must be same-origin and JSON, so another site cannot make a browser start or
  stop a task.
- Every path built from a request must resolve inside the runs root; anything else is a 404.
"""

from __future__ import annotations

import hmac
import ipaddress
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

COOKIE = "run_agent_key"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def keys_equal(given: str | None, key: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), key.encode())


def presented_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return (
        request.headers.get("x-api-key")
        or request.cookies.get(COOKIE)
        or request.query_params.get("key")
    )


class KeyMiddleware:
    """Requires the API key on every request but the static assets."""

    def __init__(self, app: ASGIApp, key: str | None) -> None:
        self.app = app
        self.key = key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.key or scope["path"].startswith("/static/"):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        given = presented_key(request)
        if not keys_equal(given, self.key):
            response: Response = JSONResponse(
                {"error": "missing or wrong API key: open the page as /?key=KEY, or send "
                 "Authorization: Bearer KEY"},
                status_code=401,
            )  # fmt: skip
        elif "key" in request.query_params and request.method == "GET":
            response = redirect_without_key(request.url)
            response.set_cookie(COOKIE, self.key, httponly=True, samesite="strict")
        else:
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)


def redirect_without_key(url: URL) -> RedirectResponse:
    return RedirectResponse(url.path + _query_without_key(url), status_code=303)


def _query_without_key(url: URL) -> str:
    pairs = [(k, v) for k, v in parse_qsl(url.query, keep_blank_values=True) if k != "key"]
    return f"?{urlencode(pairs)}" if pairs else ""


def cross_site_write(request: Request) -> str | None:
    """Why a write request must be refused as cross-site, or None if it may proceed."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return "cross-site request refused"
    origin = request.headers.get("origin")
    if origin is not None:
        host = request.headers.get("host", "")
        if urlsplit(origin).netloc != host:
            return f"request from origin {origin!r} refused"
    content_type = request.headers.get("content-type", "").split(";")[0].strip()
    if content_type != "application/json":
        return "send the request body as application/json"
    return None


def inside(root: Path, path: Path) -> Path | None:
    """`path` resolved, if it stays inside `root` (symlinks included); else None."""
    try:
        resolved = path.resolve()
        resolved.relative_to(root.resolve())
    except (OSError, ValueError):
        return None
    return resolved
