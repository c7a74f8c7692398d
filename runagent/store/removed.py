"""What the runs of a root add to /metrics' counters, and what `gc` and `delete` removed of it.

A counter only grows (Prometheus' contract: a fall reads as a reset, and `increase()` then
counts every run again). The figures are read from the run folders, so whatever cleanup removes
is first added to a tally kept under the runs root (`.removed.json`, by the project its folders
were in): a scrape counts the runs there plus the tally. The two never overlap nor leave a gap:
a removal adds to the tally and removes the folders under the tally's lock held exclusively,
and a scrape walks the root and reads the tally under the same lock held shared.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from runagent.store import runfolder, tasks
from runagent.store.jsonfile import Unreadable, read_object
from runagent.store.runfolder import RunPaths, TaskPaths
from runagent.store.runinfo import RunInfo, RunStatus

# Attempt durations, in seconds: from a quick job to a long night's attempt.
BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0)
# Queue waits, in seconds: from a slot freed at once to a night's wait for a budget or a host.
WAIT_BUCKETS = (0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0, 43200.0)
OPERATION_EVENTS = {"createFile", "readFile", "editFile", "deleteFile", "shell"}
VERDICTS = {"policyDenied": "denied", "approvalRequired": "approval_required", "error": "error"}
TALLY_LIMIT = 64 << 20  # bytes of .removed.json read; it grows with the agents and projects
TALLY_VERSION = 1
# Sums of seconds and dollars are kept whole (in micro-seconds, nano-dollars): floats added in
# another order differ in their last bit, and a counter that falls by one bit is reset.
MICRO = 1_000_000
NANO = 1_000_000_000

Key = tuple[str, ...]


class Figures(NamedTuple):
    """What one run adds to the metrics."""

    agent: str
    project: str
    restart: bool  # a restart of its loop
    ended: str | None  # the reason it ended (its status where it names none); None: not ended
    took: float | None  # seconds, where both its start and end can be read
    tokens_in: int
    tokens_out: int
    cost_usd: float
    queued: float | None  # seconds its loop's start waited in a queue, on its first run

    @classmethod
    def of(cls, info: RunInfo) -> Figures:
        ended = None
        took = None
        if info.status not in (RunStatus.RUNNING, RunStatus.UNREADABLE):
            ended = info.reason.value if info.reason else info.status.value
            took = runfolder.seconds_between(info.start_time, info.end_time)
        return cls(info.agent or "unknown", info.project_id, restarted(info), ended, took,
                   info.tokens_in or 0, info.tokens_out or 0, info.cost_usd or 0.0,
                   info.queued_seconds)  # fmt: skip


def restarted(info: RunInfo) -> bool:
    """Whether the run restarted its loop: attempt 2 or later of run-agent's (whose supervisor
    always names its host); of conductor-loop's, which numbers no attempt (its place among its
    task's runs, which gc changes, stands in), a run that names the run before it in its loop."""
    if info.host is None:
        return info.previous_run_id is not None
    return info.attempt > 1


@dataclasses.dataclass
class Histogram:
    """Observations counted into cumulative buckets (`le` bound: how many were at most it)."""

    bounds: tuple[float, ...]
    buckets: list[int]
    count: int = 0
    micros: int = 0  # the observations' sum, in millionths

    @property
    def total(self) -> float:
        return self.micros / MICRO

    @classmethod
    def empty(cls, bounds: tuple[float, ...]) -> Histogram:
        return cls(bounds, [0] * len(bounds))

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            self.buckets[i] += value <= bound
        self.count += 1
        self.micros += round(value * MICRO)

    def add(self, other: Histogram) -> None:
        for i, n in enumerate(other.buckets[: len(self.buckets)]):
            self.buckets[i] += n
        self.count += other.count
        self.micros += other.micros

    def to_dict(self) -> dict[str, Any]:
        return {"le": dict(zip(map(str, self.bounds), self.buckets, strict=True)),
                "count": self.count, "sum_micros": self.micros}  # fmt: skip

    @classmethod
    def from_dict(cls, bounds: tuple[float, ...], data: Any) -> Histogram:
        found = cls.empty(bounds)
        le = data.get("le") if isinstance(data, dict) else None
        if not isinstance(data, dict) or not isinstance(le, dict):
            raise ValueError("a histogram is not {le, count, sum}")
        found.buckets = [_number(le.get(str(bound), 0), int) for bound in bounds]
        found.count = _number(data.get("count", 0), int)
        found.micros = _number(data.get("sum_micros", 0), int)
        return found


