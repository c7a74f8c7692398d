"""A loop on another executor (a Ray cluster), followed here in the foreground: what `run`,
`job` and `resume` do there unless `--detach`. The same console as a loop run here (its event
lines, read from its supervisor.log wherever that is; in a terminal, the live status line),
the same exit code (the loop's own, which its host agent records as it ends), and Ctrl-C,
SIGTERM or SIGHUP stop the loop wherever it runs."""

from __future__ import annotations

import signal
import sys
import time
from types import FrameType
from typing import Any, NoReturn

import click

from runagent import listing
from runagent.cli.console import Console
from runagent.cli.foreground import STOP_SIGNALS
from runagent.config.settings import ExecutorSettings
from runagent.errors import ExitCode
from runagent.executors import control
from runagent.loop.events import Event, EventKind
from runagent.service import Service, StartRequest
from runagent.store import runfolder, tasks
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import RunStatus

TICK = 0.25  # seconds between looks at the loop
LOG_CHUNK = 1 << 20  # bytes of supervisor.log read per look
UNSEEN_GRACE = 30.0  # seconds a loop may be nowhere (not queued, running nor ended) at its start
# A loop whose end went unrecorded (its host lost for good): its exit code by its latest run.
STATUS_EXIT = {
    RunStatus.COMPLETED: ExitCode.COMPLETED,
    RunStatus.TIMED_OUT: ExitCode.TIMED_OUT,
    RunStatus.STOPPED: ExitCode.STOPPED,
}


