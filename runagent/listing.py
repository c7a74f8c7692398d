"""Tasks as the fleet sees them: the store's view of each (runagent.store.tasks) with its place
in the queue, when it is queued or blocked. Every listing above the fleet reads tasks here, so
none shows a queued task as a pending one; the queue's code is loaded only where there is one."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runagent.store import runfolder, tasks
from runagent.store.runfolder import TaskPaths
from runagent.store.tasks import QueuePlace, TaskView

if TYPE_CHECKING:
    from runagent.store.index import Covers, Summary


def places(root: Path) -> Mapping[str, QueuePlace]:
    """Every queued or blocked task under `root`, by P/T, with where it stands."""
    if not (root / runfolder.FLEET).is_dir():
        return tasks.NO_QUEUE
    from runagent.fleet import queue

    return queue.places(root)


def view(task: TaskPaths) -> TaskView:
    """The task as it is now, queued or blocked included (its place worked out alone: a look at
    one task reads its record and those ahead of it, not the whole queue)."""
    if not (task.root / runfolder.FLEET).is_dir():
        return tasks.view(task, tasks.NO_QUEUE)
    from runagent.fleet import queue

    return tasks.view(task, queue.Places(task.root))


def all_tasks(root: Path, project_id: str | None = None) -> list[TaskView]:
    """Every task under `root` (or one project's), queued or blocked included, their runs as
    the root's index sums them up (runagent/store/index.py: it costs what is shown, not the
    runs in history)."""
    found = tasks.all_paths(root, project_id)
    queue = places(root)
    covers = f"{project_id}/" if project_id else ""
    runs = summaries(root, found, covers=lambda label: label.startswith(covers)) if found else {}
    return [tasks.view(task, queue, runs) for task in found]


def rows(
    root: Path, project_id: str | None = None, projects: frozenset[str] | None = None
) -> dict[str, str]:
    """Every task's listing row (`TaskView.to_dict`) as JSON text, by P/T in listing order
    (`in_order`), of one project or of `projects` (None: all): what `list --json`, the API,
    the task list's stream and MCP give. A settled task's row comes from the root's index
    while its stamps hold (runagent/store/index.py)."""
    import json

    from runagent.store import index

    if projects is not None:
        found = [task for p in runfolder.project_ids(root) if p in projects
                 for task in tasks.all_paths(root, p)]  # fmt: skip
    else:
        found = tasks.all_paths(root, project_id)
    queue = places(root)
    if not found:
        return {}
    if not index.enabled():
        made = {task.label: json.dumps(tasks.view(task, queue).to_dict()) for task in found}
    else:

        def covers(label: str) -> bool:
            project = label.partition("/")[0]
            return project in projects if projects is not None else project_id in (None, project)

        made = index.for_root(root).rows(found, queue, covers)
    return {label: made[label] for label in sorted(made, key=lambda label: _place(label, queue))}


# A task's status that asks nothing of a fleet's view: no loop, no wait, nothing for a person.
QUIET = frozenset({"completed", "failed", "timed_out", "stopped", "pending"})


def glance(
    root: Path, projects: frozenset[str] | None = None,
    whole: Callable[[str, dict[str, Any]], bool] = lambda label, row: False,
) -> tuple[dict[str, dict[str, Any]], list[TaskView]]:  # fmt: skip
    """Every task's row (of `projects`; None: all), by P/T, and the whole view of those that
    are not quiet (running, waiting, raced, stopped for a person, an operations run's, and
    those `whole` asks for): a fleet's view and a scrape cost one row a task, and a view only
    for what is going on."""
    import json

    from runagent.store import index

    found = {label: json.loads(text) for label, text in rows(root, projects=projects).items()}
    looked = [TaskPaths(root, *label.split("/", 1)) for label, row in found.items()
              if row["status"] not in QUIET or "race" in row or whole(label, row)]  # fmt: skip
    if not looked:
        return found, []
    queue = places(root)
    runs = summaries(root, looked) if index.enabled() else None
    return found, [tasks.view(task, queue, runs) for task in looked]


def summaries(
    root: Path, found: list[TaskPaths], sums: bool = False, covers: Covers | None = None
) -> Mapping[str, Summary]:
    """What the runs of each of `found` add up to, by P/T, from the root's index (`sums`: the
    metrics' figures too; `covers` as for `Index.summaries`); read from the folders where the
    index is turned off."""
    from runagent.store import index

    if not index.enabled():
        return index.Index(root, persist=False).summaries(found, sums) if sums else {}
    return index.for_root(root).summaries(found, sums, covers)


def in_order(views: list[TaskView]) -> list[TaskView]:
    """Tasks as a listing shows them: by project, each project's tasks by name as a person
    counts (q2 before q10), then those that wait, in the order they start (the blocked last)."""
    return sorted(views, key=lambda v: _place(v.label, {v.label: v.queue} if v.queue else {}))


def _place(label: str, places: Mapping[str, QueuePlace]) -> tuple[object, ...]:
    """Where the task `label` (P/T) stands in a listing, `places` as for `tasks.view`."""
    import re

    project, _, name = label.partition("/")
    natural = tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name) if p)
    place = places.get(label)
    waiting = place is not None and place.unreadable is None
    where = (1 + place.blocked, place.ahead) if waiting and place else (0, 0)
    return (project, *where, natural)
