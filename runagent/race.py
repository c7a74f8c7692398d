"""A race's watcher: the one judge of a race (runagent/store/race.py), holding the race's task
while its racers run.

It wakes when a racer's folder changes (its loop taking or letting go of its lock, its DONE)
and at least every POLL seconds (a racer killed with SIGKILL writes nothing; a spend is read
from its runs), and:

- the first racer whose loop ended with the task completed (under its `until` rule and its
  check) wins: recorded under the race's lock, so exactly one racer ever does. The others are
  stopped through the door (`Service.stop_all`: asked together, their runs marked `lost_race`)
  and their worktrees removed; the race's task is completed (its DONE, its worktree record
  naming the winner's branch, which `merge` brings back);
- when the racers' summed spend crosses the race's budget, all are stopped (`budget`);
- when every racer has given up, the race fails, its record saying each one's reason;
- asked to stop (SIGTERM from `stop`, Ctrl-C of the command line that follows it), it stops all
  its racers and the race is `stopped`.

A detached race's watcher is a process of its own, started by the door:

    python -m runagent.race ROOT PROJECT TASK

and `run --race` in the foreground watches the race in its own process, exiting with its code.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from runagent import listing, python
from runagent.config.settings import Budget, ExecutorSettings, ExecutorType, parse_budget
from runagent.errors import DamagedRecordError, ExitCode, RunAgentError
from runagent.record import record
from runagent.service import Service
from runagent.store import race, runfolder, taskfolder, tasks
from runagent.store.race import Ending, Race
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import Reason, RunStatus, Usage
from runagent.store.tasks import RacerView, TaskStatus, TaskView

POLL = 0.25  # seconds between looks at the racers when nothing in their folders changed

RACE_EXIT = {
    Ending.COMPLETED: ExitCode.COMPLETED,
    Ending.FAILED: ExitCode.FAILED,
    Ending.STOPPED: ExitCode.STOPPED,
    Ending.BUDGET: ExitCode.BUDGET,
}

# A racer still in the race: its loop runs, waits in the queue, or is about to start.
RACING = frozenset({TaskStatus.RUNNING, TaskStatus.QUEUED, TaskStatus.BLOCKED, TaskStatus.PENDING})

# Why the race stopped a racer, as its record and its run say it.
_OUT = {Ending.STOPPED: Reason.STOPPED, Ending.BUDGET: Reason.BUDGET}


@record
class Finished:
    """How a race ended: its record, and the exit code that says it."""

    race: Race
    code: ExitCode

    @property
    def message(self) -> str:
        return self.race.message or ""


class Watcher:
    """Judges one race until it is over. Construct, then `run()` (the race's task held by the
    caller); `request_stop()` is safe from a signal handler."""

    def __init__(
        self, service: Service, task: TaskPaths, say: Callable[[str], None] = lambda line: None
    ) -> None:
        self.service = service
        self.task = task
        self.say = say
        self.stop = threading.Event()

    def request_stop(self) -> None:
        self.stop.set()

    def run(self) -> Finished:
        try:
            found = race.read(self.task)
        except ValueError as exc:
            raise DamagedRecordError(str(exc)) from None
        if found is None:
            raise RunAgentError(f"task {self.task.label} is no race (it has no race.yaml)")
        if found.over:
            return Finished(found, RACE_EXIT.get(found.outcome or "", ExitCode.FAILED))
        racers = found.tasks(self.task)
        budget = parse_budget(found.budget, f"the budget in {self.task.race}")
        changes = self._changes(racers)
        try:
            while True:
                if self.stop.is_set():
                    return self._end(found, Ending.STOPPED, f"race {self.task.label} stopped")
                views = [listing.view(t) for t in racers]
                winner = _winner(found, views)
                if winner is not None:
                    return self._won(found, winner)
                said = _crossed(budget, views) if budget is not None else ""
                if said:
                    return self._end(found, Ending.BUDGET, (
                        f"race {self.task.label} stopped by its budget: {said} over its racers"
                    ))  # fmt: skip
                if not any(v.status in RACING for v in views):
                    return self._end(found, Ending.FAILED, self._gave_up())
                next(changes, None)
        finally:
            close = getattr(changes, "close", None)
            if close is not None:
                close()

    def _changes(self, racers: list[TaskPaths]) -> Iterator[object]:
        """Wakes when a racer's folder changes (not what its agent writes in its worktree), and
        at least every POLL seconds; ends once the race is asked to stop."""
        import watchfiles

        folders = [t.folder for t in racers if t.folder.is_dir()]
        if not folders:
            return iter(lambda: self.stop.wait(POLL), None)
        return watchfiles.watch(
            *folders, recursive=False, debounce=20, step=20, rust_timeout=int(POLL * 1000),
            yield_on_timeout=True, stop_event=self.stop, raise_interrupt=False,
        )  # fmt: skip

    def _won(self, found: Race, winner: TaskView) -> Finished:
        """A racer completed: it wins unless one already did; the others are stopped and their
        worktrees removed; the race's task is completed, its branch the winner's."""
        won = race.decide(self.task, winner.paths.task_id)
        winning = TaskPaths(self.task.root, self.task.project_id, won)
        latest = winner.latest
        run = f" (run {latest.run_id}, attempt {latest.attempt})" if latest is not None else ""
        losers = [t for t in found.tasks(self.task) if t.task_id != won]
        self.say(f"racer {winning.label} won race {self.task.label}{run}")
        lost = f"lost the race to {winning.label}"
        stopped = self.service.stop_all(losers, found.stop_wait, Reason.LOST_RACE, lost)
        for loser in stopped:
            race.mark_out(self.task, loser.task_id, Reason.LOST_RACE.value, lost)
        if stopped:
            self.say(f"stopped {', '.join(t.label for t in stopped)}: {lost}")
        self._remove_worktrees(losers)
        record = taskfolder.read_worktree_record(winning)
        if record.get("branch"):  # the race's branch: the winner's (`merge` brings it back)
            kept = ("repo", "branch", "base", "into", "fork", "created", "synced")
            taskfolder.write_worktree_record(
                self.task, {**{k: record[k] for k in kept if k in record}, "racer": won}
            )
        runfolder.atomic_write(self.task.done, f"won by racer {winning.label}{run}\n")
        branch = f"; its branch {record['branch']}" if record.get("branch") else ""
        message = f"race {self.task.label} won by {winning.label}{run}{branch}"
        return Finished(race.end(self.task, Ending.COMPLETED, message), ExitCode.COMPLETED)

    def _remove_worktrees(self, losers: list[TaskPaths]) -> None:
        """The losers' worktrees, gone (their uncommitted work saved into their folders, their
        branches kept); one that cannot be removed is said, and left."""
        from runagent.issues import pruning

        for loser in losers:
            try:
                pruning.remove(loser, os.environ)
            except (RunAgentError, OSError) as exc:
                self.say(f"the worktree of {loser.label} was kept: {exc}")

    def _end(self, found: Race, ending: str, message: str) -> Finished:
        """The race over without a winner: the racers still in it stopped (and said to be out
        for `ending`), and the race's record saying how it ended."""
        reason = _OUT.get(ending, Reason.STOPPED)
        racing = [v.paths for v in (listing.view(t) for t in found.tasks(self.task))
                  if v.status in RACING]  # fmt: skip
        stopped = self.service.stop_all(racing, found.stop_wait, reason, message)
        for racer in stopped:
            race.mark_out(self.task, racer.task_id, reason.value, message)
        if stopped:
            self.say(f"stopped {', '.join(t.label for t in stopped)}: {message}")
        return Finished(race.end(self.task, ending, message), RACE_EXIT[ending])

    def _gave_up(self) -> str:
        """Every racer gave up: the race's message, each one's reason beside its name."""
        view = listing.view(self.task)
        racers = view.race.racers if view.race is not None else ()
        said = "; ".join(_why(r) for r in racers)
        return f"race {self.task.label} failed: every racer gave up ({said})"


