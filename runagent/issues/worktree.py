"""An issue run's git worktree: made fresh from the default branch under its task's folder, and
locked while a loop works in it (listing and pruning them is `pruning.py`'s).

What goes wrong elsewhere does not happen here: a stale branch is never reused (a fresh name is
taken), a registration left by a crash (locked, its folder gone) is repaired rather than fatal,
submodules are initialised, and a dirty worktree is only removed when forced, its diff saved
first into the task folder.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from runagent.errors import ExitCode, RunAgentError, UsageError
from runagent.issues.issue import Issue
from runagent.issues.repository import (
    DEFAULT_READY_MARKER,
    READY_MARKER_VARIABLE,
    Checkout,
    Commit,
    git,
    main_working_tree,
)
from runagent.record import record
from runagent.store import runfolder, taskfolder
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import RunInfo

BRANCH_PREFIX = "run-agent/"
LOCK_REASON = "run-agent: task {label} is running (supervisor pid {pid})"


@record
class Registration:
    """One worktree as `git worktree list --porcelain` tells it."""

    path: Path
    head: str | None
    branch: str | None  # short name; None when detached
    locked: str | None  # the reason ("" when locked without one); None when not locked
    prunable: bool


def main_repository(folder: Path, env: Mapping[str, str]) -> Path:
    """The main working tree of `--repo`; a folder outside any repository is a UsageError."""
    try:
        return main_working_tree(folder, env)
    except UsageError:
        raise UsageError(f"--repo {str(folder)!r} is not a git repository; name one") from None


def registrations(repo: Path, env: Mapping[str, str]) -> list[Registration]:
    """Every worktree of the repository, the main one first."""
    text = git(repo, "worktree", "list", "--porcelain", env=env)
    found = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, _, value = line.partition(" ")
            fields[key] = value
        if "worktree" not in fields:
            continue
        branch = fields.get("branch")
        found.append(
            Registration(
                path=Path(fields["worktree"]),
                head=fields.get("HEAD"),
                branch=branch.removeprefix("refs/heads/") if branch else None,
                locked=fields.get("locked"),
                prunable="prunable" in fields,
            )
        )
    return found


def working_trees(folder: Path, env: Mapping[str, str]) -> tuple[Path, ...]:
    """`folder` and every working tree of its repository (the main one, its linked worktrees):
    one repository's content, whichever of them a task works in."""
    repo = main_repository(folder, env)
    return (folder, *(r.path for r in registrations(repo, env)))


def registration(repo: Path, path: Path, env: Mapping[str, str]) -> Registration | None:
    target = os.path.realpath(path)
    return next((r for r in registrations(repo, env) if os.path.realpath(r.path) == target), None)


def repair(repo: Path, env: Mapping[str, str]) -> None:
    """Clear registrations a crash left behind: a run-agent lock on a worktree whose folder is
    gone is lifted (git keeps locked entries for ever otherwise), then `git worktree prune`."""
    for entry in registrations(repo, env):
        if (
            entry.locked is not None
            and entry.locked.startswith("run-agent")
            and (not entry.path.exists())
        ):
            git(repo, "worktree", "unlock", str(entry.path), env=env, check=False)
    git(repo, "worktree", "prune", env=env)


def default_branch(repo: Path, env: Mapping[str, str]) -> str:
    """The branch a new worktree starts from: the one origin/HEAD names (the local branch of
    that name if there is one), else the branch of the main working tree. Nothing is fetched."""
    remote = git(
        repo, "symbolic-ref", "--quiet", "--short", "refs/remotes/origin/HEAD", env=env,
        check=False,
    )  # fmt: skip
    if remote:
        name = remote.removeprefix("origin/")
        local = f"refs/heads/{name}"
        exists = git(repo, "rev-parse", "--verify", "--quiet", local, env=env, check=False)
        return name if exists else remote
    current = git(repo, "symbolic-ref", "--quiet", "--short", "HEAD", env=env, check=False)
    if current:
        return current
    raise UsageError(
        f"cannot tell the default branch of {repo}: it has no origin/HEAD and its HEAD is "
        "detached; check out the default branch there"
    )


def fresh_branch(repo: Path, name: str, env: Mapping[str, str]) -> str:
    """`name`, or `name-2`, `name-3`, ... : the first that is not a branch yet. A branch left
    by an earlier run is never reused, so its commits never count as new work."""
    candidate, n = name, 1
    while git(
        repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{candidate}", env=env, check=False
    ):
        n += 1
        candidate = f"{name}-{n}"
    return candidate


def branch_name(task: TaskPaths) -> str:
    return f"{BRANCH_PREFIX}{task.project_id}/{task.task_id}"


