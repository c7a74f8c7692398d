"""An index of each task's runs, so that a listing costs what it shows, not the runs in history.

A root a fleet has used for months holds 100,000 runs; `list`, the page and `/metrics` show its
tasks, each with its latest run, and what its runs add up to. Read from the run folders, that
is a YAML parse per run for `/metrics` and one per task for a listing, at every look. Here each
task keeps, in memory and in `ROOT/.index.sqlite` (the standard library's sqlite3) for the next
process: how many runs it has, its latest run's record, the figures its ended runs add to the
metrics (summed, and each one's, so a removal takes its own away), and the runs not ended yet.

The run folders stay the truth, and the index is never trusted over them: each entry keeps the
stamp of what it was read from (the task's `runs/` folder: its inode, links, mtime and ctime; a
run-info.yaml: its inode, size and ctime, which no one but the kernel sets) and is used only
while that is unchanged. A stamp read within `RACY_NS` of its own ctime is looked at again the
next time, as git does with its index: a change within the file system's clock tick leaves the
stamp as it was. A run whose record says it ended is final: its figures are kept, and its record
is looked at again only when its task's `runs/` folder changes, which run-agent makes it do
whenever it writes an ended record (`runfolder.write_run_info`: a run marked `budget`, `stuck`
or `lost_race` after its end). A running run, one without a record (yet), an operations run and
one whose record cannot be read are looked at each time, and read again when their stamp moves.

Only what shows the root reads it: `list`, `watch`, `fleet`, the page and its API, MCP's listing
and `/metrics`. Nothing that decides what runs (the gate, the keeper, budgets, cleanup) does.
The file is a cache: a process that cannot open or write it (a read-only root, a full disk, one
that is not SQLite) goes on from the folders, and `run-agent reindex` builds it afresh.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from runagent.record import record
from runagent.store import runfolder, runinfo, tasks
from runagent.store.host import is_here
from runagent.store.lock import read_holder
from runagent.store.removed import Figures, Sums
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import RunInfo, RunStatus

FILE = ".index.sqlite"  # in the runs root (a hidden name: never taken for a project)
VERSION = 2  # of the tables below; a file of another version is built afresh
RACY_NS = 2_000_000_000  # a stamp read this soon after its change is looked at again
BUSY_MS = 2_000  # how long a write waits for another process's

# The stamp of a folder or a file as it is now (a rewrite by rename is a new inode; a change
# in place moves the ctime, which no one but the kernel sets).
Stamp = tuple[int, ...]
Covers = Callable[[str], bool]  # whether a listing saw every task there is of a P/T's kind

_ENDED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.TIMED_OUT,
                    RunStatus.STOPPED, RunStatus.LOST})  # fmt: skip

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS task (label TEXT PRIMARY KEY, entry TEXT NOT NULL, sums TEXT NOT NULL,
                                 row_key TEXT, row TEXT);
CREATE TABLE IF NOT EXISTS run (label TEXT NOT NULL, run_id TEXT NOT NULL, stamp TEXT NOT NULL,
                                figures TEXT NOT NULL, PRIMARY KEY (label, run_id)) WITHOUT ROWID;
"""


_NO_SUMS = Sums()  # a listing's summaries' (never added to: a scrape asks for its own)


@record
class Summary:
    """A task's runs, as a listing and a scrape need them."""

    count: int  # its run folders
    latest: RunInfo | None  # its latest run with a record, liveness-checked (tasks.effective)
    sums: Sums  # what its final runs add to the metrics
    unsettled: tuple[Figures, ...]  # what each of its other runs with a record adds (running)
    operations: tuple[str, ...]  # its operations runs (which write no run-info), by id


@dataclass
class _Run:
    """A run that is not final: running, without a record (yet), an operations run, or one
    whose record cannot be read."""

    stamp: Stamp | None  # of its run-info.yaml; None: there is none
    read_ns: int
    info: RunInfo | None  # as read; None: no record
    operations: bool = False

    def to_json(self) -> list[Any]:
        kept = self.info is not None and self.info.status is not RunStatus.UNREADABLE
        return [list(self.stamp) if self.stamp else None, self.read_ns,
                self.info.to_dict() if kept and self.info else None, self.operations]  # fmt: skip


