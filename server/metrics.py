"""`GET /metrics`: the runs root's figures in Prometheus' text format, read afresh from the run
folders at each scrape (nothing is kept in the server, so a restarted server, or one of several
over one root, says the same), with the official client library's families and exposition.

Counters are counts of what the run folders hold: `gc` and `delete` lower them, which Prometheus'
`rate()` and `increase()` take as a counter reset.

A server keeps one `Tally` between scrapes: an ended run's run-info.yaml never changes again, so
what it adds is kept by the file's identity (inode, size, mtime) and a scrape parses only the runs
that are new, still running or rewritten since; an operations run's events likewise. A scrape of
10,000 ended runs is then a walk of stats instead of 10,000 YAML parses (bench/listing.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from runagent import listing
from runagent.store import runfolder, tasks
from runagent.store.runfolder import RunPaths, TaskPaths
from runagent.store.runinfo import RunInfo, RunStatus

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Attempt durations, in seconds: from a quick job to a long night's attempt.
BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0)
# Queue waits, in seconds: from a slot freed at once to a night's wait for a budget or a host.
WAIT_BUCKETS = (0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0, 43200.0)
OPERATION_EVENTS = {"createFile", "readFile", "editFile", "deleteFile", "shell"}
VERDICTS = {"policyDenied": "denied", "approvalRequired": "approval_required", "error": "error"}


# A file as it is now: its inode, size and mtime (a rewrite replaces the file, a new inode).
Stamp = tuple[int, int, int]
Reaches = Callable[[str], bool]  # whether a scrape shows a project


def render(
    root: Path, sse_clients: int, tally: Tally | None = None, reaches: Reaches | None = None
) -> bytes:
    """The scrape's body; `tally` is what the server kept from its earlier scrapes; `reaches`
    the projects it shows (a token limited to some: its own; None: all)."""
    registry = CollectorRegistry(auto_describe=False)
    tally = Tally() if tally is None else tally
    registry.register(RootCollector(root, sse_clients, tally, reaches))
    return generate_latest(registry)


class Figures(NamedTuple):
    """What one run adds to the metrics."""

    agent: str
    project: str
    restart: bool  # attempt 2 or later of its loop
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
        return cls(info.agent or "unknown", info.project_id, info.attempt > 1, ended, took,
                   info.tokens_in or 0, info.tokens_out or 0, info.cost_usd or 0.0,
                   info.queued_seconds)  # fmt: skip


class Tally:
    """What the root's runs and operations add up to, kept between scrapes (module docstring).
    Scrapes take their turn: two at once would each parse what the other is parsing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, tuple[Stamp, Figures]] = {}
        self._events: dict[str, tuple[Stamp, Counter[tuple[str, ...]]]] = {}
        # What the scrape under way has seen, to become the above at its end.
        self._kept_runs: dict[str, tuple[Stamp, Figures]] = {}
        self._kept_events: dict[str, tuple[Stamp, Counter[tuple[str, ...]]]] = {}

    def __len__(self) -> int:
        """How many files' figures are kept."""
        return len(self._runs) + len(self._events)

    @contextlib.contextmanager
    def scrape(self, root: Path, reaches: Reaches | None) -> Iterator[Tally]:
        """One scrape's turn: what it does not see of what it looked at (the projects it
        `reaches`; None: all) is gone (gc, delete) and forgotten, so the tally stays the size of
        the root."""
        with self._lock:
            self._kept_runs, self._kept_events = {}, {}
            yield self
            if reaches is None:
                self._runs, self._events = self._kept_runs, self._kept_events
                return
            under = len(os.fspath(root)) + 1  # a key is ROOT/PROJECT/...

            def unseen(path: str) -> bool:
                return not reaches(path[under:].split("/", 1)[0])

            self._runs = {k: v for k, v in self._runs.items() if unseen(k)} | self._kept_runs
            self._events = {k: v for k, v in self._events.items() if unseen(k)} | self._kept_events

    def runs(self, task: TaskPaths) -> Iterator[Figures]:
        """What each run of `task` adds, as `tasks.runs` reads them (liveness-checked)."""
        runs = os.fspath(task.runs)  # joined as text: a scrape stats every run of the root
        bounds = task.fence
        for run_id in task.run_ids():
            path = f"{runs}/{run_id}/{runfolder.RUN_INFO}"
            stamp = _stamp(path)
            known = self._runs.get(path)
            if stamp is not None and known is not None and known[0] == stamp:
                self._kept_runs[path] = known
                yield known[1]
                continue
            folder = task.run_folder(run_id)
            info = runfolder.read_run_record(folder, bounds)
            if info is None:
                continue
            figures = Figures.of(tasks.effective(info, folder))
            if stamp is not None and _final(info):
                self._kept_runs[path] = (stamp, figures)
            yield figures

    def operations(self, root: Path, reaches: Reaches | None) -> Counter[tuple[str, ...]]:
        """Every operation an operations run (of the projects it `reaches`) answered, by its
        type and what became of it."""
        from runagent.ops import runs as opsruns

        found: Counter[tuple[str, ...]] = Counter()
        if not root.is_dir():
            return found
        for folder in opsruns.all_runs(root, reaches or (lambda project: True)):
            path = os.fspath(RunPaths(folder).events)
            stamp = _stamp(path)
            known = self._events.get(path)
            if stamp is not None and known is not None and known[0] == stamp:
                counted = known[1]
            else:
                counted = _operations(Path(path))
            if stamp is not None:
                self._kept_events[path] = (stamp, counted)
            found.update(counted)
        return found


