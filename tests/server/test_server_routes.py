"""REST routes and security of the server, with Starlette's TestClient over real run folders."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.testclient import TestClient

from runagent.errors import (
    AlreadyRunningError,
    ConfigError,
    MissingDependencyError,
    NotFoundError,
    OutsideRootError,
    RunAgentError,
    UsageError,
    error_for_exit,
)
from server.app import STATIC, Settings, create_app
from tests.conftest import LOCAL, Workspace, wait_for

KEY = "test-key-0123456789"


@pytest.fixture
def done_task(ws: Workspace) -> Workspace:
    """A workspace with task p/t completed after one failed run."""
    ws.write_config(["--fail-first", "1", "--lines", "3", "--stderr", "warn"])
    assert ws.cli("--project", "p", "--task", "t", "the prompt").returncode == 0
    return ws


@pytest.fixture
def client(done_task: Workspace) -> Iterator[TestClient]:
    app = create_app(Settings(root=done_task.root, config_path=done_task.config))
    with TestClient(app, base_url=LOCAL) as c:
        yield c


def test_health_and_listings(client: TestClient, done_task: Workspace) -> None:
    health = client.get("/api/health").json()
    assert health["status"] == "ok" and health["version"]
    assert client.get("/api/projects").json() == [{"project_id": "p", "tasks": 1, "usage": None}]
    (row,) = client.get("/api/tasks").json()
    assert row["status"] == "completed" and row["runs"] == 2
    assert client.get("/api/projects/p/tasks").json()[0]["task_id"] == "t"
    detail = client.get("/api/projects/p/tasks/t").json()
    assert detail["prompt"] == "the prompt"
    first, second = detail["runs_list"]
    assert second["previous_run_id"] == first["run_id"]  # the restart chain
    runs = client.get("/api/projects/p/tasks/t/runs").json()
    assert [r["status"] for r in runs] == ["failed", "completed"]
    run = client.get(f"/api/projects/p/tasks/t/runs/{second['run_id']}").json()
    assert run["exit_code"] == 0


def test_run_files_whole_ranged_and_downloaded(client: TestClient, done_task: Workspace) -> None:
    run_id = done_task.runs()[-1].run_id
    base = f"/api/projects/p/tasks/t/runs/{run_id}/files"
    whole = client.get(f"{base}/stdout")
    assert whole.text == "line 1\nline 2\nline 3\n"
    assert whole.headers["x-file-size"] == "21"
    part = client.get(f"{base}/stdout", params={"offset": 7, "length": 6})
    assert part.text == "line 2" and part.headers["x-offset"] == "7"
    assert client.get(f"{base}/stderr").text == "warn\n"
    assert client.get(f"{base}/prompt").text.endswith("the prompt\n")
    download = client.get(f"{base}/output", params={"download": 1})
    assert "attachment" in download.headers["content-disposition"]
    assert client.get(f"{base}/stdout", params={"offset": -1}).status_code == 400


@pytest.mark.parametrize(
    "path",
    [
        "/api/projects/%2e%2e/tasks/t",
        "/api/projects/p/tasks/%2e%2e",
        "/api/projects/..%2f..%2fetc/tasks/passwd",
        "/api/projects/p/tasks/t/runs/..%2f..%2f..%2fTASK.md",
        "/api/projects/p/tasks/t/runs/%2fetc%2fpasswd",
        "/api/projects/p/tasks/t/runs/20260101-000000000-1/files/..%2frun-info.yaml",
        "/api/projects/p/tasks/t/runs/20260101-000000000-1/files/%2fetc%2fpasswd",
        "/api/projects/%2fetc/tasks/passwd",
        "/api/projects/p/tasks/t/stream?file=..%2f..%2fTASK.md",
        "/api/projects/%2e%2e/tasks/t/paste",
        "/api/projects/p/tasks/%2e%2e/paste",
        "/api/projects/p/tasks/..%2f..%2f..%2fetc/paste",
    ],
)
def test_traversal_attempts_get_404_never_a_file(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 404
    assert "root:" not in response.text and "the prompt" not in response.text


def test_symlinks_out_of_the_root_are_not_followed(
    client: TestClient, done_task: Workspace, tmp_path_factory: pytest.TempPathFactory
) -> None:
    outside = tmp_path_factory.mktemp("outside")
    secret_task = outside / "secret"
    (secret_task / "runs" / "20260101-000000000-1").mkdir(parents=True)
    (secret_task / "runs" / "20260101-000000000-1" / "agent-stdout.txt").write_text("SECRET")
    os.symlink(secret_task, done_task.root / "p" / "evil")
    run_id = done_task.runs()[-1].run_id
    run = done_task.task().run_folder(run_id)
    (run / "agent-stderr.txt").unlink()
    os.symlink(outside / "secret" / "runs" / "20260101-000000000-1" / "agent-stdout.txt",
               run / "agent-stderr.txt")  # fmt: skip
    assert client.get("/api/projects/p/tasks/evil").status_code == 404
    evil_file = "/api/projects/p/tasks/evil/runs/20260101-000000000-1/files/stdout"
    assert client.get(evil_file).status_code == 404
    linked = client.get(f"/api/projects/p/tasks/t/runs/{run_id}/files/stderr")
    assert linked.status_code == 404 and "SECRET" not in linked.text


def test_api_key_is_required_when_set(done_task: Workspace) -> None:
    app = create_app(Settings(root=done_task.root, api_key=KEY))
    with TestClient(app, base_url=LOCAL) as c:
        assert c.get("/api/health").status_code == 401
        assert c.get("/api/tasks", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/").status_code == 401
        assert c.get("/api/health", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert c.get("/api/health", headers={"X-API-Key": KEY}).status_code == 200
        # The page is opened once with ?key=: a cookie is set and the key leaves the address.
        opened = c.get(f"/?key={KEY}&x=1", follow_redirects=False)
        assert opened.status_code == 303
        assert opened.headers["location"] == "/?x=1"
        assert "httponly" in opened.headers["set-cookie"].lower()
        assert c.get("/api/tasks").status_code == 200  # the cookie now carries it
        assert c.get("/static/app.js").status_code == 200  # assets need no key


def test_writes_from_another_site_are_refused(client: TestClient) -> None:
    url = "/api/projects/p/tasks/t/resume"
    json_headers = {"Content-Type": "application/json"}
    evil = client.post(url, content="{}", headers={**json_headers, "Origin": "http://evil.test"})
    assert evil.status_code == 403 and "evil.test" in evil.json()["error"]
    cross = client.post(url, content="{}", headers={**json_headers, "Sec-Fetch-Site": "cross-site"})
    assert cross.status_code == 403
    form = client.post(
        url, content="a=b", headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    assert form.status_code == 403
    start = client.post("/api/projects/p/tasks", content='{"prompt":"x"}',
                        headers={"Content-Type": "text/plain"})  # fmt: skip
    assert start.status_code == 403


def test_start_validates_and_refuses_conflicts(client: TestClient) -> None:
    bad_id = client.post("/api/projects/p/tasks", json={"task_id": "../x", "prompt": "hi"})
    assert bad_id.status_code == 404
    no_prompt = client.post("/api/projects/p/tasks", json={"task_id": "n"})
    assert no_prompt.status_code == 400 and "prompt is required" in no_prompt.json()["error"]
    nul = client.post("/api/projects/p/tasks", json={"task_id": "n", "prompt": "a\u0000b"})
    assert nul.status_code == 400 and "NUL byte" in nul.json()["error"]
    blank = client.post("/api/projects/p/tasks", json={"task_id": "n", "prompt": "  "})
    assert blank.status_code == 400 and "empty" in blank.json()["error"]
    assert not (client.app.state.hub.root / "p" / "n").exists()  # type: ignore[attr-defined]
    other = client.post("/api/projects/p/tasks", json={"task_id": "t", "prompt": "different"})
    assert other.status_code == 409
    not_json = client.post(
        "/api/projects/p/tasks", content="{", headers={"Content-Type": "application/json"}
    )
    assert not_json.status_code == 400


def test_start_stop_and_resume_through_the_api(ws: Workspace) -> None:
    ws.write_config(["--lines", "1", "--sleep", "60", "--grandchild"])
    app = create_app(Settings(root=ws.root, config_path=ws.config, workdir=ws.path))
    with TestClient(app, base_url=LOCAL) as c:
        started = c.post("/api/projects/p/tasks", json={"task_id": "live", "prompt": "go"})
        assert started.status_code == 202, started.text
        body = started.json()
        assert body["task_id"] == "live" and body["supervisor_pid"] > 0
        wait_for(lambda: len(ws.agent_pids()) == 2, what="the agent and its child")
        assert c.get("/api/projects/p/tasks/live").json()["status"] == "running"
        again = c.post("/api/projects/p/tasks/live/resume", json={})
        assert again.status_code == 409 and "already running" in again.json()["error"]
        stopped = c.post("/api/projects/p/tasks/live/stop", json={})
        assert stopped.status_code == 200 and stopped.json()["stopped"]
        assert c.get("/api/projects/p/tasks/live").json()["status"] == "stopped"
        ws.write_config(["--exit", "0"])
        resumed = c.post("/api/projects/p/tasks/live/resume", json={})
        assert resumed.status_code == 202
        wait_for(
            lambda: c.get("/api/projects/p/tasks/live").json()["status"] == "completed",
            what="the resumed loop to complete",
        )
        generated = c.post("/api/projects/p/tasks", json={"prompt": "no id given"}).json()
        assert generated["task_id"].startswith("task-")
        wait_for(lambda: c.get(f"/api/projects/p/tasks/{generated['task_id']}").json()["status"]
                 == "completed", what="the generated task")  # fmt: skip


def test_the_page_and_its_assets_are_served(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "<title>run-agent</title>" in page.text
    icon = client.get("/favicon.ico")  # asked for on every page load, whatever the page says
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    assert "http" not in page.text.replace('"/static/', "")  # nothing fetched from outside
    assert (
        client.get("/static/app.js")
        .headers["content-type"]
        .startswith(("application/javascript", "text/javascript"))
    )
    assert client.get("/static/style.css").status_code == 200


# `<script type="module" src="/static/X">` in the page, and `import ... from "./X"` in a module.
MODULE_SCRIPT = re.compile(r'<script type="module" src="/static/([^"]+)"></script>')
PRELOAD = re.compile(r'<link rel="modulepreload" href="/static/([^"]+)">')
IMPORT = re.compile(r'^import\s[^;]*?\bfrom\s+"\./([^"]+)";', re.M | re.S)


def test_every_module_of_the_page_is_reached_from_index_html(client: TestClient) -> None:
    """The page is ES modules with no build step: each module in static/ is loaded through the
    import graph that starts at the page's module script (none is dead), each is served as
    JavaScript (a browser refuses to run a module served as anything else), each opens with a
    comment saying what it owns, and no two modules import each other, directly or round about."""
    page = client.get("/").text
    assert "<script" not in MODULE_SCRIPT.sub("", page)  # no classic script left
    entries = MODULE_SCRIPT.findall(page)
    assert entries == ["app.js"]
    imports: dict[str, list[str]] = {}
    todo = list(entries)
    while todo:
        name = todo.pop()
        if name in imports:
            continue
        response = client.get(f"/static/{name}")
        assert response.status_code == 200, name
        # Either JavaScript type runs a module; which one depends on the system's table of types.
        javascript = ("text/javascript", "application/javascript")
        assert response.headers["content-type"].startswith(javascript), name
        assert response.text.startswith("// "), f"{name} opens without saying what it owns"
        imports[name] = IMPORT.findall(response.text)
        todo += imports[name]
    assert set(imports) == {p.name for p in STATIC.glob("*.js")}
    # All asked for at once as the page opens, not one import level after another.
    assert sorted(PRELOAD.findall(page)) == sorted(imports)

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import cycle: {' -> '.join((*path[path.index(name) :], name))}"
        for imported in imports[name]:
            visit(imported, (*path, name))

    visit("app.js", ())


def test_the_pages_files_are_served_with_their_type_and_revalidated(client: TestClient) -> None:
    """Each module is sent as JavaScript whatever the system's table of types says, with an ETag
    the browser revalidates on each load (so an upgrade never mixes old and new modules)."""
    first = client.get("/static/app.js")
    assert first.headers["content-type"] == "text/javascript; charset=utf-8"
    assert first.text == (STATIC / "app.js").read_text()
    assert first.headers["cache-control"] == "no-cache"
    again = client.get("/static/app.js", headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    assert client.get("/static/style.css").headers["content-type"].startswith("text/css")
    for missing in ("nothing.js", ".hidden.js", "%2E%2E", "..%2Fassets.py", "index.py"):
        assert client.get(f"/static/{missing}").status_code == 404, missing


def test_serve_refuses_a_public_address_without_a_key(ws: Workspace) -> None:
    proc = ws.cli("serve", "--host", "0.0.0.0", "--port", "1", timeout=30)
    assert proc.returncode == 2
    assert "refusing to serve on 0.0.0.0" in proc.stderr and "RUN_AGENT_API_KEY" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_serve_says_when_the_port_is_taken(ws: Workspace) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = ws.cli("serve", "--port", str(port), timeout=30)
    assert proc.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in proc.stderr


def test_a_start_the_supervisor_refuses_answers_with_its_one_line_reason(ws: Workspace) -> None:
    app = create_app(Settings(root=ws.root, config_path=ws.config, workdir=ws.path))
    with TestClient(app, base_url=LOCAL) as c:
        body = {"task_id": "t", "prompt": "x", "agent": "no-such-agent"}
        refused = c.post("/api/projects/p/tasks", json=body)
        assert refused.status_code == 400
        assert refused.json()["error"].startswith("unknown agent 'no-such-agent'")


REBOUND = {"Host": "evil.example:14355"}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/"),
        ("GET", "/api/tasks"),
        ("GET", "/api/projects"),
        ("GET", "/api/projects/p/tasks/t"),
        ("GET", "/api/events"),
        ("GET", "/api/projects/p/tasks/t/stream"),
        ("POST", "/api/projects/p/tasks"),
        ("POST", "/api/projects/p/tasks/t/stop"),
        ("GET", "/api/projects/p/tasks/t/paste"),
        ("POST", "/api/projects/p/tasks/t/paste"),
    ],
)
def test_a_rebound_host_name_gets_nothing(
    client: TestClient, done_task: Workspace, method: str, path: str
) -> None:
    """A page on another site whose name resolves to 127.0.0.1 sends its own name as Host."""
    headers = {**REBOUND, "Origin": "http://evil.example:14355", "Content-Type": "application/json"}
    body = '{"task_id": "rebind", "prompt": "x"}' if method == "POST" else None
    response = client.request(method, path, headers=headers, content=body)
    assert response.status_code == 421, response.text
    assert "evil.example" in response.json()["error"]
    assert "allowed_hosts" in response.json()["error"]
    assert not (done_task.root / "p" / "rebind").exists()


@pytest.mark.parametrize(
    "host", ["127.0.0.1:14355", "localhost:80", "LOCALHOST.", "[::1]:14355", "127.0.0.2", "::1"]
)
def test_loopback_host_names_are_answered(client: TestClient, host: str) -> None:
    assert client.get("/api/tasks", headers={"Host": host}).status_code == 200


def test_configured_host_names_are_answered(done_task: Workspace) -> None:
    from server.security import allowed_hosts

    hosts = allowed_hosts("127.0.0.1", ["runs.example.org"])
    app = create_app(Settings(root=done_task.root, allowed_hosts=hosts))
    with TestClient(app, base_url="http://runs.example.org") as c:
        assert c.get("/api/tasks").status_code == 200
        assert c.get("/api/tasks", headers=REBOUND).status_code == 421
    # Listening on an address answers to that address too.
    assert "192.0.2.7" in allowed_hosts("192.0.2.7")
    assert "192.0.2.7" not in allowed_hosts("127.0.0.1")


def test_a_key_in_the_url_is_taken_only_when_opening_the_page(done_task: Workspace) -> None:
    app = create_app(Settings(root=done_task.root, api_key=KEY))
    with TestClient(app, base_url=LOCAL) as c:
        json_headers = {"Content-Type": "application/json"}
        post = c.post(f"/api/projects/p/tasks?key={KEY}", content='{"prompt":"x"}',
                      headers=json_headers)  # fmt: skip
        assert post.status_code == 401
        assert c.get(f"/api/tasks?key={KEY}").status_code == 401
        assert c.get(f"/api/events?key={KEY}").status_code == 401
        assert not (done_task.root / "p").joinpath("x").exists()
        assert c.get(f"/?key={KEY}", follow_redirects=False).status_code == 303


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("files", {"offset": "²"}),
        ("files", {"offset": "1" + "0" * 21}),
        ("files", {"length": "1" + "0" * 21}),
        ("files", {"length": ""}),
        ("files", {"offset": "-0"}),
        ("stream", {"from": "²"}),
        ("stream", {"from": "%C2%B2"}),
        ("stream", {"from": "1" + "0" * 26}),
        ("stream", {"Last-Event-ID": "²"}),
        ("stream", {"Last-Event-ID": "1" + "0" * 26}),
        ("task", {"Last-Event-ID": "x:²"}),
        ("task", {"from": "20260101-000000000-1:" + "9" * 30}),
        ("task", {"Last-Event-ID": "garbage"}),
    ],
)
def test_bad_offsets_are_a_400_naming_the_value(
    client: TestClient, done_task: Workspace, where: str, value: dict[str, str]
) -> None:
    run_id = done_task.runs()[-1].run_id
    url = {
        "files": f"/api/projects/p/tasks/t/runs/{run_id}/files/stdout",
        "stream": f"/api/projects/p/tasks/t/runs/{run_id}/stream/stdout",
        "task": "/api/projects/p/tasks/t/stream",
    }[where]
    headers = {k: v.encode() for k, v in value.items() if k == "Last-Event-ID"}
    params = {k: v for k, v in value.items() if k != "Last-Event-ID"}
    response = client.get(url, params=params, headers=headers)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    shown = next(iter(value.values()))[:12]
    as_header = shown.encode().decode("latin-1")  # how a server reads header bytes
    assert shown in error or as_header in error or "beyond any file" in error, error
    assert "\n" not in error


def test_a_length_past_the_end_is_the_rest_of_the_file(
    client: TestClient, done_task: Workspace
) -> None:
    run_id = done_task.runs()[-1].run_id
    url = f"/api/projects/p/tasks/t/runs/{run_id}/files/stdout"
    assert client.get(url, params={"offset": 14, "length": 10**18}).text == "line 3\n"
    assert client.get(url, params={"offset": 10**18}).text == ""


def test_the_lines_before_an_offset_are_counted_without_reading_them_out(
    client: TestClient, done_task: Workspace
) -> None:
    run_id = done_task.runs()[-1].run_id
    url = f"/api/projects/p/tasks/t/runs/{run_id}/files/stdout/lines"  # "line 1\nline 2\nline 3\n"
    assert client.get(url, params={"offset": 0}).json() == {"offset": 0, "newlines": 0}
    assert client.get(url, params={"offset": 7}).json() == {"offset": 7, "newlines": 1}
    assert client.get(url, params={"offset": 10}).json() == {"offset": 10, "newlines": 1}
    assert client.get(url, params={"offset": 10**18}).json() == {"offset": 21, "newlines": 3}
    bad = client.get(url, params={"offset": "x"})
    assert bad.status_code == 400 and "'x'" in bad.json()["error"]
    missing = client.get(url.replace("/stdout/", "/nope/"))
    assert missing.status_code == 404 and "'nope'" in missing.json()["error"]


def test_a_big_files_lines_are_counted_across_chunks(tmp_path: Path) -> None:
    from server.app import COUNT_CHUNK, newlines_before

    path = tmp_path / "big.txt"
    line = b"x" * 99 + b"\n"
    lines = 3 * COUNT_CHUNK // len(line) + 7  # several chunks, none ending on a line
    path.write_bytes(line * lines)
    fence = str(tmp_path.resolve())
    assert newlines_before(fence, path, path.stat().st_size) == lines
    assert newlines_before(fence, path, 250) == 2
    assert newlines_before(fence, tmp_path / "gone.txt", 100) == 0
    assert newlines_before(f"{fence}-elsewhere", path, 250) == 0  # outside its project: none


def test_a_deeply_nested_body_is_a_400(client: TestClient) -> None:
    body = "[" * 100_000 + "]" * 100_000
    response = client.post(
        "/api/projects/p/tasks", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400 and "JSON" in response.json()["error"]


def test_bad_loop_settings_in_a_start_are_a_400_before_anything_is_written(
    client: TestClient, done_task: Workspace
) -> None:
    for body, named in (({"timeout": "soon"}, "timeout"), ({"max_restarts": -2}, "max_restarts"),
                        ({"until": "never"}, "until")):  # fmt: skip
        response = client.post(
            "/api/projects/p/tasks", json={"task_id": "n", "prompt": "x", **body}
        )
        assert response.status_code == 400 and named in response.json()["error"]
    assert not (done_task.root / "p" / "n").exists()


def test_a_completed_task_runs_again_through_the_api_only_when_asked(
    done_task: Workspace,
) -> None:
    app = create_app(Settings(root=done_task.root, config_path=done_task.config,
                              workdir=done_task.path))  # fmt: skip
    with TestClient(app, base_url=LOCAL) as c:
        refused = c.post("/api/projects/p/tasks/t/resume", json={})
        assert refused.status_code == 409 and '"again": true' in refused.json()["error"]
        same = c.post("/api/projects/p/tasks", json={"task_id": "t", "prompt": "the prompt"})
        assert same.status_code == 409
        assert len(done_task.runs()) == 2
        again = c.post("/api/projects/p/tasks/t/resume", json={"again": True})
        assert again.status_code == 202, again.text
        wait_for(
            lambda: (
                len(done_task.runs()) == 3
                and c.get("/api/projects/p/tasks/t").json()["status"] == "completed"
            ),
            what="the run again",
        )


@pytest.mark.parametrize(
    "error, status",
    [(NotFoundError("no task"), 404), (OutsideRootError("out"), 404), (UsageError("bad"), 400),
     (ConfigError("bad key"), 400), (AlreadyRunningError("busy"), 409),
     (MissingDependencyError("no codex"), 424), (RunAgentError("broke"), 500),
     (error_for_exit(2, "unknown agent 'x'"), 400), (error_for_exit(75, "busy"), 409)],
)  # fmt: skip
def test_each_kind_of_error_is_its_http_status_with_a_json_message(
    tmp_path: Path, error: RunAgentError, status: int
) -> None:
    async def fail(request: Request) -> Response:
        raise error

    app = create_app(Settings(root=tmp_path))
    app.router.routes.append(Route("/api/fail", fail))
    with TestClient(app, base_url=LOCAL, raise_server_exceptions=False) as c:
        response = c.get("/api/fail")
    assert (response.status_code, response.json()) == (status, {"error": str(error)})


def test_starlettes_own_refusals_are_json_too(client: TestClient) -> None:
    missing = client.get("/api/no-such-route")
    assert (missing.status_code, missing.json()) == (404, {"error": "Not Found"})
    wrong = client.delete("/api/tasks")
    assert (wrong.status_code, wrong.json()) == (405, {"error": "Method Not Allowed"})
    assert set(wrong.headers["allow"].split(", ")) == {"GET", "HEAD"}  # a set: any order


def test_a_task_says_what_it_used_how_its_loop_ended_and_its_size(ws: Workspace) -> None:
    ws.write_config(["--lines", "1", "--exit", "1"], max_restarts=1)
    app = create_app(Settings(root=ws.root, config_path=ws.config, workdir=ws.path))
    with TestClient(app, base_url=LOCAL) as c:
        assert c.post("/api/projects/p/tasks", json={"task_id": "t", "prompt": "go"}).is_success
        url = "/api/projects/p/tasks/t"
        detail = wait_for(
            lambda: (d := c.get(url).json())["status"] == "failed" and d, what="the loop to end"
        )
    # The detached supervisor's last word, as `run-agent run` would have printed it.
    assert "gave up after 2 failed attempts (max_restarts 1)" in detail["loop_message"]
    assert detail["usage"] is None  # the fake agent reports no usage
    assert detail["disk_bytes"] > 0
    # Usage the runs recorded is summed over the task.
    for run_id, tokens in zip(ws.task().run_ids(), (10, 5), strict=True):
        path = ws.task().run_folder(run_id) / "run-info.yaml"
        path.write_text(path.read_text() + f"tokens_in: {tokens}\ntokens_out: 1\ncost_usd: 0.5\n")
    with TestClient(app, base_url=LOCAL) as c:
        usage = c.get(url).json()["usage"]
    assert usage == {"tokens_in": 15, "tokens_out": 2, "cost_usd": 1.0}


def test_the_agents_for_the_start_form_are_the_config_files(ws: Workspace) -> None:
    import backends
    from runagent.cli.options import usable_backend

    ws.write_config(agents={"other": ["--lines", "1"]})
    app = create_app(Settings(root=ws.root, config_path=ws.config, check_agent=usable_backend,
                              backend_names=backends.known()))  # fmt: skip
    with TestClient(app, base_url=LOCAL) as c:
        choices = c.get("/api/agents").json()
        assert choices["default"] == "fake"
        assert [(a["name"], a["type"]) for a in choices["agents"]] == [
            ("fake", "command"),
            ("other", "command"),
            ("paste", "paste"),  # a built-in needing no config: the page can start one
        ]
        ws.write_config(agents={"third": ["--lines", "1"]})  # read afresh, as a start reads it
        assert "third" in [a["name"] for a in c.get("/api/agents").json()["agents"]]
    # A server not handed the backends cannot read the config: it offers a free-text agent.
    with TestClient(create_app(Settings(root=ws.root)), base_url=LOCAL) as c:
        assert c.get("/api/agents").json() == {"default": None, "agents": []}


def test_delete_removes_a_finished_task_and_refuses_a_running_one(ws: Workspace) -> None:
    ws.write_config(["--lines", "1", "--sleep", "60"], max_restarts=0)
    app = create_app(Settings(root=ws.root, config_path=ws.config, workdir=ws.path))
    with TestClient(app, base_url=LOCAL) as c:
        assert c.post("/api/projects/p/tasks", json={"task_id": "t", "prompt": "go"}).is_success
        wait_for(lambda: ws.agent_pids(), what="the agent")
        url = "/api/projects/p/tasks/t"
        refused = c.request("DELETE", url, json={})
        assert refused.status_code == 409 and "stop it first" in refused.json()["error"]
        assert ws.task().folder.is_dir()
        cross = c.request("DELETE", url, json={}, headers={"Origin": "http://evil.example"})
        assert cross.status_code == 403
        assert c.post(f"{url}/stop", json={}).json()["stopped"]
        deleted = c.request("DELETE", url, json={})
        assert deleted.status_code == 200, deleted.text
        assert deleted.json()["deleted"] == "p/t" and deleted.json()["freed_bytes"] > 0
        assert not ws.task().folder.exists()
        assert c.request("DELETE", url, json={}).status_code == 404
        assert c.request("DELETE", "/api/projects/p/tasks/..%2F..", json={}).status_code == 404


def test_a_working_folder_that_is_not_one_is_refused_before_anything_is_made(
    ws: Workspace,
) -> None:
    app = create_app(Settings(root=ws.root, config_path=ws.config, workdir=ws.path))
    with TestClient(app, base_url=LOCAL) as c:
        body = {"task_id": "nowhere", "prompt": "go", "cwd": "no-such-folder"}
        refused = c.post("/api/projects/p/tasks", json=body)
        assert refused.status_code == 400
        assert "cwd 'no-such-folder' is not a folder" in refused.json()["error"]
        bad = c.post("/api/projects/p/tasks", json={**body, "cwd": "", "timeout": "soon"})
        assert bad.status_code == 400 and "timeout" in bad.json()["error"]
    assert not ws.task("p", "nowhere").folder.exists()


def test_a_huge_run_file_is_sent_a_piece_at_a_time_never_held_whole(ws: Workspace) -> None:
    """A run's stdout of 3 GiB (sparse: an agent can make its own stdout so): the file route
    streams it, the server's memory stays small while a client reads its start."""
    import httpx
    import psutil

    from tests.conftest import serving

    ws.write_config(["--lines", "1"], max_restarts=0)
    assert ws.cli("-p", "p", "-t", "t", "go").returncode == 0
    (run,) = ws.runs()
    stdout = ws.task().run(run.run_id).stdout
    with open(stdout, "r+b") as f:
        f.truncate(3 << 30)
    with serving(ws) as url:
        port = url.rsplit(":", 1)[1]
        argvs = [(p, p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])]
        (server,) = [p for p, argv in argvs if "serve" in argv and port in argv]
        address = f"{url}/api/projects/p/tasks/t/runs/{run.run_id}/files/stdout?download=1"
        with httpx.stream("GET", address, timeout=60) as answer:
            assert answer.status_code == 200
            assert answer.headers["X-File-Size"] == str(3 << 30)
            start = next(answer.iter_bytes(1 << 20))
            assert start.startswith(b"line 1")
            assert server.memory_info().rss < 1 << 30, "the server holds the file whole"
