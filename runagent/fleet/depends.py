"""Tasks that run after others (`--after P/T`): named at submission, checked there (the tasks
exist, and none would wait for itself), and judged while the task waits: once every one has
completed, it joins the queue; when one fails, is stopped or is deleted, it stays blocked with
that reason and never starts (a `resume` once the other has completed starts it). A task so
blocked needs a person (`need`), which the notifiers tell once for each blocking (`untold`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from runagent import listing
from runagent.errors import UsageError, shown
from runagent.fleet.queue import Fleet, Waiting, order
from runagent.loop import needs
from runagent.loop.needs import Need
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
                f"{where} {shown(value)} is not PROJECT/TASK; name the task to wait for, "
                "e.g. app/build"
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


def refresh_pending(fleet: Fleet) -> None:
    """`refresh` of the records that wait for the tasks they run after, and those alone (under
    the lock): the others' dependencies are judged already."""
    refresh(fleet, fleet.pending())


def need(task: TaskPaths, after: Sequence[str]) -> Need | None:
    """What a person does for a task that a task it runs after will never release (failed,
    stopped, deleted), judged now whether or not the queue has written it down yet; None
    while each may yet complete. Its episode names the blocking: that task and its latest
    run (or `gone`), so a new failure or a deletion is a blocking of its own."""
    for label in after:
        kind, words = state(task.root, label)
        if kind != "fail":
            continue
        project, _, name = label.partition("/")
        other = TaskPaths(task.root, project, name)
        gone = not other.folder.is_dir()
        latest = None if gone else listing.view(other).latest
        episode = f"{label}: {latest.run_id if latest is not None else 'gone'}"
        return needs.blocked(task, label, words, gone=gone, episode=episode)
    return None


def untold(root: Path, *, on: str | None = None, label: str | None = None) -> list[Need]:
    """The blockings no notifier has told yet, judged now under the queue's lock: of the tasks
    that run after task `on`, or of task `label` (each, given). Each is marked told in its
    record as it is returned, so whichever process finds it first tells it, and once."""
    fleet = Fleet(root)
    if not fleet.exists():
        return []
    found: list[Need] = []
    with fleet.locked():
        fleet.tidy()
        refresh_pending(fleet)
        for waiting in fleet.index().blocked():
            if (on is not None and on not in waiting.after) or label not in (None, waiting.label):
                continue
            said = need(TaskPaths(root, waiting.project, waiting.task), waiting.after)
            if said is None or said.episode == waiting.told:
                continue
            fleet.put(replace(waiting, told=said.episode))
            found.append(said)
    return found
