"""The MCP server, driven by the official SDK's own client: over stdio (`run-agent mcp`, a real
subprocess) and over streamable HTTP (`/mcp` of a real `run-agent serve`, behind the key and
scoped tokens). The tools start real tasks with the fake agent and read their real run folders;
their errors are the API's, word for word."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import httpx2
import jsonschema
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from starlette.testclient import TestClient

from runagent import listing
from runagent.config.overrides import OPTIONS
from runagent.store import tokens
from server.app import Settings, create_app
from server.mcptools import MAX_BYTES
from tests.conftest import LOCAL, Workspace, serving
from tests.server.test_server_paste import paste_session

KEY = "k" * 40
TOOLS = {"start_task", "list_tasks", "task_status", "run_output", "stop_task", "resume_task",
         "list_approvals", "answer_approval", "paste_reply", "unpause_agent", "hold_queue",
         "release_queue", "stop_all"}  # fmt: skip
READ_TOOLS = {"list_tasks", "task_status", "run_output", "list_approvals"}
WHOLE_ROOT_TOOLS = {"unpause_agent", "hold_queue", "release_queue"}  # not a limited token's


def stdio(ws: Workspace) -> Client:
    command = [sys.executable, "-m", "runagent", "mcp", "--config", str(ws.config)]
    return Client(StdioServerParameters(command=command[0], args=command[1:], cwd=str(ws.path)))


@asynccontextmanager
async def over_http(url: str, secret: str | None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client,
    ):
        yield client


async def call(client: Client, name: str, **args: Any) -> Any:
    """A tool's value (its JSON), or raise ToolError with the tool's one-line error."""
    result = await client.call_tool(name, args)
    text = result.content[0].text  # type: ignore[union-attr]
    if result.is_error:
        raise ToolError(text)
    return json.loads(text)


async def refusal(client: Client, name: str, **args: Any) -> str:
    try:
        await call(client, name, **args)
    except ToolError as exc:
        return str(exc)
    raise AssertionError(f"{name} {args} was not refused")


class ToolError(Exception):
    pass


async def until(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 60) -> Any:
    with anyio.fail_after(timeout):
        while not (found := await check()):
            await anyio.sleep(0.1)
    assert found, what
    return found


async def status_is(client: Client, project: str, task: str, *wanted: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        row: dict[str, Any] = await call(client, "task_status", project=project, task=task)
        return row if row["status"] in wanted else None

    found: dict[str, Any] = await until(check, f"{project}/{task} {wanted}")
    return found


def api_error(ws: Workspace, body: dict[str, Any]) -> str:
    """What the REST API answers a start with this body (the MCP tool must say the same)."""
    settings = Settings(root=ws.root, config_path=ws.config, workdir=ws.path, run_schedules=False)
    with TestClient(create_app(settings), base_url=LOCAL) as client:
        answer = client.post("/api/projects/p/tasks", json=body)
    assert answer.status_code >= 400
    message: str = answer.json()["error"]
    return message


def test_the_tools_and_their_schemas(ws: Workspace) -> None:
    async def main() -> None:
        async with stdio(ws) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            templates = (await client.list_resource_templates()).resource_templates
        assert set(listed) == TOOLS
        for tool in listed.values():
            jsonschema.Draft202012Validator.check_schema(tool.input_schema)
            assert tool.description and tool.input_schema["additionalProperties"] is False
        start = listed["start_task"].input_schema
        for name, option in OPTIONS.items():  # every loop option, as the CLI says it
            assert start["properties"][option.body_key or name]["description"] == option.help
        assert {"project", "task", "prompt", "after", "priority", "issue"} <= set(
            start["properties"]
        )
        assert start["required"] == ["project", "prompt"]
        valid = {"project": "p", "prompt": "go", "timeout": "30m", "until": "done-file",
                 "budget": ["1usd"], "worktree": True, "after": ["p/a"]}  # fmt: skip
        jsonschema.validate(valid, start)
        assert listed["task_status"].annotations.read_only_hint is True  # type: ignore[union-attr]
        assert templates[0].uri_template == "run-agent://runs/{project}/{task}/{run}/{file}"

    anyio.run(main)


def test_a_task_is_started_and_read_over_stdio(ws: Workspace) -> None:
    ws.write_config(["--lines", "300"])
    stdout = b""

    async def main() -> None:
        nonlocal stdout
        async with stdio(ws) as client:
            started = await call(client, "start_task", project="p", task="t", prompt="go")
            assert started["project_id"] == "p" and started["supervisor_pid"]
            done = await status_is(client, "p", "t", "completed")
            assert done["prompt"] == "go" and done["runs"] == 1
            stdout = ws.task().run(done["latest_run"]["run_id"]).stdout.read_bytes()
            # The end, bounded; then the whole, read on from byte 0 in bounded parts.
            tail = await call(client, "run_output", project="p", task="t", max_bytes=100)
            assert tail["text"].encode() == stdout[-100:] and tail["more"] is False
            assert tail["offset"] == len(stdout) - 100 and tail["size"] == len(stdout)
            parts, offset = [], 0
            while True:
                part = await call(client, "run_output", project="p", task="t", offset=offset,
                                  max_bytes=1000)  # fmt: skip
                parts.append(part["text"])
                offset = part["next_offset"]
                if not part["more"]:
                    break
            assert "".join(parts).encode() == stdout and len(parts) > 1
            big = await refusal(client, "run_output", project="p", task="t",
                                max_bytes=MAX_BYTES + 1)  # fmt: skip
            assert "read in parts with offset" in big
            rows = await call(client, "list_tasks")
            assert [(r["project_id"], r["task_id"], r["status"]) for r in rows] == [
                ("p", "t", "completed")
            ]
            # The run's files as resources, by URI; nothing outside a run folder.
            listed = (await client.list_resources()).resources
            uri = next(r.uri for r in listed if str(r.uri).endswith("/stdout"))
            read = await client.read_resource(uri)
            assert read.contents[0].text.encode() == stdout  # type: ignore[union-attr]
            for bad, said in [
                ("run-agent://runs/p/t/../../../etc/passwd", "is not a run file's URI"),
                ("run-agent://runs/p/../x/stdout", "task id '..' may not contain"),
                ("run-agent://runs/p/t/nope/stdout", "run 'nope' of task p/t not found"),
                ("file:///etc/passwd", "is not a run file's URI"),
            ]:
                with pytest.raises(MCPError, match=said) as raised:
                    await client.read_resource(bad)
                assert raised.value.error.code == -32002

    anyio.run(main)
    assert stdout.count(b"\n") == 300


def test_bad_input_gets_the_apis_one_line_errors(ws: Workspace) -> None:
    bad = [
        {"prompt": "go", "budget": "lots"},
        {"prompt": "go", "timeout": "soon"},
        {"prompt": "go", "until": "forever"},
        {"prompt": "go", "timout": "5m"},  # a typo starts nothing
        {"prompt": "go", "after": ["p/missing"]},
        {"prompt": "go", "cwd": "no-such-folder"},
        {"prompt": "go\0"},
        {"prompt": "go", "priority": "\u00b2"},  # a digit, but not one a number is written in
        {"prompt": "go", "priority": "9" * 5000},
        {"prompt": "go", "cwd": "~no-such-user-here/x"},
        {"prompt": "go", "cwd": "d" * 300},
        {"prompt": "go", "timeout": 10**400},
        {"prompt": "go", "timeout": "1" * 30000},
        {"prompt": "go", "agent": "\u0000"},
        {"prompt": "go", "issue": {"number": 1, "repo": "~no-such-user-here"}},
        {"prompt": "go", "check": "no-such-check-program --all"},
        {"prompt": "go", "check": 5},
        {"prompt": "go", "check_timeout": "soon"},
    ]

    async def main() -> None:
        async with stdio(ws) as client:
            for body in bad:
                said = await refusal(client, "start_task", project="p", task="t", **body)
                expected = api_error(ws, {"task_id": "t", **body})
                if "timout" in body:  # the tool names its own arguments
                    assert said.startswith("'timout' is not something start_task takes")
                    assert expected.startswith("'timout' is not something a start takes")
                else:
                    assert said == expected, body
                assert "\n" not in said and "Traceback" not in said and len(said) < 400, said
                assert "failed:" not in said  # a refusal, never the tool's own fault
            missing = await refusal(client, "task_status", project="p", task="nope")
            assert missing == "task p/nope not found"
            typed = await refusal(client, "run_output", project="p", task="t", offset="x")
            assert "offset 'x' is not a whole number" in typed

    anyio.run(main)
    assert not ws.task().folder.exists()  # nothing was started, nothing made


def test_stop_and_resume_over_stdio(ws: Workspace) -> None:
    ws.write_config(["--lines", "1", "--sleep", "60"])

    async def main() -> None:
        async with stdio(ws) as client:
            await call(client, "start_task", project="p", task="t", prompt="go")
            await status_is(client, "p", "t", "running")
            stopped = await call(client, "stop_task", project="p", task="t")
            assert stopped["stopped"] is True and stopped["status"] == "stopped"
            resumed = await call(client, "resume_task", project="p", task="t", timeout="5m")
            assert resumed["supervisor_pid"]

            async def second_run() -> bool:
                row = await call(client, "task_status", project="p", task="t")
                return bool(row["status"] == "running" and row["runs"] == 2)

            await until(second_run, "the resumed loop's run")
            assert (await call(client, "stop_task", project="p", task="t"))["stopped"]

    anyio.run(main)
    assert len(ws.runs()) == 2 and listing.view(ws.task()).status.value == "stopped"


def test_approvals_and_paste_replies_over_stdio(ws: Workspace) -> None:
    (ws.path / "project" / "victim").mkdir(parents=True)
    message = {"protocolVersion": "1.0", "operations": [
        {"type": "shell", "id": "rm-1", "command": "rm -r victim"}]}  # fmt: skip
    done = ws.cli("ops", "apply", "-", "-w", "project", input=json.dumps(message))
    run_id = json.loads(done.stdout)["runId"]
    paste_session(ws, "chat")
    finished = paste_session(ws, "finished", complete=True)

    async def main() -> None:
        async with stdio(ws) as client:
            (pending,) = await call(client, "list_approvals")
            assert pending["runId"] == run_id and pending["operationId"] == "rm-1"
            events = await call(client, "answer_approval", run=run_id, operation="rm-1",
                                decision="denied", reason="keep it")  # fmt: skip
            assert [e["type"] for e in events["events"]] == ["policyDenied"]
            assert "keep it" in events["events"][0]["reason"]
            again = await refusal(client, "answer_approval", run=run_id, operation="rm-1",
                                  decision="approved")  # fmt: skip
            assert again == f"run {run_id} awaits no approval"
            handed = await call(client, "paste_reply", project="p", task="chat", reply="[DONE]")
            assert handed["task_id"] == "chat" and handed["file"].endswith(".txt")
            late = await refusal(client, "paste_reply", project="p", task="finished", reply="x")
            assert "complete" in late

    anyio.run(main)
    assert (ws.path / "project" / "victim").is_dir()
    (inbox,) = (ws.task("p", "chat").folder / "paste" / "inbox").iterdir()
    assert inbox.read_text() == "[DONE]" and finished.is_complete


def test_mcp_over_http_checks_the_key_and_the_tokens(ws: Workspace) -> None:
    ws.write_config(["--lines", "2"])
    read_mine, _ = tokens.create(ws.root, tokens.Scope.READ, ["mine"])
    operate_mine, _ = tokens.create(ws.root, tokens.Scope.OPERATE, ["mine"])

    async def main(url: str) -> None:
        async with over_http(url, KEY) as admin:  # the key: every tool, every project
            assert {t.name for t in (await admin.list_tools()).tools} == TOOLS
            await call(admin, "start_task", project="theirs", task="t", prompt="go")
            await status_is(admin, "theirs", "t", "completed")
        async with over_http(url, read_mine) as reader:
            assert {t.name for t in (await reader.list_tools()).tools} == READ_TOOLS
            said = await refusal(reader, "start_task", project="mine", task="t", prompt="go")
            assert said == "this token's scope is read; start_task needs operate"
            assert (await call(reader, "list_tasks")) == []  # theirs is not shown
            foreign = await refusal(reader, "task_status", project="theirs", task="t")
            assert foreign == "this token does not reach project 'theirs'"
            assert (await client_resources(reader)) == []
        async with over_http(url, operate_mine) as operator:
            said = await refusal(operator, "start_task", project="theirs", task="u", prompt="go")
            assert said == "this token does not reach project 'theirs'"
            after = await refusal(operator, "start_task", project="mine", task="u", prompt="go",
                                  after=["theirs/t"])  # fmt: skip
            assert after == "this token does not reach project 'theirs'"
            await call(operator, "start_task", project="mine", task="u", prompt="go")
            await status_is(operator, "mine", "u", "completed")
            rows = await call(operator, "list_tasks")
            assert [(r["project_id"], r["task_id"]) for r in rows] == [("mine", "u")]

    with serving(ws, env={"RUN_AGENT_API_KEY": KEY}) as url:
        anyio.run(main, url)
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        accept = {"Accept": "application/json, text/event-stream"}
        bare = httpx.post(f"{url}/mcp", json=initialize, headers=accept, timeout=30)
        assert bare.status_code == 401 and bare.headers["www-authenticate"] == "Bearer"
        wrong = httpx.post(
            f"{url}/mcp",
            json=initialize,
            timeout=30,
            headers={**accept, "Authorization": f"Bearer {operate_mine[:-1]}x"},
        )
        assert wrong.status_code == 401
        keyed = {**accept, "Authorization": f"Bearer {KEY}"}
        other_site = httpx.post(f"{url}/mcp", json=initialize, timeout=30,
                                headers={**keyed, "Origin": "http://evil.example"})  # fmt: skip
        assert other_site.status_code == 403 and "origin" in other_site.json()["error"]
        rebound = httpx.post(f"{url}/mcp", json=initialize, timeout=30,
                             headers={**keyed, "Host": "evil.example"})  # fmt: skip
        assert rebound.status_code == 421
    assert not ws.task("theirs", "u").folder.exists()


async def client_resources(client: Client) -> list[str]:
    return [str(r.uri) for r in (await client.list_resources()).resources]


def test_every_tool_checks_the_scope_and_the_project(ws: Workspace) -> None:
    from tests.server.test_tokens import MINE, THEIRS, setup_root

    _, ops = setup_root(ws)
    needs = {"start_task": tokens.Scope.OPERATE, "stop_task": tokens.Scope.OPERATE,
             "resume_task": tokens.Scope.OPERATE, "answer_approval": tokens.Scope.OPERATE,
             "paste_reply": tokens.Scope.OPERATE,
             "unpause_agent": tokens.Scope.OPERATE, "hold_queue": tokens.Scope.OPERATE,
             "release_queue": tokens.Scope.OPERATE, "stop_all": tokens.Scope.OPERATE}  # fmt: skip
    credentials = [("api_key", KEY, tokens.Scope.ADMIN, False)]
    for scope in tokens.Scope:
        credentials.append((scope.word, tokens.create(ws.root, scope)[0], scope, False))
        mine = tokens.create(ws.root, scope, [MINE])[0]
        credentials.append((f"{scope.word}@{MINE}", mine, scope, True))

    def arguments(tool: str, project: str) -> dict[str, Any]:
        """Arguments that pass every check but the grant's and then change nothing."""
        return {
            "start_task": {"project": project, "task": "absent", "prompt": " "},
            "list_tasks": {"project": project},
            "task_status": {"project": project, "task": "t1"},
            "run_output": {"project": project, "task": "t1"},
            "stop_task": {"project": project, "task": "absent"},
            "resume_task": {"project": project, "task": "absent"},
            "list_approvals": {},
            "answer_approval": {"run": ops[project], "operation": "other", "decision": "denied"},
            "paste_reply": {"project": project, "task": "absent", "reply": "x"},
            "unpause_agent": {"agent": "nobody"},  # a pause holds across the root
            "hold_queue": {},  # a hold holds every project's queue: released below
            "release_queue": {},
            "stop_all": {"project": project},  # nothing runs or waits there
        }[tool]

    tried = 0

    async def main(url: str) -> None:
        nonlocal tried
        for name, secret, scope, limited in credentials:
            async with over_http(url, secret) as client:
                for tool in sorted(TOOLS):
                    for project in (MINE, THEIRS):
                        result = await client.call_tool(tool, arguments(tool, project))
                        said = result.content[0].text  # type: ignore[union-attr]
                        where = f"{name}: {tool} on {project}: {said[:120]}"
                        if scope < needs.get(tool, tokens.Scope.READ):
                            assert result.is_error and "this token's scope is" in said, where
                        elif limited and tool in WHOLE_ROOT_TOOLS:
                            assert result.is_error and "only some projects" in said, where
                        elif limited and project == THEIRS and tool != "list_approvals":
                            assert result.is_error and "does not reach project" in said, where
                        else:
                            assert "this token" not in said, where
                        tried += 1

    with serving(ws, env={"RUN_AGENT_API_KEY": KEY}) as url:
        anyio.run(main, url)
    assert tried == len(credentials) * len(TOOLS) * 2
    assert not ws.task(MINE, "absent").folder.exists()
    assert not ws.task(THEIRS, "absent").folder.exists()


