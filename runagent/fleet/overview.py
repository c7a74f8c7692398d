"""The fleet at a glance: how many tasks run, wait for a slot, wait for other tasks or wait for a
person; the queue in the order it will start; the tasks whose queue record cannot be read; what
was spent today against each daily budget; and what each task that needs a person waits for,
with the command that answers it (a task blocked by one it runs after that failed or was
stopped among them). The page's first view and `run-agent fleet` show it; it only
reads.
"""

from __future__ import annotations

import os
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from runagent import listing
from runagent.config.settings import Budget, BudgetSettings, LimitsSettings
from runagent.fleet import depends
from runagent.fleet.queue import Fleet, Pause, QueueHold
from runagent.loop import needs
from runagent.loop.needs import Need
from runagent.record import record
from runagent.store import runfolder, spend
from runagent.store.runinfo import Reason, Usage
from runagent.store.spend import GroupBy
from runagent.store.tasks import TaskStatus, TaskView

# A person answers these; a task whose latest run ended so, and that is not running again, waits.
_STOPPED_FOR = {Reason.BUDGET: needs.OVER_BUDGET, Reason.STUCK: needs.STUCK}
_NOT_WAITING = {TaskStatus.RUNNING, TaskStatus.QUEUED, TaskStatus.BLOCKED, TaskStatus.COMPLETED}


@record
class Spent:
    """What was spent today toward one daily budget (None: no budget, only what was spent)."""

    what: str  # "the runs root today", "project p today"
    used: Usage
    budget: Budget | None = None
    project: str | None = None  # None: the whole root

    @property
    def spent(self) -> bool:
        """Whether the budget is reached: nothing more starts under it today."""
        b, used = self.budget, self.used
        return b is not None and bool(b.crossed(used.tokens, used.cost_usd, strict=False))

    def to_dict(self) -> dict[str, Any]:
        b = self.budget
        return {"what": self.what, "used": self.used.to_dict(),
                "budget": None if b is None else {"usd": b.usd, "tokens": b.tokens},
                "words": b.words() if b else None, "spent": self.spent}  # fmt: skip


LAST_LINES = 20  # of a running task's stdout, the tail a reader picks its last readable line in


@record
class Running:
    """A loop that runs, as the fleet lists it first: its task, agent, attempt, since when,
    and the end of its stdout (its last lines, raw: a face reads them by the backend's rules)."""

    view: TaskView
    started: str | None  # its run's start (UTC, as run-info.yaml writes it)
    seconds: float | None  # how long that run has run
    last_lines: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        latest = self.view.latest
        return {
            "project_id": self.view.paths.project_id, "task_id": self.view.paths.task_id,
            "agent": latest.agent if latest else None,
            "backend": latest.backend if latest else None,
            "attempt": latest.attempt if latest else None,
            "run_id": latest.run_id if latest else None,
            "started": self.started, "seconds": self.seconds, "last_lines": list(self.last_lines),
        }  # fmt: skip


def running(view: TaskView, now: datetime | None = None) -> Running:
    """The running task `view` as the fleet lists it."""
    latest = view.latest
    if latest is None:
        return Running(view, None, None)
    now = now or datetime.now(UTC)
    seconds = runfolder.seconds_between(latest.start_time, now.isoformat())
    tail = runfolder.tail(view.paths.run(latest.run_id).stdout, 8192, view.paths.fence)
    kept = [line[:2000] for line in tail.splitlines() if line.strip()][-LAST_LINES:]
    return Running(view, latest.start_time, None if seconds is None else round(seconds, 1),
                   tuple(kept))  # fmt: skip


@record
class Waits:
    """A task that waits for others (`--after`), and where each of them stands now."""

    view: TaskView
    on: tuple[tuple[str, str], ...]  # (P/T, its status; `unknown` for one not listed)

    def to_dict(self) -> dict[str, Any]:
        return {"project_id": self.view.paths.project_id, "task_id": self.view.paths.task_id,
                "status": self.view.status.value,
                "on": [{"task": label, "status": status} for label, status in self.on]}  # fmt: skip


@record
class Overview:
    """The fleet at a glance (`run-agent fleet`, the page's fleet view): counts by status, the
    queue in order, what is blocked, spend against the budgets, what needs a person."""

    counts: dict[str, int]
    queued: tuple[TaskView, ...]  # in the order they start
    blocked: tuple[TaskView, ...]
    spent: tuple[Spent, ...]
    needs: tuple[Need, ...]
    limits: LimitsSettings
    day: str
    unreadable: tuple[TaskView, ...] = ()  # in the queue, its record unreadable: never started
    races: tuple[TaskView, ...] = ()  # the races running, each with its racers side by side
    paused: tuple[Pause, ...] = ()  # agents paused by their provider's limit, by name
    running: tuple[Running, ...] = ()  # the loops that run, longest running first
    hold: QueueHold | None = None  # the whole queue held by a person: nothing queued starts
    after: tuple[Waits, ...] = ()  # which task waits for which (`--after`), by name

    def to_dict(self) -> dict[str, Any]:
        return {
            "day": self.day,
            "counts": self.counts,
            "running": [r.to_dict() for r in self.running],
            "queue": [v.to_dict() for v in (*self.queued, *self.blocked, *self.unreadable)],
            "spent": [s.to_dict() for s in self.spent],
            "needs": [n.to_dict() for n in self.needs],
            "limits": self.limits.to_record(),
            "races": [v.to_dict() for v in self.races],
            "paused": [{**p.to_json(), "words": p.words()} for p in self.paused],
            "hold": self.hold and {**self.hold.to_json(), "words": self.hold.words()},
            "after": [w.to_dict() for w in self.after],
        }