class _Final(NamedTuple):
    """An ended run: the stamp its record was read at, when, and what it adds."""

    stamp: Stamp
    read_ns: int
    figures: Figures

    def to_json(self) -> str:
        return json.dumps([list(self.stamp), self.read_ns])

    @classmethod
    def of(cls, stamp: str, figures: str) -> _Final:
        (*found, read_ns) = json.loads(stamp)
        stamped = _stamp_of(found[0])
        if stamped is None:
            raise ValueError("no stamp")
        return cls(stamped, int(read_ns), Figures(*json.loads(figures)))


class _Row(NamedTuple):
    """A settled task's listing row (`TaskView.to_dict`, as JSON text), and the stamps of
    everything it was made from: its `runs/` folder, its latest record, its own folder (DONE,
    race.yaml, usage.json and the queue's leaving note are renamed in and out of it) and its
    lock file (written in place by the next supervisor that takes it)."""

    key: tuple[Any, ...]
    text: str


# A task's status that no process of its own can change without changing a stamp of its row.
_SETTLED = frozenset({tasks.TaskStatus.COMPLETED, tasks.TaskStatus.FAILED,
                      tasks.TaskStatus.TIMED_OUT, tasks.TaskStatus.STOPPED,
                      tasks.TaskStatus.OVER_BUDGET, tasks.TaskStatus.STUCK,
                      tasks.TaskStatus.PENDING})  # fmt: skip


@dataclass
class _Entry:
    stamp: Stamp | None  # of the task's runs/ folder; None: there is none
    read_ns: int
    count: int
    unsettled: dict[str, _Run]
    latest_id: str | None = None  # its newest final run
    latest_data: dict[str, Any] | None = None  # its record as stored: made a RunInfo if asked
    latest_stamp: Stamp | None = None
    sums: Sums = field(default_factory=Sums)
    final: dict[str, _Final] = field(default_factory=dict)  # found final since it was stored
    gone: set[str] = field(default_factory=set)  # final runs removed since it was stored
    changed: bool = True  # to be stored
    _latest: RunInfo | None = None

    @property
    def latest(self) -> RunInfo | None:
        if self._latest is None and self.latest_data is not None:
            self._latest = runinfo.trusted(self.latest_data)
        return self._latest

    @latest.setter
    def latest(self, info: RunInfo | None) -> None:
        self._latest, self.latest_data = info, None

    def latest_unsupervised(self) -> bool:
        """Whether its latest final run names no supervisor of run-agent's (conductor-loop's,
        whose reconciler may rewrite it): asked of the stored record without making it one."""
        data = self.latest_data
        if data is None:
            return self._latest is not None and tasks.unsupervised(self._latest)
        return data.get("supervisor_pid") is None and data.get("host") is None

    def to_json(self) -> str:
        return json.dumps({
            "stamp": list(self.stamp) if self.stamp else None, "read_ns": self.read_ns,
            "count": self.count, "latest_id": self.latest_id,
            "latest": self.latest_data if self._latest is None else self._latest.to_dict(),
            "latest_stamp": list(self.latest_stamp) if self.latest_stamp else None,
            "unsettled": {run_id: run.to_json() for run_id, run in self.unsettled.items()},
        })  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> _Entry:
        data = json.loads(text)
        latest = data["latest"]
        return cls(
            _stamp_of(data["stamp"]), int(data["read_ns"]), int(data["count"]),
            {str(run_id): _Run(_stamp_of(s), int(n), runinfo.trusted(i) if i else None, bool(o))
             for run_id, (s, n, i, o) in data["unsettled"].items()},
            data["latest_id"], latest if isinstance(latest, dict) else None,
            _stamp_of(data["latest_stamp"]), changed=False,
        )  # fmt: skip


def _summed(final: dict[str, _Final], entry: _Entry | None) -> Sums:
    """What `final` runs add up to, with those `entry` found final since."""
    total = Sums()
    for run in (final | entry.final if entry is not None else final).values():
        total.add_run(run.figures)
    return total