@dataclasses.dataclass
class Sums:
    """What runs add up to, as the metrics' counters and histograms label them."""

    started: Counter[Key] = dataclasses.field(default_factory=Counter)  # (agent,)
    ended: Counter[Key] = dataclasses.field(default_factory=Counter)  # (agent, reason)
    restarts: Counter[Key] = dataclasses.field(default_factory=Counter)  # (agent,)
    durations: dict[str, Histogram] = dataclasses.field(default_factory=dict)  # by agent
    waits: dict[str, Histogram] = dataclasses.field(default_factory=dict)  # by agent
    tokens: Counter[Key] = dataclasses.field(default_factory=Counter)  # (agent, project, in|out)
    cost: Counter[Key] = dataclasses.field(default_factory=Counter)  # (agent, project): NANO USD
    operations: Counter[Key] = dataclasses.field(default_factory=Counter)  # (type, verdict)

    def add_run(self, run: Figures) -> None:
        self.started[(run.agent,)] += 1
        if run.restart:
            self.restarts[(run.agent,)] += 1
        if run.ended is not None:
            self.ended[(run.agent, run.ended)] += 1
        if run.took is not None:
            self.durations.setdefault(run.agent, Histogram.empty(BUCKETS)).observe(run.took)
        if run.queued is not None:
            self.waits.setdefault(run.agent, Histogram.empty(WAIT_BUCKETS)).observe(run.queued)
        if run.tokens_in:
            self.tokens[(run.agent, run.project, "in")] += run.tokens_in
        if run.tokens_out:
            self.tokens[(run.agent, run.project, "out")] += run.tokens_out
        if run.cost_usd:
            self.cost[(run.agent, run.project)] += round(run.cost_usd * NANO)

    def add(self, other: Sums) -> Sums:
        """`other` added to these (which are returned)."""
        for name in _COUNTED:
            getattr(self, name).update(getattr(other, name))
        for hists, bounds, more in ((self.durations, BUCKETS, other.durations),
                                    (self.waits, WAIT_BUCKETS, other.waits)):  # fmt: skip
            for agent, hist in more.items():
                hists.setdefault(agent, Histogram.empty(bounds)).add(hist)
        return self

    def __bool__(self) -> bool:
        return any(dataclasses.astuple(self))

    def to_dict(self) -> dict[str, Any]:
        rows = {name: [[*key, n] for key, n in sorted(getattr(self, name).items())]
                for name in _COUNTED}  # fmt: skip
        hists = {name: {agent: h.to_dict() for agent, h in sorted(getattr(self, name).items())}
                 for name in _HISTOGRAMS}  # fmt: skip
        return rows | hists

    @classmethod
    def from_dict(cls, data: Any) -> Sums:
        """ValueError saying what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("a project's figures are not an object")
        found = cls()
        for name, width in _COUNTED.items():
            target = getattr(found, name)
            for row in data.get(name, []):
                if not isinstance(row, list) or len(row) != width + 1:
                    raise ValueError(
                        f"{name} holds {str(row)[:40]}, not {width} labels and a value"
                    )
                key = tuple(str(label) for label in row[:width])
                target[key] += _number(row[width], int)
        for name, bounds in _HISTOGRAMS.items():
            kept = data.get(name, {})
            if not isinstance(kept, dict):
                raise ValueError(f"{name} is not an object")
            getattr(found, name).update(
                {str(agent): Histogram.from_dict(bounds, h) for agent, h in kept.items()}
            )
        return found


# The counted fields and how many labels each has (`cost` in billionths of a dollar); the
# histograms and their bounds.
_COUNTED = {"started": 1, "ended": 2, "restarts": 1, "tokens": 3, "cost": 2, "operations": 2}
_HISTOGRAMS = {"durations": BUCKETS, "waits": WAIT_BUCKETS}


def _number(value: Any, kind: type[int]) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{str(value)[:40]} is not a count")
    return kind(value)


def run_sums(task: TaskPaths, run_id: str) -> Sums:
    """What one run folder of `task` adds: its record's figures (as a scrape reads it, its
    liveness checked), and an operations run's operations."""
    found = Sums()
    folder = task.run_folder(run_id)
    info = runfolder.read_run_record(folder, task.fence)
    if info is not None:
        found.add_run(Figures.of(tasks.effective(info, folder)))
    paths = RunPaths(folder)
    if runfolder.is_file_in(task.fence, paths.ops_settings):
        found.operations.update(operations(paths.events, task.fence))
    return found


