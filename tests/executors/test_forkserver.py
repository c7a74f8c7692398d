"""Supervisors forked from a server that loaded run-agent ahead (executors/forkserver.py), as a
cluster's host agent starts them: the same command line as a new interpreter's, its exit code
reported, and none outliving the server."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psutil
import pytest

from runagent.executors import forkserver
from runagent.executors.forkserver import ForkServer
from runagent.store import runfolder, taskfolder
from tests.conftest import Workspace, alive, wait_for


@pytest.fixture
def server() -> Iterator[ForkServer]:
    made = ForkServer()
    assert made.start(dict(os.environ))
    yield made
    process = made.process
    assert process is not None and process.stdin is not None
    process.stdin.close()  # as the host agent's end: the server leaves
    process.wait(30)


def job_argv(ws: Workspace, task_id: str) -> list[str]:
    return ["job", "-p", "p", "-t", task_id, "--root", str(ws.root), "--config", str(ws.config),
            "--admitted", "--executor", "local"]  # fmt: skip


def test_a_forked_supervisor_runs_the_loop_as_a_new_interpreter_would(
    ws: Workspace, server: ForkServer
) -> None:
    ws.write_config(["--lines", "2"])
    task = ws.task("p", "forked")
    taskfolder.claim_task_prompt(task, "do the thing", "")
    runfolder.make_task_folder(task)
    log = runfolder.supervisor_log_path(task)
    child = server.fork(job_argv(ws, "forked"), ws.path, dict(os.environ), log)
    assert child.wait(60) == 0
    run = ws.runs("p", "forked")[0]
    assert run.status.value == "completed" and run.supervisor_pid == child.pid
    assert "line 2" in task.run(run.run_id).stdout.read_text()
    assert "completed" in log.read_text()  # its own words went to supervisor.log


def test_a_forked_supervisors_exit_code_is_its_own(ws: Workspace, server: ForkServer) -> None:
    ws.write_config(["--exit", "3"])
    task = ws.task("p", "fails")
    taskfolder.claim_task_prompt(task, "do the thing", "")
    runfolder.make_task_folder(task)
    child = server.fork(job_argv(ws, "fails"), ws.path, dict(os.environ),
                        runfolder.supervisor_log_path(task))  # fmt: skip
    assert child.wait(60) == 1  # the loop failed: run-agent's code, not the agent's


def test_the_servers_death_takes_its_supervisors_and_their_agents(
    ws: Workspace, server: ForkServer
) -> None:
    ws.write_config(["--sleep", "120"])
    task = ws.task("p", "orphan")
    taskfolder.claim_task_prompt(task, "do the thing", "")
    runfolder.make_task_folder(task)
    child = server.fork(job_argv(ws, "orphan"), ws.path, dict(os.environ),
                        runfolder.supervisor_log_path(task))  # fmt: skip
    agents = wait_for(lambda: ws.agent_pids(), 60, "the agent to start")
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGKILL)
    assert child.wait(30) == -signal.SIGKILL  # said as the server's reader learns it went
    wait_for(lambda: not alive(child.pid), 30, "the supervisor to die with the server")
    wait_for(lambda: not any(alive(p) for p in agents), 30, "its agent to be stopped")
    assert Path(f"/proc/{child.pid}").exists() is False or not alive(child.pid)


def children_named(name: str) -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any(name in part for part in child.cmdline()):
                found.append(child)
    return found


def running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_server_that_never_says_ready_is_given_up_and_left_dead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server stuck as it starts (here a site hook that never returns) does not hold its
    starter for ever: given up after READY_WAIT, killed, and the start goes on without it."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text("import time\ntime.sleep(600)\n")
    monkeypatch.setattr(forkserver, "READY_WAIT", 1.0)
    made = ForkServer(bound=False)
    assert made.start({**os.environ, "PYTHONPATH": str(hook)}) is False
    assert not made.alive()
    assert children_named("runagent.executors.forkserver") == []


def test_a_request_answered_too_late_is_never_forked(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start given up for want of an answer is started as a new interpreter instead; the
    server's late child must then never run, or the task would get two supervisors: its asker
    says `drop` to the late answer, and the child exits before anything of its own."""
    monkeypatch.setattr(forkserver, "ANSWER_WAIT", 0.5)
    made = ForkServer(bound=False)  # the keeper's: its children outlive it
    assert made.start(dict(os.environ))
    assert made.process is not None
    stalled = made.process.pid
    late, later = ws.path / "late.log", ws.path / "later.log"
    try:
        os.kill(stalled, signal.SIGSTOP)
        with pytest.raises(OSError, match="did not answer"):
            made.fork(["--version"], ws.path, dict(os.environ), late)
        monkeypatch.setattr(forkserver, "ANSWER_WAIT", 30.0)  # the next start is answered
        os.kill(stalled, signal.SIGCONT)  # it goes on, reading the request given up
        assert made.start(dict(os.environ))
        child = made.fork(["--version"], ws.path, dict(os.environ), later)
        assert child.wait(60) == 0 and "run-agent" in later.read_text()
        # A server reads its requests in order: what it forked for the first, it had forked
        # before the second. Every child of any server has ended by now.
        wait_for(lambda: not [p for p in psutil.Process().children(recursive=True)
                              if p.ppid() == stalled], 30, "the old server's children")  # fmt: skip
        assert late.exists()  # the server did read the late request and fork it
        assert "run-agent" not in late.read_text()
        assert not made.dropped and not made.asked  # nothing left waiting on either side
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(stalled, signal.SIGKILL)
        process = made.process
        if process is not None and process.stdin is not None:
            process.stdin.close()
            process.wait(30)


def test_a_server_that_dies_as_it_is_told_go_leaves_no_start_thought_running(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server answered the pid, then died before it read `go`: its child never ran (it
    read the end of its pipe). The asker must not take it for started (the keeper would count
    a task as running that never ran, and it would be lost): it is told so (OSError) and starts
    a new interpreter instead."""
    made = ForkServer(bound=False)
    assert made.start(dict(os.environ))
    assert made.process is not None
    server = made.process.pid
    say = ForkServer._say
    waiting: list[psutil.Process] = []

    def dies_first(self: ForkServer, process: Any, message: Mapping[str, Any]) -> None:
        if "go" in message:
            waiting.extend(psutil.Process(server).children())  # the child, waiting for `go`
            os.kill(server, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError, ProcessLookupError):
                os.waitid(os.P_PID, server, os.WEXITED | os.WNOWAIT)  # dead, not yet reaped
        say(self, process, message)

    monkeypatch.setattr(ForkServer, "_say", dies_first)
    unrun = ws.path / "unrun.log"
    try:
        with pytest.raises(OSError, match="fork server"):
            made.fork(["--version"], ws.path, dict(os.environ), unrun)
        assert unrun.exists() and len(waiting) == 1  # it was forked
        wait_for(lambda: not running(waiting[0]), 30, "the unrun child to exit")
        assert "run-agent" not in unrun.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)
        made.process.wait(30)


def test_a_forked_supervisors_unexpected_error_is_logged_with_its_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `python -m runagent` would print of an error nothing caught (its traceback, exit
    code 1), a forked supervisor prints too, to its supervisor.log: not one line of it."""
    import runagent.cli

    def broken() -> None:
        raise RuntimeError("a defect deep in a run")

    monkeypatch.setattr(runagent.cli, "main", broken)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    assert forkserver._run(["job"]) == 1
    said = capsys.readouterr().err
    assert "Traceback (most recent call last)" in said and "in broken" in said
    assert said.rstrip().endswith("RuntimeError: a defect deep in a run")
