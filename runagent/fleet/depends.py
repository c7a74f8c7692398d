"""Tasks that run after others (`--after P/T`): named at submission, checked there (the tasks
exist, and none would wait for itself), and judged while the task waits: once every one has
completed, it joins the queue; when one fails, is stopped or is deleted, it stays blocked with
that reason and never starts (a `resume` once the other has completed starts it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from runagent import listing
from runagent.errors import UsageError
from runagent.fleet.queue import Fleet, Waiting, order
from runagent.store.ids import validate_id
from runagent.store.runfolder import TaskPaths
from runagent.store.tasks import TaskStatus

# What a task that will never complete by itself reads as, in "blocked: waits for P/T, which ...".
ENDED = {
    TaskStatus.FAILED: "failed",
    TaskStatus.OVER_BUDGET: "was stopped by its budget",
    TaskStatus.STUCK: "was stopped as stuck",
    TaskStatus.TIMED_OUT: "timed out",
    TaskStatus.STOPPED: "was stopped",
    TaskStatus.LOST: "lost its supervisor",
    TaskStatus.UNREADABLE: "cannot be read",
}


def parse_after(values: Sequence[str], task: TaskPaths, where: str = "--after") -> tuple[str, ...]:
    """The tasks named as P/T, each existing and not the task itself; UsageError (exit 2)
    naming the value otherwise."""
    found: list[str] = []
    for value in values:
        project, slash, name = str(value).partition("/")
        if not slash or not project or not name:
            raise UsageError(
                f"{where} {value!r} is not PROJECT/TASK; name the task to wait for, e.g. app/build"
            )
        label = f"{validate_id('project', project)}/{validate_id('task', name)}"
        if label == task.label:
            raise UsageError(f"{where} {value!r} is the task itself; a task cannot wait for itself")
        if not TaskPaths(task.root, project, name).folder.is_dir():
            raise UsageError(
                f"{where} {value!r}: no such task under {task.root}; start it first "
                "(see `run-agent list`)"
            )
        if label not in found:
            found.append(label)
    return tuple(found)


def refuse_cycle(records: Sequence[Waiting], label: str, after: Sequence[str]) -> None:
    """UsageError when `label` waiting for `after` would make a task wait for itself."""
    edges = {w.label: tuple(w.after) for w in records}
    edges[label] = tuple(after)

    def reaches(start: str, path: list[str]) -> list[str] | None:
        for nxt in edges.get(start, ()):
            if nxt == label:
                return [*path, nxt]
            if nxt not in path:
                found = reaches(nxt, [*path, nxt])
                if found:
                    return found
        return None

    cycle = reaches(label, [label])
    if cycle:
        raise UsageError(
            f"--after {cycle[1]}: {' -> '.join(cycle)} would wait for itself; drop one of them"
        )


def state(root: Path, label: str) -> tuple[str, str]:
    """('done' | 'wait' | 'fail', in words) for the task `label` another waits for."""
    project, _, name = label.partition("/")
    task = TaskPaths(root, project, name)
    if not task.folder.is_dir():
        return "fail", f"{label}, which was deleted"
    view = listing.view(task)
    status = view.status
    if view.queue is not None and view.queue.unreadable is not None:
        return "wait", label  # it waits for a person, who may yet start it (resume)
    if status is TaskStatus.COMPLETED:
        return "done", ""
    if status in ENDED:
        return "fail", f"{label}, which {ENDED[status]}"
    return "wait", label


def judge(root: Path, after: Sequence[str]) -> tuple[str, str]:
    """('done' | 'wait' | 'fail', what it waits for) over all of `after`."""
    waits = []
    for label in after:
        kind, words = state(root, label)
        if kind == "fail":
            return "fail", words
        if kind == "wait":
            waits.append(words)
    return ("wait", ", ".join(waits)) if waits else ("done", "")


def refresh(fleet: Fleet, records: Sequence[Waiting]) -> list[Waiting]:
    """The records with their dependencies judged again (under the lock): one whose tasks have
    all completed joins the queue (at its end), one whose task failed is blocked."""
    out = []
    for waiting in records:
        if not waiting.joined and waiting.blocked is None and waiting.unreadable is None:
            kind, words = judge(fleet.root, waiting.after)
            if kind == "fail":
                waiting = replace(waiting, blocked=f"waits for {words}")
                fleet.put(waiting)
            elif kind == "done":
                waiting = fleet.join(waiting)
                fleet.put(waiting)
        out.append(waiting)
    return order(out)
