"""Removing what a runs root no longer needs: old runs of finished tasks (`gc`) and whole tasks
(`delete`), never anything of a task whose loop is running, and never outside the root.

What would go is computed first, as a plan; `--dry-run` prints the plan, and a real run removes
exactly the plan, so the two can never disagree.
"""

from __future__ import annotations

import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from runagent import runfolder, tasks
from runagent.errors import AlreadyRunningError
from runagent.lock import already_running, live_holder
from runagent.runfolder import TaskPaths
from runagent.runinfo import RunStatus

KEPT_WHEN_FAILED = frozenset({RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.LOST})


@dataclass(frozen=True)
class Retention:
    """Which runs `gc` keeps: those newer than `older_than`, the task's last `keep_last`, and
    with `keep_failed` every run that did not complete."""

    older_than: timedelta | None = None
    keep_last: int = 0
    keep_failed: bool = False


@dataclass(frozen=True)
class Doomed:
    """One folder a plan removes, and its size in bytes."""

    path: Path
    label: str  # project/task or project/task/run_id
    size: int
    task: TaskPaths


def folder_size(path: Path) -> int:
    """Bytes of the files under `path` (links not followed), each file once: a large run's
    output.md is a hard link to its stdout, the same bytes on disk under two names."""
    total = 0
    seen: set[tuple[int, int]] = set()
    for item in path.rglob("*"):
        try:
            st = item.lstat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def gc_plan(root: Path, keep: Retention, now: datetime, project: str | None = None) -> list[Doomed]:
    """The run folders `gc` would remove under `root` (or one project), oldest first."""
    plan: list[Doomed] = []
    for view in tasks.all_tasks(root, project):
        if view.supervisor is not None:  # a running task is never touched
            continue
        plan += _runs_to_remove(view.paths, keep, now)
    return plan


def _runs_to_remove(task: TaskPaths, keep: Retention, now: datetime) -> Iterable[Doomed]:
    ids = task.run_ids()
    kept = set(ids[-keep.keep_last :]) if keep.keep_last else set()
    for run_id in ids:
        if run_id in kept:
            continue
        folder = task.run_folder(run_id)
        info = runfolder.read_run_info(folder)
        if info is not None and keep.keep_failed and info.status in KEPT_WHEN_FAILED:
            continue
        if keep.older_than is not None and now - _ended(folder, info) < keep.older_than:
            continue
        yield Doomed(folder, f"{task.label}/{run_id}", folder_size(folder), task)


def _ended(folder: Path, info: object) -> datetime:
    """When the run ended (run-info's end_time, else the folder's last change)."""
    end = getattr(info, "end_time", None)
    if isinstance(end, str):
        try:
            return datetime.fromisoformat(end)
        except ValueError:
            pass
    return datetime.fromtimestamp(folder.stat().st_mtime, UTC)


def delete_plan(task: TaskPaths) -> Doomed:
    """The task's folder, if its loop is not running; AlreadyRunningError otherwise."""
    runfolder.confine(task)
    holder = live_holder(task.lock)
    if holder is not None:
        raise AlreadyRunningError(
            already_running(task.label, holder) + "; stop it first (`run-agent stop`)"
        )
    return Doomed(task.folder, task.label, folder_size(task.folder), task)


def carry_out(plan: Iterable[Doomed], root: Path) -> int:
    """Remove every folder of `plan` that still stays inside `root` and whose task has not
    started meanwhile; the bytes freed."""
    freed = 0
    for doomed in plan:
        if not runfolder.within(root, doomed.path) or doomed.path.is_symlink():
            continue  # never through a link, never outside the root
        if live_holder(doomed.task.lock) is not None:
            continue  # started since the plan was made
        shutil.rmtree(doomed.path, ignore_errors=True)
        freed += doomed.size
    return freed
