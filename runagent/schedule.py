"""Cron schedules: when each fires, what a firing starts, and the scheduler that fires them.

The scheduler is driven by `tick(now)` with the time passed in, so tests can walk it through a
DST change minute by minute. It keeps, per schedule, the moment it last checked and the task it
last fired (in the runs root's .schedules.yaml), so that after downtime the firings it missed are
reported, not run in a burst (with `catch_up: true`, the last missed one is run).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import yaml

from runagent import listing
from runagent.config.settings import CRON_ALIASES, Overlap, ScheduleConfig
from runagent.errors import AlreadyRunningError, RunAgentError
from runagent.loop.context import validate_id
from runagent.record import record
from runagent.store import runfolder, tasks
from runagent.store.runfolder import TaskPaths


@record
class Firing:
    schedule: ScheduleConfig
    at: datetime  # the scheduled moment, in the schedule's time zone
    task_id: str

    @property
    def label(self) -> str:
        return f"{self.schedule.project}/{self.task_id}"


def zone(schedule: ScheduleConfig) -> ZoneInfo:
    return ZoneInfo(schedule.timezone)


def firings(schedule: ScheduleConfig, after: datetime) -> Iterator[datetime]:
    """The schedule's firings strictly after `after`, in its time zone, for ever."""
    from cronsim import CronSim

    start = after.astimezone(zone(schedule))
    for moment in CronSim(CRON_ALIASES.get(schedule.cron, schedule.cron), start):
        if moment > start:
            yield moment


def firings_between(schedule: ScheduleConfig, after: datetime, until: datetime) -> list[datetime]:
    """Firings in (after, until]."""
    out = []
    for moment in firings(schedule, after):
        if moment > until:
            break
        out.append(moment)
    return out


def next_firings(schedule: ScheduleConfig, after: datetime, count: int) -> list[datetime]:
    found = []
    for moment in firings(schedule, after):
        found.append(moment)
        if len(found) == count:
            break
    return found


def task_id(schedule: ScheduleConfig, at: datetime, root: Path | None = None) -> str:
    """The task id of a firing: the schedule's template with {name} {date} {time} {datetime}.

    A template with a time in it means "every firing its own task": when `root` already holds
    that task (a second firing within the same second), the id gets -2, -3, ... appended.
    """
    local = at.astimezone(zone(schedule))
    try:
        value = schedule.task.format(
            name=schedule.name,
            date=f"{local:%Y%m%d}",
            time=f"{local:%H%M%S}",
            datetime=f"{local:%Y%m%d-%H%M%S}",
        )
    except (KeyError, IndexError, ValueError) as exc:
        raise RunAgentError(
            f"schedules.{schedule.name}.task: {schedule.task!r} has an unknown placeholder "
            f"({exc}); use {{name}} {{date}} {{time}} {{datetime}}"
        ) from exc
    validate_id("task", value)
    if root is None or not any(p in schedule.task for p in ("{time}", "{datetime}")):
        return value
    unique, n = value, 1
    while (root / schedule.project / unique).exists():
        n += 1
        unique = validate_id("task", f"{value}-{n}")
    return unique


@dataclass
class ScheduleState:
    last_checked: datetime | None = None
    last_fired: datetime | None = None
    last_task: str | None = None
    last_outcome: str | None = None  # None while the last firing runs (or none fired)

    def to_dict(self) -> dict[str, Any]:
        return {
            "last_checked": self.last_checked.isoformat() if self.last_checked else None,
            "last_fired": self.last_fired.isoformat() if self.last_fired else None,
            "last_task": self.last_task,
            "last_outcome": self.last_outcome,
        }

    @classmethod
    def from_dict(cls, data: Any) -> ScheduleState:
        if not isinstance(data, dict):
            return cls()

        def stamp(key: str) -> datetime | None:
            value = data.get(key)
            try:
                return datetime.fromisoformat(value) if value else None
            except (TypeError, ValueError):
                return None

        return cls(stamp("last_checked"), stamp("last_fired"), data.get("last_task"),
                   data.get("last_outcome"))  # fmt: skip


def load_state(root: Path) -> dict[str, ScheduleState]:
    try:
        data = runfolder.load_yaml(runfolder.schedule_state_path(root).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): ScheduleState.from_dict(v) for k, v in data.items()}


@contextlib.contextmanager
def locked_state(root: Path) -> Iterator[dict[str, ScheduleState]]:
    """The schedules' state, read afresh under an exclusive lock and written back when the block
    ends: every writer (the server's scheduler, `schedule run`, cron's `schedule now`) changes
    what is on disk now, never an older copy of it, so no one erases another's firing."""
    runfolder.make_folder(root)
    with runfolder.exclusive(runfolder.schedule_lock_path(root)):
        state = load_state(root)
        yield state
        save_state(root, state)


