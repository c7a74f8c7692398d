"""Completion rules: the verdict on exit 0, whether a task is done, and what the agent is told."""

from __future__ import annotations

from pathlib import Path

import pytest

from runagent import completion
from runagent.config import Until
from runagent.runfolder import TaskPaths
from runagent.runinfo import Reason, RunInfo, RunStatus


def run(status: RunStatus) -> RunInfo:
    return RunInfo("r1", "p", "t", 1, "a", "command", "now", "/w", status=status)


@pytest.fixture
def task(tmp_path: Path) -> TaskPaths:
    paths = TaskPaths(tmp_path, "p", "t")
    paths.folder.mkdir(parents=True)
    return paths


def test_every_until_value_selects_a_rule_of_its_own() -> None:
    assert {u: completion.rule(u).until for u in Until} == {u: u for u in Until}


def test_until_exit_exit_zero_completes_and_so_does_done(task: TaskPaths) -> None:
    rule = completion.rule(Until.EXIT)
    verdict = rule.exit_zero(task)
    assert (verdict.status, verdict.reason, verdict.message) == (
        RunStatus.COMPLETED, Reason.EXITED, "exited 0",
    )  # fmt: skip
    assert rule.is_done(task, run(RunStatus.COMPLETED))
    assert not rule.is_done(task, run(RunStatus.FAILED))
    task.done.write_text("done\n")
    assert rule.exit_zero(task).reason is Reason.DONE_FILE
    assert rule.is_done(task, run(RunStatus.TIMED_OUT))  # DONE counts however the run ended
    assert rule.instruction.endswith("Exiting with code 0 also marks the task complete.")


def test_until_done_file_exit_zero_without_done_is_a_failure(task: TaskPaths) -> None:
    rule = completion.rule(Until.DONE_FILE)
    verdict = rule.exit_zero(task)
    assert (verdict.status, verdict.reason, verdict.message) == (
        RunStatus.FAILED, Reason.NO_DONE_FILE, "exited 0 without writing DONE",
    )  # fmt: skip
    assert not rule.is_done(task, run(RunStatus.COMPLETED))
    task.done.write_text("done\n")
    verdict = rule.exit_zero(task)
    assert (verdict.status, verdict.reason) == (RunStatus.COMPLETED, Reason.DONE_FILE)
    assert rule.is_done(task, run(RunStatus.FAILED))
    assert rule.instruction.endswith("The task is complete only when you write that file.")


@pytest.mark.parametrize("until", list(Until))
def test_every_rule_tells_the_agent_to_write_done(until: Until) -> None:
    assert completion.rule(until).instruction.startswith(
        "When the whole task is done, write a file named DONE in the task folder. "
    )
