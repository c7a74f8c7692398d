"""A git repository as run-agent reads it: HEAD, branches, and the commits made since a base.

Every git command run-agent runs goes through `run_git`, with the settings of `HOST_CONFIG` on
its command line (they win over every config file): hooks, a file system monitor, signature
checks, automatic gc and submodule recursion are off, whatever a repository's config says. A
working tree an agent wrote is never asked where its git folder is (its `.git` file or folder,
a `commondir` in it, can point at one of the agent's making): commands there name the folders
(`GitDirs`) read before the agent ran, or written down by the supervisor.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from runagent.errors import MissingDependencyError, RunAgentError, UsageError
from runagent.record import record
from runagent.store.credentials import scrub_urls

DEFAULT_READY_MARKER = "cocode ready for check"
READY_MARKER_VARIABLE = "COCODE_READY_MARKER"


class GitError(RunAgentError):
    """A git command that failed: the message carries the command and what git said."""


# What a repository's config (or an agent that wrote one) could make git run on the host.
HOST_CONFIG = (
    "core.hooksPath=/dev/null",  # no hook runs: not one of the repository's, not a planted one
    "core.fsmonitor=false",  # a program git would start to list changed files
    "core.pager=cat",
    "log.showSignature=false",  # gpg.program
    "merge.verifySignatures=false",
    "submodule.recurse=false",  # a submodule's git folder is the agent's to write
    "status.submoduleSummary=false",
    "diff.ignoreSubmodules=dirty",
    "gc.auto=0",  # no `git gc --auto` left running after a command
    "maintenance.auto=false",
    "protocol.ext.allow=never",  # a URL of .gitmodules that runs a command
)
_HOST_ARGS = tuple(a for setting in HOST_CONFIG for a in ("-c", setting))
# Variables that name a repository (set by whatever started run-agent, a hook that runs it):
# never meant for the repositories run-agent works in. The user's GIT_CONFIG_* settings stay.
_LOCATION = ("GIT_DIR", "GIT_COMMON_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE",
             "GIT_OBJECT_DIRECTORY", "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_NAMESPACE",
             "GIT_EXTERNAL_DIFF")  # fmt: skip


@record
class GitDirs:
    """Where a working tree's repository is, named rather than found: its git folder, the
    common folder (the repository's, for a linked worktree), and the working tree."""

    git_dir: Path
    common_dir: Path
    work_tree: Path

    @classmethod
    def of(cls, folder: Path, env: Mapping[str, str] | None = None) -> GitDirs:
        """The folders of the checkout `folder` is in, as git finds them now (call it before
        an agent works there). A git folder that is a folder of the working tree (not a linked
        worktree's) is its own common folder, whatever a `commondir` in it says."""
        out = git(folder, "rev-parse", "--path-format=absolute", "--absolute-git-dir",
                  "--git-common-dir", "--show-toplevel", env=env).splitlines()  # fmt: skip
        if len(out) != 3:
            raise GitError(f"`git rev-parse` in {folder} said {out!r}: not a working tree")
        own, common, top = (Path(line) for line in out)
        if (top / ".git").is_dir() and (top / ".git").resolve() == own.resolve():
            common = own
        return cls(own, common, top)

    def environment(self) -> dict[str, str]:
        return {"GIT_DIR": str(self.git_dir), "GIT_COMMON_DIR": str(self.common_dir),
                "GIT_WORK_TREE": str(self.work_tree)}  # fmt: skip


@record
class Commit:
    """A commit of the loop's work: its id and its message."""

    sha: str
    message: str  # subject and body

    @property
    def subject(self) -> str:
        return self.message.split("\n", 1)[0]


@record
class Checkout:
    """A working folder in a git repository, and the commit its loop started from: only commits
    in `base..HEAD` of that folder count as the loop's work."""

    folder: Path
    base: str
    branch: str | None = None
    repo: Path | None = None  # the repository's main working tree, when `folder` is a worktree
    dirs: GitDirs | None = None  # its repository's folders, named in every command (None: found)

    @classmethod
    def at(cls, folder: Path, base: str | None = None, dirs: GitDirs | None = None) -> Checkout:
        """The checkout of `folder`, its base `base` or else its HEAD now; a folder that is not
        in a git repository (or one without a commit) is a UsageError naming it. Its folders
        are `dirs` (a record's), or as found now, before an agent works there."""
        try:
            dirs = dirs or GitDirs.of(folder)
        except GitError:
            raise UsageError(
                f"{folder} is not in a git repository; completion by ready marker reads its "
                "commits: run in a repository (or use --issue with --repo)"
            ) from None
        top = dirs.work_tree
        start = base or head(top, dirs)
        if start is None:
            raise UsageError(f"the repository at {top} has no commit yet; commit something first")
        return cls(top, start, branch(top, dirs), main_working_tree(top, dirs=dirs), dirs)

    def head(self) -> str | None:
        return head(self.folder, self.dirs)

    def commits(self) -> list[Commit]:
        """The commits reachable from HEAD but not from the base, newest first."""
        return commits_between(self.folder, self.base, "HEAD", self.dirs)

    def find(self, marker: str) -> Commit | None:
        """The newest commit since the base whose message carries `marker`, if any."""
        return next((c for c in self.commits() if marker in c.message), None)


def git(
    folder: Path, *args: str, env: Mapping[str, str] | None = None, check: bool = True,
    dirs: GitDirs | None = None,
) -> str:  # fmt: skip
    """Run `git -C folder ARGS`; its stdout without the final newline. A failure is a GitError
    with git's own words (unless `check` is off: then the output, whatever the exit)."""
    done = run_git(folder, *args, env=env, dirs=dirs)
    if check and done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        line = f"`git {' '.join(args)}` in {folder} failed: {' / '.join(said)}"
        raise GitError(scrub_urls(line))  # a remote's URL may hold a password
    return done.stdout.removesuffix("\n")


GIT_TIMEOUT = 300.0  # seconds a git command run-agent runs may take, at most
PUSH_TIMEOUT = 1800.0  # ... one that talks to a remote


def run_git(
    folder: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    dirs: GitDirs | None = None,
    config: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """`git -C folder ARGS` as it ended, for a caller that reads its exit code (a conflict, an
    ancestry); never a prompt for credentials, never a program of the repository's (see the
    module), and in the repository `dirs` names when given. `config`: more settings (`k=v`)."""
    argv = host_argv(folder, *args, config=config)
    wait = PUSH_TIMEOUT if args[:1] in (("push",), ("fetch",)) else GIT_TIMEOUT
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, env=host_env(env, dirs),
            stdin=subprocess.DEVNULL, timeout=wait,
        )  # fmt: skip
    except subprocess.TimeoutExpired:  # (killed) e.g. on a FIFO left where git reads a file
        said = f"git gave no answer in {wait:g}s (a file of the repository it waits on?)"
        return subprocess.CompletedProcess(argv, 124, "", said)


def host_argv(folder: Path, *args: str, config: Sequence[str] = ()) -> list[str]:
    """The argv of `git ARGS` in `folder` as run-agent runs it on the host."""
    extra = [a for setting in config for a in ("-c", setting)]
    return [_git_program(), "-C", str(folder), *_HOST_ARGS, *extra, *args]


def host_env(env: Mapping[str, str] | None, dirs: GitDirs | None) -> dict[str, str]:
    """The environment of a git run-agent runs: `env` over its own, without a repository of
    anyone else's naming, with `dirs`' when given."""
    merged = {k: v for k, v in os.environ.items() if k not in _LOCATION}
    merged.update({k: v for k, v in (env or {}).items() if k not in _LOCATION})
    for name in ("GIT_INDEX_FILE", "GIT_ALTERNATE_OBJECT_DIRECTORIES"):  # run-agent's own
        if env and name in env and env[name] != os.environ.get(name):
            merged[name] = env[name]
    return {**merged, **(dirs.environment() if dirs else {}), "GIT_TERMINAL_PROMPT": "0"}


def _git_program() -> str:
    from runagent.programs import trusted  # never a git an agent left in its folder

    found = trusted("git")
    if found is None:
        raise MissingDependencyError("git not found on PATH; install git")
    return found


def main_working_tree(
    folder: Path, env: Mapping[str, str] | None = None, dirs: GitDirs | None = None
) -> Path:
    """The main working tree of the repository `folder` is in (its git folder when bare); a
    folder outside any repository is a UsageError naming it. A task's own clone (its worktree)
    stands for the repository it was cloned from, as its task's record names it."""
    if dirs is not None:
        return cloned_from(dirs.common_dir) or dirs.common_dir.parent
    try:
        common = git(folder, "rev-parse", "--path-format=absolute", "--git-common-dir", env=env)
    except GitError:
        raise UsageError(f"{str(folder)!r} is not in a git repository; name one") from None
    origin = cloned_from(Path(common))
    if origin is not None:
        return origin
    if git(folder, "rev-parse", "--is-bare-repository", env=env) == "true":
        return Path(common)
    return Path(common).parent


def cloned_from(common: Path) -> Path | None:
    """The repository a task's clone was made from, when `common` is a task's clone's git
    folder (`<task folder>/worktree.git`, named so in its task's record, which the supervisor
    writes and a sandboxed agent cannot); None for any other git folder."""
    from runagent.store import runfolder

    if common.name != runfolder.WORKTREE_GIT:
        return None
    folder = common.parent
    for name in (runfolder.ISSUE_RECORD, runfolder.WORKTREE_RECORD):
        try:
            data = runfolder.load_yaml((folder / name).read_text(encoding="utf-8"))
        except FileNotFoundError:
            continue
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or not data.get("clone") or not data.get("repo"):
            return None
        if os.path.realpath(str(data.get("git_dir"))) != os.path.realpath(common):
            return None
        return Path(str(data["repo"]))
    return None


def head(folder: Path, dirs: GitDirs | None = None) -> str | None:
    """The commit HEAD names, or None (no commit yet, or not a repository)."""
    try:
        return git(folder, "rev-parse", "--verify", "--quiet", "HEAD^{commit}", dirs=dirs) or None
    except GitError:
        return None


def branch(folder: Path, dirs: GitDirs | None = None) -> str | None:
    """The branch checked out in `folder`; None when HEAD is detached."""
    try:
        return git(folder, "symbolic-ref", "--quiet", "--short", "HEAD", dirs=dirs) or None
    except GitError:
        return None


def commits_between(folder: Path, base: str, tip: str, dirs: GitDirs | None = None) -> list[Commit]:
    """The commits of `base..tip`, newest first, with their whole messages."""
    text = git(folder, "log", "-z", "--no-show-signature", "--format=%H%n%B", f"{base}..{tip}",
               "--", dirs=dirs)  # fmt: skip
    commits = []
    for entry in text.split("\0"):
        sha, _, message = entry.strip("\n").partition("\n")
        if sha:
            commits.append(Commit(sha, message.strip("\n")))
    return commits


def dirty(folder: Path, dirs: GitDirs | None = None) -> bool:
    """Whether the working tree has changes (tracked or untracked, ignored files aside; in a
    submodule, only a change of its commit)."""
    return bool(git(folder, "status", "--porcelain", "--untracked-files=normal",
                    "--ignore-submodules=dirty", dirs=dirs))  # fmt: skip


def short(sha: str | None) -> str:
    return (sha or "")[:12]


def subjects(commits: Sequence[Commit]) -> list[str]:
    return [c.subject for c in commits]