def test_null_for_an_argument_its_schema_refuses_is_refused_and_starts_nothing(
    ws: Workspace,
) -> None:
    """The Inspector sends null for a value it cannot parse (`max_restarts=lots`): no schema of
    a tool allows null, so it is refused naming the argument, never taken as "not given"."""
    ws.write_config(["--lines", "1"])

    async def main() -> None:
        async with stdio(ws) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            properties = listed["start_task"].input_schema["properties"]
            for name in sorted(set(properties) - {"project", "task", "prompt"}):
                said = await refusal(client, "start_task", project="p", task="t", prompt="go",
                                     **{name: None})  # fmt: skip
                assert said.startswith(f"{name} is null"), said
                assert "leave it out" in said and "\n" not in said, said
            said = await refusal(client, "start_task", project="p", task="t", prompt=None)
            assert said == "prompt is null, not a string: give one", said
            said = await refusal(client, "start_task", project="p", task=None, prompt="go")
            assert said.startswith("task is null"), said
            said = await refusal(client, "start_task", project="p", prompt="go", until=None)
            assert said.startswith("until is null, not one of exit, done-file, ready-marker")
            said = await refusal(client, "start_task", project="p", prompt="go", timeout=None)
            assert said.startswith("timeout is null, not a number or a string"), said
            said = await refusal(client, "run_output", project="p", task="t", offset=None)
            assert said.startswith("offset is null"), said
            said = await refusal(client, "resume_task", project="p", task="t", timeout=None)
            assert said.startswith("timeout is null"), said

    anyio.run(main)
    assert not ws.task().folder.exists()  # nothing was started, nothing made


