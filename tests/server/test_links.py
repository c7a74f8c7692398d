"""A link never crosses projects: a symbolic link planted under one project (as a run folder, as a
task's `runs/`, as a task folder, as a run's files, as the project folder itself) that leads into
another is followed by no face of a real `run-agent serve` (REST, SSE, MCP tools and resources,
listings, `/metrics`), for a token limited to the project or any other, nor by the command line;
not when a sandboxed agent plants it, nor when it is swapped in under a stream already open."""

from __future__ import annotations

import ctypes
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml

from runagent.ops.sandbox import Bwrap
from runagent.store import runfolder, tokens
from tests.conftest import Workspace, serving, wait_for
from tests.server.test_mcp import call, over_http

MINE, THEIRS, ALIAS = "mine", "theirs", "alias"
SECRET = "their-secret"  # in their run's stdout, prompt, output and their operations
SPENT = 987654  # the tokens their run used: in their run-info, usage.json and /metrics
QUIET = 3.0  # seconds a stream that sends nothing more is read for before the test moves on
FILES = ("stdout", "stderr", "output", "prompt")
KEY = "k" * 40


@dataclass
class Root:
    """Two projects, and links planted in MINE (and the project ALIAS) that lead into THEIRS."""

    ws: Workspace
    their_run: str  # the run of theirs/t
    their_ops: str  # an operations run of theirs/ops, awaiting an approval
    my_run: str  # the run of mine/f, whose files are links to theirs
    limited: str  # a read token limited to MINE and ALIAS

    def tasks(self) -> dict[str, list[str]]:
        """Each reached project's tasks a request may name, linked or not."""
        return {MINE: ["m", "r", "l", "f", "inner"], ALIAS: ["t"]}

    def run_ids(self) -> list[str]:
        return [self.their_run, self.their_ops, self.my_run]


def link(path: Path, target: str) -> None:
    """`path` made a link to `target` (relative, as an agent writes one), in its stead."""
    if path.is_dir() and not path.is_symlink():
        path.rename(path.with_name(path.name + ".moved"))
    elif os.path.lexists(path):
        path.unlink()
    os.symlink(target, path)


def build(ws: Workspace) -> Root:
    ws.write_config(["--lines", "2", "--line-text", "mine"])
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["spender"] = {"type": "codex", "command": ws.agent_argv(
        ["--ignore-unknown", "--codex-usage", str(SPENT), "--usage-lines", "1", "--lines", "2",
         "--line-text", SECRET])}  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))
    for task in ("m", "f"):
        assert ws.cli("run", "-p", MINE, "-t", task, "my prompt").returncode == 0
    theirs = ws.cli("run", "-p", THEIRS, "-t", "t", "--agent", "spender", f"{SECRET} prompt")
    assert theirs.returncode == 0, theirs.stderr
    (ws.path / "work" / f"{SECRET}-dir").mkdir(parents=True)
    message = {"protocolVersion": "1.0", "operations": [
        {"type": "createFile", "path": f"{SECRET}.txt", "content": SECRET},
        {"type": "shell", "id": f"{SECRET}-op", "command": f"rm -r {SECRET}-dir"}]}  # fmt: skip
    ops = ws.cli("ops", "apply", "-", "-w", "work", "-p", THEIRS, input=json.dumps(message))
    assert json.loads(ops.stdout)["status"] == "awaiting_approval", ops.stderr
    their_run = ws.task(THEIRS, "t").run_ids()[0]
    their_ops = json.loads(ops.stdout)["runId"]
    mine = ws.task(MINE, "m")
    # A run folder: theirs, and their operations run, as runs of mine/m.
    link(mine.runs / their_run, f"../../../{THEIRS}/t/runs/{their_run}")
    link(mine.runs / their_ops, f"../../../{THEIRS}/ops/runs/{their_ops}")
    # A task's runs/: mine/r's are theirs.
    ws.task(MINE, "r").folder.mkdir()
    ws.task(MINE, "r").task_md.write_text("my prompt")
    link(ws.task(MINE, "r").runs, f"../../{THEIRS}/t/runs")
    # A task folder: mine/l is theirs/t.
    link(ws.task(MINE, "l").folder, f"../{THEIRS}/t")
    # A run's files: mine/f's run's files, and its task's usage, are theirs.
    my_run = ws.task(MINE, "f").run_ids()[0]
    folder = ws.task(MINE, "f").run_folder(my_run)
    for name in (runfolder.RUN_INFO, *runfolder.RUN_FILES.values()):
        link(folder / name, f"../../../../{THEIRS}/t/runs/{their_run}/{name}")
    link(ws.task(MINE, "f").folder / runfolder.TASK_USAGE, f"../../{THEIRS}/t/usage.json")
    # A project folder: alias is theirs.
    link(ws.root / ALIAS, THEIRS)
    # A link that stays inside its project is followed: mine/inner is mine/m.
    link(ws.task(MINE, "inner").folder, "m")
    limited, _ = tokens.create(ws.root, tokens.Scope.READ, [MINE, ALIAS])
    return Root(ws, their_run, their_ops, my_run, limited)


