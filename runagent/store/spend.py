"""What runs spent (tokens and cost, as their agents reported them in run-info.yaml), summed
by project, task, agent or day, for `run-agent usage`."""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable
from dataclasses import field
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

from runagent.record import record
from runagent.store import runfolder, tasks
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import RunInfo, Usage


class GroupBy(enum.Enum):
    """What the runs' usage is summed by."""

    PROJECT = "project"
    TASK = "task"
    AGENT = "agent"
    DAY = "day"

    def of(self, run: RunInfo) -> str:
        if self is GroupBy.PROJECT:
            return run.project_id
        if self is GroupBy.TASK:
            return f"{run.project_id}/{run.task_id}"
        if self is GroupBy.AGENT:
            return run.agent
        return run.start_time[:10]  # run-info's times are UTC, so a day is a UTC day


@record
class Spend:
    """One group's runs and what they used; `reported` counts the runs whose agent said."""

    key: tuple[str, ...]
    runs: int = 0
    reported: int = 0
    used: Usage = field(default_factory=Usage)

    def plus(self, run: RunInfo) -> Spend:
        used = run.usage
        if used is None:
            return Spend(self.key, self.runs + 1, self.reported, self.used)
        return Spend(self.key, self.runs + 1, self.reported + 1, self.used + used)


def runs(
    root: Path, project: str | None = None, since: datetime | date | None = None
) -> Iterable[RunInfo]:
    """Every recorded run under `root` (of `project` only, if given), or every one that may
    have started `since` then: a run whose id says it started two days or more before is not
    read (ids begin with their start's date, YYYYMMDD, in UTC; a day more for ids of another
    clock), nor is a task whose runs/ folder has not changed since (no run folder was made in
    it), so a day's spend costs that day's runs and a stat a task, not the runs in history."""
    first, floor = None, 0.0
    if since is not None:
        day = since.date() if isinstance(since, datetime) else since
        first = f"{day - timedelta(days=1):%Y%m%d}"
        floor = datetime.combine(day - timedelta(days=1), time(), UTC).timestamp()
    for project_id in [project] if project else runfolder.project_ids(root):
        for task_id in runfolder.task_ids(root, project_id):
            task = TaskPaths(root, project_id, task_id)
            if first is None:
                yield from tasks.runs(task)
                continue
            try:  # a runs/ folder unchanged since before then has no run folder made since
                if os.stat(task.runs).st_mtime < floor:
                    continue
            except OSError:
                continue
            yield from tasks.runs(task, task.run_ids(since=first))


def started_since(run: RunInfo, since: datetime | date | None) -> bool:
    if since is None:
        return True
    started = datetime.fromisoformat(run.start_time)
    if isinstance(since, datetime):
        return started >= since
    return started.date() >= since


def summed(
    found: Iterable[RunInfo], by: tuple[GroupBy, ...], since: datetime | date | None = None
) -> tuple[list[Spend], Spend]:
    """The groups, sorted by their key, and the total of every run counted."""
    groups: dict[tuple[str, ...], Spend] = {}
    total = Spend(("total",))
    for run in found:
        if not started_since(run, since):
            continue
        key = tuple(b.of(run) for b in by)
        groups[key] = groups.get(key, Spend(key)).plus(run)
        total = total.plus(run)
    return [groups[k] for k in sorted(groups)], total
