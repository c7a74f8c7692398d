"""The `codex` backend: Codex CLI `exec` mode, streaming JSON events to stdout.

    codex exec --json --skip-git-repo-check <permissions> [-m M] [-c ...] [args] - < prompt.md

`-` reads the prompt from stdin, which is prompt.md (a file): codex reads stdin to its end, so an
open pipe would hang it forever. codex ignores OPENAI_BASE_URL, so `base_url` becomes a custom
model provider given with `-c` overrides, whose key comes from CODEX_API_KEY.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, tzinfo
from datetime import time as dtime
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from runagent.backend import (
    Backend,
    Diagnosis,
    LaunchSpec,
    Permissions,
    Reason,
    RunContext,
    Usage,
    count,
    from_text,
    json_lines,
    retry_after,
    session_token,
    tail,
)

PROVIDER = "runagent"
# How codex 0.169 says when a plan's usage limit lifts (UsageLimitReachedError: the provider's
# `resets_at` in the local time of the codex process, to the minute; with the date when it is
# not today): "... or try again at 5:46 AM." / "... or try again at Nov 29th, 2026 5:46 AM."
_TRY_AGAIN_AT = re.compile(
    r"try again at (?:([A-Z][a-z]{2}) (\d{1,2})(?:st|nd|rd|th), (\d{4}) )?(\d{1,2}):(\d{2}) ([AP]M)"
)


def try_again_at(text: str, zone: str | None = None, now: float | None = None) -> float | None:
    """Seconds until the limit lifts, from codex's "try again at ..." in `text` (read in the
    time zone `zone` names, the agent's TZ, else this host's); None if it names no time. Its
    minute is taken to its end: codex leaves out the seconds."""
    m = _TRY_AGAIN_AT.search(text)
    if m is None:
        return None
    month, day, year, hour, minute, half = m.groups()
    moment = time.time() if now is None else now
    tz = _zone(zone)
    try:
        date = (
            datetime.strptime(f"{month} {day} {year}", "%b %d %Y").date()
            if month
            else datetime.fromtimestamp(moment, tz).date()
        )
        at = datetime.combine(date, dtime(int(hour) % 12 + (12 if half == "PM" else 0),
                                           int(minute)), tzinfo=tz)  # fmt: skip
    except ValueError:
        return None
    return max(0.0, at.timestamp() + 60 - moment)


def _zone(name: str | None) -> tzinfo:
    """The time zone TZ names (an IANA name), else this host's own."""
    if name:
        try:
            return ZoneInfo(name.removeprefix(":"))
        except (ValueError, ZoneInfoNotFoundError):
            pass
    return datetime.now().astimezone().tzinfo or UTC


def _codex_home(env: Mapping[str, str]) -> Path:
    home = Path(env.get("HOME") or Path.home())
    return Path(env.get("CODEX_HOME") or home / ".codex")


