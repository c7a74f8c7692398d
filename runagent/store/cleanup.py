"""Removing what a runs root no longer needs: old runs of finished tasks (`gc`) and whole tasks
(`delete`), never anything of a task whose loop is running, never a run whose process is alive
or whose run-info.yaml cannot be read (unless forced), and never outside the root.

What would go is computed first, as a plan; `--dry-run` prints the plan, and a real run removes
exactly the plan, so the two can never disagree. What the removed runs counted stays in
/metrics' counters (runagent/store/removed.py).
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from runagent.duration import parse_duration
from runagent.errors import AlreadyRunningError, UsageError
from runagent.record import record
from runagent.store import removed, runfolder, tasks
from runagent.store.lock import already_running, live_holder
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import RunInfo, RunStatus

KEPT_WHEN_FAILED = frozenset({RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.LOST})


@record
class Retention:
    """Which runs `gc` keeps: those newer than `older_than`, the task's last `keep_last`, and
    with `keep_failed` every run that did not complete."""

    older_than: timedelta | None = None
    keep_last: int = 0
    keep_failed: bool = False

    @classmethod
    def asked(
        cls, older_than: str | None, keep_last: int | None, keep_failed: bool = False,
        flag: Callable[[str], str] = lambda name: name,
    ) -> Retention:  # fmt: skip
        """What a gc request keeps, refused (UsageError) when it says too little to be safe:
        gc never removes every run by default. `flag` spells an option's name as the asker
        gave it (`--older-than`, `older_than`)."""
        age, last = flag("older_than"), flag("keep_last")
        if older_than is None and keep_last is None:
            raise UsageError(
                f"say what to keep: {age} DURATION and/or {last} N (gc never removes every run "
                "by default)"
            )
        if older_than is None and keep_last == 0:
            raise UsageError(
                f"{last} 0 alone keeps no run: it would remove every run of every task that is "
                f"not running; add {age} DURATION, or keep more ({last} 1)"
            )
        seconds = parse_duration(older_than, age) if older_than is not None else None
        return cls(timedelta(seconds=seconds) if seconds else None, keep_last or 0, keep_failed)


@record
class Doomed:
    """One folder a plan removes, and its size in bytes."""

    path: Path
    label: str  # project/task or project/task/run_id
    size: int
    task: TaskPaths


_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def folder_size(path: Path) -> int:
    """Bytes of the files under `path` (links not followed), each file once: a large run's
    output.md is a hard link to its stdout, the same bytes on disk under two names. Walked by
    descriptors without recursion, so a chain of folders an agent made deeper than Python
    recurses, or than a path can name, is counted too."""
    total = 0
    seen: set[tuple[int, int]] = set()
    for _, _, st in _walk(path):
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total


def disarm_tree(path: Path) -> int:
    """Remove what lies under `path` that is neither a regular file nor a folder (a link, a
    FIFO, a socket, a device): in a git folder an agent wrote, git on the host would follow it
    or wait on it for ever. How many were removed."""
    removed = 0
    for fd, name, st in _walk(path):
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            try:
                os.unlink(name, dir_fd=fd)
                removed += 1
            except OSError:
                continue
    return removed


def _walk(path: Path) -> Iterator[tuple[int, str, os.stat_result]]:
    """(folder's descriptor, name, lstat) of everything under `path`, links not followed, by
    descriptors and without recursion (however deep the folders go)."""
    try:
        pending = [os.open(path, _FOLDER)]
    except OSError:
        return
    try:
        while pending:
            fd = pending.pop()
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        try:
                            st = entry.stat(follow_symlinks=False)
                            if stat.S_ISDIR(st.st_mode):
                                pending.append(os.open(entry.name, _FOLDER, dir_fd=fd))
                        except OSError:
                            continue
                        yield fd, entry.name, st
            finally:
                os.close(fd)
    finally:
        for fd in pending:
            os.close(fd)


def remove_tree(path: Path) -> None:
    """Remove the folder `path` and all under it, links not followed, however deep (a chain of
    folders an agent made breaks shutil.rmtree's recursion): `rm -rf`, which walks by
    descriptors; shutil.rmtree where it cannot be run."""
    try:
        argv = ["rm", "-rf", "--one-file-system", "--", str(path)]
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, check=False)
    except OSError:
        done = None
    if done is None or (done.returncode != 0 and os.path.lexists(path)):
        shutil.rmtree(path, ignore_errors=True)


@record
class Kept:
    """A run folder cleanup keeps whatever the rules say, and why."""

    label: str
    why: str


@record
class GcPlan:
    """What `gc` removes, and the runs it keeps although old enough (to say so)."""

    doomed: list[Doomed]
    kept: list[Kept]


def gc_plan(root: Path, keep: Retention, now: datetime, project: str | None = None) -> GcPlan:
    """The run folders `gc` would remove under `root` (or one project), oldest first."""
    plan = GcPlan([], [])
    for view in tasks.all_tasks(root, tasks.NO_QUEUE, project):
        if view.supervisor is not None:  # a running task is never touched
            continue
        _plan_runs(plan, view.paths, keep, now)
    return plan


def _plan_runs(plan: GcPlan, task: TaskPaths, keep: Retention, now: datetime) -> None:
    ids = task.run_ids()
    kept = set(ids[-keep.keep_last :]) if keep.keep_last else set()
    for run_id in ids:
        if run_id in kept:
            continue
        folder = task.run_folder(run_id)
        info = runfolder.read_run_record(folder)
        if keep.older_than is not None and now - _ended(folder, info) < keep.older_than:
            continue
        label = f"{task.label}/{run_id}"
        why = untouchable(info)
        if why is not None:
            plan.kept.append(Kept(label, why))
            continue
        assert info is not None
        if keep.keep_failed and info.status in KEPT_WHEN_FAILED:
            continue
        plan.doomed.append(Doomed(folder, label, folder_size(folder), task))


def untouchable(info: RunInfo | None) -> str | None:
    """Why cleanup must not remove a run without being forced: its record cannot be read (it
    may be anyone's, even a live one), or its process is alive; None if it may go."""
    if info is None:
        return f"it has no {runfolder.RUN_INFO}"
    if info.status is RunStatus.UNREADABLE:
        return info.message or f"its {runfolder.RUN_INFO} cannot be read"
    if tasks.process_alive(info):
        return f"its process is alive (pid {info.supervisor_pid or info.pid})"
    return None


def _ended(folder: Path, info: object) -> datetime:
    """When the run ended (run-info's end_time, else the folder's last change)."""
    end = getattr(info, "end_time", None)
    if isinstance(end, str):
        try:
            return datetime.fromisoformat(end)
        except ValueError:
            pass
    return datetime.fromtimestamp(folder.stat().st_mtime, UTC)


def delete_plan(task: TaskPaths, force: bool = False) -> Doomed:
    """The task's folder, if its loop is not running (AlreadyRunningError otherwise), and,
    unless `force`, no run of it is alive or unreadable (AlreadyRunningError, UsageError)."""
    runfolder.confine(task)
    holder = live_holder(task.lock)
    if holder is not None:
        raise AlreadyRunningError(
            already_running(task.label, holder) + "; stop it first (`run-agent stop`)"
        )
    for run_id in [] if force else task.run_ids():
        info = runfolder.read_run_record(task.run_folder(run_id))
        why = untouchable(info)
        if why is None:
            continue
        what = f"run {task.label}/{run_id} is kept: {why}"
        if info is not None and tasks.process_alive(info):
            raise AlreadyRunningError(f"{what}; stop it first, or delete with --force")
        raise UsageError(f"{what}; look at it, or delete the task with --force")
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
        whole = doomed.path == doomed.task.folder
        run_ids = doomed.task.run_ids() if whole else [doomed.path.name]
        # What its runs counted stays counted: /metrics' counters never fall (store/removed.py).
        removed.remove_counted(
            root, doomed.task, run_ids, functools.partial(remove_tree, doomed.path)
        )
        freed += doomed.size
    return freed
