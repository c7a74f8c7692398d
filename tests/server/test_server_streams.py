"""SSE end to end: `run-agent serve` on 127.0.0.1, real agents writing, real SSE clients."""

from __future__ import annotations

import json
import threading

import httpx

from tests import sse
from tests.conftest import Server, Workspace, wait_for

# A line, then "é" (c3 a9) and "€" (e2 82 ac) each split across two writes, then a lone \r.
CHUNKS = ["6869207468657265", "0a", "c3", "a90a", "e282", "ac0a", "0d", "6c617374", "0a"]
EXPECTED = bytes.fromhex("".join(CHUNKS))


def start_task(server: Server, task: str = "t", prompt: str = "go") -> None:
    response = httpx.post(
        f"{server.url}/api/projects/p/tasks", json={"task_id": task, "prompt": prompt}, timeout=30
    )
    assert response.status_code == 202, response.text


def test_a_client_that_reconnects_with_last_event_id_gets_exactly_the_missing_bytes(
    ws: Workspace, server: Server
) -> None:
    go = ws.path / "go"
    ws.write_config(
        ["--lines", "3", "--line-text", "before", "--hold-at", "3", "--hold-for", str(go),
         "--chunks", *CHUNKS, "--interval", "0.05"],
        max_restarts=0,
    )  # fmt: skip
    start_task(server)
    run_id = wait_for(lambda: ws.task().run_ids(), what="the run")[0]
    url = f"{server.url}/api/projects/p/tasks/t/runs/{run_id}/stream/stdout"
    received = b""
    last_id = None
    # First connection: read until the three "before" lines arrived, then drop the connection
    # while the agent is still running (it waits for `go`).
    for message in sse.stream(url):
        if message.event == "data":
            received += str(message.json()).encode()
            last_id = message.id
            assert last_id == str(len(received))  # the id is the byte offset after the data
        if received.count(b"\n") >= 3:
            break
    assert received == b"before 1\nbefore 2\nbefore 3\n"
    go.touch()  # the agent now writes split characters while nobody is connected
    wait_for(lambda: ws.task().run(run_id).stdout.read_bytes().endswith(
        b"last\n"), what="the agent to finish writing")  # fmt: skip
    statuses = []
    ended = False
    for message in sse.stream(url, headers={"Last-Event-ID": last_id or "0"}):
        if message.event == "data":
            data = str(message.json()).encode()
            received += data
            assert message.id == str(len(received))
        elif message.event == "status":
            statuses.append(message.json()["status"])  # type: ignore[index]
        elif message.event == "end":
            ended = True
            assert message.id == str(len(received))
    assert ended
    assert received == ws.task().run(run_id).stdout.read_bytes()
    assert received.endswith(EXPECTED)
    assert statuses[-1] == "completed"


def test_from_offset_and_a_new_client_gets_the_backlog(ws: Workspace, server: Server) -> None:
    ws.write_config(["--lines", "4"], max_restarts=0)
    start_task(server)
    run_id = wait_for(lambda: ws.task().run_ids(), what="the run")[0]
    wait_for(lambda: ws.runs() and ws.runs()[0].status == "completed", what="completion")
    base = f"{server.url}/api/projects/p/tasks/t/runs/{run_id}/stream/stdout"
    whole = "".join(str(m.json()) for m in sse.stream(base) if m.event == "data")
    assert whole == "line 1\nline 2\nline 3\nline 4\n"
    tail = "".join(str(m.json()) for m in sse.stream(f"{base}?from=14") if m.event == "data")
    assert tail == "line 3\nline 4\n"


