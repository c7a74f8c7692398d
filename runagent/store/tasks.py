"""Reading a runs root: projects, tasks and runs with their derived, liveness-checked status.

Nothing here writes. A run recorded as `running` whose supervisor is gone (dead, or its pid reused
by another process) is shown as `lost`, or as `failed` when its supervisor left word that it could
not write the run's end (a full disk); one whose run-info.yaml cannot be read as `unreadable`,
with the reason (and a task whose queue record cannot be read, likewise); the task's status is
derived from its lock holder, its DONE marker and its latest run, never stored twice.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from runagent.errors import AlreadyCompletedError, NotFoundError
from runagent.record import record
from runagent.store import race, runfolder, taskfolder
from runagent.store.host import foreign_alive, is_here
from runagent.store.lock import Holder, live_holder
from runagent.store.pids import group_alive, is_alive
from runagent.store.runfolder import RunPaths, TaskPaths
from runagent.store.runinfo import Reason, RunInfo, RunStatus, Usage


class Runs(Protocol):
    """A task's runs as a listing shows them (the root's index sums them up: store/index.py)."""

    @property
    def count(self) -> int: ...
    @property
    def latest(self) -> RunInfo | None: ...
    @property
    def operations(self) -> tuple[str, ...]: ...


class TaskStatus(enum.StrEnum):
    PENDING = "pending"  # created, no run yet
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    STOPPED = "stopped"
    LOST = "lost"
    UNREADABLE = "unreadable"  # its latest run's run-info.yaml, or its queue record, cannot be read
    # A task of operations runs (`run-agent ops`, which write no run-info):
    AWAITING_APPROVAL = "awaiting_approval"  # one of its runs is paused on an operation
    IDLE = "idle"  # every batch answered; its runs take the next message
    # Not running yet (runagent/fleet/):
    QUEUED = "queued"  # waiting for a slot under `limits:`
    BLOCKED = "blocked"  # waiting for the tasks it runs after (or one of them did not complete)
    # Ended by run-agent for a person to look at (its latest run failed for that reason):
    OVER_BUDGET = "over_budget"  # a budget stopped it (a run's reason `budget`, exit 4)
    STUCK = "stuck"  # attempts in a row made no progress (a run's reason `stuck`, exit 5)


@record
class QueuePlace:
    """Where a queued or blocked task stands, as a listing shows it."""

    ahead: int
    waits_for: str
    priority: int = 0
    after: tuple[str, ...] = ()
    detached: bool = True  # started by the keeper when its turn comes (else a foreground run)
    blocked: bool = False  # waits for other tasks (not for a slot)
    unreadable: str | None = None  # its record cannot be read: why (it waits for a person)

    def to_dict(self) -> dict[str, Any]:
        return {"ahead": self.ahead, "waits_for": self.waits_for, "priority": self.priority,
                "after": list(self.after), "detached": self.detached,
                "unreadable": self.unreadable}  # fmt: skip


# The queue's places, to a reader below the fleet (which it never imports): none.
NO_QUEUE: Mapping[str, QueuePlace] = MappingProxyType({})


@record
class RacerView:
    """One racer of a race, as the race's row shows it beside the others: its agent, attempt,
    spend, last check, and why it is out of the race when it is."""

    racer: race.Racer
    view: TaskView
    won: bool = False

    @property
    def attempt(self) -> int | None:
        latest = self.view.latest
        return latest.attempt if latest is not None and latest.attempt else None

    @property
    def last_check(self) -> int | None:
        """The exit code of the check its latest run ran (None: none ran)."""
        latest = self.view.latest
        return getattr(latest, "check_exit_code", None) if latest is not None else None

    @property
    def reason(self) -> str | None:
        """Why it is out of the race (as the race stopped it, else as its latest run ended);
        None while it races, and for the winner."""
        if self.won or self.view.status in _RACING:
            return None
        if self.racer.out is not None:
            return self.racer.out
        latest = self.view.latest
        if latest is not None and latest.reason is not None:
            return latest.reason.value
        return self.view.status.value

    @property
    def message(self) -> str | None:
        if self.won or self.view.status in _RACING:
            return None
        if self.racer.message:
            return self.racer.message
        latest = self.view.latest
        return latest.describe() if latest is not None else None

    @property
    def agent(self) -> str | None:
        latest = self.view.latest
        return self.racer.agent or (latest.agent if latest is not None else None)

    def to_dict(self) -> dict[str, Any]:
        used = self.view.usage
        return {
            "task_id": self.view.paths.task_id,
            "agent": self.agent,
            "status": self.view.status.value,
            "attempt": self.attempt,
            "usage": used.to_dict() if used else None,
            "last_check": self.last_check,
            "won": self.won,
            "reason": self.reason,
            "message": self.message,
        }


@record
class RaceView:
    """A race task's racers side by side, with its record (store/race.py)."""

    record: race.Race
    racers: tuple[RacerView, ...]

    @property
    def usage(self) -> Usage | None:
        """What its racers used, summed (what its budget counts)."""
        found = [r.view.usage for r in self.racers if r.view.usage is not None]
        return sum(found[1:], found[0]) if found else None

    def to_dict(self) -> dict[str, Any]:
        r = self.record
        used = self.usage
        return {
            "racers": [racer.to_dict() for racer in self.racers],
            "started": r.started,
            "winner": r.winner,
            "outcome": r.outcome,
            "message": r.message,
            "budget": list(r.budget) or None,
            "usage": used.to_dict() if used else None,
        }


