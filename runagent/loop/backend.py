"""The backend interface (how run-agent asks an agent what to start and what it said), and the
one module a backend imports from: `__all__` names everything a backend needs."""

from __future__ import annotations

import abc
import json
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from runagent import python
from runagent.config.settings import AgentConfig, Mode, Permissions
from runagent.errors import ConfigError, MissingDependencyError
from runagent.loop.context import RunContext
from runagent.loop.failure import (
    Diagnosis,
    from_status,
    from_text,
    http_retry_after,
    json_lines,
    retry_after,
)
from runagent.loop.lines import LineRule
from runagent.loop.redaction import Redactor
from runagent.process import LaunchSpec, resolve_executable
from runagent.record import record
from runagent.store.runfolder import RunPaths, TaskPaths, atomic_write, tail
from runagent.store.runinfo import Reason, Usage

__all__ = [
    "AgentConfig",
    "Backend",
    "ChildBackend",
    "ConfigError",
    "Diagnosis",
    "Finding",
    "LaunchSpec",
    "LineRule",
    "MissingDependencyError",
    "Mode",
    "Permissions",
    "Reason",
    "RunContext",
    "RunPaths",
    "TaskPaths",
    "Usage",
    "atomic_write",
    "cache_dir",
    "count",
    "from_status",
    "from_text",
    "http_retry_after",
    "json_lines",
    "report_failure",
    "retry_after",
    "session_token",
    "tail",
]

VERSION_TIMEOUT = 20.0
VERSION_WAIT = 120.0  # for a --version asked beside the agent's start, which waits for none
ERROR_TAG = "run_agent_error"  # the key of a child backend's last word on stderr


@record
class Finding:
    """One line of `run-agent backends` / `doctor`: what was checked, and what to do if not ok."""

    ok: bool
    what: str
    fix: str = ""


