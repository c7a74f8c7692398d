"""An issue a task works on (number, link, body, repository) and the `COCODE_*` variables its
agent is given, as the cocode agent protocol names them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from runagent.errors import UsageError, shown
from runagent.issues.repository import DEFAULT_READY_MARKER, READY_MARKER_VARIABLE
from runagent.record import record
from runagent.store.credentials import scrub_urls

ISSUE_TIMEOUT = 1800.0  # the protocol's default per-agent timeout: 30 minutes
VARIABLES = (
    "COCODE_REPO_PATH",
    "COCODE_ISSUE_NUMBER",
    "COCODE_ISSUE_URL",
    "COCODE_ISSUE_BODY_FILE",
    READY_MARKER_VARIABLE,
)


@record
class Issue:
    """What an issue run is given: the issue and its body, the repository whose default branch
    its worktree starts from, and the setup command run in a new worktree."""

    number: int
    repo: Path
    body: str
    body_file: Path  # where the body is kept for the agent (the task's ISSUE.md)
    url: str = ""
    setup: tuple[str, ...] = ()

    def environment(self, worktree: Path, env: Mapping[str, str]) -> dict[str, str]:
        """The `COCODE_*` variables of a run in `worktree` (its repository path: the folder the
        agent works and commits in); the marker is the caller's `COCODE_READY_MARKER`, else
        the protocol's default."""
        return {
            "COCODE_REPO_PATH": str(worktree),
            "COCODE_ISSUE_NUMBER": str(self.number),
            "COCODE_ISSUE_URL": scrub_urls(self.url),  # a link: never a credential
            "COCODE_ISSUE_BODY_FILE": str(self.body_file),
            READY_MARKER_VARIABLE: env.get(READY_MARKER_VARIABLE) or DEFAULT_READY_MARKER,
        }


def issue_number(value: object, where: str) -> int:
    """A positive issue number from `value`; else a UsageError naming `where`."""
    try:
        number = int(str(value).strip().lstrip("#"))
    except ValueError:
        raise UsageError(
            f"{where}: {shown(value)} is not an issue number (a whole number)"
        ) from None
    if number <= 0:
        raise UsageError(f"{where}: {number} is not an issue number; give 1 or more")
    return number