@record
class TaskView:
    """A task as a listing shows it: its status, runs, latest run, supervisor and spend."""

    paths: TaskPaths
    status: TaskStatus
    run_count: int
    latest: RunInfo | None
    supervisor: Holder | None
    usage: Usage | None = None  # what its runs used, summed as each ended
    queue: QueuePlace | None = None  # queued or blocked: where it stands
    race: RaceView | None = None  # a race's task: its racers
    unreadable: str | None = None  # why its race record cannot be read
    # Its operations runs, by id, where the root's index says (None: not known; look at each)
    operations: tuple[str, ...] | None = None

    @property
    def label(self) -> str:
        return self.paths.label

    @property
    def status_words(self) -> str:
        """Its status as a listing shows it: a queued task with how many start before it and
        what it waits for ("queued: 3 ahead (max_running 4)"), a blocked one with the tasks it
        waits for ("blocked: waits for p/b")."""
        place = self.queue
        if place is None or place.unreadable is not None:
            return self.status.value
        if self.status is TaskStatus.BLOCKED:
            return f"blocked: {place.waits_for}"
        return f"queued: {place.ahead} ahead ({place.waits_for})"

    def to_dict(self) -> dict[str, Any]:
        """The task's row, as `list --json`, `status --json` and the API give it."""
        return {
            "project_id": self.paths.project_id,
            "task_id": self.paths.task_id,
            "status": self.status.value,
            "runs": self.run_count,
            "latest_run": self.latest.to_dict() if self.latest else None,
            "supervisor_pid": self.supervisor.pid if self.supervisor else None,
            "supervisor_host": self.supervisor.host if self.supervisor else None,
            "folder": str(self.paths.folder),
            "usage": self.usage.to_dict() if self.usage else None,
            "queue": self.queue.to_dict() if self.queue else None,
            **({"race": self.race.to_dict()} if self.race is not None else {}),
            **({"unreadable": self.unreadable} if self.unreadable is not None else {}),
        }


def is_lost(info: RunInfo) -> bool:
    """Whether the run is recorded as running but its supervisor is gone (dead, or its pid now
    another process's): nobody will ever write its end."""
    if info.status is not RunStatus.RUNNING:
        return False
    if unsupervised(info):
        # conductor-loop's record names no supervisor: it runs while its agent process, or its
        # process group, does (as its own reader judges a run it started or only watches).
        return not (is_alive(info.pid, None) or group_alive(info.pgid))
    if is_here(info.host):
        return not is_alive(info.supervisor_pid, info.supervisor_start)
    assert info.host is not None
    label = f"{info.project_id}/{info.task_id}"
    pid = info.supervisor_pid
    return pid is None or not foreign_alive(label, info.host, pid, info.supervisor_start)


def unsupervised(info: RunInfo) -> bool:
    """Whether the run names no supervisor of run-agent's: conductor-loop's, whose loop holds
    no run-agent lock (while it is recorded running and not lost, its task runs)."""
    return info.supervisor_pid is None and info.host is None


def live_unsupervised(task: TaskPaths) -> bool:
    """Whether the task's latest run is conductor-loop's, running and alive."""
    latest = latest_run(task)
    return latest is not None and latest.status is RunStatus.RUNNING and unsupervised(latest)