class Backend(abc.ABC):
    """One kind of agent. `launch` is pure: it builds a LaunchSpec and touches nothing.

    Subclasses set `name` (the registry key, module name, CLI choice and config type, all one).
    """

    name: ClassVar[str]
    # The executable when `command` is not configured (CLI backends).
    default_command: ClassVar[tuple[str, ...]] = ()
    package: ClassVar[str] = ""  # the npm package its CLI comes in, for the install hint
    # Prefixes of the provider variables (keys, endpoints) that are this agent's, and of those
    # that are other agents'. The registry sets both from its lines; a backend from another
    # package states its own here, on the class its entry point names.
    env_prefixes: tuple[str, ...] = ()
    foreign_prefixes: tuple[str, ...] = ()
    # Where the agent reads its key from; a configured token is put there.
    token_variable: ClassVar[str | None] = None
    # Whether `mode: agent` (an operations conversation run by run-agent) is this backend's to run.
    agent_mode: ClassVar[bool] = False
    # Whether the agent's stdout is written for a person at the terminal (it is echoed whole).
    talks_to_person: ClassVar[bool] = False
    # How each line of the agent's stdout reads in the page: the rules its JSON events are shown
    # by (runagent/loop/lines.py). None stated: the page shows the lines as the agent wrote them.
    lines: ClassVar[Sequence[LineRule]] = ()

    def __init__(self, config: AgentConfig) -> None:
        self.config = config

    @abc.abstractmethod
    def launch(self, ctx: RunContext) -> LaunchSpec:
        """The process that runs this agent for `ctx`."""

    def usage(self, ctx: RunContext) -> Usage | None:
        """Tokens (and cost) the run used, read from its stream; None if the agent does not say."""
        return None

    def working_usage(self, ctx: RunContext) -> Usage | None:
        """What the run had used by its agent's reports while it worked, leaving out the report
        it closes with (claude's `result`, gemini's): a budget is held to this, so a closing
        report that crosses one never stops a run that has finished, whenever it is read."""
        return self.usage(ctx)

    def reports_usage(self) -> bool:
        """Whether this backend reads usage from its agent's stream (its own `usage`): a budget
        can be held to only then."""
        return type(self).usage is not Backend.usage

    def final_output(self, ctx: RunContext) -> str | None:
        """The agent's final answer parsed from its output, or None to copy stdout."""
        return None

    # Whether the agent's CLI resumes a session by its id: `session_id` reads the id from the
    # run's events, and `launch` resumes `ctx.session` when it is set. Only then does an attempt
    # after another continue its session (`session: continue`).
    resumes_sessions: ClassVar[bool] = False

    def session_id(self, ctx: RunContext) -> str | None:
        """The id of the session the run's agent started or resumed, from its own events (passed
        through `session_token`); None if it did not say."""
        return None

    def session_refused(self, ctx: RunContext, exit_code: int) -> str | None:
        """Why a run told to resume `ctx.session` could not (the session gone, expired, or
        refused), in the CLI's words; None if it did, or failed for another reason. The CLI
        said so when it failed before it started any session (no id in its events)."""
        if ctx.session is None or exit_code == 0 or self.session_id(ctx) is not None:
            return None
        lines = [ln.strip() for ln in tail(ctx.stderr_path, 4000).splitlines() if ln.strip()]
        lines = [ln for ln in lines if not ln.startswith("run-agent:")]
        naming = [ln for ln in lines if ctx.session in ln]  # the line that names the session
        words = naming or lines
        return (words[-1] if words else f"exit code {exit_code}")[:300]

    def diagnose(self, ctx: RunContext, exit_code: int) -> Diagnosis | None:
        """Why a run that exited `exit_code` failed, if the backend can tell; else None."""
        return None

    def summarize(self, line: str) -> str | None:
        """A readable form of one line of the agent's stdout, for a person watching."""
        return line

    def terminal_copy(self, line: str, run_folder: Path) -> str | None:
        """Text to put on the terminal's clipboard when the agent of the run in `run_folder`
        printed `line`; else None."""
        return None

    # Whether the CLI replaces its login file by a rename rather than rewriting it (a file bound
    # at its place in the sandbox cannot be renamed over): then a sandboxed run gets a copy of it,
    # taken back when the run ends (see runagent.loop.sandbox).
    login_renamed: ClassVar[bool] = False

    def own_files(self, env: Mapping[str, str]) -> tuple[Path, ...]:
        """Where the agent CLI keeps its login, settings and session state (folders, or files),
        under the agent's environment `env`; none for an agent that keeps nothing. A sandboxed
        run (`sandbox: bwrap`) writes a private copy of each, the task's own, never the real one
        (what it writes there would be what the CLI runs on the host), but for `login_files`,
        and sees `settings_files` read-only."""
        return ()

    def login_files(self, env: Mapping[str, str]) -> tuple[Path, ...]:
        """The files under `own_files` that hold the CLI's login (tokens it refreshes): a
        sandboxed run reads and writes the real ones, so a refreshed token lands where the host
        reads it. Data the CLI never runs."""
        return ()

    def settings_files(self, env: Mapping[str, str]) -> tuple[Path, ...]:
        """The files under `own_files` that say how the CLI logs in and runs (the user's own
        settings): a sandboxed run sees the real ones read-only, where they exist."""
        return ()

    # Credentials and environment -------------------------------------------------------------

    def token(self, env: Mapping[str, str]) -> str | None:
        """The configured credential: `token`, else `token_file`, else `token_env`; or None."""
        c = self.config
        if c.token:
            return c.token
        if c.token_file is not None:
            try:
                return c.token_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise MissingDependencyError(
                    f"agents.{c.name}.token_file {str(c.token_file)!r} cannot be read "
                    f"({exc.strerror}); fix the path or its permissions"
                ) from exc
        if c.token_env:
            value = env.get(c.token_env)
            if not value:
                raise MissingDependencyError(
                    f"agents.{c.name}.token_env names {c.token_env!r}, which is not set; "
                    "export it or configure token_file"
                )
            return value
        return None

    def environment(self, ctx: RunContext) -> dict[str, str]:
        """The run's environment less other providers' variables, plus the configured token."""
        env = self._given(ctx.environment)
        token = self.token(ctx.environment)
        if token and self.token_variable:
            env[self.token_variable] = token
        return env

    def _given(self, env: Mapping[str, str]) -> dict[str, str]:
        """The variables of `env` this agent may see: not other providers' ones."""
        keep = {*self.config.env, *self.config.pass_env}
        return {
            k: v
            for k, v in env.items()
            if k in keep
            or not k.startswith(self.foreign_prefixes)
            or k.startswith(self.env_prefixes or ("\0",))
        }

    def secrets(self) -> Iterable[str]:
        """Values that must never be copied out of a run; a backend may add its own."""
        try:
            token = self.token(os.environ)
        except MissingDependencyError:
            token = None
        return [s for s in (token, self.config.token) if s]

    def redactor(self, env: Mapping[str, str]) -> Redactor:
        """Every credential a run of this agent may hold, when run-agent's environment is `env`:
        the configured token, `secrets()`, and the credential variables the agent is given."""
        try:
            token = self.token(env)
        except MissingDependencyError:
            token = None
        given = self._given({**env, **self.config.env})
        return Redactor.of_environment(given, [token, *self.secrets()])

    def commandline(self, spec: LaunchSpec) -> str:
        """The command line as one shell-quoted line; the supervisor redacts it before recording."""
        return shlex.join(spec.argv)

    # The executable --------------------------------------------------------------------------

    def command(self) -> tuple[str, ...]:
        return self.config.command or self.default_command

    def executable(self) -> str | None:
        """The absolute path of the agent's executable, or None if it is not found."""
        argv = self.command()
        return resolve_executable(argv[0], os.environ, Path.cwd()) if argv else None

    def tells_version(self) -> bool:
        """Whether `EXECUTABLE --version` says the agent's version: for a CLI's own executable
        alone, not a command of several words (`python3 fake.py`, `npx codex`), whose first
        word's version is the interpreter's."""
        return bool(self.default_command) and len(self.command()) == 1

    def version(self) -> str | None:
        """The agent's version (its `--version`), cached per executable; None if unknown."""
        exe = self.executable() if self.tells_version() else None
        return cached_version(Path(exe)) if exe else None

    def version_soon(self) -> Callable[[float | None], str | None]:
        """The agent's version, as `version` says it, without waiting for it: when it is not
        known yet, its `--version` is asked in a thread of its own while the agent starts (a
        CLI that loads itself whole to say it takes 3 s, and 20 s or more on a loaded machine).
        The callable gives it, waiting for it at most the seconds it is given (None: until
        it is known or its `--version` gave up)."""
        exe = self.executable() if self.tells_version() else None
        if exe is None:
            return lambda wait: None
        known = cached_version(Path(exe), ask=False)
        if known is not None:
            return lambda wait: known
        found: list[str | None] = []
        asking = threading.Thread(
            target=lambda: found.append(cached_version(Path(exe), timeout=VERSION_WAIT)),
            name="agent-version", daemon=True,
        )  # fmt: skip
        asking.start()

        def version(wait: float | None) -> str | None:
            asking.join(wait)
            return found[0] if found else None

        return version

    def check(self) -> list[Finding]:
        """Whether this agent can run here: its executable and its credentials."""
        findings = []
        if self.command():
            exe = self.executable()
            name = self.command()[0]
            findings.append(
                Finding(True, f"{name} found at {exe}")
                if exe
                else Finding(False, _not_found(name), self.install_hint())
            )
        if self.token_variable:
            findings.append(self.check_credentials())
        return findings

    def check_credentials(self) -> Finding:
        try:
            token = self.token(os.environ)
        except MissingDependencyError as exc:
            return Finding(False, str(exc))
        if token:
            return Finding(True, f"credentials configured for agents.{self.config.name}")
        if os.environ.get(self.token_variable or ""):
            return Finding(True, f"{self.token_variable} is set")
        return Finding(
            True,
            f"no token configured; the agent uses its own login ({self.login_hint()})",
        )

    def install_hint(self) -> str:
        how = f" (npm install -g {self.package})" if self.package else ""
        return f"install it{how}, or set agents.{self.config.name}.command"

    def login_hint(self) -> str:
        return f"or set {self.token_variable} / agents.{self.config.name}.token_env"


