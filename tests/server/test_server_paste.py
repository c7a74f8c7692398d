"""The paste run's API: the session read (GET .../paste), a reply handed in (POST .../paste), and
the root stream's `paste` event, end to end with a real `run-agent serve` and a real paste run,
and hostile bodies against TestClient over real task folders."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from starlette.testclient import TestClient

from runagent.paste import state
from runagent.paste.session import Folders, Session, digest, save
from server.actions import MAX_PASTE_BODY
from server.app import Settings, create_app
from tests import sse
from tests.conftest import LOCAL, Server, Workspace, wait_for

OUTBOX = "=== HEADER ===\nSession: x\nSequence: 1\nTask: Create hello.txt\n"
REPLY = """Here is the plan.
[CREATE_FILE path="hello.txt"]
    hi there
[/CREATE_FILE]
[RUN_COMMAND]
echo ran-ok
[/RUN_COMMAND]
[MESSAGE]
hello.txt is written
[/MESSAGE]
"""
DONE = "[DONE]\nwrote hello.txt\n[/DONE]\n"


def paste_config(ws: Workspace) -> None:
    """The workspace's config with `paste.clipboard` off (a test leaves the clipboard alone)."""
    data = yaml.safe_load(ws.config.read_text())
    data["defaults"]["max_restarts"] = 0
    data["paste"] = {"clipboard": False}
    ws.config.write_text(yaml.safe_dump(data))


def start_paste_run(ws: Workspace, server: Server, task: str = "t") -> None:
    """Start task p/TASK with the paste agent, through the API as the page does."""
    (ws.path / "work").mkdir(exist_ok=True)
    started = httpx.post(
        f"{server.url}/api/projects/p/tasks",
        json={"task_id": task, "prompt": "Create hello.txt", "agent": "paste", "cwd": "work"},
        timeout=30,
    )
    assert started.status_code == 202, started.text


def read(server: Server, task: str = "t") -> httpx.Response:
    return httpx.get(f"{server.url}/api/projects/p/tasks/{task}/paste", timeout=30)


def send(server: Server, reply: Any, task: str = "t") -> httpx.Response:
    return httpx.post(
        f"{server.url}/api/projects/p/tasks/{task}/paste", json={"reply": reply}, timeout=30
    )


def at_sequence(server: Server, sequence: int, task: str = "t") -> dict[str, Any] | None:
    response = read(server, task)
    if response.status_code != 200:
        return None
    view: dict[str, Any] = response.json()
    return view if view["sequence"] == sequence and view["text"] else None


def test_a_paste_run_is_read_and_answered_through_the_api(ws: Workspace, server: Server) -> None:
    paste_config(ws)
    # Each `paste` event of the root stream, read back as the page does: what it then shows.
    shown: list[dict[str, Any]] = []

    def listen() -> None:
        for message in sse.stream(f"{server.url}/api/events", timeout=120):
            if message.event == "paste" and message.json() == {"project_id": "p", "task_id": "t"}:
                response = read(server)
                if response.status_code == 200:
                    shown.append(response.json())
                    if response.json()["complete"]:
                        return

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    wait_for(lambda: httpx.get(f"{server.url}/api/tasks", timeout=5).status_code == 200)
    start_paste_run(ws, server)
    first = wait_for(lambda: at_sequence(server, 1), what="the first outbox")
    assert first["outbox"] == f"{first['session']}_seq0001.txt"
    assert first["text"].startswith("=== HEADER ===") and "Create hello.txt" in first["text"]
    assert first["size"] == len(first["text"]) and first["results"] == []
    assert first["complete"] is False and first["messages"] == []
    detail = httpx.get(f"{server.url}/api/projects/p/tasks/t", timeout=30).json()
    assert detail["paste"] is True and detail["status"] == "running"

    sent = send(server, REPLY)
    assert sent.status_code == 201, sent.text
    assert sent.json()["file"].endswith(".txt") and sent.json()["task_id"] == "t"
    second = wait_for(lambda: at_sequence(server, 2), what="the second outbox")
    assert (
        ws.path / "work" / "hello.txt"
    ).read_text() == "    hi there"  # indentation kept, no line break added
    lines = [line for r in second["results"] for line in r["lines"]]
    assert lines[0] == "[OK] CREATE_FILE: Created 'hello.txt'"
    assert "[OK] RUN_COMMAND: Ran 'echo ran-ok' (exit code 0)" in lines
    assert "  Output: ran-ok" in lines
    assert second["messages"] == ["hello.txt is written"]
    assert second["waiting_replies"] == []  # taken, and moved aside
    assert "[OK] CREATE_FILE" in second["text"]  # the next outbox reports the results
    # The page hears of it: a `paste` event after which the session reads at sequence 2.
    wait_for(lambda: any(v["sequence"] == 2 and v["text"] for v in shown), what="a paste event")

    assert send(server, DONE).status_code == 201
    done = wait_for(lambda: (v := read(server).json())["complete"] and v, what="DONE")
    assert done["summary"].strip() == "wrote hello.txt"
    assert done["outbox"] is None and done["text"] is None and done["size"] is None
    wait_for(lambda: ws.runs() and ws.runs()[0].status.value == "completed", what="the run")
    listener.join(30)
    assert shown and shown[-1]["complete"]
    late = send(server, "[MESSAGE]\nanyone?\n[/MESSAGE]")
    assert late.status_code == 409 and "complete" in late.json()["error"]
    assert "\n" not in late.json()["error"]
    assert not list(Folders.of(ws.task()).inbox.iterdir())


