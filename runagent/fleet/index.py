"""The queue's index: what the queue's order and caps need of each record (its place, project,
agent, limits, whether it is eligible, detached, waited for), kept in `.fleet/queue.db` (the
standard library's sqlite3), so that an admission, a hand-over or a listing of one task reads
what it touches and not every record in `.fleet/queue/`.

The folder stays the truth; the index is never trusted over it. Every change to a record is
made under the queue's lock in three steps: the record's name is written down as `dirty` in
the index, the file is written or removed, and its row is written with the name taken off and
the folder's modification time (`mtime`) noted. A process killed between them leaves the name
dirty, and the next look re-reads that one record; a folder changed by anything else (a person,
an older run-agent) no longer has the noted time, and the next writer builds the index again
from every record, as it does when the index is missing, damaged or of another schema. A reader
without the lock (a listing) that finds it out of step reads the dirty records afresh, or the
whole folder, and leaves the index to the writers.

A record's row holds no start (argv, environment): whoever starts a task reads its record.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar

W = TypeVar("W")  # a queue record (fleet.queue.Waiting), which this module does not import
R = TypeVar("R", covariant=True)

NAME = "queue.db"
WRITES_WAITED = (
    20  # looks, 10 ms apart, a reader gives a write under way before it reads the folder
)
SCHEMA = "4"  # bumped when the rows change: an index of another schema is built again
COLUMNS = ("name", "project", "task", "agent", "seq", "rank", "submitted", "after", "joined",
           "blocked", "told", "waiter", "waiter_started", "detached", "limits", "unreadable",
           "eligible", "changed")  # fmt: skip
TABLES = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS dirty (name TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS waiting ({", ".join(COLUMNS)}, PRIMARY KEY (name));
CREATE INDEX IF NOT EXISTS turn ON waiting (eligible, rank, seq);
CREATE INDEX IF NOT EXISTS fresh ON waiting (changed);
CREATE INDEX IF NOT EXISTS caps ON waiting (eligible, limits);
CREATE INDEX IF NOT EXISTS waiters ON waiting (name) WHERE waiter IS NOT NULL;
CREATE INDEX IF NOT EXISTS damaged ON waiting (name) WHERE unreadable IS NOT NULL;
CREATE INDEX IF NOT EXISTS pending ON waiting (name)
    WHERE joined = 0 AND blocked IS NULL AND unreadable IS NULL;
CREATE INDEX IF NOT EXISTS stuck ON waiting (rank, seq)
    WHERE blocked IS NOT NULL AND unreadable IS NULL;
CREATE INDEX IF NOT EXISTS afters ON waiting (name) WHERE after != '[]';
CREATE INDEX IF NOT EXISTS keeps ON waiting (name) WHERE detached = 1 AND blocked IS NULL;
"""
# Stands for a detached record's start in a record read from the index: `start is not None`
# says it is detached; `Fleet.put` takes the start itself from the record's file.
IN_FILE: Mapping[str, Any] = MappingProxyType({"in_file": True})


class Stale(Exception):
    """The index is out of step with the folder, and this reader may not mend it."""


class Source(Protocol[R]):
    """The queue an index is of (fleet.queue.Fleet): its folders, and its records as read from
    their files and as made from the index's rows."""

    folder: Path
    queue: Path

    def read_record(self, name: str) -> R | None: ...

    def from_row(self, row: tuple[Any, ...]) -> R: ...


