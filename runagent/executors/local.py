"""The local executor: a task's loop as a detached supervisor on this machine, a `run-agent`
process in its own session, so it outlives whoever started it (a server that restarts, a shell
that closes); its own output goes to the task's supervisor.log. The Ray executor starts the same
supervisor on its host through this module."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from runagent import python
from runagent.config.overrides import LoopOverrides
from runagent.errors import AlreadyRunningError, RunAgentError, error_for_exit
from runagent.record import record
from runagent.store import runfolder
from runagent.store.host import is_here
from runagent.store.lock import Holder, already_running, live_holder
from runagent.store.runfolder import TaskPaths

if TYPE_CHECKING:  # a queued start's place: loaded where there is a queue
    from runagent.fleet.queue import Turn

START_WAIT = 10.0  # seconds a detached start may take to take its lock or fail
# Seconds a person's detached start (the command line, the page and API, MCP) is waited for
# while its process lives and has not taken its lock: a loaded machine can take many seconds to
# start an interpreter, and a start that says "started" before it holds its task lets a second
# start of the task through. One that exits first is an error at once. The keeper and a
# schedule's firing wait only START_WAIT (each works under a lock others wait on); the keeper
# keeps a slower start's claim and slot while it lives.
LOCK_WAIT = 120.0
CLUSTER_ENV = "RUN_AGENT_CLUSTER"  # what a host agent of a cluster tells its loops (ray/slot)


@record
class Started:
    """A detached start, as its starter sees it: the loop's process and its lock's holder, or
    its place in the queue."""

    pid: int  # 0: not started yet, but queued
    holder: Holder | None
    queued: Turn | None = None  # where it waits, when it waits in the queue
    # The supervisor's process, to the one that started it (an executor's host agent waits on
    # it for the loop's exit code); never compared nor shown.
    process: Child | None = field(default=None, compare=False, repr=False)


def loop_argv(
    command: str,
    task: TaskPaths,
    overrides: LoopOverrides,
    config_path: Path | None,
    schedule: str | None = None,
    again: bool = False,
    on: str = "local",
) -> list[str]:
    """The one command line of a detached loop: `run-agent COMMAND` for `task` under its root,
    run where it is started (`on` another executor: that command line hands it there)."""
    args = [command, "--project", task.project_id, "--task", task.task_id, "--root",
            str(task.root)]  # fmt: skip
    if config_path is not None:
        args += ["--config", str(config_path.resolve())]
    if schedule is not None:
        args += ["--schedule", schedule]
    if again:
        args.append("--again")
    # The loop runs where this command line says, whatever executor the config names; there in
    # the foreground (its supervisor's words, event lines included, go to supervisor.log), or,
    # handed on to another executor, detached there.
    tail = ["--executor", on] if on == "local" else ["--detach", "--executor", on]
    # Admitted here, by the door that builds this line: never again where it runs.
    return [*args, *overrides.to_args(), "--admitted", *tail]


def start_local(
    task: TaskPaths,
    argv: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    wait: float = LOCK_WAIT,
    die_with_parent: bool = False,
    fork: Fork | None = None,
) -> Started:
    """Start `run-agent ARGV` for `task` in its own session on this machine (forked by `fork`
    where one is given and can); return once it holds the lock. With `die_with_parent`, the
    kernel kills it (and so, through its reaper, its agent's tree) when the thread that started
    it ends: an executor's worker that is killed leaves nothing behind."""
    return await_lock(task, spawn_local(task, argv, cwd, env, die_with_parent, fork), wait)


class Child(Protocol):
    """A supervisor's process as its starter waits on it: a Popen, or one a fork server made."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


# Forks `run-agent ARGV` in FOLDER with ENV, its output appended to LOG (forkserver.py);
# OSError if it cannot.
Fork = Callable[[list[str], Path, Mapping[str, str], Path], Child]


def spawn_local(
    task: TaskPaths,
    argv: list[str],
    cwd: Path,
    env: Mapping[str, str] | None = None,
    die_with_parent: bool = False,
    fork: Fork | None = None,
) -> Child:
    """The supervisor's process, started (refused if another holds the task): forked by `fork`
    where one is given and can, else a new interpreter. The kernel's parent-death signal
    follows the *thread* that forks: an executor that wants it calls this from a thread that
    lives as long as it does."""
    holder = live_holder(task.lock)
    if holder is not None:
        raise AlreadyRunningError(already_running(task.label, holder))
    runfolder.make_task_folder(task)
    log = runfolder.supervisor_log_path(task)
    if fork is not None:
        try:
            return fork(argv, cwd, dict(env if env is not None else os.environ), log)
        except OSError:
            pass  # started as a new interpreter instead
    with open(log, "ab", opener=runfolder.private) as out:
        return subprocess.Popen(
            python("-m", "runagent", *argv),
            cwd=cwd,
            env=dict(env if env is not None else os.environ),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            preexec_fn=_die_with_parent if die_with_parent else None,
        )


def await_lock(task: TaskPaths, proc: Child, wait: float) -> Started:
    """Wait for a started supervisor to take the task's lock; the error its exit code stands
    for, with its last word in supervisor.log, if it exits first."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        holder = live_holder(task.lock)
        if holder is not None and holder.pid == proc.pid:
            return Started(proc.pid, holder, process=proc)
        code = proc.poll()
        if code is not None:
            tail = runfolder.tail(runfolder.supervisor_log_path(task), 600).strip().splitlines()
            why = tail[-1].removeprefix("run-agent: ") if tail else f"exit code {code}"
            raise error_for_exit(code, why)
        time.sleep(0.02)
    return Started(proc.pid, None, process=proc)


def _die_with_parent() -> None:
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


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
