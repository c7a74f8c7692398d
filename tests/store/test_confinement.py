"""One confinement rule: nothing under the runs root that leads out of it is read or written.

Symbolic links planted at every level a request, a command line or a folder listing reaches (a
project, a task, TASK.md, a run folder, a run file), against the server's routes and streams and
the CLI's commands, for reads and writes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from server.app import Settings, create_app
from tests.conftest import LOCAL, Workspace

SECRET = "SECRET-OUTSIDE-THE-ROOT"
RUN_ID = "20260101-000000000-1"


@pytest.fixture
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder outside the runs root that looks like a project, with a secret file."""
    folder = tmp_path_factory.mktemp("outside")
    run = folder / "victim" / "runs" / RUN_ID
    run.mkdir(parents=True)
    (run / "agent-stdout.txt").write_text(SECRET)
    (folder / "victim" / "TASK.md").write_text(SECRET)
    (folder / "secret.txt").write_text(SECRET)
    return folder


@pytest.fixture
def done_task(ws: Workspace) -> Workspace:
    ws.write_config(["--lines", "2"], max_restarts=0)
    assert ws.cli("--project", "p", "--task", "t", "the prompt").returncode == 0
    return ws


@pytest.fixture
def client(done_task: Workspace) -> Iterator[TestClient]:
    settings = Settings(root=done_task.root, config_path=done_task.config, workdir=done_task.path)
    with TestClient(create_app(settings), base_url=LOCAL) as c:
        yield c


def untouched(outside: Path) -> bool:
    """Nothing was written outside: the folder holds only what the fixture made."""
    made = {"secret.txt", "victim", "victim/TASK.md", "victim/runs", f"victim/runs/{RUN_ID}",
            f"victim/runs/{RUN_ID}/agent-stdout.txt"}  # fmt: skip
    return {str(p.relative_to(outside)) for p in outside.rglob("*")} == made


def test_a_project_that_links_out_is_not_listed(
    client: TestClient, done_task: Workspace, outside: Path
) -> None:
    os.symlink(outside, done_task.root / "linked")
    assert [p["project_id"] for p in client.get("/api/projects").json()] == ["p"]
    assert {t["task_id"] for t in client.get("/api/tasks").json()} == {"t"}
    assert client.get("/api/projects/linked/tasks/victim").status_code == 404
    assert client.get(f"/api/projects/linked/tasks/victim/runs/{RUN_ID}").status_code == 404
    assert SECRET not in client.get("/api/projects/linked/tasks").text
    cli = done_task.cli("list", "--json", "--config", str(done_task.config))
    assert cli.returncode == 0 and "victim" not in cli.stdout
    status = done_task.cli("status", "-p", "linked", "-t", "victim")
    assert status.returncode == 2 and "leads out of the runs root" in status.stderr
    assert SECRET not in status.stdout + status.stderr


def test_a_task_md_that_links_out_is_never_a_prompt(
    client: TestClient, done_task: Workspace, outside: Path
) -> None:
    task_md = done_task.task().task_md
    task_md.unlink()
    os.symlink(outside / "secret.txt", task_md)
    response = client.get("/api/projects/p/tasks/t")
    assert response.status_code == 404 and SECRET not in response.text
    for args in (["resume", "-p", "p", "-t", "t"], ["output", "-p", "p", "-t", "t"]):
        done = done_task.cli(*args)
        assert SECRET not in done.stdout + done.stderr
    resumed = done_task.cli("resume", "-p", "p", "-t", "t")
    assert resumed.returncode == 2 and "leads out of the runs root" in resumed.stderr


def test_a_run_file_that_links_out_is_not_streamed(
    client: TestClient, done_task: Workspace, outside: Path
) -> None:
    run = done_task.task().run_folder(done_task.runs()[-1].run_id)
    (run / "agent-stdout.txt").unlink()
    os.symlink(outside / "secret.txt", run / "agent-stdout.txt")
    task_stream = client.get("/api/projects/p/tasks/t/stream")
    assert task_stream.status_code == 200 and SECRET not in task_stream.text
    run_stream = client.get(f"/api/projects/p/tasks/t/runs/{run.name}/stream/stdout")
    assert SECRET not in run_stream.text
    assert SECRET not in client.get(f"/api/projects/p/tasks/t/runs/{run.name}/files/stdout").text