def operations(events: Path, fence: str) -> Counter[Key]:
    """The operations one run's events.jsonl answered, by type and verdict."""
    found: Counter[Key] = Counter()
    try:
        lines = runfolder.read_text_in(fence, events).splitlines()
    except (OSError, UnicodeDecodeError):
        return found
    for line in lines:
        for event in _events(line):
            kind = str(event.get("type") or "")
            if kind in OPERATION_EVENTS:
                found[(kind, "done")] += 1
            elif kind in VERDICTS and event.get("operationType"):
                found[(str(event["operationType"]), VERDICTS[kind])] += 1
    return found


def _events(line: str) -> list[dict[str, Any]]:
    try:
        message = json.loads(line)
    except ValueError:
        return []
    events = message.get("events") if isinstance(message, dict) else None
    return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []


def read(root: Path) -> dict[str, Sums]:
    """What was removed from each project of `root`; nothing where the tally is not there or
    cannot be read (a removal then starts it afresh)."""
    try:
        data = read_object(runfolder.removed_path(root), TALLY_LIMIT)
        projects = data.get("projects")
        if not isinstance(projects, dict):
            raise ValueError("it has no projects")
        return {str(p): Sums.from_dict(figures) for p, figures in projects.items()}
    except (FileNotFoundError, NotADirectoryError, Unreadable, ValueError):
        return {}


def removed(root: Path, reaches: Callable[[str], bool] | None = None) -> Sums:
    """What was removed from the projects `reaches` lets through (None: all), summed."""
    total = Sums()
    for project, figures in read(root).items():
        if reaches is None or reaches(project):
            total.add(figures)
    return total


def _write(root: Path, projects: Mapping[str, Sums]) -> None:
    data = {"version": TALLY_VERSION,
            "projects": {p: s.to_dict() for p, s in sorted(projects.items())}}  # fmt: skip
    runfolder.atomic_write(runfolder.removed_path(root), json.dumps(data, indent=1) + "\n")


@contextlib.contextmanager
def _held(root: Path, how: int) -> Iterator[None]:
    """The tally's lock, `how` (LOCK_SH, LOCK_EX), for the block; a root that is not there, or
    one the lock cannot be made in (read-only: nothing can be removed from it either), none."""
    try:
        fd = runfolder.private(runfolder.removed_lock_path(root), os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.EROFS, errno.EPERM):
            raise
        yield
        return
    try:
        fcntl.flock(fd, how)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def counting(root: Path) -> Iterator[None]:
    """A scrape's turn: no removal is carried out while it walks the root and reads the tally."""
    with _held(root, fcntl.LOCK_SH):
        yield


def remove_counted(
    root: Path, task: TaskPaths, run_ids: list[str], remove: Callable[[], None]
) -> None:
    """`remove()` the folders holding `run_ids` of `task`, and add what they counted to the
    tally, as one step for a scrape: each run that is gone afterwards is counted there."""
    with _held(root, fcntl.LOCK_EX):
        counted = [(run_id, run_sums(task, run_id)) for run_id in run_ids]
        remove()
        gone = Sums()
        for run_id, figures in counted:
            if figures and not os.path.lexists(task.run_folder(run_id)):
                gone.add(figures)
        if not gone:
            return
        projects = read(root)
        projects[task.project_id] = projects.get(task.project_id, Sums()).add(gone)
        _write(root, projects)