REFUSED = f"does not reach project {THEIRS!r}"  # what a token is told of a run of theirs


def leaked(text: str, named: bool = True) -> bool:
    """Whether an answer shows anything of theirs: their text, their spend, their records (or,
    `named`, their name at all)."""
    text = text.replace(REFUSED, "")
    theirs = THEIRS in text if named else re.search(f'"project_id": ?"{THEIRS}"', text)
    return SECRET in text or str(SPENT) in text or theirs


def sse(client: httpx.Client, path: str) -> str:
    """A stream's text: to its `end` event, its first event where it has none (the root's), or
    what it sent until it has been quiet for QUIET seconds."""
    text = ""
    try:
        with client.stream("GET", path, timeout=httpx.Timeout(30, read=QUIET)) as answer:
            for chunk in answer.iter_text():
                text += chunk
                if "event: end" in text or (path == "/api/events" and "\r\n\r\n" in text):
                    break
    except httpx.ReadTimeout:
        pass
    return text


def rest_faces(root: Root, client: httpx.Client) -> Iterator[tuple[str, str]]:
    """Every GET of the API a token limited to MINE and ALIAS may make here, with its answer."""
    for path in ("/api/projects", "/api/tasks", "/api/fleet", "/api/ops/runs",
                 "/api/ops/approvals", "/metrics"):  # fmt: skip
        yield path, client.get(path).text
    yield "/api/events", sse(client, "/api/events")
    for run_id in (root.their_ops,):
        for tail in ("", "/events"):
            yield f"/api/ops/runs/{run_id}{tail}", client.get(f"/api/ops/runs/{run_id}{tail}").text
        yield "ops stream", sse(client, f"/api/ops/runs/{run_id}/events/stream")
    for project, names in root.tasks().items():
        yield f"{project} tasks", client.get(f"/api/projects/{project}/tasks").text
        for task in names:
            base = f"/api/projects/{project}/tasks/{task}"
            for path in (base, f"{base}/runs", f"{base}/paste"):
                yield path, client.get(path).text
            for name in ("stdout", "output"):
                yield f"{base}/stream?file={name}", sse(client, f"{base}/stream?file={name}")
            for run_id in root.run_ids():
                run = f"{base}/runs/{run_id}"
                yield run, client.get(run).text
                for name in FILES:
                    yield f"{run}/files/{name}", client.get(f"{run}/files/{name}").text
                    lines = f"{run}/files/{name}/lines?offset=100"
                    yield lines, client.get(lines).text
                yield f"{run}/stream/stdout", sse(client, f"{run}/stream/stdout")


async def mcp_faces(root: Root, url: str) -> list[tuple[str, str]]:
    """Every MCP tool a read token has, and every resource, with what it answered."""
    found: list[tuple[str, str]] = []

    async def answer(name: str, **args: Any) -> None:
        try:
            found.append((f"{name} {args}", json.dumps(await call(client, name, **args))))
        except Exception as exc:  # a refusal is an answer too: it must not quote theirs
            found.append((f"{name} {args}", str(exc)))

    async with over_http(url, root.limited) as client:
        await answer("list_tasks")
        await answer("list_approvals")
        for project, names in root.tasks().items():
            await answer("list_tasks", project=project)
            for task in names:
                await answer("task_status", project=project, task=task)
                await answer("run_output", project=project, task=task)
                for run_id in root.run_ids():
                    for name in FILES:
                        await answer("run_output", project=project, task=task, run=run_id,
                                     file=name)  # fmt: skip
                        uri = f"run-agent://runs/{project}/{task}/{run_id}/{name}"
                        try:
                            read = await client.read_resource(uri)
                            found.append((uri, read.model_dump_json()))
                        except Exception as exc:
                            found.append((uri, str(exc)))
        listed = (await client.list_resources()).resources
        found.append(("resources", json.dumps([str(r.uri) for r in listed])))
    return found


