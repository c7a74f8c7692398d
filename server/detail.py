"""A task as a person (or a program) asks about it: its row, prompt, runs, git work, usage, how
its last loop ended, its size and who waits on it; `GET .../tasks/T` and the MCP `task_status`
tool answer with it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from runagent import listing
from runagent.issues import worktree
from runagent.paste.session import Folders as PasteFolders
from runagent.store import cleanup, runfolder, steering, taskfolder, tasks
from runagent.store.runfolder import TaskPaths
from server.tail import file_size, read_at


def of(task: TaskPaths, reaches: Callable[[str], bool] = lambda project: True) -> dict[str, Any]:
    """The task's detail; of the tasks waiting on it, those of projects `reaches` lets
    through (a token's)."""
    places = listing.places(task.root)  # read once for its place and its waiters
    view = tasks.view(task, places)
    row = view.to_dict()
    row["prompt"] = taskfolder.read_task_prompt(task)
    row["runs_list"] = [r.to_dict() for r in tasks.runs(task)]
    # An issue run's (or a ready-marker loop's) git work, as `status --json` shows it.
    row["git"] = worktree.progress(task, view.latest, os.environ)
    total = tasks.usage(task)
    row["usage"] = total.to_dict() if total is not None else None
    row["loop_message"] = None if row["status"] == "running" else loop_message(task)
    row["disk_bytes"] = cleanup.folder_size(task.folder)
    row["paste"] = PasteFolders.of(task).root.is_dir()  # GET .../paste tells more
    # A person's messages to it, each with the run it was handed to (None: waits for the next).
    row["messages"] = [m.to_dict() for m in steering.messages(task)]
    waiting = tasks.waited_on_by(task, places)
    row["waited_on_by"] = [label for label in waiting if reaches(label.partition("/")[0])]
    return row


LOOP_TAIL = 4096  # bytes of supervisor.log read for the loop's last word


def loop_message(task: TaskPaths) -> str | None:
    """How the task's last detached loop ended, in the words it printed last in supervisor.log
    (None when no detached supervisor ran it)."""
    path = task.folder / runfolder.SUPERVISOR_LOG
    fence = task.fence
    size = file_size(fence, path)  # 0 for a link, or a folder leading out of the project
    if not size:
        return None
    latest = task.run_ids()[-1:]
    info = task.run_folder(latest[0]) / runfolder.RUN_INFO if latest else None
    with contextlib.suppress(OSError):
        if info is not None and info.stat().st_mtime > path.stat().st_mtime + 1:
            return None  # the log is older than the last run: a later loop ran in a terminal
    tail = read_at(fence, path, max(0, size - LOOP_TAIL), LOOP_TAIL).decode("utf-8", "replace")
    said = [line for line in tail.splitlines() if line.startswith("run-agent: ")]
    return said[-1].removeprefix("run-agent: ") if said else None
