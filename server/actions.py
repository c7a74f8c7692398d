"""What the server's API changes: starting, resuming, stopping and deleting tasks, firing a
schedule now, and handing a paste run the chat's reply. Every write is same-origin JSON, checked
before anything is created."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from runagent import listing
from runagent.errors import AlreadyCompletedError, UsageError, shown
from runagent.fleet.queue import Waiting
from runagent.loop.context import new_task_id, validate_id
from runagent.paste import state as paste_state
from runagent.service import Service, StartRequest
from runagent.store import cleanup
from runagent.store.runfolder import TaskPaths
from runagent.store.tokens import Scope
from server import bodies
from server.paths import Paths
from server.schedules import ScheduleRunner
from server.security import bounded_body, cross_site_write, grant_of
from server.settings import Settings

STOP_WAIT = 30.0
MAX_BODY = 4 * 1024 * 1024  # bytes of a write's body (a start's prompt and options)
# Bytes of a paste reply's request body: the reply's own limit, with room for JSON's escapes.
MAX_PASTE_BODY = 2 * paste_state.MAX_REPLY + 64 * 1024


class Actions:
    """The write handlers of the API (and the schedules and agents they start with), each
    through the one door; `routes()` mounts them."""

    def __init__(
        self, settings: Settings, service: Service, runner: ScheduleRunner, paths: Paths
    ) -> None:
        self.settings = settings
        self.service = service
        self.runner = runner
        self.paths = paths

    def routes(self) -> list[Route]:
        task = "/api/projects/{project}/tasks/{task}"
        return [
            Route("/api/schedules", self.schedules),
            Route("/api/agents", self.agents),
            Route("/api/fleet", self.fleet),
            Route("/api/fleet/unpause", self.unpause, methods=["POST"]),
            Route("/api/fleet/hold", self.hold, methods=["POST"]),
            Route("/api/fleet/release", self.release, methods=["POST"]),
            Route("/api/stop-all", self.stop_all, methods=["POST"]),
            Route("/api/schedules/{name}/run", self.run_schedule, methods=["POST"]),
            Route("/api/gc", self.gc, methods=["POST"]),
            Route("/api/projects/{project}/tasks", self.start, methods=["POST"]),
            Route(task, self.delete, methods=["DELETE"]),
            Route(f"{task}/stop", self.stop, methods=["POST"]),
            Route(f"{task}/resume", self.resume, methods=["POST"]),
            Route(f"{task}/merge", self.merge, methods=["POST"]),
            Route(f"{task}/rebase", self.rebase, methods=["POST"]),
            Route(f"{task}/paste", self.paste_reply, methods=["POST"]),
        ]

    async def fleet(self, request: Request) -> Response:
        """The fleet at a glance: counts, the queue in order, today's spend against each daily
        budget, and the tasks that need a person (the page's first view)."""
        found = await run_in_threadpool(self.service.fleet, grant_of(request).projects)
        return JSONResponse(found.to_dict())

    async def unpause(self, request: Request) -> Response:
        """`{"agent": NAME}`: lift the pause a provider's limit put the agent in, across the
        runs root (so not for a token limited to some projects); `lifted` says the pause in
        words, null when the agent was not paused."""
        body = await self._body(request)
        agent = body.get("agent")
        if not isinstance(agent, str) or not agent.strip():
            raise UsageError(
                f'agent {shown(agent)} is not an agent\'s name; send {{"agent": NAME}}'
            )
        if grant_of(request).projects is not None:
            raise HTTPException(403, "a pause holds across the runs root; this token reaches only "
                                "some projects")  # fmt: skip
        lifted = await run_in_threadpool(self.service.unpause, agent)
        return JSONResponse({"agent": agent, "lifted": lifted})

    async def hold(self, request: Request) -> Response:
        """Hold the whole queue: no queued task starts until released, the loops that run go
        on. It holds every project's starts, so only a token that reaches every project may;
        `hold` says the hold in force, `made` whether this request made it."""
        await self._body(request)
        self._whole_root(request, "a hold holds every project's queue")
        held, made = await run_in_threadpool(self.service.hold_queue, "the API")
        return JSONResponse({"hold": {**held.to_json(), "words": held.words()}, "made": made})

    async def release(self, request: Request) -> Response:
        """Release the queue a hold held; `released` says the hold in words, null when the
        queue was not held."""
        await self._body(request)
        self._whole_root(request, "a hold holds every project's queue")
        released = await run_in_threadpool(self.service.release_queue)
        return JSONResponse({"released": released.words(past=True) if released else None})

    async def stop_all(self, request: Request) -> Response:
        """`{"project": P?}`: stop every loop (of P) and take every task (of P) out of the
        queue, the queue held meanwhile; a token limited to projects stops only theirs."""
        body = await self._body(request)
        grant, project = grant_of(request), body.get("project")
        if project is not None:
            if not isinstance(project, str):
                raise UsageError(f"project {shown(project)} is not a project id; send "
                                 '{"project": P} or nothing')  # fmt: skip
            project = validate_id("project", project)
            grant.reach(project)
        done = await run_in_threadpool(
            self.service.stop_everything, STOP_WAIT, project, grant.projects
        )
        return JSONResponse(done.to_dict())

    def _whole_root(self, request: Request, why: str) -> None:
        if grant_of(request).projects is not None:
            raise HTTPException(403, f"{why}; this token reaches only some projects, not every "
                                "project")  # fmt: skip

    async def _body(self, request: Request, limit: int = MAX_BODY) -> dict[str, Any]:
        """The JSON object a same-origin write sends; a body over `limit` bytes is a 413."""
        refusal = cross_site_write(request)
        if refusal is not None:
            raise HTTPException(403, refusal)
        try:
            body = json.loads(await bounded_body(request, limit))
        except (ValueError, RecursionError) as exc:  # RecursionError: nesting thousands deep
            raise HTTPException(400, "the body is not valid JSON (or nests too deeply)") from exc
        if not isinstance(body, dict):
            raise HTTPException(400, "the body must be a JSON object")
        return body

    async def _start(self, request: StartRequest) -> Response:
        try:
            started = await run_in_threadpool(self.service.start, request)
        except AlreadyCompletedError as exc:
            raise AlreadyCompletedError(f'{exc} (send "again": true)') from exc
        body = bodies.started(request, started)
        return JSONResponse(body, status_code=202)

    async def start(self, request: Request) -> Response:
        body = await self._body(request)
        given = body.get("task_id")
        if given is not None and not isinstance(given, str):
            raise UsageError(f"task_id {shown(given)} is not a task's id; give one such as "
                             "fix-login, or leave it out for a new one")  # fmt: skip
        task = self.paths.task(request, must_exist=False, task_id=given or new_task_id())
        start = bodies.start_request(
            body, task, self.settings.workdir, grant_of(request), self.settings.workspaces
        )
        return await self._start(start)

    async def resume(self, request: Request) -> Response:
        body = await self._body(request)
        task = self.paths.task(request)
        start = bodies.resume_request(
            body, task, self.settings.workdir, grant_of(request), self.settings.workspaces
        )
        kept = await run_in_threadpool(self.service.steer, start)
        if kept is not None:  # its loop runs: the message waits for its next attempt
            return JSONResponse(bodies.steered(start, kept), status_code=202)
        return await self._start(start)

    async def agents(self, request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(self.service.agent_choices))

    async def delete(self, request: Request) -> Response:
        """Remove a finished task's folder with all its runs; 409 while its loop runs."""
        await self._body(request)
        task = self.paths.task(request)
        _, freed = await run_in_threadpool(self.service.delete, task)
        return JSONResponse({"deleted": task.label, "freed_bytes": freed})

    async def schedules(self, request: Request) -> Response:
        reaches = grant_of(request).reaches
        rows = await run_in_threadpool(self.runner.describe)
        return JSONResponse([row for row in rows if reaches(row["project"])])

    async def run_schedule(self, request: Request) -> Response:
        """Fire a schedule now, as the config says: its body is `{}` (a firing takes no option
        a token could change it with, the sandbox least of all)."""
        for key in await self._body(request):
            raise UsageError(
                f"{key[:80]!r} is not something a schedule's firing takes: it runs as the config "
                "says; send {}"
            )
        name = request.path_params["name"]
        if name not in self.settings.schedules:
            raise HTTPException(404, f"no schedule {name!r}")
        grant_of(request).reach(self.settings.schedules[name].project)
        firing = await run_in_threadpool(self.runner.fire_now, name)
        body = {"schedule": name, "project_id": firing.schedule.project, "task_id": firing.task_id}
        return JSONResponse(body, status_code=202)

    async def gc(self, request: Request) -> Response:
        """`{"older_than": "30d"?, "keep_last": N?, "keep_failed": bool?, "project": P?,
        "dry_run": bool?}`: remove old runs of tasks that are not running, as `run-agent gc`
        does (admin scope; a token limited to projects names one of them)."""
        body = await self._body(request)
        grant, project = grant_of(request), body.get("project")
        if project is not None:
            project = validate_id("project", str(project))
            grant.reach(project)
        elif grant.projects is not None:
            raise HTTPException(403, "this token reaches only some projects; name one: project")
        older_than, keep_last = body.get("older_than"), body.get("keep_last")
        if older_than is not None and not isinstance(older_than, str):
            raise UsageError(f"older_than {shown(older_than)} is not a duration such as 30d")
        if keep_last is not None and (
            isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0
        ):
            raise UsageError(
                f"keep_last {shown(keep_last)} is not a whole number of runs (0 or more)"
            )
        keep = cleanup.Retention.asked(older_than, keep_last, body.get("keep_failed") is True)

        def collect() -> dict[str, Any]:
            plan = cleanup.gc_plan(self.settings.root, keep, datetime.now(UTC), project)
            doomed = [{"run": d.label, "bytes": d.size} for d in plan.doomed]
            kept = [{"run": k.label, "why": k.why} for k in plan.kept]
            dry = body.get("dry_run") is True
            freed = 0 if dry else cleanup.carry_out(plan.doomed, self.settings.root)
            return {"dry_run": dry, "removed": doomed, "kept": kept, "freed_bytes": freed}

        return JSONResponse(await run_in_threadpool(collect))

    async def stop(self, request: Request) -> Response:
        await self._body(request)
        task = self.paths.task(request)
        holder = await run_in_threadpool(self.service.stop, task, STOP_WAIT)
        left = isinstance(holder, Waiting)  # taken out of the queue, never started
        return JSONResponse({"stopped": holder is not None, "left_queue": left,
                             "status": listing.view(task).status})  # fmt: skip

    async def merge(self, request: Request) -> Response:
        """`{"push": REMOTE?, "into": BRANCH?, "force": bool?}`: bring the task's worktree
        branch back (Service.merge); 409 on a conflict or changes in the way."""
        body = await self._body(request)
        task = self.paths.task(request)
        given = {}
        for name in ("push", "into"):
            value = body.get(name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise UsageError(f"{name} {shown(value)} is not a name; leave it out, or give one")
            given[name] = value
        force = body.get("force") is True
        said = await run_in_threadpool(
            lambda: self.service.merge(task, push=given["push"], into=given["into"], force=force)
        )
        return JSONResponse({"done": said})

    async def rebase(self, request: Request) -> Response:
        """`{"onto": BRANCH?, "abort": bool?}`: bring the branch the task's worktree work goes
        back into (or BRANCH) into its worktree (Service.rebase); conflicts, or a check that
        fails on the result, resume its loop. 409 while it runs, or on changes in the way."""
        body = await self._body(request)
        task = self.paths.task(request)
        onto = body.get("onto")
        if onto is not None and (not isinstance(onto, str) or not onto.strip()):
            raise UsageError(f"onto {shown(onto)} is not a branch name; leave it out, or give one")
        abort = body.get("abort", False)
        if not isinstance(abort, bool):
            raise UsageError(f"abort {shown(abort)} is not true or false")
        owner = grant_of(request).scope >= Scope.ADMIN
        done = await run_in_threadpool(
            lambda: self.service.rebase(task, onto=onto, abort=abort, owner=owner, sender="api")
        )
        return JSONResponse({**done.to_dict(), "done": done.words(task.label)})

    async def paste_reply(self, request: Request) -> Response:
        """`{"reply": TEXT}`: the chat's answer into the task's paste inbox, where the run reads
        it (as a file saved there by hand would be). 201 with the file's name."""
        body = await self._body(request, MAX_PASTE_BODY)
        task = self.paths.paste_task(request)
        path = await run_in_threadpool(submit_reply, task, body)
        answer = {"project_id": task.project_id, "task_id": task.task_id, "file": path.name}
        return JSONResponse(answer, status_code=201)


def submit_reply(task: TaskPaths, body: dict[str, Any]) -> Path:
    """`{"reply": TEXT}` into the task's paste inbox (the API and the MCP tool alike): a
    UsageError naming what is wrong with it, AlreadyCompletedError (409) once the session is
    complete; the inbox file's path."""
    reply = body.get("reply")
    if "reply" not in body:
        raise UsageError("reply is required: the chat's whole answer, as a string")
    if not isinstance(reply, str):
        raise UsageError(f"reply must be a string, not {bodies.json_type(reply)}")
    try:
        reply.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UsageError(
            f"reply holds {reply[exc.start]!r} at character {exc.start}, which is not text (a "
            "lone surrogate); paste the answer again"
        ) from exc
    try:
        return paste_state.submit(task, reply)
    except UsageError as exc:
        session = paste_state.current(task)
        if session is not None and session.is_complete:  # nothing more is read: 409
            raise AlreadyCompletedError(str(exc)) from exc
        raise