def _why(racer: RacerView) -> str:
    reason = racer.reason or racer.view.status.value
    message = f": {racer.message}" if racer.message else ""
    return f"{racer.view.label} {reason}{message}"


def _winner(found: Race, views: list[TaskView]) -> TaskView | None:
    """The racer that completed first in this race: its loop over (its lock let go), its DONE
    written and its latest run, of this race, completed. (A DONE an agent writes while its loop
    runs is no win: its loop judges it, with its check.)"""
    done = [
        v for v in views
        if v.status is TaskStatus.COMPLETED and v.latest is not None
        and v.latest.status is RunStatus.COMPLETED and v.latest.start_time >= found.started
    ]  # fmt: skip
    done.sort(key=lambda v: v.latest.end_time or "" if v.latest is not None else "")
    return done[0] if done else None


def _crossed(budget: Budget, views: list[TaskView]) -> str:
    """The race's budget in words once its racers' summed spend is past it; '' within it."""
    used = Usage()
    for v in views:  # every run of each racer, a running one's spend so far included
        found = tasks.usage(v.paths)
        if found is not None:
            used = used + found
    return budget.crossed(used.tokens, used.cost_usd)


def exit_code(finished: Finished) -> int:
    return int(finished.code)


def ensure_watched(racer: TaskPaths) -> None:
    """A racer's loop has ended: if its race is not over and nothing watches it (its watcher
    was killed, or the command line that followed it), start a watcher, which judges the race
    as it stands now (a racer that completed meanwhile wins, the others are stopped)."""
    import subprocess

    from runagent.store.lock import live_holder

    found = race.race_of(racer)
    if found is None or found[1].over or live_holder(found[0].lock) is not None:
        return
    owner = found[0]
    try:
        with open(runfolder.supervisor_log_path(owner), "ab", opener=runfolder.private) as out:
            subprocess.Popen(
                python(*race.watcher_argv(owner)), cwd=owner.root,
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
            )  # fmt: skip
    except OSError as exc:  # said where the race's words go; its racers' stop still stops it
        _say(f"race {owner.label} has no watcher and none could be started: {exc}")


def main(args: list[str]) -> int:
    """The watcher of a detached race: waits for the race's task (its starter lets go of it
    once this is started), judges the race, and exits with its code; SIGTERM stops it."""
    if len(args) != 3:
        print("usage: python -m runagent.race ROOT PROJECT TASK", file=sys.stderr)
        return int(ExitCode.USAGE)
    from runagent.store.lock import TaskLock

    task = runfolder.confine(TaskPaths(Path(args[0]), args[1], args[2]))
    try:
        found = race.read(task)
    except ValueError as exc:
        print(f"run-agent: {exc}", file=sys.stderr, flush=True)
        return int(ExitCode.FAILED)
    executor = None
    if found is not None and found.executor:
        executor = ExecutorSettings(
            type=ExecutorType(str(found.executor.get("type", "local"))),
            address=str(found.executor.get("address", "auto")),
            namespace=str(found.executor.get("namespace", "run-agent")),
        )
    watcher = Watcher(Service(task.root, executor=executor), task, _say)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: watcher.request_stop())
    lock = TaskLock(task.lock, task.label)
    lock.acquire(wait=lambda why: None)
    try:
        finished = watcher.run()
    except RunAgentError as exc:
        _say(str(exc))
        return int(exc.exit_code)
    finally:
        lock.release()
    _say(finished.message)
    return exit_code(finished)


def _say(line: str) -> None:
    print(f"run-agent: {line}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
