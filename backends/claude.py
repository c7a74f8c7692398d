"""The `claude` backend: Claude Code headless, streaming JSON events to stdout.

    claude -p --output-format stream-json --verbose <permissions> [--model M] [args] < prompt.md

The prompt arrives on stdin from prompt.md (a file, never an open pipe). `--dangerously-skip-
permissions` is refused by claude as root unless IS_SANDBOX=1 is set; as root without it, this
backend allows the editing and shell tools by name instead (`--permission-mode acceptEdits
--allowedTools ...`), which claude accepts. run-agent never sets IS_SANDBOX itself: that is the
user's statement that the machine is a sandbox.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runagent.backend import (
    Backend,
    Diagnosis,
    LaunchSpec,
    Permissions,
    Reason,
    RunContext,
    Usage,
    count,
    from_status,
    from_text,
    json_lines,
    session_token,
    tail,
)

ROOT_TOOLS = ("Bash", "Edit", "Write", "MultiEdit", "NotebookEdit", "WebFetch", "WebSearch")
QUIET = {
    # No update checks, telemetry or error reports from an unattended run.
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
}


def _config_dir(env: Mapping[str, str]) -> Path:
    home = Path(env.get("HOME") or Path.home())
    return Path(env.get("CLAUDE_CONFIG_DIR") or home / ".claude")


# What a turn read: its new input and the cached context it read and wrote.
_INPUT = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


class ClaudeBackend(Backend):
    name = "claude"
    default_command = ("claude",)
    package = "@anthropic-ai/claude-code"  # the npm package its vendor ships the CLI in
    token_variable = "ANTHROPIC_API_KEY"
    # How the page reads each line of the stream (runagent/loop/lines.py says how rules read).
    lines = (
        {"when": {"type": "assistant"}, "has": ["message"], "each": "message.content", "rules": [
            {"when": {"type": "text"}, "show": [("assistant", "{text}")]},
            {"when": {"type": "tool_use"}, "show": [("tool", "⚙ {name} {input}")]},
        ]},
        {"when": {"type": "user"}, "has": ["message"], "each": "message.content", "rules": [
            {"when": {"type": "tool_result", "is_error": True}, "show": [("error", "↳ {content}")]},
            {"when": {"type": "tool_result"}, "show": [("tool", "↳ {content}")]},
        ]},
        {"when": {"type": "result", "is_error": True},
         "show": [("error", "result: {result|subtype}")]},
        {"when": {"type": "result"}, "has": ["is_error"],
         "show": [("result", "result: {result|subtype}")]},
        {"when": {"type": "system"}, "show": [("meta", "system {subtype} {model|message}")]},
        {"has": ["type"], "show": [("meta", "{type}")]},
    )  # fmt: skip

    def own_files(self, env: Mapping[str, str]) -> tuple[Path, ...]:
        home = Path(env.get("HOME") or Path.home())
        return (_config_dir(env), home / ".claude.json")

    def login_files(self, env: Mapping[str, str]) -> tuple[Path, ...]:
        return (_config_dir(env) / ".credentials.json",)  # rewritten in place on a refresh

    def settings_files(self, env: Mapping[str, str]) -> tuple[Path, ...]:
        return (_config_dir(env) / "settings.json",)

    def launch(self, ctx: RunContext) -> LaunchSpec:
        env = self.environment(ctx)
        for key, value in QUIET.items():
            env.setdefault(key, value)
        if self.config.base_url:
            env["ANTHROPIC_BASE_URL"] = self.config.base_url
        argv = [*self.command(), "-p", "--output-format", "stream-json", "--verbose"]
        argv += self.permission_flags(env)
        if ctx.session is not None:  # exactly that session, never `--continue`'s latest
            argv += ["--resume", ctx.session]
        if self.config.model:
            argv += ["--model", self.config.model]
        argv += self.config.args
        return LaunchSpec(tuple(argv), env, ctx.working_dir, stdin=ctx.prompt_file)

    def permission_flags(self, env: dict[str, str]) -> list[str]:
        if self.config.permissions is Permissions.NONE:
            return []
        if os.geteuid() == 0 and env.get("IS_SANDBOX") != "1":
            return ["--permission-mode", "acceptEdits", "--allowedTools", *ROOT_TOOLS]
        return ["--dangerously-skip-permissions"]

    def usage(self, ctx: RunContext) -> Usage | None:
        """The `result` event's usage (input counts cached reads and writes) and cost; until it
        comes, what the assistant messages so far said they used, each message counted once
        (claude repeats a message's usage on every event of its content), with no cost."""
        found = None
        for event in json_lines(ctx.stdout_path):
            if event.get("type") == "result":
                used = event.get("usage")
                cost = event.get("total_cost_usd")
                found = Usage(
                    count(used, *_INPUT),
                    count(used, "output_tokens"),
                    float(cost) if isinstance(cost, int | float) and cost >= 0 else None,
                )
        return found if found is not None else self.working_usage(ctx)

    def working_usage(self, ctx: RunContext) -> Usage | None:
        """What its assistant messages said they used, each counted once; never the closing
        `result` (its final report, which a budget never stops a run for)."""
        messages: dict[str, tuple[int, int]] = {}
        for event in json_lines(ctx.stdout_path):
            message = event.get("message") if event.get("type") == "assistant" else None
            if not isinstance(message, dict) or not isinstance(message.get("id"), str):
                continue
            used = message.get("usage")
            seen = messages.get(message["id"], (0, 0))
            messages[message["id"]] = (max(seen[0], count(used, *_INPUT)),
                                       max(seen[1], count(used, "output_tokens")))  # fmt: skip
        if not messages:
            return None
        return Usage(sum(i for i, _ in messages.values()), sum(o for _, o in messages.values()))

    resumes_sessions = True

    def session_id(self, ctx: RunContext) -> str | None:
        """The `system/init` event's: a resume that fails gives none (its `result` names the
        session it was asked for)."""
        for event in json_lines(ctx.stdout_path):
            if event.get("type") == "system" and event.get("subtype") == "init":
                return session_token(event.get("session_id"))
        return None

    def final_output(self, ctx: RunContext) -> str | None:
        result = None
        for event in json_lines(ctx.stdout_path):
            if event.get("type") == "result" and isinstance(event.get("result"), str):
                result = event["result"]
        return None if result is None else result.rstrip("\n") + "\n"

    def diagnose(self, ctx: RunContext, exit_code: int) -> Diagnosis | None:
        limited: dict[str, Any] | None = None
        result: dict[str, Any] | None = None
        for event in json_lines(ctx.stdout_path):
            kind = event.get("type")
            if kind == "rate_limit_event":
                info = event.get("rate_limit_info") or {}
                if info.get("status") == "rejected":
                    limited = info
            elif kind == "result":
                result = event
        if limited is not None:
            resets = limited.get("resetsAt")
            wait = (
                max(0.0, float(resets) - time.time()) if isinstance(resets, int | float) else None
            )
            kind = limited.get("rateLimitType") or "usage"
            return Diagnosis(Reason.RATE_LIMIT, f"rate limited ({kind} limit reached)", wait)
        if result is not None and result.get("is_error"):
            text = str(result.get("result") or result.get("subtype") or "error")
            status = result.get("api_error_status")
            if isinstance(status, int):
                return from_status(status, text)
            return from_text(text) or Diagnosis(Reason.API_ERROR, f"claude reported: {text}")
        stderr = tail(ctx.stderr_path, 4000)
        return from_text(stderr) if stderr.strip() else None

    def summarize(self, line: str) -> str | None:
        try:
            event = json.loads(line)
        except ValueError:
            return line
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "assistant":
            parts = []
            for block in (event.get("message") or {}).get("content") or []:
                if block.get("type") == "text":
                    parts.append(block.get("text", ""))
                elif block.get("type") == "tool_use":
                    parts.append(f"[{block.get('name')}] {json.dumps(block.get('input'))}")
            return " ".join(parts) or None
        if kind == "result":
            return f"result: {event.get('result', '')}"
        if kind == "system" and event.get("subtype") == "init":
            return f"session started ({event.get('model', '?')})"
        return None

    def login_hint(self) -> str:
        return "`claude` login in HOME, or ANTHROPIC_API_KEY / agents.<name>.token_env"
