"""Agent processes: spawned with stdio on files, in their own session, stopped as a whole tree.

Each agent runs under a reaper (`runagent/reaper.py`), a tiny process in its own session that
holds a pipe from the supervisor. The reaper stops the agent's whole tree when asked, when the agent
exits leaving children behind, and when the pipe closes because the supervisor died, even by a
SIGKILL of its whole process group. The agent's stdout and stderr are file descriptors of the run
folder: no copy loop sits in between. A command that runs an agent starts its first reaper's
interpreter as soon as it begins (`start_reaper_early`), so that it boots while the command loads
and prepares; the reaper is told what to start over its pipe.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING

from runagent.errors import RunAgentError
from runagent.record import record
from runagent.store import runfolder

if TYPE_CHECKING:  # imported where a process is started: a listing only asks who is alive
    import subprocess

REAPER = Path(__file__).with_name("reaper.py")
STOP_MARGIN = 10.0  # seconds the reaper gets beyond the grace period before it is overruled


@record
class LaunchSpec:
    """What to start: the whole environment, not an overlay. `stdin=None` means /dev/null.

    `files` are written (when their content differs) just before the start: settings files an
    agent CLI needs, so that building a LaunchSpec stays free of side effects.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path = field(default_factory=Path.cwd)
    stdin: Path | None = None
    files: Mapping[Path, str] = field(default_factory=dict)


class SpawnError(RunAgentError):
    """The agent could not be started; `exit_code` follows the shell (126, 127)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def resolve_executable(argv0: str, env: Mapping[str, str], cwd: Path) -> str | None:
    """The absolute path `argv0` names under `env`'s PATH, or None if there is none."""
    if os.sep in argv0:
        path = Path(argv0) if os.path.isabs(argv0) else cwd / argv0
        return str(path) if path.is_file() and os.access(path, os.X_OK) else None
    # shutil.which's search, without importing shutil (and with it bz2 and lzma) for it.
    for folder in env.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(folder or os.curdir, argv0)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


class AgentProcess:
    """A running agent under its reaper. Use `start`, then `wait` until it returns a code."""

    def __init__(self, reaper: subprocess.Popen[bytes], lifeline: int, report: int) -> None:
        self._reaper = reaper
        self._lifeline = lifeline
        self._report = report
        self._buffer = b""
        self.pid = 0
        self.exit_code: int | None = None

    @classmethod
    def start(cls, spec: LaunchSpec, stdout: Path, stderr: Path, *, grace: float) -> AgentProcess:
        """Start the agent under a reaper (the one started early, if there is one); raise
        SpawnError when it cannot be executed."""
        import json

        if not spec.argv:
            raise SpawnError("the agent's command line is empty", 127)
        exe = resolve_executable(spec.argv[0], spec.env, spec.cwd)
        if exe is None:
            raise SpawnError(f"{spec.argv[0]!r} not found on PATH", 127)
        if not spec.cwd.is_dir():
            raise SpawnError(f"working folder {str(spec.cwd)!r} does not exist", 127)
        for path, content in spec.files.items():
            _write_if_changed(path, content)
        # Opened here first, so that a file the agent cannot have is this process's error.
        for file, flags in ((spec.stdin or os.devnull, os.O_RDONLY),
                            (stdout, os.O_WRONLY | os.O_CREAT | os.O_APPEND),
                            (stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND)):  # fmt: skip
            os.close(runfolder.private(file, flags))
        launch = {
            "exe": os.path.abspath(exe), "argv": list(spec.argv), "env": dict(spec.env),
            "cwd": os.path.abspath(spec.cwd), "grace": grace,
            "stdin": os.path.abspath(spec.stdin) if spec.stdin else None,
            "stdout": os.path.abspath(stdout), "stderr": os.path.abspath(stderr),
        }  # fmt: skip
        if any("\0" in text for text in _texts(launch)):
            raise SpawnError(
                f"could not start the reaper for {exe!r}: embedded null byte in its command or "
                "environment", 126
            )  # fmt: skip
        reaper, lifeline_w, report_r = take_reaper()
        message = b"S" + json.dumps(launch).encode("utf-8", "surrogateescape") + b"\n"
        try:
            view = memoryview(message)
            while view:
                view = view[os.write(lifeline_w, view) :]
        except OSError:
            pass  # the reaper is gone: it reports nothing, and the start fails below
        process = cls(reaper, lifeline_w, report_r)
        process._await_start(exe)
        return process

    def _await_start(self, exe: str) -> None:
        line = self._read_line(timeout=30.0)
        if line.startswith("started "):
            self.pid = int(line.split()[1])
            return
        self.close()
        if line.startswith("error "):
            _, number, message = line.split(" ", 2)
            code = 127 if int(number) == errno.ENOENT else 126
            raise SpawnError(f"cannot execute {exe!r}: {message}", code)
        raise SpawnError(f"the reaper for {exe!r} did not start the agent", 126)

    def _read_line(self, timeout: float | None) -> str:
        """The next report line, '' on timeout, 'eof' when the reaper is gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._report], [], [], remaining)
            if not ready:
                return ""
            chunk = os.read(self._report, 4096)
            if not chunk:
                return "eof"
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    @property
    def pgid(self) -> int:
        return self.pid  # the agent leads its own session and group

    def fileno(self) -> int:
        """Readable when the reaper has something to say (the agent's exit)."""
        return self._report

    def poll(self) -> int | None:
        """The agent's exit code if the reaper has reported it, without blocking."""
        return self.wait(0)

    def wait(self, timeout: float | None) -> int | None:
        """Wait up to `timeout` seconds for the exit code; None if the agent still runs."""
        while self.exit_code is None:
            line = self._read_line(timeout)
            if line == "":
                return None
            if line == "eof":
                self._reaper_lost()
            elif line.startswith("exit "):
                self.exit_code = int(line.split()[1])
        return self.exit_code

    def stop(self, grace: float) -> int:
        """Stop the agent's whole tree (SIGTERM, grace, SIGKILL) and return its exit code."""
        if self.exit_code is not None:
            return self.exit_code
        try:
            os.write(self._lifeline, b"T")
        except OSError:
            pass
        code = self.wait(grace + STOP_MARGIN)
        if code is None:
            self._reaper.kill()
            self._reaper_lost()
            code = self.exit_code
        assert code is not None
        return code

    def _reaper_lost(self) -> None:
        """The reaper died without a report: kill what we can reach, the agent's group."""
        try:
            os.killpg(self.pgid, signal.SIGKILL)
        except OSError:
            pass
        self.exit_code = 128 + signal.SIGKILL

    def close(self) -> None:
        """Release the pipes and collect the reaper. Closing the lifeline stops any tree left."""
        import subprocess  # loaded already: this process was started with it

        for fd in (self._lifeline, self._report):
            try:
                os.close(fd)
            except OSError:
                pass
        self._lifeline = self._report = -1
        try:
            self._reaper.wait(timeout=STOP_MARGIN)
        except subprocess.TimeoutExpired:
            self._reaper.kill()
            self._reaper.wait()


def _texts(launch: dict[str, object]) -> list[str]:
    """Every string of a launch message (an exec cannot pass one holding a NUL byte)."""
    found: list[str] = []
    for value in launch.values():
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list):
            found += [str(v) for v in value]
        elif isinstance(value, dict):
            found += [f"{k}{v}" for k, v in value.items()]
    return found


