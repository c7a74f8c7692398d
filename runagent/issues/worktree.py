"""A task's own git worktree: made fresh under its task's folder, on a new branch from a base (an
issue run's: the default branch; a worktree run's: the HEAD it was started from, or `--base`),
and locked while a loop works in it (listing and pruning them is `pruning.py`'s).

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
    GitDirs,
    GitError,
    git,
    host_argv,
    host_env,
    main_working_tree,
    short,
)
from runagent.record import record
from runagent.store import runfolder, taskfolder
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import RunInfo

BRANCH_PREFIX = "run-agent/"
LOCK_REASON = "run-agent: task {label} is running (supervisor pid {pid})"


@record
class Tree:
    """A loop's own worktree: a fresh branch from `base` of the repository `repo` is in."""

    repo: Path  # a folder of the repository (a linked worktree's too)
    base: str | None = None  # a revision, read in `repo`; None: the default branch (issue runs)
    setup: tuple[str, ...] = ()  # run once in a new worktree (config issues.setup)


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
    task: TaskPaths, tree: Tree, env: Mapping[str, str], setup_timeout: float | None = None,
    issue: Issue | None = None,
) -> Checkout:  # fmt: skip
    """The task's worktree, ready for a loop that holds the task's lock: its own worktree from
    an earlier loop is reused (the work goes on), else one is made on a fresh branch from the
    tree's base. Submodules are initialised in a worktree just made (never again on the
    host: their git folders are then the agent's), the setup command run once, and the worktree
    locked; the checkout's base is its HEAD now, the loop's start."""
    repo = main_repository(tree.repo, env)
    repair(repo, env)
    if issue is not None:
        runfolder.atomic_write(issue.body_file, issue.body)
    path = task.worktree
    record = taskfolder.read_worktree_record(task)
    entry = None if record.get("clone") else registration(repo, path, env)
    made = False
    if entry is not None:  # a linked worktree made before worktrees were clones: kept as it is
        if entry.locked is not None:  # a loop that died holding it: we hold the task lock now
            git(repo, "worktree", "unlock", str(path), env=env, check=False)
    elif not (record.get("clone") and path.is_dir() and task.worktree_git.is_dir()):
        for left in (path, task.worktree_git):  # a folder nobody knows: kept aside, not deleted
            if left.exists():
                left.rename(left.with_name(f"{left.name}.stale-{_stamp()}"))
        _create(task, tree, repo, env, issue)
        made = True
    dirs = tree_dirs(task, env)
    # Only a worktree just made from the repository: in one an agent worked in, a submodule's
    # git folder is the agent's to write, and its config (a filter, an update command) would
    # run on the host. The agent updates its own submodules from then on.
    if made and (path / ".gitmodules").exists():
        git(path, "submodule", "update", "--init", "--recursive", env=env, dirs=dirs)
    _setup(task, tree.setup, env, setup_timeout)
    if entry is not None:
        reason = LOCK_REASON.format(label=task.label, pid=os.getpid())
        git(repo, "worktree", "lock", "--reason", reason, str(path), env=env)
    return Checkout.at(path, dirs=dirs)


def sync_branch(task: TaskPaths, env: Mapping[str, str]) -> str | None:
    """Bring the task's branch back from its clone into the repository: the objects the
    repository lacks are packed from the clone's (read as data: the clone's commit-graph and
    bitmaps are not trusted) and the branch of the same name moved to the clone's tip, against
    the value run-agent last gave it (`synced` in the task's record, at first the fork).
    Nothing else of the repository changes, and a branch someone else moved there since is
    never overwritten: a GitError saying so, the work left in the clone. The tip, or None when
    there is nothing to bring (no clone, or its branch is gone from it)."""
    record = taskfolder.read_worktree_record(task)
    if not record.get("clone") or not task.worktree_git.is_dir():
        return None
    dirs = tree_dirs(task, env)
    repo, branch = Path(str(record["repo"])), str(record["branch"])
    ref = f"refs/heads/{branch}"
    tip = git(task.folder, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", env=env,
              check=False, dirs=dirs)  # fmt: skip
    if not tip:
        return None
    last = str(record.get("synced") or record.get("fork") or "")
    now = git(repo, "rev-parse", "--verify", "--quiet", ref, env=env, check=False)
    if now != last:
        if now == tip:  # brought back by a run-agent that did not live to write it down
            taskfolder.write_worktree_record(task, {**record, "synced": tip})
            return tip
        where = f"moved to {short(now)}" if now else "deleted"
        raise GitError(
            f"{branch} cannot be brought back into {repo}: it was {where} there since run-agent "
            f"last set it ({short(last)}), and that is kept; the task's work is {short(tip)} in "
            f"{task.worktree_git} (`git fetch {task.worktree_git} {branch}` takes it; `git "
            f"branch -f {branch} {short(last)}` in {repo} lets run-agent bring it back)"
        )
    if tip == now:
        return tip
    _bring_objects(task, repo, tip, [now, str(record.get("fork") or "")], env)
    git(repo, "update-ref", "-m", f"run-agent: task {task.label}", ref, tip, now, env=env)
    taskfolder.write_worktree_record(task, {**record, "synced": tip})
    return tip


