"""`GET /metrics`: the runs root's figures in Prometheus' text format, read afresh at each
scrape (a restarted server, or one of several over one root, says the same), with the official
client library's families and exposition.

Counters only grow: what `gc` and `delete` removed is kept in a tally under the runs root and
counted beside what the run folders hold (runagent/store/removed.py), so Prometheus' `rate()` and
`increase()` never read a removal as a reset.

What the runs add up to comes from the root's index (runagent/store/index.py): each task's ended
runs summed, checked against its folders' stamps, so a scrape of 100,000 ended runs reads what
changed since the last look, not every record (bench/listing.py). A server keeps one `Tally`
between scrapes for the operations runs' events, by each file's identity (inode, size, mtime):
a scrape parses only the events files that grew.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
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
from runagent.store.index import Summary
from runagent.store.removed import Histogram, Sums
from runagent.store.runfolder import RunPaths, TaskPaths

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
    """What the root's operations runs answered, kept between scrapes (module docstring).
    Scrapes take their turn: two at once would each parse what the other is parsing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, tuple[Stamp, Counter[tuple[str, ...]]]] = {}
        # What the scrape under way has seen, to become the above at its end.
        self._kept_events: dict[str, tuple[Stamp, Counter[tuple[str, ...]]]] = {}

    def __len__(self) -> int:
        """How many files' figures are kept."""
        return len(self._events)

    @contextlib.contextmanager
    def scrape(self, root: Path, reaches: Reaches | None) -> Iterator[Tally]:
        """One scrape's turn: what it does not see of what it looked at (the projects it
        `reaches`; None: all) is gone (gc, delete) and forgotten, so the tally stays the size of
        the root."""
        with self._lock:
            self._kept_events = {}
            yield self
            if reaches is None:
                self._events = self._kept_events
                return
            under = len(os.fspath(root)) + 1  # a key is ROOT/PROJECT/...

            def unseen(path: str) -> bool:
                return not reaches(path[under:].split("/", 1)[0])

            self._events = {k: v for k, v in self._events.items() if unseen(k)} | self._kept_events

    def operations(self, task: TaskPaths, run_ids: Iterable[str]) -> Counter[tuple[str, ...]]:
        """Every operation the operations runs `run_ids` of `task` answered, by its type and
        what became of it."""
        found: Counter[tuple[str, ...]] = Counter()
        for run_id in run_ids:
            path = os.fspath(RunPaths(task.run_folder(run_id)).events)
            stamp = _stamp(path)
            known = self._events.get(path)
            if stamp is not None and known is not None and known[0] == stamp:
                counted = known[1]
            else:
                counted = removed.operations(Path(path), task.fence)
            if stamp is not None:
                self._kept_events[path] = (stamp, counted)
            found.update(counted)
        return found


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

    def _views(self) -> tuple[dict[str, str], list[tasks.TaskView], Mapping[str, Summary]]:
        """The tasks it shows: each one's status, the whole view of the races among them, and
        what their runs add up to (by P/T)."""
        if not self.root.is_dir():
            return {}, [], {}
        reached = [p for p in runfolder.project_ids(self.root) if self.reaches is None or
                   self.reaches(p)]  # fmt: skip
        found = [task for p in reached for task in tasks.all_paths(self.root, p)]
        reaches = self.reaches
        covers = None if reaches is None else lambda label: reaches(label.split("/", 1)[0])
        runs = listing.summaries(self.root, found, sums=True, covers=covers or (lambda _: True))
        rows, views = listing.glance(self.root, frozenset(reached))
        statuses = {label: str(row["status"]) for label, row in rows.items()}
        return statuses, [v for v in views if v.race is not None], runs

    def _collect(self) -> Iterator[Metric]:
        statuses, views, runs = self._views()
        by_status = Counter(statuses.values())  # over_budget, stuck: as everywhere else
        # What gc and delete removed, then what the run folders hold (module docstring).
        sums = removed.removed(self.root, self.reaches) if self.root.is_dir() else Sums()
        root = self.root
        for label, summary in runs.items():
            sums.add(summary.sums)
            for run in summary.unsettled:
                sums.add_run(run)
            if summary.operations:
                task = TaskPaths(root, *label.split("/", 1))
                sums.operations.update(self.tally.operations(task, summary.operations))
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