def test_no_face_follows_a_link_into_another_project(ws_outside: Workspace) -> None:
    root = build(ws_outside)
    leaks = []
    with serving(ws_outside, env={"RUN_AGENT_API_KEY": KEY}) as url:
        auth = {"Authorization": f"Bearer {root.limited}"}
        with httpx.Client(base_url=url, headers=auth, timeout=30) as client:
            leaks += [face for face, text in rest_faces(root, client) if leaked(text)]
            mine = ws_outside.task(MINE, "m").run_ids()[0]
            inner = client.get(f"/api/projects/{MINE}/tasks/inner/runs/{mine}/files/stdout")
            assert inner.text == "mine 1\nmine 2\n", "a link inside its project is followed"
        leaks += [face for face, text in anyio.run(mcp_faces, root, url) if leaked(text)]
        # Whoever asks: a token for every project sees no run, task or project through a link.
        with httpx.Client(base_url=url, headers={"X-API-Key": KEY}, timeout=30) as client:
            projects = [p["project_id"] for p in client.get("/api/projects").json()]
            if projects != [MINE, THEIRS]:
                leaks.append(f"the key's /api/projects: {projects}")
            runs = client.get(f"/api/projects/{MINE}/tasks/m/runs").json()
            if [r["project_id"] for r in runs] != [MINE]:
                leaks.append("the key's runs of mine/m")
            tasks = {(t["project_id"], t["task_id"]) for t in client.get("/api/tasks").json()}
            if (MINE, "l") in tasks or (ALIAS, "t") in tasks:
                leaks.append("the key's /api/tasks")
            spent = f'direction="in",project="{THEIRS}"}} {float(SPENT)}'
            if spent not in client.get("/metrics").text:
                leaks.append("the key's /metrics counts their spend more than once")
    # The command line reads as the API does.
    for args in (
        ["output", "-p", MINE, "-t", "m"],
        ["output", "-p", MINE, "-t", "m", "--run", root.their_run],
        ["output", "-p", MINE, "-t", "f", "--file", "stdout"],
        ["output", "-p", MINE, "-t", "f", "--file", "prompt", "--json"],
        ["output", "-p", MINE, "-t", "f", "--follow"],
        ["status", "-p", MINE, "-t", "f", "--json"],
        ["usage", "--project", MINE, "--json"],
        ["usage", "--project", ALIAS],
    ):
        done = ws_outside.cli(*args)
        if SECRET in done.stdout + done.stderr or str(SPENT) in done.stdout:
            leaks.append(f"run-agent {' '.join(args)}")
    rows = json.loads(ws_outside.cli("list", "--json").stdout)
    if {(r["project_id"], r["task_id"]) for r in rows} != {
        (MINE, t) for t in ("m", "r", "f", "inner")
    } | {
        (THEIRS, "t"),
        (THEIRS, "ops"),
    }:
        leaks.append(f"run-agent list: {rows}")
    assert not leaks, "\n".join(leaks)


