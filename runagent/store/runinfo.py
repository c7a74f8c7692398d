"""What run-info.yaml records about one run: the closed sets of run status and reason, and the
RunInfo record itself (`runfolder` reads and writes it)."""

from __future__ import annotations

import dataclasses
import enum
import functools
from datetime import datetime
from typing import Any

from runagent.errors import shown
from runagent.record import record

RUN_INFO_VERSION = 1


class RunStatus(enum.StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    STOPPED = "stopped"
    LOST = "lost"  # its supervisor died while it was running
    # A reader's verdict, never written: run-info.yaml cannot be read (the message says why).
    UNREADABLE = "unreadable"


class Reason(enum.StrEnum):
    """Why a run ended the way it did (`reason` in run-info.yaml)."""

    EXITED = "exited"  # exit code 0
    DONE_FILE = "done_file"  # the agent wrote DONE
    EXIT_CODE = "exit_code"  # a non-zero exit code
    NO_DONE_FILE = "no_done_file"  # exit 0 under --until done-file, but no DONE
    READY_MARKER = "ready_marker"  # a commit since the base carries the ready marker
    NO_READY_MARKER = "no_ready_marker"  # exit 0 under --until ready-marker, but no such commit
    CRASH = "crash"  # killed by a signal run-agent did not send
    RATE_LIMIT = "rate_limit"  # the model provider's rate or usage limit
    AUTH = "auth"  # credentials missing or refused
    API_ERROR = "api_error"  # the model provider answered with an error
    TIMEOUT = "timeout"
    IDLE_TIMEOUT = "idle_timeout"
    STOPPED = "stopped"
    MISSING_BINARY = "missing_binary"
    SPAWN_ERROR = "spawn_error"
    SUPERVISOR_LOST = "supervisor_lost"
    WRITE_ERROR = "write_error"  # run-agent could not write a file of the run (a full disk)
    STUCK = "stuck"  # the last of attempts in a row without progress; the loop stopped there
    BUDGET = "budget"  # the run crossed a budget (its message says which, and how much of what)
    CHECK_FAILED = "check_failed"  # it said it was done, and the task's check did not pass
    # it said it was done, and a `run-agent rebase`'s conflicts were left unresolved
    UNRESOLVED_CONFLICT = "unresolved_conflict"
    LOST_RACE = "lost_race"  # stopped because another racer of its race completed first
    STEERED = "steered"  # ended for a person's message sent with --now; the next attempt has it


@record
class Usage:
    """Tokens an agent's run read and wrote, and what it cost where the agent says."""

    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float | None = None

    @property
    def tokens(self) -> int:
        """Read and written: what a token budget counts."""
        return self.tokens_in + self.tokens_out

    def __add__(self, other: Usage) -> Usage:
        costs = [c for c in (self.cost_usd, other.cost_usd) if c is not None]
        return Usage(
            self.tokens_in + other.tokens_in,
            self.tokens_out + other.tokens_out,
            sum(costs) if costs else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return {"tokens_in": self.tokens_in, "tokens_out": self.tokens_out,
                "cost_usd": self.cost_usd}  # fmt: skip


@record
class RunInfo:
    """The metadata of one run, as stored in run-info.yaml."""

    run_id: str
    project_id: str
    task_id: str
    attempt: int
    agent: str
    backend: str
    start_time: str
    cwd: str
    status: RunStatus = RunStatus.RUNNING
    previous_run_id: str | None = None
    parent_run_id: str | None = None
    agent_version: str | None = None
    pid: int | None = None
    pgid: int | None = None
    supervisor_pid: int | None = None
    supervisor_start: float | None = None
    host: str | None = None  # the host its supervisor ran on
    end_time: str | None = None
    exit_code: int | None = None
    reason: Reason | None = None
    message: str | None = None
    commandline: str | None = None
    # The highest attempt number the run's loop may reach (its first + max_restarts).
    last_attempt: int | None = None
    # What the run used, where the agent's stream says (None: it does not).
    tokens_in: int | None = None
    tokens_out: int | None = None
    cost_usd: float | None = None
    # Of a run in a git checkout (an issue run, or one completed by a ready marker).
    repo: str | None = None
    branch: str | None = None
    base_commit: str | None = None
    head_commit: str | None = None
    # Of the first run of a loop whose start waited in a queue (for a slot under `limits:`, for
    # the tasks it runs after, or in a Ray cluster's queue): seconds from its queueing to this.
    queued_seconds: float | None = None
    # Of a run the task's check judged (it said it was done): the command, its exit code (as a
    # shell says it: 127 not found, 128+N killed by signal N), and how long it took, in seconds.
    check_command: str | None = None
    check_exit_code: int | None = None
    check_seconds: float | None = None
    # The agent's own session (conversation) id, from its events, where its CLI resumes one by
    # id: the next attempt of the task continues it (`session: continue`).
    session_id: str | None = None
    # Of a run that resumed an earlier run's session: that run.
    resumed_run_id: str | None = None
    version: int = RUN_INFO_VERSION

    def replace(self, **changes: Any) -> RunInfo:
        return dataclasses.replace(self, **changes)

    @property
    def usage(self) -> Usage | None:
        """What the run used, if its agent said."""
        if self.tokens_in is None and self.tokens_out is None and self.cost_usd is None:
            return None
        return Usage(self.tokens_in or 0, self.tokens_out or 0, self.cost_usd)

    def describe(self) -> str:
        """How the run ended, in words: its message, else its status and exit code."""
        return self.message or f"ended {self.status.value} with exit code {self.exit_code}"

    def to_dict(self) -> dict[str, Any]:
        # Every field is a plain value: read one by one (asdict deep-copies each, and a listing
        # of a thousand tasks asks a thousand records).
        data = {name: getattr(self, name) for name in _in_order()}
        data["status"] = self.status.value
        data["reason"] = self.reason.value if self.reason else None
        return {k: v for k, v in data.items() if v is not None or k not in _WHEN_KNOWN}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunInfo:
        """The record `data` holds, as run-agent writes it or as conductor-loop does (which has
        no attempt, backend, reason or message, and whose reconciler rewrites a run-agent run
        without them). ValueError says which field is wrong, and how."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values = _defaults(values, data.get("error_summary"))
        _check_types(values)
        values["status"] = _status(values.get("status", RunStatus.RUNNING))
        values["reason"] = _reason(values.get("reason"))
        if values["status"] is RunStatus.RUNNING:
            values["exit_code"] = None  # conductor-loop's int field holds a placeholder
        return cls(**values)


@functools.cache
def _in_order() -> tuple[str, ...]:
    """RunInfo's fields in the order a record is written: who it is first, then as declared."""
    first = ("version", "run_id", "project_id", "task_id", "attempt", "status")
    return first + tuple(f.name for f in dataclasses.fields(RunInfo) if f.name not in first)


def trusted(data: dict[str, Any]) -> RunInfo:
    """The record `data` holds as this program wrote it (`RunInfo.to_dict`, kept by the root's
    index), without the checks a file's record goes through."""
    reason = data.get("reason")
    return RunInfo(**{**data, "status": RunStatus(data["status"]),
                      "reason": Reason(reason) if reason else None})  # fmt: skip


# Written only when known: a run's git checkout, how long its loop's start waited, its check,
# its agent's session.
_WHEN_KNOWN = ("repo", "branch", "base_commit", "head_commit", "queued_seconds", "check_command",
               "check_exit_code", "check_seconds", "session_id", "resumed_run_id")  # fmt: skip


# conductor-loop writes Go's zero time as the end of a running run, and 0 for a pid it lacks.
_ZERO_TIME = "0001-01-01"


def _defaults(values: dict[str, Any], error_summary: Any) -> dict[str, Any]:
    """What conductor-loop's struct does not write, filled in: its agent type is the backend
    (the same names), its error_summary the message; its timestamps as text."""
    values = dict(values)
    values.setdefault("attempt", 1)
    values.setdefault("backend", values.get("agent"))
    values.setdefault("cwd", "")
    if values.get("message") is None and isinstance(error_summary, str) and error_summary:
        values["message"] = error_summary
    for key in ("start_time", "end_time"):
        value = values.get(key)
        if isinstance(value, datetime):  # YAML reads an unquoted timestamp as one
            value = value.isoformat()
        if isinstance(value, str) and value.startswith(_ZERO_TIME):
            value = None
        values[key] = value
    values["start_time"] = values["start_time"] or ""
    for key in ("pid", "pgid"):
        if values.get(key) == 0:
            values[key] = None
    return values


_KINDS: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "str": (str,)}


def _check_types(values: dict[str, Any]) -> None:
    """ValueError naming the first field whose value is not of its type."""
    for f in dataclasses.fields(RunInfo):
        value = values.get(f.name)
        kind = str(f.type).split(" |")[0]
        if value is None or kind not in _KINDS:
            continue
        if isinstance(value, bool) or not isinstance(value, _KINDS[kind]):
            raise ValueError(
                f"{f.name} is {shown(value)}, not {'an' if kind == 'int' else 'a'} {kind}"
            )


def _status(value: Any) -> RunStatus:
    try:
        status = RunStatus(value)
    except ValueError:
        status = RunStatus.UNREADABLE
    if status is RunStatus.UNREADABLE:  # conductor-loop's `unknown`, or a newer one's value
        known = ", ".join(s.value for s in RunStatus if s is not RunStatus.UNREADABLE)
        raise ValueError(f"status {shown(value)} is none run-agent knows ({known})")
    return status


def _reason(value: Any) -> Reason | None:
    try:
        return Reason(value)
    except ValueError:  # none, or one a newer run-agent wrote
        return None
