"""OpenAI-compatible streaming chat completions, run as an agent process (perplexity, xai).

An HTTP backend runs like every other agent: `python -m backends.<name> RUN_FOLDER` is the child
process the supervisor starts, times out and kills. The child reads prompt.md, streams the answer
to stdout as it arrives, writes output.md (with a Sources list when the provider cites), retries
429, 5xx and connection errors with exponential backoff honouring Retry-After, and gives up on a
stream that goes silent. A failure ends with one JSON line on stderr that `diagnose` reads.

Tuning by environment (an agent's `env:`): RUN_AGENT_STREAM_TIMEOUT (seconds of silence before
giving up, default 120) and RUN_AGENT_CHAT_RETRIES (default 5).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from runagent.backend import (
    Backend,
    Diagnosis,
    Finding,
    LaunchSpec,
    Reason,
    RunContext,
    RunPaths,
    atomic_write,
    http_retry_after,
    tail,
)

ERROR_TAG = "run_agent_error"
RETRIES = 5
BACKOFF_START = 1.0
BACKOFF_CAP = 60.0
RETRY_AFTER_CAP = 300.0  # longer waits are the supervisor's (it does not spend restarts on them)


class ChatBackend(Backend):
    """An agent behind an OpenAI-compatible chat-completions endpoint."""

    default_url: ClassVar[str]
    default_model: ClassVar[str]

    def launch(self, ctx: RunContext) -> LaunchSpec:
        env = self.environment(ctx)
        env["RUN_AGENT_CHAT_URL"] = endpoint(self.config.base_url or self.default_url)
        env["RUN_AGENT_CHAT_MODEL"] = self.config.model or self.default_model
        argv = (sys.executable, "-m", f"backends.{self.name}", str(ctx.run_folder))
        return LaunchSpec(argv, env, ctx.working_dir, stdin=None)

    def final_output(self, ctx: RunContext) -> str | None:
        try:
            return ctx.paths.output.read_text(encoding="utf-8")
        except OSError:
            return None

    def diagnose(self, ctx: RunContext, exit_code: int) -> Diagnosis | None:
        for line in reversed(tail(ctx.stderr_path, 8000).splitlines()):
            try:
                report = json.loads(line).get(ERROR_TAG)
            except (ValueError, AttributeError):
                continue
            if isinstance(report, dict):
                return Diagnosis(
                    Reason(report.get("reason", Reason.API_ERROR.value)),
                    str(report.get("message", "")),
                    report.get("retry_after"),
                )
        return None

    def check(self) -> list[Finding]:
        finding = self.check_credentials()
        if finding.ok and "own login" in finding.what:
            finding = Finding(
                False,
                f"no API key: {self.token_variable} is not set",
                f"export {self.token_variable} or set agents.{self.config.name}.token_env",
            )
        return [finding]


def endpoint(base_url: str) -> str:
    """The chat-completions URL for a base URL that may or may not name the path."""
    url = base_url.rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


# The child process ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    url: str
    model: str
    key: str
    prompt: str
    stream_timeout: float
    retries: int = RETRIES


class Failed(Exception):
    def __init__(self, reason: Reason, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


def main(token_variable: str, cite: bool) -> int:
    """Entry point of `python -m backends.<name> RUN_FOLDER`."""
    if len(sys.argv) != 2:
        print(f"usage: python -m backends.<name> RUN_FOLDER (got {sys.argv[1:]})", file=sys.stderr)
        return 2
    run = RunPaths(Path(sys.argv[1]))
    key = os.environ.get(token_variable, "")
    try:
        if not key:
            raise Failed(Reason.AUTH, f"{token_variable} is not set; configure the agent's token")
        request = Request(
            url=os.environ["RUN_AGENT_CHAT_URL"],
            model=os.environ["RUN_AGENT_CHAT_MODEL"],
            key=key,
            prompt=run.prompt.read_text(encoding="utf-8"),
            stream_timeout=float(os.environ.get("RUN_AGENT_STREAM_TIMEOUT", "120")),
            retries=int(os.environ.get("RUN_AGENT_CHAT_RETRIES", RETRIES)),
        )
        text, citations = complete(request)
    except Failed as exc:
        report(exc)
        return 3 if exc.reason is Reason.AUTH else 1
    answer = text.rstrip("\n") + "\n"
    if cite and citations:
        sources = "\nSources:\n" + "".join(f"{i}. {u}\n" for i, u in enumerate(citations, 1))
        sys.stdout.write("\n" + sources)
        answer += sources
    sys.stdout.flush()
    atomic_write(run.output, answer)
    return 0


def report(exc: Failed) -> None:
    print(f"error: {exc}", file=sys.stderr)
    detail = {"reason": exc.reason.value, "message": str(exc), "retry_after": exc.retry_after}
    print(json.dumps({ERROR_TAG: detail}), file=sys.stderr, flush=True)


def complete(request: Request) -> tuple[str, list[str]]:
    """Stream one answer to stdout, retrying what a retry can fix before any text was written."""
    import httpx

    timeout = httpx.Timeout(30.0, read=request.stream_timeout)
    body = {
        "model": request.model,
        "stream": True,
        "messages": [{"role": "user", "content": request.prompt}],
    }
    headers = {"Authorization": f"Bearer {request.key}", "Accept": "text/event-stream"}
    delay = BACKOFF_START
    with httpx.Client(timeout=timeout) as client:
        for attempt in range(request.retries + 1):
            try:
                with client.stream("POST", request.url, json=body, headers=headers) as response:
                    if response.status_code == 200:
                        return consume(response.iter_lines())
                    failure = http_failure(response.status_code, response.read(), response.headers)
            except httpx.ReadTimeout as exc:
                raise Failed(
                    Reason.API_ERROR, f"the stream went silent for {request.stream_timeout:g}s"
                ) from exc
            except httpx.TransportError as exc:
                failure = Failed(
                    Reason.API_ERROR, f"connection failed: {exc or type(exc).__name__}"
                )
            retryable = (
                failure.reason is Reason.RATE_LIMIT
                or "HTTP 5" in str(failure)
                or ("connection failed" in str(failure))
            )
            wait = failure.retry_after if failure.retry_after is not None else delay
            if not retryable or attempt == request.retries or wait > RETRY_AFTER_CAP:
                raise failure
            print(f"retrying in {wait:g}s: {failure}", file=sys.stderr, flush=True)
            time.sleep(wait)
            delay = min(delay * 2, BACKOFF_CAP)
    raise AssertionError("unreachable")


def http_failure(status: int, body: bytes, headers: Any) -> Failed:
    text = body.decode("utf-8", errors="replace")
    try:
        error = json.loads(text).get("error", text)
        message = error.get("message", text) if isinstance(error, dict) else str(error)
    except (ValueError, AttributeError):
        message = text
    message = f"HTTP {status}: {message.strip()[:300]}"
    if status == 429:
        return Failed(Reason.RATE_LIMIT, message, http_retry_after(headers.get("retry-after")))
    if status in (401, 403):
        return Failed(Reason.AUTH, message)
    return Failed(Reason.API_ERROR, message)


def consume(lines: Iterator[str]) -> tuple[str, list[str]]:
    """Write each content delta to stdout as it arrives; return the text and any citations."""
    parts: list[str] = []
    citations: list[str] = []
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            continue
        if isinstance(chunk.get("citations"), list):
            citations = [str(c) for c in chunk["citations"]]
        if chunk.get("error"):
            raise Failed(Reason.API_ERROR, f"stream error: {chunk['error']}")
        for choice in chunk.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                parts.append(content)
                sys.stdout.write(content)
                sys.stdout.flush()
    return "".join(parts), citations
