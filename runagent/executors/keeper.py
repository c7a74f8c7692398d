"""The keeper: one process per runs root that starts queued detached tasks as their turn comes.

A queued detached task costs a record, not a process: the keeper is the one process that waits
for all of them. It wakes when anything under `.fleet/` changes (a loop that ends frees its
slot by removing a file) and at least once a second (a holder killed by SIGKILL removes
nothing; its slot counts for nothing once its pid is gone, and a task waited for may have
completed). Each record carries what its start needs (argv, folder, environment, the limits in
force when it was queued), so the keeper needs no config of its own. A record keeps the names of
its secret variables, never their values: the keeper gives the start its own values of them (it
was started by whoever queued the first record, with that environment), and a start that needs
one the keeper's environment does not set is blocked, saying which, never started without it. It
exits once no detached task is queued that it could start; whoever queues the next one, or ends
a loop while one waits, starts it again (gate.ensure_keeper).

    python -m runagent.executors.keeper [--detach] ROOT
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from runagent import python
from runagent.executors.forkserver import ForkServer
from runagent.fleet import depends, gate
from runagent.fleet.queue import Ahead, Claim, Fleet, Waiting, owned_by_others
from runagent.loop.context import QUEUED_SINCE, START_TICKET
from runagent.store import credentials
from runagent.store.pids import is_alive, process_start_time
from runagent.store.runfolder import TaskPaths

if TYPE_CHECKING:
    from runagent.executors.local import Child


def keep(root: Path) -> int:
    """Start queued detached tasks of `root` as their turn comes, until none is queued."""
    fleet = Fleet(root)
    fleet.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(fleet.folder / "keeper.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return 0  # another keeper has it
    changes = gate._changes(fleet)
    seen = Seen()
    # The supervisors it starts, forked from a process that loaded them once: a freed slot
    # waits for no interpreter's start. Started once a task is queued; a new interpreter for
    # each start where it cannot be.
    forks: ForkServer | None = None
    try:
        while True:
            with fleet.locked():
                due = _due(fleet, seen)
                if due is None:
                    # Let go of the keeper's lock before the fleet's: a record written after
                    # this look finds no keeper, and its writer starts one.
                    os.close(fd)
                    fd = -1
                    return 0
            if forks is None:
                forks = ForkServer(bound=False)
                forks.start(dict(os.environ))
            for waiting, ticket in due:
                _start(fleet, waiting, forks, ticket, seen)
            if not due:
                next(changes)
    finally:
        changes.close()
        if fd >= 0:
            os.close(fd)


class Seen:
    """How far the keeper has checked the records (the index's counter of writes): a record is
    checked once as it comes (whether this user's own, its environment complete), not at
    every look."""

    def __init__(self) -> None:
        self.changed = 0
        # Starts of this keeper whose loop had not taken its lock when START_WAIT was up (the
        # process, its start time): their claims stay until the loop takes them over, or its
        # process ends without; the slot taken for each is freed once its process ends.
        self.slow: dict[str, tuple[Child, float | None]] = {}


def _due(fleet: Fleet, seen: Seen | None = None) -> list[tuple[Waiting, str]] | None:
    """The detached tasks whose turn has come, their slots taken for them and their starts
    claimed (under the lock), each with its claim's ticket;
    None when no detached task is queued at all, nor a start a gone keeper claimed. One walk
    down the queue's order (the index), as far as a task may yet start: each task ahead taken
    to have started if it fits, as `decide` takes them."""
    seen = seen if seen is not None else Seen()
    fleet.tidy()
    depends.refresh_pending(fleet)
    undecided = _recover(fleet, seen)
    index = fleet.index()
    if not index.any_detached():
        # A blocked one starts only when resumed, which starts a keeper again.
        return [] if undecided else None
    fresh, seen.changed = index.changed_since(seen.changed)
    for waiting in fresh:
        _check(fleet, waiting)
    holders, paused, held = fleet.holders(), fleet.pauses(), fleet.queue_hold()
    if held is not None:
        return []
    ahead = Ahead(holders, paused, index.limits())
    due: list[tuple[Waiting, str]] = []
    for waiting in index.in_order():
        if ahead.none_fits():
            break
        started = False
        if waiting.start is not None:
            limits = waiting.limit_settings()
            if ahead.turn(limits, waiting.project, waiting.agent, held).go:
                record = _check(fleet, waiting)  # what it runs: its record, read now
                if record is None:
                    continue
                task = TaskPaths(fleet.root, waiting.project, waiting.task)
                # Claimed, so that a keeper killed before the start begins loses nothing
                # (`_recover`): a local loop takes the claim off as it begins, a hand-over to
                # the cluster as soon as its process is made (it goes on if the keeper dies).
                ticket = fleet.claim(record)
                fleet.drop(task)
                if limits.active:
                    fleet.hold(task, waiting.agent)
                due.append((record, ticket))
                started = True
        ahead.add(waiting, started)
    return due


def _recover(fleet: Fleet, seen: Seen) -> bool:
    """Under the lock: put back in their places in the queue the starts that a keeper now gone
    claimed and that never began (no loop took them over, nor holds their task's lock, START_WAIT
    after the claim), and drop this keeper's claims on slow starts whose process ended without
    taking them over; whether a claim must still be waited for (its start may yet begin)."""
    undecided = False
    for path, claim in fleet.claims():
        try:
            undecided |= _judge(fleet, seen, path, claim)
        except OSError as exc:  # one claim that cannot be handled holds up no other start
            print(f"run-agent: the start claim {path} could not be handled: {exc}",
                  file=sys.stderr, flush=True)  # fmt: skip
    for label, (child, started) in list(seen.slow.items()):
        if not _lives(child, started):  # began and ended, or never began: its slot is free
            project, _, task = label.partition("/")
            fleet.release(TaskPaths(fleet.root, project, task))  # (only a slot this keeper holds)
            del seen.slow[label]
    return undecided


def _lives(child: Child, started: float | None) -> bool:
    """Whether a start's process still runs; read from the process itself too (a fork server
    that died reports no exit), by its start time (a pid reused since is not it)."""
    return child.poll() is None and is_alive(child.pid, started)


def _judge(fleet: Fleet, seen: Seen, path: Path, claim: Claim | None) -> bool:
    """`_recover` of one claim: whether it must still be waited for."""
    from runagent.executors.local import START_WAIT
    from runagent.store.lock import live_holder

    if claim is None:  # unreadable, or not this user's alone: never run
        path.unlink(missing_ok=True)
        print(f"run-agent: dropped the start claim {path}: it cannot be trusted",
              file=sys.stderr, flush=True)  # fmt: skip
        return False
    waiting = claim.waiting
    task = TaskPaths(fleet.root, waiting.project, waiting.task)
    if claim.keeper.pid == os.getpid() and claim.keeper.alive():  # this keeper's slow start
        slow = seen.slow.get(waiting.label)
        if slow is not None and _lives(*slow):
            return True
        path.unlink(missing_ok=True)
        _say(task, f"the queue could not start task {task.label}: its loop ended before it began")
        return False
    if claim.keeper.alive():
        return False
    since = (
        "it runs" if live_holder(task.lock) is not None
        else "it is queued again" if fleet.record_of(task) is not None
        else "it ran since" if _ran_since(task, claim.at) else ""
    )  # fmt: skip
    if since:
        path.unlink(missing_ok=True)
        gone = f"the keeper that was starting task {waiting.label} (pid {claim.keeper.pid})"
        _say(
            task, f"{gone} stopped before its loop began; it is not put back in the queue: {since}"
        )
        return False
    if 0 <= time.time() - claim.at < START_WAIT:
        return True
    fleet.put(waiting)
    path.unlink(missing_ok=True)
    _say(task, f"task {waiting.label} is back in its place in the queue: the keeper that was "
               f"starting it (pid {claim.keeper.pid}) stopped before its loop began")  # fmt: skip
    return False


def _ran_since(task: TaskPaths, moment: float) -> bool:
    """Whether a run of the task began after `moment` (a run folder made since: the runs
    folder's time then changed)."""
    try:
        return os.stat(task.runs).st_mtime > moment
    except OSError:
        return False


def _say(task: TaskPaths, words: str) -> None:
    """Say `words` in keeper.log and the task's supervisor.log."""
    from runagent.store import runfolder

    line = f"run-agent: {words}"
    print(line, file=sys.stderr, flush=True)
    try:
        runfolder.append_line(runfolder.supervisor_log_path(task), line)
    except OSError:
        pass


def _check(fleet: Fleet, waiting: Waiting) -> Waiting | None:
    """The record of a detached task as it is in its file, if it may be started: one that is
    not this user's own is dropped, one whose secret variables the keeper lacks is blocked
    (None for either, and for one gone or changed since)."""
    record = fleet.record_of(TaskPaths(fleet.root, waiting.project, waiting.task))
    if record is None or record.start is None or not record.eligible:
        return None
    refused = _untrusted(fleet, record)
    if refused:  # never started: a record is what this process runs, and is checked so
        fleet.drop(TaskPaths(fleet.root, record.project, record.task))
        print(f"run-agent: dropped the queue record of {record.label}: {refused}",
              file=sys.stderr, flush=True)  # fmt: skip
        return None
    missing = _environment(record)[1]
    if missing:
        _block(fleet, record, _lacks(missing))
        return None
    return record


# What a queued start may run: run-agent's own loop commands, nothing else.
STARTS = ("run", "resume", "job")


def _untrusted(fleet: Fleet, waiting: Waiting) -> str:
    """Why a record may not be started ('' if it may): the keeper runs what a record says, so
    it must be this user's own (owned by it, writable by no one else, in a folder that is
    too), and say a run-agent loop command."""
    path = fleet.record_path(waiting.project, waiting.task)
    for what in (fleet.folder, fleet.queue, path):
        refused = owned_by_others(what)
        if refused:
            return refused
    start = waiting.start or {}
    argv = start.get("argv")
    if not isinstance(argv, list) or not argv or argv[0] not in STARTS:
        return f"its start {argv!r} is not a run-agent {' or '.join(STARTS)} command line"
    if not isinstance(start.get("env"), dict) or not isinstance(start.get("withheld", []), list):
        return "its environment is not a mapping of names to values with a list of names"
    return ""


def _environment(waiting: Waiting) -> tuple[dict[str, str], tuple[str, ...]]:
    """The environment a record's start runs with: the values it keeps, and those of its
    secret variables (the names it keeps) from the keeper's own; and the names of those the
    keeper's environment does not set."""
    start = waiting.start or {}
    values = {str(k): str(v) for k, v in dict(start.get("env") or {}).items()}
    withheld = [str(name) for name in start.get("withheld") or ()]
    return credentials.restore(values, withheld, os.environ)


def _lacks(missing: tuple[str, ...]) -> str:
    """Why a start that needs `missing` is blocked, as `blocked: ...` and `it ...` read it."""
    names, them = ", ".join(missing), "it is" if len(missing) == 1 else "they are"
    return (
        f"needs {names}, which the environment of the queue's keeper does not set (a queued "
        f"start keeps the names of its secret variables, not their values); resume it where "
        f"{them} set"
    )


def _block(fleet: Fleet, waiting: Waiting, why: str) -> None:
    """Leave a record in the queue, blocked for `why` (under the lock): listings show it, a
    resume starts it again; said in keeper.log and the task's supervisor.log."""
    from runagent.store import runfolder

    fleet.put(replace(waiting, blocked=why))
    line = f"run-agent: task {waiting.label} is blocked: it {why}"
    print(line, file=sys.stderr, flush=True)
    task = TaskPaths(fleet.root, waiting.project, waiting.task)
    try:
        runfolder.append_line(runfolder.supervisor_log_path(task), line)
    except OSError:
        pass


def _start(
    fleet: Fleet, waiting: Waiting, forks: ForkServer | None = None, ticket: str | None = None,
    seen: Seen | None = None,
) -> None:  # fmt: skip
    """Start a task whose turn has come (its supervisor forked by `forks` where it serves the
    start's environment, else a new interpreter), its claim's `ticket` handed to its loop,
    which takes the claim off as it begins; a start that fails frees its slot, takes its
    claim off and says why in the task's supervisor.log (where a detached loop's own words
    go). A loop that has not taken its lock after START_WAIT keeps its claim (`seen.slow`)."""
    from runagent.executors.local import START_WAIT, start_local

    task = TaskPaths(fleet.root, waiting.project, waiting.task)
    start = waiting.start or {}
    if ticket is not None and not fleet.has_claim(waiting.project, waiting.task, ticket):
        with fleet.locked():  # taken back (`stop`) while earlier starts of its batch were made
            fleet.release(task)
        return
    try:
        argv = [str(a) for a in start["argv"]]
        cwd, env = Path(str(start["cwd"])), _environment(waiting)[0]
        env[QUEUED_SINCE] = waiting.submitted  # what its first run records (or its cluster's)
        if _executor_of(argv) == "ray":
            _hand_to_cluster(task, argv, cwd, env, lambda: _unclaim(fleet, waiting, ticket))
        else:
            if ticket is not None:
                env[START_TICKET] = ticket
            fork = forks.fork if forks is not None and forks.serves(env) else None
            started = start_local(task, argv, cwd=cwd, env=env, wait=START_WAIT, fork=fork)
            if started.holder is None and started.process is not None and seen is not None:
                seen.slow[waiting.label] = (started.process, process_start_time(started.pid))
    except Exception as exc:  # each start alone: one that cannot be made holds up no other
        with fleet.locked():
            fleet.release(task)
            _unclaim(fleet, waiting, ticket)
        _say(task, f"the queue could not start task {task.label}: {exc}")


def _executor_of(argv: list[str]) -> str:
    """The executor a start's command line names last (`--executor X`)."""
    at = len(argv) - 1 - argv[::-1].index("--executor") if "--executor" in argv else -1
    return argv[at + 1] if 0 <= at < len(argv) - 1 else "local"


def _unclaim(fleet: Fleet, waiting: Waiting, ticket: str | None) -> None:
    if ticket is not None:
        fleet.unclaim(waiting.project, waiting.task, ticket)


def _hand_to_cluster(
    task: TaskPaths, argv: list[str], cwd: Path, env: dict[str, str],
    made: Callable[[], None] = lambda: None,
) -> None:  # fmt: skip
    """Start a task whose loop runs on the Ray cluster: its command line hands it to Ray (where
    it may wait in the cluster's own queue) and exits; what it says goes to supervisor.log.
    `made` runs once its process is made."""
    from runagent.errors import error_for_exit
    from runagent.executors.local import START_WAIT
    from runagent.store import runfolder

    runfolder.make_task_folder(task)
    log = runfolder.supervisor_log_path(task)
    with open(log, "ab", opener=runfolder.private) as out:
        proc = subprocess.Popen(
            python("-m", "runagent", *argv), cwd=cwd, env=env,
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
        )  # fmt: skip
    made()
    try:
        code = proc.wait(timeout=START_WAIT + HAND_OVER_WAIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    if code != 0:
        tail = runfolder.tail(log, 600).strip().splitlines()
        why = tail[-1].removeprefix("run-agent: ") if tail else f"exit code {code}"
        raise error_for_exit(code, why)


HAND_OVER_WAIT = 120.0  # seconds a hand-over to the cluster may take beyond a local start


def main(args: list[str]) -> int:
    detach = args[:1] == ["--detach"]
    rest = args[1:] if detach else args
    if len(rest) != 1:
        print("usage: python -m runagent.executors.keeper [--detach] ROOT", file=sys.stderr)
        return 2
    if detach and os.fork() > 0:
        return 0  # the parent exits at once: nothing is left for its starter to reap
    return keep(Path(rest[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
