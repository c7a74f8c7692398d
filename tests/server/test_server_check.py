"""The task's check through the server and MCP: started with a start's `check`, its output a run
file the page reads and streams, and sent only by whoever may decide what runs on this machine."""

from __future__ import annotations

import shlex
import sys
from typing import Any

import anyio
import httpx

from runagent.store import tokens
from tests.conftest import Server, Workspace, serving, wait_for
from tests.server.test_mcp import call, refusal, status_is, stdio

FAILS_ONCE = (
    "import pathlib, sys; p = pathlib.Path('checks'); n = int(p.read_text()) + 1 "
    "if p.exists() else 1; p.write_text(str(n)); print('check', n); sys.exit(0 if n > 1 else 1)"
)


def failing_once(ws: Workspace) -> str:
    return shlex.join([sys.executable, "-c", FAILS_ONCE, ws.marker])


def test_a_check_started_through_the_api_is_a_run_file_of_each_run(
    ws: Workspace, server: Server
) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        check = failing_once(ws)
        started = client.post("/api/projects/p/tasks", json={"task_id": "t", "prompt": "go",
                                                             "check": check,
                                                             "check_timeout": "1m"})  # fmt: skip
        assert started.status_code == 202, started.text

        def runs() -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = client.get("/api/projects/p/tasks/t/runs").json()
            return found

        wait_for(lambda: ws.task().done.exists() and len(runs()) == 2, 60, "two runs")
        first, second = runs()
        assert first["reason"] == "check_failed" and first["check_exit_code"] == 1
        assert first["check_command"] == check and second["check_exit_code"] == 0
        run = f"/api/projects/p/tasks/t/runs/{first['run_id']}"
        said = client.get(f"{run}/files/check")
        assert said.status_code == 200 and said.text == "check 1\n"
        streamed = client.get(f"{run}/stream/check", headers={"accept": "text/event-stream"})
        assert streamed.status_code == 200 and '"check 1\\n"' in streamed.text
    remembered = (ws.task().folder / "task.yaml").read_text()
    assert "check_timeout: 60" in remembered and "check:" in remembered


def test_a_check_is_a_command_only_whoever_decides_what_runs_here_may_send(
    ws: Workspace,
) -> None:
    operate, _ = tokens.create(ws.root, tokens.Scope.OPERATE)
    admin, _ = tokens.create(ws.root, tokens.Scope.ADMIN)
    with serving(ws) as url, httpx.Client(base_url=url, timeout=30) as client:

        def start(secret: str, task: str, **body: object) -> httpx.Response:
            return client.post("/api/projects/p/tasks", json={"prompt": "go", "task_id": task,
                                                              **body},
                               headers={"Authorization": f"Bearer {secret}"})  # fmt: skip

        refused = start(operate, "a", check="true")
        assert refused.status_code == 403, refused.text
        assert "check `true`: the agent runs unsandboxed" in refused.json()["error"]
        assert not ws.task("p", "a").folder.exists()
        missing = start(admin, "b", check="no-such-check-program -x")
        assert missing.status_code == 424, missing.text
        said = missing.json()["error"]
        assert "check `no-such-check-program -x` cannot run" in said and "\n" not in said
        assert not ws.task("p", "b").folder.exists()
        assert start(admin, "c", check="true").status_code == 202
        wait_for(lambda: ws.task("p", "c").done.exists(), 60, "task c to complete")
        assert start(operate, "d").status_code == 202  # a start without a check goes on
        wait_for(lambda: ws.task("p", "d").done.exists(), 60, "task d to complete")


def test_start_task_over_mcp_takes_a_check_and_run_output_reads_it(ws: Workspace) -> None:
    check = failing_once(ws)

    async def main() -> None:
        async with stdio(ws) as client:
            bad = await refusal(client, "start_task", project="p", task="x", prompt="go",
                                check="pytest 'unclosed")  # fmt: skip
            assert bad.startswith('check "pytest \'unclosed" cannot be split'), bad
            await call(client, "start_task", project="p", task="t", prompt="go", check=check)
            done = await status_is(client, "p", "t", "completed")
            assert done["runs"] == 2
            first = (await call(client, "task_status", project="p", task="t"))["runs_list"][0]
            said = await call(client, "run_output", project="p", task="t",
                              run=first["run_id"], file="check")  # fmt: skip
            assert said["text"] == "check 1\n"

    anyio.run(main)
