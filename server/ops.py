"""The server's face of the operations runtime: create a run, send it messages, read its events,
answer its approvals.

A workspace named by a request must resolve, links and all, inside one of the folders the server
was configured to let operations act in (`server.ops_workspaces`, by default the folder it was
started in): whoever holds the API key may run shell commands in a workspace, so the key must not
also choose any folder of the machine (a home folder, /etc). One message at a time per run: a
second one sent while the first runs, here or by any process (the run's turn lock), gets a 409,
so two batches never interleave in one run.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runagent.config.settings import Config
from runagent.errors import (
    AlreadyRunningError,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    RunAgentError,
    UsageError,
    shown,
)
from runagent.loop.context import new_run_id, validate_id
from runagent.ops.approval import awaited
from runagent.ops.event import EventsMessage
from runagent.ops.protocol import MAX_MESSAGE_BYTES
from runagent.ops.runs import all_runs, approval_row, describe, ids
from runagent.ops.runtime import Runtime, find_run
from runagent.ops.sandbox import Sandbox
from runagent.store import runfolder
from runagent.store.runfolder import RunPaths, TaskPaths, within
from runagent.store.tokens import Scope
from server import streams
from server.hub import Hub
from server.security import bounded_body, cross_site_write, grant_of

POLICIES = ("restrictive", "standard", "permissive")
DECISIONS = ("approved", "denied")
SANDBOXES = tuple(s.value for s in Sandbox)
CONFINES = {Sandbox.NONE: 0, Sandbox.AUTO: 1, Sandbox.BWRAP: 2}  # more confined, higher


@dataclass
class OpsApi:
    """The operations routes over the runs root `root`; workspaces only inside `workspaces`."""

    root: Path
    workspaces: tuple[Path, ...]
    hub: Hub
    sse: Callable[[Request, AsyncIterator[streams.Event]], Response]
    # The config as a start now reads it (None: none to read), whose `ops.sandbox` is what a
    # run is made with unless asked, and the least a token below admin may ask for.
    config: Callable[[], Config | None] = lambda: None

    def routes(self) -> list[Route]:
        return [
            Route("/api/ops/runs", self.list_runs, methods=["GET"]),
            Route("/api/ops/runs", self.create, methods=["POST"]),
            Route("/api/ops/approvals", self.approvals, methods=["GET"]),
            Route("/api/ops/runs/{run}", self.run, methods=["GET"]),
            Route("/api/ops/runs/{run}/messages", self.message, methods=["POST"]),
            Route("/api/ops/runs/{run}/events", self.events, methods=["GET"]),
            Route("/api/ops/runs/{run}/events/stream", self.event_stream, methods=["GET"]),
            Route("/api/ops/runs/{run}/approvals/{operation}", self.answer, methods=["POST"]),
        ]

    # Which folders ---------------------------------------------------------------------------

    def workspace(self, given: object) -> Path:
        """The folder a request names, if operations may act there; else a 403 or 400."""
        if not isinstance(given, str) or not given or "\0" in given:
            raise HTTPException(400, "workspace is required: a folder the operations act in")
        allowed = [f.resolve() for f in self.workspaces]
        path = Path(given).expanduser()
        path = path if path.is_absolute() else allowed[0] / path
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            raise HTTPException(
                400, f"workspace {given!r} does not exist; create it first"
            ) from None
        if not real.is_dir():
            raise HTTPException(400, f"workspace {given!r} is not a folder")
        if not any(within(f, real) for f in allowed):
            shown = ", ".join(str(f) for f in allowed)
            raise HTTPException(
                403,
                f"workspace {given!r} is outside the folders operations may act in ({shown}); "
                "add it to server.ops_workspaces in config.yaml",
            )
        return real

    def folder(self, request: Request) -> Path:
        """The operations run a request names, if its project is one the request reaches."""
        run_id = request.path_params["run"]
        try:
            found = find_run(self.root, validate_id("run", run_id))
        except (UsageError, NotFoundError):
            raise HTTPException(404, f"no operations run {run_id[:80]!r}") from None
        grant_of(request).reach(ids(found)["project_id"])
        return found

    # Reading ---------------------------------------------------------------------------------

    async def list_runs(self, request: Request) -> Response:
        reaches = grant_of(request).reaches
        return JSONResponse(
            await run_in_threadpool(lambda: [describe(f) for f in all_runs(self.root, reaches)])
        )

    async def run(self, request: Request) -> Response:
        folder = self.folder(request)
        return JSONResponse(await run_in_threadpool(describe, folder))

    async def approvals(self, request: Request) -> Response:
        reaches = grant_of(request).reaches
        return JSONResponse(await run_in_threadpool(pending_approvals, self.root, reaches))

    async def events(self, request: Request) -> Response:
        """Every events message the run sent, in order, and the byte size they came from (the
        offset to stream on from)."""
        run = RunPaths(self.folder(request))
        path = run.events
        size = streams.file_size(run.fence, path)
        data = streams.read_at(run.fence, path, 0, size) if size else b""
        messages = [json.loads(line) for line in data.decode("utf-8").splitlines() if line]
        return JSONResponse({"runId": path.parent.name, "messages": messages, "offset": size})

    async def event_stream(self, request: Request) -> Response:
        """events.jsonl as SSE: one `events` event per events message, its id the byte offset
        after it, so a client reconnecting with Last-Event-ID misses none and gets none twice."""
        run = RunPaths(self.folder(request))
        path = run.events
        raw = request.headers.get("last-event-id") or request.query_params.get("from") or "0"
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 19:
            raise HTTPException(400, f"offset {raw[:40]!r} is not a whole number of bytes")
        offset = int(raw)
        if offset and streams.read_at(run.fence, path, offset - 1, 1) != b"\n":
            raise HTTPException(400, f"offset {offset} is not the end of an events message")
        return self.sse(request, message_events(self.hub, path, offset))

    # Writing ---------------------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        body = json_object(await self.body(request))
        workspace = self.workspace(body.get("workspace"))
        policy = body.get("policy", "standard")
        if policy not in POLICIES:
            raise HTTPException(400, f"policy {shown(policy)} is not one of {', '.join(POLICIES)}")
        config = await run_in_threadpool(self.config)
        floor = Sandbox(config.ops.sandbox) if config is not None else Sandbox.AUTO
        sandbox = body.get("sandbox", floor.value)
        if sandbox not in SANDBOXES:
            raise HTTPException(
                400, f"sandbox {shown(sandbox)} is not one of {', '.join(SANDBOXES)}"
            )
        try:
            project = validate_id("project", str(body.get("project_id") or "ops"))
            task_id = validate_id("task", str(body.get("task_id") or "ops"))
        except UsageError as exc:
            raise HTTPException(400, str(exc)) from exc
        grant = grant_of(request)
        grant.reach(project)
        if grant.scope < Scope.ADMIN and CONFINES[Sandbox(sandbox)] < CONFINES[floor]:
            raise ForbiddenError(
                f"sandbox {sandbox}: the config's ops.sandbox is {floor.value}, and only the "
                "config's owner lowers it (its command line, the api_key or an admin token); "
                "leave it out"
            )
        task = runfolder.confine(TaskPaths(self.root, project, task_id))

        def create() -> Path:
            folder = task.run_folder(new_run_id())
            Runtime.create(folder, workspace, policy, Sandbox(sandbox))
            return folder

        folder = await run_in_threadpool(create)
        return JSONResponse(describe(folder), status_code=201)

    async def message(self, request: Request) -> Response:
        """The events message answering the operations message (or answer) in the body."""
        text = (await self.body(request)).decode("utf-8", errors="surrogateescape")
        folder = self.folder(request)
        reply = await self.exclusive(folder, lambda runtime: runtime.receive_text(text))
        return JSONResponse(reply.to_dict())

    async def answer(self, request: Request) -> Response:
        """Approve or deny the operation the run is paused on: `{"decision": "approved" |
        "denied", "reason"?, "operationHash"?}`; the batch goes on, and its events come back."""
        body = json_object(await self.body(request))
        folder = self.folder(request)
        operation = request.path_params["operation"]
        reply = await run_in_threadpool(answer_approval, folder, operation, body)
        return JSONResponse(reply.to_dict())

    async def body(self, request: Request) -> bytes:
        """The body of a write: same-origin JSON, at most MAX_MESSAGE_BYTES."""
        refusal = cross_site_write(request)
        if refusal is not None:
            raise HTTPException(403, refusal)
        return await bounded_body(request, MAX_MESSAGE_BYTES)

    async def exclusive(
        self, folder: Path, act: Callable[[Runtime], EventsMessage]
    ) -> EventsMessage:
        """`act` on the run's runtime in a worker thread, holding the run's turn (in_turn)."""
        return await run_in_threadpool(in_turn, folder, act)


def in_turn(folder: Path, act: Callable[[Runtime], EventsMessage]) -> EventsMessage:
    """`act` on the run's runtime, holding the run's turn, unless a message is already being
    answered in that run, by this server or any process (AlreadyRunningError: a 409)."""
    runtime = Runtime.open(folder, on_busy=None)
    try:
        with runtime.turn():
            return act(runtime)
    except AlreadyRunningError as exc:
        raise AlreadyRunningError(f"{exc}; retry") from None


def pending_approvals(root: Path, reaches: Callable[[str], bool]) -> list[dict[str, Any]]:
    """Each operations run (in the projects `reaches` lets through) paused on an approval."""
    rows = []
    for folder in all_runs(root, reaches):
        try:
            waiting = Runtime.open(folder).pending
        except RunAgentError:  # a run whose files cannot be read has nothing to answer
            continue
        if waiting is not None:
            rows.append({**ids(folder), **approval_row(waiting)})
    return rows


def answer_approval(folder: Path, operation: str, body: dict[str, Any]) -> EventsMessage:
    """`{"decision": "approved" | "denied", "reason"?, "operationHash"?}` for the operation the
    run at `folder` is paused on (the API and the MCP tool alike); a ConflictError (409) when it
    awaits no approval, another operation, or the operation changed since it was shown."""
    decision = body.get("decision")
    if decision not in DECISIONS:
        raise UsageError('decision must be "approved" or "denied"')
    extra = {k: body[k] for k in ("reason", "operationHash") if body.get(k) is not None}
    if not all(isinstance(v, str) for v in extra.values()):
        raise UsageError("reason and operationHash must be strings")

    def respond(runtime: Runtime) -> EventsMessage:
        waiting = awaited(runtime.pending, runtime.run_id, operation)
        if extra.get("operationHash", waiting.digest) != waiting.digest:
            raise ConflictError(f"operation {operation!r} is no longer the one shown; look again")
        answer = {"operationId": operation, "decision": decision, **extra}
        return runtime.receive({"approval": answer})

    return in_turn(folder, respond)


def json_object(data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except RecursionError as exc:
        raise HTTPException(400, "the body is nested too deep to read") from exc
    except ValueError as exc:
        raise HTTPException(400, "the body is not valid JSON") from exc
    if not isinstance(body, dict):
        raise HTTPException(400, "the body must be a JSON object")
    return body


async def message_events(hub: Hub, path: Path, offset: int) -> AsyncIterator[streams.Event]:
    """events.jsonl from `offset` as one SSE event per whole line (events message)."""
    held = ""
    async for item in streams.run_file_events(hub, path.parent, path.name, offset):
        if not isinstance(item, streams.Chunk):  # every data event is a chunk
            continue
        held += json.loads(item.data)
        *lines, held = held.split("\n")
        at = item.end - len(held.encode("utf-8"))
        at -= sum(len(line.encode("utf-8")) + 1 for line in lines)
        for line in lines:
            at += len(line.encode("utf-8")) + 1
            yield {"event": "events", "data": line, "id": str(at)}
