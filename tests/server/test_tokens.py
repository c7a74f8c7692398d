"""Scoped API tokens: made, listed and revoked with `run-agent token`, and checked on every
route of a real `run-agent serve` (REST and SSE alike) with every scope, a project limit, and
tokens that must be refused (expired, revoked, one character changed)."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import yaml
from starlette.routing import Route

from runagent import listing
from runagent.store import tokens
from runagent.store.credentials import TOKEN
from server.app import Settings, create_app
from tests.conftest import Workspace, serving, wait_for

KEY = "k" * 40
MINE, THEIRS = "mine", "theirs"
WRITE = {"content-type": "application/json"}


def tree(root: Path) -> dict[str, tuple[int, int | bytes]]:
    """Every file under the root, with its size and time: what a refused request must leave.
    The schedules' state and lock by their content, but when the scheduler last looked: the
    server's scheduler rewrites them on its own at each tick, whatever a request does."""
    found: dict[str, tuple[int, int | bytes]] = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if name.startswith("..schedules.yaml.") and name.endswith(".tmp"):
                continue  # the scheduler's own write of its state, caught in flight (CI)
            info = os.lstat(path)
            if name in (".schedules.yaml", ".schedules.lock"):
                kept = [line for line in Path(path).read_bytes().splitlines()
                        if b"last_checked:" not in line]  # fmt: skip
                found[path] = (0, b"\n".join(kept))
            elif os.path.basename(folder) == ".fleet" and name.endswith(".db"):
                # The queue by what it holds: the server's scheduler takes the fleet's lock and
                # reads the queue at its own ticks, which moved their times in CI.
                with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                    found[path] = (0, "\n".join(db.iterdump()).encode())
            elif os.path.basename(folder) == ".fleet" and (
                name.endswith(("lock", "-wal", "-shm", "-journal"))
            ):
                found[path] = (0, 0)  # there, whenever it was last taken
            else:
                found[path] = (info.st_size, info.st_mtime_ns)
    return found


@dataclass
class Credential:
    name: str
    secret: str | None
    scope: tokens.Scope | None  # None: refused outright (a 401)
    limited: bool = False


def credentials(root: Path) -> list[Credential]:
    """The api_key, a token of each scope for all projects and for MINE only, and three that
    must be refused: expired, revoked, and a good one with one character changed."""
    made = [Credential("none", None, None), Credential("api_key", KEY, tokens.Scope.ADMIN)]
    for scope in tokens.Scope:
        secret, _ = tokens.create(root, scope)
        made.append(Credential(scope.word, secret, scope))
        secret, _ = tokens.create(root, scope, [MINE])
        made.append(Credential(f"{scope.word}@{MINE}", secret, scope, limited=True))
    long_ago = datetime.now(UTC) - timedelta(days=2)
    expired, _ = tokens.create(root, tokens.Scope.ADMIN, expires=3600, now=long_ago)
    revoked, record = tokens.create(root, tokens.Scope.ADMIN)
    tokens.revoke(root, record.id)
    good = made[-1].secret or ""
    changed = good[:-1] + ("A" if good[-1] != "A" else "B")
    made += [Credential("expired", expired, None), Credential("revoked", revoked, None),
             Credential("one character changed", changed, None)]  # fmt: skip
    return made


def needs(method: str, path: str) -> tokens.Scope:
    if method in ("GET", "HEAD"):
        return tokens.Scope.ADMIN if path == "/api/gc" else tokens.Scope.READ
    return tokens.Scope.ADMIN if method == "DELETE" or path == "/api/gc" else tokens.Scope.OPERATE


# The routes with no project in their path that show or change the whole root: a token limited
# to projects gets them cut to its projects (listings, events, /metrics), except these (403).
WHOLE_ROOT = {"/api/gc", "/api/fleet/hold", "/api/fleet/release"}  # every project's
SSE = ("/stream", "/api/events")


