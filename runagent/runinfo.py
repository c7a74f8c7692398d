"""What run-info.yaml records about one run: the closed sets of run status and reason, and the
RunInfo record itself (`runfolder` reads and writes it)."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

RUN_INFO_VERSION = 1


class RunStatus(enum.StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    STOPPED = "stopped"
    LOST = "lost"  # its supervisor died while it was running


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


@dataclass(frozen=True)
class Usage:
    """Tokens an agent's run read and wrote, and what it cost where the agent says."""

    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float | None = None

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


@dataclass(frozen=True)
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
        data = dataclasses.asdict(self)
        data["status"] = self.status.value
        data["reason"] = self.reason.value if self.reason else None
        order = ["version", "run_id", "project_id", "task_id", "attempt", "status"]
        data = {k: data[k] for k in order} | {k: v for k, v in data.items() if k not in order}
        return {k: v for k, v in data.items() if v is not None or k not in _GIT_FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunInfo:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["status"] = RunStatus(values.get("status", RunStatus.RUNNING))
        values["reason"] = _reason(values.get("reason"))
        return cls(**values)


_GIT_FIELDS = ("repo", "branch", "base_commit", "head_commit")  # written only when known


def _reason(value: Any) -> Reason | None:
    try:
        return Reason(value)
    except ValueError:  # none, or one a newer run-agent wrote
        return None
