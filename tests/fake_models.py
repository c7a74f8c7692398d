"""A fake model provider on 127.0.0.1 speaking the real streaming wire formats, for the tests.

Anthropic Messages (claude), OpenAI Responses (codex), Gemini streamGenerateContent (gemini) and
OpenAI chat completions (perplexity, xai). `scenario` picks the behaviour for every format:

- "text": answer "hello from fake model";
- "tool": first call the CLI's shell tool to write fake_tool_output.txt, then answer;
- "tool_forever": call the shell tool on every request, never answering: a CLI that works turn
  after turn until it is stopped (each turn reports its usage as the CLI does);
- "error": HTTP 400; "auth": HTTP 401; "rate_limit": HTTP 429 (Retry-After: 1) every time;
- "rate_limit_once": HTTP 429 on the first model request, then "text";
- "usage_limit": HTTP 429 as each provider answers once a usage quota is spent, until
  `limit_seconds` from the request (its error body and headers as the real provider sends them,
  and the CLIs read: `usage_limit_error`); "usage_limit_once": that on the first model request,
  then "text";
- "hang": send the response headers, then nothing until the server stops;
- "script" (chat completions only): the n-th request is answered with `replies[n]` (the last
  one again past the end), e.g. operations messages for an agent-mode conversation;
- "calls" (Anthropic Messages only): a request carrying n tool results is answered with the
  tool call `calls[n]` (a tool's name and input, e.g. an MCP server's tool), and once every
  call has its result, with the text answer.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TEXT = "hello from fake model"
TOOL_COMMAND = "echo 'hello from fake tool' > fake_tool_output.txt"


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeModelServer:
    scenario: str = "text"
    requests: list[Recorded] = field(default_factory=list)
    model_requests: int = 0
    citations: list[str] = field(default_factory=list)
    tool_command: str = TOOL_COMMAND  # what the "tool" scenario asks the CLI's shell to run
    replies: list[str] = field(default_factory=list)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    limit_seconds: int = 3600  # how long a "usage_limit" lasts from the request that hits it

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        server = self

        class Handler(_Handler):
            fake = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeModelServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopping.set()  # releases hanging responses
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)

    def next_behaviour(self) -> str:
        with self._lock:
            self.model_requests += 1
            if self.scenario == "rate_limit_once":
                return "rate_limit" if self.model_requests == 1 else "text"
            if self.scenario == "usage_limit_once":
                return "usage_limit" if self.model_requests == 1 else "text"
            return self.scenario

    def reply(self) -> str:
        """The scripted reply to the request just counted."""
        with self._lock:
            return self.replies[min(self.model_requests, len(self.replies)) - 1]

    def chat_bodies(self) -> list[Any]:
        return [r.body for r in self.requests if r.path.endswith("/chat/completions")]


class _Handler(BaseHTTPRequestHandler):
    fake: FakeModelServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet

    def do_HEAD(self) -> None:  # claude's connectivity probe
        self._record(None)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self._record(None)
        self._json(200, {})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        self._record(body)
        path = self.path.split("?")[0]
        if path.endswith("/messages"):
            fmt = "anthropic"
        elif path.endswith("/responses"):
            fmt = "responses"
        elif ":streamGenerateContent" in path or ":generateContent" in path:
            fmt = "gemini"
        elif path.endswith("/chat/completions"):
            fmt = "chat"
        else:
            self._json(404, {"error": {"message": f"no such endpoint {path}"}})
            return
        behaviour = self.fake.next_behaviour()
        if behaviour in ("error", "auth", "rate_limit"):
            status = {"error": 400, "auth": 401, "rate_limit": 429}[behaviour]
            self._json(status, error_body(fmt, status), retry_after=status == 429)
            return
        if behaviour == "usage_limit":
            status, payload, headers = usage_limit_error(fmt, self.fake.limit_seconds)
            self._json(status, payload, headers=headers)
            return
        if behaviour == "hang":
            self._start_stream()
            self.fake._stopping.wait()
            return
        if behaviour == "script" and fmt == "chat":
            self._start_stream()
            for chunk in scripted_stream(body, self.fake.reply(), self.fake.citations):
                self.wfile.write(chunk.encode())
                self.wfile.flush()
            self.close_connection = True
            return
        if behaviour == "calls" and fmt == "anthropic":
            done = json.dumps(body).count('"tool_result"')
            call = self.fake.calls[done] if done < len(self.fake.calls) else None
            self._start_stream()
            for chunk in anthropic_stream(body, "", self.fake.citations, call):
                self.wfile.write(chunk.encode())
                self.wfile.flush()
            self.close_connection = True
            return
        # The shell command the model calls for, or "" for a plain answer.
        wants = behaviour == "tool_forever" or (
            behaviour == "tool" and not has_tool_result(fmt, body)
        )
        tool = self.fake.tool_command if wants else ""
        if fmt == "gemini" and ":generateContent" in path:
            self._json(200, gemini_chunk(TEXT, tool=""))
            return
        self._start_stream()
        for chunk in STREAMS[fmt](body, tool, self.fake.citations):
            self.wfile.write(chunk.encode())
            self.wfile.flush()
        self.close_connection = True

    def _record(self, body: Any) -> None:
        self.fake.requests.append(
            Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
        )

    def _json(
        self, status: int, payload: Any, retry_after: bool = False,
        headers: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if retry_after:
            self.send_header("Retry-After", "1")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.flush()


def error_body(fmt: str, status: int) -> Any:
    message = f"fake-llm: injected error {status}"
    if fmt == "anthropic":
        kind = {400: "invalid_request_error", 401: "authentication_error", 429: "rate_limit_error"}
        return {"type": "error", "error": {"type": kind[status], "message": message}}
    if fmt == "gemini":
        state = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 429: "RESOURCE_EXHAUSTED"}
        error: dict[str, Any] = {"code": status, "message": message, "status": state[status]}
        if status == 429:
            error["details"] = [
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1s"}
            ]
        return {"error": error}
    kind = {400: "invalid_request_error", 401: "invalid_api_key", 429: "rate_limit_exceeded"}
    return {"error": {"type": kind[status], "code": kind[status], "message": message}}


def usage_limit_error(fmt: str, seconds: int) -> tuple[int, Any, dict[str, str]]:
    """The 429 a provider answers once a usage quota is spent, lifting in `seconds`: its status,
    body and headers as the real provider sends them.

    - Responses (codex signed in to a ChatGPT plan): `error.type` usage_limit_reached with the
      reset as `resets_at` (epoch seconds) and `resets_in_seconds`, and the plan's windows in
      the x-codex-primary-* / x-codex-secondary-* headers, which codex reads into its
      rate-limit snapshot;
    - Gemini API: RESOURCE_EXHAUSTED with a QuotaFailure naming the daily per-model quota, a Help
      link and a RetryInfo whose retryDelay is the time to the reset (the message says "Please
      retry in ..." too), as gemini-cli's classifyGoogleError reads it;
    - Anthropic Messages: rate_limit_error with retry-after and the
      anthropic-ratelimit-*-reset headers (RFC 3339);
    - chat completions: rate_limit_exceeded with retry-after.
    """
    import time
    from datetime import UTC, datetime

    reset = int(time.time()) + seconds
    if fmt == "responses":
        body: Any = {"error": {
            "type": "usage_limit_reached", "message": "The usage limit has been reached",
            "plan_type": "plus", "resets_at": reset, "eligible_promo": None,
            "resets_in_seconds": seconds,
        }}  # fmt: skip
        return 429, body, {
            "x-codex-primary-used-percent": "100.0", "x-codex-primary-window-minutes": "300",
            "x-codex-primary-reset-at": str(reset),
            "x-codex-secondary-used-percent": "41.0",
            "x-codex-secondary-window-minutes": "10080",
        }  # fmt: skip
    if fmt == "gemini":
        metric = "generativelanguage.googleapis.com/generate_content_free_tier_requests"
        body = {"error": {
            "code": 429,
            "message": (
                "You exceeded your current quota, please check your plan and billing details. "
                "For more information on this error, head to: "
                "https://ai.google.dev/gemini-api/docs/rate-limits.\n* Quota exceeded for "
                f"metric: {metric}, limit: 250, model: gemini-3.8-flash\n"
                f"Please retry in {seconds}.0s."
            ),
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{
                    "quotaMetric": metric,
                    "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
                    "quotaDimensions": {"location": "global", "model": "gemini-3.8-flash"},
                    "quotaValue": "250",
                }]},
                {"@type": "type.googleapis.com/google.rpc.Help", "links": [{
                    "description": "Learn more about Gemini API quotas",
                    "url": "https://ai.google.dev/gemini-api/docs/rate-limits",
                }]},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{seconds}s"},
            ],
        }}  # fmt: skip
        return 429, body, {}
    if fmt == "anthropic":
        at = datetime.fromtimestamp(reset, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"type": "error", "error": {
            "type": "rate_limit_error",
            "message": "This request would exceed your organization's rate limit.",
        }}  # fmt: skip
        return 429, body, {
            "retry-after": str(seconds), "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": at,
            "anthropic-ratelimit-tokens-reset": at,
        }  # fmt: skip
    said = f"Rate limit reached. Please try again in {seconds}s."
    body = {"error": {"type": "requests", "code": "rate_limit_exceeded", "param": None,
                      "message": said}}  # fmt: skip
    return 429, body, {"retry-after": str(seconds)}


def has_tool_result(fmt: str, body: Any) -> bool:
    text = json.dumps(body)
    marker = {
        "anthropic": '"tool_result"',
        "responses": '"function_call_output"',
        "gemini": '"functionResponse"',
    }.get(fmt)
    return marker is not None and marker in text


def sse(data: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n"


def anthropic_stream(
    body: Any, tool: str, citations: list[str], call: tuple[str, dict[str, Any]] | None = None
) -> Iterator[str]:
    model = (body or {}).get("model", "fake")
    usage = {"input_tokens": 10, "output_tokens": 1}
    unique = uuid.uuid4().hex[:12]  # each message and tool call its own id, as the API gives
    message = {"id": f"msg_fake_{unique}", "type": "message", "role": "assistant", "model": model,
               "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": usage}  # fmt: skip
    yield sse({"type": "message_start", "message": message}, "message_start")
    if call is not None:  # a named tool (an MCP server's), with its input
        block = {"type": "tool_use", "id": f"toolu_fake_{unique}", "name": call[0], "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(call[1])}
    elif tool:
        block = {"type": "tool_use", "id": f"toolu_fake_{unique}", "name": "Bash", "input": {}}
        arguments = json.dumps({"command": tool, "description": "write"})
        delta = {"type": "input_json_delta", "partial_json": arguments}
    else:
        block = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": TEXT}
    yield sse({"type": "content_block_start", "index": 0, "content_block": block},
              "content_block_start")  # fmt: skip
    yield sse({"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta")
    yield sse({"type": "content_block_stop", "index": 0}, "content_block_stop")
    stop = "tool_use" if tool or call is not None else "end_turn"
    yield sse({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
               "usage": {"output_tokens": 5}}, "message_delta")  # fmt: skip
    yield sse({"type": "message_stop"}, "message_stop")


def responses_stream(body: Any, tool: str, citations: list[str]) -> Iterator[str]:
    model = (body or {}).get("model", "fake")
    response: dict[str, Any] = {"id": "resp_fake", "object": "response", "created_at": 0,
                                "status": "in_progress", "model": model, "output": []}  # fmt: skip
    yield sse({"type": "response.created", "response": response}, "response.created")
    if tool:
        item: dict[str, Any] = {"type": "function_call", "id": "fc_fake", "call_id": "call_fake",
                                "name": "exec_command", "status": "completed",
                                "arguments": json.dumps({"cmd": tool})}  # fmt: skip
        yield sse({"type": "response.output_item.added", "output_index": 0, "item": item},
                  "response.output_item.added")  # fmt: skip
    else:
        item = {"id": "msg_fake", "type": "message", "role": "assistant", "status": "in_progress",
                "content": []}  # fmt: skip
        yield sse({"type": "response.output_item.added", "output_index": 0, "item": item},
                  "response.output_item.added")  # fmt: skip
        yield sse({"type": "response.output_text.delta", "item_id": "msg_fake", "output_index": 0,
                   "content_index": 0, "delta": TEXT}, "response.output_text.delta")  # fmt: skip
        item = {**item, "status": "completed",
                "content": [{"type": "output_text", "text": TEXT, "annotations": []}]}  # fmt: skip
    yield sse({"type": "response.output_item.done", "output_index": 0, "item": item},
              "response.output_item.done")  # fmt: skip
    usage = {"input_tokens": 20, "input_tokens_details": {"cached_tokens": 0},
             "output_tokens": 10, "output_tokens_details": {"reasoning_tokens": 0},
             "total_tokens": 30}  # fmt: skip
    done = {**response, "status": "completed", "output": [item], "usage": usage}
    yield sse({"type": "response.completed", "response": done}, "response.completed")


def gemini_chunk(text: str, tool: str) -> dict[str, Any]:
    part: dict[str, Any] = (
        {"functionCall": {"name": "run_shell_command", "args": {"command": tool}}}
        if tool
        else {"text": text}
    )
    return {
        "candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP",
                        "index": 0}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5,
                          "totalTokenCount": 15},
    }  # fmt: skip


def gemini_stream(body: Any, tool: str, citations: list[str]) -> Iterator[str]:
    yield f"data: {json.dumps(gemini_chunk(TEXT, tool))}\r\n\r\n"


def chat_stream(body: Any, tool: str, citations: list[str]) -> Iterator[str]:
    model = (body or {}).get("model", "fake")
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model}
    if citations:
        base["citations"] = citations
    for piece in ("hello ", "from ", "fake ", "model"):
        yield sse({**base, "choices": [{"index": 0, "delta": {"content": piece},
                                         "finish_reason": None}]})  # fmt: skip
    yield sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    yield "data: [DONE]\n\n"


def scripted_stream(body: Any, text: str, citations: list[str]) -> Iterator[str]:
    """`text` as a chat-completions stream, in a few deltas (split mid-JSON on purpose)."""
    model = (body or {}).get("model", "fake")
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model}
    step = max(1, len(text) // 3)
    for at in range(0, len(text), step):
        delta = {"content": text[at : at + step]}
        yield sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    yield sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    yield "data: [DONE]\n\n"


STREAMS = {
    "anthropic": anthropic_stream,
    "responses": responses_stream,
    "gemini": gemini_stream,
    "chat": chat_stream,
}
