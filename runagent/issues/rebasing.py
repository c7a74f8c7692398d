"""`run-agent rebase`: the branch a task's work goes back into, brought into its worktree, so
that `merge` can take the work back when that branch moved on meanwhile.

The branch is brought in by a merge commit on the task's branch (never by rewriting its
commits: the agent's session, the ready marker's commit and what run-agent last brought back
all name them), so `merge` is then a fast-forward. What it takes is decided in the repository
(`git merge-tree`, run-agent's git on the user's repository); the merge itself runs in the
worktree, whose git folder an agent wrote, so the service runs it where the agent runs (under
its sandbox) with `merge_argv`, and `conclude` reads how it ended.

A merge that stops on conflicts leaves them in the worktree for the task's agent: the worktree
record keeps the files (`Rebase`, state `conflict`), the next attempt's prompt names them
(runagent/loop/prompt.py), and a run that says it is done while a conflict marker is left in
one of them, or the merge is not committed, fails (`unresolved`). A clean merge whose check fails
afterwards is kept as `check_failed`: the agent is shown the check's output.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

from runagent.errors import ConflictError, UsageError
from runagent.issues.merging import refuse_dirty, work_of
from runagent.issues.repository import GitDirs, GitError, git, host_argv, run_git, short
from runagent.issues.worktree import main_repository, sync_branch, tree_dirs
from runagent.record import record
from runagent.store import runfolder, taskfolder
from runagent.store.runfolder import TaskPaths

CONFLICT = "conflict"  # git stopped on conflicts: the agent resolves them
CHECK_FAILED = "check_failed"  # merged cleanly, but the task's check fails on the result
MERGED = "merged"  # merged cleanly (and its check, if any, passed)
RESOLVED = "resolved"  # the agent resolved the conflicts (or the check passes again)
PENDING = frozenset({CONFLICT, CHECK_FAILED})

# A line git writes where it stops on a conflict (`=======` alone is also a Markdown rule).
_MARKER = re.compile(rb"^(?:<{7}|>{7}|\|{7})(?: |$)", re.MULTILINE)
MAX_SCAN = 64 * 1024 * 1024  # bytes of a file read for markers (a bigger one is not text)
TIMEOUT = 600.0  # seconds the merge in the worktree may take


@record
class Rebase:
    """A task's last rebase, as its worktree record keeps it."""

    onto: str  # the branch brought in
    commit: str  # its tip then
    state: str  # CONFLICT, CHECK_FAILED, MERGED or RESOLVED
    files: tuple[str, ...] = ()  # the files git stopped on
    check: str = ""  # the check that failed on the merge (CHECK_FAILED)
    at: str = ""

    @property
    def pending(self) -> bool:
        return self.state in PENDING


@record
class Plan:
    """A rebase about to run: the task's branch at `tip`, `onto` at `commit`, and what the
    repository's git says the merge will give (`conflicts`: the files, none when clean)."""

    task: TaskPaths
    repo: Path
    branch: str
    tip: str
    onto: str
    commit: str
    dirs: GitDirs
    conflicts: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        return f"Merge {self.onto} into {self.branch} (run-agent rebase)"


@record
class Rebased:
    """What a rebase did, for the faces."""

    branch: str
    onto: str
    commit: str  # `onto`'s tip that was brought in
    how: str  # "up to date", "merged", "check failed", "conflict" or "aborted"
    files: tuple[str, ...] = ()
    tip: str = ""  # the task's branch after it
    resumed: bool = False  # its loop was resumed to finish it

    def words(self, label: str) -> str:
        if self.how == "up to date":
            return f"task {label}: {self.branch} already has {self.onto} ({short(self.commit)})"
        if self.how == "aborted":
            return f"task {label}: the merge of {self.onto} was undone; {self.branch} is as before"
        if self.how == "merged":
            return (
                f"task {label}: merged {self.onto} ({short(self.commit)}) into {self.branch} "
                f"({short(self.tip)}); `run-agent merge` now brings it back as a fast-forward"
            )
        then = "its loop goes on to" if self.resumed else "`run-agent resume` lets its agent"
        if self.how == "check failed":
            return (
                f"task {label}: merged {self.onto} ({short(self.commit)}) into {self.branch}, "
                f"but its check fails on the result (see check.txt); {then} fix it"
            )
        shown = ", ".join(self.files[:5]) + (" ..." if len(self.files) > 5 else "")
        return (
            f"task {label}: merging {self.onto} ({short(self.commit)}) into {self.branch} "
            f"conflicts in {shown}; {then} resolve them"
        )

    def to_dict(self) -> dict[str, object]:
        return {"branch": self.branch, "onto": self.onto, "commit": self.commit, "how": self.how,
                "files": list(self.files), "tip": self.tip or None,
                "resumed": self.resumed}  # fmt: skip


