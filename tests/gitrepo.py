"""Real git repositories in temporary folders for the tests, with a neutral identity."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# Given to every git the tests start (and to agents that commit), never written to a git config.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "run-agent test",
    "GIT_AUTHOR_EMAIL": "run-agent-test@example.invalid",
    "GIT_COMMITTER_NAME": "run-agent test",
    "GIT_COMMITTER_EMAIL": "run-agent-test@example.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(folder: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(folder), *args],
        env={**os.environ, **GIT_ENV},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def make_repo(folder: Path, branch: str = "main") -> Path:
    """A repository with one commit on `branch`."""
    folder.mkdir(parents=True, exist_ok=True)
    git(folder, "init", "-q", "-b", branch)
    (folder / "README").write_text("a repository\n")
    git(folder, "add", "README")
    git(folder, "commit", "-q", "-m", "initial commit")
    return folder


def commit(folder: Path, *messages: str, name: str = "work.txt", text: str = "") -> str:
    """Change `name` (adding `text`) and commit it with `-m` for each of `messages`; the sha."""
    with open(folder / name, "a") as f:
        f.write(text or f"{messages[0]}\n")
    git(folder, "add", "-A")
    git(folder, "commit", "-q", *(a for m in messages for a in ("-m", m)))
    return git(folder, "rev-parse", "HEAD")
