"""When a task is done: one rule per `until` value, each judging runs and wording itself.

A rule answers two questions. What a run that exited 0 amounts to (completed, or failed because
it did not do what completes the task), and whether the task is done after a run, whatever its
exit. It also supplies the sentence the agent's prompt gives as the completion rule, and the
variables the agent needs to follow it. `Until`, in config/settings.py, stays the setting that
selects a rule; `for_loop` gives the rule what it reads for one loop (the ready marker: the
checkout).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from runagent.config.settings import Until
from runagent.record import record
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import Reason, RunInfo, RunStatus

if TYPE_CHECKING:  # the ready marker's rule reads git; only that rule imports what reads it
    from runagent.issues.repository import Checkout

# Every rule asks for DONE in the task folder: it is how an agent says "finished" in any mode.
_WRITE_DONE = "When the whole task is done, write a file named DONE in the task folder."


@record
class Verdict:
    """How a run ended, as its run-info.yaml says it: status, reason and a message."""

    status: RunStatus
    reason: Reason
    message: str


class CompletionRule(abc.ABC):
    """One way a task completes."""

    until: ClassVar[Until]
    checkout: Checkout | None = None  # the repository whose commits the rule reads, if any

    @property
    @abc.abstractmethod
    def instruction(self) -> str:
        """What the agent is told about finishing, in its prompt."""

    def for_loop(
        self, working_dir: Path, env: Mapping[str, str], checkout: Checkout | None
    ) -> CompletionRule:
        """The rule as one loop applies it, in `working_dir`, with the caller's `env`, and the
        loop's `checkout` if it has one. A rule that needs what is not there says so
        (a UsageError) before anything starts."""
        return self

    def environment(self) -> Mapping[str, str]:
        """Variables the agent is given to follow the rule."""
        return {}

    @abc.abstractmethod
    def exit_zero(self, task: TaskPaths) -> Verdict:
        """The verdict on a run that exited 0."""

    @abc.abstractmethod
    def is_done(self, task: TaskPaths, run: RunInfo) -> bool:
        """Whether the task is done after `run` (which was not stopped)."""


class ExitRule(CompletionRule):
    """`until: exit`: exit 0 completes the task, and so does a DONE the agent wrote."""

    until = Until.EXIT

    @property
    def instruction(self) -> str:
        return f"{_WRITE_DONE} Exiting with code 0 also marks the task complete."

    def exit_zero(self, task: TaskPaths) -> Verdict:
        if task.done.exists():
            return Verdict(RunStatus.COMPLETED, Reason.DONE_FILE, "exited 0 and wrote DONE")
        return Verdict(RunStatus.COMPLETED, Reason.EXITED, "exited 0")

    def is_done(self, task: TaskPaths, run: RunInfo) -> bool:
        # A run that failed or timed out after writing DONE still finished the task.
        return task.done.exists() or run.status is RunStatus.COMPLETED


class DoneFileRule(CompletionRule):
    """`until: done-file`: only a DONE the agent wrote completes the task; exit 0 without it is a
    failure, so the run is retried."""

    until = Until.DONE_FILE

    @property
    def instruction(self) -> str:
        return f"{_WRITE_DONE} The task is complete only when you write that file."

    def exit_zero(self, task: TaskPaths) -> Verdict:
        if task.done.exists():
            return Verdict(RunStatus.COMPLETED, Reason.DONE_FILE, "exited 0 and wrote DONE")
        return Verdict(RunStatus.FAILED, Reason.NO_DONE_FILE, "exited 0 without writing DONE")

    def is_done(self, task: TaskPaths, run: RunInfo) -> bool:
        return task.done.exists()


class ReadyMarkerRule(CompletionRule):
    """`until: ready-marker`: a commit made since the loop's base (`base..HEAD` of the working
    folder) whose message, subject or body, carries the marker completes the task. The marker
    in a file, in a commit older than the base or on another branch does not count; exit 0
    without such a commit is a failure, so the run is retried."""

    until = Until.READY_MARKER

    def __init__(self, marker: str | None = None, checkout: Checkout | None = None):
        self._marker = marker  # None: the protocol's default
        self.checkout = checkout

    @property
    def marker(self) -> str:
        from runagent.issues.repository import DEFAULT_READY_MARKER

        return self._marker or DEFAULT_READY_MARKER

    @property
    def instruction(self) -> str:
        return (
            "When the whole task is done, commit your work with a commit message that contains "
            f"`{self.marker}` (in its subject or body). Only such a commit on this branch "
            "completes the task; commit progress as you go."
        )

    def for_loop(
        self, working_dir: Path, env: Mapping[str, str], checkout: Checkout | None
    ) -> CompletionRule:
        from runagent.issues.repository import READY_MARKER_VARIABLE, Checkout

        return ReadyMarkerRule(env.get(READY_MARKER_VARIABLE), checkout or Checkout.at(working_dir))

    def environment(self) -> Mapping[str, str]:
        from runagent.issues.repository import READY_MARKER_VARIABLE

        return {READY_MARKER_VARIABLE: self.marker}

    def exit_zero(self, task: TaskPaths) -> Verdict:
        from runagent.issues.repository import short

        found = self.checkout.find(self.marker) if self.checkout else None
        if found is not None:
            return Verdict(
                RunStatus.COMPLETED,
                Reason.READY_MARKER,
                f"exited 0; commit {short(found.sha)} carries the ready marker",
            )
        base = f" since {short(self.checkout.base)}" if self.checkout else ""
        return Verdict(
            RunStatus.FAILED,
            Reason.NO_READY_MARKER,
            f"exited 0 without a commit{base} carrying the ready marker {self.marker!r}",
        )

    def is_done(self, task: TaskPaths, run: RunInfo) -> bool:
        # A run that failed or timed out after its marker commit still finished the task.
        return self.checkout is not None and self.checkout.find(self.marker) is not None


RULES: Mapping[Until, CompletionRule] = {
    r.until: r for r in (ExitRule(), DoneFileRule(), ReadyMarkerRule())
}


def rule(until: Until) -> CompletionRule:
    """The rule `until` selects."""
    return RULES[until]
