"""Stuck detection: an agent that makes no progress is stopped, saying what it saw.

Judged between attempts, never during one: a long attempt that is still producing output is
the idle timeout's business, not this. Two signs, each over `stuck_after` attempts in a row
(rate-limited runs are not counted; a run that completes the task ends the loop anyway):

- the same failure: the same exit code and the same last lines of output, once numbers, hex
  ids, times and colour codes are set aside (they differ from run to run of the same mistake);
  for a run whose check failed (it said it was done), the check's exit code and the last lines
  of the check's output;
- no change to the working folder: in a git working tree, the same `HEAD` and the same
  uncommitted changes (status and diff) after the attempt as before it; elsewhere, no file
  under it written since the attempt began (a bounded walk, which takes "too many files to
  look at" for a change, and skips `.git` and the runs root).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from runagent.errors import RunAgentError
from runagent.record import record
from runagent.store import runfolder
from runagent.store.runinfo import Reason, RunInfo, RunStatus

if TYPE_CHECKING:
    from runagent.issues.repository import GitDirs

TAIL_BYTES = 8192  # of stdout and of stderr, read for a failure's signature
TAIL_LINES = 20  # non-empty lines compared
WALK_LIMIT = 50_000  # entries looked at before a folder counts as changed (too big to tell)
GIT_TIMEOUT = 30.0
CLOCK_SLACK_NS = 20_000_000

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
_VARIES = re.compile(r"\b[0-9a-f]{7,}\b|\d+(?:\.\d+)?", re.IGNORECASE)


def normalize(text: str) -> list[str]:
    """The last non-empty lines of `text` with what varies between runs of the same failure
    (colour codes, numbers, hex ids, times, paths' run ids) set aside."""
    lines = []
    for line in _ANSI.sub("", text).splitlines():
        line = " ".join(_VARIES.sub("#", line).split())
        if line:
            lines.append(line)
    return lines[-TAIL_LINES:]


def signature(info: RunInfo, run_folder: Path) -> tuple[str, str] | None:
    """A failed run's failure as (a key to compare, the line that says it); None for a run
    that did not fail."""
    if info.status is not RunStatus.FAILED:
        return None
    import hashlib  # only a failed run pays for it (OpenSSL's library loads with it)

    paths = runfolder.RunPaths(run_folder)
    if info.reason is Reason.CHECK_FAILED:  # the agent said done: how its check failed counts
        said = normalize(runfolder.tail(paths.check, TAIL_BYTES))
        key = "\n".join([f"check {info.check_command} exit {info.check_exit_code}", *said])
        last = runfolder.tail(paths.check, 1024).strip().splitlines() or [info.message or ""]
        return hashlib.sha256(key.encode()).hexdigest(), last[-1][:120]
    out = normalize(runfolder.tail(paths.stdout, TAIL_BYTES))
    err = normalize(runfolder.tail(paths.stderr, TAIL_BYTES))
    key = "\n".join([f"exit {info.exit_code} {info.reason}", *out, "--", *err])
    last = runfolder.tail(paths.stderr, 1024).strip().splitlines() or [info.message or ""]
    return hashlib.sha256(key.encode()).hexdigest(), last[-1][:120]


@record
class Progress:
    """What the working folder looked like when an attempt began."""

    folder: Path
    began_ns: int  # the attempt's start, as file times count
    git: str | None  # HEAD and the uncommitted changes, digested; None: not a git working tree
    skip: tuple[Path, ...] = ()  # not looked at (the runs root, when it lies inside)
    dirs: GitDirs | None = None  # the checkout's git folders, named (None: found in `folder`)

    @classmethod
    def before(
        cls, folder: Path, env: Mapping[str, str], skip: tuple[Path, ...] = (),
        dirs: GitDirs | None = None,
    ) -> Progress:  # fmt: skip
        # File times come from a coarser clock than time_ns(): a write just after this
        # instant may be stamped a few milliseconds before it.
        began = time.time_ns() - CLOCK_SLACK_NS
        return cls(folder, began, _git_state(folder, env, skip, dirs), skip, dirs)

    def changed(self, env: Mapping[str, str]) -> bool:
        """Whether the attempt changed the folder (committed, edited, or wrote any file)."""
        if self.git is not None:
            return _git_state(self.folder, env, self.skip, self.dirs) != self.git
        return _written_since(self.folder, self.began_ns, self.skip)

    def how(self) -> str:
        """What "changed nothing" meant, in words."""
        return "same commit and diff" if self.git is not None else "no file written"


def _git_state(
    folder: Path, env: Mapping[str, str], skip: tuple[Path, ...], dirs: GitDirs | None
) -> str | None:
    """A digest of HEAD, the status and the diff of the working tree at `folder`, but for the
    folders in `skip` that lie inside it; None when it is not one (or git cannot tell)."""
    inside = [os.path.relpath(p, folder) for p in skip if _within(p, folder)]
    paths = ["--", ".", *(f":(exclude){p}" for p in inside)]
    import hashlib

    from runagent.issues.repository import host_argv, host_env

    digest = hashlib.sha256()

    for args in (["rev-parse", "--is-inside-work-tree", "HEAD"],
                 ["status", "--porcelain=v1", "--untracked-files=all",
                  "--ignore-submodules=dirty", *paths],
                 ["diff", "HEAD", "--no-ext-diff", "--no-textconv", "--ignore-submodules=dirty",
                  "--binary", *paths]):  # fmt: skip
        try:
            done = subprocess.run(
                host_argv(folder, *args), env=host_env(env, dirs), stdin=subprocess.DEVNULL,
                capture_output=True, timeout=GIT_TIMEOUT, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired, RunAgentError):
            return None
        if done.returncode != 0:
            return None
        digest.update(done.stdout)
    return digest.hexdigest()


def _within(path: Path, folder: Path) -> bool:
    try:
        Path(os.path.abspath(path)).relative_to(os.path.abspath(folder))
    except ValueError:
        return False
    return True


def _written_since(folder: Path, since_ns: int, skip: tuple[Path, ...]) -> bool:
    """Whether any file under `folder` was written since `since_ns`; True too when there are
    more entries than can be looked at (no progress is never claimed without looking)."""
    skipped = {os.path.abspath(p) for p in skip}
    seen = 0
    for top, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != ".git" and os.path.join(top, d) not in skipped]
        for name in [*files, *dirs]:
            seen += 1
            if seen > WALK_LIMIT:
                return True
            try:
                if os.lstat(os.path.join(top, name)).st_mtime_ns >= since_ns:
                    return True
            except OSError:
                continue
    return False
