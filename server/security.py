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
- Every path built from a request must resolve inside the runs root, and whatever lies under a
  project inside that project (`runfolder.fence`, the one confinement rule, checked on the
  descriptor a file is read through); anything else is a 404.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
import socket
import threading
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import URL, Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from runagent.config.userfile import describe_size
from runagent.errors import ForbiddenError
from runagent.store import tokens

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
    if request.headers.get("x-api-key"):
        return request.headers["x-api-key"]
    if opens_the_page(request) and "key" in request.query_params:
        return request.query_params["key"]  # the one just given, over a cookie gone stale
    return request.cookies.get(COOKIE)


def opens_the_page(request: Request) -> bool:
    """`GET /`: the one address where the key may be given as `?key=`."""
    return request.method == "GET" and request.url.path == "/"


class KeyMiddleware:
    """Requires a credential on every request but the static assets (and the paths made
    public, `open_paths`: `/metrics` under `metrics.public`), once the server has a key or any
    token: the api_key (everything), or a scoped token (runagent/store/tokens.py) whose scope
    and projects the route must be within. A request's grant is left in `scope["state"]` for
    the handlers that list (they show only its projects)."""

    def __init__(
        self, app: ASGIApp, key: str | None, root: Path | None = None,
        open_paths: frozenset[str] = frozenset(),
    ) -> None:  # fmt: skip
        self.app = app
        self.key = key
        self.root = root
        self.open_paths = open_paths
        self.tokens = TokenFile(root) if root is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path.startswith("/static/") or path in self.open_paths:
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        given = presented_key(request)
        try:
            grant = await self._grant_now(given)
        except tokens.TokenFileError as exc:  # an unreadable token file lets in the api_key alone
            said = (f"the server's token file cannot be read: {exc.why}; until it is fixed, "
                    "only the api_key gets in")  # fmt: skip
            await JSONResponse({"error": said}, status_code=503)(scope, receive, send)
            return
        if grant is None:
            response: Response = JSONResponse(
                {"error": "missing, wrong, expired or revoked API key or token: send "
                 "Authorization: Bearer KEY (a key in the address is taken only when opening "
                 "the page, as /?key=KEY)"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )  # fmt: skip
            if wants_a_page(request):
                response = key_page(refused=given is not None)
            await response(scope, receive, send)
            return
        refusal = refused(grant, scope.get("method", "GET"), path)
        if refusal is not None:
            await JSONResponse({"error": refusal}, status_code=403)(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state["grant"] = grant
        if grant.token_id:  # a stream it opens ends when the token is revoked or expires
            state["still_valid"] = lambda: self._still(given)
        if given is not None and "key" in request.query_params and opens_the_page(request):
            response = redirect_without_key(request.url)
            response.set_cookie(COOKIE, given, httponly=True, samesite="strict")
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _grant_now(self, given: str | None) -> tokens.Grant | None:
        """`_grant` of `given`, the token file read (when it changed) in a worker thread: a
        large or slow file never holds up the event loop, which serves every other client."""
        if self._is_key(given) or self.tokens is None:
            return self._grant(given, None)
        records = self.tokens.cached()
        if isinstance(records, _Stale):
            records = await run_in_threadpool(self.tokens.read)
        return self._grant(given, records)

    def _still(self, given: str | None) -> bool:
        """Whether the token `given` is still good (a stream opened with it goes on); called
        in a worker thread."""
        try:
            records = self.tokens.read() if self.tokens is not None else None
            return self._grant(given, records) is not None
        except tokens.TokenFileError:
            return False

    def _is_key(self, given: str | None) -> bool:
        return given is not None and bool(self.key) and keys_equal(given, self.key or "")

    def _grant(
        self, given: str | None, records: list[tokens.TokenRecord] | None
    ) -> tokens.Grant | None:
        """What the credential `given` may do: everything for the api_key (or on a server
        with neither a key nor a token), a token's grant among `records` (None: there is no
        token file), or None (a 401)."""
        if self._is_key(given):
            return tokens.ADMIN
        if records is None:  # no token was ever made: the key, or open as before without one
            return None if self.key else tokens.ADMIN
        return tokens.verify(records, given or "", datetime.now(UTC))


class _Stale:
    """The token file changed since it was read: it must be read again."""


STALE = _Stale()


class TokenFile:
    """The token file's records, read again only when its (inode, size, modification time)
    changed, a file that cannot be read remembered as such until it changes too: a request
    costs a stat, and a bad file is read (at most tokens.FILE_CAP bytes) once, not per
    request."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()  # one reader at a time; the others then find it read
        self._stamp: tuple[int, int, int] | None = None
        self._records: list[tokens.TokenRecord] | None = None
        self._error: tokens.TokenFileError | None = None

    def _now(self) -> tuple[int, int, int] | None:
        """The file's stamp; None when there is none (TokenFileError if it cannot be looked
        at)."""
        try:
            info = tokens.path(self.root).stat()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise tokens.TokenFileError(tokens.path(self.root), str(exc.strerror)) from None
        return info.st_ino, info.st_size, info.st_mtime_ns

    def cached(self) -> list[tokens.TokenRecord] | _Stale | None:
        """The records as last read if the file has not changed since (None: no file),
        else STALE; a stat, cheap enough for the event loop."""
        stamp = self._now()
        if stamp is None:
            return None
        if stamp != self._stamp:
            return STALE
        return self._result()

    def read(self) -> list[tokens.TokenRecord] | None:
        """The records, read again if the file changed (blocking: call it in a thread)."""
        with self._lock:
            stamp = self._now()
            if stamp is None:
                return None
            if stamp != self._stamp:
                try:
                    self._records, self._error = tokens.read(self.root), None
                except tokens.TokenFileError as exc:
                    self._records, self._error = None, exc
                self._stamp = stamp
            return self._result()

    def _result(self) -> list[tokens.TokenRecord] | None:
        if self._error is not None:
            raise tokens.TokenFileError(tokens.path(self.root), self._error.why)
        return self._records or []


PROJECT_PATH = re.compile(r"^/api/projects/([^/]+)")
NEEDS = {"GET": tokens.Scope.READ, "HEAD": tokens.Scope.READ, "DELETE": tokens.Scope.ADMIN}
ADMIN_PATHS = frozenset({"/api/gc"})  # writes that remove, as a DELETE does
MCP_PATH = "/mcp"


def refused(grant: tokens.Grant, method: str, path: str) -> str | None:
    """Why `grant` may not `method` `path` (a 403), or None if it may: reads need `read`,
    deletes and gc `admin`, every other write `operate`; a token limited to projects reaches
    only theirs."""
    needs = NEEDS.get(method.upper(), tokens.Scope.OPERATE)
    if path in ADMIN_PATHS:
        needs = tokens.Scope.ADMIN
    elif path == MCP_PATH:  # one address for every tool: each tool call checks its own
        needs = tokens.Scope.READ
    found = PROJECT_PATH.match(path)
    try:
        grant.require(needs, f"{method.upper()} {path}")
        grant.reach(*([unquote(found[1])] if found is not None else []))
    except ForbiddenError as exc:
        return str(exc)
    return None


def grant_of(request: Request) -> tokens.Grant:
    """The grant the key middleware left for the request (everything, where none is needed)."""
    found = request.scope.get("state", {}).get("grant")
    return found if isinstance(found, tokens.Grant) else tokens.ADMIN


def wants_a_page(request: Request) -> bool:
    """A browser opening an address (a GET that accepts HTML), not a script or the page's own
    requests (which ask for JSON)."""
    return request.method == "GET" and "text/html" in request.headers.get("accept", "")


KEY_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>run-agent: a key is needed</title>
<style>body{{font:16px system-ui,sans-serif;max-width:36em;margin:4em auto;padding:0 1em}}
input{{font:inherit;width:100%;margin:.5em 0;padding:.4em}}code{{font-size:90%}}</style>
</head><body>
<h1>A key is needed</h1>
<p>{said} Give the server's API key or a token; this browser keeps it in a cookie for this
site.</p>
<form method="get" action="/">
<label for="key">Key or token</label>
<input id="key" name="key" type="password" autocomplete="off" required autofocus>
<button type="submit">Open the page</button>
</form>
<p>On the server's machine, <code>run-agent token create --scope read --link</code> makes a token
and prints the address to open with it (<code>--scope operate</code> to start and stop tasks).</p>
</body></html>
"""


def key_page(refused: bool) -> HTMLResponse:
    """A browser's 401: what to give and where to get it, with a form that opens the page with
    it (as `/?key=`, which sets the cookie and leaves an address without it)."""
    said = ("That key or token was refused: it is wrong, expired or revoked." if refused
            else "This run-agent server lets in only who gives a key.")  # fmt: skip
    return HTMLResponse(
        KEY_PAGE.format(said=said), status_code=401, headers={"WWW-Authenticate": "Bearer"}
    )


def redirect_without_key(url: URL) -> RedirectResponse:
    return RedirectResponse(url.path + _query_without_key(url), status_code=303)


def _query_without_key(url: URL) -> str:
    pairs = [(k, v) for k, v in parse_qsl(url.query, keep_blank_values=True) if k != "key"]
    return f"?{urlencode(pairs)}" if pairs else ""


def cross_site(request: Request) -> str | None:
    """Why a request must be refused as coming from another site's page, or None."""
    if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
        return "cross-site request refused"
    origin = request.headers.get("origin")
    if origin is not None:
        host = request.headers.get("host", "")
        if urlsplit(origin).netloc != host:
            return f"request from origin {origin[:100]!r} refused"
    return None


class SameOrigin:
    """An ASGI app (`/mcp`) that another site's page may not reach, whatever the method."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = cross_site(Request(scope)) if scope["type"] == "http" else None
        if refusal is not None:
            await JSONResponse({"error": refusal}, status_code=403)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def cross_site_write(request: Request) -> str | None:
    """Why a write request must be refused as cross-site, or None if it may proceed."""
    refusal = cross_site(request)
    if refusal is not None:
        return refusal
    content_type = request.headers.get("content-type", "").split(";")[0].strip()
    if content_type != "application/json":
        return "send the request body as application/json"
    return None


async def bounded_body(request: Request, limit: int) -> bytes:
    """A request's body, read no further than `limit` bytes: past it (or when its length says
    it will be) a 413; what is left of it is read and dropped before the answer goes out
    (server/intake.py), so the client reads the answer."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def too_large(limit: int) -> HTTPException:
    """The 413 of a body over `limit` bytes; the connection closes after it."""
    return HTTPException(413, f"the body is over {describe_size(limit)} ({limit} bytes); send "
                         "less", headers={"Connection": "close"})  # fmt: skip