def test_the_task_stream_follows_the_loop_into_the_next_attempt(
    ws: Workspace, server: Server
) -> None:
    # Each attempt waits, once its lines are out, until the stream has shown the first run: a
    # client that joins late would start at the latest run, not at attempt 1.
    go = ws.path / "go"
    ws.write_config(["--fail-first", "2", "--lines", "2", "--interval", "0.05",
                     "--wait-for", str(go)], max_restarts=3)  # fmt: skip
    start_task(server)
    events = []
    for message in sse.stream(f"{server.url}/api/projects/p/tasks/t/stream?file=stdout"):
        events.append(message)
        if message.event == "run":
            go.touch()
    runs = [m.json() for m in events if m.event == "run"]
    assert [r["attempt"] for r in runs] == [1, 2, 3]  # type: ignore[index]
    text = "".join(str(m.json()) for m in events if m.event == "data")
    assert text == "line 1\nline 2\n" * 3
    assert events[-1].event == "end" and events[-1].json()["status"] == "completed"  # type: ignore[index]
    # Ids carry the run: a reconnect resumes inside the right run.
    last_data = [m for m in events if m.event == "data"][-1]
    assert last_data.id is not None and last_data.id.startswith(str(runs[-1]["run_id"]) + ":")  # type: ignore[index]


def test_the_root_stream_announces_new_tasks_and_status_changes(
    ws: Workspace, server: Server
) -> None:
    go = ws.path / "go"
    ws.write_config(["--wait-for", str(go)], max_restarts=0)
    seen: list[tuple[str, object]] = []
    done = threading.Event()

    def listen() -> None:
        for message in sse.stream(f"{server.url}/api/events", timeout=60):
            seen.append((message.event, message.json()))
            statuses = [d.get("status") for e, d in seen if e == "task" and isinstance(d, dict)]
            if "completed" in statuses:
                break
        done.set()

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    wait_for(lambda: seen and seen[0][0] == "snapshot", what="the snapshot")
    start_task(server, task="new")
    wait_for(lambda: any(e == "task" and d.get("status") == "running" for e, d in seen  # type: ignore[union-attr]
                         ), what="the running task")  # fmt: skip
    go.touch()
    assert done.wait(30), f"no completed event; saw {json.dumps(seen)[:500]}"
    assert seen[0] == ("snapshot", [])


def test_the_root_stream_says_when_a_loop_says_how_it_ended(ws: Workspace, server: Server) -> None:
    """A detached loop prints its last word to supervisor.log after it let go of the task, when
    the row no longer changes: a `loop` event tells the page to read the task again."""
    task = ws.task("p", "ended")
    task.folder.mkdir(parents=True)
    (task.folder / "TASK.md").write_text("the prompt")
    log = task.folder / "supervisor.log"
    log.write_text("run-agent: attempt 1/1: run r started\n")
    seen: list[tuple[str, object]] = []
    done = threading.Event()

    def listen() -> None:
        for message in sse.stream(f"{server.url}/api/events", timeout=60):
            seen.append((message.event, message.json()))
            if message.event == "loop":
                break
        done.set()

    threading.Thread(target=listen, daemon=True).start()
    wait_for(lambda: seen and seen[0][0] == "snapshot", what="the snapshot")
    with log.open("a") as f:
        f.write("run-agent: gave up after 1 failed attempt (max_restarts 0)\n")
    assert done.wait(30), f"no loop event; saw {json.dumps(seen)[:500]}"
    assert seen[-1] == ("loop", {"project_id": "p", "task_id": "ended"})


def test_a_stream_of_a_missing_run_is_404(server: Server) -> None:
    response = httpx.get(
        f"{server.url}/api/projects/p/tasks/t/runs/20260101-000000000-1/stream/stdout"
    )
    assert response.status_code == 404


def test_a_quiet_stream_sends_heartbeat_comments(ws: Workspace) -> None:
    """A heartbeat keeps proxies from dropping a quiet stream and lets clients notice a dead one."""
    import asyncio

    import uvicorn

    from server.app import Settings, create_app
    from tests.conftest import free_port

    go = ws.path / "go"
    ws.write_config(["--wait-for", str(go)], max_restarts=0)
    loop = ws.start_cli("--project", "p", "--task", "t", "x")
    run_id = wait_for(lambda: ws.task().run_ids(), what="the run")[0]
    port = free_port()
    app = create_app(Settings(root=ws.root, heartbeat=0.3))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, what="uvicorn")
        url = f"http://127.0.0.1:{port}/api/projects/p/tasks/t/runs/{run_id}/stream/stdout"
        comments = 0
        with httpx.Client(timeout=10) as client, client.stream("GET", url) as response:
            for line in response.iter_lines():
                if line.startswith(":"):
                    comments += 1
                if comments == 2:
                    break
        assert comments == 2
    finally:
        go.touch()
        server.should_exit = True
        thread.join(10)
    loop.communicate(timeout=30)
    assert ws.runs()[0].status == "completed"


