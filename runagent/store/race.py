"""A race: several loops (racers) at work on one task's prompt at once, the first that completes
winning. What a race is on disk: the race task's `race.yaml` (its racers, when it started, its
shared budget and, once decided, its winner and how it ended), written whole and changed only
under the race's lock, so that exactly one racer wins; and how racers are named.

Each racer is a task of its own beside the race's task, named from it: `T.1`, `T.2`, ... for N
loops of one agent (`--race N`), `T.<agent>` for one loop per agent (`--agents a,b,c`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from runagent.errors import UsageError, shown
from runagent.record import record
from runagent.store import runfolder
from runagent.store.ids import validate_id
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import Reason, RunStatus

MIN_RACERS = 2
MAX_RACERS = 16  # a race of more loops than this is a fleet, not a race


class Ending:
    """How a race ended (`outcome` in race.yaml), and what its racers were stopped for."""

    COMPLETED = "completed"  # a racer completed: the winner
    FAILED = "failed"  # every racer gave up
    STOPPED = "stopped"  # stopped (`stop`, Ctrl-C)
    BUDGET = "budget"  # the racers' summed spend crossed the race's budget


ENDINGS = (Ending.COMPLETED, Ending.FAILED, Ending.STOPPED, Ending.BUDGET)


@record
class RaceSpec:
    """How many loops race, and of which agents: `count` loops of the task's agent, or one loop
    of each of `agents`."""

    count: int = 0
    agents: tuple[str, ...] = ()

    @classmethod
    def parse(
        cls, race: object, agents: object, where: tuple[str, str] = ("--race", "--agents")
    ) -> RaceSpec | None:
        """From raw values (the command line's, an API body's, a schedule's): None when neither
        is given; a UsageError naming the value for one that is not a race (both given, a
        count under 2, an agent named twice)."""
        if race in (None, "", 0, False) and agents in (None, "", [], ()):
            return None
        if race not in (None, "", 0, False) and agents not in (None, "", [], ()):
            raise UsageError(
                f"{where[0]} and {where[1]} do not go together: race N loops of one agent, "
                "or one loop of each agent named"
            )
        if agents not in (None, "", [], ()):
            return cls(agents=_agents(agents, where[1]))
        if isinstance(race, bool) or not isinstance(race, int | str):
            raise UsageError(f"{where[0]} {shown(race)} is not a whole number of racers")
        try:
            count = int(race)
        except ValueError:
            raise UsageError(f"{where[0]} {shown(race)} is not a whole number of racers") from None
        _bounded(count, where[0])
        return cls(count=count)

    def racers(self, task_id: str, agent: str | None) -> tuple[Racer, ...]:
        """The racers of a race on task `task_id`, `agent` the one `--race` races (None: the
        config's default); a UsageError naming an id a racer cannot have."""
        named: list[tuple[str, str | None]]
        if self.agents:
            named = [(f"{task_id}.{a}", a) for a in self.agents]
        else:
            named = [(f"{task_id}.{n}", agent) for n in range(1, self.count + 1)]
        for racer_id, _ in named:
            validate_id("racer's task", racer_id)
        return tuple(Racer(racer_id, a) for racer_id, a in named)

    def to_record(self) -> dict[str, object]:
        return {"agents": list(self.agents)} if self.agents else {"race": self.count}

    def words(self) -> str:
        if self.agents:
            return f"{len(self.agents)} racers ({', '.join(self.agents)})"
        return f"{self.count} racers"


def _agents(given: object, where: str) -> tuple[str, ...]:
    parts = given.split(",") if isinstance(given, str) else given
    if not isinstance(parts, list | tuple) or not all(isinstance(p, str) for p in parts):
        raise UsageError(f"{where} {shown(given)} is not a list of agents' names")
    names = tuple(p.strip() for p in parts if p.strip())
    for name in names:
        if not name.isprintable() or name != name.strip():
            raise UsageError(f"{where}: agent {shown(name)} holds a control character")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(
            f"{where} names {', '.join(twice)} twice; each racer is one agent's loop (race N "
            "loops of one agent with --race N)"
        )
    _bounded(len(names), where)
    return names


def _bounded(count: int, where: str) -> None:
    if count < MIN_RACERS:
        raise UsageError(
            f"{where}: a race of {count} is no race; give {MIN_RACERS} racers or more, or run "
            "the task as a loop of its own"
        )
    if count > MAX_RACERS:
        raise UsageError(f"{where}: {count} racers is more than {MAX_RACERS}; give fewer")


@record
class Racer:
    """One loop of a race: its task (beside the race's) and agent (None: the default), and once
    it is out of the race, why (`lost_race`, `stopped`, `budget`) as the race recorded it."""

    task_id: str
    agent: str | None = None
    out: str | None = None
    message: str | None = None

    def to_dict(self) -> dict[str, Any]:
        found = {"task_id": self.task_id, "agent": self.agent}
        if self.out is not None:
            found |= {"out": self.out, "message": self.message}
        return found


@record
class Race:
    """A race task's `race.yaml`."""

    racers: tuple[Racer, ...]
    started: str  # when its racers were started (ISO 8601)
    spec: RaceSpec = RaceSpec()
    budget: tuple[str, ...] = ()  # the racers' summed spend may not cross it (`--budget` values)
    winner: str | None = None  # the racer's task id, once one completed
    outcome: str | None = None  # an Ending, once the race is over
    message: str | None = None  # how it ended, in words
    ended: str | None = None
    executor: dict[str, Any] | None = None  # where its racers run, when not on this machine
    stop_wait: float = 30.0  # seconds its racers may take to stop (their kill_grace, and more)

    @property
    def over(self) -> bool:
        return self.outcome is not None

    def racer(self, task_id: str) -> Racer | None:
        return next((r for r in self.racers if r.task_id == task_id), None)

    def tasks(self, race: TaskPaths) -> list[TaskPaths]:
        """The racers' tasks, beside the race's."""
        return [TaskPaths(race.root, race.project_id, r.task_id) for r in self.racers]

    def to_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "racers": [r.to_dict() for r in self.racers],
            "started": self.started,
            **self.spec.to_record(),
        }
        optional = {"budget": list(self.budget) or None, "winner": self.winner,
                    "outcome": self.outcome, "message": self.message, "ended": self.ended,
                    "executor": self.executor}  # fmt: skip
        found |= {k: v for k, v in optional.items() if v is not None}
        return found | {"stop_wait": self.stop_wait}

    @classmethod
    def from_dict(cls, data: object) -> Race:
        """The record `data` holds; ValueError saying what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("it is not a mapping")
        given = data.get("racers")
        if not isinstance(given, list) or not given:
            raise ValueError("it names no racers")
        racers = []
        for entry in given:
            if not isinstance(entry, dict) or not isinstance(entry.get("task_id"), str):
                raise ValueError(f"racer {entry!r} has no task_id")
            validate_id("racer's task", entry["task_id"])
            racers.append(Racer(entry["task_id"], _text(entry.get("agent")),
                                _text(entry.get("out")), _text(entry.get("message"))))  # fmt: skip
        outcome = data.get("outcome")
        if outcome is not None and outcome not in ENDINGS:
            raise ValueError(f"outcome {outcome!r} is not one of {', '.join(ENDINGS)}")
        budget = data.get("budget") or []
        executor = data.get("executor")
        agents = data.get("agents") or ()
        spec = RaceSpec(agents=tuple(str(a) for a in agents)) if agents else RaceSpec(
            count=int(data.get("race") or len(racers))
        )  # fmt: skip
        return cls(
            racers=tuple(racers),
            started=str(data.get("started") or ""),
            spec=spec,
            budget=tuple(str(b) for b in budget) if isinstance(budget, list) else (),
            winner=_text(data.get("winner")),
            outcome=outcome,
            message=_text(data.get("message")),
            ended=_text(data.get("ended")),
            executor=executor if isinstance(executor, dict) else None,
            stop_wait=_seconds(data.get("stop_wait")),
        )


def _seconds(value: object) -> float:
    """A stop's wait as the record says it (a number of seconds, at most an hour)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 3600:
        return Race.stop_wait
    return float(value)


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def is_race(task: TaskPaths) -> bool:
    """Whether the task is a race's (its race.yaml is there)."""
    return runfolder.stat_in(task.fence, task.race) is not None


def race_of(racer: TaskPaths) -> tuple[TaskPaths, Race] | None:
    """The race `racer` runs in (racers are named `RACE.N` or `RACE.AGENT`, beside their race's
    task) and its record; None for a task that is no racer, or whose race cannot be read (its
    watcher says why)."""
    name, dot, _ = racer.task_id.rpartition(".")
    if not dot or not name:
        return None
    owner = TaskPaths(racer.root, racer.project_id, name)
    try:
        found = read(owner)
    except ValueError:
        return None
    if found is None or found.racer(racer.task_id) is None:
        return None
    return owner, found


def watcher_argv(task: TaskPaths) -> list[str]:
    """The command line (after the interpreter) of the race's watcher process."""
    return ["-m", "runagent.race", str(task.root), task.project_id, task.task_id]


def read(task: TaskPaths) -> Race | None:
    """The task's race record; None when it is not a race's. A record that cannot be read is
    a ValueError saying why (a race is never judged on a guess)."""
    try:
        text = runfolder.read_text_in(task.fence, runfolder.confine(task).race)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{task.race} cannot be read: {exc}") from exc
    try:
        return Race.from_dict(runfolder.load_yaml(text))
    except (ValueError, TypeError, UsageError) as exc:
        raise ValueError(f"{task.race} is not a race record: {exc}") from exc


def write(task: TaskPaths, race: Race) -> None:
    text = runfolder.dump_yaml(race.to_dict(), sort_keys=False, allow_unicode=True)
    runfolder.atomic_write(runfolder.confine(task).race, text)


@contextmanager
def locked(task: TaskPaths) -> Iterator[None]:
    """Held while the race record is read, changed and written (a win, an ending)."""
    runfolder.make_task_folder(task)
    with runfolder.exclusive(task.race_lock):
        yield


def begin(
    task: TaskPaths, spec: RaceSpec, racers: Sequence[Racer], budget: Sequence[str] = (), *,
    executor: dict[str, Any] | None = None, stop_wait: float = Race.stop_wait,
) -> Race:  # fmt: skip
    """Write down a race about to start (a new record: an earlier race's is replaced)."""
    race = Race(tuple(racers), runfolder.timestamp(), spec, tuple(budget), executor=executor,
                stop_wait=stop_wait)  # fmt: skip
    with locked(task):
        write(task, race)
    return race


def decide(task: TaskPaths, winner: str) -> str:
    """Record `winner` as the race's winner unless one is already: the winner, whichever it is
    (exactly one racer ever wins a race)."""
    with locked(task):
        race = read(task)
        if race is None:
            raise ValueError(f"task {task.label} is no race")
        if race.winner is not None:
            return race.winner
        write(task, replace(race, winner=winner))
        return winner


def mark_out(task: TaskPaths, racer_id: str, why: str, message: str) -> None:
    """Record why a racer is out of the race (the race stopped it: `lost_race`, `stopped`,
    `budget`)."""
    with locked(task):
        race = read(task)
        if race is None:
            return
        racers = tuple(
            replace(r, out=why, message=message) if r.task_id == racer_id else r
            for r in race.racers
        )
        write(task, replace(race, racers=racers))


def end(task: TaskPaths, outcome: str, message: str) -> Race:
    """Record how the race ended (its first ending stands)."""
    with locked(task):
        race = read(task)
        if race is None:
            raise ValueError(f"task {task.label} is no race")
        if race.outcome is None:
            race = replace(race, outcome=outcome, message=message, ended=runfolder.timestamp())
            write(task, race)
        return race


def mark_stopped_run(task: TaskPaths, since: str, reason: Reason, message: str) -> None:
    """The run a racer was stopped in (its latest, stopped on request at `since` or later)
    says why the race stopped it: `lost_race` (stopped), `budget` (failed, as a run stopped at
    its own budget is)."""
    for run_id in reversed(task.run_ids()):
        folder = task.run_folder(run_id)
        info = runfolder.read_run_info(folder)
        if info is None:
            continue
        if info.reason is not Reason.STOPPED or (info.end_time or "") < since:
            return
        status = RunStatus.FAILED if reason is Reason.BUDGET else info.status
        runfolder.write_run_info(folder, info.replace(status=status, reason=reason,
                                                      message=message))  # fmt: skip
        return