@pytest.fixture
def client(ws: Workspace) -> Iterator[TestClient]:
    settings = Settings(root=ws.root, config_path=ws.config, workdir=ws.path)
    with TestClient(create_app(settings), base_url=LOCAL) as c:
        yield c


def paste_session(ws: Workspace, task: str = "t", complete: bool = False) -> Session:
    """Task p/TASK with a paste session at its first outbox (no run reads its inbox)."""
    folders = Folders.of(ws.task("p", task))
    folders.make()
    session = Session.new("Create hello.txt")
    if complete:
        session = session.touched(is_complete=True, summary="all done")
    save(folders, session)
    folders.outbox_file(session.session_id, 1).write_text(OUTBOX)
    return session


URL = "/api/projects/p/tasks/t/paste"
JSON = {"Content-Type": "application/json"}


def test_the_session_is_read_as_it_is_on_disk(ws: Workspace, client: TestClient) -> None:
    session = paste_session(ws)
    view = client.get(URL).json()
    assert view["session"] == session.session_id and view["sequence"] == 1
    assert view["text"] == OUTBOX and view["size"] == len(OUTBOX)
    sent = client.post(URL, json={"reply": REPLY})
    assert sent.status_code == 201
    inbox = Folders.of(ws.task()).inbox
    assert (inbox / sent.json()["file"]).read_text() == REPLY  # whole, as sent
    assert client.get(URL).json()["waiting_replies"] == [sent.json()["file"]]


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("not json", "not valid JSON"),
        (b'{"reply": "\xff"}', "not valid JSON"),
        ("[1, 2]", "a JSON object"),
        ("{}", "reply is required"),
        ('{"reply": null}', "not null"),
        ('{"reply": 7}', "not a number"),
        ('{"reply": ["a"]}', "not an array"),
        ('{"reply": {"text": "a"}}', "not an object"),
        ('{"reply": true}', "not a boolean"),
        ('{"reply": ""}', "empty"),
        ('{"reply": " \\n\\t "}', "empty"),
        ('{"reply": "\\ud800 [DONE]"}', "lone surrogate"),
        ('{"reply": "' + "[" * 100000 + '"}', None),  # a long reply is fine, deep nesting is not
        ("[" * 100000 + "]" * 100000, "not valid JSON"),
    ],
)
def test_a_bad_body_is_a_400_naming_what_is_wrong(
    ws: Workspace, client: TestClient, body: str | bytes, said: str | None
) -> None:
    paste_session(ws)
    response = client.post(URL, content=body, headers=JSON)
    if said is None:
        assert response.status_code == 201
        return
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert said in error and "\n" not in error
    assert not list(Folders.of(ws.task()).inbox.iterdir())


