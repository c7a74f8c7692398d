"""What a loop tells its watchers: an Event as each step happens, and the LoopResult at its end."""

from __future__ import annotations

import enum
from pathlib import Path

from runagent.record import record
from runagent.store.runinfo import RunInfo


class EventKind(enum.StrEnum):
    """The steps of a loop a watcher hears of."""

    RUN_STARTED = "run_started"
    TICK = "tick"  # the run goes on (every tick, about a second): for a live status line
    CHECKING = "checking"  # a run said it was done: the task's check judges it (loop/check.py)
    RUN_ENDED = "run_ended"
    WAITING = "waiting"  # before the next attempt: a backoff, or a rate limit waited out
    MARKED_LOST = "marked_lost"  # a run of an earlier, dead supervisor was written down as lost
    DONE_ARCHIVED = "done_archived"  # a DONE left by an earlier loop was moved out of the way
    BRANCH_KEPT = "branch_kept"  # a worktree's branch could not be brought back after a run
    LOOP_ENDED = "loop_ended"


class Outcome(enum.StrEnum):
    """How a whole loop ended; the command line maps it to its exit code."""

    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    STOPPED = "stopped"
    MISSING_DEPENDENCY = "missing_dependency"
    STUCK = "stuck"  # attempts in a row without progress (loop/stuck.py)
    BUDGET = "budget"  # a budget was crossed, or none is left (loop/budget.py)


@record
class Event:
    """What a loop tells its listeners (the console, the notifiers): a run started or ended, a
    restart waits, the loop ended, with what it knows of it."""

    kind: EventKind
    run: RunInfo | None = None
    run_folder: Path | None = None
    elapsed: float = 0.0
    delay: float = 0.0
    message: str = ""
    outcome: Outcome | None = None  # LOOP_ENDED only


@record
class LoopResult:
    """How a loop ended, in a word and a sentence, and the runs it made."""

    outcome: Outcome
    message: str
    runs: tuple[RunInfo, ...] = ()