def follow_remote(service: Service, request: StartRequest, quiet: bool) -> NoReturn:
    """Start the task's loop on the service's executor and follow it until it ends; exit with
    its exit code."""
    settings = service.executor
    assert settings is not None
    task = request.task
    began = time.time()  # before the start: the loop's end is recorded after it
    follower = Follower(service, settings, task, began, quiet)
    # A signal while it starts stops it once started: never a loop left running unfollowed.
    previous = {sig: signal.signal(sig, follower.signalled) for sig in STOP_SIGNALS}
    try:
        started = service.start(request)
        if started.queued is not None:  # one line, even with --quiet: it is not lost, it waits
            click.echo(f"run-agent: {started.queued.words(task.label)}", err=True)
        elif not quiet:
            held = started.holder
            where = held.describe(host=True) if held is not None else f"pid {started.pid}"
            click.echo(f"run-agent: task {task.label} runs on {settings.type} (supervisor "
                       f"{where})", err=True)  # fmt: skip
        follower.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class Follower:
    def __init__(
        self, service: Service, settings: ExecutorSettings, task: TaskPaths, began: float,
        quiet: bool,
    ) -> None:  # fmt: skip
        self.service = service
        self.cluster = control.ray_executor(settings)
        self.shared = settings.shared_root
        self.task = task
        self.began = began
        self.quiet = quiet
        self.console = Console(sys.stderr, 1, quiet)
        self.offset: int | None = None  # of this loop's first line in supervisor.log
        self.node = ""  # the host whose supervisor.log it reads (a moved loop has another)
        self.pending = b""
        self.last_line = ""
        self.signals = 0
        self.stop_sent = False

    def run(self) -> NoReturn:
        unseen = time.monotonic()
        while True:
            if self.signals and not self.stop_sent:
                self._stop()
            end = self.cluster.ended(self.task.label, self.began)
            if end is not None and end.get("withdrawn"):  # taken out of the cluster's queue
                self.console.say(f"task {self.task.label} left the queue; it was never started")
                self._exit(int(end.get("code", ExitCode.STOPPED)))
            self._relay(end)
            if end is not None:
                self._exit(int(end.get("code", ExitCode.FAILED)))
            if self._blocked_for_good():
                self._exit(ExitCode.BLOCKED)
            if self._somewhere():
                unseen = time.monotonic()
            elif time.monotonic() - unseen > UNSEEN_GRACE:
                self._exit(self._by_latest_run())
            self._status()
            time.sleep(TICK)

    def signalled(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1
        if self.signals > 1:  # a second Ctrl-C: leave it stopping, go
            shows = f"`run-agent status -p {self.task.project_id}` shows when it has"
            self.console.say(f"task {self.task.label} is still stopping where it runs; {shows}")
            sys.exit(int(ExitCode.STOPPED))

    def _stop(self) -> None:
        from runagent.fleet.queue import Waiting

        stopped = self.service.stop(self.task, None)
        if isinstance(stopped, Waiting):  # it never started: nothing to wait for
            self.console.say(f"task {self.task.label} left the queue; it was never started")
            sys.exit(int(ExitCode.STOPPED))
        if stopped is not None:  # else it is still being placed or started: asked again
            self.stop_sent = True
            self.console.say(f"stopping task {self.task.label}")

    def _relay(self, end: dict[str, Any] | None) -> None:
        """Print the lines this loop's supervisor wrote since the last look (all of them once
        it has ended: `end` is its end record)."""
        final = end is not None
        if self.offset is None or not self.shared:  # a loop moved to a host of its own root
            found = None
            if end is not None:
                found = (str(end.get("node") or ""), int(end.get("log_from") or 0))
            elif (where := self.cluster.locate(self.task.label)) is not None:
                found = (where.node, where.log_from)
            if found is not None and (self.offset is None or found[0] != self.node):
                self.node, self.offset, self.pending = found[0], found[1], b""
            if self.offset is None:
                return
        while data := self._read(self.offset):
            self.offset += len(data)
            self.pending += data
            if not final:
                break
        *lines, self.pending = self.pending.split(b"\n")
        if final and self.pending:
            lines, self.pending = [*lines, self.pending], b""
        for raw in lines:
            line = raw.decode("utf-8", errors="replace").rstrip("\r")
            if line.strip():
                self.last_line = line
                if not self.quiet:
                    self.console.relay(line)

    def _read(self, offset: int) -> bytes:
        relative = runfolder.SUPERVISOR_LOG
        if not self.shared:
            return self.cluster.read(self.task, relative, offset, LOG_CHUNK)
        try:
            with open(self.task.folder / relative, "rb") as f:
                f.seek(offset)
                return f.read(LOG_CHUNK)
        except OSError:
            return b""

    def _exit(self, code: int) -> NoReturn:
        if self.quiet and self.last_line:  # only the final line, as a loop run here
            self.console.relay(self.last_line, always=True)
        self.console.done()
        sys.exit(code)

    def _somewhere(self) -> bool:
        """Whether the loop runs, starts or waits: its placement group is on the cluster (placed,
        waiting, or moving from a dead host), or it waits in this root's queue."""
        if self.cluster.present(self.task.label):
            return True
        view = listing.view(self.task)  # its own place, not the whole queue's
        return view.status in (tasks.TaskStatus.RUNNING, tasks.TaskStatus.QUEUED,
                               tasks.TaskStatus.BLOCKED)  # fmt: skip

    def _blocked_for_good(self) -> bool:
        """Whether it waits here for a task that did not complete (it stays blocked)."""
        from runagent.fleet import depends
        from runagent.fleet.queue import Fleet

        fleet = Fleet(self.task.root)
        if not fleet.exists() or fleet.record_of(self.task) is None:
            return False
        with fleet.locked():
            fleet.tidy()
            depends.refresh_pending(fleet)
            mine = fleet.record_of(self.task)
        if mine is None or mine.abandoned() or mine.blocked is None:
            return False
        then = "; `run-agent resume` starts it once that task has completed"
        self.console.say(f"task {self.task.label} is blocked: it {mine.blocked}"
                         f"{then if mine.blocked.startswith('waits for') else ''}")  # fmt: skip
        return True

    def _by_latest_run(self) -> int:
        latest = tasks.latest_run(self.task)
        if latest is None:
            return int(ExitCode.FAILED)
        return int(STATUS_EXIT.get(latest.status, ExitCode.FAILED))

    def _status(self) -> None:
        """The live status line, in a terminal, when the run's folder is readable here."""
        if not self.console.live or not self.shared:
            return
        latest = tasks.latest_run(self.task)
        if latest is None or latest.status is not RunStatus.RUNNING:
            return
        folder = self.task.run_folder(latest.run_id)
        elapsed = max(0.0, time.time() - _epoch(latest.start_time))
        self.console.show(Event(EventKind.TICK, run=latest, run_folder=folder, elapsed=elapsed))


def _epoch(stamp: str) -> float:
    from datetime import datetime

    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return time.time()
