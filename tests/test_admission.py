"""A start is admitted once, by the door (`Service`), whatever face asks for it and wherever its
loop then runs: the command line's foreground, `--detach` (its loop a process of its own), a
queued start the keeper starts later, the API's start and a schedule's firing. And a server
reads its config once per start.

Counted in the real processes: a `sitecustomize` on the processes' PYTHONPATH writes a line for
each admission (`Service._admit`) and each config read made through the door, with the pid."""

from __future__ import annotations

import os
import textwrap
from collections import Counter
from pathlib import Path

import httpx
import yaml

from runagent.errors import ExitCode
from tests.conftest import Workspace, serving, wait_for

COUNTER = textwrap.dedent(
    """
    import os, traceback
    LOG = os.environ.get("RUN_AGENT_TEST_COUNTS")
    if LOG:
        def note(what):
            with open(LOG, "a") as f:
                f.write(f"{os.getpid()} {what}\\n")

        import runagent.service as service
        admit = service.Service._admit

        def counted(self, request):
            note(f"admit {request.task.label}")
            return admit(self, request)

        service.Service._admit = counted
        import runagent.config.file as file
        load = file.load_config

        def loaded(*args, **kwargs):
            if any(f.filename.endswith("runagent/service.py") for f in traceback.extract_stack()):
                note("config")
            return load(*args, **kwargs)

        file.load_config = loaded
    """
)


def counting(ws: Workspace) -> tuple[dict[str, str], Path]:
    """The environment under which the processes of a test count, and their log."""
    site = ws.path / "counting"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(COUNTER)
    log = ws.path / "counts.log"
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {"PYTHONPATH": path, "RUN_AGENT_TEST_COUNTS": str(log)}, log


def admissions(log: Path) -> Counter[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    return Counter(line.split(" ", 2)[2] for line in lines if line.split(" ")[1] == "admit")


def status(ws: Workspace, task: str) -> str | None:
    found = ws.cli("status", "-p", "p", "-t", task, "--json")
    return yaml.safe_load(found.stdout).get("status") if found.returncode == 0 else None


def test_the_counter_counts(ws: Workspace) -> None:
    env, log = counting(ws)
    refused = ws.cli("run", "-p", "p", "-t", "t", "--cwd", str(ws.path / "none"), "x", env=env)
    assert refused.returncode == ExitCode.USAGE and "does not exist" in refused.stderr
    assert admissions(log) == {"p/t": 1}  # a refused start was admitted (and refused) once


def test_each_start_of_the_command_line_is_admitted_once(ws: Workspace) -> None:
    env, log = counting(ws)
    assert ws.cli("run", "-p", "p", "-t", "here", "go", env=env).returncode == 0
    assert ws.cli("job", "-p", "p", "-t", "once", "go", env=env).returncode == 0
    detached = ws.cli("run", "-p", "p", "-t", "there", "go", "--detach", env=env)
    assert detached.returncode == 0, detached.stderr
    wait_for(lambda: status(ws, "there") == "completed", 60, "the detached loop to complete")
    resumed = ws.cli("resume", "-p", "p", "-t", "there", "--again", "--detach", env=env)
    assert resumed.returncode == 0, resumed.stderr
    wait_for(lambda: len(ws.runs("p", "there")) == 2 and status(ws, "there") == "completed",
             60, "the resumed loop to complete")  # fmt: skip
    assert admissions(log) == {"p/here": 1, "p/once": 1, "p/there": 2}


def test_a_queued_start_is_admitted_once_though_the_keeper_starts_it(ws: Workspace) -> None:
    ws.write_config(["--lines", "1", "--wait-in-task", "go"], max_restarts=0)
    data = yaml.safe_load(ws.config.read_text())
    data["limits"] = {"max_running": 1}
    ws.config.write_text(yaml.safe_dump(data))
    env, log = counting(ws)
    for task in ("a", "b"):
        started = ws.cli("run", "-p", "p", "-t", task, "go", "--detach", env=env)
        assert started.returncode == 0, started.stderr
    assert "queue" in started.stderr  # b waits for a's slot, as a record the keeper starts
    for task in ("a", "b"):
        ws.task("p", task).folder.joinpath("go").touch()
    wait_for(lambda: status(ws, "b") == "completed", 60, "the queued loop to complete")
    assert admissions(log) == {"p/a": 1, "p/b": 1}


def test_a_servers_start_and_a_schedules_firing_are_admitted_once_reading_the_config_once(
    ws: Workspace,
) -> None:
    data = yaml.safe_load(ws.config.read_text())
    data["schedules"] = {"nightly": {"cron": "@daily", "project": "p", "task": "night",
                                     "prompt": "nightly work"}}  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))
    env, log = counting(ws)
    assert ws.cli("schedule", "now", "nightly", env=env).returncode == 0
    wait_for(lambda: status(ws, "night") == "completed", 60, "the firing to complete")
    with serving(ws, env) as url:
        before = log.read_text().splitlines()
        answer = httpx.post(
            f"{url}/api/projects/p/tasks", json={"task_id": "web", "prompt": "go"}, timeout=60
        )
        assert answer.status_code == 202, answer.text
        server = answer.json()  # answered: the start's checks are done
        assert server["task_id"] == "web"
        during = log.read_text().splitlines()[len(before) :]
        wait_for(lambda: status(ws, "web") == "completed", 60, "the API's start to complete")
    assert admissions(log) == {"p/night": 1, "p/web": 1}
    pids = {line.split(" ")[0] for line in during if line.endswith("admit p/web")}
    assert len(pids) == 1  # the server's
    (pid,) = pids
    assert [line for line in during if line == f"{pid} config"] == [f"{pid} config"]
