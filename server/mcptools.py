"""run-agent as a Model Context Protocol server, through the official `mcp` SDK: the tools an
assistant needs to hand off a long task and check on it, and the run folders' files as
resources. The same server answers over stdio (`run-agent mcp`, a local process: everything
is allowed) and over streamable HTTP at `/mcp` of `run-agent serve` (behind the host check, the
origin check and the key or a scoped token: each tool call checks its own scope and project).

Every tool goes through the same functions as the REST API (server/bodies.py, detail.py,
ops.py, actions.py), so a start's arguments are the API body's keys, with its JSON Schema built
from the loop's typed options, and a bad value gets the API's one-line error, as a tool error.
"""

from __future__ import annotations

import contextlib
import json
import logging
import stat
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Receive, Send
from starlette.types import Scope as Asgi

from runagent import __version__, listing
from runagent.errors import (
    AlreadyCompletedError,
    ForbiddenError,
    NotFoundError,
    RunAgentError,
    UsageError,
    shown,
)
from runagent.fleet.queue import Waiting
from runagent.loop.context import new_task_id, validate_id
from runagent.ops.runs import ids
from runagent.ops.runtime import find_run
from runagent.service import Service, StartRequest
from runagent.store import runfolder
from runagent.store.credentials import scrub_urls
from runagent.store.runfolder import TaskPaths
from runagent.store.tokens import ADMIN, Grant, Scope
from server import bodies, detail, streams
from server.actions import STOP_WAIT, submit_reply
from server.ops import answer_approval, pending_approvals
from server.paths import Paths
from server.security import grant_of

log = logging.getLogger("run-agent.mcp")
RESOURCE_NOT_FOUND = -32002  # the error code the MCP specification gives a resource not found
INVALID_PARAMS = -32602  # JSON-RPC's, which it gives an unknown tool
URI = "run-agent://runs/{project}/{task}/{run}/{file}"
FILES = tuple(runfolder.RUN_FILES)  # stdout, stderr, output, prompt, check
DEFAULT_BYTES = 16 * 1024  # what run_output reads unless told
MAX_BYTES = 256 * 1024  # the most one run_output call returns
MAX_RESOURCE = 1024 * 1024  # a resource over this is read from its last MiB
MAX_RESOURCES = 500  # resources listed: the latest run's files of the newest tasks

_TASK = {
    "project": {"type": "string", "description": "The project's id."},
    "task": {"type": "string", "description": "The task's id (start_task: default a new one)."},
}
_TOOL_KEYS = {"project", "task"}


@dataclass
class Tool:
    name: str
    scope: Scope
    description: str
    properties: dict[str, Any]
    required: tuple[str, ...]
    call: Callable[[Grant, dict[str, Any]], Any]  # run in a worker thread

    def to_tool(self) -> types.Tool:
        schema = {"type": "object", "properties": self.properties,
                  "required": list(self.required), "additionalProperties": False}  # fmt: skip
        read_only = self.scope is Scope.READ
        return types.Tool(
            name=self.name, description=self.description, input_schema=schema,
            annotations=types.ToolAnnotations(read_only_hint=read_only,
                                              destructive_hint=False if read_only else None),
        )  # fmt: skip


