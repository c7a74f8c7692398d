"""conductor-loop's runs through the API: its run ids (`YYYYMMDD-HHMMSS0000-PID-SEQ`, as its
runner names a run's folder) open on every run route, and the task stream's event ids, which
carry them, are taken back on a reconnect."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from starlette.testclient import TestClient

from server.app import Settings, create_app
from tests import sse
from tests.conftest import LOCAL, Server, Workspace
from tests.store.test_conductor_loop import COMPLETED, TASK

RUN = "20260205-1245000000-87500-1"  # its runner's newRunID: the time, its pid, a sequence
TAKEN = "20260205-1245000000-87500-2-3316151712"  # os.MkdirTemp's, where that name was taken


def conductor_run(ws: Workspace, run_id: str, stdout: str) -> None:
    folder = ws.task("conductor", TASK).run_folder(run_id)
    folder.mkdir(parents=True)
    (folder / "agent-stdout.txt").write_text(stdout)
    (folder / "run-info.yaml").write_text(COMPLETED.replace("20260205-1245000000-87500", run_id))


@pytest.fixture
def client(ws: Workspace) -> Iterator[TestClient]:
    conductor_run(ws, RUN, "hello\n")
    conductor_run(ws, TAKEN, "again\n")
    with TestClient(create_app(Settings(root=ws.root)), base_url=LOCAL) as c:
        yield c


def test_conductor_loops_run_ids_open_on_the_run_routes(client: TestClient) -> None:
    base = f"/api/projects/conductor/tasks/{TASK}/runs"
    assert [r["run_id"] for r in client.get(base).json()] == [RUN, TAKEN]
    for run_id, text in ((RUN, "hello\n"), (TAKEN, "again\n")):
        run = client.get(f"{base}/{run_id}")
        assert run.status_code == 200 and run.json()["status"] == "completed", run.text
        assert client.get(f"{base}/{run_id}/files/stdout").text == text
    for other in ("20260205-1245000000", "x", "20260205-1245000000-1-2-3-4", "..%2F..%2Fp"):
        assert client.get(f"{base}/{other}").status_code == 404


def test_the_task_streams_event_ids_of_a_conductor_loop_run_are_taken_back(
    ws: Workspace, server: Server
) -> None:
    conductor_run(ws, RUN, "hello\n")
    url = f"{server.url}/api/projects/conductor/tasks/{TASK}/stream?file=stdout"
    messages = list(sse.stream(url))
    (data,) = [m for m in messages if m.event == "data"]
    assert data.json() == "hello\n" and data.id == f"{RUN}:6"
    again = list(sse.stream(url, headers={"Last-Event-ID": data.id}))  # a browser's reconnect
    assert [m.event for m in again if m.event == "data"] == [] and again[-1].event == "end"
    run_stream = f"{server.url}/api/projects/conductor/tasks/{TASK}/runs/{RUN}/stream/stdout"
    assert [m.json() for m in sse.stream(run_stream) if m.event == "data"] == ["hello\n"]
    refused = httpx.get(url, headers={"Last-Event-ID": "../x:0"}, timeout=30)
    assert refused.status_code == 400 and "RUN_ID:OFFSET" in refused.text