# A reaper's interpreter started ahead of need (start_reaper_early), with its lifeline's and
# report's ends; taken by the next start.
_Standby = tuple["subprocess.Popen[bytes]", int, int]
_standby: _Standby | None = None


def start_reaper_early() -> None:
    """Start a reaper's interpreter now, so that it boots (about 10 ms) while this process
    loads and prepares its run, not after; the next `AgentProcess.start` takes it. A reaper
    that is never told what to start exits when this process does (its lifeline ends)."""
    global _standby
    if _standby is None:
        _standby = _spawn_reaper()


def drop_reaper_early() -> None:
    """Let a reaper started ahead of need that nothing took go (its lifeline's end tells it to
    exit), and collect it: a loop that ends does not leave one waiting in a long-lived process."""
    global _standby
    standby, _standby = _standby, None
    if standby is None:
        return
    import subprocess  # loaded already: the reaper was started with it

    reaper, lifeline, report = standby
    for fd in (lifeline, report):
        os.close(fd)
    try:
        reaper.wait(timeout=STOP_MARGIN)
    except subprocess.TimeoutExpired:
        reaper.kill()
        reaper.wait()


def take_reaper() -> _Standby:
    """The reaper started early, if it is still there, else one started now."""
    global _standby
    standby, _standby = _standby, None
    if standby is not None and standby[0].poll() is None:
        return standby
    if standby is not None:
        os.close(standby[1])
        os.close(standby[2])
    return _spawn_reaper()


def _spawn_reaper() -> _Standby:
    import subprocess

    lifeline_r, lifeline_w = os.pipe()
    report_r, report_w = os.pipe()
    argv = [sys.executable, "-I", "-S", str(REAPER), str(lifeline_r), str(report_w), "--standby"]
    try:
        reaper = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",  # it enters the agent's folder when told it; until then it holds none
            pass_fds=(lifeline_r, report_w),
            # Its own session, so that a signal to the supervisor's whole group (`timeout -s
            # KILL`, a CI job cancelled) cannot take the reaper down with it: the lifeline's
            # end of file is then what tells it the supervisor is gone.
            start_new_session=True,
        )
    except OSError as exc:
        os.close(lifeline_w)
        os.close(report_r)
        raise SpawnError(f"could not start a reaper: {exc.strerror}", 126) from exc
    finally:
        os.close(lifeline_r)
        os.close(report_w)
    return reaper, lifeline_w, report_r


def _write_if_changed(path: Path, content: str) -> None:
    try:
        if path.read_text(encoding="utf-8") == content:
            return
    except OSError:
        pass
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        runfolder.atomic_write(path, content)
    except OSError as exc:
        raise SpawnError(f"cannot write {str(path)!r} for the agent: {exc.strerror}", 126) from exc