def last(task: TaskPaths) -> Rebase | None:
    """The task's last rebase, as its worktree record keeps it (None: none, or unreadable)."""
    found = taskfolder.read_worktree_record(task).get("rebase")
    if not isinstance(found, dict):
        return None
    try:
        files = found.get("files") or ()
        return Rebase(str(found["onto"]), str(found["commit"]), str(found["state"]),
                      tuple(str(f) for f in files), str(found.get("check") or ""),
                      str(found.get("at") or ""))  # fmt: skip
    except (KeyError, TypeError):
        return None


def pending(task: TaskPaths) -> Rebase | None:
    """The task's rebase its agent has yet to finish (conflicts, or a check that failed on
    it); None when there is none."""
    found = last(task)
    return found if found is not None and found.pending else None


def keep(task: TaskPaths, rebase: Rebase) -> None:
    """Write the rebase's state into the task's worktree record."""
    record = taskfolder.read_worktree_record(task)
    entry = {"onto": rebase.onto, "commit": rebase.commit, "state": rebase.state,
             "files": list(rebase.files), "check": rebase.check or None,
             "at": rebase.at or runfolder.timestamp()}  # fmt: skip
    taskfolder.write_worktree_record(task, {**record, "rebase": entry})


def plan(task: TaskPaths, env: Mapping[str, str], onto: str | None = None) -> Plan | Rebased:
    """What rebasing the task's worktree onto `onto` (default: the branch it merges into)
    takes, decided in the repository; `Rebased` ("up to date") when it has it all already.
    Called holding the task's lock. Refused, changing nothing: a task with no worktree, a
    worktree with uncommitted changes, or one still waiting on an earlier rebase's conflicts."""
    work = work_of(task)
    waiting = pending(task)
    if waiting is not None and waiting.state == CONFLICT:
        raise ConflictError(
            f"task {task.label} still has the conflicts of merging {waiting.onto} in "
            f"{', '.join(waiting.files[:5])}: `run-agent resume -p {task.project_id} -t "
            f"{task.task_id}` lets its agent resolve them, or `run-agent rebase --abort` undoes it"
        )
    target = onto or work.into
    if not target:
        raise UsageError(
            f"task {task.label} was started from a detached HEAD: say which branch to bring "
            "in with --onto BRANCH"
        )
    dirs = tree_dirs(task, env)
    if dirs is None or not task.worktree.is_dir():
        raise UsageError(
            f"task {task.label}'s worktree is gone (pruned?); there is nothing to rebase"
        )
    sync_branch(task, env)
    repo = main_repository(work.repo, env)
    commit = git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{target}^{{commit}}",
                 env=env, check=False)  # fmt: skip
    if not commit:
        raise UsageError(f"branch {target!r} does not exist in {repo}; give --onto BRANCH")
    refuse_dirty(task.worktree, f"task {task.label}'s worktree", env, untracked=True, dirs=dirs)
    tip = git(task.worktree, "rev-parse", "--verify", "HEAD^{commit}", env=env, dirs=dirs)
    if run_git(repo, "merge-base", "--is-ancestor", commit, tip, env=env).returncode == 0:
        return Rebased(work.branch, target, commit, "up to date", tip=tip)
    done = run_git(repo, "merge-tree", "--write-tree", "--name-only", "--no-messages", tip,
                   commit, env=env)  # fmt: skip
    if done.returncode not in (0, 1):
        raise GitError(f"task {task.label}: git merge-tree failed: {done.stderr.strip()}")
    files = tuple(line for line in done.stdout.splitlines()[1:] if line)
    return Plan(task, repo, work.branch, tip, target, commit, dirs, files)


def merge_argv(plan: Plan) -> list[str]:
    """The git command that merges `plan`'s commit in the worktree (run where its agent runs),
    with no editor, no signing and none of the worktree's hooks."""
    return host_argv(
        plan.task.worktree, "merge", "--no-ff", "--no-edit", "-m", plan.message, plan.commit,
        config=("commit.gpgSign=false", "merge.conflictStyle=merge", "rerere.enabled=false"),
    )  # fmt: skip


def merge_env(plan: Plan, env: Mapping[str, str]) -> dict[str, str]:
    """The merge's environment: its git folders named, and the identity of the repository's
    own commits (the user's, as their git says it) for the merge commit."""
    ident = git(plan.repo, "var", "GIT_COMMITTER_IDENT", env=env, check=False)
    found = re.match(r"^(.*?) <([^>]*)>", ident)
    name, email = (found.group(1), found.group(2)) if found else ("run-agent", "run-agent@local")
    return {
        **{k: v for k, v in env.items() if not k.startswith("GIT_")},
        **plan.dirs.environment(),
        "GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email,
        "GIT_TERMINAL_PROMPT": "0", "GIT_EDITOR": "true", "GIT_MERGE_AUTOEDIT": "no",
    }  # fmt: skip