class CodexBackend(Backend):
    name = "codex"
    default_command = ("codex",)
    package = "@openai/codex"  # the npm package its vendor ships the CLI in
    token_variable = "CODEX_API_KEY"
    login_renamed = True  # auth.json is written beside and renamed over
    # How the page reads each line of the stream (runagent/loop/lines.py says how rules read).
    lines = (
        {"when": {"item.type": "agent_message"}, "show": [("assistant", "{item.text}")]},
        {"when": {"item.type": "command_execution"},
         "show": [("tool", "⚙ {item.command} {item.exit_code}")]},
        {"when": {"item.type": "error"}, "show": [("error", "{item.message}")]},
        {"when": {"type": "turn.failed"}, "show": [("error", "turn failed: {error.message}")]},
        {"when": {"type": "error"}, "show": [("error", "{message|error}")]},
        {"has": ["type"], "show": [("meta", "{type}")]},
    )  # fmt: skip

    def own_files(self, env: Mapping[str, str]) -> tuple[Path, ...]:
        return (_codex_home(env),)

    def login_files(self, env: Mapping[str, str]) -> tuple[Path, ...]:
        return (_codex_home(env) / "auth.json",)

    def settings_files(self, env: Mapping[str, str]) -> tuple[Path, ...]:
        return (_codex_home(env) / "config.toml",)

    def launch(self, ctx: RunContext) -> LaunchSpec:
        argv = [*self.command(), "exec"]
        if ctx.session is not None:  # exactly that session, never `--last`
            argv.append("resume")
        argv += ["--json", "--skip-git-repo-check"]
        if self.config.permissions is Permissions.BYPASS:
            argv.append("--dangerously-bypass-approvals-and-sandbox")
        if self.config.model:
            argv += ["-m", self.config.model]
        if self.config.base_url:
            argv += self.provider_overrides(self.config.base_url)
        argv += self.config.args
        if ctx.session is not None:
            argv.append(ctx.session)
        argv.append("-")
        return LaunchSpec(tuple(argv), self.environment(ctx), ctx.working_dir, ctx.prompt_file)

    @staticmethod
    def provider_overrides(base_url: str) -> list[str]:
        settings = {
            "model_provider": PROVIDER,
            f"model_providers.{PROVIDER}.name": PROVIDER,
            f"model_providers.{PROVIDER}.base_url": json.dumps(base_url),
            f"model_providers.{PROVIDER}.env_key": "CODEX_API_KEY",
            f"model_providers.{PROVIDER}.wire_api": "responses",
        }
        return [arg for key, value in settings.items() for arg in ("-c", f"{key}={value}")]

    def usage(self, ctx: RunContext) -> Usage | None:
        """Every `turn.completed` event's usage, summed (codex gives no cost)."""
        total = None
        for event in json_lines(ctx.stdout_path):
            if event.get("type") == "turn.completed":
                used = event.get("usage")
                turn = Usage(count(used, "input_tokens"), count(used, "output_tokens"))
                total = turn if total is None else total + turn
        return total

    resumes_sessions = True

    def session_id(self, ctx: RunContext) -> str | None:
        """The `thread.started` event's thread id (codex's session)."""
        for event in json_lines(ctx.stdout_path):
            if event.get("type") == "thread.started":
                return session_token(event.get("thread_id"))
        return None

    def final_output(self, ctx: RunContext) -> str | None:
        answer = None
        for event in json_lines(ctx.stdout_path):
            item = event.get("item") or {}
            if event.get("type") == "item.completed" and item.get("type") == "agent_message":
                answer = str(item.get("text", ""))
        return None if answer is None else answer.rstrip("\n") + "\n"

    def diagnose(self, ctx: RunContext, exit_code: int) -> Diagnosis | None:
        errors = []
        for event in json_lines(ctx.stdout_path):
            if event.get("type") == "turn.failed":
                errors.append(str((event.get("error") or {}).get("message", "")))
            elif event.get("type") == "error":
                errors.append(str(event.get("message", "")))
        text = "\n".join(e for e in errors if e) or tail(ctx.stderr_path, 4000)
        if not text.strip():
            return None
        found = from_text(text)
        if found is not None and found.reason is Reason.RATE_LIMIT and found.retry_after is None:
            # A plan's usage limit: codex says when it lifts only in its message's words.
            lifts = try_again_at(text, ctx.environment.get("TZ"))
            return replace(found, retry_after=lifts) if lifts is not None else found
        if found is not None:
            return found
        if "usage_limit_reached" in text:
            return Diagnosis(Reason.RATE_LIMIT, "usage limit reached", retry_after(text))
        first = text.strip().splitlines()[-1][:300]
        return Diagnosis(Reason.API_ERROR, f"codex reported: {first}") if errors else None

    def summarize(self, line: str) -> str | None:
        try:
            event = json.loads(line)
        except ValueError:
            return line
        if not isinstance(event, dict):
            return None
        item = event.get("item") or {}
        if item.get("type") == "agent_message":
            return str(item.get("text", ""))
        if item.get("type") == "command_execution":
            return f"[exec] {item.get('command', '')}"
        if event.get("type") in ("turn.failed", "error"):
            return f"error: {(event.get('error') or {}).get('message') or event.get('message')}"
        return None

    def login_hint(self) -> str:
        return "`codex login` in HOME, or CODEX_API_KEY / agents.<name>.token_env"
