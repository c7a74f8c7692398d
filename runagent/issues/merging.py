"""The way back from a task's worktree: its branch merged into the branch it started from
(`run-agent merge`), or pushed to a remote instead.

Nothing is half done: a conflict is found before anything changes (`git merge-tree`, which
writes no working tree), a checkout of the target branch with uncommitted changes is refused,
and a target branch no worktree has checked out is moved with `update-ref` against its old
value, so a branch that moved meanwhile is never overwritten.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

from runagent.config.settings import MergeMode
from runagent.errors import AlreadyRunningError, ConflictError, RunAgentError, UsageError
from runagent.issues.repository import GitDirs, git, run_git
from runagent.issues.worktree import main_repository, registrations, sync_branch, tree_dirs
from runagent.record import record
from runagent.store import runfolder, taskfolder, tasks
from runagent.store.credentials import scrub_urls
from runagent.store.lock import already_running, live_holder
from runagent.store.runfolder import TaskPaths


@record
class Merged:
    branch: str
    into: str
    commit: str  # the target branch's tip after the merge
    how: str  # "fast-forward", "merge commit" or "already merged"

    def words(self, label: str) -> str:
        if self.how == "already merged":
            return f"task {label}: {self.branch} is already merged into {self.into}"
        done = f"{self.how}, {self.commit[:12]}"
        return f"task {label}: merged {self.branch} into {self.into} ({done})"


@record
class Work:
    """A task's worktree work, as `merge` and the page see it."""

    repo: Path
    branch: str
    into: str | None  # the branch it merges into (None: started from a detached HEAD)
    fork: str  # the commit its branch started from


def work_of(task: TaskPaths) -> Work:
    """The task's worktree work; a UsageError when it has none."""
    record = taskfolder.read_worktree_record(task)
    if not record.get("branch") or not record.get("repo"):
        raise UsageError(
            f"task {task.label} has no worktree of its own to merge; only a task started with "
            "--worktree (or an issue run) has a branch to bring back"
        )
    into = record.get("into")
    if into is None and "into" not in record:  # written before `into` was: its base if a branch
        into = record.get("default_branch") or record.get("base")
    return Work(Path(str(record["repo"])), str(record["branch"]), str(into) if into else None,
                str(record.get("fork") or ""))  # fmt: skip


def merge(
    task: TaskPaths, mode: MergeMode, env: Mapping[str, str], *, into: str | None = None,
    force: bool = False,
) -> Merged:  # fmt: skip
    """Merge the task's branch into the branch it started from (or `into`). Refused, changing
    nothing: while its loop runs, unless it completed (`force` merges it anyway), with
    uncommitted changes in its worktree or in a checkout of the target, on a conflict, and
    under `ff-only` when it cannot be a fast-forward."""
    work = _ready(task, force)
    sync_branch(task, env)
    target = into or work.into
    if not target:
        raise UsageError(
            f"task {task.label} was started from a detached HEAD: say which branch to merge "
            "into with --into BRANCH"
        )
    repo = main_repository(work.repo, env)
    if not git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{target}", env=env,
               check=False):  # fmt: skip
        raise UsageError(f"branch {target!r} does not exist in {repo}; give --into BRANCH")
    refuse_dirty(task.worktree, f"task {task.label}'s worktree", env, untracked=True,
                  dirs=tree_dirs(task, env))  # fmt: skip
    old = git(repo, "rev-parse", f"refs/heads/{target}", env=env)
    tip = git(repo, "rev-parse", f"refs/heads/{work.branch}", env=env)
    if _is_ancestor(repo, tip, old, env):
        return _recorded(task, Merged(work.branch, target, old, "already merged"))
    fast = _is_ancestor(repo, old, tip, env)
    if mode is MergeMode.FF_ONLY and not fast:
        raise ConflictError(
            f"task {task.label}: {work.branch} cannot be fast-forwarded onto {target}, which "
            "has moved on (issues.merge: ff-only); nothing was changed"
        )
    _refuse_conflict(task, repo, target, work.branch, env)
    message = f"Merge {work.branch} (run-agent task {task.label})"
    checkout = next((r.path for r in registrations(repo, env) if r.branch == target), None)
    if checkout is not None:
        refuse_dirty(checkout, f"the checkout of {target} at {checkout}", env)
        flags = {MergeMode.FF: [], MergeMode.FF_ONLY: ["--ff-only"], MergeMode.NO_FF: ["--no-ff"]}
        done = run_git(checkout, "merge", "--quiet", *flags[mode], "-m", message, work.branch,
                    env=env)  # fmt: skip
        if done.returncode != 0:
            run_git(checkout, "merge", "--abort", env=env)
            raise ConflictError(
                f"task {task.label}: git refused to merge {work.branch} in {checkout}: "
                f"{_last_line(done)}; nothing was changed"
            )
        new = git(checkout, "rev-parse", "HEAD", env=env)
    elif fast and mode is not MergeMode.NO_FF:
        new = tip
        git(repo, "update-ref", f"refs/heads/{target}", new, old, env=env)
    else:
        tree = git(repo, "merge-tree", "--write-tree", old, tip, env=env).splitlines()[0]
        new = git(repo, "commit-tree", tree, "-p", old, "-p", tip, "-m", message, env=env)
        git(repo, "update-ref", f"refs/heads/{target}", new, old, env=env)
    how = "fast-forward" if new == tip else "merge commit"
    return _recorded(task, Merged(work.branch, target, new, how))