@dataclass
class Target:
    """One request to try: the filled-in path, the project it reaches (None: none in
    particular) and the route's pattern."""

    method: str
    pattern: str
    path: str
    project: str | None


def targets(runs: dict[str, str], ops: dict[str, str]) -> Iterator[Target]:
    """Every route of the app (so a new one cannot go untried), each method, with its path
    filled for MINE and for THEIRS where it names a project. Writes name a task that does not
    exist, so an allowed one answers (404, 400) without changing anything."""
    app = create_app(Settings(root=Path("/nonexistent"), run_schedules=False))
    for route in app.routes:
        assert isinstance(route, Route)
        if route.path.startswith("/static/"):
            continue
        for method in sorted((route.methods or {"GET"}) - {"HEAD"}):
            reading = method == "GET"
            for project in (MINE, THEIRS) if "{" in route.path else (None,):
                params = {"project": project or "", "task": "t1" if reading else "absent",
                          "run": runs[project or MINE], "name": "stdout", "operation": "op",
                          "schedule": project or ""}  # fmt: skip
                if route.path.startswith("/api/ops/runs/{run}"):
                    params["run"] = ops[project or MINE]
                if route.path.startswith("/api/schedules/{name}"):
                    params["name"] = f"s-{project}"
                if not any(p in route.path for p in ("{project}", "{run}", "{name}")):
                    project = None
                if route.path.startswith("/api/backends/{name}"):
                    params["name"], project = "claude", None  # a backend's, no project's
                path = route.path.format(**params)
                yield Target(method, route.path, path, project)


def expected(cred: Credential, target: Target) -> str:
    """`401`, `403`, or `through` (the route's own answer, whatever it is)."""
    if cred.scope is None:
        return "401"
    if cred.scope < needs(target.method, target.pattern):
        return "403"
    if cred.limited and (target.project == THEIRS or target.pattern in WHOLE_ROOT):
        return "403"
    return "through"


def ask(client: httpx.Client, url: str, cred: Credential, target: Target) -> int:
    headers = {"Authorization": f"Bearer {cred.secret}"} if cred.secret else {}
    if target.method == "GET":
        with client.stream("GET", url + target.path, headers=headers) as answer:
            return answer.status_code  # a stream is left at its headers
    return client.request(target.method, url + target.path, headers={**headers, **WRITE},
                          content=b"{}").status_code  # fmt: skip


def setup_root(ws: Workspace) -> tuple[dict[str, str], dict[str, str]]:
    """Two projects with a finished task each, an operations run awaiting approval in each, and
    a schedule for each; their run ids."""
    ws.write_config(["--lines", "2"])
    config = yaml.safe_load(ws.config.read_text())
    config["schedules"] = {f"s-{p}": {"cron": "0 0 1 1 *", "project": p, "prompt": "go"}
                           for p in (MINE, THEIRS)}  # fmt: skip
    ws.config.write_text(yaml.safe_dump(config))
    (ws.path / "project" / "victim").mkdir(parents=True)
    runs, ops = {}, {}
    for project in (MINE, THEIRS):
        assert ws.cli("run", "-p", project, "-t", "t1", "go").returncode == 0
        runs[project] = ws.task(project, "t1").run_ids()[-1]
        message = {"protocolVersion": "1.0", "operations": [
            {"type": "shell", "id": "op", "command": "rm -r victim"}]}  # fmt: skip
        done = ws.cli("ops", "apply", "-", "-w", "project", "-p", project, "-t", "ops",
                      input=json.dumps(message))  # fmt: skip
        assert json.loads(done.stdout)["status"] == "awaiting_approval", done.stderr
        ops[project] = json.loads(done.stdout)["runId"]
    return runs, ops


