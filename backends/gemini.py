"""The `gemini` backend: Gemini CLI headless, streaming JSON events to stdout.

    gemini --output-format stream-json <permissions> --skip-trust [-m M] [args] < prompt.md

Without `--yolo`, headless gemini drops every tool that needs confirmation, so it could neither
edit nor run anything. With `base_url`, gemini 0.61 derives a "gateway" auth type from the
environment and refuses it ("Invalid auth method selected.", exit 41) unless settings select
API-key auth: this backend gives it a system settings file that says so.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

from runagent.backend import (
    Backend,
    Diagnosis,
    LaunchSpec,
    Permissions,
    Reason,
    RunContext,
    Usage,
    cache_dir,
    count,
    from_text,
    json_lines,
    retry_after,
    session_token,
    tail,
)

GATEWAY_SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
}
# gemini exits with the HTTP status & 0xFF on an API error, and 41 for an auth problem.
EXIT_RATE_LIMIT = 429 & 0xFF
EXIT_AUTH = {41, 401 & 0xFF, 403 & 0xFF}


class GeminiBackend(Backend):
    name = "gemini"
    default_command = ("gemini",)
    package = "@google/gemini-cli"  # the npm package its vendor ships the CLI in
    token_variable = "GEMINI_API_KEY"
    # How the page reads each line of the stream (runagent/loop/lines.py says how rules read).
    lines = (
        {"when": {"type": "message", "role": "assistant"}, "show": [("assistant", "{content}")]},
        {"when": {"type": "message"}, "show": [("meta", "{role}: {content}")]},
        {"when": {"type": "tool_use"}, "show": [("tool", "⚙ {tool_name} {parameters}")]},
        {"when": {"type": "tool_result"}, "show": [("tool", "↳ {status} {output}")]},
        {"when": {"type": "result", "status": "error"},
         "show": [("error", "result: {status} {error.message}")]},
        {"when": {"type": "result"}, "show": [("result", "result: {status} {error.message}")]},
        {"has": ["type"], "show": [("meta", "{type}")]},
    )  # fmt: skip

    def own_files(self, env: Mapping[str, str]) -> tuple[Path, ...]:
        return (_gemini_dir(env),)

    def login_files(self, env: Mapping[str, str]) -> tuple[Path, ...]:
        return (_gemini_dir(env) / "oauth_creds.json",)  # rewritten in place on a refresh

    def settings_files(self, env: Mapping[str, str]) -> tuple[Path, ...]:
        return (_gemini_dir(env) / "settings.json",)  # says how it logs in (auth.selectedType)

    def launch(self, ctx: RunContext) -> LaunchSpec:
        env = self.environment(ctx)
        argv = [*self.command(), "--output-format", "stream-json"]
        if self.config.permissions is Permissions.BYPASS:
            argv.append("--yolo")
        argv.append("--skip-trust")
        if ctx.session is not None:  # exactly that session, never "latest"
            argv += ["--resume", ctx.session]
        if self.config.model:
            argv += ["-m", self.config.model]
        argv += self.config.args
        files: dict[Path, str] = {}
        if self.config.base_url:
            env["GOOGLE_GEMINI_BASE_URL"] = self.config.base_url
            if "GEMINI_CLI_SYSTEM_SETTINGS_PATH" not in env:
                path, content = settings_file()
                env["GEMINI_CLI_SYSTEM_SETTINGS_PATH"] = str(path)
                files[path] = content
        return LaunchSpec(tuple(argv), env, ctx.working_dir, ctx.prompt_file, files)

    def usage(self, ctx: RunContext) -> Usage | None:
        """The `result` event's stats (gemini gives no cost)."""
        found = None
        for event in json_lines(ctx.stdout_path):
            if event.get("type") == "result" and isinstance(event.get("stats"), dict):
                stats = event["stats"]
                found = Usage(count(stats, "input_tokens"), count(stats, "output_tokens"))
        return found

    def working_usage(self, ctx: RunContext) -> Usage | None:
        """None: gemini reports its usage only as it closes (its `result`), which a budget never
        stops a finished run for."""
        return None

    resumes_sessions = True

    def session_id(self, ctx: RunContext) -> str | None:
        """The `init` event's session id, once the model answered in it (or it is the session
        the run resumed, kept already): gemini keeps no session whose first request failed."""
        found = None
        for event in json_lines(ctx.stdout_path):
            kind = event.get("type")
            if kind == "init" and found is None:
                found = session_token(event.get("session_id")) or ""
                if found and found == ctx.session:
                    return found
            elif found and (kind == "tool_use" or event.get("role") == "assistant"):
                return found
        return None

    def session_refused(self, ctx: RunContext, exit_code: int) -> str | None:
        """Refused only when gemini started no session at all (no `init` event)."""
        if any(event.get("type") == "init" for event in json_lines(ctx.stdout_path)):
            return None
        return super().session_refused(ctx, exit_code)

    def final_output(self, ctx: RunContext) -> str | None:
        parts: list[str] = []
        seen = False
        for event in json_lines(ctx.stdout_path):
            if event.get("type") == "message" and event.get("role") == "assistant":
                parts.append(str(event.get("content", "")))
                seen = True
        return "".join(parts).rstrip("\n") + "\n" if seen else None

    def diagnose(self, ctx: RunContext, exit_code: int) -> Diagnosis | None:
        message = ""
        for event in json_lines(ctx.stdout_path):
            if event.get("type") == "result" and event.get("status") == "error":
                message = str((event.get("error") or {}).get("message", ""))
        text = message or tail(ctx.stderr_path, 4000)
        if exit_code == EXIT_RATE_LIMIT:
            return Diagnosis(Reason.RATE_LIMIT, f"rate limited: {_short(text)}", retry_after(text))
        if exit_code in EXIT_AUTH:
            return Diagnosis(Reason.AUTH, f"authentication failed: {_short(text)}")
        found = from_text(text) if text.strip() else None
        if found is not None:
            return found
        return (
            Diagnosis(Reason.API_ERROR, f"gemini reported: {_short(message)}") if message else None
        )

    def summarize(self, line: str) -> str | None:
        try:
            event = json.loads(line)
        except ValueError:
            return line
        if not isinstance(event, dict):
            return None
        if event.get("type") == "message" and event.get("role") == "assistant":
            return str(event.get("content", ""))
        if event.get("type") == "tool_use":
            return f"[{event.get('tool_name')}] {json.dumps(event.get('parameters'))}"
        if event.get("type") == "result":
            return f"result: {event.get('status')}"
        return None

    def login_hint(self) -> str:
        return "`gemini` login in HOME, or GEMINI_API_KEY / agents.<name>.token_env"


def settings_file() -> tuple[Path, str]:
    """Where the gateway settings live (named by their content) and what they say."""
    content = json.dumps(GATEWAY_SETTINGS, indent=2) + "\n"
    digest = hashlib.sha256(content.encode()).hexdigest()[:12]
    return cache_dir() / f"gemini-settings-{digest}.json", content


def _gemini_dir(env: Mapping[str, str]) -> Path:
    return Path(env.get("GEMINI_CLI_HOME") or env.get("HOME") or Path.home()) / ".gemini"


def _short(text: str) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "error")
    return line[:300]
