"""The gate in front of a task's loop, which the door (service.py) passes every start through:
start now, or wait in the queue, for a slot under `limits:` or for the tasks named by `--after`.

A detached start that must wait leaves a record, and the keeper (executors/keeper.py) starts it
when its turn comes; a foreground run waits in its own process, as the user's shell does anyway, and
says so once. A start that may go takes its slot at once, under the lock, so no other start
can take the same slot meanwhile: for a detached start, in the name of the process that starts
it, until the started loop takes it over (`take_turn`, which finds it there).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from runagent import python
from runagent.config.settings import LimitsSettings
from runagent.errors import AlreadyRunningError, BlockedError, DamagedRecordError, StoppedError
from runagent.fleet import depends
from runagent.fleet.queue import Fleet, Pause, QueueHold, Turn, Waiting, now
from runagent.store.lock import live_holder
from runagent.store.runfolder import TaskPaths, private

POLL = 1.0  # seconds between looks when nothing under .fleet/ changed (a SIGKILLed holder)


def needed(
    task: TaskPaths, limits: LimitsSettings, after: Sequence[str], agent: str | None = None
) -> bool:
    """Whether a start must pass the gate: limits are on, it waits for other tasks, the task
    is in the queue already (a resume of a blocked task), its agent is paused, or the queue is
    held."""
    if limits.active or after:
        return True
    fleet = Fleet(task.root)
    if not fleet.exists():
        return False
    return fleet.record_of(task) is not None or fleet.queue_hold() is not None or (
        agent is not None and agent in fleet.pauses(clean=False))  # fmt: skip


def submit(
    task: TaskPaths, limits: LimitsSettings, agent: str, *, priority: int = 0,
    after: Sequence[str] = (), start: Mapping[str, Any] | None = None, waiter: bool = False,
) -> Turn:  # fmt: skip
    """Admit a start: go now (its slot taken for this process when limits are on), or put it
    in the queue, detached (`start`: what the keeper runs) or waited for by this process."""
    fleet = Fleet(task.root)
    with fleet.locked():
        old = fleet.record_of(task)  # one that cannot be read is replaced by this start
        if old is not None and not old.abandoned() and old.blocked is None and not old.unreadable:
            raise AlreadyRunningError(
                f"task {task.label} is already in the queue; stopping it takes it out "
                "(`run-agent stop`, or Leave the queue on the page)"
            )
        fleet.tidy()
        depends.refresh_pending(fleet)
        if after:  # the edges are those of the records that run after others
            edges = [w for w in fleet.index().with_after() if w.label != task.label]
            depends.refuse_cycle(edges, task.label, after)
        me = os.getpid()
        waiting = Waiting(
            task.project_id, task.task_id, agent, fleet.next_seq(), priority, now(),
            tuple(after), joined=not after, waiter=me if waiter else None,
            waiter_started=_started(me) if waiter else None, start=start,
            limits=limits,
        )  # fmt: skip
        if after:
            kind, words = depends.judge(task.root, after)
            if kind == "fail":
                fleet.put(replace(waiting, blocked=f"waits for {words}"))
                return Turn(False, 0, f"waits for {words}", blocked=True)
            if kind == "wait":
                fleet.put(waiting)
                return Turn(False, 0, f"waits for {words}", blocked=True)
            waiting = replace(waiting, joined=True)
        # Behind every eligible record, whatever its priority, as a start always was.
        turn = fleet.turn(limits, task.project_id, agent, None)
        if turn.go:
            fleet.drop(task)
            if limits.active:
                fleet.hold(task, agent)
        else:
            fleet.put(waiting)
        return turn


def take_turn(
    task: TaskPaths, limits: LimitsSettings, agent: str, *, priority: int = 0,
    after: Sequence[str] = (), tell: Callable[[Turn], None] = lambda turn: None,
) -> str | None:  # fmt: skip
    """A loop about to run in this process: take the slot a detached start took for it, or
    pass the gate, waiting here (`tell` says so, once) until its turn comes; when it waited,
    since when (what its first run records). Ctrl-C or a `stop` leaves the queue
    (StoppedError); a task it waits for that fails ends the wait (BlockedError), leaving the
    task blocked with that reason; a record of it that cannot be read ends it too
    (DamagedRecordError), leaving the task `unreadable` for a person."""
    fleet = Fleet(task.root)
    if fleet.exists():
        with fleet.locked():
            if fleet.slot_of(task) is not None:  # taken for this start by whoever started it
                fleet.hold(task, agent)
                fleet.drop(task)
                return None
    if not needed(task, limits, after, agent):
        return None
    changes = None
    try:
        since = now()
        turn = submit(task, limits, agent, priority=priority, after=after, waiter=True)
        if turn.go:
            return None
        tell(turn)
        changes = _changes(fleet)
        while not _my_turn(fleet, task, limits, agent):
            next(changes)
        return since
    except KeyboardInterrupt:
        with fleet.locked():
            mine = fleet.record_of(task)
            if mine is not None and mine.waiter == os.getpid():
                fleet.drop(task)
        raise StoppedError(f"task {task.label} left the queue") from None
    finally:
        if changes is not None:
            changes.close()


def _my_turn(fleet: Fleet, task: TaskPaths, limits: LimitsSettings, agent: str) -> bool:
    """Whether the waiting task's turn has come (its slot then taken, its record gone)."""
    with fleet.locked():
        mine = fleet.record_of(task)
        if mine is not None and mine.unreadable is not None:  # kept, for a person to see
            fleet.report(mine)
            raise DamagedRecordError(f"task {task.label}: {mine.unreadable_words()}")
        if mine is None or mine.waiter != os.getpid():
            raise StoppedError(f"task {task.label} was taken out of the queue")
        fleet.tidy()
        depends.refresh_pending(fleet)
        mine = fleet.record_of(task) or mine  # joined or blocked just now, maybe
        if mine.blocked is not None:
            fleet.put(replace(mine, waiter=None, waiter_started=None))
            raise BlockedError(
                f"task {task.label} is blocked: it {mine.blocked}; `run-agent resume` "
                "starts it once that task has completed"
            )
        if not mine.eligible:
            return False
        if not fleet.turn(limits, task.project_id, agent, (mine.priority, mine.seq)).go:
            return False
        fleet.drop(task)
        if limits.active:
            fleet.hold(task, agent)
        return True


