"""Which task a request names, kept inside its project: a bad id, a missing task or a path that
leads out of the project (into another, or out of the root) is a 404, for the read API, the
actions and the MCP tools alike (runfolder.fence: the one rule)."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from starlette.requests import Request

from runagent.errors import NotFoundError, OutsideRootError, UsageError
from runagent.loop.context import is_run_id, validate_id
from runagent.paste.session import Folders as PasteFolders
from runagent.store import runfolder
from runagent.store.runfolder import TaskPaths


class Paths:
    """The tasks of one runs root, as requests name them."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def task(
        self, request: Request, must_exist: bool = True, task_id: str | None = None
    ) -> TaskPaths:
        """The task a request names (in its path, else `task_id`); 404 for a bad id, a missing
        task, or a path out of the root."""
        return self.named(
            request.path_params["project"], task_id or request.path_params["task"], must_exist
        )

    def named(self, project: str, task_id: str, must_exist: bool = True) -> TaskPaths:
        """The task `project`/`task_id` (as a request or a tool call names it); NotFoundError
        (404) for a bad id, a missing task, or a path out of the root."""
        try:
            project = validate_id("project", project)
            task_id = validate_id("task", task_id)
        except UsageError as exc:
            raise NotFoundError(str(exc)) from exc
        task = TaskPaths(self.root, project, task_id)
        try:
            runfolder.confine(task)
        except OutsideRootError as exc:
            raise NotFoundError(f"task {project}/{task_id} not found") from exc
        if must_exist and not task.folder.is_dir():
            raise NotFoundError(f"task {project}/{task_id} not found")
        return task

    def paste_task(self, request: Request) -> TaskPaths:
        return self.paste_named(request.path_params["project"], request.path_params["task"])

    def paste_named(self, project: str, task_id: str) -> TaskPaths:
        """The task named, if its paste folders (those that exist) stay inside its project; a
        link out is a task without a paste session (404)."""
        task = self.named(project, task_id)
        folders = PasteFolders.of(task)
        bounds = task.fence
        for path in (folders.root, folders.outbox, folders.inbox, folders.sessions):
            if os.path.lexists(path) and not runfolder.holds(bounds, path):
                raise NotFoundError(f"task {task.label} has no paste session")
        return task

    def run_folder(self, task: TaskPaths, run_id: str) -> Path:
        """The folder of the task's run `run_id`, if it is one inside its project; else
        NotFoundError (404). What is read in it is read while it still is (`runfolder.open_in`)."""
        folder = task.run_folder(run_id)
        found = runfolder.stat_in(task.fence, folder) if is_run_id(run_id) else None
        if found is None or not stat.S_ISDIR(found.st_mode):
            raise NotFoundError(f"run {run_id[:80]!r} of task {task.label} not found")
        return folder

    def run_file(self, folder: Path, name: str, names: Sequence[str]) -> Path:
        """The run file `name` (one of `names`) of a run's folder, if it does not lead out of
        its project; else NotFoundError (404)."""
        if name not in names:
            raise NotFoundError(f"no file {str(name)[:80]!r}; one of: {', '.join(names)}")
        path = folder / runfolder.RUN_FILES[name]
        if os.path.lexists(path) and not runfolder.holds(runfolder.RunPaths(folder).fence, path):
            raise NotFoundError(f"no file {name!r} in run {folder.name}")
        return path
