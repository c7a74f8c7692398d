"""The shell operation: one command run under the project's reaper, its tree killed on timeout.

The command runs as `bash -c` (else `sh -c`) in a folder of the workspace, in its own session,
with a small environment (PATH, HOME, locale, TMPDIR and the operation's `env`), so that the
runtime's own secrets are not handed to what a model wrote. stdout and stderr go to files, as an
agent's do, and come back cut to a cap, marked where they were cut. Under a sandbox (see
`sandbox`) the same command runs inside bubblewrap, still under the reaper.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from runagent.ops.protocol import SHELL_EXIT_TIMED_OUT
from runagent.ops.sandbox import Bwrap
from runagent.process import AgentProcess, LaunchSpec, SpawnError
from runagent.record import record

OUTPUT_CAP = 1024 * 1024  # bytes of each stream handed back in the event
OUTPUT_LIMIT = 64 * 1024 * 1024  # bytes of both streams on disk before the command is stopped
KILL_GRACE = 2.0  # seconds between SIGTERM and SIGKILL for a tree that timed out
PASSED_ON = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "TMPDIR")
NOT_RUN = 126  # the shell's code for a command that could not be executed
CHECK_EVERY = 0.5  # seconds between looks at the output's size while the command runs


@record
class ShellResult:
    exit_code: int
    stdout: str
    stderr: str
    duration_ms: int
    timed_out: bool = False
    error: str | None = None  # the command could not start, or was stopped for its output


def shell_environment() -> dict[str, str]:
    """The variables of this process a shell command is given (the rest may hold secrets)."""
    return {k: os.environ[k] for k in PASSED_ON if k in os.environ}


def run_shell(
    command: str, cwd: Path, timeout_ms: int, env: Mapping[str, str],
    sandbox: Bwrap | None = None, shell: str | None = None, scratch: Path | None = None,
) -> ShellResult:  # fmt: skip
    """Run `command` in `cwd` with exactly `env`, for at most `timeout_ms`; a timeout stops its
    whole tree. Under `sandbox`, or not at all when that sandbox cannot be built here. `shell`
    is the program that runs it with `-c` (default bash, else sh). Its output is captured in a
    folder made in `scratch` (the run's folder: one a killed process leaves behind belongs to
    the run, not to the machine's temporary folder), else in the temporary folder."""
    shell = shell or shutil.which("bash", path=env.get("PATH", os.defpath)) or "/bin/sh"
    argv: tuple[str, ...] = (shell, "-c", command)
    if sandbox is not None:
        problem = sandbox.problem()
        if problem is not None:
            return ShellResult(NOT_RUN, "", "", 0, error=f"{problem}; the command was not run")
        argv = sandbox.argv(argv, cwd)
    spec = LaunchSpec(argv=argv, env=dict(env), cwd=cwd)
    with tempfile.TemporaryDirectory(prefix=".shell-", dir=scratch) as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        started = time.monotonic()
        try:
            process = AgentProcess.start(spec, out, err, grace=KILL_GRACE)
        except SpawnError as exc:
            return ShellResult(exc.code, "", "", _ms(started), error=str(exc))
        timed_out, error = False, None
        try:
            deadline = started + timeout_ms / 1000
            while process.wait(min(CHECK_EVERY, max(0.0, deadline - time.monotonic()))) is None:
                if time.monotonic() >= deadline:
                    timed_out = True
                elif _size(out) + _size(err) > OUTPUT_LIMIT:
                    error = f"the command wrote more than {OUTPUT_LIMIT} bytes and was stopped"
                else:
                    continue
                process.stop(KILL_GRACE)
                break
            code = SHELL_EXIT_TIMED_OUT if timed_out else process.exit_code
        finally:
            process.close()
        assert code is not None
        return ShellResult(code, _capture(out), _capture(err), _ms(started), timed_out, error)


def _ms(started: float) -> int:
    return round((time.monotonic() - started) * 1000)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _capture(path: Path) -> str:
    """The stream's text, its first OUTPUT_CAP bytes and a note of the size when it is longer."""
    size = _size(path)
    with open(path, "rb") as f:
        data = f.read(OUTPUT_CAP)
    text = data.decode("utf-8", errors="replace")
    if size > OUTPUT_CAP:
        text += f"\n[output cut: {size} bytes, the first {OUTPUT_CAP} shown]\n"
    return text