def test_every_route_checks_the_scope_and_the_project(ws: Workspace) -> None:
    runs, ops = setup_root(ws)
    creds = credentials(ws.root)
    log = ws.path / "serve.log"
    tried = refused = 0
    with (
        serving(ws, env={"RUN_AGENT_API_KEY": KEY}, log=log) as url,
        httpx.Client(timeout=30) as client,
    ):
        for target in targets(runs, ops):
            for cred in creds:
                if (
                    target.pattern == "/api/schedules/{name}/run"
                    and expected(cred, target) == "through"
                ):
                    continue  # firing one starts a run: tried once, below
                before = tree(ws.root)
                got = ask(client, url, cred, target)
                want = expected(cred, target)
                where = f"{cred.name}: {target.method} {target.path}"
                if want == "through":
                    assert got not in (401, 403), f"{where} answered {got}"
                else:
                    assert str(got) == want, f"{where} answered {got}, not {want}"
                    assert tree(ws.root) == before, f"{where} changed the root"
                    refused += 1
                tried += 1
        # The one firing: a schedule of MINE, by an operate token limited to MINE.
        limited = next(c for c in creds if c.name == f"operate@{MINE}")
        fired = client.post(f"{url}/api/schedules/s-{MINE}/run", content=b"{}", headers={
            "Authorization": f"Bearer {limited.secret}", **WRITE})  # fmt: skip
        assert fired.status_code == 202, fired.text
        task = ws.task(MINE, fired.json()["task_id"])
        wait_for(lambda: listing.view(task).status == "completed", 60, "the firing")
    assert tried > 400 and refused > 250  # every route, each with every credential
    # Never logged, never in a run folder, never in an error message (none was answered).
    said = log.read_text(errors="replace")
    for cred in creds:
        if cred.secret:
            assert cred.secret not in said
            assert not any(cred.secret.encode() in p.read_bytes()
                           for p in ws.root.rglob("*") if p.is_file())  # fmt: skip


def test_a_token_limited_to_projects_sees_only_them(ws: Workspace) -> None:
    runs, ops = setup_root(ws)
    secret, _ = tokens.create(ws.root, tokens.Scope.OPERATE, [MINE])
    auth = {"Authorization": f"Bearer {secret}"}
    with (
        serving(ws, env={"RUN_AGENT_API_KEY": KEY}) as url,
        httpx.Client(base_url=url, headers=auth, timeout=30) as client,
    ):
        assert [p["project_id"] for p in client.get("/api/projects").json()] == [MINE]
        assert {t["project_id"] for t in client.get("/api/tasks").json()} == {MINE}
        assert [s["project"] for s in client.get("/api/schedules").json()] == [MINE]
        assert [r["project_id"] for r in client.get("/api/ops/runs").json()] == [MINE]
        assert [r["runId"] for r in client.get("/api/ops/approvals").json()] == [ops[MINE]]
        fleet = client.get("/api/fleet").json()
        assert fleet["counts"]["tasks"] == 2  # t1 and ops of MINE
        assert {n["project_id"] for n in fleet["needs"]} == {MINE}
        assert all(MINE in s["what"] for s in fleet["spent"])  # not the whole root's spend
        with client.stream("GET", "/api/events") as events:
            lines = events.iter_lines()
            next(line for line in lines if line.startswith("event: snapshot"))
            snapshot = json.loads(next(lines).removeprefix("data: "))
        assert {t["project_id"] for t in snapshot} == {MINE}
        # What a start waits for, or an operations run is made in, is within its reach too.
        start = {"prompt": "go", "task_id": "later", "after": [f"{THEIRS}/t1"]}
        refused = client.post(f"/api/projects/{MINE}/tasks", json=start)
        assert refused.status_code == 403 and THEIRS in refused.json()["error"]
        made = client.post("/api/ops/runs", json={"workspace": "project", "project_id": THEIRS})
        assert made.status_code == 403
        assert not ws.task(MINE, "later").folder.exists()
        # /metrics holds its projects' figures alone, with no label naming another.
        mine = scraped(client.get("/metrics").text)
        assert mine["run_agent_tasks"] == 2 and mine["run_agent_runs_started_total"] == 1
        assert mine["run_agent_operations_total"] == 1  # its operation awaiting approval
        assert THEIRS not in client.get("/metrics").text
        assert "run_agent_sse_clients" not in mine  # the server's, not a project's
        # The api_key still sees everything.
        key = {"Authorization": f"Bearer {KEY}"}
        everything = client.get("/api/projects", headers=key)
        assert [p["project_id"] for p in everything.json()] == [MINE, THEIRS]
        whole = scraped(client.get("/metrics", headers=key).text)
        assert whole["run_agent_tasks"] == 4 and whole["run_agent_runs_started_total"] == 2
        assert whole["run_agent_operations_total"] == 2 and "run_agent_sse_clients" in whole
        assert scraped(client.get("/metrics").text) == mine  # the same again, after a whole one
    assert runs