def open_worktree(
    task: TaskPaths, issue: Issue, env: Mapping[str, str], setup_timeout: float | None = None
) -> Checkout:
    """The task's worktree, ready for a loop that holds the task's lock: its own worktree from
    an earlier loop is reused (the work goes on), else one is made on a fresh branch from the
    default branch. Submodules are initialised, the setup command run once, and the worktree
    locked; the checkout's base is its HEAD now, the loop's start."""
    repo = main_repository(issue.repo, env)
    repair(repo, env)
    runfolder.atomic_write(issue.body_file, issue.body)
    path = task.worktree
    entry = registration(repo, path, env)
    if entry is None:
        if path.exists():  # a folder git no longer knows: kept aside, never deleted
            path.rename(path.with_name(f"{path.name}.stale-{_stamp()}"))
        _create(task, issue, repo, env)
    elif entry.locked is not None:  # a loop that died holding it: we hold the task lock now
        git(repo, "worktree", "unlock", str(path), env=env, check=False)
    if (path / ".gitmodules").exists():
        git(path, "submodule", "update", "--init", "--recursive", env=env)
    _setup(task, issue, env, setup_timeout)
    reason = LOCK_REASON.format(label=task.label, pid=os.getpid())
    git(repo, "worktree", "lock", "--reason", reason, str(path), env=env)
    return Checkout.at(path)


def close_worktree(task: TaskPaths, issue: Issue, env: Mapping[str, str]) -> None:
    """Unlock the worktree when its loop ends; best effort (a crash leaves it to `repair`)."""
    try:
        repo = main_repository(issue.repo, env)
        git(repo, "worktree", "unlock", str(task.worktree), env=env, check=False)
    except RunAgentError:
        pass


def _create(task: TaskPaths, issue: Issue, repo: Path, env: Mapping[str, str]) -> None:
    start = default_branch(repo, env)
    fork = git(repo, "rev-parse", "--verify", f"{start}^{{commit}}", env=env)
    name = branch_name(task)
    if git(repo, "check-ref-format", "--branch", name, env=env, check=False) != name:
        raise UsageError(
            f"task id {task.task_id!r} cannot name a git branch ({name}); give another --task"
        )
    branch = fresh_branch(repo, name, env)
    git(repo, "worktree", "add", "--quiet", "-b", branch, str(task.worktree), fork, env=env)
    taskfolder.write_issue_record(
        task,
        {
            "issue": issue.number,
            "url": issue.url,
            "repo": str(repo),
            "worktree": str(task.worktree),
            "branch": branch,
            "default_branch": start,
            "fork": fork,
            "created": runfolder.timestamp(),
            "setup_done": not issue.setup,
        },
    )


def _setup(task: TaskPaths, issue: Issue, env: Mapping[str, str], timeout: float | None) -> None:
    """Run the setup command in the worktree, once (until it has succeeded), for at most
    `timeout` seconds (then its whole group is killed); its output goes to setup.log in the
    task folder."""
    record = taskfolder.read_issue_record(task)
    if not issue.setup or record.get("setup_done"):
        return
    with open(task.setup_log, "ab") as log:
        try:
            process = subprocess.Popen(
                issue.setup, cwd=task.worktree, env=dict(env), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            raise RunAgentError(
                f"setup command {issue.setup[0]!r} could not start: {exc.strerror}; fix "
                "issues.setup in config.yaml"
            ) from exc
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise RunAgentError(
                f"setup command {' '.join(issue.setup)!r} ran longer than {timeout:g}s in "
                f"{task.worktree} and was stopped; see {task.setup_log}",
                exit_code=ExitCode.TIMED_OUT,
            ) from None
    if code != 0:
        raise RunAgentError(
            f"setup command {' '.join(issue.setup)!r} exited with code {code} in "
            f"{task.worktree}; see {task.setup_log}"
        )
    taskfolder.write_issue_record(task, {**record, "setup_done": True})


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S")


def progress(
    task: TaskPaths, latest: RunInfo | None, env: Mapping[str, str]
) -> dict[str, object] | None:
    """Where a task's git work stands, for `status --json`: the issue (for an issue run), the
    branch, the commits since the base of its latest run, and whether one carries the ready
    marker (`COCODE_READY_MARKER` here, else the default). None for a task with no git work."""
    record = taskfolder.read_issue_record(task)
    base = latest.base_commit if latest is not None else None
    if not base and record.get("fork"):
        base = str(record["fork"])
    if record:
        folder = task.worktree
    elif latest is not None and base:
        folder = Path(latest.cwd)
    else:
        return None
    marker = env.get(READY_MARKER_VARIABLE) or DEFAULT_READY_MARKER
    commits: list[Commit] = []
    if base and folder.is_dir():
        try:
            commits = Checkout(folder, base).commits()
        except RunAgentError:  # the folder or the base is gone: nothing to show
            commits = []
    seen = next((c for c in commits if marker in c.message), None)
    issue = {"number": record.get("issue"), "url": record.get("url") or None} if record else None
    return {
        "issue": issue,
        "repo": record.get("repo") or (latest.repo if latest else None),
        "worktree": str(folder),
        "branch": record.get("branch") or (latest.branch if latest else None),
        "base_commit": base,
        "commits": [{"sha": c.sha, "subject": c.subject} for c in commits],
        "ready_marker": marker,
        "marker_seen": seen is not None,
        "marker_commit": seen.sha if seen else None,
    }
