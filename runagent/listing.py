"""Tasks as the fleet sees them: the store's view of each (runagent.store.tasks) with its place
in the queue, when it is queued or blocked. Every listing above the fleet reads tasks here, so
none shows a queued task as a pending one; the queue's code is loaded only where there is one."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from runagent.store import runfolder, tasks
from runagent.store.runfolder import TaskPaths
from runagent.store.tasks import QueuePlace, TaskView


def places(root: Path) -> Mapping[str, QueuePlace]:
    """Every queued or blocked task under `root`, by P/T, with where it stands."""
    if not (root / runfolder.FLEET).is_dir():
        return tasks.NO_QUEUE
    from runagent.fleet import queue

    return queue.places(root)


def view(task: TaskPaths) -> TaskView:
    """The task as it is now, queued or blocked included."""
    return tasks.view(task, places(task.root))


def all_tasks(root: Path, project_id: str | None = None) -> list[TaskView]:
    """Every task under `root` (or one project's), queued or blocked included."""
    return tasks.all_tasks(root, places(root), project_id)


def in_order(views: list[TaskView]) -> list[TaskView]:
    """Tasks as a listing shows them: by project, each project's tasks by name as a person
    counts (q2 before q10), then those that wait, in the order they start (the blocked last)."""
    import re

    def natural(name: str) -> tuple[tuple[int, int | str], ...]:
        return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name) if p)

    def place(v: TaskView) -> tuple[object, ...]:
        waiting = v.queue is not None and v.queue.unreadable is None
        where = (1 + v.queue.blocked, v.queue.ahead) if waiting and v.queue else (0, 0)
        return (v.paths.project_id, *where, natural(v.paths.task_id))

    return sorted(views, key=place)