def _stamp_of(value: Any) -> Stamp | None:
    return tuple(int(n) for n in value) if value else None


def _row_key(task: TaskPaths, entry: _Entry) -> tuple[Any, ...] | None:
    """The stamps a settled task's row is made from, as they are now (None: not all known)."""
    if entry.latest_id is not None and entry.latest_stamp is None:
        return None  # its latest record was read within its racy window
    folder = _stat(os.fspath(task.folder), follow=False)
    if folder is None or entry.stamp is None:
        return None
    lock = _stat(os.fspath(task.lock), follow=False)
    return (entry.stamp, entry.latest_id, entry.latest_stamp, _folder_stamp(folder),
            _file_stamp(lock) or ())  # fmt: skip


def _holds(folder: str, row: _Row) -> bool:
    """Whether every stamp `row` was made from is as it was, the task's `folder` given."""
    runs, latest_id, latest, own, lock = row.key
    return (
        _folder_stamp(_stat(f"{folder}/runs")) == runs
        and _folder_stamp(_stat(folder, follow=False)) == own
        and (_file_stamp(_stat(f"{folder}/{runfolder.LOCK}", follow=False)) or ()) == lock
        and (latest_id is None or
             _file_stamp(_stat(f"{folder}/runs/{latest_id}/{runfolder.RUN_INFO}", False)) == latest)
    )  # fmt: skip


def _key_of(value: Any) -> tuple[Any, ...]:
    """A row's key as stored (JSON's lists), comparable with one made now."""
    return tuple(tuple(part) if isinstance(part, list) else part for part in value)


def _settled(view: tasks.TaskView, key: tuple[Any, ...], now: int) -> bool:
    """Whether the task's row can only change with one of the stamps of `key`: it has ended
    (or never ran), nothing holds it or may come back to (a lock's note of a holder known by
    its pid alone, or on another host, is looked at each time), it is not queued, raced or an
    operations run's nor conductor-loop's, and no stamp changed within the racy window."""
    if view.status not in _SETTLED or view.queue is not None or view.race is not None:
        return False
    if view.supervisor is not None or view.operations or view.unreadable is not None:
        return False
    if view.latest is not None and tasks.unsupervised(view.latest):
        return False  # conductor-loop's, whose reconciler may rewrite it: read each time
    runs, _, _, folder, lock = key
    if any(now - stamp[-1] < RACY_NS for stamp in (runs, folder, lock) if stamp):
        return False
    if lock:
        holder = read_holder(view.paths.lock)
        if holder is not None and (holder.process_start is None or not is_here(holder.host)):
            return False
    return True


