"""Slots and the queue: files under the runs root (`.fleet/`), read and changed only under one
lock, so the cap holds whichever process starts a task.

- `slots/P@T.json`: a task loop that runs while limits are on, and the process that holds its
  slot (its pid and start time). A holder that dies, even by SIGKILL, frees its slot: a slot
  whose process is gone counts for nothing and is removed at the next look.
- `queue/P@T.json`: a task waiting for a slot, or for the tasks it runs after: its place (seq,
  priority), and either the foreground run waiting in its own process (its pid) or, for a
  detached start, how the keeper starts it: argv, folder and environment, its secret variables
  by name alone (credentials.withhold). Like at(1)'s jobs, these files are readable by their
  owner only.
- `cluster/P@T.json`: a task waiting in a Ray cluster's queue (its cap is the hosts' `agent_slot`,
  its order Ray's): no process waits for it, and this record only lets listings show it queued.
  It is judged, never trusted: it counts for nothing once the task holds its lock, a run of it
  has started since, or the cluster no longer has its group (a root a host cannot write to is
  never cleaned by that host, so the record cannot be relied on to be removed).
- `paused/AGENT.json`: an agent paused across the fleet until its provider's limit lifts (a run of
  it was rate limited, and said until when): no task of it starts before then, wherever it was
  queued; `fleet unpause` lifts it sooner. One past its time counts for nothing.
- `hold.json`: the whole queue held by a person (`fleet hold`, the page, the API; `stop --all`
  while it stops everything): no queued task starts, whatever its agent or project, until
  `fleet release` removes it; the loops that run go on. Not a pause: a pause is an agent's,
  set by its provider's limit, and lifts by itself; a hold is the queue's, and only a person
  lifts it. One that cannot be read still holds.
- `starting/P@T.json`: a detached start the keeper took off the queue and is starting: its record,
  the keeper (pid and start time) and a ticket the started loop takes it off with. A keeper
  killed midway (SIGKILL, the OOM killer) leaves it: once the start has had START_WAIT to take
  its task's lock and has not, the next keeper puts the record back in its place in the queue,
  so a start is never lost and never made twice (executors/keeper.py).
- `seq`: the counter that numbers places in the queue.
- `lock`: held while any of these is read, decided on and written (a few milliseconds).

A queue record that cannot be read (half written, not a record, wrong types, over RECORD_CAP) is
never dropped and never run: it stands in the queue as `unreadable`, saying why, in every
listing, and the first writer to see it says so once in `keeper.log`. A start of the task
(`resume`) replaces it, `stop` and `delete` remove it.

The order is first come, first served within a priority (higher first). A task may start when
it fits every cap it counts against (all tasks, its project, its agent) once every task ahead
of it that fits has started: one waiting on a full project does not hold back one of another.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from runagent.config.settings import LimitsSettings
from runagent.errors import shown
from runagent.record import record
from runagent.store import jsonfile, runfolder
from runagent.store.pids import is_alive, process_start_time
from runagent.store.runfolder import FLEET, TaskPaths, make_folder
from runagent.store.tasks import QueuePlace

if TYPE_CHECKING:
    from runagent.fleet.index import Index

T = TypeVar("T")
FOLDER = FLEET  # in the runs root: an id may not start with '.', so no project is named so
SEP = "@"  # between project and task in a file name: a character no id holds
# Bytes a record may hold: twice what Linux lets a command line and its environment be.
RECORD_CAP = 4 * 1024 * 1024
LOG = "keeper.log"
HOLD = "hold.json"  # the whole queue held by a person
LOG_LOOKBACK = 64 * 1024  # bytes at the end of keeper.log looked through for a line said already


def _file_name(project: str, task: str) -> str:
    return f"{project}{SEP}{task}.json"


@record
class Holder:
    """A running task's slot: the process that holds it."""

    project: str
    task: str
    agent: str
    pid: int
    started: float | None = None  # the process's start time: a pid reused since is not it

    @property
    def label(self) -> str:
        return f"{self.project}/{self.task}"

    def alive(self) -> bool:
        return is_alive(self.pid, self.started)