class Index(Generic[W]):
    """The index of one runs root's queue, open for one look or change."""

    def __init__(self, fleet: Source[W], db: sqlite3.Connection) -> None:
        self.fleet = fleet
        self.db = db
        self._in_step = False  # the folder as noted when the change under way began

    # Changes, under the queue's lock.

    def mark(self, name: str) -> None:
        """Write down that record `name` is about to change."""
        # Whether the folder is as noted until this change: only then is the time after it
        # noted (a change by another hand meanwhile keeps the index out of step, to be built
        # again).
        self._in_step = self._noted_time() == _mtime(self.fleet)
        with self.db:
            self.db.execute("INSERT OR IGNORE INTO dirty VALUES (?)", (name,))

    def settle(self, name: str, waiting: W | None) -> None:
        """Record `name` changed to `waiting` (None: removed): its row, the name no longer
        dirty, the folder's time noted if it was in step before."""
        with self.db:
            self._row(name, waiting)
            self.db.execute("DELETE FROM dirty WHERE name = ?", (name,))
            if self._in_step:
                self._note_time()

    def _row(self, name: str, waiting: W | None) -> None:
        if waiting is None:
            self.db.execute("DELETE FROM waiting WHERE name = ?", (name,))
            return
        changed = self._counter()
        row = _row(name, waiting, changed)
        self.db.execute(
            f"INSERT OR REPLACE INTO waiting VALUES ({', '.join('?' * len(COLUMNS))})", row
        )

    def _counter(self) -> int:
        found = self.db.execute("SELECT value FROM meta WHERE key = 'changed'").fetchone()
        # Counted on from the microseconds of the index's making: an index made again (damaged,
        # of an older schema) counts on past every number the one before it gave.
        changed = int(found[0]) + 1 if found else time.time_ns() // 1000
        self.db.execute("INSERT OR REPLACE INTO meta VALUES ('changed', ?)", (str(changed),))
        return changed

    def _note_time(self) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES ('mtime', ?)", (_mtime(self.fleet),))

    def mend(self) -> None:
        """Bring the index in step with the folder (under the lock): the dirty records read
        again, or every record when the folder changed behind its back."""
        dirty = self._dirty()
        if self._noted_time() != _mtime(self.fleet) and not dirty:
            self.rebuild()
            return
        for name in dirty:  # a writer stopped midway: the folder's time changed with it
            self._in_step = True
            self.settle(name, self.fleet.read_record(name))
        if self._noted_time() != _mtime(self.fleet):
            self.rebuild()

    def rebuild(self) -> None:
        """The index built afresh from every record in the folder."""
        noted = _mtime(self.fleet)  # before the folder is read: a change after it is seen
        with self.db:
            self.db.execute("DELETE FROM waiting")
            self.db.execute("DELETE FROM dirty")
            for name in _names(self.fleet.queue):
                waiting = self.fleet.read_record(name)
                if waiting is not None:
                    self._row(name, waiting)
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('mtime', ?)", (noted,))

    # Looks.

    def in_step(self) -> bool:
        return not self._dirty() and self._noted_time() == _mtime(self.fleet)

    def _dirty(self) -> list[str]:
        return [name for (name,) in self.db.execute("SELECT name FROM dirty")]

    def dirty(self) -> list[str]:
        """The records about to change (a reader without the lock reads them afresh)."""
        return self._dirty()

    def _noted_time(self) -> str | None:
        found = self.db.execute("SELECT value FROM meta WHERE key = 'mtime'").fetchone()
        return str(found[0]) if found else None

    def all(self) -> list[W]:
        """Every record, in no order."""
        return [
            self.fleet.from_row(row) for row in self.db.execute(f"SELECT {_SELECT} FROM waiting")
        ]

    def pending(self) -> list[W]:
        """The records that wait for the tasks they run after (neither joined nor blocked)."""
        query = (f"SELECT {_SELECT} FROM waiting WHERE joined = 0 AND blocked IS NULL "
                 "AND unreadable IS NULL")  # fmt: skip
        return [self.fleet.from_row(row) for row in self.db.execute(query)]

    def with_after(self) -> list[W]:
        """The records that name tasks they run after."""
        query = f"SELECT {_SELECT} FROM waiting WHERE after != '[]'"
        return [self.fleet.from_row(row) for row in self.db.execute(query)]

    def blocked(self) -> list[W]:
        """The readable records that are blocked, in the queue's order."""
        query = (f"SELECT {_SELECT} FROM waiting WHERE blocked IS NOT NULL AND unreadable IS "
                 "NULL ORDER BY rank, seq")  # fmt: skip
        return [self.fleet.from_row(row) for row in self.db.execute(query)]

    def waited_for(self) -> list[W]:
        """The records a foreground run waits for in its own process."""
        query = f"SELECT {_SELECT} FROM waiting WHERE waiter IS NOT NULL"
        return [self.fleet.from_row(row) for row in self.db.execute(query)]

    def unreadable(self) -> list[str]:
        return [n for (n,) in self.db.execute("SELECT name FROM waiting WHERE unreadable "
                                              "IS NOT NULL")]  # fmt: skip

    def any_detached(self) -> bool:
        """Whether a detached record that is not blocked waits (one the keeper may start)."""
        query = "SELECT 1 FROM waiting WHERE detached = 1 AND blocked IS NULL LIMIT 1"
        return self.db.execute(query).fetchone() is not None

    def count_ahead(self, before: tuple[int, int] | None) -> int:
        """The eligible records ahead of place (priority, seq) `before` in the queue's order
        (None: all of them)."""
        query = "SELECT COUNT(*) FROM waiting WHERE eligible = 1"
        if before is None:
            return int(self.db.execute(query).fetchone()[0])
        query += " AND (rank, seq) < (?, ?)"
        return int(self.db.execute(query, (-before[0], before[1])).fetchone()[0])

    def in_order(self, before: tuple[int, int] | None = None) -> Iterator[W]:
        """The eligible records in the queue's order (those ahead of place (priority, seq)
        `before`), read as they are asked for."""
        query = f"SELECT {_SELECT} FROM waiting WHERE eligible = 1"
        args: tuple[int, ...] = ()
        if before is not None:
            query += " AND (rank, seq) < (?, ?)"
            args = (-before[0], before[1])
        for row in self.db.execute(query + " ORDER BY rank, seq", args):
            yield self.fleet.from_row(row)

    def limits(self) -> list[Any]:
        """The limits (LimitsSettings, None for none) the eligible records carry, each once."""
        query = "SELECT DISTINCT limits FROM waiting WHERE eligible = 1"
        return [limits_of(text) for (text,) in self.db.execute(query)]

    def changed_since(self, changed: int) -> tuple[list[W], int]:
        """The detached eligible records written since counter `changed`, and the counter now."""
        query = (f"SELECT {_SELECT} FROM waiting INDEXED BY fresh WHERE changed > ? "
                 "AND detached = 1 AND eligible = 1")  # fmt: skip
        rows = sorted(self.db.execute(query, (changed,)), key=lambda row: (row[5], row[4]))
        found = [self.fleet.from_row(row) for row in rows]
        now = self.db.execute("SELECT value FROM meta WHERE key = 'changed'").fetchone()
        return found, int(now[0]) if now else 0