def _final(info: RunInfo) -> bool:
    """Whether what a record adds stays as long as its file does: not while it runs (it turns
    lost without its file changing), nor while it cannot be read (a chmod makes it readable),
    nor where it has no attempt of its own (conductor-loop's: numbered by its place among its
    task's runs, which gc changes). run-agent's supervisor always names its host."""
    return info.status not in (RunStatus.RUNNING, RunStatus.UNREADABLE) and info.host is not None


def _stamp(path: str) -> Stamp | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class RootCollector(Collector):
    def __init__(self, root: Path, sse_clients: int, tally: Tally, reaches: Reaches | None) -> None:
        self.root = root
        self.sse_clients = sse_clients
        self.tally = tally
        self.reaches = reaches

    def collect(self) -> Iterator[Metric]:
        # Gathered whole under the tally's lock, never held across a yield to the exposition.
        with self.tally.scrape(self.root, self.reaches):
            gathered = list(self._collect())
        yield from gathered

    def _views(self) -> list[tasks.TaskView]:
        if not self.root.is_dir():
            return []
        if self.reaches is None:
            return listing.all_tasks(self.root)
        reached = filter(self.reaches, runfolder.project_ids(self.root))
        return [view for project in reached for view in listing.all_tasks(self.root, project)]

    def _collect(self) -> Iterator[Metric]:
        views = self._views()
        by_status: Counter[str] = Counter()
        started: Counter[str] = Counter()
        ended: Counter[tuple[str, ...]] = Counter()
        restarts: Counter[str] = Counter()
        durations: dict[str, list[float]] = {}
        waits: dict[str, list[float]] = {}
        tokens: Counter[tuple[str, ...]] = Counter()
        cost: dict[tuple[str, ...], float] = {}
        for view in views:
            by_status[view.status.value] += 1  # over_budget, stuck: as everywhere else
            for run in self.tally.runs(view.paths):
                started[run.agent] += 1
                restarts[run.agent] += run.restart
                if run.ended is not None:
                    ended[(run.agent, run.ended)] += 1
                if run.took is not None:
                    durations.setdefault(run.agent, []).append(run.took)
                if run.queued is not None:
                    waits.setdefault(run.agent, []).append(run.queued)
                if run.tokens_in:
                    tokens[(run.agent, run.project, "in")] += run.tokens_in
                if run.tokens_out:
                    tokens[(run.agent, run.project, "out")] += run.tokens_out
                if run.cost_usd:
                    cost[(run.agent, run.project)] = (
                        cost.get((run.agent, run.project), 0.0) + run.cost_usd
                    )
        yield _gauge("run_agent_tasks", "Tasks under the runs root by status.", ["status"],
                     {(s,): n for s, n in by_status.items()})  # fmt: skip
        yield _counter("run_agent_runs_started", "Runs started, by agent.", ["agent"],
                       {(a,): n for a, n in started.items()})  # fmt: skip
        yield _counter("run_agent_runs_ended", "Runs ended, by agent and the reason they ended.",
                       ["agent", "reason"], ended)  # fmt: skip
        again: dict[tuple[str, ...], float] = {(a,): n for a, n in restarts.items() if n}
        yield _counter("run_agent_restarts", "Runs that were a restart of their loop (attempt "
                       "2 or later), by agent.", ["agent"], again)  # fmt: skip
        yield _histogram("run_agent_attempt_duration_seconds", "How long ended runs "
                         "(attempts) took, by agent.", BUCKETS, durations)  # fmt: skip
        yield _counter("run_agent_tokens", "Tokens the runs used, by agent, project and "
                       "direction (in, out).", ["agent", "project", "direction"],
                       tokens)  # fmt: skip
        yield _counter("run_agent_cost_usd", "What the runs cost, in US dollars, by agent and "
                       "project.", ["agent", "project"], cost)  # fmt: skip
        yield from _racers(views)
        yield from self._queue()
        yield _histogram("run_agent_queue_wait_seconds", "How long the starts that waited in a "
                         "queue (for a slot, for the tasks they run after, or for a host of a "
                         "Ray cluster) waited before their loop began, by agent.", WAIT_BUCKETS,
                         waits)  # fmt: skip
        if self.reaches is None:  # the server's, not a project's: for whole-root readers
            sse = GaugeMetricFamily("run_agent_sse_clients", "SSE streams being sent by this "
                                    "server.")  # fmt: skip
            sse.add_metric([], self.sse_clients)
            yield sse
        yield _counter("run_agent_operations", "Operations of operations runs, by type and "
                       "verdict (done, denied, approval_required, error).",
                       ["type", "verdict"],
                       self.tally.operations(self.root, self.reaches))  # fmt: skip

    def _queue(self) -> Iterator[Metric]:
        """How many tasks wait (queued for a slot, or blocked on others), and the longest wait."""
        waiting: Counter[str] = Counter()
        oldest = 0.0
        if (self.root / runfolder.FLEET).is_dir():
            from runagent.fleet.queue import Fleet

            fleet = Fleet(self.root)
            records = [*fleet.waiting(clean=False), *fleet.on_cluster()]
            for record in [r for r in records if self.reaches is None or self.reaches(r.project)]:
                waiting["blocked" if record.blocked or not record.joined else "queued"] += 1
                oldest = max(oldest, _age(record.submitted))
        length = GaugeMetricFamily("run_agent_queue_length", "Tasks waiting to start, queued "
                                   "for a slot or blocked on tasks they run after.",
                                   labels=["state"])  # fmt: skip
        for state in ("queued", "blocked"):
            length.add_metric([state], waiting[state])
        yield length
        wait = GaugeMetricFamily("run_agent_queue_oldest_wait_seconds", "How long the task "
                                 "that has waited longest has waited (0: none waits).")  # fmt: skip
        wait.add_metric([], oldest)
        yield wait
        paused = GaugeMetricFamily(
            "run_agent_agent_paused_until_seconds",
            "The agents paused across the fleet by their provider's limit: when each pause "
            "lifts (Unix time), and why.",
            labels=["agent", "why"],
        )
        if (self.root / runfolder.FLEET).is_dir():
            from runagent.fleet.queue import Fleet

            for pause in Fleet(self.root).pauses(clean=False).values():
                paused.add_metric([pause.agent, pause.why], pause.until)
        yield paused


