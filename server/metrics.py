"""`GET /metrics`: the runs root's figures in Prometheus' text format, read afresh from the run
folders at each scrape (nothing is kept in the server, so a restarted server, or one of several
over one root, says the same), with the official client library's families and exposition.

Counters only grow: what `gc` and `delete` removed is kept in a tally under the runs root and
counted beside what the run folders hold (runagent/store/removed.py), so Prometheus' `rate()` and
`increase()` never read a removal as a reset.

A server keeps one `Tally` between scrapes: an ended run's run-info.yaml never changes again, so
what it adds is kept by the file's identity (inode, size, mtime) and a scrape parses only the runs
that are new, still running or rewritten since; an operations run's events likewise. A scrape of
10,000 ended runs is then a walk of stats instead of 10,000 YAML parses (bench/listing.py).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from runagent import listing
from runagent.store import removed, runfolder, tasks
from runagent.store.removed import Figures, Histogram, Sums
from runagent.store.runfolder import RunPaths, TaskPaths
from runagent.store.runinfo import RunInfo, RunStatus

CONTENT_TYPE = CONTENT_TYPE_LATEST


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
                counted = removed.operations(Path(path), RunPaths(Path(path).parent).fence)
            if stamp is not None:
                self._kept_events[path] = (stamp, counted)
            found.update(counted)
        return found


def _final(info: RunInfo) -> bool:
    """Whether what a record adds stays as long as its file does: not while it runs (it turns
    lost without its file changing), nor while it cannot be read (a chmod makes it readable)."""
    return info.status not in (RunStatus.RUNNING, RunStatus.UNREADABLE)


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
        with self.tally.scrape(self.root, self.reaches), removed.counting(self.root):
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
        # What gc and delete removed, then what the run folders hold (module docstring).
        sums = removed.removed(self.root, self.reaches) if self.root.is_dir() else Sums()
        for view in views:
            by_status[view.status.value] += 1  # over_budget, stuck: as everywhere else
            for run in self.tally.runs(view.paths):
                sums.add_run(run)
        sums.operations.update(self.tally.operations(self.root, self.reaches))
        yield _gauge("run_agent_tasks", "Tasks under the runs root by status.", ["status"],
                     {(s,): n for s, n in by_status.items()})  # fmt: skip
        yield _counter("run_agent_runs_started", "Runs started, by agent.", ["agent"],
                       sums.started)  # fmt: skip
        yield _counter("run_agent_runs_ended", "Runs ended, by agent and the reason they ended.",
                       ["agent", "reason"], sums.ended)  # fmt: skip
        yield _counter("run_agent_restarts", "Runs that were a restart of their loop (attempt "
                       "2 or later), by agent.", ["agent"], sums.restarts)  # fmt: skip
        yield _histogram("run_agent_attempt_duration_seconds", "How long ended runs "
                         "(attempts) took, by agent.", sums.durations)  # fmt: skip
        yield _counter("run_agent_tokens", "Tokens the runs used, by agent, project and "
                       "direction (in, out).", ["agent", "project", "direction"],
                       sums.tokens)  # fmt: skip
        usd = {key: nano / removed.NANO for key, nano in sums.cost.items()}
        yield _counter("run_agent_cost_usd", "What the runs cost, in US dollars, by agent and "
                       "project.", ["agent", "project"], usd)  # fmt: skip
        yield from _racers(views)
        yield from self._queue()
        yield _histogram("run_agent_queue_wait_seconds", "How long the starts that waited in a "
                         "queue (for a slot, for the tasks they run after, or for a host of a "
                         "Ray cluster) waited before their loop began, by agent.",
                         sums.waits)  # fmt: skip
        if self.reaches is None:  # the server's, not a project's: for whole-root readers
            sse = GaugeMetricFamily("run_agent_sse_clients", "SSE streams being sent by this "
                                    "server.")  # fmt: skip
            sse.add_metric([], self.sse_clients)
            yield sse
        yield _counter("run_agent_operations", "Operations of operations runs, by type and "
                       "verdict (done, denied, approval_required, error).",
                       ["type", "verdict"], sums.operations)  # fmt: skip

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
        held = GaugeMetricFamily("run_agent_queue_held", "1 while a person holds the whole "
                                 "queue (fleet hold): no queued task starts; else 0.")  # fmt: skip
        if (self.root / runfolder.FLEET).is_dir():
            from runagent.fleet.queue import Fleet

            held.add_metric([], 1 if Fleet(self.root).queue_hold() is not None else 0)
        else:
            held.add_metric([], 0)
        yield held


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


def _histogram(name: str, doc: str, values: Mapping[str, Histogram]) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=["agent"])
    for agent, seen in sorted(values.items()):
        buckets = [
            (_le(bound), float(n)) for bound, n in zip(seen.bounds, seen.buckets, strict=True)
        ]
        buckets.append(("+Inf", float(seen.count)))
        family.add_metric([agent], buckets, seen.total)
    return family


def _le(bound: float) -> str:
    return f"{bound:g}" if bound != int(bound) else f"{bound:.1f}"


def _age(stamp: str) -> float:
    try:
        return max(0.0, time.time() - datetime.fromisoformat(stamp).timestamp())
    except ValueError:
        return 0.0
