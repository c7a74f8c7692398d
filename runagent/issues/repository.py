"""A git repository as run-agent reads it: HEAD, branches, and the commits made since a base."""

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


@record
class Commit:
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

    @classmethod
    def at(cls, folder: Path, base: str | None = None) -> Checkout:
        """The checkout of `folder`, its base `base` or else its HEAD now; a folder that is not
        in a git repository (or one without a commit) is a UsageError naming it."""
        try:
            top = Path(git(folder, "rev-parse", "--show-toplevel"))
        except GitError:
            raise UsageError(
                f"{folder} is not in a git repository; completion by ready marker reads its "
                "commits: run in a repository (or use --issue with --repo)"
            ) from None
        start = base or head(top)
        if start is None:
            raise UsageError(f"the repository at {top} has no commit yet; commit something first")
        return cls(top, start, branch(top), main_working_tree(top))

    def head(self) -> str | None:
        return head(self.folder)

    def commits(self) -> list[Commit]:
        """The commits reachable from HEAD but not from the base, newest first."""
        return commits_between(self.folder, self.base, "HEAD")

    def find(self, marker: str) -> Commit | None:
        """The newest commit since the base whose message carries `marker`, if any."""
        return next((c for c in self.commits() if marker in c.message), None)


def git(folder: Path, *args: str, env: Mapping[str, str] | None = None, check: bool = True) -> str:
    """Run `git -C folder ARGS`; its stdout without the final newline. A failure is a GitError
    with git's own words (unless `check` is off: then the output, whatever the exit)."""
    done = run_git(folder, *args, env=env)
    if check and done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        line = f"`git {' '.join(args)}` in {folder} failed: {' / '.join(said)}"
        raise GitError(scrub_urls(line))  # a remote's URL may hold a password
    return done.stdout.removesuffix("\n")


def run_git(
    folder: Path, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`git -C folder ARGS` as it ended, for a caller that reads its exit code (a conflict, an
    ancestry); never a prompt for credentials."""
    try:
        return subprocess.run(
            ["git", "-C", str(folder), *args],
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {}), "GIT_TERMINAL_PROMPT": "0"},
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        raise MissingDependencyError("git not found on PATH; install git") from None


def main_working_tree(folder: Path, env: Mapping[str, str] | None = None) -> Path:
    """The main working tree of the repository `folder` is in (its git folder when bare); a
    folder outside any repository is a UsageError naming it."""
    try:
        common = git(folder, "rev-parse", "--path-format=absolute", "--git-common-dir", env=env)
    except GitError:
        raise UsageError(f"{str(folder)!r} is not in a git repository; name one") from None
    if git(folder, "rev-parse", "--is-bare-repository", env=env) == "true":
        return Path(common)
    return Path(common).parent


def head(folder: Path) -> str | None:
    """The commit HEAD names, or None (no commit yet, or not a repository)."""
    try:
        return git(folder, "rev-parse", "--verify", "--quiet", "HEAD^{commit}") or None
    except GitError:
        return None


def branch(folder: Path) -> str | None:
    """The branch checked out in `folder`; None when HEAD is detached."""
    try:
        return git(folder, "symbolic-ref", "--quiet", "--short", "HEAD") or None
    except GitError:
        return None


def commits_between(folder: Path, base: str, tip: str) -> list[Commit]:
    """The commits of `base..tip`, newest first, with their whole messages."""
    text = git(folder, "log", "-z", "--format=%H%n%B", f"{base}..{tip}", "--")
    commits = []
    for entry in text.split("\0"):
        sha, _, message = entry.strip("\n").partition("\n")
        if sha:
            commits.append(Commit(sha, message.strip("\n")))
    return commits


def dirty(folder: Path) -> bool:
    """Whether the working tree has changes (tracked or untracked, ignored files aside)."""
    return bool(git(folder, "status", "--porcelain", "--untracked-files=normal"))


def short(sha: str | None) -> str:
    return (sha or "")[:12]


def subjects(commits: Sequence[Commit]) -> list[str]:
    return [c.subject for c in commits]