def save_state(root: Path, state: Mapping[str, ScheduleState]) -> None:
    runfolder.make_folder(root)
    text = runfolder.dump_yaml({k: v.to_dict() for k, v in state.items()}, sort_keys=True)
    runfolder.atomic_write(runfolder.schedule_state_path(root), text)


Launch = Callable[[Firing], int]  # starts a firing's loop, returns its supervisor pid


def _always() -> bool:
    return True


@dataclass
class Scheduler:
    """Fires the enabled schedules; `launch` starts a firing (a detached supervisor)."""

    schedules: Mapping[str, ScheduleConfig]
    root: Path
    launch: Launch
    log: Callable[[str], None] = print
    state: dict[str, ScheduleState] = field(default_factory=dict)
    queued: dict[str, Firing] = field(default_factory=dict)
    # Whether this scheduler may fire (control.hold_scheduler): on a cluster, only the one that
    # holds the cluster-wide scheduler name does, however many run.
    leader: Callable[[], bool] = _always

    def start(self, now: datetime) -> None:
        """Load what was fired before; report (and with catch_up, run) what was missed."""
        if not self.leader():
            return
        with locked_state(self.root) as self.state:
            self._catch_up(now)

    def _catch_up(self, now: datetime) -> None:
        for schedule in self.enabled():
            state = self.state.setdefault(schedule.name, ScheduleState())
            if state.last_checked is None:
                state.last_checked = now
                continue
            missed = firings_between(schedule, state.last_checked, now)
            if missed:
                self.log(
                    f"{schedule.name}: missed {len(missed)} firing(s) while not running, "
                    f"from {missed[0].isoformat()} to {missed[-1].isoformat()}"
                    + ("; running the last one" if schedule.catch_up else "; not run")
                )
                if schedule.catch_up:
                    self._fire(schedule, missed[-1])
            state.last_checked = now

    def enabled(self) -> list[ScheduleConfig]:
        return [s for s in self.schedules.values() if s.enabled]

    def tick(self, now: datetime) -> None:
        """Fire what is due up to `now`, start queued firings, and log finished ones."""
        if not self.leader():
            return
        with locked_state(self.root) as self.state:
            for schedule in self.enabled():
                state = self.state.setdefault(schedule.name, ScheduleState(last_checked=now))
                due = firings_between(schedule, state.last_checked or now, now)
                state.last_checked = now
                if len(due) > 1:  # the clock jumped (suspend, a slow tick): the latest counts
                    self.log(f"{schedule.name}: {len(due) - 1} firing(s) passed while busy")
                if due:
                    self._fire(schedule, due[-1])
                self._finish(schedule, state)
                if schedule.keep is not None:
                    self._retain(schedule, now)

    def fire_now(self, schedule: ScheduleConfig, now: datetime) -> Firing:
        """Fire `schedule` at once; raise (AlreadyRunningError when its overlap policy says the
        previous firing blocks it) instead of logging, for `schedule now`."""
        with locked_state(self.root) as self.state:
            state = self.state.setdefault(schedule.name, ScheduleState())
            now = now.replace(microsecond=0)  # a firing's time is shown and recorded to the second
            firing = Firing(
                schedule, now.astimezone(zone(schedule)), task_id(schedule, now, self.root)
            )
            if schedule.overlap is not Overlap.ALLOW and self._running(state, schedule):
                raise AlreadyRunningError(
                    f"schedule {schedule.name}: its previous firing {schedule.project}/"
                    f"{state.last_task} is still running (overlap: {schedule.overlap.value})"
                )
            pid = self.launch(firing)
            state.last_fired, state.last_task, state.last_outcome = firing.at, firing.task_id, None
        self.log(f"{schedule.name}: fired {firing.at.isoformat()} as {firing.label} "
                 f"({_launched(pid)})")  # fmt: skip
        return firing

    def _running(self, state: ScheduleState, schedule: ScheduleConfig) -> bool:
        if not state.last_task:
            return False
        task = TaskPaths(self.root, schedule.project, state.last_task)
        return listing.view(task).status is tasks.TaskStatus.RUNNING

    def _fire(self, schedule: ScheduleConfig, at: datetime) -> Firing | None:
        state = self.state.setdefault(schedule.name, ScheduleState())
        try:
            firing = Firing(schedule, at, task_id(schedule, at, self.root))
        except RunAgentError as exc:
            self.log(f"{schedule.name}: not fired: {exc}")
            return None
        if self._running(state, schedule):
            previous = f"{schedule.project}/{state.last_task}"
            if schedule.overlap is Overlap.SKIP:
                self.log(f"{schedule.name}: skipped {at.isoformat()}: {previous} still runs")
                return None
            if schedule.overlap is Overlap.QUEUE:
                self.queued[schedule.name] = firing
                self.log(f"{schedule.name}: queued {at.isoformat()} until {previous} ends")
                return None
        return self._launch(firing, state)

    def _launch(self, firing: Firing, state: ScheduleState) -> Firing | None:
        name = firing.schedule.name
        try:
            pid = self.launch(firing)
        except RunAgentError as exc:  # a failing firing must not stop the scheduler
            self.log(f"{name}: firing {firing.at.isoformat()} as {firing.label} failed: {exc}")
            state.last_outcome = f"not started: {exc}"
            return None
        state.last_fired, state.last_task, state.last_outcome = firing.at, firing.task_id, None
        self.log(f"{name}: fired {firing.at.isoformat()} as {firing.label} ({_launched(pid)})")
        return firing

    def _retain(self, schedule: ScheduleConfig, now: datetime) -> None:
        """Let go of the firings its `keep:` no longer keeps (never a running one)."""
        from runagent.store import cleanup

        for task in expired(self.root, schedule, now):
            try:
                cleanup.carry_out([cleanup.delete_plan(task)], self.root)
            except RunAgentError as exc:  # started meanwhile: kept, and tried again later
                self.log(f"{schedule.name}: kept {task.label}: {exc}")
                continue
            self.log(f"{schedule.name}: removed {task.label} (keep: {schedule.keep})")

    def _finish(self, schedule: ScheduleConfig, state: ScheduleState) -> None:
        if state.last_task and state.last_outcome is None and not self._running(state, schedule):
            task = TaskPaths(self.root, schedule.project, state.last_task)
            state.last_outcome = listing.view(task).status.value
            self.log(f"{schedule.name}: {schedule.project}/{state.last_task} "
                     f"{state.last_outcome}")  # fmt: skip
        queued = self.queued.get(schedule.name)
        if queued is not None and not self._running(state, schedule):
            del self.queued[schedule.name]
            self._launch(queued, state)