def overview(
    root: Path, limits: LimitsSettings | None = None, budgets: BudgetSettings | None = None,
    projects: frozenset[str] | None = None,
) -> Overview:  # fmt: skip
    """The fleet, or the part of it in `projects` (a token limited to them sees no other
    project's tasks or spend, and not the whole root's)."""
    rows, views = listing.glance(root, projects, _may_need)
    needs = [need for view in views for need in needs_of(view)]
    waiting = [v for v in views if v.queue is not None and v.queue.unreadable is None]
    queued = sorted((v for v in waiting if not _blocked(v)), key=_place)
    blocked = sorted((v for v in waiting if _blocked(v)), key=lambda v: v.label)
    unreadable = [v for v in views if v.queue is not None and v.queue.unreadable is not None]
    races = tuple(v for v in views if v.race is not None and v.status is TaskStatus.RUNNING)
    counts = {  # a race's task is no loop of its own: its racers are, each counted
        "running": sum(row["status"] == "running" and "race" not in row for row in rows.values()),
        "races": len(races),
        "queued": len(queued),
        "blocked": len(blocked),
        "unreadable": len(unreadable),
        "needs_person": len({n.label for n in needs}),
        "tasks": len(rows),
    }
    today = datetime.now(UTC).date()
    spent = _spent(root, budgets or BudgetSettings(), today)
    if projects is not None:
        spent = tuple(s for s in spent if s.project in projects)
    fleet = Fleet(root)
    paused = tuple(sorted(fleet.pauses(clean=False).values(), key=lambda p: p.agent))
    loops = [running(v) for v in views if v.status is TaskStatus.RUNNING and v.race is None]
    loops.sort(key=lambda r: (r.started or "~", r.view.label))
    return Overview(counts, tuple(queued), tuple(blocked), spent, tuple(needs),
                    limits or LimitsSettings(), today.isoformat(), tuple(unreadable),
                    races, paused, tuple(loops), fleet.queue_hold(),
                    _waits(rows, waiting))  # fmt: skip


def _may_need(label: str, row: dict[str, Any]) -> bool:
    """Whether a quiet task may still wait for a person: stopped by its budget or stuck, or a
    copy-paste task (whose chat's reply may be awaited)."""
    latest = row["latest_run"]
    if latest is not None and latest.get("reason") in _STOPPED_FOR:
        return True
    return os.path.isdir(f"{row['folder']}/paste")


def _waits(rows: dict[str, dict[str, Any]], waiting: list[TaskView]) -> tuple[Waits, ...]:
    """The tasks in the queue that name others with `--after`, each with their statuses now
    (`unknown` for one not listed: deleted, or of a project the listing leaves out)."""
    statuses = {label: row["status"] for label, row in rows.items()}
    found = []
    for view in sorted(waiting, key=lambda v: v.label):
        assert view.queue is not None
        if view.queue.after:
            on = tuple((label, statuses.get(label, "unknown")) for label in view.queue.after)
            found.append(Waits(view, on))
    return tuple(found)


def _blocked(view: TaskView) -> bool:
    return view.queue is not None and view.queue.blocked


def _place(view: TaskView) -> tuple[int, str]:
    assert view.queue is not None
    return view.queue.ahead, view.label


def _spent(root: Path, budgets: BudgetSettings, today: date) -> tuple[Spent, ...]:
    """Today's spend of the whole root and of each project that has a budget or spent any."""
    groups, total = spend.summed(spend.runs(root, since=today), (GroupBy.PROJECT,), today)
    by_project = {group.key[0]: group.used for group in groups}
    found = [Spent("the runs root today", total.used, budgets.daily)]
    for project in sorted(by_project.keys() | budgets.projects.keys()):
        used = by_project.get(project, Usage())
        budget = budgets.projects.get(project)
        found.append(Spent(f"project {project} today", used, budget, project))
    return tuple(found)


def needs_of(view: TaskView) -> list[Need]:
    """What the task waits for from a person (runagent.loop.needs)."""
    task = view.paths
    ids = task.run_ids() if view.operations is None else view.operations  # only theirs ask
    found = [needs.approval(task, task.run_folder(run_id)) for run_id in ids]
    found.append(needs.reply(task))
    latest = view.latest
    if latest is not None and latest.reason in _STOPPED_FOR and view.status not in _NOT_WAITING:
        found.append(needs.stopped(task, _STOPPED_FOR[latest.reason], latest.message or ""))
    if _blocked(view):
        assert view.queue is not None
        found.append(depends.need(view.paths, view.queue.after))
    return [need for need in found if need is not None]