class Index:
    """The index of one runs root, in this process (`for_root` shares one per root); safe to
    use from several threads, and beside other processes using the same file."""

    def __init__(self, root: Path, persist: bool = True) -> None:
        self.root = root
        self.persist = persist  # kept in its file (else in memory: read afresh in each process)
        self._lock = threading.RLock()
        self._entries: dict[str, _Entry] = {}
        self._stored: dict[str, str] = {}  # entries loaded from the file, not decoded yet
        self._rows: dict[str, _Row] = {}  # settled tasks' rows
        self._sums: dict[str, str] = {}  # stored sums of entries loaded, not decoded yet
        self._db: sqlite3.Connection | None = None
        self._loaded = False

    # -- reading -------------------------------------------------------------------------

    def summaries(
        self, found: Iterable[TaskPaths], sums: bool = False, covers: Covers | None = None
    ) -> dict[str, Summary]:
        """Each task of `found` as its runs are now, by P/T (`sums`: with its metrics).
        `covers`: the tasks (P/T) `found` lists all of that there are, so what the index knows
        of any other among them is forgotten (deleted, or gone with its project)."""
        with self._lock:
            self._load()
            now = time.time_ns()
            out = {task.label: self._summary(task, now, sums) for task in found}
            if covers is not None:
                self._forget(lambda label: label not in out and covers(label))
            self._store()
            return out

    def rows(
        self, found: Iterable[TaskPaths], places: Mapping[str, tasks.QueuePlace],
        covers: Covers | None = None,
    ) -> dict[str, str]:  # fmt: skip
        """Each task of `found`'s listing row (`TaskView.to_dict`) as JSON text, by P/T,
        `places` and `covers` as for `tasks.view` and `summaries`. A settled task's row (ended,
        nothing holding it, not queued, no race, no operations run) is kept and given again
        while every stamp it was made from holds: what a look at a thousand such tasks costs is
        five `stat`s each, no file read."""
        with self._lock:
            self._load()
            now = time.time_ns()
            out = {}
            root = os.fspath(self.root)
            for task in found:
                label = task.label
                row = self._rows.get(label)
                if row is not None and label not in places and _holds(f"{root}/{label}", row):
                    out[label] = row.text  # its entry not even decoded
                    continue
                entry = self._fresh(task, now)
                key = None if label in places or entry.unsettled else _row_key(task, entry)
                if key is not None and row is not None and row.key == key:
                    out[label] = row.text
                    continue
                summary = self._summary_of(task, entry, False)
                view = tasks.view(task, places, {label: summary})
                text = out[label] = json.dumps(view.to_dict())
                kept = _Row(key, text) if key and _settled(view, key, now) else None
                if kept != row:
                    if kept is None:
                        del self._rows[label]
                    else:
                        self._rows[label] = kept
                    entry.changed = True
            if covers is not None:
                self._forget(lambda label: label not in out and covers(label))
            self._store()
            return out

    def __len__(self) -> int:
        """How many tasks it knows."""
        return len(self._entries.keys() | self._stored.keys())

    def _forget(self, gone: Callable[[str], bool]) -> None:
        labels = [label for label in self._entries.keys() | self._stored.keys() if gone(label)]
        for label in labels:
            for known in (self._entries, self._stored, self._sums, self._rows):
                known.pop(label, None)
        if labels and self._db is not None:
            try:
                with self._db:
                    self._db.execute("BEGIN IMMEDIATE")
                    for table in ("task", "run"):
                        self._db.executemany(f"DELETE FROM {table} WHERE label = ?",
                                             [(label,) for label in labels])  # fmt: skip
            except sqlite3.OperationalError:  # busy: a stale row is checked by its stamps
                pass
            except sqlite3.Error:
                self._drop()

    def _summary(self, task: TaskPaths, now: int, sums: bool) -> Summary:
        return self._summary_of(task, self._fresh(task, now), sums)

    def _summary_of(self, task: TaskPaths, entry: _Entry, sums: bool) -> Summary:
        latest_id, latest = entry.latest_id, entry.latest
        for run_id, run in entry.unsettled.items():
            if run.info is not None and (latest_id is None or run_id > latest_id):
                latest_id, latest = run_id, run.info
        if latest is not None and latest_id is not None and latest.status is RunStatus.RUNNING:
            latest = tasks.effective(latest, task.run_folder(latest_id))  # or lost
        operations = tuple(run_id for run_id, run in entry.unsettled.items() if run.operations)
        if not sums:
            return Summary(entry.count, latest, _NO_SUMS, (), operations)
        unsettled = tuple(
            Figures.of(tasks.effective(run.info, task.run_folder(run_id)))
            for run_id, run in entry.unsettled.items()
            if run.info is not None and run.info.status is not RunStatus.UNREADABLE
        )
        return Summary(entry.count, latest, self._decoded(task.label, entry), unsettled,
                       operations)  # fmt: skip

    def _decoded(self, label: str, entry: _Entry) -> Sums:
        kept = self._sums.pop(label, None)
        if kept is not None:
            try:
                entry.sums = Sums.from_dict(json.loads(kept))
            except ValueError:
                entry.sums = _summed(self._final_runs(label, None), None)
        return entry.sums

    def _fresh(self, task: TaskPaths, now: int) -> _Entry:
        """The task's entry, brought up to date with its folders."""
        runs = f"{os.fspath(self.root)}/{task.label}/{runfolder.RUNS}"  # no Path made: a look
        st = _stat(runs)  # at a thousand tasks makes this a thousand times
        stamp = _folder_stamp(st)
        entry = self._entry(task.label)
        if entry is None or entry.stamp != stamp or _racy(entry.read_ns, st):
            return self._relist(task, entry, stamp, now)
        for run_id in list(entry.unsettled):
            self._look_again(task, entry, run_id, now)
        if entry.latest_id is not None:  # a final record rewritten after all: read it again
            st = _stat(f"{runs}/{entry.latest_id}/{runfolder.RUN_INFO}", follow=False)
            if _file_stamp(st) != entry.latest_stamp or entry.latest_unsupervised():
                self._read_latest(task, entry, now)
        return entry

    def _relist(self, task: TaskPaths, entry: _Entry | None, stamp: Stamp | None,
                now: int) -> _Entry:  # fmt: skip
        """The task's entry from a fresh listing of its runs: its final runs kept while their
        records' stamps hold, the ones gone taken away, the new and the others read."""
        ids = task.run_ids() if stamp is not None else []
        self._sums.pop(task.label, None)  # counted afresh below
        final = self._final_runs(task.label, entry)
        fresh = _Entry(stamp, now, len(ids), {})
        if entry is not None:  # what it found and could not store yet
            fresh.final, fresh.gone = dict(entry.final), set(entry.gone)
        for run_id in final.keys() - set(ids):
            fresh.gone.add(run_id)
            fresh.final.pop(run_id, None)
            del final[run_id]
        unsettled = entry.unsettled if entry is not None else {}
        runs = os.fspath(task.runs)
        latest_id = None
        for run_id in ids:
            known = final.get(run_id)
            if known is not None:
                st = _stat(f"{runs}/{run_id}/{runfolder.RUN_INFO}", follow=False)
                if _file_stamp(st) == known.stamp and not _racy(known.read_ns, st):
                    latest_id = run_id
                    continue
                fresh.gone.add(run_id)  # rewritten after all: read again, as any other
                fresh.final.pop(run_id, None)
                final.pop(run_id)
            fresh.unsettled[run_id] = unsettled.get(run_id) or _Run(None, 0, None)
            self._look_again(task, fresh, run_id, now)
            if run_id in fresh.final:
                latest_id = run_id
        fresh.sums = _summed(final, fresh)
        self._entries[task.label] = fresh
        if fresh.latest_id != latest_id:  # not the one found final just now
            fresh.latest_id, fresh.latest, fresh.latest_stamp = latest_id, None, None
            if entry is not None and entry.latest_id == latest_id:
                fresh.latest_data, fresh._latest = entry.latest_data, entry._latest
                fresh.latest_stamp = entry.latest_stamp
        if fresh.latest_id is not None and (
            (fresh.latest_data is None and fresh._latest is None) or fresh.latest_unsupervised()
        ):
            self._read_latest(task, fresh, now)
        return fresh

    def _look_again(self, task: TaskPaths, entry: _Entry, run_id: str, now: int) -> None:
        """Read an unsettled run again where its record changed; a run found final moves to
        the final ones. An operations run (its settings in its folder; an agent-mode one has a
        record too) is never final: its events grow as it takes messages."""
        run = entry.unsettled[run_id]
        folder = f"{os.fspath(task.runs)}/{run_id}"
        st = _stat(f"{folder}/{runfolder.RUN_INFO}", follow=False)
        stamp = _file_stamp(st)
        if not run.operations:  # looked for until the run is final (a run folder is made first)
            run.operations = runfolder.is_file_in(task.fence, f"{folder}/{runfolder.OPS_SETTINGS}")
            entry.changed = entry.changed or run.operations
        if stamp is None and run.stamp is None and run.read_ns:
            return  # a run folder without a record (yet), as before
        if stamp != run.stamp or _racy(run.read_ns, st) or run.info is None or (
                run.info.status is RunStatus.UNREADABLE):  # fmt: skip
            info = runfolder.read_run_record(task.run_folder(run_id), task.fence)
            if info is not None and info.status is RunStatus.UNREADABLE and stamp is None:
                info = None
            entry.unsettled[run_id] = run = _Run(stamp, now, info, run.operations)
            entry.changed = True
        info = run.info
        if info is None or info.status not in _ENDED or stamp is None or run.operations:
            return
        figures = Figures.of(info)
        del entry.unsettled[run_id]
        entry.final[run_id] = _Final(stamp, run.read_ns, figures)
        entry.gone.discard(run_id)
        if entry.latest_id is None or run_id > entry.latest_id:
            entry.latest_id, entry.latest = run_id, info
            entry.latest_stamp = stamp if not _racy(run.read_ns, st) else None
        if task.label in self._sums:  # its stored sums, not decoded yet: with this one
            entry.sums = self._decoded(task.label, entry)
        entry.sums.add_run(figures)
        entry.changed = True

    def _read_latest(self, task: TaskPaths, entry: _Entry, now: int) -> None:
        assert entry.latest_id is not None
        folder = task.run_folder(entry.latest_id)
        st = _stat(os.fspath(folder / runfolder.RUN_INFO), follow=False)
        entry.latest = runfolder.read_run_record(folder, task.fence)
        entry.latest_stamp = _file_stamp(st) if not _racy(now, st) else None
        entry.changed = True

    # -- the file ------------------------------------------------------------------------

    def _load(self) -> None:
        """Every task's stored entry, the first time this process looks."""
        if self._loaded or (self.persist and not self.root.is_dir()):  # nothing to know yet
            return
        self._loaded = True
        db = self._open()
        if db is None:
            return
        try:
            rows = db.execute("SELECT label, entry, sums, row_key, row FROM task")
            for label, entry, sums, row_key, row in rows:
                self._stored[label], self._sums[label] = entry, sums
                if row_key and row:
                    with contextlib.suppress(ValueError, TypeError):
                        self._rows[label] = _Row(_key_of(json.loads(row_key)), row)
        except sqlite3.Error:
            self._drop()

    def _entry(self, label: str) -> _Entry | None:
        """The task's entry, decoded from the file's the first time it is asked for."""
        found = self._entries.get(label)
        stored = self._stored.pop(label, None) if found is None else None
        if stored is not None:
            try:
                self._entries[label] = found = _Entry.from_json(stored)
            except (ValueError, TypeError, KeyError):
                return None  # read again from its folders
        return found

    def _final_runs(self, label: str, entry: _Entry | None) -> dict[str, _Final]:
        """The task's final runs as stored, with what `entry` found since and not stored."""
        found: dict[str, _Final] = {}
        if self._db is not None:
            try:
                rows = self._db.execute("SELECT run_id, stamp, figures FROM run WHERE label = ?",
                                        (label,))  # fmt: skip
                for run_id, stamp, figures in rows:
                    with contextlib.suppress(ValueError, TypeError):
                        found[run_id] = _Final.of(stamp, figures)
            except sqlite3.Error:
                self._drop()
        if entry is not None:
            found = {k: v for k, v in found.items() if k not in entry.gone} | entry.final
        return found

    def _store(self) -> None:
        """What changed, written in one transaction; nothing when another process holds the
        file too long, or it cannot be written (the next look reads the folders again)."""
        changed = [(label, e) for label, e in self._entries.items() if e.changed]
        if not changed:
            return
        db = self._db
        if db is not None:
            try:
                with db:
                    db.execute("BEGIN IMMEDIATE")
                    for label, e in changed:
                        db.executemany("DELETE FROM run WHERE label = ? AND run_id = ?",
                                       [(label, run_id) for run_id in e.gone])  # fmt: skip
                        db.executemany(
                            "INSERT OR REPLACE INTO run VALUES (?, ?, ?, ?)",
                            [(label, run_id, f.to_json(), json.dumps(f.figures))
                             for run_id, f in e.final.items()],
                        )  # fmt: skip
                        sums = self._sums.get(label) or json.dumps(e.sums.to_dict())
                        row = self._rows.get(label)
                        db.execute("INSERT OR REPLACE INTO task VALUES (?, ?, ?, ?, ?)",
                                   (label, e.to_json(), sums,
                                    json.dumps(row.key) if row else None,
                                    row.text if row else None))  # fmt: skip
            except sqlite3.OperationalError:  # busy, or no room: kept for the next look
                return
            except sqlite3.Error:
                self._drop()
                return
        for _, e in changed:
            e.changed, e.final, e.gone = False, {}, set()

    def _open(self) -> sqlite3.Connection | None:
        path = self.root / FILE
        if not self.persist:
            self._db = _connect(None)
            return self._db
        try:
            self._db = _connect(path)
        except sqlite3.DatabaseError:  # not an index of this version: built afresh
            with contextlib.suppress(OSError):
                for suffix in ("", "-wal", "-shm"):
                    os.unlink(f"{path}{suffix}")
            try:
                self._db = _connect(path)
            except sqlite3.Error:
                self._db = None
        except (sqlite3.Error, OSError):
            self._db = None
        if self._db is None:  # this process keeps it in memory alone
            self._db = _connect(None)
        return self._db

    def _drop(self) -> None:
        """Go on without the file, in memory (this process): everything known is forgotten
        and read again from the folders, which are the truth."""
        self.close()
        self._loaded = True
        self._db = _connect(None)

    def close(self) -> None:
        """Let go of the file; a later look opens it again."""
        with self._lock:
            if self._db is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._db.close()
            self._db = None
            self._entries, self._sums, self._loaded = {}, {}, False
            self._stored, self._rows = {}, {}