def test_what_a_sandboxed_agent_plants_in_its_task_is_not_followed(
    ws_outside: Workspace,
) -> None:
    if Bwrap(Path("/")).problem() is not None:
        pytest.skip("bubblewrap cannot run here")
    ws = ws_outside
    root = build(ws)
    their = f"../../../{THEIRS}/t/runs/{root.their_run}"
    planted = "20990101-000000000-1"  # a run id later than any: the task's latest run
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["planter"] = {"type": "command", "sandbox": "bwrap", "command": ws.agent_argv([
        "--symlink", f"$TASK_FOLDER/runs/{planted}={their}",
        "--symlink", f"$TASK_FOLDER/{runfolder.TASK_USAGE}=../../{THEIRS}/t/usage.json",
        "--symlink", f"$RUN_FOLDER/{runfolder.PROMPT}={their}/{runfolder.PROMPT}"])}  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))
    done = ws.cli("run", "-p", MINE, "-t", "planted", "--agent", "planter", "go")
    assert done.returncode == 0, done.stderr
    leaks = []
    with serving(ws) as url:
        auth = {"Authorization": f"Bearer {root.limited}"}
        with httpx.Client(base_url=url, headers=auth, timeout=30) as client:
            base = f"/api/projects/{MINE}/tasks/planted"
            for path in (base, f"{base}/runs", f"/api/projects/{MINE}/tasks", "/api/tasks",
                         "/metrics", f"{base}/runs/{planted}/files/stdout"):  # fmt: skip
                if leaked(client.get(path).text, named=False):
                    leaks.append(path)
            run = f"{base}/runs/{ws.task(MINE, 'planted').run_ids()[0]}"
            for path in (f"{run}/files/prompt", f"{base}/stream?file=stdout",
                         f"{base}/stream?file=output"):  # fmt: skip
                if leaked(client.get(path).text if "/files/" in path else sse(client, path),
                          named=False):  # fmt: skip
                    leaks.append(path)

        async def tools() -> None:
            async with over_http(url, root.limited) as client:
                for name in FILES:
                    said = await call(client, "run_output", project=MINE, task="planted",
                                      file=name)  # fmt: skip
                    if leaked(json.dumps(said), named=False):
                        leaks.append(f"run_output {name}")
                status = await call(client, "task_status", project=MINE, task="planted")
                if leaked(json.dumps(status), named=False):
                    leaks.append("task_status")

        anyio.run(tools)
    assert not leaks, "\n".join(leaks)


RENAME_EXCHANGE = 2  # renameat2's flag: the two names trade places in one step


def exchange(a: Path, b: Path) -> None:
    """Swap two names at once, as an agent can: no moment shows neither."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), RENAME_EXCHANGE) != 0:
        raise OSError(ctypes.get_errno(), f"renameat2 {a} {b}")


@contextmanager
def events_of(client: httpx.Client, path: str) -> Iterator[Iterator[str]]:
    """A stream's events (their raw text), one at a time, as they come."""
    with client.stream("GET", path, timeout=httpx.Timeout(60)) as answer:
        assert answer.status_code == 200

        def each() -> Iterator[str]:
            held = ""
            for chunk in answer.iter_text():
                held += chunk
                while "\r\n\r\n" in held:
                    event, held = held.split("\r\n\r\n", 1)
                    if not event.startswith(":"):  # a heartbeat
                        yield event

        yield each()


def test_a_link_swapped_in_under_an_open_stream_is_not_followed(ws_outside: Workspace) -> None:
    ws = ws_outside
    root = build(ws)
    hold = ws.path / "go-on"
    ws.write_config(["--lines", "3", "--line-text", "mine", "--hold-at", "1",
                     "--hold-for", str(hold)])  # fmt: skip
    proc = ws.start_cli("run", "-p", MINE, "-t", "live", "my prompt")
    task = ws.task(MINE, "live")
    try:
        with serving(ws) as url:
            auth = {"Authorization": f"Bearer {root.limited}"}
            with httpx.Client(base_url=url, headers=auth, timeout=60) as client:
                wait_for(lambda: task.run_ids() and "mine 1" in task.run(
                    task.run_ids()[0]).stdout.read_text(), 30, "the first line")  # fmt: skip
                run_id = task.run_ids()[0]
                folder = task.run_folder(run_id)
                path = f"/api/projects/{MINE}/tasks/live/runs/{run_id}/stream/stdout"
                with events_of(client, path) as events:
                    seen = [next(events), next(events)]  # the first line, the status running
                    assert "mine 1" in seen[0] and "running" in seen[1], seen
                    # The run folder becomes a link to theirs at once, as the stream reads on.
                    aside = folder.with_name("aside")
                    os.symlink(f"../../../{THEIRS}/t/runs/{root.their_run}", aside)
                    exchange(folder, aside)
                    seen.append(next(events))  # what it sends once it has looked again
                    exchange(folder, aside)
                    aside.unlink()
                    hold.touch()
                    for event in events:
                        seen.append(event)
                        if event.startswith("event: end"):
                            break
        assert proc.wait(30) == 0
    finally:
        hold.touch()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    sent = "\n".join(seen)
    assert not leaked(sent), sent
    assert "mine 3" in sent and "event: end" in sent
