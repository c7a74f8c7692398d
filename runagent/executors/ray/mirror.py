"""A task's folder on a host that does not share the server's runs root: sent to the server's
root as it grows (Mirror), received there (the HOME actor `serve` holds), and taken back from it
by a loop started again on another host after its own died (seed). Without a server holding
HOME, nothing is sent: the folder stays on its host, whose agent serves reads of it."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import ray

import runagent.executors.ray.boundary as boundary
from runagent.executors.ray.boundary import ClusterError, GoneError
from runagent.store import runfolder
from runagent.store.runfolder import TaskPaths

HOME = "home"  # the actor name of the server's runs root (serve holds it)
COPY_CHUNK = 4 << 20
HOME_RECHECK = 5.0  # seconds between looks for a server holding HOME
SEED_LIMIT = 1 << 20  # bytes of one file a restarted loop takes from the server's copy
# Files that only grow: mirrored by their new bytes (SSE offsets stay those of the original).
GROWING = {runfolder.STDOUT, runfolder.STDERR, runfolder.SUPERVISOR_LOG}
# Not taken by a restarted loop: what only grows (sent by offset, which a copy would break) and
# the lock, which is the dead host's.
SEEDED_NOT = {*GROWING, runfolder.LOCK}


class Mirror:
    """A task's folder, copied to the server's root (the HOME actor `serve` holds) as it grows:
    files that only grow (the agent's output, supervisor.log) by their new bytes, the others
    (run-info.yaml, DONE, TASK.md) whole and atomically when they change. Without a server
    holding HOME, nothing is sent; the folder stays here, where `read` serves it."""

    def __init__(self, task: TaskPaths) -> None:
        self.task = task
        self.prefix = f"{task.project_id}/{task.task_id}"
        self.sent: dict[str, tuple[int, int]] = {}  # file -> (size, mtime) last sent
        self.home: Any = None
        self.looked = -HOME_RECHECK
        self.lock = threading.Lock()

    def _find_home(self, final: bool) -> Any:
        due = final or time.monotonic() - self.looked > HOME_RECHECK
        if self.home is None and due:
            self.looked = time.monotonic()
            try:
                self.home = boundary.actor(HOME, ray.get_runtime_context().namespace)
            except GoneError:
                return None
        return self.home

    def sync(self, final: bool = False) -> None:
        """Send what changed; one pass at a time (a stop's final pass waits for the watch's
        pass in flight, so an older run-info.yaml never lands after the last one), and DONE
        last, as the supervisor writes it: a reader of the server's root never sees DONE
        beside a run-info.yaml that still says running."""
        with self.lock:
            self._sync(final)

    def _sync(self, final: bool) -> None:
        home = self._find_home(final)
        if home is None:
            return
        # The records (run-info.yaml, DONE, ...) are read before the output they speak of and
        # sent after it: a run-info.yaml that says its run ended reaches the server only with
        # all the output written before it, so a reader there never takes an ended run's
        # output for whole while its last lines are still on their way.
        paths = sorted(self.task.folder.rglob("*"), key=lambda p: (p.name == runfolder.DONE, p))
        records = []
        for path in paths:
            if path.name not in GROWING:
                try:  # the lock's note too: the server's view says who runs it
                    if (changed := self._changed(path)) is not None:
                        records.append((path, changed))
                except (FileNotFoundError, IsADirectoryError):  # renamed meanwhile, or a
                    continue  # folder: the rest is still sent, and it next time
        try:
            for path in paths:
                if path.name in GROWING:
                    try:
                        self._grow(home, path)
                    except FileNotFoundError:
                        continue
            for path, (st, data) in records:
                self._replace(home, path, st, data)
        except ClusterError:  # the server went away: look for one again later
            self.home = None

    def _grow(self, home: Any, path: Path) -> None:
        relative = self._relative(path)
        st = path.stat()
        size, mtime = self.sent.get(relative, (0, 0))
        if (st.st_size, st.st_mtime_ns) == (size, mtime):
            return
        if st.st_size < size:  # cut short (truncated by hand): sent whole again
            self._replace(home, path, st, path.read_bytes())
            return
        name = f"{self.prefix}/{relative}"
        with open(path, "rb") as f:
            f.seek(size)
            offset = size
            while offset < st.st_size and (chunk := f.read(COPY_CHUNK)):
                boundary.call(home.put, name, offset, chunk)
                offset += len(chunk)
        if st.st_size == 0:
            boundary.call(home.put, name, 0, b"")
        self.sent[relative] = (st.st_size, st.st_mtime_ns)

    def _changed(self, path: Path) -> tuple[os.stat_result, bytes] | None:
        """A record's bytes and the stat of the very file they were read from (one replaced by
        a rename meanwhile is either the old or the new, whole); None if it is as last sent."""
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if (st.st_size, st.st_mtime_ns) == self.sent.get(self._relative(path), (0, 0)):
                return None
            return st, f.read()

    def _relative(self, path: Path) -> str:
        return str(path.relative_to(self.task.folder))

    def _replace(self, home: Any, path: Path, st: os.stat_result, data: bytes) -> None:
        relative = self._relative(path)
        boundary.call(home.replace, f"{self.prefix}/{relative}", data)
        self.sent[relative] = (st.st_size, st.st_mtime_ns)


def seed(task: TaskPaths, namespace: str) -> None:
    """Started again on this host after another died, with a root of its own: take the task's
    record from the server's copy (its runs' run-info, TASK.md, task.yaml), so the loop goes on
    where it was: the interrupted run is marked lost, the next numbered on."""
    try:
        home = boundary.actor(HOME, namespace)
        found: Any = boundary.call(home.task_files, task.project_id, task.task_id)
        files: dict[str, bytes] = dict(found)
    except ClusterError:
        return  # no server holds the copy: the loop starts from this host's root
    for relative, data in files.items():
        path = task.folder / relative
        if not runfolder.within(task.root, path) or path.exists():
            continue
        runfolder.make_folder(path.parent)
        runfolder.atomic_write_bytes(path, data)


class _Home:
    """The server's runs root, as hosts that do not share it send finished task folders to it;
    held by `serve` (a non-detached actor on its own host, named HOME)."""

    def __init__(self, root: str) -> None:
        self.root = Path(root).resolve()

    def put(self, relative: str, offset: int, data: bytes) -> None:
        path = (self.root / relative).resolve()
        if not path.is_relative_to(self.root):
            raise ValueError(f"{relative!r} is outside the runs root")
        runfolder.make_folder(path.parent)
        with open(path, "r+b" if offset else "wb", opener=runfolder.private) as f:
            f.seek(offset)
            f.write(data)

    def task_files(self, project_id: str, task_id: str) -> dict[str, bytes]:
        """The small files that record a task (not its agents' output, nor its lock), by path
        relative to its folder: what a loop restarted on a host with an empty root starts
        from."""
        folder = (self.root / project_id / task_id).resolve()
        if not folder.is_relative_to(self.root) or not folder.is_dir():
            return {}
        found: dict[str, bytes] = {}
        for path in folder.rglob("*"):
            if path.is_symlink() or not path.is_file() or path.name in SEEDED_NOT:
                continue
            if path.stat().st_size <= SEED_LIMIT:
                found[str(path.relative_to(folder))] = path.read_bytes()
        return found

    def replace(self, relative: str, data: bytes) -> None:
        """Write a whole file atomically (a reader never sees half a run-info.yaml)."""
        path = (self.root / relative).resolve()
        if not path.is_relative_to(self.root):
            raise ValueError(f"{relative!r} is outside the runs root")
        runfolder.make_folder(path.parent)
        runfolder.atomic_write_bytes(path, data)  # flushed to disk, as every record is


RemoteHome: Any = ray.remote(_Home)