def process_alive(info: RunInfo) -> bool:
    """Whether a run recorded as running may still have a live process: its supervisor, or
    its agent (an orphan outliving a dead supervisor). Cleanup never removes such a run."""
    if info.status is not RunStatus.RUNNING:
        return False
    return not is_lost(info) or (is_here(info.host) and is_alive(info.pid, None))


def effective(info: RunInfo, run_folder: Path) -> RunInfo:
    """The run as it really is: a lost run reads as `lost`, or as `failed` with the reason when
    its supervisor could not write the run's end."""
    if is_lost(info):
        return runfolder.unrecorded(run_folder, info) or info.replace(status=RunStatus.LOST)
    return info


def runs(task: TaskPaths, run_ids: list[str] | None = None) -> list[RunInfo]:
    """Every run of the task with run-info (of `run_ids`, if given), oldest first,
    liveness-checked; one whose run-info.yaml cannot be read is there as `unreadable`, saying
    why."""
    found = []
    bounds = task.fence
    for run_id in task.run_ids() if run_ids is None else run_ids:
        folder = task.run_folder(run_id)
        info = runfolder.read_run_record(folder, bounds)
        if info is not None:
            found.append(effective(info, folder))
    return found


def latest_run(task: TaskPaths, run_ids: list[str] | None = None) -> RunInfo | None:
    """The task's latest run with run-info (of `run_ids`, its runs as just listed)."""
    bounds = task.fence
    for run_id in reversed(task.run_ids() if run_ids is None else run_ids):
        folder = task.run_folder(run_id)
        info = runfolder.read_run_record(folder, bounds)
        if info is not None:
            return effective(info, folder)
    return None


def view(
    task: TaskPaths, places: Mapping[str, QueuePlace], runs: Mapping[str, Runs] | None = None
) -> TaskView:
    """The task as it is now, with its place in the queue from `places` (P/T: where a queued or
    blocked task stands, as runagent.listing reads them; NO_QUEUE below the fleet, where
    a queued task is as a pending one); its runs as `runs` sums them up (P/T: the root's
    index, runagent/store/index.py), else as its folder holds them."""
    holder = live_holder(task.lock)
    summary = runs.get(task.label) if runs is not None else None
    operations = None
    if summary is not None:
        count, latest, operations = summary.count, summary.latest, summary.operations
    else:
        run_ids = task.run_ids()  # listed once, for the latest run and the count
        count, latest = len(run_ids), latest_run(task, run_ids)
    # A loop that holds its task yet waits in the queue (its agent paused by a provider's
    # limit, its slot given back) is queued, saying what for.
    place = places.get(task.label)
    if place is not None and place.unreadable is not None:
        status = TaskStatus.UNREADABLE  # its queue record: it waits for a person
    elif place is not None:
        status = TaskStatus.BLOCKED if place.blocked else TaskStatus.QUEUED
    elif holder is not None:
        status = TaskStatus.RUNNING
    elif runfolder.stat_in(task.fence, task.done) is not None:
        status = TaskStatus.COMPLETED
    elif latest is None:  # never ran: a task taken out of the queue before it did is stopped
        status = operations_status(task) or (
            TaskStatus.STOPPED if runfolder.stat_in(task.fence, task.left_queue) else
            TaskStatus.PENDING)  # fmt: skip
    else:
        status = TaskStatus(latest.status.value)
        if status is TaskStatus.RUNNING and not unsupervised(latest):
            status = TaskStatus.LOST  # a supervisor alive, yet not holding the lock
        elif status is TaskStatus.FAILED and latest.reason in _ENDED_FOR:
            status = _ENDED_FOR[latest.reason]  # one word for why run-agent ended it, everywhere
    used = taskfolder.read_task_usage(task)
    found = TaskView(task, status, count, latest, holder, used, place, operations=operations)
    if runfolder.stat_in(task.fence, task.race) is not None:
        return _race_view(found, places, runs)
    return found


# A failed task's status when run-agent ended its loop for a person to look at.
_ENDED_FOR = {Reason.BUDGET: TaskStatus.OVER_BUDGET, Reason.STUCK: TaskStatus.STUCK}

# A race's status once it is over (race.yaml's outcome), while nothing holds its task.
_RACE_ENDED = {
    race.Ending.COMPLETED: TaskStatus.COMPLETED,
    race.Ending.FAILED: TaskStatus.FAILED,
    race.Ending.STOPPED: TaskStatus.STOPPED,
    race.Ending.BUDGET: TaskStatus.OVER_BUDGET,
}
# A racer still in the race.
_RACING = frozenset({TaskStatus.RUNNING, TaskStatus.QUEUED, TaskStatus.BLOCKED, TaskStatus.PENDING})


