"""What a person asked to change for one loop (on the command line, in an API call, in a schedule),
typed once, applied to the config's loop settings, and carried to a detached supervisor's argv."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from runagent.config.settings import (
    AgentSandbox,
    Budget,
    LoopSettings,
    Session,
    Until,
    check_words,
    parse_budget,
)
from runagent.duration import parse_duration
from runagent.errors import RunAgentError, UsageError, shown
from runagent.record import record
from runagent.store import taskfolder
from runagent.store.runfolder import TaskPaths

DURATIONS = ("restart_delay", "timeout", "idle_timeout", "check_timeout")
C = TypeVar("C", bound=enum.Enum)


def flag(name: str) -> str:
    """The command-line option of a field: `idle_timeout` -> `--idle-timeout`."""
    return "--" + name.replace("_", "-")


@record
class Option:
    """One loop option as every face offers it: the command line's help, and the JSON Schema of
    its value in an API body or a tool call (checked again, with the same one-line errors, by
    `LoopOverrides.parse`)."""

    help: str
    schema: dict[str, Any]
    body_key: str = ""  # its key in a body, where that is not its name


_DURATION = {"type": ["number", "string"], "examples": ["30m", 90]}
OPTIONS: dict[str, Option] = {
    "agent": Option("Agent from config.yaml `agents:` (or a backend name).", {"type": "string"}),
    "working_dir": Option(
        "Working folder of the agent (default: the current folder).", {"type": "string"}, "cwd"
    ),
    "max_restarts": Option("Restarts after the first run.", {"type": "integer", "minimum": 0}),
    "restart_delay": Option(
        "First backoff, e.g. 2s; it doubles up to restart_delay_max.", _DURATION
    ),
    "timeout": Option("Stop a run after this long in total, e.g. 30m (0: never).", _DURATION),
    "idle_timeout": Option("Stop a run after this long without output (0: never).", _DURATION),
    "budget": Option(
        "What the task may spend over all its runs: a cost (0.50usd) and/or tokens "
        "(200k-tokens); crossing it stops the loop.",
        {"type": ["string", "array"], "items": {"type": "string"}, "examples": ["0.50usd"]},
    ),
    "stuck_after": Option(
        "Stop the loop after N attempts in a row without progress: the same failure, or no "
        "change to the working folder (default 3).",
        {"type": "integer", "minimum": 0},
    ),
    "until": Option(
        "exit: exit 0 completes the task; done-file: only a DONE file does; ready-marker: only "
        "a commit since the start carrying the ready marker.",
        {"enum": [u.value for u in Until]},
    ),
    "worktree": Option(
        "Work in a git worktree of its own, on a new branch from the working folder's HEAD (or "
        "--base); `merge` brings it back.",
        {"type": "boolean"},
    ),
    "base": Option("The revision a --worktree's branch starts from.", {"type": "string"}),
    "sandbox": Option(
        "bwrap: run the agent under bubblewrap (its folders writable, the home hidden); none: "
        "as you.",
        {"enum": [c.value for c in AgentSandbox]},
    ),
    "check": Option(
        "A command that judges a run that says it is done, e.g. 'pytest -q' (split into words, "
        "no shell), run in the working folder, in the agent's sandbox when it has one: exit 0 "
        "completes the task, anything else fails the run (check_failed) and the next attempt "
        "is told why.",
        {"type": "string", "examples": ["pytest -q"]},
    ),
    "check_timeout": Option(
        "Stop the check after this long, e.g. 10m (default 10m; 0: never).", _DURATION
    ),
    "session": Option(
        "continue: an attempt after another resumes the agent's session by its id (claude, "
        "codex, gemini), told the failure's tail; fresh: it starts a new session, told the task "
        "again (default continue).",
        {"enum": [c.value for c in Session]},
    ),
    "fresh": Option(
        "Start this loop's attempts in new sessions of the agent (as session fresh, for this "
        "loop only: not remembered for the task's next resume).",
        {"type": "boolean"},
    ),
}

# The overrides that hold for the one loop they were given to: carried on its command line (a
# detached loop's too), never remembered in task.yaml for the loops after it.
THIS_LOOP = ("fresh",)


def body_schema() -> dict[str, dict[str, Any]]:
    """The loop options as the properties of a JSON Schema, keyed as a body names them."""
    return {
        option.body_key or name: {**option.schema, "description": option.help}
        for name, option in OPTIONS.items()
    }


@record
class LoopOverrides:
    """None means "as the config says". A duration of 0 means "off" (for `restart_delay`: none)."""

    agent: str | None = None
    working_dir: Path | None = None
    max_restarts: int | None = None
    restart_delay: float | None = None
    timeout: float | None = None
    idle_timeout: float | None = None
    until: Until | None = None
    stuck_after: int | None = None  # 0: stuck detection off for this task
    budget: Budget | None = None  # what the task may spend over all its runs
    worktree: bool | None = None  # the loop works in a git worktree of its own
    base: str | None = None  # the revision its worktree's branch starts from (default: HEAD)
    sandbox: AgentSandbox | None = None  # the agent's process under bubblewrap, or not
    check: str | None = None  # the command that judges a run that says it is done
    check_timeout: float | None = None  # how long the check may run (0: no bound)
    session: Session | None = None  # an attempt continues the agent's session, or starts fresh
    fresh: bool | None = None  # this loop's attempts start fresh (THIS_LOOP: never remembered)

    @classmethod
    def parse(
        cls,
        values: Mapping[str, Any],
        where: Callable[[str], str] = flag,
        blank_is_unset: bool = False,
    ) -> LoopOverrides:
        """From raw values (the CLI's strings, an API body's JSON) keyed by field name; a bad one
        is a UsageError naming it as `where(name)` says (an option, or a body key). A form's
        empty field is unset with `blank_is_unset`; on a command line it is an error."""
        known = {f.name for f in dataclasses.fields(cls)}
        unset = (None, "") if blank_is_unset else (None,)
        given = {k: v for k, v in values.items() if k in known and v not in unset}
        changes: dict[str, Any] = {}
        for name, value in given.items():
            if name in DURATIONS:
                changes[name] = parse_duration(value, where(name)) or 0.0
            elif name == "max_restarts":
                changes[name] = _count(value, where(name))
            elif name == "stuck_after":
                changes[name] = _count(value, where(name), "attempts")
            elif name == "budget":
                if isinstance(value, Budget):
                    changes[name] = value
                else:
                    parts = value.split(",") if isinstance(value, str) else value
                    if not isinstance(parts, list | tuple):
                        raise UsageError(f"{where(name)} {shown(value)} is not a budget")
                    changes[name] = parse_budget(parts, where(name))
            elif name == "until":
                changes[name] = _choice(value, where(name), Until)
            elif name == "working_dir":
                if not isinstance(value, str | Path) or "\0" in str(value):
                    raise UsageError(f"{where(name)} {shown(value)} is not a folder's path")
                changes[name] = Path(value)
            elif name == "worktree":
                changes[name] = _yes_no(value, where(name))
            elif name == "fresh":
                changes[name] = _yes_no(value, where(name)) or None  # false: as if not given
            elif name == "sandbox":
                changes[name] = _choice(value, where(name), AgentSandbox)
            elif name == "session":
                changes[name] = _choice(value, where(name), Session)
            elif name == "check":
                if not isinstance(value, str):
                    raise UsageError(f"{where(name)} {shown(value)} is not a command line")
                check_words(value, where(name))
                changes[name] = value.strip()
            elif isinstance(value, str) and value.strip() and value.isprintable():
                changes[name] = value
            elif isinstance(value, str) and value.strip():
                raise UsageError(f"{where(name)} {shown(value)} holds a control character")
            elif not isinstance(value, str):
                raise UsageError(f"{where(name)} {shown(value)} is not a name; give one as text")
            else:
                raise UsageError(
                    f"{where(name)} {shown(value)} is empty; name one, or leave it out"
                )
        if changes.get("fresh") and changes.get("session") is Session.CONTINUE:
            raise UsageError(
                f"{where('fresh')} and {where('session')} continue contradict each other; give one"
            )
        return cls(**changes)

    def apply(self, settings: LoopSettings) -> LoopSettings:
        """The loop settings with these overrides in place."""
        changes: dict[str, Any] = {}
        if self.max_restarts is not None:
            changes["max_restarts"] = self.max_restarts
        if self.restart_delay is not None:
            changes["restart_delay"] = self.restart_delay
        for name in ("timeout", "idle_timeout", "check_timeout"):
            value = getattr(self, name)
            if value is not None:
                changes[name] = value or None  # 0: off
        if self.until is not None:
            changes["until"] = self.until
        if self.stuck_after is not None:
            changes["stuck_after"] = self.stuck_after
        if self.budget is not None:
            changes["budget"] = self.budget
        if self.worktree is not None:
            changes["worktree"] = self.worktree
        if self.sandbox is not None:
            changes["sandbox"] = self.sandbox
        if self.check is not None:
            changes["check"] = self.check
        if self.session is not None:
            changes["session"] = self.session
        if self.fresh:
            changes["session"] = Session.FRESH
        return dataclasses.replace(settings, **changes)

    def merged(self, given: LoopOverrides) -> LoopOverrides:
        """These overrides with every one `given` sets put in their place."""
        changes = {f.name: getattr(given, f.name) for f in dataclasses.fields(given)}
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_record(self) -> dict[str, object]:
        """The overrides that are set, as plain values (for the task's task.yaml): those of
        this loop alone (THIS_LOOP) are not."""
        record: dict[str, object] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in THIS_LOOP:
                continue
            if isinstance(value, Budget):
                record[field.name] = value.to_args()
            elif value is not None:
                plain = isinstance(value, Path | Until | AgentSandbox | Session)
                record[field.name] = str(value) if plain else value
        return record

    @classmethod
    def remembered(cls, task: TaskPaths) -> LoopOverrides:
        """How the task was last started; nothing when it never was, or the record is bad.

        The record lies in the task's folder, which its agent writes: a sandbox it names may
        raise the config's, never lower it. `sandbox: none` is read as unset, which is the
        config's own (its owner lowers it again for a loop on the command line)."""
        try:
            found = cls.parse(taskfolder.read_task_settings(task))
        except RunAgentError:  # an edited or damaged record is not a reason to refuse a resume
            return cls()
        if found.sandbox is AgentSandbox.NONE:
            found = dataclasses.replace(found, sandbox=None)
        return dataclasses.replace(found, **dict.fromkeys(THIS_LOOP))  # never one to remember

    def to_args(self) -> list[str]:
        """The same overrides as `run-agent run` options, for a detached supervisor."""
        args: list[str] = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            option = "--cwd" if field.name == "working_dir" else flag(field.name)
            if field.name in THIS_LOOP:  # flags of this loop, given or not
                args += [option] if value else []
                continue
            if isinstance(value, bool):
                args.append(option if value else f"--no-{option.removeprefix('--')}")
                continue
            if isinstance(value, Budget):
                args += [arg for given in value.to_args() for arg in (option, given)]
                continue
            text = f"{value:g}" if isinstance(value, float) else str(value)
            args += [option, text]
        return args


def _count(value: object, where: str, what: str = "restarts") -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise UsageError(f"{where}: {shown(value)} is not a whole number of {what}")
    try:
        count = int(value)
    except ValueError:
        raise UsageError(f"{where}: {shown(value)} is not a whole number of {what}") from None
    if count < 0:
        raise UsageError(f"{where}: {count} is negative; give 0 or more {what}")
    return count


def _yes_no(value: object, where: str) -> bool:
    """A switch from JSON (true/false) or a form or record's text (true/false, yes/no, on/off)."""
    if isinstance(value, bool):
        return value
    words = {"true": True, "yes": True, "on": True, "1": True,
             "false": False, "no": False, "off": False, "0": False}  # fmt: skip
    if isinstance(value, str) and value.strip().lower() in words:
        return words[value.strip().lower()]
    raise UsageError(f"{where}: {shown(value)} is not true or false")


def _choice(value: object, where: str, kind: type[C]) -> C:
    """One of the enum `kind`'s values, else a UsageError naming them."""
    try:
        return kind(str(value))
    except ValueError:
        choices = ", ".join(str(c.value) for c in kind)
        raise UsageError(f"{where}: {shown(value)} is not one of {choices}") from None
