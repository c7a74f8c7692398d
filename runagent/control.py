"""Controlling task loops from outside them: the one door through which a loop is started and
stopped, whatever executor runs it.

The `local` executor starts a detached supervisor: a `run-agent` process in its own session, so
it outlives whoever started it (a server that restarts, a shell that closes); its own output goes
to the task's supervisor.log. The `ray` executor (rayexecutor.py, imported only when configured)
starts the same supervisor inside a named actor on a host of a Ray cluster. The command line, the
schedules and the server call `start_detached` and `stop` here and never ask which one runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from runagent import host, runfolder
from runagent.config import ExecutorSettings, ExecutorType
from runagent.errors import (
    AlreadyRunningError,
    MissingDependencyError,
    RunAgentError,
    error_for_exit,
)
from runagent.host import is_here
from runagent.lock import Holder, already_running, live_holder
from runagent.overrides import LoopOverrides
from runagent.runfolder import TaskPaths

START_WAIT = 10.0  # seconds a detached start may take to take its lock or fail


@dataclass(frozen=True)
class Started:
    pid: int
    holder: Holder | None


def loop_argv(
    command: str,
    task: TaskPaths,
    overrides: LoopOverrides,
    config_path: Path | None,
    schedule: str | None = None,
    again: bool = False,
) -> list[str]:
    """The one command line of a detached loop: `run-agent COMMAND` for `task` under its root."""
    args = [command, "--project", task.project_id, "--task", task.task_id, "--root",
            str(task.root)]  # fmt: skip
    if config_path is not None:
        args += ["--config", str(config_path.resolve())]
    if schedule is not None:
        args += ["--schedule", schedule]
    if again:
        args.append("--again")
    # The loop runs where this command line is started, whatever executor the config names.
    return [*args, *overrides.to_args(), "--executor", "local", "--quiet"]


def start_detached(
    task: TaskPaths,
    command: str,
    overrides: LoopOverrides,
    *,
    config_path: Path | None,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    schedule: str | None = None,
    again: bool = False,
    wait: float = START_WAIT,
    executor: ExecutorSettings | None = None,
) -> Started:
    """Start `run-agent COMMAND` for `task` on `executor` (None: this machine); return once its
    supervisor holds the task.

    Raises AlreadyRunningError if another supervisor holds the task (naming its host when that
    is another), and the error its exit code stands for (errors.error_for_exit), with the tail
    of supervisor.log, if the new one exits before taking the lock.
    """
    if executor is not None and executor.type is ExecutorType.RAY:
        return ray_executor(executor).start(
            task, command, overrides, config_path=config_path, cwd=cwd, schedule=schedule,
            again=again, wait=wait,
        )  # fmt: skip
    argv = loop_argv(command, task, overrides, config_path, schedule, again)
    return start_local(task, argv, cwd=cwd, env=env, wait=wait)


def start_local(
    task: TaskPaths,
    argv: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    wait: float = START_WAIT,
    die_with_parent: bool = False,
) -> Started:
    """Start `run-agent ARGV` for `task` in its own session on this machine; return once it
    holds the lock. With `die_with_parent`, the kernel kills it (and so, through its reaper, its
    agent's tree) when the process that started it dies: an executor's worker that is killed
    leaves nothing behind."""
    holder = live_holder(task.lock)
    if holder is not None:
        raise AlreadyRunningError(already_running(task.label, holder))
    runfolder.confine(task).folder.mkdir(parents=True, exist_ok=True)
    log = runfolder.supervisor_log_path(task)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runagent", *argv],
            cwd=cwd,
            env=dict(env if env is not None else os.environ),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            preexec_fn=_die_with_parent if die_with_parent else None,
        )
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        holder = live_holder(task.lock)
        if holder is not None and holder.pid == proc.pid:
            return Started(proc.pid, holder)
        code = proc.poll()
        if code is not None:
            tail = runfolder.tail(log, 600).strip().splitlines()
            why = tail[-1].removeprefix("run-agent: ") if tail else f"exit code {code}"
            raise error_for_exit(code, why)
        time.sleep(0.02)
    return Started(proc.pid, None)


def _die_with_parent() -> None:
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def stop(
    task: TaskPaths, wait: float | None, executor: ExecutorSettings | None = None
) -> Holder | None:
    """Ask the task's supervisor to stop its loop, and wait up to `wait` seconds for it to exit
    (None: do not wait). Its agent's tree is killed by run-agent's own reaper, on whatever host.

    Returns the holder that was asked, or None if the task was not running. Raises
    RunAgentError if the supervisor is still alive after `wait`.
    """
    if executor is not None and executor.type is ExecutorType.RAY:
        asked = ray_executor(executor).stop(task, wait)
        if asked is not None:
            return asked
    return stop_local(task, wait)


def stop_local(task: TaskPaths, wait: float | None) -> Holder | None:
    """`stop` for a supervisor on this machine."""
    holder = live_holder(task.lock)
    if holder is None:
        return None
    if not is_here(holder.host):
        raise RunAgentError(
            f"task {task.label} runs on host {holder.host}, which this machine cannot signal; "
            "stop it with --executor ray (or executor.type: ray in config.yaml)"
        )
    try:
        os.kill(holder.pid, signal.SIGTERM)
    except ProcessLookupError:
        return None
    if wait is None:
        return holder
    deadline = time.monotonic() + wait
    while holder.alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    if holder.alive():
        raise RunAgentError(
            f"the supervisor of {task.label} ({holder.describe()}) did not stop "
            f"within {wait:g}s; it may still be stopping its agent"
        )
    return holder


class Executor(Protocol):
    """What runs task loops elsewhere than in a detached supervisor on this machine."""

    def start(
        self, task: TaskPaths, command: str, overrides: LoopOverrides, *,
        config_path: Path | None, cwd: Path, schedule: str | None, again: bool, wait: float,
    ) -> Started: ...  # fmt: skip

    def stop(self, task: TaskPaths, wait: float | None) -> Holder | None: ...

    def hold_name(self, name: str) -> bool: ...

    def read(self, task: TaskPaths, relative: str, offset: int, limit: int) -> bytes: ...

    def receive_runs(self, root: Path) -> None: ...

    def judge(self, label: str, on: str, pid: int, start: float | None) -> bool: ...


def ray_executor(settings: ExecutorSettings) -> Executor:
    """The Ray executor for `settings`, connected; MissingDependencyError saying how to install
    the extra when Ray is not installed. Ray is imported here only: it costs a second."""
    try:
        from runagent import rayexecutor
    except ImportError as exc:
        if exc.name is None or not exc.name.startswith("ray"):
            raise
        raise MissingDependencyError(
            "executor 'ray' needs Ray, which is not installed; install it with "
            "pip install 'run-agent[ray]', or use --executor local"
        ) from None
    return rayexecutor.connect(settings)


def hold_scheduler(executor: ExecutorSettings | None) -> bool:
    """Whether this process may fire schedules: always on this machine; on a cluster only the
    one process that holds the cluster-wide scheduler name (held until the process ends)."""
    if executor is None or executor.type is not ExecutorType.RAY:
        return True
    return ray_executor(executor).hold_name(SCHEDULER_NAME)


SCHEDULER_NAME = "scheduler"


def judge_foreign_hosts(executor: ExecutorSettings) -> None:
    """Have supervisors on other hosts judged alive by the cluster, which is joined only when
    one is first met (a listing of local tasks never pays for Ray)."""

    def judge(label: str, on: str, pid: int, start: float | None) -> bool:
        try:
            cluster = ray_executor(executor)
        except RunAgentError:  # no cluster to ask: a run is never called lost on a guess
            return True
        return cluster.judge(label, on, pid, start)

    host.set_judge(judge)