def _launched(pid: int) -> str:
    """How a firing's start went, for the log: its supervisor, or queued (pid 0)."""
    return f"supervisor pid {pid}" if pid else "queued: it starts when its turn comes"


def firing_tasks(root: Path, schedule: ScheduleConfig) -> list[TaskPaths]:
    """The tasks the schedule's firings made (ids its `task` template gives), oldest first."""
    pattern = re.escape(schedule.task)
    for name, form in (("name", re.escape(schedule.name)), ("date", r"\d{8}"),
                       ("time", r"\d{6}"), ("datetime", r"\d{8}-\d{6}")):  # fmt: skip
        pattern = pattern.replace(re.escape("{" + name + "}"), form)
    made = re.compile(pattern + r"(?:-\d+)?")
    ids = [t for t in runfolder.task_ids(root, schedule.project) if made.fullmatch(t)]
    return [TaskPaths(root, schedule.project, t) for t in ids]


def expired(root: Path, schedule: ScheduleConfig, now: datetime) -> list[TaskPaths]:
    """The schedule's finished tasks its `keep:` lets go: beyond the newest `last`, older than
    `older_than`, and (with `failed`) completed; never one that runs."""
    keep = schedule.keep
    if keep is None:
        return []
    made = firing_tasks(root, schedule)
    candidates = made[: len(made) - keep.last] if keep.last else made
    gone = []
    for task in candidates:
        view = listing.view(task)
        if view.status in (tasks.TaskStatus.RUNNING, tasks.TaskStatus.PENDING):
            continue
        if keep.failed and view.status is not tasks.TaskStatus.COMPLETED:
            continue
        ended = view.latest.end_time if view.latest else None
        young = ended is not None and now - datetime.fromisoformat(ended) < timedelta(
            seconds=keep.older_than or 0
        )
        if keep.older_than is not None and young:
            continue
        gone.append(task)
    return gone


def describe(
    schedules: Mapping[str, ScheduleConfig], root: Path, now: datetime, count: int = 3
) -> list[dict[str, Any]]:
    """Each schedule as `schedule list --json` and the server show it: next firings, last one."""
    state = load_state(root)
    rows = []
    for config in schedules.values():
        last = state.get(config.name, ScheduleState())
        upcoming = next_firings(config, now, count) if config.enabled else []
        if last.last_task and not (last.last_outcome or "").startswith("not started"):
            # The last firing's outcome is its task's status, read now rather than stored.
            task = TaskPaths(root, config.project, last.last_task)
            last.last_outcome = listing.view(task).status.value
        rows.append({
            "name": config.name, "cron": config.cron, "timezone": config.timezone,
            "enabled": config.enabled, "overlap": config.overlap.value,
            "project": config.project, "task": config.task,
            "next": [t.isoformat() for t in upcoming], **last.to_dict(),
        })  # fmt: skip
    return rows


def seconds_to_next_minute(now: datetime) -> float:
    following = (now + timedelta(minutes=1)).replace(second=0, microsecond=0)
    return max(0.05, (following - now).total_seconds())


def utc_now() -> datetime:
    return datetime.now(UTC)