def test_a_rebound_host_name_gets_nothing_from_a_real_server(ws: Workspace, server: Server) -> None:
    """DNS rebinding end to end: a page on evil.example that resolves to 127.0.0.1."""
    evil = {"Host": "evil.example:14355", "Origin": "http://evil.example:14355"}
    with httpx.Client(base_url=server.url, headers=evil, timeout=10) as client:
        assert client.get("/api/tasks").status_code == 421
        with client.stream("GET", "/api/events") as events:
            assert events.status_code == 421
        started = client.post("/api/projects/rebind/tasks", json={"prompt": "x", "task_id": "t"})
        assert started.status_code == 421
    assert not (ws.root / "rebind").exists() and not ws.agent_pids()
    assert httpx.get(f"{server.url}/api/tasks", timeout=10).status_code == 200


def test_a_refused_start_leaves_no_task_behind(ws: Workspace, server: Server) -> None:
    """Validate everything before creating anything: an unknown agent, a missing working folder."""
    url = f"{server.url}/api/projects/p/tasks"
    claud = httpx.post(url, json={"task_id": "a", "prompt": "x", "agent": "claud"}, timeout=30)
    assert claud.status_code == 400 and "did you mean 'claude'?" in claud.json()["error"]
    nowhere = httpx.post(url, json={"task_id": "b", "prompt": "x", "cwd": "/no/such/dir"},
                         timeout=30)  # fmt: skip
    assert nowhere.status_code == 400 and "/no/such/dir" in nowhere.json()["error"]
    assert not (ws.root / "p").exists() or not list((ws.root / "p").iterdir())
    retry = httpx.post(url, json={"task_id": "a", "prompt": "another prompt"}, timeout=30)
    assert retry.status_code == 202  # the id is not blocked by the refused start
    wait_for(lambda: ws.cli("status", "-p", "p", "-t", "a").stdout.count("completed"))


def test_resume_from_the_page_runs_the_agent_the_task_was_started_with(
    ws: Workspace, server: Server
) -> None:
    ws.write_config(agents={"slowfail": ["--exit", "1"]}, max_restarts=0)  # default `fake` exits 0
    url = f"{server.url}/api/projects/p/tasks"
    started = httpx.post(url, json={"task_id": "t", "prompt": "x", "agent": "slowfail"}, timeout=30)
    assert started.status_code == 202, started.text
    wait_for(lambda: [r.status.value for r in ws.runs()] == ["failed"], what="the first run")
    wait_for(lambda: "running" not in ws.cli("status", "-p", "p", "-t", "t").stdout)
    resumed = httpx.post(f"{url}/t/resume", json={}, timeout=30)
    assert resumed.status_code == 202, resumed.text
    wait_for(lambda: len(ws.runs()) == 2 and ws.runs()[1].status.value == "failed",
             what="the resumed run")  # fmt: skip
    assert [r.agent for r in ws.runs()] == ["slowfail", "slowfail"]  # never the default agent


def test_ctrl_c_with_a_browser_connected_ends_its_streams_cleanly(
    ws: Workspace, server: Server
) -> None:
    import signal

    seen: list[str] = []
    outcome: dict[str, object] = {}

    def listen() -> None:
        try:
            for message in sse.stream(f"{server.url}/api/events"):
                seen.append(message.event)
        except httpx.HTTPError as exc:  # a response cut off mid-stream
            outcome["error"] = exc

    client = threading.Thread(target=listen, daemon=True)
    client.start()
    wait_for(lambda: "snapshot" in seen, what="the client to be streaming")
    server.process.send_signal(signal.SIGINT)
    out, _ = server.process.communicate(timeout=30)
    client.join(timeout=30)
    assert server.process.returncode is not None
    assert "ASGI" not in out and "ERROR" not in out and "Traceback" not in out, out
    assert "error" not in outcome, outcome
