"""run-agent as a cocode agent: the `COCODE_*` variables a host gives it, read and checked; the
agent's work committed as it goes; the final commit carrying the ready marker; log lines."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from runagent.config import userfile
from runagent.errors import UsageError
from runagent.issues.issue import issue_number
from runagent.issues.repository import (
    DEFAULT_READY_MARKER,
    READY_MARKER_VARIABLE,
    Checkout,
    GitDirs,
    git,
    head,
)
from runagent.record import record
from runagent.store.credentials import scrub_urls


@record
class CocodeRequest:
    """What a cocode host asks of its agent, from the `COCODE_*` variables."""

    repo: Path
    number: int
    url: str
    body_file: Path
    body: str
    marker: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CocodeRequest:
        """Read and check the variables; a missing or wrong one is a UsageError naming it."""
        repo = Path(_required(env, "COCODE_REPO_PATH"))
        if not repo.is_dir() or head(repo) is None:
            raise UsageError(
                f"COCODE_REPO_PATH {str(repo)!r} is not a git repository with a commit; set "
                "it to the worktree the agent is to work in"
            )
        number = issue_number(_required(env, "COCODE_ISSUE_NUMBER"), "COCODE_ISSUE_NUMBER")
        body_file = Path(_required(env, "COCODE_ISSUE_BODY_FILE"))
        data = userfile.read_file(body_file, userfile.MAX_TEXT_BYTES, "COCODE_ISSUE_BODY_FILE")
        try:
            body = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(
                f"COCODE_ISSUE_BODY_FILE {str(body_file)!r} is not UTF-8 text ({exc.reason} at "
                f"byte {exc.start})"
            ) from None
        if not body.strip():
            raise UsageError(f"COCODE_ISSUE_BODY_FILE {str(body_file)!r} is empty")
        marker = env.get(READY_MARKER_VARIABLE, "") or DEFAULT_READY_MARKER
        return cls(repo, number, env.get("COCODE_ISSUE_URL", ""), body_file, body, marker)

    def prompt(self) -> str:
        """The agent's task: the issue, and how its work is taken."""
        link = f" ({scrub_urls(self.url)})" if self.url else ""
        return (
            f"Resolve issue #{self.number}{link} in the git repository you are in "
            f"({self.repo}). Commit your changes as you go. Exit 0 once the issue is resolved "
            "and tested; exit non-zero if you cannot resolve it.\n\n"
            f"## Issue #{self.number}\n\n{self.body}"
        )


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise UsageError(
            f"{name} is not set; a cocode host sets it (see `run-agent cocode --help`)"
        )
    return value


def commit_work(
    folder: Path, message: str, env: Mapping[str, str], dirs: GitDirs | None = None
) -> str | None:
    """Commit every change under `folder` with `message` if there is any (the agent did not
    commit it); the new commit, or None when there was nothing to commit. `dirs`: the git
    folders found before the agent worked there."""
    if not _stage_here(folder, env, dirs):
        return None
    git(folder, "commit", "--quiet", "--no-verify", "-m", message, "--", ".", env=env, dirs=dirs)
    return git(folder, "rev-parse", "HEAD", env=env, dirs=dirs)


def ready_commit(
    checkout: Checkout, request: CocodeRequest, summary: str, env: Mapping[str, str]
) -> str:
    """The final commit, carrying the ready marker: made only when the agent succeeded."""
    commits = len(checkout.commits())
    message = (
        f"Resolve issue #{request.number}\n\n{summary}\n"
        f"{commits} commit{'s' if commits != 1 else ''} since {checkout.base[:12]}.\n\n"
        f"{request.marker}"
    )
    # `--only` with no paths: an empty commit that leaves what others staged out of it.
    dirs = checkout.dirs
    paths = ["--", "."] if _stage_here(request.repo, env, dirs) else ["--allow-empty", "--only"]
    git(request.repo, "commit", "--quiet", "--no-verify", "-m", message, *paths, env=env,
        dirs=dirs)  # fmt: skip
    return git(request.repo, "rev-parse", "HEAD", env=env, dirs=dirs)


def _stage_here(folder: Path, env: Mapping[str, str], dirs: GitDirs | None) -> bool:
    """Stage every change under `folder`, and say whether there is any. COCODE_REPO_PATH may
    be a subfolder of its repository: what lies outside it is never run-agent's to commit,
    so every commit here names `.` (and takes nothing else that was staged)."""
    git(folder, "add", "--all", "--", ".", env=env, dirs=dirs)
    return bool(git(folder, "diff", "--cached", "--name-only", "--ignore-submodules=dirty", "--",
                    ".", env=env, dirs=dirs))  # fmt: skip


def log_line(level: str, message: str, now: datetime | None = None) -> str:
    """One log line as the protocol shows them: JSON with timestamp, level and message."""
    moment = now or datetime.now(UTC)
    stamp = moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    return json.dumps({"timestamp": stamp, "level": level, "message": message})
