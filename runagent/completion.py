"""When a task is done: one rule per `until` value, each judging runs and wording itself.

A rule answers two questions. What a run that exited 0 amounts to (completed, or failed because
it did not do what completes the task), and whether the task is done after a run, whatever its
exit. It also supplies the sentence the agent's prompt gives as the completion rule. `Until`, in
config.py, stays the setting that selects a rule.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from runagent.config import Until
from runagent.runfolder import TaskPaths
from runagent.runinfo import Reason, RunInfo, RunStatus

# Every rule asks for DONE in the task folder: it is how an agent says "finished" in any mode.
_WRITE_DONE = "When the whole task is done, write a file named DONE in the task folder."


@dataclass(frozen=True)
class Verdict:
    """How a run ended, as its run-info.yaml says it: status, reason and a message."""

    status: RunStatus
    reason: Reason
    message: str


class CompletionRule(abc.ABC):
    """One way a task completes."""

    until: ClassVar[Until]
    instruction: ClassVar[str]  # what the agent is told about finishing, in its prompt

    @abc.abstractmethod
    def exit_zero(self, task: TaskPaths) -> Verdict:
        """The verdict on a run that exited 0."""

    @abc.abstractmethod
    def is_done(self, task: TaskPaths, run: RunInfo) -> bool:
        """Whether the task is done after `run` (which was not stopped)."""


class ExitRule(CompletionRule):
    """`until: exit`: exit 0 completes the task, and so does a DONE the agent wrote."""

    until = Until.EXIT
    instruction = f"{_WRITE_DONE} Exiting with code 0 also marks the task complete."

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
    instruction = f"{_WRITE_DONE} The task is complete only when you write that file."

    def exit_zero(self, task: TaskPaths) -> Verdict:
        if task.done.exists():
            return Verdict(RunStatus.COMPLETED, Reason.DONE_FILE, "exited 0 and wrote DONE")
        return Verdict(RunStatus.FAILED, Reason.NO_DONE_FILE, "exited 0 without writing DONE")

    def is_done(self, task: TaskPaths, run: RunInfo) -> bool:
        return task.done.exists()


RULES: Mapping[Until, CompletionRule] = {r.until: r for r in (ExitRule(), DoneFileRule())}


def rule(until: Until) -> CompletionRule:
    """The rule `until` selects."""
    return RULES[until]
