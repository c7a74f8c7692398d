"""Completion rules: the verdict on exit 0, whether a task is done, and what the agent is told."""

from __future__ import annotations

from pathlib import Path

import pytest

from runagent.config.settings import Until
from runagent.errors import UsageError
from runagent.issues.repository import Checkout
from runagent.loop import completion
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import Reason, RunInfo, RunStatus
from tests.gitrepo import commit, git, make_repo


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


@pytest.mark.parametrize("until", [Until.EXIT, Until.DONE_FILE])
def test_file_rules_tell_the_agent_to_write_done(until: Until) -> None:
    assert completion.rule(until).instruction.startswith(
        "When the whole task is done, write a file named DONE in the task folder. "
    )


MARKER = "cocode ready for check"


def ready_rule(repo: Path, base: str | None = None) -> completion.CompletionRule:
    """The ready-marker rule for a loop starting now in `repo` (or from `base`)."""
    checkout = Checkout.at(repo, base) if base else None
    return completion.rule(Until.READY_MARKER).for_loop(repo, {}, checkout)


@pytest.mark.parametrize(
    "messages",
    [
        ("cocode ready for check",),  # the subject
        ("Fix issue", "cocode ready for check"),  # the body
        ("feat: add feature - cocode ready for check",),  # with other text
    ],
)
def test_ready_marker_in_a_commit_since_the_base_completes(
    task: TaskPaths, tmp_path: Path, messages: tuple[str, ...]
) -> None:
    repo = make_repo(tmp_path / "repo")
    rule = ready_rule(repo)
    assert not rule.is_done(task, run(RunStatus.COMPLETED))  # no commit yet: not complete
    assert rule.exit_zero(task).reason is Reason.NO_READY_MARKER
    commit(repo, "progress")
    sha = commit(repo, *messages)
    commit(repo, "a later commit without it")  # not only the last commit is read
    verdict = rule.exit_zero(task)
    assert (verdict.status, verdict.reason) == (RunStatus.COMPLETED, Reason.READY_MARKER)
    assert sha[:12] in verdict.message
    assert rule.is_done(task, run(RunStatus.FAILED))  # however the run ended
    assert rule.environment() == {"COCODE_READY_MARKER": MARKER}
    assert MARKER in rule.instruction


def test_ready_marker_only_in_a_file_does_not_count(task: TaskPaths, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    rule = ready_rule(repo)
    commit(repo, "Update README", name="README.md", text=f"{MARKER}\n")
    commit(repo, "Add comment", name="file.js", text=f"// {MARKER}\n")
    verdict = rule.exit_zero(task)
    assert (verdict.status, verdict.reason) == (RunStatus.FAILED, Reason.NO_READY_MARKER)
    assert verdict.message.startswith("exited 0 without a commit since ")
    assert verdict.message.endswith(f"carrying the ready marker {MARKER!r}")
    assert not rule.is_done(task, run(RunStatus.COMPLETED))


def test_ready_marker_before_the_base_or_on_a_reused_tip_does_not_count(
    task: TaskPaths, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    commit(repo, f"old work\n\n{MARKER}")  # a reused branch whose tip already carries it
    rule = ready_rule(repo)
    assert not rule.is_done(task, run(RunStatus.COMPLETED))
    commit(repo, "new work, not finished")
    assert rule.exit_zero(task).reason is Reason.NO_READY_MARKER


def test_ready_marker_on_another_branch_does_not_count(task: TaskPaths, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    rule = ready_rule(repo)
    git(repo, "switch", "-q", "-c", "elsewhere")
    commit(repo, MARKER)
    git(repo, "switch", "-q", "main")
    commit(repo, "work on the loop's branch")
    assert not rule.is_done(task, run(RunStatus.COMPLETED))


def test_ready_marker_base_given_by_the_loop_counts_commits_after_it(
    task: TaskPaths, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    base = git(repo, "rev-parse", "HEAD")
    commit(repo, f"done in an earlier attempt\n\n{MARKER}")
    assert ready_rule(repo, base).is_done(task, run(RunStatus.FAILED))


def test_ready_marker_takes_the_marker_from_the_environment(
    task: TaskPaths, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "repo")
    rule = completion.rule(Until.READY_MARKER).for_loop(
        repo, {"COCODE_READY_MARKER": "ship it"}, None
    )
    commit(repo, MARKER)
    assert not rule.is_done(task, run(RunStatus.COMPLETED))
    commit(repo, "ship it")
    assert rule.is_done(task, run(RunStatus.COMPLETED))
    assert rule.environment() == {"COCODE_READY_MARKER": "ship it"}


def test_ready_marker_outside_a_repository_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is not in a git repository"):
        completion.rule(Until.READY_MARKER).for_loop(tmp_path, {}, None)