def _connect(path: Path | None) -> sqlite3.Connection:
    """The index file, made if it is not there (private, as everything under a root is), or
    one in memory (None); DatabaseError if it is not an index of this version."""
    if path is not None:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        os.close(os.open(path, flags, runfolder.FILE_MODE))
    db = sqlite3.connect(":memory:" if path is None else path, timeout=BUSY_MS / 1000,
                         isolation_level=None, check_same_thread=False)  # fmt: skip
    try:
        if path is not None:
            db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # a cache: a crash loses at most the last look
        db.executescript(_SCHEMA)
        found = db.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
        if found is None:
            db.execute("INSERT OR IGNORE INTO meta VALUES ('version', ?)", (str(VERSION),))
        elif found[0] != str(VERSION):
            raise sqlite3.DatabaseError(f"an index of version {found[0]}")
    except BaseException:
        db.close()
        raise
    return db


def _stat(path: str, follow: bool = True) -> os.stat_result | None:
    try:
        return os.stat(path, follow_symlinks=follow)
    except OSError:
        return None


def _folder_stamp(st: os.stat_result | None) -> Stamp | None:
    return (st.st_ino, st.st_nlink, st.st_mtime_ns, st.st_ctime_ns) if st else None


def _file_stamp(st: os.stat_result | None) -> Stamp | None:
    return (st.st_ino, st.st_size, st.st_ctime_ns) if st else None


