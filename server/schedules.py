"""The server's scheduler: `run-agent serve` fires the config's schedules in a background thread;
and, in another, sees that the queue has its keeper.

Firing goes through the `launch` function it is given: the one door's (runagent.service), which
checks the agent with the check the command line hands in and starts a detached supervisor.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from runagent import schedule as sched
from runagent.config.settings import ScheduleConfig

log = logging.getLogger("run-agent.schedules")
TICK = 15.0


class Background:
    """A loop the server runs in a thread of its own until it stops (`_loop` waits on
    `_stop` between its steps)."""

    name = "run-agent-background"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _begin(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _loop(self) -> None:
        raise NotImplementedError


class ScheduleRunner(Background):
    """The scheduler, its thread, and a lock so the page's "run now" and the ticks take turns."""

    name = "run-agent-scheduler"

    def __init__(
        self,
        schedules: Mapping[str, ScheduleConfig],
        root: Path,
        launch: sched.Launch | None,
        run: bool,
        clock: Callable[[], datetime] = sched.utc_now,
        leader: Callable[[], bool] = lambda: True,
    ) -> None:
        self.clock = clock
        self.schedules = schedules
        self.root = root
        self.running = run and launch is not None and any(s.enabled for s in schedules.values())
        self.scheduler = sched.Scheduler(
            schedules, root, launch or _no_launch, log=log.info, leader=leader
        )
        self._lock = threading.Lock()
        super().__init__()

    def start(self) -> None:
        if not self.running:
            return
        with self._lock:
            self.scheduler.start(self.clock())
        self._begin()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with self._lock:
                    self.scheduler.tick(self.clock())
            except Exception:  # the scheduler must outlive any one bad tick
                log.exception("schedule tick failed")
            self._stop.wait(min(TICK, sched.seconds_to_next_minute(self.clock())))

    def describe(self) -> list[dict[str, Any]]:
        rows = sched.describe(self.schedules, self.root, self.clock())
        for row in rows:
            row["scheduler"] = "running" if self.running else "off"
        return rows

    def fire_now(self, name: str) -> sched.Firing:
        with self._lock:
            return self.scheduler.fire_now(self.schedules[name], self.clock())


class QueueWatch(Background):
    """While the server runs: every LOOK seconds, start the queue's keeper if detached starts
    wait and none runs (one killed, even by SIGKILL, is otherwise started again only by the
    next queued start or a loop's end, which a queue held by a pause may not see for hours)."""

    LOOK = 5.0
    name = "run-agent-queue"

    def __init__(self, keep: Callable[[], bool]) -> None:
        self.keep = keep
        super().__init__()

    def start(self) -> None:
        self._begin()

    def _loop(self) -> None:
        while not self._stop.wait(self.LOOK):
            try:
                if self.keep():
                    log.info("started the queue's keeper: detached starts waited without one")
            except Exception:  # a look that fails (a full disk) must not end the watch
                log.exception("a look at the queue's keeper failed")


def _no_launch(firing: sched.Firing) -> int:
    from runagent.errors import RunAgentError

    raise RunAgentError("this server was started without a way to launch firings")