def pause(task: TaskPaths, agent: str, seconds: float, why: str) -> Pause:
    """A run of `task` found `agent`'s provider limited for `seconds`: pause the agent across
    the fleet until then (or the later time a pause it is in says). The pause in force."""
    fleet = Fleet(task.root)
    said = " ".join(why.split())  # one line, and short: a provider's error may be a JSON body
    said = said if len(said) <= WHY_LIMIT else said[: WHY_LIMIT - 3] + "..."
    with fleet.locked():
        return fleet.pause(Pause(agent, time.time() + seconds, said, task.label, now()))


WHY_LIMIT = 160  # characters of a pause's reason kept


def unpause(root: Path, agent: str) -> Pause | None:
    """Lift `agent`'s pause (`fleet unpause`): its queued tasks start as their turns come. The
    pause it was in; None if it was in none."""
    fleet = Fleet(root)
    if not fleet.exists():
        return None
    with fleet.locked():
        lifted = fleet.unpause(agent)
        detached = fleet.detached_waits()
    if detached:
        ensure_keeper(root)
    return lifted


def hold_queue(root: Path, by: str) -> tuple[QueueHold, bool]:
    """Hold the whole queue (`fleet hold`): no queued task starts until `release`; the loops
    that run go on. The hold in force, and whether this made it (False: it was held)."""
    fleet = Fleet(root)
    with fleet.locked():
        made = QueueHold(now(), by)
        before = fleet.hold_queue(made)
    return (made, True) if before is None else (before, False)


def release_queue(root: Path, only: QueueHold | None = None) -> QueueHold | None:
    """Release the queue (`fleet release`), or only the hold `only` (one `stop --all` made):
    the queued tasks start as their turns come. The hold released; None if none was."""
    fleet = Fleet(root)
    if not fleet.exists():
        return None
    with fleet.locked():
        released = fleet.release_queue(only)
        detached = fleet.detached_waits()
    if released is not None and detached:
        ensure_keeper(root)
    return released


def wait_out(
    task: TaskPaths, limits: LimitsSettings, agent: str, stopped: Callable[[float], bool],
    *, priority: int = 0,
) -> bool:  # fmt: skip
    """A loop of this process whose agent is paused: give its slot back (the next in the queue
    may take it) and wait in the queue as a record, like any foreground run, until the pause
    lifts and its turn comes (its slot taken again). `stopped(seconds)` waits between looks and
    says whether the loop was stopped meanwhile; False if it was (`stop` signals the loop as
    well as taking its record out). A record taken out by another reader (one on another host
    of a shared root, which cannot see this process) is put back."""
    fleet = Fleet(task.root)
    with fleet.locked():
        fleet.release(task)
        detached = fleet.detached_waits()
    if detached:
        ensure_keeper(task.root)
    while True:
        try:
            if _my_turn(fleet, task, limits, agent):
                return True
        except StoppedError:  # not in the queue (yet, or again): a stop signals the loop too
            try:
                if submit(task, limits, agent, priority=priority, waiter=True).go:
                    return True
            except AlreadyRunningError:
                pass  # put back meanwhile
        except (BlockedError, DamagedRecordError):
            return False
        if stopped(LOOK):
            with fleet.locked():
                mine = fleet.record_of(task)
                if mine is not None and mine.waiter == os.getpid():
                    fleet.drop(task)
            return False