def test_a_reply_over_the_limit_is_refused(ws: Workspace, client: TestClient) -> None:
    paste_session(ws)
    big = client.post(URL, json={"reply": "x" * (state.MAX_REPLY + 1)})
    assert big.status_code == 400 and f"more than {state.MAX_REPLY}" in big.json()["error"]
    huge = client.post(URL, content=b'{"reply": "' + b"y" * MAX_PASTE_BODY + b'"}', headers=JSON)
    assert huge.status_code == 413 and str(MAX_PASTE_BODY) in huge.json()["error"]
    assert not list(Folders.of(ws.task()).inbox.iterdir())


def test_a_write_from_another_site_is_refused(ws: Workspace, client: TestClient) -> None:
    paste_session(ws)
    body = json.dumps({"reply": REPLY})
    evil = client.post(URL, content=body, headers={**JSON, "Origin": "http://evil.test"})
    assert evil.status_code == 403
    cross = client.post(URL, content=body, headers={**JSON, "Sec-Fetch-Site": "cross-site"})
    assert cross.status_code == 403
    form = client.post(URL, content=body, headers={"Content-Type": "text/plain"})
    assert form.status_code == 403  # a form another site could post
    assert not list(Folders.of(ws.task()).inbox.iterdir())


def test_a_task_without_a_paste_session_is_a_404(ws: Workspace, client: TestClient) -> None:
    assert ws.cli("-p", "p", "-t", "plain", "no paste here").returncode == 0
    for task in ("plain", "missing"):
        url = f"/api/projects/p/tasks/{task}/paste"
        got = client.get(url)
        assert got.status_code == 404 and "\n" not in got.json()["error"]
        sent = client.post(url, json={"reply": REPLY})
        assert sent.status_code == 404, sent.text
    assert client.get("/api/projects/p/tasks/plain").json()["paste"] is False
    assert not (ws.task("p", "plain").folder / "paste").exists()


def test_a_complete_session_takes_no_reply(ws: Workspace, client: TestClient) -> None:
    paste_session(ws, complete=True)
    view = client.get(URL).json()
    assert view["complete"] and view["summary"] == "all done" and view["text"] is None
    refused = client.post(URL, json={"reply": REPLY})
    assert refused.status_code == 409 and "complete" in refused.json()["error"]
    assert not list(Folders.of(ws.task()).inbox.iterdir())


def test_a_reply_handed_in_twice_is_a_409_saying_it_is_a_duplicate(
    ws: Workspace, client: TestClient
) -> None:
    paste_session(ws)
    sent = client.post(URL, json={"reply": REPLY})
    assert sent.status_code == 201
    again = client.post(URL, json={"reply": REPLY})
    assert again.status_code == 409, again.text
    assert again.json()["error"] == (
        f"the reply is a duplicate of {sent.json()['file']}, which waits in the inbox: it was not "
        "saved, so the reply is applied once"
    )
    inbox = Folders.of(ws.task()).inbox
    assert [p.name for p in inbox.iterdir()] == [sent.json()["file"]]
    # Once the run has carried it out (its digest is the session's last), it is still refused.
    (inbox / sent.json()["file"]).unlink()
    folders = Folders.of(ws.task())
    session = state.current(ws.task())
    assert session is not None
    save(folders, session.touched(sequence_number=2, replies=(digest(REPLY),)))
    applied = client.post(URL, json={"reply": REPLY.replace("\n", "\r\n")})
    assert applied.status_code == 409 and "already applied" in applied.json()["error"]
    assert not list(inbox.iterdir())


def test_the_key_guards_the_paste_routes(ws: Workspace) -> None:
    paste_session(ws)
    key = "paste-key-0123456789"
    with TestClient(create_app(Settings(root=ws.root, api_key=key)), base_url=LOCAL) as c:
        assert c.get(URL).status_code == 401
        assert c.post(URL, json={"reply": REPLY}).status_code == 401
        assert c.get(URL, headers={"X-API-Key": key}).status_code == 200
    assert not list(Folders.of(ws.task()).inbox.iterdir())
