"""The server's operations API: runs bound to allowed workspaces, messages, events, approvals."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from server.app import Settings, create_app
from tests import sse
from tests.conftest import LOCAL, Server, Workspace, wait_for

KEY = "ops-key-0123456789"


def batch(*operations: Any) -> dict[str, Any]:
    return {"protocolVersion": "1.0", "operations": list(operations)}


@pytest.fixture
def client(ws: Workspace) -> Iterator[TestClient]:
    (ws.path / "project" / "victim").mkdir(parents=True)
    app = create_app(Settings(root=ws.root, config_path=ws.config, workdir=ws.path))
    with TestClient(app, base_url=LOCAL) as c:
        yield c


def create(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/api/ops/runs", json={"workspace": "project", **body})
    assert response.status_code == 201, response.text
    reply: dict[str, Any] = response.json()
    return reply


def test_pause_approve_and_the_batch_completes(client: TestClient, ws: Workspace) -> None:
    run = create(client)
    assert run["workspace"] == str((ws.path / "project").resolve())
    assert run["policy"] == "standard" and run["pending"] is None
    url = f"/api/ops/runs/{run['runId']}"
    paused = client.post(f"{url}/messages", json=batch(
        {"type": "shell", "command": "echo one >> log"},
        {"type": "shell", "id": "rm-1", "command": "rm -r victim && echo ran >> log"},
        {"type": "shell", "command": "echo three >> log"},
    )).json()  # fmt: skip
    assert paused["status"] == "awaiting_approval" and paused["runId"] == run["runId"]
    assert [e["type"] for e in paused["events"]] == ["shell", "approvalRequired"]

    (row,) = client.get("/api/ops/approvals").json()
    assert row["runId"] == run["runId"] and row["operationId"] == "rm-1"
    assert row["details"]["command"] == "rm -r victim && echo ran >> log"
    assert row["details"]["policy"] and row["reason"]
    assert row["operationHash"].startswith("sha256:")
    assert client.get(url).json()["pending"]["operationId"] == "rm-1"

    wrong = client.post(f"{url}/approvals/other", json={"decision": "approved"})
    assert wrong.status_code == 409 and "awaits approval of 'rm-1'" in wrong.json()["error"]
    stale = client.post(
        f"{url}/approvals/rm-1", json={"decision": "approved", "operationHash": "sha256:00"}
    )
    assert stale.status_code == 409
    bad = client.post(f"{url}/approvals/rm-1", json={"decision": "maybe"})
    assert bad.status_code == 400

    done = client.post(
        f"{url}/approvals/rm-1",
        json={"decision": "approved", "operationHash": row["operationHash"]},
    )
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "completed"
    assert (ws.path / "project" / "log").read_text() == "one\nran\nthree\n"
    assert not (ws.path / "project" / "victim").exists()
    assert client.get("/api/ops/approvals").json() == []
    again = client.post(f"{url}/approvals/rm-1", json={"decision": "approved"})
    assert again.status_code == 409 and "awaits no approval" in again.json()["error"]

    record = client.get(f"{url}/events").json()
    assert [m["status"] for m in record["messages"]] == ["awaiting_approval", "completed"]
    assert record["offset"] == os.path.getsize(
        ws.root / "ops" / "ops" / "runs" / run["runId"] / "events.jsonl"
    )
    assert [r["runId"] for r in client.get("/api/ops/runs").json()] == [run["runId"]]


def test_deny_continues_and_answers_as_messages_work(client: TestClient, ws: Workspace) -> None:
    run = create(client, policy="standard", project_id="p", task_id="agent")
    url = f"/api/ops/runs/{run['runId']}"
    client.post(f"{url}/messages", json=batch(
        {"type": "shell", "id": "rm-1", "command": "rm -rf victim"},
        {"type": "createFile", "path": "after.txt", "content": "still here"},
    ))  # fmt: skip
    denied = client.post(f"{url}/approvals/rm-1", json={"decision": "denied", "reason": "no"})
    events = denied.json()["events"]
    assert [e["type"] for e in events] == ["policyDenied", "createFile"]
    assert "no" in events[0]["reason"]
    assert (ws.path / "project" / "victim").is_dir()
    assert (ws.path / "project" / "after.txt").read_text() == "still here"

    client.post(
        f"{url}/messages", json=batch({"type": "shell", "id": "x", "command": "rm -r victim"})
    )
    answer = {"type": "userMessage", "content": "approved"}
    assert client.post(f"{url}/messages", json=answer).json()["status"] == "completed"
    assert not (ws.path / "project" / "victim").exists()


def test_protocol_errors_are_events_and_http_errors_are_json(client: TestClient) -> None:
    run = create(client, policy="permissive")
    url = f"/api/ops/runs/{run['runId']}/messages"
    not_json = client.post(url, content=b"{nope", headers={"content-type": "application/json"})
    assert not_json.status_code == 200 and not_json.json()["status"] == "error"
    assert not_json.json()["events"][0]["category"] == "validation"
    missing = client.post("/api/ops/runs/20250101-000000000-1/messages", json=batch())
    assert missing.status_code == 404 and "error" in missing.json()
    assert client.get("/api/ops/runs/..%2F..%2Fetc/events").status_code == 404
    assert (
        client.post(url, content=b"{}", headers={"content-type": "text/plain"}).status_code == 403
    )
    cross = client.post(url, json=batch(), headers={"origin": "http://evil.example"})
    assert cross.status_code == 403 and "evil.example" in cross.json()["error"]
    rebound = client.get("/api/ops/approvals", headers={"host": "evil.example"})
    assert rebound.status_code == 421


@pytest.mark.parametrize(
    ("workspace", "status", "words"),
    [
        ("/", 403, "outside the folders"),
        ("/etc", 403, "server.ops_workspaces"),
        ("escape", 403, "outside the folders"),  # a link inside that leads out
        ("..", 403, "outside the folders"),
        ("nothing-here", 400, "does not exist"),
        ("file.txt", 400, "not a folder"),
        ("", 400, "workspace is required"),
        (".", 400, "inside the workspace"),  # it holds the runs root: ops could rewrite runs
    ],
)
def test_only_allowed_folders_can_be_workspaces(
    client: TestClient, ws: Workspace, workspace: str, status: int, words: str
) -> None:
    (ws.path / "escape").symlink_to("/")
    (ws.path / "file.txt").write_text("x")
    response = client.post("/api/ops/runs", json={"workspace": workspace})
    assert response.status_code == status, response.text
    assert words in response.json()["error"]
    assert not list(ws.root.glob("*/*/runs/*"))


def test_configured_workspaces_replace_the_working_folder(ws: Workspace, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    settings = Settings(root=ws.root, workdir=ws.path, api_key=KEY, ops_workspaces=(elsewhere,))
    with TestClient(create_app(settings), base_url=LOCAL) as c:
        assert c.post("/api/ops/runs", json={"workspace": str(elsewhere)}).status_code == 401
        auth = {"authorization": f"Bearer {KEY}"}
        made = c.post("/api/ops/runs", json={"workspace": str(elsewhere)}, headers=auth)
        assert made.status_code == 201 and made.json()["workspace"] == str(elsewhere.resolve())
        (ws.path / "project").mkdir()
        refused = c.post(
            "/api/ops/runs", json={"workspace": str(ws.path / "project")}, headers=auth
        )
        assert refused.status_code == 403


def test_one_message_at_a_time_per_run(client: TestClient, ws: Workspace) -> None:
    run = create(client, policy="permissive")
    url = f"/api/ops/runs/{run['runId']}/messages"
    gate = ws.path / "project" / "gate"
    slow = batch(
        {"type": "shell", "command": f"touch started; while [ ! -e {gate} ]; do sleep 0.05; done"}
    )
    replies: list[httpx.Response] = []
    first = threading.Thread(target=lambda: replies.append(client.post(url, json=slow)))
    first.start()
    wait_for(lambda: (ws.path / "project" / "started").exists(), what="the first batch to run")
    busy = client.post(url, json=batch({"type": "message", "content": "hi"}))
    assert busy.status_code == 409 and "another message" in busy.json()["error"]
    gate.touch()
    first.join(timeout=30)
    assert replies[0].json()["status"] == "completed"


def test_over_a_real_server_pause_approve_from_the_cli_and_stream_the_events(
    ws: Workspace, server: Server
) -> None:
    (ws.path / "project" / "victim").mkdir(parents=True)
    made = httpx.post(f"{server.url}/api/ops/runs", json={"workspace": "project"})
    assert made.status_code == 201, made.text
    run_id = made.json()["runId"]
    url = f"{server.url}/api/ops/runs/{run_id}"
    paused = httpx.post(f"{url}/messages", json=batch(
        {"type": "createFile", "path": "a.txt", "content": "a"},
        {"type": "shell", "id": "rm-1", "command": "rm -r victim"},
        {"type": "readFile", "path": "a.txt"},
    ), timeout=30).json()  # fmt: skip
    assert paused["status"] == "awaiting_approval"

    approved = ws.cli("ops", "approve", run_id, "rm-1", "--config", str(ws.config))
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["status"] == "completed"
    assert not (ws.path / "project" / "victim").exists()
    assert httpx.get(f"{server.url}/api/ops/approvals").json() == []

    received = []
    for message in sse.stream(f"{url}/events/stream"):
        received.append(message)
        if len(received) == 2:
            break
    assert [m.event for m in received] == ["events", "events"]
    first, second = (m.json() for m in received)
    assert isinstance(first, dict) and isinstance(second, dict)
    assert (first["status"], second["status"]) == ("awaiting_approval", "completed")
    assert second["events"][-1]["content"] == "a"
    # Reconnecting after the first message gets exactly the second.
    resumed = sse.stream(f"{url}/events/stream", headers={"last-event-id": str(received[0].id)})
    again = next(resumed)
    resumed.close()
    assert again.json() == second and again.id == received[1].id
    assert httpx.get(f"{url}/events/stream?from=3").status_code == 400


def test_a_run_can_ask_for_the_bwrap_sandbox(client: TestClient, ws: Workspace) -> None:
    bogus = client.post("/api/ops/runs", json={"workspace": "project", "sandbox": "chroot"})
    assert bogus.status_code == 400 and "none, bwrap" in bogus.json()["error"]
    made = client.post("/api/ops/runs", json={"workspace": "project", "sandbox": "bwrap"})
    if made.status_code == 424:  # bwrap missing or unusable here: refused, saying why
        assert "sandbox bwrap" in made.json()["error"]
        pytest.skip(f"bwrap unusable: {made.json()['error']}")
    assert made.status_code == 201 and made.json()["sandbox"] == "bwrap"
    url = f"/api/ops/runs/{made.json()['runId']}/messages"
    reply = client.post(url, json=batch({"type": "shell", "command": f"ls {ws.root}"})).json()
    assert reply["events"][0]["success"] is False  # the runs root is not there in the sandbox


def test_a_body_nested_too_deep_says_so(client: TestClient) -> None:
    deep = b'{"workspace": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    made = client.post("/api/ops/runs", content=deep, headers={"content-type": "application/json"})
    assert made.status_code == 400 and made.json()["error"] == "the body is nested too deep to read"
    run = create(client)
    sent = client.post(
        f"/api/ops/runs/{run['runId']}/messages", content=deep,
        headers={"content-type": "application/json"},
    )  # fmt: skip
    assert sent.status_code == 200 and sent.json()["status"] == "error"
    assert sent.json()["events"][0]["message"].startswith("the message is nested too deep")
