"""Supervisors forked from a server that loaded run-agent ahead (executors/forkserver.py), as a
cluster's host agent starts them: the same command line as a new interpreter's, its exit code
reported, and none outliving the server."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

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
