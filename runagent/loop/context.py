"""What a loop and each of its runs start from (LoopRequest, RunContext), the rules for ids and
prompts, and the environment an agent is given."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from dataclasses import field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from runagent.config.settings import BudgetSettings, LoopSettings
from runagent.errors import UsageError
from runagent.record import record
from runagent.store.ids import MAX_ID_LENGTH as MAX_ID_LENGTH
from runagent.store.ids import validate_id as validate_id
from runagent.store.runfolder import RunPaths, TaskPaths

if TYPE_CHECKING:  # only named in annotations: a listing validates ids without git's modules
    from runagent.issues.issue import Issue
    from runagent.issues.repository import Checkout
    from runagent.issues.worktree import Tree


# Variables of the contract between run-agent and the agents it starts.
CONTRACT_VARIABLES = (
    "TASK_FOLDER",
    "RUN_FOLDER",
    "JRUN_PROJECT_ID",
    "JRUN_TASK_ID",
    "JRUN_ID",
    "JRUN_PARENT_ID",
    "JRUN_RUNS_DIR",
)


# Set by whoever starts a loop whose start waited in a queue (the keeper, a cluster's host
# agent): when it was queued. The loop takes it out of what its agents get.
QUEUED_SINCE = "RUN_AGENT_QUEUED_SINCE"
# Set by the queue's keeper: the ticket of its claim on the start (fleet/queue.py, `starting/`),
# which the loop takes off as it takes the start over. Not passed on to agents either.
START_TICKET = "RUN_AGENT_START_TICKET"


@record
class LoopRequest:
    """Everything one loop needs besides its backend; each run's RunContext is made from it."""

    task: TaskPaths
    prompt: str
    agent_name: str
    working_dir: Path
    settings: LoopSettings
    base_env: Mapping[str, str] = field(default_factory=dict)
    parent_run_id: str | None = None
    executable_dir: Path | None = None
    # How the task was started (agent, working folder, overrides), written beside TASK.md once
    # the loop holds the lock, so that a resume runs it the same way.
    started_with: Mapping[str, object] = field(default_factory=dict)
    # The git checkout the loop works in and the base it started from (an issue run); None
    # lets a rule that reads commits record the working folder's HEAD as the base.
    checkout: Checkout | None = None
    # Variables the loop adds for its agent beside the contract.
    loop_env: Mapping[str, str] = field(default_factory=dict)
    # A loop in a worktree of its own (an issue run, or a run with --worktree): made or reused
    # and locked once the loop holds the task; `working_dir` is in it.
    worktree: Tree | None = None
    # An issue run (in its worktree): its agent gets the COCODE_* variables.
    issue: Issue | None = None
    # What may be spent in a day by the task's project and by the whole root (config `budgets:`).
    budgets: BudgetSettings | None = None
    # When its start was put in a queue it then waited in (UTC, ISO 8601); None: it did not wait.
    queued_since: str | None = None
    # Files that decide what runs on the host (the config file the loop was started with): a
    # sandboxed agent sees them read-only wherever they lie (loop/sandbox.py).
    control: tuple[Path, ...] = ()


@record
class RunContext:
    """Everything a backend needs to launch one run of an agent.

    The protocol's eight fields are all here: `project_id` and `task_id` are read from `task`,
    `stdout_path` and `stderr_path` from `paths`, so each is stated once.
    """

    run_id: str
    task: TaskPaths
    prompt: str
    working_dir: Path
    paths: RunPaths
    environment: Mapping[str, str]
    # The agent's session this run resumes (an earlier run's `session_id`); None: a new one.
    session: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "environment", MappingProxyType(dict(self.environment)))

    @property
    def project_id(self) -> str:
        return self.task.project_id

    @property
    def task_id(self) -> str:
        return self.task.task_id

    @property
    def stdout_path(self) -> Path:
        return self.paths.stdout

    @property
    def stderr_path(self) -> Path:
        return self.paths.stderr

    @property
    def run_folder(self) -> Path:
        return self.paths.folder

    @property
    def task_folder(self) -> Path:
        return self.task.folder

    @property
    def prompt_file(self) -> Path:
        return self.paths.prompt


