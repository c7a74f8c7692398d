"""Controlling task loops from outside them: starting a detached supervisor, and stopping a loop.

A detached supervisor is a `run-agent` process in its own session, so it outlives whoever started
it (a server that restarts, a shell that closes); its own output goes to the task's
supervisor.log.
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

from runagent import runfolder
from runagent.errors import AlreadyRunningError, RunAgentError, error_for_exit
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
    return [*args, *overrides.to_args(), "--quiet"]


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
) -> Started:
    """Start `run-agent COMMAND` for `task` in its own session; return once it holds the lock.

    Raises AlreadyRunningError if another supervisor holds the task, and the error its exit code
    stands for (errors.error_for_exit), with the tail of supervisor.log, if the new one exits
    before taking the lock.
    """
    holder = live_holder(task.lock)
    if holder is not None:
        raise AlreadyRunningError(already_running(task.label, holder))
    runfolder.confine(task).folder.mkdir(parents=True, exist_ok=True)
    log = runfolder.supervisor_log_path(task)
    argv = loop_argv(command, task, overrides, config_path, schedule, again)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runagent", *argv],
            cwd=cwd,
            env=dict(env if env is not None else os.environ),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
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


def stop(task: TaskPaths, wait: float | None) -> Holder | None:
    """Ask the task's supervisor to stop its loop, and wait up to `wait` seconds for it to exit
    (None: do not wait).

    Returns the holder that was asked, or None if the task was not running. Raises
    RunAgentError if the supervisor is still alive after `wait`.
    """
    holder = live_holder(task.lock)
    if holder is None:
        return None
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
            f"the supervisor of {task.label} (pid {holder.pid}) did not stop "
            f"within {wait:g}s; it may still be stopping its agent"
        )
    return holder
