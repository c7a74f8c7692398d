"""The Starlette app of `run-agent serve`: REST and SSE over run folders, and the static page.

The server only reads run folders; starting a task spawns a detached supervisor, so runs outlive
the server. It imports no backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from runagent import __version__, listing
from runagent.errors import RunAgentError, UsageError
from runagent.loop import lines
from runagent.loop.context import is_run_id, validate_id
from runagent.paste import state as paste_state
from runagent.store import runfolder, tasks
from runagent.store.credentials import scrub_urls
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import Usage
from runagent.store.tokens import Scope
from server import detail, streams
from server.actions import MAX_BODY, Actions
from server.assets import STATIC, asset, page_file
from server.hub import Hub
from server.intake import Bounded, Drained
from server.ops import OpsApi
from server.paths import Paths
from server.schedules import QueueWatch, ScheduleRunner
from server.security import MCP_PATH, HostMiddleware, KeyMiddleware, SameOrigin, grant_of
from server.settings import Settings as Settings  # where the callers have found it

if TYPE_CHECKING:  # prometheus_client is loaded with the first scrape
    from server import metrics

T = TypeVar("T")
STREAM_FILES = ("stdout", "stderr", "output", "check")
SHUTDOWN_GRACE = 2.0  # seconds a stream has to end by itself when the server shuts down
MAX_BYTES = 2**62  # offsets past this cannot be a position in a file (and overflow a seek)
COUNT_CHUNK = 4 * 1024 * 1024  # bytes read at a time when counting lines: memory stays bounded
FILE_PIECE = 1024 * 1024  # bytes of a run file sent at a time


def byte_count(name: str, raw: str) -> int:
    """A byte offset or length from a request: ASCII digits, at most MAX_BYTES; else a 400."""
    if not (raw.isascii() and raw.isdigit()):
        raise HTTPException(400, f"{name} {raw[:40]!r} is not a whole number of bytes")
    if len(raw) > len(str(MAX_BYTES)) or int(raw) > MAX_BYTES:
        raise HTTPException(400, f"{name} {raw[:40]} is beyond any file (at most {MAX_BYTES})")
    return int(raw)


def create_app(settings: Settings) -> Starlette:
    hub = Hub(settings.root)
    service = settings.service()
    runner = ScheduleRunner(
        settings.schedules,
        settings.root,
        service.fire,
        settings.run_schedules,
        settings.clock,
        leader=service.hold_scheduler,
    )

    from server import mcptools  # the official SDK: its import is paid by the server alone

    watch = QueueWatch(service.keep_queue)
    mcp = mcptools.Http(
        mcptools.Tools(service, settings.root, settings.workdir, settings.workspaces)
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await hub.start()
        runner.start()
        watch.start()
        try:
            async with mcp.run():
                yield
        finally:
            await run_in_threadpool(watch.stop)
            await run_in_threadpool(runner.stop)
            await hub.stop()

    paths = Paths(settings.root)
    api = Api(settings, hub, paths)
    routes = [
        Route("/", api.index),
        Route("/favicon.ico", api.favicon),
        Route("/api/health", api.health),
        Route("/metrics", api.metrics),
        Route("/api/projects", api.projects),
        Route("/api/tasks", api.all_tasks),
        Route("/api/events", api.events),
        Route("/api/backends/{name}/lines", api.backend_lines),
        Route("/api/projects/{project}/tasks", api.project_tasks, methods=["GET"]),
        Route("/api/projects/{project}/tasks/{task}", api.task, methods=["GET"]),
        Route("/api/projects/{project}/tasks/{task}/paste", api.paste, methods=["GET"]),
        Route("/api/projects/{project}/tasks/{task}/diff", api.diff, methods=["GET"]),
        Route("/api/projects/{project}/tasks/{task}/stream", api.task_stream),
        Route("/api/projects/{project}/tasks/{task}/runs", api.runs),
        Route("/api/projects/{project}/tasks/{task}/runs/{run}", api.run),
        Route("/api/projects/{project}/tasks/{task}/runs/{run}/files/{name}", api.file),
        Route("/api/projects/{project}/tasks/{task}/runs/{run}/files/{name}/lines", api.lines),
        Route("/api/projects/{project}/tasks/{task}/runs/{run}/stream/{name}", api.run_stream),
        *Actions(settings, service, runner, paths).routes(),
        *OpsApi(settings.root, settings.workspaces, hub, api._sse, service.current_config).routes(),
        Route("/static/{name}", asset),
        Route(MCP_PATH, SameOrigin(Bounded(mcp, MAX_BODY))),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[
            Middleware(Drained),  # outermost: every refusal of a request with a body is read
            Middleware(HostMiddleware, allowed=settings.allowed_hosts),
            Middleware(
                KeyMiddleware,
                key=settings.api_key,
                root=settings.root,
                open_paths=_open_paths(settings),
            ),
        ],
        exception_handlers={HTTPException: _http_error, RunAgentError: _run_agent_error},
    )
    app.state.hub = hub  # its streams' shared tails, for the tests of the fan-out
    return app


def _open_paths(settings: Settings) -> frozenset[str]:
    """What answers without the API key beside the page's assets: /metrics if made public."""
    return frozenset({"/metrics"}) if settings.metrics_public else frozenset()


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    detail = scrub_urls(exc.detail) if isinstance(exc.detail, str) else exc.detail
    return JSONResponse({"error": detail}, status_code=exc.status_code, headers=exc.headers)


