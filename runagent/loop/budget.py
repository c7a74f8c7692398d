"""Budgets that stop the loop: what a task may spend over all its runs, and what its project and
the whole runs root may spend in a (UTC) day.

Before each attempt the loop takes what was spent so far (the task's summed usage, today's runs
of its project and of the root); while the attempt runs, the usage its agent has reported so
far is added to each, on every look at the run (several times a second when a budget is set),
and the first budget crossed stops the agent's whole tree. What a run's stream does not carry
yet cannot be counted: an agent that reports its cost only at its end (claude's `result`) is
held to a cost budget when that line comes, and to a token budget as its messages report tokens.
A budgeted run writes its usage so far into its run-info.yaml once a second, and a run under a
daily budget reads the day's other runs again every few seconds: other tasks running at the same
time count toward a daily budget while they run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, date, datetime
from pathlib import Path

from runagent.config.settings import Budget, BudgetSettings
from runagent.record import record
from runagent.store import spend, taskfolder
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import RunInfo, Usage


@record
class Limit:
    """One budget a run counts against, and what was spent toward it before the run."""

    what: str  # "per task", "for project p today", "for the runs root today"
    budget: Budget
    before: Usage
    project: str | None = None  # a daily budget's: its project's runs count ("": every run)


@record
class Spending:
    """The budgets an attempt runs under; `run_id`'s own record is never counted as before."""

    limits: tuple[Limit, ...]
    root: Path
    run_id: str = ""

    @classmethod
    def before_attempt(
        cls, task: TaskPaths, budget: Budget | None, daily: BudgetSettings | None
    ) -> Spending | None:
        """What was spent toward each budget the task counts against; None when it has none."""
        limits = []
        if budget is not None:
            limits.append(Limit("per task", budget, taskfolder.read_task_usage(task) or Usage()))
        if daily is not None:
            project = daily.projects.get(task.project_id)
            if project is not None:
                what = f"for project {task.project_id} today"
                limits.append(Limit(what, project, Usage(), task.project_id))
            if daily.daily is not None:
                limits.append(Limit("for the runs root today", daily.daily, Usage(), ""))
        return cls(tuple(limits), task.root).counted() if limits else None

    def counted(self, run_id: str = "") -> Spending:
        """The daily budgets with what the day's other runs spent, as their records say now (a
        running one's record carries its usage so far): other tasks count while they run."""
        today = datetime.now(UTC).date()
        limits = tuple(
            limit if limit.project is None else replace(limit, before=_spent(
                (r for r in spend.runs(self.root, limit.project or None) if r.run_id != run_id),
                today,
            ))
            for limit in self.limits
        )  # fmt: skip
        return Spending(limits, self.root, run_id)

    @property
    def daily(self) -> bool:
        return any(limit.project is not None for limit in self.limits)

    def crossed(self, live: Usage | None, strict: bool = True) -> str:
        """The first budget that `live` (this run's usage so far) takes past its bound (with
        `strict`; else to it), in words: "$0.52 of $0.50 per task"; '' while within all."""
        for limit in self.limits:
            used = limit.before + live if live is not None else limit.before
            said = limit.budget.crossed(used.tokens, used.cost_usd, strict)
            if said:
                return f"{said} {limit.what}"
        return ""


def _spent(runs: Iterable[RunInfo], today: date) -> Usage:
    _, total = spend.summed(runs, (), today)
    return total.used
