"""The exception root of run-agent: each class carries the exit code the command line returns and
the HTTP status the server answers with (as click's exceptions carry their exit code)."""

from __future__ import annotations

import enum
import json
import re


class ExitCode(enum.IntEnum):
    """The documented exit codes of `run-agent` (README, "Exit codes")."""

    COMPLETED = 0
    FAILED = 1
    USAGE = 2
    MISSING_DEPENDENCY = 3
    BUDGET = 4
    STUCK = 5
    BLOCKED = 6
    CONFLICT = 7
    ALREADY_RUNNING = 75
    TIMED_OUT = 124
    STOPPED = 130


class RunAgentError(Exception):
    """Root of every error run-agent raises on purpose.

    The message is one line that names the bad value and says what to do; `exit_code` is what
    the command line exits with when the error reaches it, `http_status` what the server answers
    (a subclass inherits both from its nearest base that sets them).
    """

    exit_code: ExitCode = ExitCode.FAILED
    http_status: int = 500  # not the client's doing: the server's own failure

    def __init__(self, message: str, *, exit_code: ExitCode | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(RunAgentError):
    """A bad argument, id or option value."""

    exit_code = ExitCode.USAGE
    http_status = 400


class ForbiddenError(UsageError):
    """A credential whose scope or projects do not reach what it asked for."""

    http_status = 403


class ConfigError(RunAgentError):
    """A bad config.yaml: the message carries the key path and the value."""

    exit_code = ExitCode.USAGE
    http_status = 400


class MissingDependencyError(RunAgentError):
    """An executable, file or credential the run needs is not there."""

    exit_code = ExitCode.MISSING_DEPENDENCY
    http_status = 424


class AlreadyRunningError(RunAgentError):
    """Another supervisor holds the task's lock."""

    exit_code = ExitCode.ALREADY_RUNNING
    http_status = 409


class NotFoundError(RunAgentError):
    """A project, task or run that does not exist."""

    exit_code = ExitCode.USAGE
    http_status = 404


class OutsideRootError(NotFoundError):
    """A path under the runs root leads out of it (a symbolic link): it is never read or written."""


class PromptConflictError(UsageError):
    """A task already exists with another prompt in its TASK.md."""

    http_status = 409  # the request is sound; the task is not in a state to take it


class AlreadyCompletedError(UsageError):
    """A completed task asked to run without being asked to run again."""

    http_status = 409  # the request is sound; the task is not in a state to take it


class DuplicateReplyError(UsageError):
    """A paste reply handed in again: the run would move it aside unapplied, so it is not saved."""

    http_status = 409  # the reply is sound; the run already has it


class StoppedError(RunAgentError):
    """A task left before it started: taken out of the queue (`stop`, Ctrl-C)."""

    exit_code = ExitCode.STOPPED
    http_status = 409


class BudgetError(RunAgentError):
    """A start refused because a daily budget (its project's, the root's) is spent."""

    exit_code = ExitCode.BUDGET
    http_status = 409


class BlockedError(RunAgentError):
    """A task waits for another that did not complete (failed, stopped, deleted)."""

    exit_code = ExitCode.BLOCKED
    http_status = 409


class DamagedRecordError(RunAgentError):
    """A record run-agent keeps for a task (its queue record) cannot be read: the task is shown
    as `unreadable` and left for a person, never dropped."""

    http_status = 503


class ConflictError(RunAgentError):
    """A merge refused: the branch conflicts, or uncommitted changes are in the way."""

    exit_code = ExitCode.CONFLICT
    http_status = 409


def error_for_exit(code: int, message: str) -> RunAgentError:
    """The error a run-agent process that exited `code` after saying `message` stands for, as
    the class of its exit code (so a caller can tell a refusal from a failure)."""
    for kind in (UsageError, MissingDependencyError, AlreadyRunningError):
        if code == kind.exit_code:
            return kind(message)
    try:
        return RunAgentError(message, exit_code=ExitCode(code))
    except ValueError:  # not one of ours (a signal, a crash): a plain failure
        return RunAgentError(message)


def shown(value: object, limit: int = 80) -> str:
    """`value` as a person reads it in one line, the way config.yaml and JSON write it, never as
    Python does: a string in quotes, `true`/`false`/`null`, numbers, `[a, "b c"]` and
    `{k: v}`; cut short (an error stays one readable line, whatever was sent). The one place an
    error, a status line or an example names a value given by a person or a program."""
    text = repr(str(value)) if isinstance(value, str) else _flow(value)
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-2:]}"


def spelled(value: object) -> str:
    """`value` after the label that names it (`budget 0.5usd 200000tokens`, `worktree true`):
    as `shown`, but its strings, and a list's, bare (a list of words is its words)."""
    if isinstance(value, str):
        return str(value)
    if isinstance(value, list | tuple):
        return " ".join(spelled(v) for v in value)
    return _flow(value)


# A string written bare inside a list or a mapping: a word no YAML reader takes for another type.
_BARE = re.compile(r"[A-Za-z0-9_./-][A-Za-z0-9_./@%+~-]*")
_NOT_BARE = frozenset(("y", "n", "yes", "no", "on", "off", "true", "false", "null"))


def _flow(value: object) -> str:
    """`value` in YAML's flow style (what `[a, b]` and `{k: v}` in config.yaml are)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"nan": ".nan", "inf": ".inf", "-inf": "-.inf"}[str(value)]
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, str):
        text = str(value)
        return text if _bare(text) else json.dumps(text, ensure_ascii=False)
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return "[" + ", ".join(_flow(v) for v in items) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_flow(k)}: {_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, enum.Enum):
        return _flow(value.value)
    return json.dumps(str(value), ensure_ascii=False)


def _bare(text: str) -> bool:
    """Whether `text` reads back as this very string when written without quotes."""
    if not _BARE.fullmatch(text) or text.lower() in _NOT_BARE or text == "-":
        return False
    if text.lower().lstrip("+-").startswith((".inf", ".nan", "0x", "0o", "0b")):
        return False
    try:
        float(text.replace("_", ""))
    except ValueError:
        return True
    return False  # a number