def conclude(plan: Plan, code: int, said: str, env: Mapping[str, str]) -> Rebased:
    """How the merge in the worktree ended (its exit `code`, its output `said`): merged, its
    branch brought back into the repository; or stopped on conflicts, left for the agent (the
    files from the index, as git left it); anything else is a GitError and nothing is kept."""
    task, dirs = plan.task, plan.dirs
    head = git(task.worktree, "rev-parse", "--verify", "--quiet", "HEAD^{commit}", env=env,
               check=False, dirs=dirs)  # fmt: skip
    merging = os.path.lexists(dirs.git_dir / "MERGE_HEAD")
    if code == 0 and head and not merging and _contains(task, head, plan.commit, env):
        tip = sync_branch(task, env) or head
        keep(task, Rebase(plan.onto, plan.commit, MERGED))
        return Rebased(plan.branch, plan.onto, plan.commit, "merged", tip=tip)
    if merging:
        listed = git(task.worktree, "ls-files", "--unmerged", "-z", env=env, check=False,
                     dirs=dirs)  # fmt: skip
        files = tuple(dict.fromkeys(e.split("\t", 1)[1] for e in listed.split("\0") if "\t" in e))
        files = files or plan.conflicts
        keep(task, Rebase(plan.onto, plan.commit, CONFLICT, files))
        return Rebased(plan.branch, plan.onto, plan.commit, "conflict", files, tip=head)
    lines = said.strip().splitlines()
    raise GitError(
        f"task {task.label}: git could not merge {plan.onto} into {plan.branch}: "
        f"{lines[-1] if lines else f'exit code {code}'}; nothing was changed"
    )


def abort_argv(task: TaskPaths) -> list[str]:
    """The git command that undoes a merge stopped on conflicts, in the worktree."""
    return host_argv(task.worktree, "merge", "--abort")


def aborted(task: TaskPaths, env: Mapping[str, str]) -> Rebased:
    """After `abort_argv` ran: the rebase forgotten, the branch as it was."""
    work, found = work_of(task), last(task)
    dirs = tree_dirs(task, env)
    if dirs is not None and os.path.lexists(dirs.git_dir / "MERGE_HEAD"):
        raise GitError(f"task {task.label}: git could not undo the merge in {task.worktree}")
    record = taskfolder.read_worktree_record(task)
    record.pop("rebase", None)
    taskfolder.write_worktree_record(task, record)
    onto, commit = (found.onto, found.commit) if found else (work.into or "", "")
    return Rebased(work.branch, onto, commit, "aborted")


def unresolved(task: TaskPaths, folder: Path, dirs: GitDirs | None) -> str:
    """Why the conflicts of the task's pending rebase are not resolved yet, in words ("" when
    they are): a conflict marker left in one of its files, or the merge not committed. Read
    as data: a file that is no regular file, or too big, is not scanned."""
    found = pending(task)
    if found is None or found.state != CONFLICT:
        return ""
    marked = [name for name in found.files if _has_markers(folder, name)]
    if marked:
        shown = ", ".join(marked[:5]) + (" ..." if len(marked) > 5 else "")
        return f"conflict markers are left in {shown}"
    if dirs is not None and os.path.lexists(dirs.git_dir / "MERGE_HEAD"):
        return f"the merge of {found.onto} is not committed (git commit concludes it)"
    return ""


def settle(task: TaskPaths) -> None:
    """The task's pending rebase is done with: its agent resolved it, its check passes."""
    found = pending(task)
    if found is not None:
        keep(task, Rebase(found.onto, found.commit, RESOLVED, found.files, at=found.at))


def _contains(task: TaskPaths, head: str, commit: str, env: Mapping[str, str]) -> bool:
    done = run_git(task.worktree, "merge-base", "--is-ancestor", commit, head, env=env,
                   dirs=tree_dirs(task, env))  # fmt: skip
    return done.returncode == 0


def _has_markers(folder: Path, name: str) -> bool:
    """Whether `folder/name` holds a line git writes at a conflict; a path that leaves the
    folder (by a link too), a link, or what is no regular file is not read (and counts as
    none)."""
    path = folder / name
    if not os.path.realpath(path).startswith(os.path.realpath(folder) + os.sep):
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_SCAN:
            return False
        with os.fdopen(fd, "rb", closefd=False) as f:
            return _MARKER.search(f.read(MAX_SCAN)) is not None
    finally:
        os.close(fd)
