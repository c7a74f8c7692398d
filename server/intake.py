"""A request's body as it comes in: refused past a limit in a way every client reads.

A server that answers (a 413, a 401, any refusal) while the client is still sending its body,
and then closes, leaves unread bytes in its socket: the kernel answers them with a reset, and a
client that sends its whole body before reading (Python's urllib and requests, most scripts)
sees "connection reset by peer", never the answer. So before a response starts, whatever is
left of a declared body is read and thrown away, up to MAX_DISCARD bytes (a body larger still
is answered and the connection closed: the client may then see the reset, but the server reads
no further for it). A client that waits for `100 Continue` and was never told to go on is not
made to send: its answer comes first, as HTTP/1.1 means it to.

`Drained` does this for every route; `Bounded` holds an app that reads bodies itself (the MCP
SDK's `/mcp`, which would read any size) to a limit, as `security.bounded_body` holds a route.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.security import bounded_body

MAX_DISCARD = 64 * 1024 * 1024  # bytes of a refused body read and thrown away before its answer


def declared_body(headers: Headers) -> int | None:
    """The bytes a request says its body holds: its Content-Length, -1 for a chunked body of
    unknown length, None for none."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return -1
    length = headers.get("content-length", "")
    return int(length) if length.isdigit() and int(length) > 0 else None


class Drained:
    """Reads what is left of a request's body before its response starts (up to MAX_DISCARD
    bytes), so the client, done sending, reads the answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope) if scope["type"] == "http" else None
        declared = declared_body(headers) if headers is not None else None
        if headers is None or declared is None:  # no body: nothing to wait for
            await self.app(scope, receive, send)
            return
        waits = "100-continue" in headers.get("expect", "").lower()
        done = False
        asked = 0  # bytes the app has read

        async def counted() -> Message:
            nonlocal done, asked
            message = await receive()
            asked += len(message.get("body", b""))
            done = done or not message.get("more_body", False)
            return message

        async def answer(message: Message) -> None:
            nonlocal done
            if message["type"] == "http.response.start" and not done:
                done = True  # once: the answer's own body goes out as it comes
                untouched = waits and asked == 0  # never told to go on: it sends nothing
                beyond = declared > 0 and declared - asked > MAX_DISCARD
                if not untouched and not beyond:
                    await _discard(receive)
            await send(message)

        await self.app(scope, counted, answer)


async def _discard(receive: Receive) -> None:
    """Read and drop the rest of a body, up to MAX_DISCARD bytes."""
    dropped = 0
    while dropped <= MAX_DISCARD:
        message = await receive()
        if message["type"] != "http.request":
            return  # the client went away
        dropped += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


class Bounded:
    """An ASGI app whose requests' bodies are read here, at most `limit` bytes (a 413 past it,
    as `bounded_body` answers), and handed to it whole."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            body = await bounded_body(Request(scope, receive), self.limit)
        except HTTPException as exc:
            refusal = JSONResponse({"error": exc.detail}, exc.status_code, headers=exc.headers)
            await refusal(scope, receive, send)
            return
        given = False

        async def replay() -> Message:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
