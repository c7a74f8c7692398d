"""OpenAI-compatible streaming chat completions, run as an agent process (perplexity, xai, and
any endpoint as `chat_completions`).

An HTTP backend runs like every other agent: `python -m backends.<name> RUN_FOLDER` is the child
process the supervisor starts, times out and kills. The child reads prompt.md, streams the answer
to stdout as it arrives, writes output.md (with a Sources list when the provider cites), retries
429, 5xx and connection errors with exponential backoff honouring Retry-After, and gives up on a
stream that goes silent. A failure ends with one JSON line on stderr that `diagnose` reads.

In agent mode (`mode: agent`) the child is the HTTP transport of a conversation
(runagent/ops/conversation.py): each reply is streamed to stdout, run as an operations message in
the working folder, and answered with its events; the final message goes to output.md.

Tuning by environment (an agent's `env:`): RUN_AGENT_STREAM_TIMEOUT (seconds of silence before
giving up, default 120) and RUN_AGENT_CHAT_RETRIES (default 5).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from runagent.backend import (
    AgentConfig,
    ChildBackend,
    ConfigError,
    Finding,
    LaunchSpec,
    Mode,
    Reason,
    RunContext,
    RunPaths,
    atomic_write,
    http_retry_after,
    report_failure,
)
from runagent.record import record
from runagent.store.credentials import scrub_urls

RETRIES = 5
BACKOFF_START = 1.0
BACKOFF_CAP = 60.0
RETRY_AFTER_CAP = 300.0  # longer waits are the supervisor's (it does not spend restarts on them)


class ChatBackend(ChildBackend):
    """An agent behind an OpenAI-compatible chat-completions endpoint."""

    default_url: ClassVar[str]
    default_model: ClassVar[str]
    agent_mode = True  # `mode: agent` is this module's conversation loop
    default_reason = Reason.API_ERROR

    def launch(self, ctx: RunContext) -> LaunchSpec:
        env = self.environment(ctx)
        env["RUN_AGENT_CHAT_URL"] = endpoint(self.config.base_url or self.default_url)
        env["RUN_AGENT_CHAT_MODEL"] = self.config.model or self.default_model
        env["RUN_AGENT_CHAT_MODE"] = self.config.mode.value
        if self.config.mode is Mode.AGENT:
            env["RUN_AGENT_MAX_TURNS"] = str(self.config.max_turns)
            env["RUN_AGENT_OPS"] = json.dumps(self.config.ops.to_dict())
        return LaunchSpec(self.child_argv(ctx), env, ctx.working_dir, stdin=None)

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


@record
class Request:
    url: str
    model: str
    key: str
    stream_timeout: float
    retries: int = RETRIES


class Failed(Exception):
    def __init__(self, reason: Reason, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after = retry_after


def main(token_variable: str, cite: bool, key_required: bool = True) -> int:
    """Entry point of `python -m backends.<name> RUN_FOLDER`."""
    if len(sys.argv) != 2:
        print(f"usage: python -m backends.<name> RUN_FOLDER (got {sys.argv[1:]})", file=sys.stderr)
        return 2
    run = RunPaths(Path(sys.argv[1]))
    key = os.environ.get(token_variable, "")
    try:
        if not key and key_required:
            raise Failed(Reason.AUTH, f"{token_variable} is not set; configure the agent's token")
        request = Request(
            url=os.environ["RUN_AGENT_CHAT_URL"],
            model=os.environ["RUN_AGENT_CHAT_MODEL"],
            key=key,
            stream_timeout=float(os.environ.get("RUN_AGENT_STREAM_TIMEOUT", "120")),
            retries=int(os.environ.get("RUN_AGENT_CHAT_RETRIES", RETRIES)),
        )
        prompt = run.prompt.read_text(encoding="utf-8")
        if os.environ.get("RUN_AGENT_CHAT_MODE") == Mode.AGENT.value:
            return converse(request, run, prompt)
        text, citations = complete(request, [{"role": "user", "content": prompt}])
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


def converse(request: Request, run: RunPaths, prompt: str) -> int:
    """Agent mode: the conversation, with this module as its transport, in the working folder."""
    from runagent.errors import RunAgentError
    from runagent.ops import Approvals
    from runagent.ops.conversation import Conversation, unattended_policy
    from runagent.ops.policy import Policy
    from runagent.ops.runtime import Runtime
    from runagent.ops.sandbox import Sandbox
    from runagent.ops.waiting import HEARTBEAT_MAX

    def ask(chat: list[dict[str, str]]) -> str:
        text, _ = complete(request, chat)
        sys.stdout.write("\n")
        sys.stdout.flush()
        return text

    try:
        ops = json.loads(os.environ.get("RUN_AGENT_OPS") or "{}")
        approvals = Approvals(ops.get("approvals", Approvals.DENY.value))
        policy = Policy.from_config(ops)
        if approvals is Approvals.DENY:
            policy = unattended_policy(policy)
        runtime = Runtime.create(
            run.folder, Path.cwd(), policy.name, Sandbox(ops.get("sandbox", "auto")),
            rules=ops.get("rules"), policy=policy,
        )  # fmt: skip
        max_turns = int(os.environ.get("RUN_AGENT_MAX_TURNS", "20"))
    except (RunAgentError, ValueError, TypeError, AttributeError) as exc:
        report(Failed(Reason.EXIT_CODE, f"agent mode cannot start: {exc}"))
        return 2
    idle = float(os.environ.get("RUN_AGENT_IDLE_TIMEOUT") or 0)
    # A wait for approval writes a line to stderr every third of the idle timeout: waiting for
    # a person is not a silent agent, and the supervisor sees the output grow.
    conversation = Conversation(
        runtime, ask, max_turns=max_turns, approvals=approvals, say=sys.stderr,
        heartbeat=idle / 3 if idle else HEARTBEAT_MAX,
    )  # fmt: skip
    outcome = conversation.run(prompt)
    if not outcome.finished:
        report(Failed(Reason.EXIT_CODE, outcome.answer))
        return 1
    atomic_write(run.output, outcome.answer.rstrip("\n") + "\n")
    return 0


def report(exc: Failed) -> None:
    report_failure(exc.reason, str(exc), exc.retry_after)


def complete(request: Request, messages: list[dict[str, str]]) -> tuple[str, list[str]]:
    """Stream one answer to stdout, retrying what a retry can fix before any text was written."""
    import httpx

    timeout = httpx.Timeout(30.0, read=request.stream_timeout)
    body = {"model": request.model, "stream": True, "messages": messages}
    headers = {"Accept": "text/event-stream"}
    if request.key:
        headers["Authorization"] = f"Bearer {request.key}"
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


class ChatCompletionsBackend(ChatBackend):
    """Any OpenAI-compatible endpoint (a local model server, a gateway): `base_url` and `model`
    are required, a key is optional (CHAT_COMPLETIONS_API_KEY, or the agent's token)."""

    name = "chat_completions"
    token_variable = "CHAT_COMPLETIONS_API_KEY"
    default_url = ""  # required in the config instead
    default_model = ""

    def __init__(self, config: AgentConfig) -> None:
        super().__init__(config)
        for key in ("base_url", "model"):
            if not getattr(config, key):
                raise ConfigError(
                    f"agents.{config.name}.{key}: missing; a chat_completions agent needs "
                    + ("its endpoint URL" if key == "base_url" else "the model to ask for")
                )

    def check(self) -> list[Finding]:
        finding = self.check_credentials()
        if finding.ok and "own login" in finding.what:  # an endpoint may need no key at all
            where = scrub_urls(self.config.base_url or "")  # its password is never shown
            finding = Finding(True, f"no key configured: requests to {where} carry none")
        return [finding]


if __name__ == "__main__":
    sys.exit(main(ChatCompletionsBackend.token_variable, cite=False, key_required=False))