async def _run_agent_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RunAgentError)
    return JSONResponse({"error": scrub_urls(str(exc))}, status_code=exc.http_status)


class Api:
    """The read API's handlers: reading run folders and streaming them (writes are `Actions`')."""

    def __init__(self, settings: Settings, hub: Hub, paths: Paths) -> None:
        self.settings = settings
        self.root = settings.root
        self.hub = hub
        self.paths = paths
        self.task_paths = paths.task
        self.paste_task = paths.paste_task
        self.sse_clients = 0  # SSE responses being sent now (the metrics' gauge)
        self.tally: metrics.Tally | None = None  # kept from one scrape of /metrics to the next

    # Paths from requests ---------------------------------------------------------------------

    def run_folder(self, request: Request) -> tuple[TaskPaths, Path]:
        task = self.task_paths(request)
        return task, self.paths.run_folder(task, request.path_params["run"])

    def run_file(self, request: Request, names: Sequence[str]) -> tuple[Path, Path]:
        _, folder = self.run_folder(request)
        return folder, self.paths.run_file(folder, request.path_params["name"], names)

    # Reading -------------------------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        return page_file("index.html", request)

    async def favicon(self, request: Request) -> Response:
        """Browsers ask for /favicon.ico whatever the page says; answer it, not a 404."""
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")

    async def health(self, request: Request) -> Response:
        """Up, its version, and what the caller may do (`access`: its scope and projects); the
        runs root's path (a host path) only to a grant of the whole root at admin scope (the
        api_key, an admin token of every project)."""
        grant = grant_of(request)
        # What the caller may do (its own access, nothing of anyone else's): the page shows
        # only the actions it can take.
        access = {
            "scope": grant.scope.name.lower(),
            "projects": sorted(grant.projects) if grant.projects is not None else None,
        }
        found: dict[str, Any] = {"status": "ok", "version": __version__, "access": access}
        if grant.scope >= Scope.ADMIN and grant.projects is None:
            found["root"] = str(self.root)
        return JSONResponse(found)

    async def projects(self, request: Request) -> Response:
        reaches = grant_of(request).reaches

        def projects() -> list[dict[str, Any]]:
            used: dict[str, Usage] = {}
            for label, row in listing.glance(self.root)[0].items():
                if row["usage"] is not None:
                    project = label.partition("/")[0]
                    found = Usage(**row["usage"])
                    used[project] = used[project] + found if project in used else found
            return [
                {
                    "project_id": p,
                    "tasks": len(runfolder.task_ids(self.root, p)),
                    "usage": used[p].to_dict() if p in used else None,
                }
                for p in runfolder.project_ids(self.root)
                if reaches(p)
            ]

        return JSONResponse(await run_in_threadpool(projects))

    async def all_tasks(self, request: Request) -> Response:
        reaches = grant_of(request).reaches
        rows = await run_in_threadpool(streams.snapshot, self.root)
        text = streams.json_array(streams.of_projects(rows, reaches).values())
        return Response(text, media_type="application/json")

    async def project_tasks(self, request: Request) -> Response:
        try:
            project = validate_id("project", request.path_params["project"])
        except UsageError as exc:
            raise HTTPException(404, str(exc)) from exc
        if not (self.root / project).is_dir():
            raise HTTPException(404, f"project {project!r} not found")
        views = await run_in_threadpool(listing.all_tasks, self.root, project)
        return JSONResponse([v.to_dict() for v in views])

    async def task(self, request: Request) -> Response:
        task = self.task_paths(request)
        return JSONResponse(await run_in_threadpool(detail.of, task, grant_of(request).reaches))

    async def diff(self, request: Request) -> Response:
        """A worktree task's branch against its fork, as a patch (the first 2 MiB, `truncated`
        past that): what `merge` would bring back."""
        task = self.task_paths(request)
        from runagent.issues import worktree

        found = await run_in_threadpool(worktree.diff, task, dict(os.environ))
        return JSONResponse(found.to_dict())

    async def paste(self, request: Request) -> Response:
        """The task's paste session as a person needs it: the current outbox (name, sequence,
        size, text), the last reply's results, the messages, the summary once DONE."""
        task = self.paste_task(request)
        found = await run_in_threadpool(paste_state.view, task)  # an outbox linking out: no text
        if found is None:
            raise HTTPException(404, f"task {task.label} has no paste session")
        return JSONResponse(found)

    async def runs(self, request: Request) -> Response:
        task = self.task_paths(request)
        infos = await run_in_threadpool(tasks.runs, task)
        return JSONResponse([i.to_dict() for i in infos])

    async def run(self, request: Request) -> Response:
        _, folder = self.run_folder(request)
        info = runfolder.read_run_record(folder)  # an unreadable one says why
        if info is None:
            raise HTTPException(404, "run has no run-info.yaml yet")
        return JSONResponse(tasks.effective(info, folder).to_dict())

    async def file(self, request: Request) -> Response:
        """A run file, whole or a byte range (?offset=&length=), or as a download (?download=1)."""
        folder, path = self.run_file(request, list(runfolder.RUN_FILES))
        fence = runfolder.RunPaths(folder).fence
        size = streams.file_size(fence, path)
        offset = byte_count("offset", request.query_params.get("offset", "0"))
        length = min(
            byte_count("length", request.query_params.get("length", str(size))),
            max(0, size - offset),
        )
        headers = {"X-File-Size": str(size), "X-Offset": str(offset)}
        if request.query_params.get("download"):
            name = f"{path.parent.name}-{path.name}"
            headers["Content-Disposition"] = f'attachment; filename="{name}"'

        async def pieces() -> AsyncIterator[bytes]:
            """The range a piece at a time, off the event loop: a run's output of gigabytes
            (or a file an agent made sparse and huge) is never held whole in memory."""
            at, end = offset, offset + length
            while at < end:
                piece = await run_in_threadpool(
                    streams.read_at, fence, path, at, min(FILE_PIECE, end - at)
                )
                if not piece:  # it shrank meanwhile
                    return
                at += len(piece)
                yield piece

        return StreamingResponse(pieces(), media_type="text/plain; charset=utf-8", headers=headers)

    async def lines(self, request: Request) -> Response:
        """How many newlines a run file has before byte `?offset=` (at most its size): the page
        numbers a huge log's tail by it without reading the file's start."""
        folder, path = self.run_file(request, list(runfolder.RUN_FILES))
        fence = runfolder.RunPaths(folder).fence
        offset = byte_count("offset", request.query_params.get("offset", "0"))
        offset = min(offset, streams.file_size(fence, path))
        counted = await run_in_threadpool(newlines_before, fence, path, offset)
        return JSONResponse({"offset": offset, "newlines": counted})

    async def backend_lines(self, request: Request) -> Response:
        """How the stdout lines of a run of backend NAME read (runagent/loop/lines.py): the rules
        the page draws the agent's JSON events by, none where the backend states none."""
        name = request.path_params["name"]
        told = self.settings.backend_lines
        rules = [] if told is None else await run_in_threadpool(told, name)
        return JSONResponse({"backend": name, "rules": lines.checked(rules, name)})

    # Streams -----------------------------------------------------------------------------------

    def _offset(self, request: Request) -> int:
        if "last-event-id" in request.headers:
            return byte_count("Last-Event-ID", request.headers["last-event-id"] or "0")
        return byte_count("from", request.query_params.get("from") or "0")

    async def metrics(self, request: Request) -> Response:
        """The root's figures in Prometheus' text format (server/metrics.py)."""
        from server import metrics

        if self.tally is None:
            self.tally = metrics.Tally()
        grant = grant_of(request)  # a token limited to projects sees theirs alone
        reaches = None if grant.projects is None else grant.reaches
        body = await run_in_threadpool(
            metrics.render, self.root, self.sse_clients, self.tally, reaches
        )
        return Response(body, media_type=metrics.CONTENT_TYPE)

    def _sse(self, request: Request, events: AsyncIterator[streams.Event]) -> Response:
        """An SSE response of `events` that ends cleanly when the server shuts down (a client
        still connected on Ctrl-C gets the end of its response, and nothing is logged), or when
        the token it was opened with is revoked or expires."""
        stop = anyio.Event()
        valid = request.scope.get("state", {}).get("still_valid")
        if valid is not None:
            events = _while(valid, stop, events)
        return EventSourceResponse(
            self._counted(streams.until(stop, events)),
            ping=self.settings.heartbeat,
            send_timeout=60,
            shutdown_event=stop,
            shutdown_grace_period=SHUTDOWN_GRACE,
        )

    async def _counted(self, events: AsyncIterator[T]) -> AsyncIterator[T]:
        """`events`, counted among the SSE clients while they are sent."""
        self.sse_clients += 1
        try:
            async for event in events:
                yield event
        finally:
            self.sse_clients -= 1

    async def run_stream(self, request: Request) -> Response:
        folder, path = self.run_file(request, STREAM_FILES)
        offset = self._offset(request)
        return self._sse(request, streams.run_file_events(self.hub, folder, path.name, offset))

    async def task_stream(self, request: Request) -> Response:
        task = self.task_paths(request)
        name = request.query_params.get("file", "stdout")
        if name not in STREAM_FILES:
            raise HTTPException(404, f"no file {name!r}; one of: {', '.join(STREAM_FILES)}")
        cursor = request.headers.get("last-event-id") or request.query_params.get("from")
        run_id, offset = None, 0
        if cursor and ":" in cursor:
            run_id, _, raw = cursor.rpartition(":")
            if not is_run_id(run_id):
                raise HTTPException(400, f"cursor {cursor[:80]!r} is not RUN_ID:OFFSET")
            offset = byte_count("the cursor's offset", raw)
        elif cursor:
            raise HTTPException(400, f"cursor {cursor[:80]!r} is not RUN_ID:OFFSET")
        return self._sse(
            request, streams.task_events(self.hub, task, runfolder.RUN_FILES[name], run_id, offset)
        )

    async def events(self, request: Request) -> Response:
        reaches = grant_of(request).reaches
        return self._sse(request, streams.root_events(self.hub, self.root, reaches))


REVALIDATE = 1.0  # seconds between looks at whether a stream's token is still good


async def _while(
    valid: Callable[[], bool], stop: anyio.Event, events: AsyncIterator[T]
) -> AsyncIterator[T]:
    """`events`, with `stop` set once `valid()` says the stream's token is no longer good (the
    stream then ends as at shutdown: a revoked token reads nothing more)."""

    async def watch() -> None:
        while not stop.is_set():
            with anyio.move_on_after(REVALIDATE):
                await stop.wait()
            if not stop.is_set() and not await run_in_threadpool(valid):
                stop.set()

    watcher = asyncio.ensure_future(watch())
    try:
        async for event in events:
            yield event
    finally:
        watcher.cancel()


def newlines_before(fence: str, path: Path, offset: int) -> int:
    """The newlines in the file's first `offset` bytes, read COUNT_CHUNK bytes at a time (an
    84 MB log is counted in well under a second, in a few MB of memory)."""
    counted = at = 0
    while at < offset:
        data = streams.read_at(fence, path, at, min(COUNT_CHUNK, offset - at))
        if not data:
            break  # the file shrank (or was swapped for a link): what was there is counted
        counted += data.count(b"\n")
        at += len(data)
    return counted