@record
class Waiting:
    """A task in the queue."""

    project: str
    task: str
    agent: str
    seq: int
    priority: int = 0
    submitted: str = ""  # when it was put in the queue (UTC, ISO 8601)
    after: tuple[str, ...] = ()  # P/T of the tasks it runs after
    joined: bool = True  # False while it waits for the tasks it runs after
    blocked: str | None = None  # why it will not start: a task it runs after did not complete
    told: str | None = None  # the blocking a notifier told a person of (its episode): told once
    waiter: int | None = None  # the pid of a foreground run waiting in its own process
    waiter_started: float | None = None
    start: Mapping[str, Any] | None = None  # a detached start: {argv, cwd, env, withheld}
    limits: LimitsSettings | None = None  # the limits in force when it was queued
    cluster: Mapping[str, Any] | None = None  # in a Ray cluster's queue: {group, needs}
    # A stand-in for a record that cannot be read, saying why (never written, never started).
    unreadable: str | None = None

    @property
    def label(self) -> str:
        return f"{self.project}/{self.task}"

    def unreadable_words(self) -> str:
        """What a task whose record cannot be read waits for: a person, and which commands."""
        task = f"-p {self.project} -t {self.task}"
        return (f"its queue record cannot be read: {self.unreadable}; `run-agent resume {task}` "
                f"queues it afresh, `run-agent stop {task}` takes it out")  # fmt: skip

    def still_on_cluster(self, root: Path) -> bool:
        """Whether a task recorded as waiting in the cluster's queue still waits there: it
        does not hold its lock, no run of it has started since it was queued, and the cluster
        (when this process knows it) still has its placement group."""
        from runagent.store import host
        from runagent.store.lock import live_holder
        from runagent.store.runfolder import read_run_record

        task = TaskPaths(root, self.project, self.task)
        if live_holder(task.lock) is not None:
            return False
        runs = task.run_ids()
        latest = read_run_record(task.run_folder(runs[-1])) if runs else None
        if latest is not None and _instant(latest.start_time) >= _instant(self.submitted):
            return False
        group = str((self.cluster or {}).get("group") or "")
        return host.waits_on_cluster(self.label, group)

    def cluster_words(self) -> str:
        """What a task in the cluster's queue waits for, in words."""
        needs = dict((self.cluster or {}).get("needs") or {})
        return f"a Ray host with {needs_words(needs)} free"

    @property
    def eligible(self) -> bool:
        """In the queue proper: its dependencies done, nothing blocking it, readable."""
        return self.joined and self.blocked is None and self.unreadable is None

    def limit_settings(self) -> LimitsSettings:
        """The limits in force when it was queued (the record carries them to the keeper)."""
        return self.limits if self.limits is not None else LimitsSettings()

    def abandoned(self) -> bool:
        """A foreground run that waited for it is gone (a detached start never is)."""
        return self.waiter is not None and not is_alive(self.waiter, self.waiter_started)

    def to_json(self) -> dict[str, Any]:
        return {
            "project": self.project, "task": self.task, "agent": self.agent, "seq": self.seq,
            "priority": self.priority, "submitted": self.submitted, "after": list(self.after),
            "joined": self.joined, "blocked": self.blocked, "told": self.told,
            "waiter": self.waiter,
            "waiter_started": self.waiter_started,
            "start": dict(self.start) if self.start is not None else None,
            "limits": self.limits.to_record() if self.limits is not None else None,
            "cluster": dict(self.cluster) if self.cluster is not None else None,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Waiting:
        """The record `data` holds; ValueError naming the first field that is not what it
        should be (the keeper runs what a record says, so every field is checked)."""
        get = data.get
        return cls(
            project=_text(get("project"), "project"), task=_text(get("task"), "task"),
            agent=_text(get("agent"), "agent"), seq=_whole(get("seq"), "seq"),
            priority=_whole(get("priority", 0), "priority"),
            submitted=_text(get("submitted", ""), "submitted"),
            after=tuple(_texts(get("after", []), "after")),
            joined=_flag(get("joined", True), "joined"),
            blocked=_maybe(_text, get("blocked"), "blocked"),
            told=_maybe(_text, get("told"), "told"),
            waiter=_maybe(_whole, get("waiter"), "waiter"),
            waiter_started=_maybe(_number, get("waiter_started"), "waiter_started"),
            start=_maybe(_start, get("start"), "start"),
            limits=_maybe(LimitsSettings.from_record, get("limits"), "limits"),
            cluster=_maybe(_cluster, get("cluster"), "cluster"),
        )  # fmt: skip


@record
class Pause:
    """An agent paused across the fleet: until when (seconds since the epoch), why (the limit
    its provider said), and which task's run found it."""

    agent: str
    until: float
    why: str
    by: str = ""  # P/T of the task whose run was limited
    since: str = ""  # when it was paused (UTC, ISO 8601)

    def words(self) -> str:
        """`claude paused until 17:00 UTC: usage limit`."""
        return f"{self.agent} paused until {clock(self.until)}: {self.why}"

    def lifted(self, at: float | None = None) -> bool:
        import time

        return self.until <= (time.time() if at is None else at)

    def to_json(self) -> dict[str, Any]:
        return {"agent": self.agent, "until": self.until, "until_utc": _stamp(self.until),
                "why": self.why, "by": self.by, "since": self.since}  # fmt: skip

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Pause:
        get = data.get
        return cls(
            agent=_text(get("agent"), "agent"), until=_number(get("until"), "until"),
            why=_text(get("why", ""), "why"), by=_text(get("by", ""), "by"),
            since=_text(get("since", ""), "since"),
        )  # fmt: skip


@record
class QueueHold:
    """The whole queue held by a person: since when (UTC, ISO 8601), and by what."""

    since: str
    by: str = ""  # `run-agent fleet hold`, `the API`, `stop --all`
    unreadable: str | None = None  # its record cannot be read: it holds all the same

    def words(self, past: bool = False) -> str:
        """`the queue is held since 05:10 UTC` (`was`, once released)."""
        when = _instant(self.since)
        since = f" since {clock(when.timestamp())}" if when.year > 1970 else ""
        if self.unreadable is not None:
            since += f" (its record {FOLDER}/{HOLD} cannot be read: {self.unreadable})"
        return f"the queue {'was' if past else 'is'} held{since}"

    def to_json(self) -> dict[str, Any]:
        return {"since": self.since, "by": self.by}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QueueHold:
        get = data.get
        return cls(since=_text(get("since", ""), "since"), by=_text(get("by", ""), "by"))


def clock(moment: float) -> str:
    """A moment as a person reads it on a fleet's page: `17:00 UTC` today (seconds when it has
    some), with its date another day."""
    when = datetime.fromtimestamp(moment, UTC)
    shown = when.strftime("%H:%M:%S" if when.second else "%H:%M")
    if when.date() != datetime.now(UTC).date():
        shown = f"{when.date().isoformat()} {shown}"
    return f"{shown} UTC"


def _stamp(moment: float) -> str:
    when = datetime.fromtimestamp(moment, UTC).isoformat(timespec="seconds")
    return when.replace("+00:00", "Z")


def needs_words(needs: Mapping[str, Any]) -> str:
    """A Ray resource request in words: `agent_slot 1`."""
    return ", ".join(f"{name} {amount:g}" for name, amount in needs.items()) or "room"


def _instant(stamp: str) -> datetime:
    """An ISO 8601 time as written in records (a `Z` for UTC); the epoch if unreadable."""
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError:
        return datetime.fromtimestamp(0, UTC)
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def places(root: Path) -> dict[str, QueuePlace]:
    """Every queued or blocked task under `root`, by P/T, with where it stands (read only). One
    walk down the queue's order, counting the slots the tasks ahead would take as it goes."""
    fleet = Fleet(root)
    records = fleet.waiting(clean=False)  # a listing reads; the queue's writers tidy it
    holders = fleet.holders(clean=False)
    paused = fleet.pauses(clean=False)
    held = fleet.queue_hold()
    found = {}
    ahead = Ahead(holders, paused, (w.limits for w in records if w.eligible))
    for waiting in records:  # in order: each eligible one sees those before it
        if waiting.unreadable is not None:
            found[waiting.label] = QueuePlace(0, waiting.unreadable_words(), detached=False,
                                              unreadable=waiting.unreadable)  # fmt: skip
            continue
        if waiting.blocked is not None:
            waits = f"blocked: {waiting.blocked}"
        elif not waiting.joined:
            waits = f"waits for {', '.join(waiting.after)}"
        else:
            turn = ahead.turn(waiting.limit_settings(), waiting.project, waiting.agent, held)
            waits = turn.waits_for or "its turn: a slot is free"
        found[waiting.label] = QueuePlace(
            ahead.count if waiting.eligible else 0, waits, waiting.priority, waiting.after,
            waiting.start is not None, not waiting.eligible,
        )  # fmt: skip
        if waiting.eligible:
            ahead.add(waiting)
    # One Ray has placed whose loop waits on its host in this root's queue (for a hold, or its
    # agent's pause) is there, no longer in Ray's queue.
    on_cluster = [w for w in fleet.on_cluster() if w.label not in found]
    for n, waiting in enumerate(on_cluster):
        found[waiting.label] = QueuePlace(n, waiting.cluster_words(), waiting.priority)
    return found


def place(root: Path, project: str, task: str) -> QueuePlace | None:
    """Where one task stands in the queue (None: it is in none), reading what it touches: its
    record, and the records ahead of it only as far as the caps need (read only)."""
    fleet = Fleet(root)
    waiting = _record(fleet.record_path(project, task))
    if waiting is None or waiting.abandoned():
        return _place_on_cluster(fleet, f"{project}/{task}")
    if waiting.unreadable is not None:
        return QueuePlace(0, waiting.unreadable_words(), detached=False,
                          unreadable=waiting.unreadable)  # fmt: skip
    if waiting.blocked is not None:
        waits = f"blocked: {waiting.blocked}"
    elif not waiting.joined:
        waits = f"waits for {', '.join(waiting.after)}"
    else:
        turn = fleet.turn(waiting.limit_settings(), waiting.project, waiting.agent,
                          (waiting.priority, waiting.seq), locked=False)  # fmt: skip
        return QueuePlace(turn.ahead, turn.waits_for or "its turn: a slot is free",
                          waiting.priority, waiting.after, waiting.start is not None)  # fmt: skip
    return QueuePlace(0, waits, waiting.priority, waiting.after, waiting.start is not None, True)


def _place_on_cluster(fleet: Fleet, label: str) -> QueuePlace | None:
    on_cluster = fleet.on_cluster() if fleet.cluster.is_dir() else []
    for n, waiting in enumerate(on_cluster):
        if waiting.label == label:
            if fleet.record_path(waiting.project, waiting.task).exists():
                return None  # in this root's queue after all (gone from it since)
            return QueuePlace(n, waiting.cluster_words(), waiting.priority)
    return None


class Places(Mapping[str, QueuePlace]):
    """The queue's places, each worked out when it is asked for (`place`): a view of one task
    reads what it touches; going through them all reads them all at once (`places`)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.known: dict[str, QueuePlace | None] = {}
        self.every: dict[str, QueuePlace] | None = None

    def __getitem__(self, label: str) -> QueuePlace:
        if self.every is not None:
            return self.every[label]
        if label not in self.known:
            project, _, task = label.partition("/")
            self.known[label] = place(self.root, project, task) if task else None
        found = self.known[label]
        if found is None:
            raise KeyError(label)
        return found

    def _all(self) -> dict[str, QueuePlace]:
        if self.every is None:
            self.every = places(self.root)
        return self.every

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


class Tally:
    """The slots taken as a look goes down the queue's order: all of them, by project, by agent
    (counts, so a look at a deep queue costs a step per task, not a pass over those before)."""

    def __init__(self, holders: Sequence[Holder] = ()) -> None:
        from collections import Counter

        self.total = 0
        self.projects: Counter[str] = Counter()
        self.agents: Counter[str] = Counter()
        for holder in holders:
            self.add(holder.project, holder.agent)

    def add(self, project: str, agent: str) -> None:
        self.total += 1
        self.projects[project] += 1
        self.agents[agent] += 1

    def full_cap(self, limits: LimitsSettings, project: str, agent: str) -> str:
        """The first cap a task of `project` run by `agent` would exceed now; '' if none."""
        return limits.full_cap_counted(
            project, agent, self.total, self.projects[project], self.agents[agent]
        )


class Ahead:
    """The eligible tasks a look down the queue's order has passed, as `decide` takes them to
    have started: for each limits the records carry (one, unless the config changed while they
    waited), the slots they take."""

    def __init__(self, holders: Sequence[Holder], paused: Mapping[str, Pause],
                 limits: Iterable[LimitsSettings | None]) -> None:  # fmt: skip
        self.holders, self.paused, self.count = list(holders), paused, 0
        # Limits are records of mappings, compared but not hashed: a short list.
        self.tallies: list[tuple[LimitsSettings, Tally]] = []
        for each in limits:
            self._tally(each if each is not None else LimitsSettings())

    def _tally(self, limits: LimitsSettings) -> Tally:
        for known, tally in self.tallies:
            if known is limits or known == limits:
                return tally
        if self.count:
            raise ValueError("limits named after the look began")
        tally = Tally(self.holders)
        self.tallies.append((limits, tally))
        return tally

    def add(self, waiting: Waiting, started: bool = False) -> None:
        """`waiting` passed: under each limits it takes a slot if it fits (`started`: it holds
        one now, fit or not)."""
        self.count += 1
        for limits, tally in self.tallies:
            if started or (
                waiting.agent not in self.paused
                and not tally.full_cap(limits, waiting.project, waiting.agent)
            ):
                tally.add(waiting.project, waiting.agent)

    def turn(
        self, limits: LimitsSettings, project: str, agent: str, held: QueueHold | None
    ) -> Turn:  # fmt: skip
        """`decide` for a task of `project` run by `agent` behind those passed."""
        if held is not None:
            return Turn(False, self.count, held.words())
        if agent in self.paused:
            return Turn(False, self.count, self.paused[agent].words())
        cap = self._tally(limits).full_cap(limits, project, agent)
        return Turn(False, self.count, cap) if cap else Turn(True)

    def none_fits(self) -> bool:
        """Whether every cap on all tasks is full: no task further down may start."""
        return bool(self.tallies) and all(
            limits.all_taken(tally.total) for limits, tally in self.tallies
        )


@record
class Turn:
    """Whether a task may start now; if not, how many are ahead of it and what it waits for."""

    go: bool
    ahead: int = 0
    waits_for: str = ""
    blocked: bool = False  # it waits for other tasks, not for a slot

    def words(self, label: str) -> str:
        """What a queued start says, once: `queued: 3 ahead (max_running 4)`."""
        if self.blocked:
            return f"task {label} is blocked: it {self.waits_for}"
        return f"task {label} queued: {self.ahead} ahead ({self.waits_for})"


def full_cap(limits: LimitsSettings, project: str, agent: str, holders: Sequence[Holder]) -> str:
    """The first cap a task of `project` run by `agent` would exceed, in words; '' if none."""
    return limits.full_cap(project, agent, [(h.project, h.agent) for h in holders])


def decide(
    limits: LimitsSettings, project: str, agent: str, ahead: Sequence[Waiting],
    holders: Sequence[Holder], paused: Mapping[str, Pause] | None = None,
    held: QueueHold | None = None,
) -> Turn:  # fmt: skip
    """May a task start now, with `ahead` (eligible, in order) before it in the queue? Each of
    them that fits is taken to have started first; the task then must fit what is left. A task
    of a paused agent does not start, and takes no slot from those behind it; while the queue
    is held, none starts."""
    if held is not None:
        return Turn(False, len(ahead), held.words())
    paused = paused or {}
    if agent in paused:
        return Turn(False, len(ahead), paused[agent].words())
    cap = cap_left(limits, project, agent, ahead, holders, paused)
    return Turn(False, len(ahead), cap) if cap else Turn(True)


def cap_left(
    limits: LimitsSettings, project: str, agent: str, ahead: Iterable[Waiting],
    holders: Sequence[Holder], paused: Mapping[str, Pause],
) -> str:  # fmt: skip
    """The cap a task would exceed once each of `ahead` (in order) that fits has started
    before it, in words; '' if it fits. The look down the order stops once every cap on all
    tasks is full: none further can start first."""
    tally = Tally(holders)
    for waiting in ahead:
        if limits.all_taken(tally.total):
            break  # none further fits: the cap found is this one
        if waiting.agent in paused:
            continue
        if not tally.full_cap(limits, waiting.project, waiting.agent):
            tally.add(waiting.project, waiting.agent)
    return tally.full_cap(limits, project, agent)


def order(records: Sequence[Waiting]) -> list[Waiting]:
    """The queue's order: higher priority first, then first come first."""
    return sorted(records, key=lambda w: (-w.priority, w.seq))


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Fleet:
    """The fleet files of one runs root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.folder = root / FOLDER
        self.slots = self.folder / "slots"
        self.queue = self.folder / "queue"
        self.cluster = self.folder / "cluster"
        self.paused = self.folder / "paused"
        self.starting = self.folder / "starting"
        self._locked = False
        self._index: Index[Waiting] | None = None

    def exists(self) -> bool:
        return self.folder.is_dir()

    @contextmanager
    def locked(self) -> Iterator[Fleet]:
        """Hold the fleet's lock (blocking) while reading, deciding and writing."""
        make_folder(self.root)
        self.folder.mkdir(exist_ok=True, mode=0o700)  # records may hold an environment
        self.slots.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.queue.mkdir(parents=True, exist_ok=True, mode=0o700)
        with runfolder.exclusive(self.folder / "lock"):
            self._locked = True
            try:
                yield self
            finally:
                self._locked = False
                if self._index is not None:
                    self._index.db.close()
                    self._index = None

    def index(self) -> Index[Waiting]:
        """The queue's index, in step with the folder (under the lock: mended once each time
        the lock is taken; fleet/index.py)."""
        from runagent.fleet.index import open_index

        assert self._locked, "the queue's index is written under its lock"
        if self._index is None:
            self._index = open_index(self, locked=True)
        return self._index

    def read_record(self, name: str) -> Waiting | None:
        """The record of file `name` in the queue's folder (as `record_of`)."""
        return _record(self.queue / name)

    def from_row(self, row: tuple[Any, ...]) -> Waiting:
        """The record a row of the index holds (fleet/index.py): its start IN_FILE."""
        from runagent.fleet.index import IN_FILE, limits_of

        (_name, project, task, agent, seq, rank, submitted, after, joined, blocked, told, waiter,
         waiter_started, detached, limits, unreadable, _eligible) = row  # fmt: skip
        return Waiting(
            project, task, agent, seq, -rank, submitted, tuple(json.loads(after)), bool(joined),
            blocked, told, waiter, waiter_started, IN_FILE if detached else None,
            limits_of(limits), None, unreadable,
        )  # fmt: skip

    # Slots.

    def holders(self, clean: bool = True) -> list[Holder]:
        """The live slots; with `clean` (under the lock), those of processes that are gone
        are removed."""
        found = []
        for path in _files(self.slots):
            holder = _read(path, _holder)
            if holder is not None and holder.alive():
                found.append(holder)
            elif clean:
                path.unlink(missing_ok=True)
        return found

    def slot_of(self, task: TaskPaths) -> Holder | None:
        path = self.slots / _file_name(task.project_id, task.task_id)
        holder = _read(path, _holder)
        return holder if holder is not None and holder.alive() else None

    def hold(self, task: TaskPaths, agent: str, pid: int | None = None) -> Holder:
        """Take (or take over) the task's slot for process `pid` (default: this one)."""
        pid = os.getpid() if pid is None else pid
        holder = Holder(task.project_id, task.task_id, agent, pid, process_start_time(pid))
        _write(self.slots / _file_name(task.project_id, task.task_id), {
            "project": holder.project, "task": holder.task, "agent": holder.agent,
            "pid": holder.pid, "started": holder.started,
        })  # fmt: skip
        return holder

    def release(self, task: TaskPaths, pid: int | None = None) -> None:
        """Free the task's slot if process `pid` (default: this one) holds it."""
        pid = os.getpid() if pid is None else pid
        path = self.slots / _file_name(task.project_id, task.task_id)
        holder = _read(path, _holder)
        if holder is not None and holder.pid == pid:
            path.unlink(missing_ok=True)

    # Agents paused by their provider's limit.

    def pauses(self, clean: bool = True) -> dict[str, Pause]:
        """The agents paused now, by name; with `clean` (under the lock), the records of pauses
        that have lifted are removed (one that cannot be read counts for nothing)."""
        found = {}
        for path in _files(self.paused):
            pause = _read(path, Pause.from_json)
            if pause is not None and not pause.lifted() and path.name == _agent_file(pause.agent):
                found[pause.agent] = pause
            elif clean:
                path.unlink(missing_ok=True)
        return found

    def pause(self, pause: Pause) -> Pause:
        """Pause an agent (under the lock): until the later of this and a pause it is in."""
        path = self.paused / _agent_file(pause.agent)
        held = _read(path, Pause.from_json)
        if held is not None and held.agent == pause.agent and held.until >= pause.until:
            return held
        self.paused.mkdir(exist_ok=True, mode=0o700)
        _write(path, pause.to_json())
        return pause

    def unpause(self, agent: str) -> Pause | None:
        """Lift an agent's pause (under the lock); the pause it was in, if any."""
        path = self.paused / _agent_file(agent)
        held = _read(path, Pause.from_json)
        path.unlink(missing_ok=True)
        return held if held is not None and not held.lifted() else None

    # The whole queue held by a person (not an agent's pause).

    def queue_hold(self) -> QueueHold | None:
        """The hold on the queue, if any (one whose record cannot be read holds all the same)."""
        try:
            return QueueHold.from_json(jsonfile.read_object(self.folder / HOLD, RECORD_CAP))
        except FileNotFoundError:
            return None
        except ValueError as exc:  # jsonfile.Unreadable too
            return QueueHold("", unreadable=str(exc))
        except OSError as exc:
            return QueueHold("", unreadable=exc.strerror or str(exc))

    def hold_queue(self, hold: QueueHold) -> QueueHold | None:
        """Hold the queue (under the lock); the hold it was in already (kept as it was)."""
        held = self.queue_hold()
        if held is None:
            _write(self.folder / HOLD, hold.to_json())
        return held

    def release_queue(self, only: QueueHold | None = None) -> QueueHold | None:
        """Release the queue (under the lock), or only if it is held by `only` (a hold another
        made meanwhile stays); the hold it released."""
        held = self.queue_hold()
        if held is None or (only is not None and held != only):
            return None
        (self.folder / HOLD).unlink(missing_ok=True)
        return held

    # The queue.

    def waiting(self, clean: bool = True) -> list[Waiting]:
        """Every task in the queue, in order (those whose record cannot be read as stand-ins
        saying why), but those of foreground runs that are gone (a waiter that died never
        holds up the queue); with `clean` under the lock, their records are removed, and a
        record that cannot be read is said in keeper.log (once), never removed. Read from the
        index: a detached record's start is IN_FILE (fleet/index.py)."""
        if clean and self._locked:
            self.tidy()
            return order(self.index().all())
        found = [w for w in self._unlocked_records() if not w.abandoned()]
        return order(found)

    def _unlocked_records(self) -> list[Waiting]:
        """Every record, for a reader without the lock: from the index, with those about to
        change read afresh; from the folder when the index is out of step with it."""
        from runagent.fleet import index

        if not (self.folder / index.NAME).exists():
            return self._from_folder()
        try:
            look = index.open_index(self, locked=False)
        except index.Stale:
            return self._from_folder()
        try:
            return look.all()
        finally:
            look.db.close()

    def _from_folder(self) -> list[Waiting]:
        found = []
        for path in _files(self.queue):
            waiting = _record(path)
            if waiting is not None:
                found.append(waiting)
        return found

    def tidy(self) -> None:
        """Under the lock: remove the records of foreground runs that are gone, and say in
        keeper.log (once) each record that cannot be read."""
        index = self.index()
        for waiting in index.waited_for():
            if waiting.abandoned():
                self._remove(_file_name(waiting.project, waiting.task))
        for name in index.unreadable():
            damaged = self.read_record(name)
            if damaged is not None and damaged.unreadable is not None:
                self.report(damaged, self.queue / name)

    def pending(self) -> list[Waiting]:
        """Under the lock: the records that wait for the tasks they run after."""
        return self.index().pending()

    def detached_waits(self) -> bool:
        """Under the lock: whether a detached task that is not blocked is queued, or a start is
        claimed by a keeper that is gone (the keeper has work)."""
        self.tidy()
        return self.index().any_detached() or self.orphaned_claims()

    def turn(
        self, limits: LimitsSettings, project: str, agent: str, before: tuple[int, int] | None,
        *, locked: bool = True,
    ) -> Turn:  # fmt: skip
        """`decide` for a task of `project` run by `agent` behind the eligible records ahead of
        place (priority, seq) `before` (None: all of them), reading them down the queue's
        order only until every cap on all tasks is full. Without the lock (a listing), from
        the index if it is in step, else from the folder."""
        from runagent.fleet import index as queue_index

        holders = self.holders(clean=locked)
        paused = self.pauses(clean=locked)
        held = self.queue_hold()
        look: Index[Waiting] | None = None
        if locked:
            look = self.index()
        elif (self.folder / queue_index.NAME).exists():
            try:
                look = queue_index.open_index(self, locked=False)
            except queue_index.Stale:
                look = None
        try:
            if look is None:  # read every record: the index is not to be trusted now
                records = [w for w in order(self._from_folder()) if not w.abandoned()]
                key = (-before[0], before[1]) if before is not None else None
                ahead = [w for w in records if w.eligible
                         and (key is None or (-w.priority, w.seq) < key)]  # fmt: skip
                return decide(limits, project, agent, ahead, holders, paused, held)
            if held is not None or agent in paused:
                count = look.count_ahead(before)
                why = held.words() if held is not None else paused[agent].words()
                return Turn(False, count, why)
            cap = cap_left(limits, project, agent, look.in_order(before), holders, paused)
            if not cap:
                return Turn(True)
            return Turn(False, look.count_ahead(before), cap)
        finally:
            if look is not None and not locked:
                look.db.close()

    def record_path(self, project: str, task: str) -> Path:
        return self.queue / _file_name(project, task)

    def record_of(self, task: TaskPaths) -> Waiting | None:
        """The task's queue record (a stand-in saying why if it cannot be read); None if the
        task is not in the queue."""
        return _record(self.record_path(task.project_id, task.task_id))

    def put(self, waiting: Waiting) -> None:
        """Write the task's record (under the lock), and its row in the index. One read from
        the index keeps its start in its file: it is taken from there, and a record gone
        meanwhile stays gone."""
        from runagent.fleet.index import IN_FILE

        assert waiting.unreadable is None, "a stand-in for a damaged record is never written"
        name = _file_name(waiting.project, waiting.task)
        if waiting.start is IN_FILE:
            kept = self.read_record(name)
            if kept is None or kept.unreadable is not None or kept.start is None:
                return
            waiting = replace(waiting, start=kept.start)
        if not self._locked:
            _write(self.queue / name, waiting.to_json())  # the index sees the folder changed
            return
        index = self.index()
        index.mark(name)
        _write(self.queue / name, waiting.to_json())
        index.settle(name, waiting)

    def report(self, waiting: Waiting, path: Path | None = None) -> None:
        """Say in keeper.log that a queue record (at `path`, by default the task's) cannot be
        read, unless it says so already (every writer of the queue looks at it, the keeper
        once a second)."""
        name = (path or self.record_path(waiting.project, waiting.task)).name
        line = (f"run-agent: task {waiting.label}: its queue record {FOLDER}/queue/{name} is "
                f"unreadable: {waiting.unreadable}; it stays in the queue, never started, "
                f"until `run-agent resume -p {waiting.project} -t {waiting.task}` queues it "
                f"afresh or `run-agent stop` or `delete` takes it out\n").encode()  # fmt: skip
        try:
            with open(self.folder / LOG, "a+b") as log:
                size = log.seek(0, os.SEEK_END)
                log.seek(max(0, size - LOG_LOOKBACK))
                if line not in log.read():
                    log.write(line)
        except OSError:
            pass  # the listings show it all the same

    def drop(self, task: TaskPaths) -> bool:
        """Take the task out of the queue; whether it was in it."""
        return self._remove(_file_name(task.project_id, task.task_id))

    def _remove(self, name: str) -> bool:
        index = self.index() if self._locked else None
        if index is not None:
            index.mark(name)
        try:
            (self.queue / name).unlink()
        except FileNotFoundError:
            return False
        finally:
            if index is not None:
                index.settle(name, None)
        return True

    # Starts the keeper made, until their loops take them over.

    def claim(self, waiting: Waiting) -> str:
        """Under the lock: say that this process (the keeper) is starting `waiting`, taken off
        the queue; the ticket its loop takes the claim off with (`unclaim`)."""
        import secrets

        ticket = secrets.token_hex(8)
        self.starting.mkdir(exist_ok=True, mode=0o700)
        _write(self.starting / _file_name(waiting.project, waiting.task), {
            "record": waiting.to_json(), "pid": os.getpid(),
            "started": process_start_time(os.getpid()), "at": time.time(), "ticket": ticket,
        })  # fmt: skip
        return ticket

    def unclaim(self, project: str, task: str, ticket: str) -> bool:
        """Take the keeper's claim on a start off (its loop took it over, or the keeper saw it
        through): only the claim bearing `ticket`. Whether it was there."""
        if not self.has_claim(project, task, ticket):
            return False
        (self.starting / _file_name(project, task)).unlink(missing_ok=True)
        return True

    def has_claim(self, project: str, task: str, ticket: str) -> bool:
        """Whether the claim bearing `ticket` is there (not taken back by a `stop`)."""
        claim = _read(self.starting / _file_name(project, task), _claim)
        return claim is not None and claim.ticket == ticket

    def claims(self) -> list[tuple[Path, Claim | None]]:
        """The keepers' claims on starts, each with its file (None for one that cannot be
        read, or is not this user's alone: never put back in the queue). What is not a regular
        file, and a file that cannot be read just now (no descriptor left), is passed over."""
        import stat

        found: list[tuple[Path, Claim | None]] = []
        paths = _files(self.starting)
        folders_ours = not paths or not any(map(owned_by_others, (self.folder, self.starting)))
        for path in paths:
            try:
                if not stat.S_ISREG(os.lstat(path).st_mode):
                    continue
                claim: Claim | None = None
                if folders_ours and not owned_by_others(path):
                    claim = _claim(jsonfile.read_object(path, RECORD_CAP))
            except FileNotFoundError:
                continue
            except (ValueError, KeyError, TypeError):  # jsonfile.Unreadable too
                claim = None
            except OSError:
                continue
            if claim is not None and claim.waiting.label != _label_of(path.name):
                claim = None
            found.append((path, claim))
        return found

    def orphaned_claims(self) -> bool:
        """Whether a start is claimed by a keeper that is gone: a keeper must look at it. (One
        that cannot be trusted summons none; a keeper that runs drops it.)"""
        return any(c is not None and not c.keeper.alive() for _, c in self.claims())

    def drop_claim(self, task: TaskPaths) -> Waiting | None:
        """Under the lock: take a keeper's claim on the task's start off (`stop`, `delete`): its
        loop, if it is starting, then never runs (gate.take_over). The claimed record, if any."""
        path = self.starting / _file_name(task.project_id, task.task_id)
        claim = _read(path, _claim)
        try:
            path.unlink()
        except FileNotFoundError:
            return None
        return claim.waiting if claim is not None else None

    def next_seq(self) -> int:
        """The next place in the queue (under the lock)."""
        path = self.folder / "seq"
        try:
            seq = int(path.read_text(encoding="utf-8").strip() or 0) + 1
        except (OSError, ValueError):
            seq = 1
        _write_text(path, f"{seq}\n")
        return seq

    # Ray's queue.

    def on_cluster(self, clean: bool = False) -> list[Waiting]:
        """The tasks that still wait in a Ray cluster's queue, in the order they were queued;
        with `clean` (under the lock), the records of the others are removed."""
        found = []
        for path in _files(self.cluster):
            waiting = _read(path, Waiting.from_json)
            if waiting is not None and waiting.still_on_cluster(self.root):
                found.append(waiting)
            elif clean:
                path.unlink(missing_ok=True)
        return order(found)

    def put_on_cluster(self, waiting: Waiting) -> None:
        self.cluster.mkdir(exist_ok=True, mode=0o700)
        _write(self.cluster / _file_name(waiting.project, waiting.task), waiting.to_json())

    def off_cluster(self, task: TaskPaths) -> Waiting | None:
        """Remove the task's record of waiting in the cluster's queue; the record, if any."""
        path = self.cluster / _file_name(task.project_id, task.task_id)
        waiting = _read(path, Waiting.from_json)
        path.unlink(missing_ok=True)
        return waiting

    def join(self, waiting: Waiting) -> Waiting:
        """The record as it joins the queue proper: at its end, now."""
        return replace(waiting, joined=True, blocked=None, seq=self.next_seq())

    def ahead_of(self, waiting: Waiting, records: Sequence[Waiting]) -> list[Waiting]:
        """The eligible records before `waiting` in the queue's order."""
        key = (-waiting.priority, waiting.seq)
        return [w for w in records if w.eligible and (-w.priority, w.seq) < key]


@record
class Claim:
    """A start a keeper took off the queue (`starting/`): the record, the keeper, since when."""

    waiting: Waiting
    keeper: Holder
    at: float
    ticket: str


def _claim(data: Mapping[str, Any]) -> Claim:
    waiting = Waiting.from_json(_object(data.get("record"), "record"))
    keeper = _holder({**data, "project": waiting.project, "task": waiting.task,
                      "agent": waiting.agent})  # fmt: skip
    return Claim(
        waiting, keeper, _number(data.get("at"), "at"), _text(data.get("ticket"), "ticket")
    )


def _label_of(name: str) -> str:
    project, _, task = name.removesuffix(".json").partition(SEP)
    return f"{project}/{task}"


def owned_by_others(path: Path) -> str:
    """Why a file the keeper would act on is not this user's alone ('' if it is): owned by
    another, or writable by anyone else. The keeper runs what such files say."""
    import stat

    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is not this user's alone (owner {st.st_uid}, mode {st.st_mode:o})"
    return ""


def _agent_file(agent: str) -> str:
    """An agent's pause record's name: its name, quoted so that no name leaves the folder."""
    from urllib.parse import quote

    return f"{quote(agent, safe='')}.json"


def _holder(data: Mapping[str, Any]) -> Holder:
    started = data.get("started")
    return Holder(
        str(data["project"]), str(data["task"]), str(data["agent"]), int(data["pid"]),
        float(started) if started is not None else None,
    )  # fmt: skip


def _record(path: Path) -> Waiting | None:
    """The queue record at `path`: None if there is none, a stand-in saying why (`unreadable`)
    if it cannot be read or is not a record of the task its name says."""
    stem = path.name.removesuffix(".json")
    project, _, task = stem.partition(SEP)
    try:
        waiting = Waiting.from_json(jsonfile.read_object(path, RECORD_CAP))
    except FileNotFoundError:
        return None
    except ValueError as exc:  # jsonfile.Unreadable too
        return Waiting(project, task, "", 0, unreadable=str(exc))
    if waiting.label != f"{project}/{task}":
        return Waiting(project, task, "", 0, unreadable=f"it names task {shown(waiting.label)}")
    return waiting


# Each field of a record checked for its type: a ValueError names the field and its value.


def _text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} {shown(value)} is not a string")
    return value


