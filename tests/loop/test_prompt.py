"""The prompt an agent is given: preamble, completion rule, the previous run's tail, the task."""

from __future__ import annotations

from pathlib import Path

from runagent.config.settings import LoopSettings, Until
from runagent.loop import completion, prompt
from runagent.loop.context import LoopRequest
from runagent.loop.redaction import Redactor
from runagent.store.runfolder import TaskPaths, create_run_folder
from runagent.store.runinfo import RunInfo, RunStatus


def request(tmp_path: Path, until: Until = Until.EXIT) -> LoopRequest:
    return LoopRequest(
        task=TaskPaths(tmp_path / "runs", "p", "t"),
        prompt="fix the build",
        agent_name="fake",
        working_dir=tmp_path / "work",
        settings=LoopSettings(max_restarts=2, until=until),
    )


def test_a_first_run_is_told_where_it_is_how_to_finish_and_the_task(tmp_path: Path) -> None:
    req = request(tmp_path, Until.DONE_FILE)
    rule = completion.rule(Until.DONE_FILE)
    text = prompt.compose(req, rule, Redactor(), run_id="r1", attempt=1, previous=None)
    assert text.startswith("# run-agent\n\nYou are running under run-agent: project `p`, task `t`, "
                           "run `r1`, attempt 1 of at most 3.\n")  # fmt: skip
    assert f"- Run folder: {req.task.run_folder('r1')}\n" in text
    assert f"- Working folder: {tmp_path / 'work'}\n" in text
    assert f"\n{rule.instruction}\n" in text
    assert "Previous" not in text
    assert text.endswith("\n## Task\n\nfix the build\n")


def test_the_previous_run_is_shown_fenced_and_without_secrets(tmp_path: Path) -> None:
    req = request(tmp_path)
    create_run_folder(req.task, "r0")
    paths = req.task.run("r0")
    paths.output.write_text("some ```code``` using sk-secret\n")
    paths.stderr.write_text("")  # nothing to show: no stderr section
    before = RunInfo("r0", "p", "t", 4, "fake", "command", "now", "/w", status=RunStatus.FAILED,
                     exit_code=1)  # fmt: skip
    text = prompt.compose(
        req, completion.rule(Until.EXIT), Redactor.of(["sk-secret"]), run_id="r1", attempt=1,
        previous=before,
    )  # fmt: skip
    assert "## Previous run of this task\n" in text  # attempt 1: a run of an earlier loop
    assert "Run `r0` (attempt 4) ended failed: ended failed with exit code 1." in text
    assert "The end of its output:\n\n````\nsome ```code``` using [REDACTED]\n````" in text
    assert "sk-secret" not in text and "The end of its stderr" not in text
    again = prompt.compose(
        req, completion.rule(Until.EXIT), Redactor(), run_id="r1", attempt=2, previous=before
    )
    assert "## Previous attempt\n" in again
