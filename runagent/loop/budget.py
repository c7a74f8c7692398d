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
time count toward a daily budget while they run. A racer counts against its race's budget too,
with what its fellow racers spent so far: each publishes its spend and reads theirs every
SHARED_EVERY seconds, so the first report that takes their sum past the budget stops the racer
that makes it, and the others at their next look.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, date, datetime
from pathlib import Path

from runagent.config.settings import Budget, BudgetSettings, parse_budget
from runagent.errors import UsageError
from runagent.record import record
from runagent.store import race, spend, taskfolder, tasks
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import RunInfo, Usage

SHARED_EVERY = 0.2  # seconds between a racer's publishing its spend and reading its fellows'


@record
class Limit:
    """One budget a run counts against, and what was spent toward it before the run."""

    what: str  # "per task", "for project p today", "for the runs root today"
    budget: Budget
    before: Usage
    project: str | None = None  # a daily budget's: its project's runs count ("": every run)
    fellows: tuple[TaskPaths, ...] = ()  # a race's: its racers (this one too), whose runs count


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
        shared = _race_limit(task)
        if shared is not None:
            limits.append(shared)
        return cls(tuple(limits), task.root).counted() if limits else None

    def counted(self, run_id: str = "") -> Spending:
        """The daily budgets with what the day's other runs spent, as their records say now (a
        running one's record carries its usage so far): other tasks count while they run."""
        today = datetime.now(UTC).date()
        limits = tuple(
            _fellows_spent(limit, run_id) if limit.fellows else
            limit if limit.project is None else replace(limit, before=_spent(
                (r for r in spend.runs(self.root, limit.project or None, today)
                 if r.run_id != run_id),
                today,
            ))
            for limit in self.limits
        )  # fmt: skip
        return Spending(limits, self.root, run_id)

    @property
    def daily(self) -> bool:
        return any(limit.project is not None for limit in self.limits)

    @property
    def shared(self) -> bool:
        """Whether it counts against a race's budget, with what its fellow racers spend."""
        return any(limit.fellows for limit in self.limits)

    def crossed(self, live: Usage | None, strict: bool = True) -> str:
        """The first budget that `live` (this run's usage so far) takes past its bound (with
        `strict`; else to it), in words: "$0.52 of $0.50 per task"; '' while within all."""
        for limit in self.limits:
            used = limit.before + live if live is not None else limit.before
            said = limit.budget.crossed(used.tokens, used.cost_usd, strict)
            if said:
                return f"{said} {limit.what}"
        return ""


# How `crossed` names a daily budget ("... for project p today", "... for the runs root today"):
# no larger task budget lifts one, only config.yaml's `budgets:` or the next day (UTC).
_DAILY = re.compile(r"\bfor (?:project \S+|the runs root) today\b")


def lifts(said: str) -> str:
    """What lets a loop stopped by the budget `crossed` named (`said`) go on, in words."""
    if _DAILY.search(said):
        return "a larger daily budget (budgets: in config.yaml), or tomorrow (UTC), lets it go on"
    return "a larger --budget lets it go on"


def answer(task: TaskPaths, said: str) -> str:
    """The command (or the change) that answers a loop stopped by the budget `said` names."""
    resume = f"run-agent resume -p {task.project_id} -t {task.task_id}"
    if _DAILY.search(said):
        return (f"raise the daily budget under budgets: in config.yaml (or wait for tomorrow, "
                f"UTC), then {resume}")  # fmt: skip
    return f"{resume} --budget AMOUNT (a larger one)"


def _spent(runs: Iterable[RunInfo], today: date) -> Usage:
    _, total = spend.summed(runs, (), today)
    return total.used


def _race_limit(task: TaskPaths) -> Limit | None:
    """The budget of the race `task` is a racer of, with all its racers; None for any other
    task, or a race without a budget."""
    found = race.race_of(task)
    if found is None or not found[1].budget:
        return None
    owner, record = found
    try:
        budget = parse_budget(record.budget, f"the budget of race {owner.label}")
    except UsageError:
        return None
    if budget is None:
        return None
    racers = tuple(record.tasks(owner))
    return Limit(f"over race {owner.label}'s racers", budget, Usage(), fellows=racers)


def _fellows_spent(limit: Limit, run_id: str) -> Limit:
    """A race's limit with what its racers have spent so far, every run of each (a running
    one's spend so far included), but `run_id`'s own, which the attempt counts live."""
    used = Usage()
    for fellow in limit.fellows:
        for info in tasks.runs(fellow):
            if info.usage is not None and info.run_id != run_id:
                used = used + info.usage
    return replace(limit, before=used)