def _racy(read_ns: int, st: os.stat_result | None) -> bool:
    """Whether what was read at `read_ns` may have changed since without its stamp showing it:
    it was changed within `RACY_NS` of the reading."""
    return st is not None and read_ns - st.st_ctime_ns < RACY_NS


_shared: dict[str, Index] = {}  # by root, the one used last at the end
_shared_lock = threading.Lock()
SHARED = 4  # roots whose index a process keeps open at once (a server has one)


def for_root(root: Path) -> Index:
    """This process's index of `root`: one per root, the last few used kept open."""
    key = os.fspath(root)
    with _shared_lock:
        found = _shared.pop(key, None)
        _shared[key] = found = Index(root) if found is None else found
        while len(_shared) > SHARED:
            _shared.pop(next(iter(_shared))).close()
        return found


def enabled() -> bool:
    """Whether listings read through the file (RUN_AGENT_INDEX=off reads every run instead:
    the old path, for a comparison and a doubt)."""
    return os.environ.get("RUN_AGENT_INDEX", "on").strip().lower() not in ("off", "0", "no")


def rebuild(root: Path, found: Iterable[TaskPaths]) -> tuple[int, int]:
    """The index of `root` built afresh from its folders (`run-agent reindex`): (tasks, runs)."""
    path = root / FILE
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{path}{suffix}")
    with _shared_lock:
        _shared.pop(os.fspath(root), None)
    index = Index(root)
    listed = list(found)
    summaries = index.summaries(listed, sums=True)
    index.close()
    return len(listed), sum(s.count for s in summaries.values())
