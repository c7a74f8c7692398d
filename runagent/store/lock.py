"""The task lock: one supervisor per task, released by the kernel when its holder dies.

The lock is an flock on the task's `.lock` file; its content names the holder (pid, process start
time, since when) so that a second supervisor can say who is running, and readers can tell a live
holder from a stale note left by a crash without ever touching the lock themselves.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from runagent.errors import AlreadyRunningError
from runagent.record import record
from runagent.store.host import foreign_alive, is_here, this_host
from runagent.store.pids import is_alive, process_start_time
from runagent.store.runfolder import dump_yaml, load_yaml, make_folder, open_regular, private


@record
class Holder:
    """Who holds a task, as its lock file says: a process known by its pid and start time, so
    a pid used again by another process is no holder; on this host or another."""

    pid: int
    process_start: float | None
    since: str
    host: str | None = None  # None: a note written before holders named their host
    task: str = ""  # the label of the task it holds

    def alive(self) -> bool:
        if is_here(self.host):
            return is_alive(self.pid, self.process_start)
        assert self.host is not None
        return foreign_alive(self.task, self.host, self.pid, self.process_start)

    def describe(self, host: bool = False) -> str:
        """Which supervisor it is, in words: its pid, and its host when that is another (or
        always, with `host`: a task that runs on a cluster, of which this may be a host)."""
        named = self.host is not None and (host or not is_here(self.host))
        return f"pid {self.pid}" + (f" on host {self.host}" if named else "")


def read_holder(path: Path, label: str = "") -> Holder | None:
    """Who the lock file says holds it (alive or not), or None if it names nobody."""
    try:
        with open_regular(path) as f:  # a lock file is never a link: one swapped in is no one
            data = load_yaml(f.read().decode("utf-8"))
        host = data.get("host")
        return Holder(
            int(data["pid"]),
            data.get("process_start"),
            str(data["since"]),
            str(host) if host else None,
            label or f"{path.parent.parent.name}/{path.parent.name}",
        )
    except (OSError, TypeError, KeyError, ValueError, AttributeError):  # ValueError: not YAML
        return None


def live_holder(path: Path) -> Holder | None:
    holder = read_holder(path)
    return holder if holder is not None and holder.alive() else None


def already_running(label: str, holder: Holder | None, host: bool = False) -> str:
    """The one wording of "another supervisor holds this task" (naming its host when that is
    another, or always with `host`)."""
    if holder is None:
        return f"task {label} is already running (its supervisor is starting)"
    described = holder.describe(host)
    return f"task {label} is already running (supervisor {described} since {holder.since})"


class TaskLock:
    """Held for the life of a supervisor; `label` names the task in the "already running" error."""

    def __init__(self, path: Path, label: str) -> None:
        self.path = path
        self.label = label
        self._fd: int | None = None

    def acquire(self, wait: Callable[[str], None] | None = None) -> Holder:
        """Take the lock; when another holds it, refuse (AlreadyRunningError), or with `wait`,
        tell it why (the refusal's words) and wait for the lock."""
        make_folder(self.path.parent)
        fd = private(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if wait is None:
                os.close(fd)
                raise AlreadyRunningError(self._busy_message()) from None
            try:
                wait(self._busy_message())
                fcntl.flock(fd, fcntl.LOCK_EX)  # a signal's exception ends the wait
            except BaseException:
                os.close(fd)
                raise
        pid = os.getpid()
        since = datetime.now(UTC).isoformat(timespec="seconds")
        holder = Holder(pid, process_start_time(pid), since, this_host(), self.label)
        note = dump_yaml(
            {
                "pid": holder.pid,
                "process_start": holder.process_start,
                "since": holder.since,
                "host": holder.host,
            }
        )
        os.ftruncate(fd, 0)
        os.pwrite(fd, note.encode(), 0)
        self._fd = fd
        return holder

    def _busy_message(self) -> str:
        return already_running(self.label, read_holder(self.path, self.label))

    def release(self) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the descriptor drops the flock
        self._fd = None

    def __enter__(self) -> TaskLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