def _race_view(
    found: TaskView, places: Mapping[str, QueuePlace], runs: Mapping[str, Runs] | None
) -> TaskView:
    """A race's task as it is: running while its watcher holds it, then as its record says it
    ended (lost, when its watcher died before that), with its racers side by side."""
    try:
        record = race.read(found.paths)
    except ValueError as exc:
        return replace(found, status=TaskStatus.UNREADABLE, unreadable=str(exc))
    if record is None:  # gone since it was seen
        return found
    racers = tuple(
        RacerView(r, view(t, places, runs), won=r.task_id == record.winner)
        for r, t in zip(record.racers, record.tasks(found.paths), strict=True)
    )
    status = found.status
    if found.supervisor is None:
        ended = _RACE_ENDED.get(record.outcome or "")
        status = ended if ended is not None else TaskStatus.LOST
    return replace(found, status=status, race=RaceView(record, racers))


def waited_on_by(task: TaskPaths, places: Mapping[str, QueuePlace]) -> list[str]:
    """The tasks (P/T) that wait for `task` to complete (started `--after` it); `places` as
    for `view`."""
    return sorted(label for label, place in places.items() if task.label in place.after)


def operations_status(task: TaskPaths) -> TaskStatus | None:
    """What a task of operations runs is doing, which no run-info says: awaiting approval while
    one of its runs is paused, running while one answers a message, else idle; None when it has
    no operations run."""
    bounds = task.fence
    runs = [RunPaths(task.run_folder(run_id)) for run_id in task.run_ids()]
    runs = [run for run in runs if runfolder.is_file_in(bounds, run.ops_settings)]
    if not runs:
        return None
    if any(runfolder.is_file_in(bounds, run.approval_pending) for run in runs):
        return TaskStatus.AWAITING_APPROVAL
    if any(live_holder(run.ops_lock) is not None for run in runs):
        return TaskStatus.RUNNING
    return TaskStatus.IDLE


def find_task(root: Path, project_id: str, task_id: str) -> TaskPaths:
    """The task's paths; NotFoundError naming it if there is no such task."""
    task = runfolder.confine(TaskPaths(root, project_id, task_id))
    if not task.folder.is_dir():
        if not (root / project_id).is_dir():
            raise NotFoundError(
                f"project {project_id!r} not found under {root}; see `run-agent list`"
            )
        raise NotFoundError(
            f"task {project_id}/{task_id} not found under {root}; "
            f"see `run-agent list --project {project_id}`"
        )
    return task


def all_tasks(
    root: Path, places: Mapping[str, QueuePlace], project_id: str | None = None
) -> list[TaskView]:
    """Every task under `root` (or one project's), `places` as for `view`."""
    return [view(task, places) for task in all_paths(root, project_id)]


def all_paths(root: Path, project_id: str | None = None) -> list[TaskPaths]:
    """Every task's paths under `root` (or one project's)."""
    projects = [project_id] if project_id else runfolder.project_ids(root)
    return [TaskPaths(root, p, t) for p in projects for t in runfolder.task_ids(root, p)]


def refuse_completed(view: TaskView, again: bool) -> None:
    """The one rule for running a completed task again (run, resume, the API, the page): only
    when asked to in so many words; its DONE is then moved into the run it came from."""
    if view.status is TaskStatus.COMPLETED and not again:
        raise AlreadyCompletedError(
            f"task {view.label} is already completed ({view.paths.done} exists); "
            "run it again with --again"
        )


def usage(task: TaskPaths) -> Usage | None:
    """What the task's runs used, summed over those whose agent said; None if none did (read
    from every run, so right even for runs recorded before the task kept its sum)."""
    total = None
    for info in runs(task):
        if info.usage is not None:
            total = info.usage if total is None else total + info.usage
    return total


def project_usage(views: list[TaskView]) -> dict[str, Usage]:
    """What each project's tasks used, by project id (projects whose agents never said: none)."""
    totals: dict[str, Usage] = {}
    for v in views:
        if v.usage is not None:
            project = v.paths.project_id
            totals[project] = totals[project] + v.usage if project in totals else v.usage
    return totals