_SELECT = ", ".join(COLUMNS[:-1])


def open_index(fleet: Source[W], locked: bool) -> Index[W]:
    """The index of `fleet`'s queue, in step with its folder: mended when `locked` (this
    process holds the queue's lock), else Stale when it is not in step. A damaged index is
    removed and built again (under the lock)."""
    path = fleet.folder / NAME
    try:
        index = Index(fleet, _connect(path, locked))
        if locked:
            index.mend()
            return index
        for _ in range(WRITES_WAITED):
            if index.in_step():
                return index
            if not index.dirty():
                break  # changed by another hand: only a writer builds it again
            time.sleep(0.01)  # a write under way settles in a few milliseconds
        index.db.close()
        raise Stale(path)
    except sqlite3.DatabaseError:
        if not locked:
            raise Stale(path) from None
    for extra in ("", "-journal"):  # damaged (a full disk, a crash of the machine): afresh
        Path(f"{path}{extra}").unlink(missing_ok=True)
    index = Index(fleet, _connect(path, True))
    index.rebuild()
    return index


def _connect(path: Path, locked: bool) -> sqlite3.Connection:
    """The index at `path`, made (readable by its owner only) with its tables if new; one of
    another schema is emptied to be built again (by a process that holds the queue's lock;
    Stale for another)."""
    from runagent.store.runfolder import private

    if not path.exists():
        if not locked:
            raise Stale(path)
        os.close(private(path, os.O_WRONLY | os.O_CREAT))
    # The queue's lock orders the writers; a reader waits out a write of a few milliseconds.
    db = sqlite3.connect(path, timeout=30, check_same_thread=False)
    # The index is never the truth: a crash of the machine that loses its last writes leaves
    # the folder's time unlike the one noted, and the index is built again.
    db.execute("PRAGMA synchronous = OFF")
    found = db.execute("SELECT name FROM sqlite_master WHERE name = 'meta'").fetchone()
    schema = None
    if found:
        row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        schema = row[0] if row else None
    if schema != SCHEMA:
        if not locked:
            db.close()
            raise Stale(path)
        with db:
            for table in ("meta", "dirty", "waiting"):
                db.execute(f"DROP TABLE IF EXISTS {table}")
            for statement in _statements():
                db.execute(statement)
            db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA,))
    return db


def _statements() -> list[str]:
    return [s.strip() for s in TABLES.split(";") if s.strip()]


def _names(folder: Path) -> list[str]:
    try:
        return [name for name in os.listdir(folder) if name.endswith(".json")]
    except OSError:
        return []


def _mtime(fleet: Source[Any]) -> str:
    try:
        return str(os.stat(fleet.queue).st_mtime_ns)
    except OSError:
        return "none"


_LIMITS: dict[str, Any] = {}  # the limits of rows by their JSON: most rows carry the same


def _row(name: str, w: Any, changed: int) -> tuple[Any, ...]:
    limits = json.dumps(w.limits.to_record(), sort_keys=True) if w.limits is not None else None
    return (name, w.project, w.task, w.agent, w.seq, -w.priority, w.submitted,
            json.dumps(list(w.after)), int(w.joined), w.blocked, w.told, w.waiter,
            w.waiter_started, int(w.start is not None), limits, w.unreadable, int(w.eligible),
            changed)  # fmt: skip


def limits_of(text: str | None) -> Any:
    """The LimitsSettings a row's limits column holds (None for none)."""
    if text is None:
        return None
    found = _LIMITS.get(text)
    if found is None:
        from runagent.config.settings import LimitsSettings

        found = _LIMITS[text] = LimitsSettings.from_record(json.loads(text))
    return found