def push(task: TaskPaths, remote: str, env: Mapping[str, str], *, force: bool = False) -> str:
    """Push the task's branch to `remote` (instead of merging it); what was pushed, in words."""
    work = _ready(task, force)
    sync_branch(task, env)
    repo = main_repository(work.repo, env)
    if run_git(repo, "remote", "get-url", remote, env=env).returncode != 0:
        raise UsageError(f"{repo} has no remote {scrub_urls(remote)!r}; name one of `git remote`")
    done = run_git(repo, "push", "--quiet", remote, f"refs/heads/{work.branch}", env=env)
    if done.returncode != 0:
        raise RunAgentError(
            f"task {task.label}: git push {scrub_urls(remote)} {work.branch} failed: "
            f"{_last_line(done)}"
        )
    record = taskfolder.read_worktree_record(task)
    taskfolder.write_worktree_record(task, {**record, "pushed": {
        "remote": remote, "at": runfolder.timestamp()}})  # fmt: skip
    return f"task {task.label}: pushed {work.branch} to {remote}"


def _ready(task: TaskPaths, force: bool) -> Work:
    work = work_of(task)
    holder = live_holder(task.lock)
    if holder is not None:
        raise AlreadyRunningError(already_running(task.label, holder) + "; stop it first")
    status = tasks.view(task, tasks.NO_QUEUE).status
    if status is not tasks.TaskStatus.COMPLETED and not force:
        raise UsageError(
            f"task {task.label} is {status.value}, not completed: bring its branch back anyway "
            "with --force"
        )
    return work


def refuse_dirty(
    folder: Path, what: str, env: Mapping[str, str], untracked: bool = False,
    dirs: GitDirs | None = None,
) -> None:  # fmt: skip
    """ConflictError naming the first change, when `folder`'s checkout has uncommitted ones."""
    if not folder.is_dir():
        return
    shown = "all" if untracked else "no"
    changes = git(folder, "status", "--porcelain", f"--untracked-files={shown}",
                  "--ignore-submodules=dirty", env=env, dirs=dirs)  # fmt: skip
    if changes:
        first = changes.splitlines()[0].strip()
        raise ConflictError(
            f"{what} has uncommitted changes ({first}, ...); commit or set them aside first; "
            "nothing was changed"
        )


def _refuse_conflict(
    task: TaskPaths, repo: Path, target: str, branch: str, env: Mapping[str, str]
) -> None:
    done = run_git(repo, "merge-tree", "--write-tree", "--name-only", "--no-messages", target,
                branch, env=env)  # fmt: skip
    if done.returncode == 1:
        files = [line for line in done.stdout.splitlines()[1:] if line]
        raise ConflictError(
            f"task {task.label}: {branch} conflicts with {target} in {', '.join(files[:5])}"
            f"{' ...' if len(files) > 5 else ''}; `run-agent rebase -p {task.project_id} -t "
            f"{task.task_id}` brings {target} into the task's worktree for its agent to resolve "
            f"(or resolve it by hand: git merge {branch}); nothing was changed"
        )
    if done.returncode != 0:
        raise RunAgentError(f"task {task.label}: git merge-tree failed: {_last_line(done)}")


def _is_ancestor(repo: Path, older: str, newer: str, env: Mapping[str, str]) -> bool:
    return run_git(repo, "merge-base", "--is-ancestor", older, newer, env=env).returncode == 0


def _recorded(task: TaskPaths, merged: Merged) -> Merged:
    record = taskfolder.read_worktree_record(task)
    taskfolder.write_worktree_record(task, {**record, "merged": {
        "into": merged.into, "commit": merged.commit, "how": merged.how,
        "at": runfolder.timestamp()}})  # fmt: skip
    return merged


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return scrub_urls(lines[-1].strip()) if lines else f"exit code {done.returncode}"