def _bring_objects(
    task: TaskPaths, repo: Path, tip: str, known: list[str], env: Mapping[str, str]
) -> None:
    """Copy into the repository the objects of `tip` it lacks, from the task's clone: packed
    by the repository's git reading the clone's objects as an alternate, indexed (each object
    hashed again) into the repository's own."""
    borrowed = {**env, "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(task.worktree_git / "objects")}
    wanted = "".join(f"{line}\n" for line in (tip, *(f"^{sha}" for sha in known if sha)))
    untrusted = ("core.commitGraph=false", "pack.useBitmaps=false")
    packer = subprocess.Popen(
        host_argv(repo, "pack-objects", "--revs", "--stdout", "-q", config=untrusted),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=host_env(borrowed, None),
    )  # fmt: skip
    indexer = subprocess.Popen(
        host_argv(repo, "index-pack", "--stdin"), stdin=packer.stdout,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=host_env(env, None),
    )  # fmt: skip
    assert packer.stdin is not None and packer.stdout is not None and packer.stderr is not None
    packer.stdout.close()
    with contextlib.suppress(BrokenPipeError):
        packer.stdin.write(wanted.encode())
    with contextlib.suppress(BrokenPipeError):
        packer.stdin.close()
    said = indexer.communicate()[1] + packer.stderr.read()
    packer.stderr.close()
    if packer.wait() != 0 or indexer.returncode != 0:
        words = " / ".join(said.decode(errors="replace").split("\n")).strip(" /")[:300]
        raise GitError(f"bringing {tip[:12]} back from {task.worktree_git} failed: {words}")


def tree_dirs(task: TaskPaths, env: Mapping[str, str]) -> GitDirs | None:
    """The git folders of the task's worktree as the supervisor wrote them down when it made it
    (never as its `.git` file says: the agent writes that); None for a task with no worktree.
    A record older than these fields: found in the repository's list of its worktrees."""
    record = taskfolder.read_worktree_record(task)
    if not record.get("repo"):
        return None
    if record.get("git_dir") and record.get("common_dir"):
        return GitDirs(Path(str(record["git_dir"])), Path(str(record["common_dir"])),
                       task.worktree)  # fmt: skip
    repo = Path(str(record["repo"]))
    common = Path(git(repo, "rev-parse", "--path-format=absolute", "--git-common-dir", env=env))
    target = os.path.realpath(task.worktree / ".git")
    for admin in sorted((common / "worktrees").glob("*")):
        try:
            named = (admin / "gitdir").read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if os.path.realpath(named) == target:
            return GitDirs(admin, common, task.worktree)
    raise RunAgentError(f"{task.worktree} is not a worktree of {repo} (git does not list it)")


def close_worktree(task: TaskPaths, tree: Tree, env: Mapping[str, str]) -> None:
    """Unlock the worktree when its loop ends; best effort (a crash leaves it to `repair`)."""
    try:
        sync_branch(task, env)
        if not taskfolder.read_worktree_record(task).get("clone"):
            repo = main_repository(tree.repo, env)
            git(repo, "worktree", "unlock", str(task.worktree), env=env, check=False)
    except RunAgentError:
        pass


def resolve_base(folder: Path, base: str | None, env: Mapping[str, str]) -> str:
    """The commit `base` names in the repository of `folder` (None: its HEAD); a UsageError
    naming it when it names none, so that a typo never starts a run."""
    ref = base or "HEAD"
    sha = git(folder, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", env=env,
              check=False)  # fmt: skip
    if not sha:
        raise UsageError(
            f"--base {ref!r} names no commit of the repository at {folder}; give a branch, "
            "tag or commit of it"
        )
    return sha


def check_tree(folder: Path, base: str | None, root: Path, env: Mapping[str, str]) -> None:
    """Before a worktree run is admitted: `folder` is in a git repository, `base` (None: HEAD)
    names a commit of it, and the runs root (where the worktree is made) is outside it."""
    from runagent.config.file import refuse_root_inside

    if not folder.is_dir():
        raise UsageError(f"working folder {str(folder)!r} does not exist; check --cwd")
    try:
        trees = working_trees(folder, env)
    except UsageError:
        raise UsageError(
            f"--worktree needs a git repository, and {str(folder)!r} is in none; give --cwd a "
            "folder of one"
        ) from None
    resolve_base(folder, base, env)
    refuse_root_inside(root, "--root or storage.runs_dir", trees)


def work_folder(task: TaskPaths, folder: Path, env: Mapping[str, str]) -> Path:
    """Where in the task's worktree the agent works: at `folder`'s place in its own working
    tree (a run started in `repo/web` works in `worktree/web`)."""
    top = Path(git(folder, "rev-parse", "--show-toplevel", env=env))
    inside = folder.resolve().relative_to(top.resolve())
    return task.worktree / inside


def _create(
    task: TaskPaths, tree: Tree, repo: Path, env: Mapping[str, str], issue: Issue | None
) -> None:
    start = tree.base or default_branch(repo, env)
    fork = resolve_base(tree.repo if tree.base else repo, start, env)
    name = branch_name(task)
    if git(repo, "check-ref-format", "--branch", name, env=env, check=False) != name:
        raise UsageError(
            f"task id {task.task_id!r} cannot name a git branch ({name}); give another --task"
        )
    branch = fresh_branch(repo, name, env)
    into = _branch_of(tree.repo if tree.base else repo, start, env)
    # The branch in the repository, at the fork: its name is taken, and what reads it works.
    git(repo, "branch", "--no-track", branch, fork, env=env)
    # The agent's own clone, its git folder beside the worktree: it borrows the repository's
    # objects (read-only to a sandboxed agent) and can move no ref of the repository.
    git(
        task.folder,
        "clone",
        "--quiet",
        "--shared",
        "--template=",
        "--branch",
        branch,
        "--separate-git-dir",
        str(task.worktree_git),
        str(repo),
        str(task.worktree),
        env=env,
    )
    dirs = GitDirs(task.worktree_git, task.worktree_git, task.worktree)
    _local_branches(task.folder, branch, env, dirs)
    taskfolder.write_worktree_record(
        task,
        {
            "issue": issue.number if issue is not None else None,
            "url": issue.url if issue is not None else "",
            "repo": str(repo),
            "worktree": str(task.worktree),
            "branch": branch,
            "default_branch": start if issue is not None else None,
            "base": start,
            "into": into,
            "fork": fork,
            "created": runfolder.timestamp(),
            "setup_done": not tree.setup,
            "git_dir": str(dirs.git_dir),
            "common_dir": str(dirs.common_dir),
            "clone": True,
        },
    )


def _local_branches(folder: Path, own: str, env: Mapping[str, str], dirs: GitDirs) -> None:
    """The repository's branches as local branches of the new clone too, as a linked worktree
    sees them (`git log main..HEAD` works there); only its own is ever brought back."""
    found = git(folder, "for-each-ref", "--format=%(objectname) %(refname)", "refs/remotes/origin/",
                env=env, dirs=dirs)  # fmt: skip
    lines = []
    for line in found.splitlines():
        sha, _, ref = line.partition(" ")
        name = ref.removeprefix("refs/remotes/origin/")
        if name not in ("HEAD", own):
            lines.append(f"create refs/heads/{name} {sha}\n")
    if lines:
        done = subprocess.run(host_argv(folder, "update-ref", "--stdin"), input="".join(lines),
                              capture_output=True, text=True, env=host_env(env, dirs))  # fmt: skip
        if done.returncode != 0:
            raise GitError(f"`git update-ref` in {dirs.git_dir} failed: {done.stderr.strip()}")


def _branch_of(folder: Path, ref: str, env: Mapping[str, str]) -> str | None:
    """The local branch `ref` stands for in `folder` (HEAD: the branch checked out there), the
    one `merge` brings the work back into; None for a detached HEAD, a tag or a commit."""
    if ref == "HEAD":
        on = git(folder, "symbolic-ref", "--quiet", "--short", "HEAD", env=env, check=False)
        return on or None
    found = git(folder, "rev-parse", "--verify", "--quiet", f"refs/heads/{ref}", env=env,
                check=False)  # fmt: skip
    return ref if found else None


def _setup(
    task: TaskPaths, setup: tuple[str, ...], env: Mapping[str, str], timeout: float | None
) -> None:
    """Run the setup command in the worktree, once (until it has succeeded), for at most
    `timeout` seconds (then its whole group is killed); its output goes to setup.log in the
    task folder."""
    record = taskfolder.read_worktree_record(task)
    if not setup or record.get("setup_done"):
        return
    with open(task.setup_log, "ab", opener=runfolder.private) as log:
        try:
            process = subprocess.Popen(
                setup, cwd=task.worktree, env=dict(env), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            raise RunAgentError(
                f"setup command {setup[0]!r} could not start: {exc.strerror}; fix "
                "issues.setup in config.yaml"
            ) from exc
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise RunAgentError(
                f"setup command {' '.join(setup)!r} ran longer than {timeout:g}s in "
                f"{task.worktree} and was stopped; see {task.setup_log}",
                exit_code=ExitCode.TIMED_OUT,
            ) from None
    if code != 0:
        raise RunAgentError(
            f"setup command {' '.join(setup)!r} exited with code {code} in "
            f"{task.worktree}; see {task.setup_log}"
        )
    taskfolder.write_worktree_record(task, {**record, "setup_done": True})


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S")


def progress(
    task: TaskPaths, latest: RunInfo | None, env: Mapping[str, str]
) -> dict[str, object] | None:
    """Where a task's git work stands, for `status --json`: the issue (for an issue run), the
    branch, the commits since the base of its latest run (a worktree's: since its fork), and
    whether one since that base carries the ready marker (`COCODE_READY_MARKER` here, else the
    default). None for a task with no git work."""
    record = taskfolder.read_worktree_record(task)
    racer = record.get("racer")
    if isinstance(racer, str) and racer and racer != task.task_id:  # a race's: its winner's
        from runagent.store.ids import validate_id

        winner = TaskPaths(task.root, task.project_id, validate_id("racer's task", racer))
        return progress(winner, None, env) if "racer" not in (
            taskfolder.read_worktree_record(winner)) else None  # fmt: skip
    base = latest.base_commit if latest is not None else None
    if not base and record.get("fork"):
        base = str(record["fork"])
    if record:
        folder = task.worktree  # read only while it lies inside the task's project
        if os.path.lexists(folder) and not runfolder.holds(task.fence, folder):
            return None
    elif latest is not None and base:
        folder = Path(latest.cwd)
    else:
        return None
    marker = env.get(READY_MARKER_VARIABLE) or DEFAULT_READY_MARKER
    commits: list[Commit] = []
    dirs: GitDirs | None = None
    # A worktree's commits are listed since its fork, as its way back counts them; the ready
    # marker counts only since the base of its latest loop, as the rule reads it.
    fork = str(record.get("fork") or "") or None
    since = fork or base
    seen: Commit | None = None
    if since and folder.is_dir():
        try:
            dirs = tree_dirs(task, env) if record else _recorded_dirs(latest)
            commits = Checkout(folder, since, dirs=dirs).commits()
            if base and base != since:
                seen = Checkout(folder, base, dirs=dirs).find(marker)
        except RunAgentError:  # the folder or the base is gone: nothing to show
            commits = []
    if not (base and base != since):
        seen = next((c for c in commits if marker in c.message), None)
    number = record.get("issue")
    issue = {"number": number, "url": record.get("url") or None} if number else None
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
        **(_branch_work(record, folder, env, dirs) if record else {}),
    }


def _recorded_dirs(latest: RunInfo | None) -> GitDirs:
    """The git folders of a plain run's checkout, found in its working folder (the sandbox
    keeps its agent from replacing its `.git`; a `commondir` in a `.git` folder is not followed)."""
    if latest is None:
        raise RunAgentError("no run to read a checkout from")
    return GitDirs.of(Path(latest.cwd))


def _branch_work(
    record: Mapping[str, object], folder: Path, env: Mapping[str, str], dirs: GitDirs | None
) -> dict[str, object]:
    """A worktree's branch against where it forked, for the page's merge: the branch it goes
    back into, its commits since the fork, those of that branch it lacks (`behind`), the diff
    stat, whether it was merged or pushed, and its last rebase."""
    fork = str(record.get("fork") or "")
    ahead, stat = 0, ""
    if fork and folder.is_dir() and dirs is not None:
        count = git(folder, "rev-list", "--count", f"{fork}..HEAD", env=env, check=False,
                    dirs=dirs)  # fmt: skip
        ahead = int(count) if count.isdigit() else 0
        stat = git(folder, "diff", "--no-ext-diff", "--no-textconv", "--shortstat", fork, "HEAD",
                   env=env, check=False, dirs=dirs).strip()  # fmt: skip
    return {
        "fork_commit": fork or None, "into": record.get("into"), "ahead": ahead,
        "behind": _behind(record, env), "diffstat": stat, "merged": record.get("merged"),
        "pushed": record.get("pushed"), "rebase": record.get("rebase"),
        "removed": bool(record.get("removed")),
    }  # fmt: skip


def _behind(record: Mapping[str, object], env: Mapping[str, str]) -> int | None:
    """How many commits the branch the work goes back into has that the task's branch (as last
    brought back) has not, read in the repository: what `run-agent rebase` would bring in."""
    repo, branch, into = record.get("repo"), record.get("branch"), record.get("into")
    if not (repo and branch and into) or not Path(str(repo)).is_dir():
        return None
    count = git(Path(str(repo)), "rev-list", "--count", f"refs/heads/{branch}..refs/heads/{into}",
                env=env, check=False)  # fmt: skip
    return int(count) if count.isdigit() else None


DIFF_LIMIT = 2 * 1024 * 1024  # bytes of a worktree's diff shown at most


@record
class Diff:
    """What a task's branch changed since its fork, as `merge` would bring it back."""

    fork: str
    tip: str
    text: str
    truncated: bool  # it was longer than DIFF_LIMIT: the text is its start

    def to_dict(self) -> dict[str, object]:
        return {"fork_commit": self.fork, "tip": self.tip, "diff": self.text,
                "truncated": self.truncated}  # fmt: skip


def diff(task: TaskPaths, env: Mapping[str, str], limit: int = DIFF_LIMIT) -> Diff:
    """The task's branch against its fork, as a patch, read in the repository once the branch is
    brought back (run-agent's git on the user's repository: no program of the worktree's runs,
    neither an external diff nor a text conversion). UsageError for a task with no worktree."""
    record = taskfolder.read_worktree_record(task)
    fork, repo, branch = (str(record.get(k) or "") for k in ("fork", "repo", "branch"))
    if not (fork and repo and branch):
        raise UsageError(f"task {task.label} has no worktree of its own, so no diff to show")
    with contextlib.suppress(RunAgentError):  # kept in its clone: the last one brought back
        sync_branch(task, env)
    tip = git(Path(repo), "rev-parse", "--verify", f"refs/heads/{branch}^{{commit}}", env=env)
    text = git(Path(repo), "diff", "--no-ext-diff", "--no-textconv", "--no-color", "--stat",
               "--patch", fork, tip, env=env)  # fmt: skip
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return Diff(fork, tip, text, False)
    return Diff(fork, tip, data[:limit].decode("utf-8", "ignore"), True)