def _whole(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} {shown(value)} is not a whole number")
    return value


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} {shown(value)} is not a number")
    return float(value)


def _flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} {shown(value)} is not true or false")
    return value


def _texts(value: object, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{name} {shown(value)} is not a list of strings")
    return value


def _object(value: object, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{name} {shown(value)} is not an object")
    return value


def _maybe(check: Callable[[object, str], T], value: object, name: str) -> T | None:
    """`check(value)`, or None for a null (or missing) field."""
    return None if value is None else check(value, name)


def _start(value: object, name: str) -> dict[str, Any]:
    """A detached start: `{argv: [str], cwd: str, env: {str: str}}`."""
    start = _object(value, name)
    _texts(start.get("argv"), f"{name}.argv")
    _text(start.get("cwd"), f"{name}.cwd")
    for key, variable in _object(start.get("env") or {}, f"{name}.env").items():
        _text(variable, f"{name}.env.{key}")
    return start


def _cluster(value: object, name: str) -> dict[str, Any]:
    """Where it waits on a Ray cluster: `{group: str, needs: {str: number}}`."""
    cluster = _object(value, name)
    _maybe(_text, cluster.get("group"), f"{name}.group")
    for key, amount in _object(cluster.get("needs") or {}, f"{name}.needs").items():
        _number(amount, f"{name}.needs.{key}")
    return cluster


def _files(folder: Path) -> list[Path]:
    try:
        return [folder / name for name in os.listdir(folder) if name.endswith(".json")]
    except OSError:
        return []


def _read(path: Path, make: Callable[[Mapping[str, Any]], T]) -> T | None:
    """`make(data)` of the JSON file at `path`; None if it is not there or not what it should
    be (a damaged slot counts for nothing, and is written afresh by the next holder; a damaged
    record of the cluster's queue is only a listing's hint)."""
    try:
        return make(jsonfile.read_object(path, RECORD_CAP))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path, data: Mapping[str, Any]) -> None:
    _write_text(path, json.dumps(data, ensure_ascii=False))


def _write_text(path: Path, text: str) -> None:
    """Whole or not at all, readable by the owner only (a record may hold an environment)."""
    runfolder.atomic_write(path, text)