def parent_run_id(env: Mapping[str, str]) -> str | None:
    """The run that started this one: an agent starting a sub-run has JRUN_ID set."""
    return env.get("JRUN_ID") or None


def validate_prompt(text: str, source: str) -> str:
    """`text` if it can be a prompt (text, not blank); else a UsageError naming `source`."""
    if not text.strip():
        raise UsageError(f"{source} is empty; say what the agent should do")
    if "\0" in text:
        raise UsageError(
            f"{source} contains a NUL byte (at character {text.index(chr(0))}); "
            "a prompt is text: remove it"
        )
    return text


# The run id's one format: what RunIdClock writes.
RUN_ID = re.compile(r"\d{8}-\d{9}-\d+")
# conductor-loop's, whose runs run-agent reads: its runner's `YYYYMMDD-HHMMSS0000-PID-SEQ`, and
# the `-N` os.MkdirTemp adds where that folder was taken.
CONDUCTOR_RUN_ID = re.compile(r"\d{8}-\d{10}-\d+-\d+(?:-\d+)?")


def is_run_id(text: str) -> bool:
    """Whether `text` has the form RunIdClock gives, or conductor-loop's runner (so it names
    no other path): what a run id from outside must match."""
    return RUN_ID.fullmatch(text) is not None or CONDUCTOR_RUN_ID.fullmatch(text) is not None


class RunIdClock:
    """Issues run ids `YYYYMMDD-HHMMSSmmm-PID` (UTC) that sort in start order and never repeat.

    Two ids asked for in the same millisecond by one process get consecutive milliseconds, so the
    format stays fixed and the order stays true; other processes differ by their pid.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = 0

    def next_id(self, now: datetime | None = None) -> str:
        moment = now or datetime.now(UTC)
        with self._lock:
            ms = max(int(moment.timestamp() * 1000), self._last_ms + 1)
            self._last_ms = ms
        stamp = datetime.fromtimestamp(ms / 1000, UTC)
        return f"{stamp:%Y%m%d-%H%M%S}{ms % 1000:03d}-{os.getpid()}"


_clock = RunIdClock()


def new_run_id() -> str:
    return _clock.next_id()


def new_task_id(now: datetime | None = None) -> str:
    """A fresh task id for a run started without `--task`: `task-YYYYMMDD-HHMMSS-xxxxxxxx`."""
    moment = now or datetime.now(UTC)
    return f"task-{moment:%Y%m%d-%H%M%S}-{os.urandom(4).hex()}"


def agent_environment(
    *,
    base: Mapping[str, str],
    agent_env: Mapping[str, str],
    loop_env: Mapping[str, str] = MappingProxyType({}),
    task: TaskPaths,
    paths: RunPaths,
    run_id: str,
    parent_run_id: str | None,
    executable_dir: Path | None,
) -> dict[str, str]:
    """The environment of one run: the caller's, the agent's configured one, the loop's own
    (`loop_env`: an issue's COCODE_* variables, the ready marker), then the contract.

    The contract variables always win, so an agent never sees a stale id inherited from a parent
    run-agent; the run-agent executable's folder leads PATH, so an agent can start sub-runs.
    """
    env = {k: v for k, v in base.items() if k not in CONTRACT_VARIABLES}
    env.update(agent_env)
    env.update(loop_env)
    env.update(
        TASK_FOLDER=str(task.folder),
        RUN_FOLDER=str(paths.folder),
        JRUN_PROJECT_ID=task.project_id,
        JRUN_TASK_ID=task.task_id,
        JRUN_ID=run_id,
        JRUN_RUNS_DIR=str(task.root),
    )
    if parent_run_id:
        env["JRUN_PARENT_ID"] = parent_run_id
    if executable_dir is not None:
        parts = [p for p in env.get("PATH", os.defpath).split(os.pathsep) if p]
        folder = str(executable_dir)
        env["PATH"] = os.pathsep.join([folder, *(p for p in parts if p != folder)])
    return env
