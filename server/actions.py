"""What the server's API changes: starting, resuming, stopping and deleting tasks, firing a
schedule now, and handing a paste run the chat's reply. Every write is same-origin JSON, checked
before anything is created."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from runagent import cleanup, control, taskfolder, tasks
from runagent.context import new_task_id, validate_prompt
from runagent.errors import AlreadyCompletedError, RunAgentError, UsageError
from runagent.overrides import LoopOverrides
from runagent.paste import state as paste_state
from runagent.runfolder import TaskPaths
from server.security import bounded_body, cross_site_write

if TYPE_CHECKING:
    from server.app import Settings
    from server.schedules import ScheduleRunner

STOP_WAIT = 30.0
# Bytes of a paste reply's request body: the reply's own limit, with room for JSON's escapes.
MAX_PASTE_BODY = 2 * paste_state.MAX_REPLY + 64 * 1024


class Actions:
    """The write handlers of the API; `Api` gives them `task_paths` and its settings."""

    settings: Settings
    root: Path
    runner: ScheduleRunner

    def task_paths(
        self, request: Request, must_exist: bool = True, task_id: str | None = None
    ) -> TaskPaths:
        raise NotImplementedError  # Api's

    def paste_task(self, request: Request) -> TaskPaths:
        raise NotImplementedError  # Api's

    # Actions -------------------------------------------------------------------------------------

    async def _body(self, request: Request, limit: int | None = None) -> dict[str, Any]:
        """The JSON object a same-origin write sends; a body over `limit` bytes is a 413."""
        refusal = cross_site_write(request)
        if refusal is not None:
            raise HTTPException(403, refusal)
        try:
            if limit is None:
                body = await request.json()
            else:
                body = json.loads(await bounded_body(request, limit))
        except (ValueError, RecursionError) as exc:  # RecursionError: nesting thousands deep
            raise HTTPException(400, "the body is not valid JSON (or nests too deeply)") from exc
        if not isinstance(body, dict):
            raise HTTPException(400, "the body must be a JSON object")
        return body

    async def _start(
        self, task: TaskPaths, command: str, overrides: LoopOverrides, body: dict[str, Any]
    ) -> Response:
        again = body.get("again") is True
        try:
            await run_in_threadpool(lambda: tasks.refuse_completed(tasks.view(task), again))
        except AlreadyCompletedError as exc:
            raise AlreadyCompletedError(f'{exc} (send "again": true)') from exc
        started = await run_in_threadpool(
            lambda: control.start_detached(
                task,
                command,
                overrides,
                config_path=self.settings.config_path,
                cwd=self.settings.workdir,
                env=self.settings.env if self.settings.env is not None else dict(os.environ),
                again=again,
                executor=self.settings.executor,
            )
        )
        body = {
            "project_id": task.project_id,
            "task_id": task.task_id,
            "supervisor_pid": started.pid,
            "host": started.holder.host if started.holder is not None else None,
        }
        return JSONResponse(body, status_code=202)

    def _overrides(self, body: dict[str, Any]) -> LoopOverrides:
        """The loop settings the body changes (the form's empty fields change nothing); a
        working folder that is not one is refused here, before any task is created."""
        values = {**body, "working_dir": body.get("cwd")}
        overrides = LoopOverrides.parse(
            values, where=lambda name: "cwd" if name == "working_dir" else name,
            blank_is_unset=True,
        )  # fmt: skip
        if overrides.working_dir is not None:
            folder = self.settings.workdir / overrides.working_dir.expanduser()
            if not folder.is_dir():
                raise UsageError(
                    f"cwd {str(overrides.working_dir)!r} is not a folder on this machine"
                )
        return overrides

    async def start(self, request: Request) -> Response:
        body = await self._body(request)
        task = self.task_paths(
            request, must_exist=False, task_id=str(body.get("task_id") or "") or new_task_id()
        )
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise HTTPException(400, "prompt is required: say what the agent should do")
        validate_prompt(prompt, "the prompt")  # a UsageError: 400, naming what is wrong
        overrides = self._overrides(body)
        if self.settings.check_start is not None:
            await run_in_threadpool(self.settings.check_start, task, overrides)
        created = not task.folder.exists()
        taskfolder.claim_task_prompt(task, prompt, "resume it, or start a new task")
        try:
            return await self._start(task, "run", overrides, body)
        except RunAgentError:
            if created:  # a refused start leaves no task behind
                taskfolder.discard_new_task(task)
            raise

    async def resume(self, request: Request) -> Response:
        body = await self._body(request)
        task = self.task_paths(request)
        overrides = self._overrides(body)
        if self.settings.check_start is not None:
            await run_in_threadpool(self.settings.check_start, task, overrides)
        return await self._start(task, "resume", overrides, body)

    async def agents(self, request: Request) -> Response:
        if self.settings.agents is None:
            return JSONResponse({"default": None, "agents": []})
        return JSONResponse(await run_in_threadpool(self.settings.agents))

    async def delete(self, request: Request) -> Response:
        """Remove a finished task's folder with all its runs; 409 while its loop runs."""
        await self._body(request)
        task = self.task_paths(request)

        def remove() -> dict[str, Any]:
            plan = cleanup.delete_plan(task)  # AlreadyRunningError (409) while it runs
            return {"deleted": task.label, "freed_bytes": cleanup.carry_out([plan], self.root)}

        return JSONResponse(await run_in_threadpool(remove))

    async def schedules(self, request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(self.runner.describe))

    async def run_schedule(self, request: Request) -> Response:
        await self._body(request)
        name = request.path_params["name"]
        if name not in self.settings.schedules:
            raise HTTPException(404, f"no schedule {name!r}")
        firing = await run_in_threadpool(self.runner.fire_now, name)
        body = {"schedule": name, "project_id": firing.schedule.project, "task_id": firing.task_id}
        return JSONResponse(body, status_code=202)

    async def stop(self, request: Request) -> Response:
        await self._body(request)
        task = self.task_paths(request)
        holder = await run_in_threadpool(control.stop, task, STOP_WAIT, self.settings.executor)
        return JSONResponse({"stopped": holder is not None, "status": tasks.view(task).status})

    async def paste_reply(self, request: Request) -> Response:
        """`{"reply": TEXT}`: the chat's answer into the task's paste inbox, where the run reads
        it (as a file saved there by hand would be). 201 with the file's name."""
        body = await self._body(request, MAX_PASTE_BODY)
        task = self.paste_task(request)
        reply = body.get("reply")
        if "reply" not in body:
            raise HTTPException(400, "reply is required: the chat's whole answer, as a string")
        if not isinstance(reply, str):
            raise HTTPException(400, f"reply must be a string, not {_json_type(reply)}")
        try:
            reply.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise HTTPException(
                400, f"reply holds {reply[exc.start]!r} at character {exc.start}, which is not "
                "text (a lone surrogate); paste the answer again",
            ) from exc  # fmt: skip

        def submit() -> Path:
            try:
                return paste_state.submit(task, reply)
            except UsageError as exc:
                session = paste_state.current(task)
                if session is not None and session.is_complete:  # nothing more is read: 409
                    raise AlreadyCompletedError(str(exc)) from exc
                raise

        path = await run_in_threadpool(submit)
        answer = {"project_id": task.project_id, "task_id": task.task_id, "file": path.name}
        return JSONResponse(answer, status_code=201)


def _json_type(value: object) -> str:
    """What JSON calls the type of a decoded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "an array" if isinstance(value, list) else "an object"