def test_a_run_folder_that_links_out_is_not_a_run(
    client: TestClient, done_task: Workspace, outside: Path
) -> None:
    os.symlink(outside / "victim" / "runs" / RUN_ID, done_task.task().runs / RUN_ID)
    assert RUN_ID not in client.get("/api/projects/p/tasks/t/runs").text
    assert SECRET not in client.get("/api/projects/p/tasks/t/stream", params={"from": ""}).text
    assert client.get(f"/api/projects/p/tasks/t/runs/{RUN_ID}/files/stdout").status_code == 404
    assert RUN_ID not in done_task.cli("list", "-p", "p", "-t", "t", "--json").stdout


@pytest.mark.parametrize("level", ["project", "task"])
def test_a_start_through_a_link_writes_nothing_outside(
    client: TestClient, done_task: Workspace, outside: Path, level: str
) -> None:
    if level == "project":
        os.symlink(outside, done_task.root / "wproj")
        project, task = "wproj", "victim"
    else:
        os.symlink(outside / "victim", done_task.root / "p" / "wtask")
        project, task = "p", "wtask"
    response = client.post(f"/api/projects/{project}/tasks", json={"task_id": task,
                           "prompt": "write here"})  # fmt: skip
    assert response.status_code == 404, response.text
    new_task = client.post(f"/api/projects/{project}/tasks", json={"prompt": "a new task"})
    if level == "project":
        assert new_task.status_code == 404, new_task.text
    assert client.post(f"/api/projects/{project}/tasks/{task}/resume", json={}).status_code == 404
    for args in (["-p", project, "-t", task, "write here"], ["job", "-p", project, "-t", task,
                 "write here"], ["resume", "-p", project, "-t", task]):  # fmt: skip
        done = done_task.cli(*args)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and "leads out of the runs root" in done.stderr
    if level == "project":
        generated = done_task.cli("-p", project, "write here")
        assert generated.returncode == 2 and "leads out of the runs root" in generated.stderr
    assert untouched(outside)


@pytest.mark.parametrize("level", ["paste", "inbox", "outbox"])
def test_a_paste_folder_that_links_out_is_neither_read_nor_written(
    client: TestClient, done_task: Workspace, outside: Path, level: str
) -> None:
    from runagent.paste.session import Folders, Session, save

    folders = Folders.of(done_task.task())
    if level == "paste":  # a whole paste folder elsewhere, with a session and its outbox
        away = Folders(outside / "victim" / "paste")
        away.make()
        session = Session.new("steal")
        save(away, session)
        away.outbox_file(session.session_id, 1).write_text(SECRET)
        os.symlink(away.root, folders.root)
    else:
        folders.make()
        session = Session.new("steal")
        save(folders, session)
        outbox = folders.outbox_file(session.session_id, 1)
        if level == "inbox":
            folders.inbox.rmdir()
            os.symlink(outside / "victim", folders.inbox)
            outbox.write_text("the outbox")
        else:  # the outbox file itself
            os.symlink(outside / "secret.txt", outbox)
    url = "/api/projects/p/tasks/t/paste"
    read = client.get(url)
    assert SECRET not in read.text
    assert read.status_code == (200 if level == "outbox" else 404), read.text
    sent = client.post(url, json={"reply": "[MESSAGE]\nwrite here\n[/MESSAGE]"})
    assert sent.status_code == (201 if level == "outbox" else 404), sent.text
    if level == "paste":  # what the test put there, and nothing else
        assert not list((outside / "victim" / "paste" / "inbox").iterdir())
        shutil.rmtree(outside / "victim" / "paste")
    assert untouched(outside)
