"""The server's scheduler: `run-agent serve` fires the config's schedules in a background thread.

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


class ScheduleRunner:
    """The scheduler, its thread, and a lock so the page's "run now" and the ticks take turns."""

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
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self.running:
            return
        with self._lock:
            self.scheduler.start(self.clock())
        self._thread = threading.Thread(target=self._loop, name="run-agent-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

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


def _no_launch(firing: sched.Firing) -> int:
    from runagent.errors import RunAgentError

    raise RunAgentError("this server was started without a way to launch firings")
