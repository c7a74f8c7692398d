"""The task's check: a command (`--check`, `check:`) that judges a run which says it is done.

It runs in the task's working folder (its worktree where it has one), under the same sandbox as
the agent when the agent runs in one (never on the host then: a check runs the repository's
code, which the agent wrote), with a timeout of its own (`check_timeout`) after which its whole
process tree is stopped as an agent's is (runagent/process.py: its reaper, SIGTERM, the grace,
SIGKILL). Its stdout and stderr both go to one file (the run's check.txt). Exit 0 passes;
anything else fails the run (`check_failed`, the loop's business). The command is split into
words as a shell splits them and run without a shell (`check_words`).

What it is given: the environment the loop was started with and the task's variables
(TASK_FOLDER, JRUN_*; RUN_FOLDER in a run), not the agent's own `env:` (its keys are the agent's).
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from runagent.config.settings import check_words
from runagent.errors import MissingDependencyError
from runagent.process import AgentProcess, LaunchSpec, SpawnError, resolve_executable
from runagent.record import record
from runagent.store import runfolder

if TYPE_CHECKING:
    from runagent.loop.sandbox import Reach

OUTPUT_TAIL = 3000  # bytes of its output a failed check's next prompt carries


class Stop(Protocol):
    """A stop request a check gives way to (the loop's StopSignal)."""

    requested: bool

    def fileno(self) -> int: ...

    def drain(self) -> None: ...


class Starter(Protocol):
    """How a process is started under its reaper: `AgentProcess.start`, or one of its shape."""

    def __call__(
        self, spec: LaunchSpec, stdout: Path, stderr: Path, *, grace: float
    ) -> AgentProcess: ...


@record
class Check:
    """A check as a loop runs it: the command line, its timeout (None: none) and the grace its
    tree gets between SIGTERM and SIGKILL."""

    command: str
    timeout: float | None = None
    grace: float = 5.0
    words: tuple[str, ...] = ()  # its words as given (a command of run-agent's, not a check's)

    @property
    def argv(self) -> tuple[str, ...]:
        return self.words or check_words(self.command, "--check")


@record
class Result:
    """How a check ended: its exit code as a shell says it (127 not found, 128+N killed by
    signal N), how long it took, and whether run-agent ended it (its timeout, a stop)."""

    command: str
    exit_code: int
    seconds: float
    timed_out: bool = False
    stopped: bool = False
    unstarted: str = ""  # why it could not be started at all, in words

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and not (self.timed_out or self.stopped or self.unstarted)

    def words(self, timeout: float | None = None) -> str:
        """check `pytest -q` passed in 1.25s; ... failed: exited with code 1; ..."""
        head = f"check `{self.command}`"
        if self.unstarted:
            return f"{head} cannot run: {self.unstarted}"
        if self.passed:
            return f"{head} passed in {self.seconds:.2f}s"
        if self.stopped:
            return f"{head} stopped on request"
        if self.timed_out:
            bound = f" {timeout:g}s" if timeout else ""
            return f"{head} failed: ran longer than check_timeout{bound}"
        if self.exit_code > 128:
            return f"{head} failed: killed by signal {self.exit_code - 128}"
        return f"{head} failed: exited with code {self.exit_code}"


def unrunnable(command: str, folder: Path, env: Mapping[str, str]) -> str | None:
    """Why the check's program cannot be started from `folder` with `env`'s PATH, in words; None
    when it can. (A name is looked for on PATH; a path with a slash, from `folder`.)"""
    program = check_words(command, "--check")[0]
    if resolve_executable(program, env, folder) is not None:
        return None
    if os.sep not in program:
        return f"{program!r} is not found on PATH"
    path = Path(program) if os.path.isabs(program) else folder / program
    if path.is_dir():
        return f"{str(path)!r} is a folder"
    if path.exists():
        return f"{str(path)!r} is not executable"
    return f"{str(path)!r} does not exist"


def refuse_unrunnable(command: str, folder: Path, env: Mapping[str, str]) -> None:
    """MissingDependencyError in one line naming the command, unless its program can start."""
    why = unrunnable(command, folder, env)
    if why is not None:
        raise MissingDependencyError(
            f"check `{command}` cannot run: {why}; install it, or give --check a command that "
            "runs here"
        )


def run(
    check: Check,
    *,
    cwd: Path,
    env: Mapping[str, str],
    output: Path,
    stop: Stop | None = None,
    reach: Reach | None = None,
    start: Starter = AgentProcess.start,
    clock: Callable[[], float] = time.monotonic,
) -> Result:
    """Run the check once in `cwd` (under bubblewrap with `reach` when given), its output in
    `output`, until it exits, its timeout passes or `stop` is requested; its tree is stopped
    whole either way."""
    spec = LaunchSpec(argv=check.argv, env=dict(env), cwd=cwd)
    if reach is not None:
        from runagent.loop import sandbox

        spec = sandbox.wrap(spec, reach)
    started = clock()
    try:
        process = start(spec, output, output, grace=check.grace)
    except SpawnError as exc:
        _note(output, str(exc))
        return Result(check.command, exc.code, clock() - started, unstarted=str(exc))
    try:
        code, why = _wait(process, check, stop, started, clock)
    finally:
        process.close()
    seconds = clock() - started
    if why:
        _note(output, f"check {why} after {seconds:.1f}s; its processes were stopped")
    return Result(check.command, code, seconds, why == "timed out", why == "stopped")


def _wait(
    process: AgentProcess, check: Check, stop: Stop | None, started: float,
    clock: Callable[[], float],
) -> tuple[int, str]:  # fmt: skip
    """Its exit code, and '' or why run-agent ended it ("timed out", "stopped")."""
    deadline = started + check.timeout if check.timeout else None
    watched = [process.fileno()] + ([stop.fileno()] if stop is not None else [])
    while True:
        if stop is not None and stop.requested:
            return process.stop(check.grace), "stopped"
        wait = None if deadline is None else max(0.0, deadline - clock())
        ready, _, _ = select.select(watched, [], [], wait)
        if stop is not None and stop.fileno() in ready:
            stop.drain()
        if process.fileno() in ready:
            code = process.wait(0)
            if code is not None:
                return code, ""
        if deadline is not None and clock() >= deadline:
            return process.stop(check.grace), "timed out"


def _note(output: Path, text: str) -> None:
    """A line of run-agent's own at the end of the check's output; best effort."""
    try:
        runfolder.append_line(output, f"run-agent: {text}")
    except OSError:
        pass