def test_an_unknown_tool_is_the_protocols_error(ws: Workspace) -> None:
    """The specification's "unknown tools" are a protocol error (JSON-RPC -32602, Invalid
    params), not a tool's result: a client learns the name is wrong, not that a tool failed."""

    async def main() -> None:
        async with stdio(ws) as client:
            with pytest.raises(MCPError, match="unknown tool 'delete_everything'") as raised:
                await client.call_tool("delete_everything", {})
            assert raised.value.error.code == -32602
            assert "start_task" in raised.value.error.message

    anyio.run(main)


def test_an_agent_holds_the_queue_stops_everything_and_releases_it_over_mcp(
    ws: Workspace,
) -> None:
    ws.write_config(["--lines", "1", "--wait-in-task", "go"], max_restarts=0)

    async def main() -> None:
        async with stdio(ws) as client:
            await call(client, "start_task", project="p", task="a", prompt="go")
            await status_is(client, "p", "a", "running")
            held = await call(client, "hold_queue")
            assert held["made"] and held["hold"]["words"].startswith("the queue is held since ")
            queued = await call(client, "start_task", project="p", task="b", prompt="go")
            assert queued["queued"]["waits_for"].startswith("the queue is held"), queued
            bad = await refusal(client, "stop_all", project="no such")
            assert bad.startswith("project id 'no such' has characters"), bad
            stopped = await call(client, "stop_all")
            assert stopped == {"stopped": ["p/a"], "left_queue": ["p/b"], "held": True}
            released = await call(client, "release_queue")
            assert released["released"].startswith("the queue was held since "), released
            assert (await call(client, "release_queue"))["released"] is None

    anyio.run(main)
    assert not ws.task("p", "b").run_ids()