def scraped(text: str) -> dict[str, float]:
    """Each family's samples summed over their labels (Prometheus' own parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def test_gc_is_for_admin_tokens(ws: Workspace) -> None:
    setup_root(ws)
    for project in (MINE, THEIRS):  # a second run each: gc keeps the last one
        assert ws.cli("job", "-p", project, "-t", "t1", "--again", "go").returncode == 0
    admin_mine, _ = tokens.create(ws.root, tokens.Scope.ADMIN, [MINE])
    operate, _ = tokens.create(ws.root, tokens.Scope.OPERATE)
    keep = {"keep_last": 1}
    with (
        serving(ws, env={"RUN_AGENT_API_KEY": KEY}) as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):

        def gc(secret: str, body: dict[str, object]) -> httpx.Response:
            return client.post("/api/gc", json=body, headers={"Authorization": f"Bearer {secret}"})

        assert gc(operate, keep).status_code == 403
        assert gc(admin_mine, keep).status_code == 403  # it must name its project
        assert gc(admin_mine, {**keep, "project": THEIRS}).status_code == 403
        said = gc(admin_mine, {"project": MINE})
        assert said.status_code == 400 and "keep_last" in said.json()["error"]
        dry = gc(admin_mine, {**keep, "project": MINE, "dry_run": True}).json()
        assert len(dry["removed"]) == 1 and len(ws.task(MINE, "t1").run_ids()) == 2
        done = gc(admin_mine, {**keep, "project": MINE}).json()
        assert done["removed"] == dry["removed"] and done["freed_bytes"] > 0
    assert len(ws.task(MINE, "t1").run_ids()) == 1
    assert len(ws.task(THEIRS, "t1").run_ids()) == 2


def test_the_page_takes_a_token_once_and_keeps_it_in_a_cookie(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    secret, _ = tokens.create(tmp_path, tokens.Scope.READ)
    app = create_app(Settings(root=tmp_path, run_schedules=False))
    with TestClient(app, base_url="http://127.0.0.1", follow_redirects=False) as client:
        assert client.get("/api/tasks").status_code == 401  # a token exists: no longer open
        assert client.get("/api/tasks").headers["www-authenticate"] == "Bearer"
        opened = client.get(f"/?key={secret}")
        assert opened.status_code == 303 and opened.headers["location"] == "/"
        assert client.get("/api/tasks").status_code == 200  # the cookie carries it
        stop = client.post("/api/projects/p/tasks/t/stop", json={})
        assert stop.status_code == 403 and "needs operate" in stop.json()["error"]
        assert secret not in stop.text
    with TestClient(app, base_url="http://127.0.0.1") as fresh:  # no cookie
        assert fresh.get(f"/api/tasks?key={secret}").status_code == 401  # only on the page


def test_an_unreadable_token_file_lets_only_the_key_in(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    tokens.create(tmp_path, tokens.Scope.READ)
    tokens.path(tmp_path).write_text("{not json")
    app = create_app(Settings(root=tmp_path, api_key=KEY, run_schedules=False))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        broken = client.get("/api/tasks", headers={"Authorization": "Bearer rat_x"})
        assert broken.status_code == 503 and "token file" in broken.json()["error"]
        keyed = client.get("/api/tasks", headers={"Authorization": f"Bearer {KEY}"})
        assert keyed.status_code == 200
    # Without a key, the server stays closed rather than open.
    app = create_app(Settings(root=tmp_path, run_schedules=False))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        assert client.get("/api/tasks").status_code == 503


def test_token_commands(ws: Workspace) -> None:
    made = ws.invoke("token", "create", "--scope", "operate", "-p", "app", "--expires", "30d",
                     "--note", "CI of app")  # fmt: skip
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert TOKEN.fullmatch(secret)
    assert "shown only this once" in made.stderr and secret not in made.stderr
    stored = tokens.path(ws.root)
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert stat.S_IMODE(stored.parent.stat().st_mode) == 0o700
    assert secret[-43:] not in stored.read_text()  # the secret part: only its hash is kept
    (record,) = tokens.read(ws.root)
    assert record.scope is tokens.Scope.OPERATE and record.projects == ("app",)
    listed = ws.invoke("token", "list")
    assert record.id in listed.stdout and "active" in listed.stdout and secret not in listed.stdout
    assert "CI of app" in listed.stdout
    header, row = listed.stdout.splitlines()  # a header row, as `list` has
    assert header.split() == ["ID", "SCOPE", "PROJECTS", "CREATED", "EXPIRES", "STATE", "NOTE"]
    assert row.split()[:3] == [record.id, "operate", "app"] and row.endswith("active  CI of app")
    (shown,) = json.loads(ws.invoke("token", "list", "--json").stdout)
    assert shown["id"] == record.id and shown["state"] == "active" and "sha256" not in shown
    assert shown["scope"] == "operate" and shown["projects"] == ["app"] and shown["expires"]
    assert ws.invoke("token", "revoke", record.id).returncode == 0
    assert "revoked" in ws.invoke("token", "list").stdout
    verdict = tokens.verify(tokens.read(ws.root), secret, datetime.now(UTC))
    assert verdict is None


@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        (["--scope", "root"], 2, "'root' is not one of"),
        (["--scope", "read", "--expires", "soon"], 2, "'soon' is not a duration"),
        (["--scope", "read", "--expires", "0"], 2, "--expires '0' is no time"),
        (
            ["--scope", "read", "--expires", "400d"],
            2,
            "longer than 365 days; give a shorter duration (or leave it out: until revoked)",
        ),
        (["--scope", "read", "-p", "../x"], 2, "project"),
    ],
)
def test_token_create_refuses_bad_input(
    ws: Workspace, args: list[str], code: int, said: str
) -> None:
    done = ws.invoke("token", "create", *args)
    assert done.returncode == code and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not tokens.path(ws.root).exists()


def test_revoking_an_unknown_token_says_so(ws: Workspace) -> None:
    done = ws.invoke("token", "revoke", "000000000000")
    assert done.returncode != 0 and "no token '000000000000'" in done.stderr


def test_serve_beyond_loopback_takes_a_token_instead_of_a_key(ws: Workspace) -> None:
    refused = ws.invoke("serve", "--host", "0.0.0.0", "--port", "1")
    assert refused.returncode == 2 and "needs an API key or a token" in refused.stderr


def test_a_revoked_token_ends_the_streams_it_opened(ws: Workspace) -> None:
    ws.write_config(["--lines", "1"])
    secret, record = tokens.create(ws.root, tokens.Scope.READ)
    with (
        serving(ws) as url,
        httpx.stream(
            "GET", f"{url}/api/events", headers={"Authorization": f"Bearer {secret}"}, timeout=30
        ) as events,
    ):
        lines = events.iter_lines()
        assert next(lines) == "event: snapshot"
        tokens.revoke(ws.root, record.id)
        rest = list(lines)  # the stream ends by itself: this returns
        assert not any(line.startswith("event: task") for line in rest)
        again = httpx.get(f"{url}/api/tasks", headers={"Authorization": f"Bearer {secret}"})
        assert again.status_code == 401


def test_no_credential_of_run_agent_reaches_an_agent_or_a_record(ws: Workspace) -> None:
    ws.write_config(["--echo-env", "RUN_AGENT_API_KEY", "CI_TOKEN", "--sleep", "60"])
    secret, _ = tokens.create(ws.root, tokens.Scope.OPERATE)
    env = {"RUN_AGENT_API_KEY": KEY, "CI_TOKEN": secret}
    auth = {"Authorization": f"Bearer {secret}"}
    try:
        with (
            serving(ws, env=env) as url,
            httpx.Client(base_url=url, headers=auth, timeout=60) as client,
        ):
            first = client.post("/api/projects/p/tasks", json={"task_id": "a", "prompt": "go"})
            assert first.status_code == 202, first.text
            wait_for(lambda: listing.view(ws.task("p", "a")).status.value == "running", 60, "a")
            body = {"task_id": "b", "prompt": "go", "after": ["p/a"]}
            queued = client.post("/api/projects/p/tasks", json=body)
            assert queued.json()["queued"] is not None, queued.text
            run = ws.task("p", "a").run(ws.task("p", "a").run_ids()[0])
            wait_for(lambda: "CI_TOKEN=" in run.stdout.read_text(), 30, "the agent's env")
            assert "RUN_AGENT_API_KEY=\nCI_TOKEN=\n" in run.stdout.read_text()
        # The foreground command line gives its agent neither, either (one that says its
        # environment and ends: a timeout could end it, on a loaded machine, before it spoke).
        ws.write_config(["--echo-env", "RUN_AGENT_API_KEY", "CI_TOKEN"])
        done = ws.cli("job", "-p", "p", "-t", "c", "go", env=env)
        assert done.returncode == 0, done.stderr
        assert "RUN_AGENT_API_KEY=\nCI_TOKEN=\n" in ws.task("p", "c").run(
            ws.task("p", "c").run_ids()[0]).stdout.read_text(), done.stderr  # fmt: skip
        for path in ws.root.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                assert KEY.encode() not in data and secret.encode() not in data, path
    finally:
        for task in ("b", "a"):
            ws.cli("stop", "-p", "p", "-t", task)


def test_creating_and_revoking_at_once_loses_nothing(tmp_path: Path) -> None:
    import threading

    made = [tokens.create(tmp_path, tokens.Scope.READ)[1] for _ in range(10)]
    threads = [threading.Thread(target=tokens.revoke, args=(tmp_path, r.id)) for r in made]
    threads += [threading.Thread(target=tokens.create, args=(tmp_path, tokens.Scope.READ))
                for _ in range(10)]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    records = tokens.read(tmp_path)
    assert len(records) == 20
    assert {r.id for r in records if r.revoked} == {r.id for r in made}


def test_a_link_from_one_project_into_another_leads_nowhere(ws: Workspace) -> None:
    ws.write_config(["--lines", "1", "--line-text", "their-secret"])
    assert ws.cli("run", "-p", THEIRS, "-t", "t", "go").returncode == 0
    (ws.root / MINE).mkdir()
    (ws.root / MINE / "alias").symlink_to(ws.root / THEIRS / "t")
    run_id = ws.task(THEIRS, "t").run_ids()[0]
    secret, _ = tokens.create(ws.root, tokens.Scope.READ, [MINE])
    app = create_app(Settings(root=ws.root, run_schedules=False))
    from starlette.testclient import TestClient

    with TestClient(app, base_url="http://127.0.0.1") as client:
        auth = {"Authorization": f"Bearer {secret}"}
        read = client.get(f"/api/projects/{MINE}/tasks/alias/runs/{run_id}/files/stdout",
                          headers=auth)  # fmt: skip
        assert read.status_code == 404 and "their-secret" not in read.text
        assert client.get(f"/api/projects/{MINE}/tasks", headers=auth).json() == []
    status = ws.cli("status", "-p", MINE, "-t", "alias")
    assert status.returncode == 2 and "out of its project's folder" in status.stderr


def test_a_token_below_admin_starts_tasks_only_in_the_workspaces(ws: Workspace) -> None:
    ws.write_config(["--lines", "1", "--sleep", "60"])
    (ws.path / "inside").mkdir()
    operate, _ = tokens.create(ws.root, tokens.Scope.OPERATE, [MINE])
    admin, _ = tokens.create(ws.root, tokens.Scope.ADMIN)
    try:
        with serving(ws) as url, httpx.Client(base_url=url, timeout=30) as client:

            def start(secret: str, **body: object) -> httpx.Response:
                return client.post(f"/api/projects/{MINE}/tasks", json={"prompt": "go", **body},
                                   headers={"Authorization": f"Bearer {secret}"})  # fmt: skip

            outside = start(operate, task_id="a", cwd="/")
            assert outside.status_code == 403 and "outside the folders" in outside.json()["error"]
            repo = start(operate, task_id="b", issue={"number": 1, "repo": "/"})
            assert repo.status_code == 403 and "issue.repo" in repo.json()["error"]
            assert not ws.task(MINE, "a").folder.exists() and not ws.task(MINE, "b").folder.exists()
            assert start(operate, task_id="c", cwd="inside").status_code == 202
            # What waits on a task, from a project the token does not reach, is not named.
            waiter = client.post(f"/api/projects/{THEIRS}/tasks", headers={
                "Authorization": f"Bearer {admin}"},
                json={"task_id": "w", "prompt": "go", "after": [f"{MINE}/c"]})  # fmt: skip
            assert waiter.json()["queued"]["waits_for"], waiter.text

            def waiters(secret: str) -> list[str]:
                detail = client.get(f"/api/projects/{MINE}/tasks/c",
                                    headers={"Authorization": f"Bearer {secret}"})  # fmt: skip
                found: list[str] = detail.json()["waited_on_by"]
                return found

            assert waiters(admin) == [f"{THEIRS}/w"] and waiters(operate) == []
    finally:
        ws.cli("stop", "-p", THEIRS, "-t", "w")
        ws.cli("stop", "-p", MINE, "-t", "c")


def test_the_root_s_path_is_told_to_a_whole_root_admin_alone(tmp_path: Path) -> None:
    """`/api/health` names the runs root (a host path) to the api_key and an admin token of the
    whole root; every other credential gets its status and version, and no host path."""
    from starlette.testclient import TestClient

    root = tmp_path / "runs"
    creds = [c for c in credentials(root) if c.scope is not None]
    app = create_app(Settings(root=root, api_key=KEY, run_schedules=False))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        for cred in creds:
            answer = client.get("/api/health", headers={"Authorization": f"Bearer {cred.secret}"})
            assert answer.status_code == 200 and answer.json()["status"] == "ok", cred.name
            admin = cred.scope is tokens.Scope.ADMIN and not cred.limited
            assert ("root" in answer.json()) is admin, (cred.name, answer.text)
            assert (str(tmp_path) in answer.text) is admin, (cred.name, answer.text)
            if admin:
                assert answer.json()["root"] == str(root)


# A token file that cannot be read: a 503 with one line for every request but the api_key's, read
# without blocking and within a size cap; the commands say so in one line and never write over it.

DEEP = 200_000  # brackets: far past what the parser recurses into


def _with(field: str, value: object) -> Callable[[str], bytes]:
    def spoil(text: str) -> bytes:
        data = json.loads(text)
        data["tokens"][0][field] = value
        return json.dumps(data).encode()

    return spoil


def _padded(text: str) -> bytes:
    data = json.loads(text)  # every token still good; 66 MB of padding beside them
    data["pad"] = "x" * (66 * 1000 * 1000)
    return json.dumps(data).encode()


BAD_TOKEN_FILES: dict[str, tuple[Callable[[str], bytes], str]] = {
    "expires without a zone": (_with("expires", "2099-01-01T00:00:00"), "has no time zone"),
    "expires garbage": (_with("expires", "next tuesday"), "'next tuesday' is not a time"),
    "scope garbage": (_with("scope", ["root"]), "scope [root] is not"),
    "tokens not a list": (lambda text: b'{"tokens": "all"}', "tokens 'all' is not a list"),
    "not JSON": (lambda text: b"\x00\x01garbage{{", "not JSON"),
    "deep nesting": (lambda text: b'{"tokens": ' + b"[" * DEEP + b"]" * DEEP + b"}", "too deep"),
    "66 MB": (_padded, "over 4 MiB"),
}


def spoil_token_file(root: Path, kind: str) -> bytes:
    """Put a token file damaged as `kind` says in place, whole at once; its bytes."""
    path = tokens.path(root)
    spoil, _ = BAD_TOKEN_FILES[kind]
    data = spoil(path.read_text())
    spoilt = path.with_name(".spoilt")
    spoilt.write_bytes(data)
    spoilt.replace(path)
    return data


def test_a_bad_token_file_is_a_503_in_one_line_and_the_key_still_gets_in(ws: Workspace) -> None:
    secret, _ = tokens.create(ws.root, tokens.Scope.READ)
    good = tokens.path(ws.root).read_text()
    log = ws.path / "serve.log"
    with (
        serving(ws, env={"RUN_AGENT_API_KEY": KEY}, log=log) as url,
        httpx.Client(base_url=url, timeout=20) as client,
    ):
        assert client.get("/api/tasks", headers=bearer(secret)).status_code == 200
        for kind, (_, why) in BAD_TOKEN_FILES.items():
            spoil_token_file(ws.root, kind)
            for _ in range(2):  # the second from what the first read left
                got = client.get("/api/tasks", headers=bearer(secret))
                assert got.status_code == 503, (kind, got.status_code, got.text[:300])
                error = got.json()["error"]
                assert why in error and "token file" in error and "\n" not in error, (kind, error)
                assert str(ws.root) not in error  # the root's path is not every client's
            assert client.get("/api/tasks", headers=bearer(KEY)).status_code == 200, kind
            tokens.path(ws.root).write_text(good)
            assert client.get("/api/tasks", headers=bearer(secret)).status_code == 200, kind
        # A FIFO in its place would hang the read: refused without reading.
        tokens.path(ws.root).unlink()
        os.mkfifo(tokens.path(ws.root))
        got = client.get("/api/tasks", headers=bearer(secret))
        assert got.status_code == 503 and "not a regular file" in got.json()["error"]
        assert client.get("/api/tasks", headers=bearer(KEY)).status_code == 200
    assert "Traceback" not in log.read_text(errors="replace")


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.mark.parametrize("kind", list(BAD_TOKEN_FILES))
def test_the_token_commands_say_a_bad_token_file_in_one_line_and_never_write_over_it(
    ws: Workspace, kind: str
) -> None:
    tokens.create(ws.root, tokens.Scope.READ)
    data = spoil_token_file(ws.root, kind)
    _, why = BAD_TOKEN_FILES[kind]
    for args in (["list"], ["list", "--json"], ["create", "--scope", "read"],
                 ["revoke", "000000000000"]):  # fmt: skip
        done = ws.invoke("token", *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert why in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stdout == "", done.stdout
    assert tokens.path(ws.root).read_bytes() == data  # the tokens a person has are never lost
