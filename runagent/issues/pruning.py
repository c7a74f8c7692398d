"""Issue worktrees under a runs root, as `run-agent worktrees` lists them, and pruning those whose
tasks are finished: a dirty one is kept unless forced (its diff saved first), a merged branch
goes, an unmerged one stays."""

from __future__ import annotations

import enum
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from runagent.errors import AlreadyRunningError, RunAgentError, UsageError
from runagent.issues.repository import dirty, git, run_git
from runagent.issues.worktree import (
    LOCK_REASON,
    _stamp,
    default_branch,
    registration,
    repair,
    sync_branch,
    tree_dirs,
)
from runagent.record import record
from runagent.store import cleanup, runfolder, taskfolder, tasks
from runagent.store.lock import TaskLock, live_holder
from runagent.store.runfolder import TaskPaths


@record
class IssueWorktree:
    """An issue task's worktree as `run-agent worktrees` lists it."""

    task: tasks.TaskView
    path: Path
    repo: Path
    branch: str | None
    fork: str | None  # the commit its branch was made from
    registered: bool  # git knows it (else: a folder left behind, or already removed)
    locked: str | None
    ahead: int | None  # commits on its branch since the fork
    dirty: bool | None  # uncommitted changes (None: no folder to look in)

    @property
    def finished(self) -> bool:
        """Its task's loop has ended and completed it."""
        return self.task.status is tasks.TaskStatus.COMPLETED

    def to_dict(self) -> dict[str, object]:
        return {
            "project_id": self.task.paths.project_id,
            "task_id": self.task.paths.task_id,
            "status": self.task.status.value,
            "path": str(self.path),
            "repo": str(self.repo),
            "branch": self.branch,
            "fork": self.fork,
            "registered": self.registered,
            "locked": self.locked,
            "ahead": self.ahead,
            "dirty": self.dirty,
        }


class PruneAction(enum.StrEnum):
    """What pruning did with one worktree."""

    REMOVED = "removed"
    KEPT_RUNNING = "kept_running"  # its task's loop runs
    KEPT_UNFINISHED = "kept_unfinished"  # its task is not completed (without --all)
    KEPT_DIRTY = "kept_dirty"  # uncommitted changes (without --force)
    KEPT_LOCKED = "kept_locked"  # locked by someone else than run-agent


@record
class Pruned:
    worktree: IssueWorktree
    action: PruneAction
    saved_diff: Path | None = None  # the uncommitted work of a worktree removed by force
    branch_deleted: bool = False  # merged into the default branch (else kept)

    def describe(self) -> str:
        label, w = self.worktree.task.label, self.worktree
        if self.action is PruneAction.KEPT_RUNNING:
            return f"{label}: kept, its loop is running"
        if self.action is PruneAction.KEPT_UNFINISHED:
            return f"{label}: kept, the task is {w.task.status.value} (--all prunes it)"
        if self.action is PruneAction.KEPT_LOCKED:
            return f"{label}: kept, locked by someone else ({w.locked}); unlock it to prune it"
        if self.action is PruneAction.KEPT_DIRTY:
            return f"{label}: kept, {w.path} has uncommitted changes (--force saves and removes)"
        saved = f"; uncommitted changes saved to {self.saved_diff}" if self.saved_diff else ""
        kept = (
            f"branch {w.branch} deleted (merged)"
            if self.branch_deleted
            else f"branch {w.branch} kept (not merged)"
        )
        return f"{label}: removed {w.path}; {kept}{saved}"


def issue_worktrees(root: Path, env: Mapping[str, str]) -> list[IssueWorktree]:
    """Every issue task's worktree under the runs root that has not been removed."""
    found = [worktree_of(view, env) for view in tasks.all_tasks(root, tasks.NO_QUEUE)]
    return [w for w in found if w is not None]


def worktree_of(view: tasks.TaskView, env: Mapping[str, str]) -> IssueWorktree | None:
    """The task's worktree, if it has one that was not removed (a race's task has none of its
    own: its record names its winner's, which is listed as the winner's)."""
    record = taskfolder.read_worktree_record(view.paths)
    if not record.get("branch") or record.get("removed") or record.get("racer"):
        return None
    path, repo = view.paths.worktree, Path(str(record.get("repo")))
    clone = bool(record.get("clone"))
    try:
        entry = None if clone else registration(repo, path, env)
    except RunAgentError:  # the repository is gone
        entry = None
    known = view.paths.worktree_git.is_dir() if clone else entry is not None
    exists = path.is_dir()
    fork = str(record["fork"]) if record.get("fork") else None
    ahead = dirty_ = None
    if exists and known:
        dirs = tree_dirs(view.paths, env)
        dirty_ = dirty(path, dirs)
        if fork:
            ahead = int(git(path, "rev-list", "--count", f"{fork}..HEAD", env=env, dirs=dirs))
    return IssueWorktree(
        task=view,
        path=path,
        repo=repo,
        branch=str(record.get("branch")) if record.get("branch") else None,
        fork=fork,
        registered=known,
        locked=entry.locked if entry is not None else _held(view.paths) if clone else None,
        ahead=ahead,
        dirty=dirty_,
    )