class ChildBackend(Backend):
    """A backend whose agent is a child process of run-agent's own code, `python -m
    backends.NAME RUN_FOLDER`: it writes its answer to output.md, and says why it failed in one
    JSON line on stderr (`report_failure`), which `diagnose` reads."""

    default_reason: ClassVar[Reason] = Reason.EXIT_CODE  # a report that names no reason

    def child_argv(self, ctx: RunContext) -> tuple[str, ...]:
        return (*python("-m", f"backends.{self.name}"), str(ctx.run_folder))

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
                try:
                    reason = Reason(report.get("reason", self.default_reason.value))
                except ValueError:
                    reason = self.default_reason
                return Diagnosis(reason, str(report.get("message", "")), report.get("retry_after"))
        return None


def report_failure(reason: Reason, message: str, retry_after: float | None = None) -> None:
    """A child backend's last word: the message for a person, then the line `diagnose` reads."""
    print(f"error: {message}", file=sys.stderr)
    detail = {"reason": reason.value, "message": message, "retry_after": retry_after}
    print(json.dumps({ERROR_TAG: detail}), file=sys.stderr, flush=True)


# What a session id may look like (the CLIs' are UUIDs): it goes on the agent's command line, so
# nothing that could read as an option or hold a separator.
_SESSION_ID = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{7,127}")


def session_token(value: object) -> str | None:
    """`value` if it can be a session id run-agent hands back to the CLI; else None."""
    return value if isinstance(value, str) and _SESSION_ID.fullmatch(value) else None


def count(data: object, *keys: str) -> int:
    """The sum of the whole, non-negative numbers at `keys` of a stream event's dict (what a
    model sends is untrusted: anything else counts as 0)."""
    if not isinstance(data, dict):
        return 0
    values = (data.get(key) for key in keys)
    return sum(v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0)


def _not_found(name: str) -> str:
    if os.sep in name:  # a path is not looked up on PATH
        return f"{name!r} not found (no executable file there)"
    return f"{name!r} not found on PATH"


def cached_version(
    exe: Path, cache: Path | None = None, ask: bool = True, timeout: float = VERSION_TIMEOUT
) -> str | None:
    """`exe --version`, remembered per executable (path, size, mtime) across runs (not `ask`:
    only if remembered)."""
    cache = cache or version_cache_path()
    try:
        st = exe.stat()
    except OSError:
        return None
    key = f"{exe}:{st.st_size}:{st.st_mtime_ns}"
    try:
        known = json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    if key in known:
        return str(known[key])
    if not ask:
        return None
    try:
        out = subprocess.run(
            [str(exe), "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    version = (out.stdout.strip() or out.stderr.strip()).splitlines()[:1]
    if out.returncode != 0 or not version:
        return None
    known[key] = version[0][:200]
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cache, json.dumps(known, indent=1))
    except OSError:
        pass  # a cache that cannot be written only costs time
    return str(known[key])


def version_cache_path() -> Path:
    return cache_dir() / "versions.json"


def cache_dir() -> Path:
    """run-agent's folder in the user's cache, for files it can always make again."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "run-agent"
