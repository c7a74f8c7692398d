"""Who may use the server and which paths a request may reach.

- Every request (reads, writes and streams alike) must name, in its Host header, a host the
  server is meant to be reached by: loopback names and addresses, the address it listens on, and
  the names configured in `server.allowed_hosts`. A page on another site whose name resolves to
  127.0.0.1 (DNS rebinding) sends its own name, and gets a 421.
- An API key, when set, is required on every request except the static page's assets: as
  `Authorization: Bearer KEY`, `X-API-Key`, the `run_agent_key` cookie, or once as `?key=` on the
  page's own address, `GET /` (which sets the cookie and redirects to an address without it, so
  the key does not stay in the address bar or history). A key in any other URL is refused: URLs
  end up in logs and histories. Keys are compared in constant time, never logged.
- A write (POST) must be same-origin and JSON, so another site cannot make a browser start or
  stop a task.
- Every path built from a request must resolve inside the runs root (`runfolder.within`, the one
  confinement rule); anything else is a 404.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit

from starlette.datastructures import URL, Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

COOKIE = "run_agent_key"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_ADDRESSES = frozenset({"0.0.0.0", "::", ""})


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(bind: str, configured: Iterable[str] = ()) -> frozenset[str]:
    """The host names a server listening on `bind` answers to: loopback, the bind address (and,
    on a wildcard address, this machine's own names), and the configured ones."""
    names = set(LOOPBACK_NAMES) | {normal_host(h) for h in configured}
    if bind in WILDCARD_ADDRESSES:
        names |= {normal_host(socket.gethostname()), normal_host(socket.getfqdn())}
    else:
        names.add(normal_host(bind))
    return frozenset(n for n in names if n)


def normal_host(name: str) -> str:
    """A host name as compared: lower case, no brackets, no trailing dot."""
    return name.strip().strip("[]").rstrip(".").lower()


def host_of(header: str) -> str:
    """The host part of a Host header (`name`, `name:port`, `[v6]:port`)."""
    header = header.strip()
    if header.startswith("["):
        return normal_host(header[: header.find("]") + 1])
    return normal_host(header.rpartition(":")[0] if header.count(":") == 1 else header)


class HostMiddleware:
    """Answers only requests whose Host header names an allowed host (DNS rebinding)."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or "*" in self.allowed:
            await self.app(scope, receive, send)
            return
        header = Headers(scope=scope).get("host", "")
        host = host_of(header)
        if host in self.allowed or (_is_ip(host) and is_loopback(host)):
            await self.app(scope, receive, send)
            return
        shown = header[:100]
        response = JSONResponse(
            {"error": f"host {shown!r} is not one this server answers to; if you reach it by "
             "that name, add it to server.allowed_hosts in config.yaml"},
            status_code=421,
        )  # fmt: skip
        await response(scope, receive, send)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def keys_equal(given: str | None, key: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), key.encode())


def presented_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    given = request.headers.get("x-api-key") or request.cookies.get(COOKIE)
    if given is None and opens_the_page(request):
        given = request.query_params.get("key")
    return given


def opens_the_page(request: Request) -> bool:
    """`GET /`: the one address where the key may be given as `?key=`."""
    return request.method == "GET" and request.url.path == "/"


class KeyMiddleware:
    """Requires the API key on every request but the static assets (and the paths made
    public, `open_paths`: `/metrics` under `metrics.public`)."""

    def __init__(self, app: ASGIApp, key: str | None, open_paths: frozenset[str] = frozenset()):
        self.app = app
        self.key = key
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not self.key or path.startswith("/static/"):
            await self.app(scope, receive, send)
            return
        if path in self.open_paths:
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        given = presented_key(request)
        if not keys_equal(given, self.key):
            response: Response = JSONResponse(
                {"error": "missing or wrong API key: send Authorization: Bearer KEY (a key in "
                 "the address is taken only when opening the page, as /?key=KEY)"},
                status_code=401,
            )  # fmt: skip
        elif "key" in request.query_params and opens_the_page(request):
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


async def bounded_body(request: Request, limit: int) -> bytes:
    """A request's body, read no further than `limit` bytes (413 past it)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, f"the body is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