LOOK = 0.25  # seconds between a paused loop's looks at the queue (and at its own stop)


def release(task: TaskPaths) -> None:
    """The loop of this process ended: free its slot, and see that queued detached tasks have
    a keeper to start them (it may have been killed)."""
    fleet = Fleet(task.root)
    if not fleet.exists():
        return
    with fleet.locked():
        fleet.release(task)
        detached = fleet.detached_waits()
    if detached:
        ensure_keeper(task.root)


def take_over(task: TaskPaths, ticket: str) -> None:
    """A loop the keeper started takes its start over: the keeper's claim on it (bearing
    `ticket`) is off, so no keeper puts it back in the queue. StoppedError if the claim is
    gone: the start was taken back as it began (`stop`, or its keeper was killed and a later
    one put it back in the queue, where it may be claimed afresh), and must not run."""
    fleet = Fleet(task.root)
    with fleet.locked():
        if fleet.unclaim(task.project_id, task.task_id, ticket):
            return
    raise StoppedError(
        f"task {task.label}: this start was taken back as it began (stopped, or put back in "
        "the queue when the keeper starting it stopped); it did not run"
    )


def claimed(root: Path) -> set[str]:
    """P/T of the tasks whose starts a keeper claimed and no loop has taken over yet."""
    fleet = Fleet(root)
    return {c.waiting.label for _, c in fleet.claims() if c is not None}


def keeper_wanted(root: Path) -> bool:
    """Whether `root`'s queue has work and no keeper runs (one was killed): `serve` looks."""
    fleet = Fleet(root)
    # Nothing queued nor claimed: no lock taken, no index opened (either would make files in
    # a root where nothing waits, every few seconds).
    if not (_holds_any(fleet.queue) or _holds_any(fleet.starting)):
        return False
    try:
        if _keeper_runs(fleet):
            return False
        with fleet.locked():
            return fleet.detached_waits()
    except OSError:  # a root this process may only read: its owner's processes keep it
        return False


def dequeue(task: TaskPaths, settle: Callable[[], None] | None = None) -> Waiting | None:
    """Take the task out of the queue (`stop`, `delete`); its record, or None if it was not in
    it. A foreground run waiting for it notices, and ends. `settle` runs, still under the
    queue's lock, once it is out (`stop` says what became of it there), and the tasks that run
    after it are judged again: one that now never starts is blocked at once."""
    fleet = Fleet(task.root)
    if not fleet.exists():
        return None
    with fleet.locked():
        record = fleet.record_of(task)
        fleet.drop(task)
        claimed = fleet.drop_claim(task)  # a start the keeper is making: it does not run
        if record is None and claimed is not None and live_holder(task.lock) is None:
            record = claimed  # (with a loop of it running, a dead keeper's claim was stale)
        if record is not None and settle is not None:
            settle()
            fleet.tidy()
            depends.refresh_pending(fleet)
    return record


def ensure_keeper(root: Path, env: Mapping[str, str] | None = None) -> None:
    """Start the keeper of `root`'s queue unless one runs, with `env` (None: this process's),
    whose secrets it gives the starts it makes. It detaches from this process (so none is left
    for this one to reap) and exits once no detached task is queued that it could start."""
    fleet = Fleet(root)
    fleet.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    if _keeper_runs(fleet):
        return
    with open(fleet.folder / "keeper.log", "ab", opener=private) as log:
        subprocess.run(
            python("-m", "runagent.executors.keeper", "--detach", str(root.resolve())),
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/", check=False,
            start_new_session=True, timeout=60, env=dict(env) if env is not None else None,
        )  # fmt: skip


def _holds_any(folder: Path) -> bool:
    """Whether `folder` has any entry (a missing or unreadable one has none)."""
    try:
        with os.scandir(folder) as entries:
            return any(True for _ in entries)
    except OSError:
        return False


def _keeper_runs(fleet: Fleet) -> bool:
    """Whether a keeper holds `fleet`'s keeper.lock (it holds it for as long as it runs)."""
    from runagent.store.runfolder import is_held

    return is_held(fleet.folder / "keeper.lock")


def _changes(fleet: Fleet) -> Generator[object, None, None]:
    """Yields when something under .fleet/ changed, or after POLL seconds."""
    import watchfiles

    return watchfiles.watch(
        fleet.folder, step=5, debounce=50, rust_timeout=int(POLL * 1000),
        yield_on_timeout=True, recursive=True,
    )  # fmt: skip


def _started(pid: int) -> float | None:
    from runagent.store.pids import process_start_time

    return process_start_time(pid)