def _racers(views: list[tasks.TaskView]) -> Iterator[Metric]:
    """The racers of the races running, side by side: each one's attempt, spend and last
    check, labelled by its project, race, racer and agent."""
    attempt: dict[tuple[str, ...], float] = {}
    spent: dict[tuple[str, ...], float] = {}
    cost: dict[tuple[str, ...], float] = {}
    check: dict[tuple[str, ...], float] = {}
    for view in views:
        if view.race is None or view.status is not tasks.TaskStatus.RUNNING:
            continue
        for racer in view.race.racers:
            key = (view.paths.project_id, view.paths.task_id, racer.view.paths.task_id,
                   racer.agent or "unknown")  # fmt: skip
            attempt[key] = racer.attempt or 0
            used = racer.view.usage
            spent[key] = used.tokens if used is not None else 0
            if used is not None and used.cost_usd is not None:
                cost[key] = used.cost_usd
            if racer.last_check is not None:
                check[key] = racer.last_check
    labels = ["project", "race", "racer", "agent"]
    yield _gauge("run_agent_racer_attempt", "The attempt each racer of a running race is at.",
                 labels, attempt)  # fmt: skip
    yield _gauge("run_agent_racer_tokens", "Tokens each racer of a running race used so far.",
                 labels, spent)  # fmt: skip
    yield _gauge("run_agent_racer_cost_usd", "What each racer of a running race cost so far, "
                 "where its agent says.", labels, cost)  # fmt: skip
    yield _gauge("run_agent_racer_last_check", "The exit code of the last check of each racer "
                 "of a running race (0: it passed), once one ran.", labels, check)  # fmt: skip


def _operations(events: Path) -> Counter[tuple[str, ...]]:
    """The operations one run's events.jsonl answered, by type and verdict."""
    found: Counter[tuple[str, ...]] = Counter()
    try:
        lines = runfolder.read_text_in(RunPaths(events.parent).fence, events).splitlines()
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


def _gauge(name: str, doc: str, labels: list[str],
           values: Mapping[tuple[str, ...], float]) -> GaugeMetricFamily:  # fmt: skip
    return _filled(GaugeMetricFamily(name, doc, labels=labels), values)


def _counter(name: str, doc: str, labels: list[str],
             values: Mapping[tuple[str, ...], float]) -> CounterMetricFamily:  # fmt: skip
    return _filled(CounterMetricFamily(name, doc, labels=labels), values)


F = TypeVar("F", GaugeMetricFamily, CounterMetricFamily)


def _filled(family: F, values: Mapping[tuple[str, ...], float]) -> F:
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family


def _histogram(name: str, doc: str, bounds: tuple[float, ...],
               values: dict[str, list[float]]) -> HistogramMetricFamily:  # fmt: skip
    family = HistogramMetricFamily(name, doc, labels=["agent"])
    for agent, seen in sorted(values.items()):
        buckets = [(_le(bound), float(sum(v <= bound for v in seen))) for bound in bounds]
        buckets.append(("+Inf", float(len(seen))))
        family.add_metric([agent], buckets, sum(seen))
    return family


def _le(bound: float) -> str:
    return f"{bound:g}" if bound != int(bound) else f"{bound:.1f}"


def _age(stamp: str) -> float:
    try:
        return max(0.0, time.time() - datetime.fromisoformat(stamp).timestamp())
    except ValueError:
        return 0.0
