"""The operations runs under a runs root: where their folders are, and what each is doing now
(running, awaiting approval of which operation, or done), as `run-agent ops list` and the API's
run rows show them."""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from runagent.ops.approval import Pending
from runagent.ops.runtime import Runtime
from runagent.store import runfolder, tasks
from runagent.store.lock import live_holder
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import RunStatus


class RunState(enum.StrEnum):
    RUNNING = "running"  # a message is being answered, or its agent-mode run is live
    AWAITING_APPROVAL = "awaiting_approval"  # paused on an operation (`pending` says which)
    DONE = "done"  # nothing under way: it takes the next message at once


def all_runs(root: Path, reaches: Callable[[str], bool] = lambda project: True) -> Iterator[Path]:
    """Every operations run's folder under the runs root (in the projects `reaches` lets
    through), oldest first within a task: as the root's index knows them (a look at a root of
    100,000 runs looks at its operations runs, not at every run folder), else from the
    folders."""
    from runagent.store import index

    if index.enabled():
        found = [task for project in filter(reaches, runfolder.project_ids(root))
                 for task in tasks.all_paths(root, project)]  # fmt: skip
        known = index.for_root(root).summaries(found)
        for task in found:
            for run_id in sorted(known[task.label].operations):
                yield task.run_folder(run_id)
        return
    for project in filter(reaches, runfolder.project_ids(root)):
        bounds = runfolder.fence(root, project)
        for task_id in runfolder.task_ids(root, project):
            task = TaskPaths(root, project, task_id)
            runs = os.fspath(task.runs)  # joined as text: most run folders are not operations'
            for run_id in task.run_ids():  # none that leads out of the project
                if runfolder.is_file_in(bounds, f"{runs}/{run_id}/{runfolder.OPS_SETTINGS}"):
                    yield task.run_folder(run_id)


def ids(folder: Path) -> dict[str, str]:
    return {
        "runId": folder.name,
        "project_id": folder.parent.parent.parent.name,
        "task_id": folder.parent.parent.name,
    }


def state(runtime: Runtime) -> RunState:
    """What the run is doing: a pause wins (it waits for a person, whoever runs it), then a
    live holder of its turn, then a live agent-mode run (which holds the turn only per reply)."""
    if runtime.pending is not None:
        return RunState.AWAITING_APPROVAL
    if live_holder(runtime.paths.ops_lock) is not None:
        return RunState.RUNNING
    info = runfolder.read_run_info(runtime.paths.folder)
    if info is not None and tasks.effective(info, runtime.paths.folder).status is RunStatus.RUNNING:
        return RunState.RUNNING
    return RunState.DONE


def describe(folder: Path) -> dict[str, Any]:
    """The run's row: ids, workspace, policy and sandbox, `state`, and `pending` (the awaited
    operation, or None)."""
    runtime = Runtime.open(folder)
    waiting = runtime.pending
    return {
        **ids(folder),
        **runtime.settings.to_dict(),
        "state": state(runtime).value,
        "pending": approval_row(waiting) if waiting is not None else None,
    }


def approval_row(waiting: Pending) -> dict[str, Any]:
    """What a person answering a pause is shown: the operation, why, the rule, its hash."""
    asked = waiting.events[-1] if waiting.events else {}
    return {
        "operationId": waiting.operation_id,
        "operationType": asked.get("operationType"),
        "reason": asked.get("reason"),
        "details": asked.get("details", {}),
        "timestamp": asked.get("timestamp"),
        "operationHash": waiting.digest,
    }