class Tools:
    """The tools and resources over one runs root, through one door (`service`)."""

    def __init__(
        self, service: Service, root: Path, workdir: Path, workspaces: tuple[Path, ...] = ()
    ) -> None:
        self.service = service
        self.root = root
        self.workdir = workdir
        self.workspaces = workspaces  # where a token below admin starts tasks (stdio: none)
        self.paths = Paths(root)
        self.tools = {tool.name: tool for tool in self._tools()}

    def _tools(self) -> list[Tool]:
        # fmt: off
        return [
            Tool("start_task", Scope.OPERATE,
                 "Start an agent on a task in a supervised loop (restarts within bounds); returns "
                 "at once with the task's ids, or where it waits in the queue. Check on it with "
                 "task_status and run_output.",
                 {**_TASK, **{k: v for k, v in bodies.start_schema().items() if k != "task_id"}},
                 ("project", "prompt"), self.start),
            Tool("list_tasks", Scope.READ,
                 "Every task (of one project, if given) with its status and latest run.",
                 {"project": _TASK["project"]}, (), self.list_tasks),
            Tool("task_status", Scope.READ,
                 "A task's status, prompt, runs, usage, git work, and how its last loop ended.",
                 _TASK, ("project", "task"), self.status),
            Tool("run_output", Scope.READ,
                 "A run's output: its end (the last max_bytes bytes) or, given offset, the bytes "
                 "from there; next_offset reads on. file: stdout (the agent's stream, live), "
                 "stderr, output (its final answer), prompt, check (what the task's check "
                 "printed, judging a run that said it was done).",
                 {**_TASK,
                  "run": {"type": "string", "description": "The run's id (default: the latest)."},
                  "file": {"enum": list(FILES), "default": "stdout"},
                  "offset": {"type": "integer", "minimum": 0,
                             "description": "Read from this byte (default: the end's last bytes)."},
                  "max_bytes": {"type": "integer", "minimum": 1, "maximum": MAX_BYTES,
                                "default": DEFAULT_BYTES}},
                 ("project", "task"), self.output),
            Tool("stop_task", Scope.OPERATE,
                 "Stop a task's loop (its agent's whole process tree), or take it out of the "
                 "queue; nothing restarts.", _TASK, ("project", "task"), self.stop),
            Tool("resume_task", Scope.OPERATE,
                 "Start a stopped or failed task's loop again, with its prompt and settings (any "
                 "loop option given changes them); message gives its next attempt a person's "
                 "words (a running task's next attempt, or with now its current one ended).",
                 {**_TASK, **bodies.resume_schema()}, ("project", "task"), self.resume),
            Tool("list_approvals", Scope.READ,
                 "The operations runs paused on an operation that needs a person's approval.",
                 {}, (), self.approvals),
            Tool("answer_approval", Scope.OPERATE,
                 "Approve or deny the operation an operations run is paused on; its batch goes "
                 "on, and its events are returned.",
                 {"run": {"type": "string", "description": "The operations run's id."},
                  "operation": {"type": "string", "description": "The operation's id."},
                  "decision": {"enum": ["approved", "denied"]},
                  "reason": {"type": "string"},
                  "operationHash": {"type": "string", "description": "The hash shown with it: "
                                    "refused if the operation changed since."}},
                 ("run", "operation", "decision"), self.answer),
            Tool("unpause_agent", Scope.OPERATE,
                 "Lift the pause a provider's limit put an agent in across the fleet: its queued "
                 "tasks start as their turns come, before the reset its provider said.",
                 {"agent": {"type": "string", "description": "The agent's name in config.yaml."}},
                 ("agent",), self.unpause),
            Tool("hold_queue", Scope.OPERATE,
                 "Hold the whole queue: no queued task starts until release_queue; the loops "
                 "that run go on (not for a token limited to projects).", {}, (), self.hold),
            Tool("release_queue", Scope.OPERATE,
                 "Release the queue hold_queue held: its tasks start as their turns come.", {},
                 (), self.release),
            Tool("stop_all", Scope.OPERATE,
                 "Stop every loop (of project, if given) and take every task (of it) out of "
                 "the queue, the queue held meanwhile so that none starts; a token limited to "
                 "projects stops only theirs.", {"project": _TASK["project"]}, (),
                 self.stop_all),
            Tool("paste_reply", Scope.OPERATE,
                 "Hand a paste task's run the chat's reply (the whole answer, as text).",
                 {**_TASK, "reply": {"type": "string"}}, ("project", "task", "reply"),
                 self.paste),
        ]
        # fmt: on

    # Tools ---------------------------------------------------------------------------------

    def task(self, grant: Grant, args: dict[str, Any], must_exist: bool = True) -> TaskPaths:
        project, task_id = _text(args, "project"), _text(args, "task")
        grant.reach(validate_id("project", project))
        return self.paths.named(project, task_id, must_exist)

    def start(self, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
        body = {k: v for k, v in args.items() if k not in _TOOL_KEYS}
        task_id = str(args.get("task") or "") or new_task_id()
        task = self.task(grant, {"project": args.get("project"), "task": task_id}, False)
        return self._through_the_door(
            bodies.start_request(body, task, self.workdir, grant, self.workspaces)
        )

    def resume(self, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
        task = self.task(grant, args)
        body = {k: v for k, v in args.items() if k not in _TOOL_KEYS}
        start = bodies.resume_request(body, task, self.workdir, grant, self.workspaces, "MCP")
        kept = self.service.steer(start)
        if kept is not None:  # its loop runs: the message waits for its next attempt
            return bodies.steered(start, kept)
        return self._through_the_door(start)

    def _through_the_door(self, start: StartRequest) -> dict[str, Any]:
        try:
            started = self.service.start(start)
        except AlreadyCompletedError as exc:
            raise AlreadyCompletedError(f"{exc} (give again: true)") from exc
        return bodies.started(start, started)

    def list_tasks(self, grant: Grant, args: dict[str, Any]) -> list[dict[str, Any]]:
        only = args.get("project")
        if only is not None:
            grant.reach(validate_id("project", _text(args, "project")))
        rows = streams.of_projects(streams.snapshot(self.root), grant.reaches)
        return [json.loads(row) for label, row in rows.items()
                if only is None or label.partition("/")[0] == only]  # fmt: skip

    def status(self, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
        return detail.of(self.task(grant, args), grant.reaches)

    def output(self, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
        name = args.get("file", "stdout")
        if name not in FILES:
            raise UsageError(f"file {name!r} is not one of {', '.join(FILES)}")
        limit = _count(args, "max_bytes", DEFAULT_BYTES, MAX_BYTES)
        offset = _count(args, "offset", -1, None)
        task = self.task(grant, args)
        run_id = args.get("run") or next(reversed(task.run_ids()), None)
        if run_id is None:
            raise NotFoundError(f"task {task.label} has no run yet")
        path = self.paths.run_file(self.paths.run_folder(task, str(run_id)), name, FILES)
        size = streams.file_size(task.fence, path)
        tail = offset < 0
        start = max(0, size - limit) if tail else min(offset, size)
        data = streams.read_at(task.fence, path, start, min(limit, size - start)) if size else b""
        if tail and start > 0:  # begin on a character, not inside one
            cut = next((i for i, b in enumerate(data[:4]) if b & 0xC0 != 0x80), 0)
            data, start = data[cut:], start + cut
        status = listing.view(task).status.value
        return {"run": run_id, "file": name, "size": size, "offset": start,
                "next_offset": start + len(data), "more": start + len(data) < size,
                "task_status": status, "text": data.decode("utf-8", "replace")}  # fmt: skip

    def stop(self, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
        task = self.task(grant, args)
        holder = self.service.stop(task, STOP_WAIT)
        return {"stopped": holder is not None, "left_queue": isinstance(holder, Waiting),
                "status": listing.view(task).status.value}  # fmt: skip

    def unpause(self, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
        agent = _text(args, "agent")
        if grant.projects is not None:
            raise ForbiddenError(
                "a pause holds across the runs root; this token reaches only some projects"
            )
        return {"agent": agent, "lifted": self.service.unpause(agent)}

    def hold(self, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
        _whole_root(grant)
        held, made = self.service.hold_queue("MCP")
        return {"hold": {**held.to_json(), "words": held.words()}, "made": made}

    def release(self, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
        _whole_root(grant)
        released = self.service.release_queue()
        return {"released": released.words(past=True) if released else None}

    def stop_all(self, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
        project = None
        if args.get("project") is not None:
            project = validate_id("project", _text(args, "project"))
            grant.reach(project)
        return self.service.stop_everything(STOP_WAIT, project, grant.projects).to_dict()

    def approvals(self, grant: Grant, args: dict[str, Any]) -> list[dict[str, Any]]:
        return pending_approvals(self.root, grant.reaches)

    def answer(self, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
        run_id = _text(args, "run")
        try:
            folder = find_run(self.root, validate_id("run", run_id))
        except (UsageError, NotFoundError):
            raise NotFoundError(f"no operations run {run_id[:80]!r}") from None
        grant.reach(ids(folder)["project_id"])
        answer = {k: v for k, v in args.items() if k not in ("run", "operation")}
        return answer_approval(folder, _text(args, "operation"), answer).to_dict()

    def paste(self, grant: Grant, args: dict[str, Any]) -> dict[str, Any]:
        project, task_id = _text(args, "project"), _text(args, "task")
        grant.reach(validate_id("project", project))
        task = self.paths.paste_named(project, task_id)
        path = submit_reply(task, args)  # it reads `reply` alone
        return {"project_id": task.project_id, "task_id": task.task_id, "file": path.name}

    # Resources -----------------------------------------------------------------------------

    def resources(self, grant: Grant) -> list[types.Resource]:
        """The latest run's files of each task the grant reaches, newest tasks first."""
        found: list[types.Resource] = []
        views = sorted(  # run ids begin with their start time: the newest first
            listing.all_tasks(self.root), key=lambda v: v.latest.run_id if v.latest else "",
            reverse=True,
        )  # fmt: skip
        for view in views:
            task = view.paths
            if not grant.reaches(task.project_id) or view.latest is None:
                continue
            run_id = view.latest.run_id
            for name in FILES:
                path = task.run_folder(run_id) / runfolder.RUN_FILES[name]
                st = runfolder.stat_in(task.fence, path, follow=False)  # inside its project
                if st is not None and stat.S_ISREG(st.st_mode):
                    found.append(types.Resource(
                        name=f"{task.label}/{run_id}/{name}", uri=uri_of(task, run_id, name),
                        mime_type="text/plain", size=st.st_size,
                    ))  # fmt: skip
            if len(found) >= MAX_RESOURCES:
                break
        return found[:MAX_RESOURCES]

    def read(self, grant: Grant, uri: str) -> str:
        """A run file by its URI; a file over MAX_RESOURCE is read from its last MiB, said so
        in a first line (run_output reads any part of it)."""
        parts = uri.removeprefix("run-agent://runs/").split("/")
        if not uri.startswith("run-agent://runs/") or len(parts) != 4:
            raise NotFoundError(f"{uri[:200]!r} is not a run file's URI ({URI})")
        project, task_id, run_id, name = (unquote(p) for p in parts)
        if name not in FILES:
            raise NotFoundError(f"no file {name!r}; one of: {', '.join(FILES)}")
        task = self.task(grant, {"project": project, "task": task_id})
        path = self.paths.run_file(self.paths.run_folder(task, run_id), name, FILES)
        size = streams.file_size(task.fence, path)
        start = max(0, size - MAX_RESOURCE)
        data = streams.read_at(task.fence, path, start, size - start) if size else b""
        text = data.decode("utf-8", "replace")
        if start:
            text = f"[{start} earlier bytes left out; run_output reads them]\n{text}"
        return text


def uri_of(task: TaskPaths, run_id: str, name: str) -> str:
    return URI.format(project=quote(task.project_id), task=quote(task.task_id), run=run_id,
                      file=name)  # fmt: skip


def _whole_root(grant: Grant) -> None:
    if grant.projects is not None:
        raise ForbiddenError(
            "a hold holds every project's queue; this token reaches only some projects"
        )


def _text(args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str) or not value:
        raise UsageError(f"{name} is required: a string (got {bodies.json_type(value)})")
    return value


def _refuse_null(
    args: dict[str, Any], properties: dict[str, Any], required: tuple[str, ...]
) -> None:
    """A UsageError naming the first argument given as null where its schema allows none: a
    client sends null for a value it could not read (the Inspector, for `max_restarts=lots`),
    and taking it as "not given" would start the task with the defaults instead."""
    for name, value in args.items():
        if value is None and not _allows_null(properties.get(name, {})):
            kind = _kind(properties.get(name, {}))
            fix = "give one" if name in required else "give one, or leave it out"
            raise UsageError(f"{name} is null, not {kind}: {fix}")


def _allows_null(schema: dict[str, Any]) -> bool:
    kinds = schema.get("type")
    if "enum" in schema:
        return None in schema["enum"]
    if kinds is None:
        return True
    return "null" in (kinds if isinstance(kinds, list) else [kinds])


def _kind(schema: dict[str, Any]) -> str:
    """What a schema takes, in words: `an integer`, `a number or a string`, `one of a, b`."""
    if "enum" in schema:
        return "one of " + ", ".join(map(str, schema["enum"]))
    kinds = schema.get("type")
    listed = kinds if isinstance(kinds, list) else [kinds]
    return " or ".join(("an " if str(k)[0] in "aeiou" else "a ") + str(k) for k in listed)


def _count(args: dict[str, Any], name: str, default: int, most: int | None) -> int:
    value = args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or (value < 0 and value != default):
        raise UsageError(f"{name} {shown(value)} is not a whole number of bytes (0 or more)")
    if most is not None and value > most:
        raise UsageError(f"{name} {value} is over {most}; read in parts with offset")
    return value


def server(tools: Tools, grant: Callable[[ServerRequestContext[Any]], Grant]) -> Server[Any]:
    """The MCP server of `tools`, each request's grant read by `grant` from its context."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        allowed = grant(ctx)
        return types.ListToolsResult(
            tools=[t.to_tool() for t in tools.tools.values() if allowed.scope >= t.scope]
        )

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tool = tools.tools.get(params.name)
        args = dict(params.arguments or {})
        if tool is None:  # the specification's "unknown tools": a protocol error, not a tool's
            known = ", ".join(tools.tools)
            raise MCPError(INVALID_PARAMS, f"unknown tool {params.name[:80]!r}; one of: {known}")
        try:
            allowed = grant(ctx)
            allowed.require(tool.scope, tool.name)
            bodies.refuse_unknown(args, tool.properties, tool.name)
            _refuse_null(args, tool.properties, tool.required)
            found = await _in_thread(tool.call, allowed, args)
        except RunAgentError as exc:
            return _error(str(exc))
        except Exception as exc:  # a tool's own fault: said in one line, logged whole
            log.exception("tool %s failed", params.name)
            return _error(f"{params.name} failed: {type(exc).__name__}: {exc}")
        text = json.dumps(found, indent=1, default=str)
        shaped = found if isinstance(found, dict) else {"items": found}
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=text)], structured_content=shaped
        )

    async def list_resources(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=await _in_thread(tools.resources, grant(ctx)))

    async def list_templates(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        template = types.ResourceTemplate(
            name="run file", uri_template=URI, mime_type="text/plain",
            description=f"A run's file: {', '.join(FILES)}.",
        )  # fmt: skip
        return types.ListResourceTemplatesResult(resource_templates=[template])

    async def read_resource(
        ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        try:
            text = await _in_thread(tools.read, grant(ctx), uri)
        except RunAgentError as exc:  # the client gets the one line, as a resource not found
            raise MCPError(RESOURCE_NOT_FOUND, scrub_urls(str(exc))) from None
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, mime_type="text/plain", text=text)]
        )

    return Server(
        "run-agent", version=__version__,
        instructions="Start AI coding agents on tasks in supervised loops, and check on them: "
        "start_task returns at once; task_status and run_output say how it goes.",
        on_list_tools=list_tools, on_call_tool=call_tool, on_list_resources=list_resources,
        on_list_resource_templates=list_templates, on_read_resource=read_resource,
    )  # fmt: skip


async def _in_thread(call: Callable[..., Any], *args: Any) -> Any:
    return await anyio.to_thread.run_sync(lambda: call(*args))


def _error(message: str) -> types.CallToolResult:
    text = scrub_urls(message)  # a URL's password is never answered
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                is_error=True)  # fmt: skip


def _http_grant(ctx: ServerRequestContext[Any]) -> Grant:
    """The grant the key middleware left on the HTTP request that carried the message."""
    request = ctx.request
    return grant_of(request) if isinstance(request, Request) else Grant(Scope.READ, frozenset())


class Http:
    """`/mcp` of `run-agent serve`, an ASGI app: streamable HTTP without sessions (each POST
    stands alone, answered as JSON), so nothing is kept between requests and a restarted server
    loses no client's state. `run()` is its part of the server's lifespan (the SDK's manager
    runs once, so each lifespan has its own)."""

    def __init__(self, tools: Tools) -> None:
        self.server = server(tools, _http_grant)
        self.manager: StreamableHTTPSessionManager | None = None

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        manager = StreamableHTTPSessionManager(self.server, json_response=True, stateless=True)
        async with manager.run():
            self.manager = manager
            try:
                yield
            finally:
                self.manager = None

    async def __call__(self, scope: Asgi, receive: Receive, send: Send) -> None:
        if self.manager is None:
            answer = JSONResponse({"error": "the MCP endpoint is not running yet"}, 503)
            await answer(scope, receive, send)
            return
        await self.manager.handle_request(scope, receive, send)


async def serve_stdio(tools: Tools) -> None:
    """Serve over this process's stdin and stdout until the client closes them (stdio: the
    local user's own process, so every tool is allowed)."""
    from mcp.server.stdio import stdio_server

    mcp = server(tools, lambda ctx: ADMIN)
    async with stdio_server() as (read, write):
        await mcp.run(read, write, mcp.create_initialization_options())