def remove(task: TaskPaths, env: Mapping[str, str]) -> Pruned | None:
    """Remove the worktree of a task whose loop has ended, whatever its status (a race's loser:
    its uncommitted changes saved into its folder first, its branch kept unless merged); None
    when it has none."""
    w = worktree_of(tasks.view(task, tasks.NO_QUEUE), env)
    return None if w is None else prune(w, env, every=True, force=True)


def prune(worktree: IssueWorktree, env: Mapping[str, str], *, every: bool, force: bool) -> Pruned:
    """Remove one issue worktree if its task is done with it (completed; with `every`, any
    whose loop is not running), never losing work: a dirty one is kept unless `force`, and then
    its diff is saved into the task folder first. Its branch is deleted when merged into the
    default branch, kept otherwise."""
    w = worktree
    if w.task.status is tasks.TaskStatus.RUNNING:
        return Pruned(w, PruneAction.KEPT_RUNNING)
    # Held while pruning, so that no loop of the task starts in a worktree being removed.
    lock = TaskLock(w.task.paths.lock, w.task.label)
    try:
        lock.acquire()
    except AlreadyRunningError:
        return Pruned(w, PruneAction.KEPT_RUNNING)
    try:
        return _prune(w, env, every=every, force=force)
    finally:
        lock.release()


def _prune(w: IssueWorktree, env: Mapping[str, str], *, every: bool, force: bool) -> Pruned:
    if not w.finished and not every:
        return Pruned(w, PruneAction.KEPT_UNFINISHED)
    if w.locked is not None and not w.locked.startswith("run-agent"):
        return Pruned(w, PruneAction.KEPT_LOCKED)
    saved = None
    if w.dirty:
        if not force:
            return Pruned(w, PruneAction.KEPT_DIRTY)
        saved = save_diff(w.task.paths, env)
    repair(w.repo, env)
    if taskfolder.read_worktree_record(w.task.paths).get("clone"):  # its own clone: no git's
        sync_branch(w.task.paths, env)
        for folder in (w.path, w.task.paths.worktree_git):
            cleanup.remove_tree(folder)
    elif registration(w.repo, w.path, env) is not None:  # repair may have pruned a stale one
        git(w.repo, "worktree", "unlock", str(w.path), env=env, check=False)
        forced = saved is not None or (w.path / ".gitmodules").exists()  # clean, but git asks
        git(w.repo, "worktree", "remove", *(["--force"] if forced else []), str(w.path), env=env)
    elif w.path.exists():  # a folder git no longer knows: kept aside, never deleted
        w.path.rename(w.path.with_name(f"{w.path.name}.stale-{_stamp()}"))
    git(w.repo, "worktree", "prune", env=env)
    deleted = _delete_if_merged(w, env)
    record = taskfolder.read_worktree_record(w.task.paths)
    taskfolder.write_worktree_record(w.task.paths, {**record, "removed": runfolder.timestamp()})
    return Pruned(w, PruneAction.REMOVED, saved, deleted)


def _held(task: TaskPaths) -> str | None:
    """A clone is locked by its task's lock (git knows nothing of it): while a loop of the
    task holds it, in the words `git worktree lock` was given for a linked worktree."""
    holder = live_holder(task.lock)
    return LOCK_REASON.format(label=task.label, pid=holder.pid) if holder is not None else None


def save_diff(task: TaskPaths, env: Mapping[str, str]) -> Path:
    """Save the worktree's uncommitted changes, untracked files included, as a binary diff
    against its HEAD in the task folder (`git apply` takes it back); the worktree and its
    index are left as they were."""
    path = task.worktree
    dirs = tree_dirs(task, env)
    index = Path(git(path, "rev-parse", "--path-format=absolute", "--git-path", "index", env=env,
                     dirs=dirs))  # fmt: skip
    target = task.saved_diff(_stamp())
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "index"
        _copy_regular(index, copy)  # an agent's link or FIFO in its place is no index
        private = {**env, "GIT_INDEX_FILE": str(copy)}
        git(path, "add", "--all", env=private, dirs=dirs)
        diff = git(path, "diff", "--cached", "--binary", "--no-ext-diff", "--no-textconv",
                   "--ignore-submodules=dirty", "HEAD", env=private, dirs=dirs)  # fmt: skip
    runfolder.atomic_write(target, diff + "\n")
    return target


def _copy_regular(source: Path, target: Path) -> None:
    """Copy the regular file `source` (not through a link, never waiting on a FIFO) to
    `target`; nothing when it is anything else."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    with open(fd, "rb") as f:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            with open(target, "wb") as out:
                shutil.copyfileobj(f, out)


def _delete_if_merged(w: IssueWorktree, env: Mapping[str, str]) -> bool:
    if not w.branch:
        return False
    try:
        target = default_branch(w.repo, env)
    except UsageError:
        return False
    merged = run_git(w.repo, "merge-base", "--is-ancestor", w.branch, target,
                     env=env).returncode == 0  # fmt: skip
    if merged:
        git(w.repo, "branch", "-D", w.branch, env=env)
    return merged
