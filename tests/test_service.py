"""The one door: a start is checked in the same order, refused with the same error, and leaves
the same task folder behind, whether the command line, the API or a schedule's firing asks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml
from starlette.testclient import TestClient

import backends
from runagent.cli.options import usable_backend
from runagent.config.file import load_config
from runagent.config.settings import ExecutorSettings, ExecutorType
from runagent.errors import AlreadyCompletedError, ExitCode, PromptConflictError, RunAgentError
from runagent.service import Command, Service, StartRequest
from server.app import Settings, create_app
from tests.conftest import LOCAL, Workspace

UNREACHABLE = {"type": "ray", "address": "127.0.0.1:9"}  # nothing listens on discard


def with_schedule(ws: Workspace, task: str, **config: object) -> None:
    data = yaml.safe_load(ws.config.read_text())
    data["schedules"] = {"tick": {"cron": "@daily", "project": "p", "task": task,
                                  "prompt": "nightly work"}}  # fmt: skip
    data.update(config)
    ws.config.write_text(yaml.safe_dump(data))


@contextmanager
def served(ws: Workspace, **settings: object) -> Iterator[TestClient]:
    """The server as `run-agent serve` wires it, not firing on its own."""
    config = load_config(ws.config, backends.known(), ws.path)
    app = create_app(
        Settings(root=ws.root, config_path=ws.config, workdir=ws.path, schedules=config.schedules,
                 run_schedules=False, check_agent=usable_backend, backend_names=backends.known(),
                 **settings)  # type: ignore[arg-type]
    )  # fmt: skip
    with TestClient(app, base_url=LOCAL) as client:
        yield client


def folder_state(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` with its bytes (a lock file's holder record included)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def status_of(error: type[RunAgentError]) -> int:
    return error.http_status


def test_a_completed_task_is_refused_alike_by_every_face_and_left_as_it_was(
    ws: Workspace,
) -> None:
    assert ws.invoke("-p", "p", "-t", "t", "the prompt").returncode == 0
    before = folder_state(ws.task().folder)
    refusals = [ws.invoke("-p", "p", "-t", "t", "the prompt"), ws.invoke("resume", "-p", "p",
                "-t", "t")]  # fmt: skip
    for refused in refusals:
        assert refused.returncode == AlreadyCompletedError.exit_code == ExitCode.USAGE
        assert "already completed" in refused.stderr and "--again" in refused.stderr
    with served(ws) as c:
        for answer in (
            c.post("/api/projects/p/tasks", json={"task_id": "t", "prompt": "the prompt"}),
            c.post("/api/projects/p/tasks/t/resume", json={}),
        ):
            assert answer.status_code == status_of(AlreadyCompletedError) == 409
            assert "already completed" in answer.json()["error"]
            assert '"again": true' in answer.json()["error"]
    assert folder_state(ws.task().folder) == before


def test_a_prompt_conflict_is_refused_alike_by_every_face_and_left_as_it_was(
    ws: Workspace,
) -> None:
    assert ws.invoke("-p", "p", "-t", "fixed", "another prompt").returncode == 0
    with_schedule(ws, "fixed")  # fires `nightly work` into a task that holds another prompt
    before = folder_state(ws.task("p", "fixed").folder)
    by_cli = ws.invoke("-p", "p", "-t", "fixed", "nightly work")
    by_firing = ws.invoke("schedule", "now", "tick")
    for refused in (by_cli, by_firing):
        assert refused.returncode == PromptConflictError.exit_code, refused.stderr
        assert "exists with another prompt" in refused.stderr
        assert "Traceback" not in refused.stderr
    with served(ws) as c:
        for answer in (
            c.post("/api/projects/p/tasks", json={"task_id": "fixed", "prompt": "nightly work"}),
            c.post("/api/schedules/tick/run", json={}),
        ):
            assert answer.status_code == status_of(PromptConflictError) == 409, answer.text
            assert "exists with another prompt" in answer.json()["error"]
    assert folder_state(ws.task("p", "fixed").folder) == before


def test_a_start_the_executor_refuses_leaves_no_task_from_any_face(ws: Workspace) -> None:
    # The checks pass, TASK.md is claimed, then the executor cannot be reached: the folder the
    # start made goes again, the same way for the command line, the API and a firing.
    with_schedule(ws, "fired", executor=UNREACHABLE)
    by_cli = ws.cli("run", "-p", "p", "-t", "by-cli", "go")
    by_firing = ws.cli("schedule", "now", "tick")
    for refused in (by_cli, by_firing):
        assert refused.returncode == ExitCode.MISSING_DEPENDENCY, refused.stderr
        assert "Traceback" not in refused.stderr
    executor = ExecutorSettings(type=ExecutorType.RAY, address="127.0.0.1:9")
    with served(ws, executor=executor) as c:
        for answer in (
            c.post("/api/projects/p/tasks", json={"task_id": "by-api", "prompt": "go"}),
            c.post("/api/schedules/tick/run", json={}),
        ):
            assert answer.status_code == 424, answer.text
    assert not (ws.root / "p").exists() or not any((ws.root / "p").iterdir())


def test_a_missing_agent_is_refused_before_anything_is_made(ws: Workspace) -> None:
    missing = ws.path / "no-such-agent"
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["fake"]["command"] = [str(missing)]
    ws.config.write_text(yaml.safe_dump(data))
    with_schedule(ws, "fired")
    refusals = [ws.invoke("-p", "p", "-t", "t", "go"), ws.invoke("schedule", "now", "tick")]
    for refused in refusals:
        assert refused.returncode == ExitCode.MISSING_DEPENDENCY, refused.stderr
        assert str(missing) in refused.stderr
    assert "schedule tick: " in refusals[1].stderr  # a firing names its schedule
    with served(ws) as c:
        answer = c.post("/api/projects/p/tasks", json={"task_id": "t", "prompt": "go"})
        assert answer.status_code == 424 and str(missing) in answer.json()["error"]
    assert not (ws.root / "p").exists()


def test_the_service_checks_in_one_order_and_creates_nothing_while_checking(
    ws: Workspace,
) -> None:
    asked: list[str | None] = []
    service = Service(ws.root, lambda config, agent, who: asked.append(agent),
                      config=load_config(ws.config, backends.known(), ws.path))  # fmt: skip
    task = ws.task("p", "new")
    assert service.admit(StartRequest(task, "go")).prompt == "go"
    assert asked == [None] and not task.folder.exists()  # admitted, nothing made
    resumed = StartRequest(task, command=Command.RESUME)
    try:
        service.admit(resumed)
    except Exception as exc:  # no TASK.md to resume from: refused before the agent is asked
        assert "no TASK.md" in str(exc)
    else:
        raise AssertionError("a resume without TASK.md was admitted")
    assert asked == [None] and not task.folder.exists()


def test_a_check_that_cannot_run_is_refused_alike_by_every_face_before_anything_is_made(
    ws: Workspace,
) -> None:
    with_schedule(ws, "fired")
    data = yaml.safe_load(ws.config.read_text())
    data["schedules"]["tick"]["check"] = "no-such-check-program --all"
    ws.config.write_text(yaml.safe_dump(data))
    refusals = [ws.invoke("-p", "p", "-t", "t", "--check", "no-such-check-program --all", "go"),
                ws.invoke("schedule", "now", "tick")]  # fmt: skip
    for refused in refusals:
        assert refused.returncode == ExitCode.MISSING_DEPENDENCY, refused.stderr
        assert "check `no-such-check-program --all` cannot run" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    assert "schedule tick: " not in refusals[0].stderr
    with served(ws) as c:
        body = {"task_id": "t", "prompt": "go", "check": "no-such-check-program --all"}
        answer = c.post("/api/projects/p/tasks", json=body)
        assert answer.status_code == 424 and "cannot run" in answer.json()["error"]
    assert not (ws.root / "p").exists()


def test_a_schedules_firing_runs_its_check(ws: Workspace) -> None:
    from tests.conftest import wait_for

    with_schedule(ws, "fired")
    data = yaml.safe_load(ws.config.read_text())
    data["schedules"]["tick"].update(check="true", check_timeout="1m")
    ws.config.write_text(yaml.safe_dump(data))
    fired = ws.cli("schedule", "now", "tick")
    assert fired.returncode == 0, fired.stderr
    wait_for(lambda: ws.task("p", "fired").done.exists(), 60, "the firing to complete")
    (run,) = ws.runs("p", "fired")
    assert run.check_command == "true" and run.check_exit_code == 0
