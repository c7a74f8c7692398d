"""`run-agent cocode`: run-agent as the agent a cocode host starts, tested with the protocol's
"Testing Your Agent" recipe against a real repository and the fake agent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Workspace
from tests.gitrepo import GIT_ENV, git, make_repo

MARKER = "cocode ready for check"


@pytest.fixture
def recipe(ws: Workspace) -> dict[str, str]:
    """The recipe's environment: a test repository and an issue file."""
    repo = make_repo(ws.path / "test-repo")
    (repo / "main.py").write_text("print('bug')\n")
    git(repo, "add", "main.py")
    git(repo, "commit", "-q", "-m", "add main.py")
    issue = ws.path / "issue.txt"
    issue.write_text("Fix the bug in main.py\n")
    return {
        "COCODE_REPO_PATH": str(repo),
        "COCODE_ISSUE_NUMBER": "1",
        "COCODE_ISSUE_URL": "https://github.com/test/repo/issues/1",
        "COCODE_ISSUE_BODY_FILE": str(issue),
        "COCODE_READY_MARKER": MARKER,
    }


def cocode(
    ws: Workspace, env: dict[str, str], *args: str, unset: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """`cd $COCODE_REPO_PATH && run-agent cocode ARGS`, as the recipe runs its agent."""
    full = {**os.environ, **GIT_ENV, **env}
    for name in unset:
        full.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "runagent", "cocode", "--config", str(ws.config), *args],
        cwd=env.get("COCODE_REPO_PATH", ws.path), env=full, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


def log(proc: subprocess.CompletedProcess[str]) -> list[dict[str, str]]:
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert lines and all(set(line) == {"timestamp", "level", "message"} for line in lines)
    assert all(line["timestamp"].endswith("Z") for line in lines)
    return lines


def last_message(repo: str) -> str:
    return git(Path(repo), "log", "-1", "--format=%B")


def test_the_recipe_the_last_commit_carries_the_marker(
    ws: Workspace, recipe: dict[str, str]
) -> None:
    # The agent edits main.py on its second attempt and never commits: run-agent does.
    ws.write_config(
        ["--fail-first", "1", "--edit", "main.py", "--echo-env", "COCODE_READY_MARKER"],
        env=GIT_ENV,
    )
    proc = cocode(ws, recipe)
    assert proc.returncode == 0, proc.stderr
    assert MARKER in last_message(recipe["COCODE_REPO_PATH"])  # "Ready!"
    repo = Path(recipe["COCODE_REPO_PATH"])
    assert git(repo, "status", "--porcelain") == ""
    subjects = git(repo, "log", "--format=%s").splitlines()
    assert subjects[0] == "Resolve issue #1"
    assert subjects[1].startswith("Work on issue #1 (run-agent run ")  # attempt 1's edit
    assert subjects[2].startswith("Work on issue #1 (run-agent run ")  # attempt 2's edit
    messages = [line["message"] for line in log(proc)]
    assert any("carries the ready marker" in m for m in messages)
    assert [line["level"] for line in log(proc)].count("error") == 1  # attempt 1's failure
    # The usual run folder, and the agent never saw the marker (it is run-agent's to commit).
    runs = ws.runs("cocode", "issue-1")
    assert [r.status.value for r in runs] == ["failed", "completed"]
    stdout = ws.task("cocode", "issue-1").run(runs[1].run_id).stdout.read_text()
    assert "COCODE_READY_MARKER=\n" in stdout
    prompt = ws.task("cocode", "issue-1").task_md.read_text()
    assert "Fix the bug in main.py" in prompt and "issues/1" in prompt


def test_a_failing_agent_leaves_no_marker_and_its_exit_code_says_why(
    ws: Workspace, recipe: dict[str, str]
) -> None:
    ws.write_config(["--edit", "main.py", "--exit", "1"], env=GIT_ENV)
    proc = cocode(ws, recipe, "--max-restarts", "0")
    assert proc.returncode == 1, proc.stderr
    message = last_message(recipe["COCODE_REPO_PATH"])
    assert MARKER not in message
    assert message.startswith("Work on issue #1")  # partial work is kept, committed
    assert log(proc)[-1]["level"] == "error"
    assert "no ready marker committed" in log(proc)[-1]["message"]


def test_a_timeout_exits_124(ws: Workspace, recipe: dict[str, str]) -> None:
    ws.write_config(["--sleep", "30"], env=GIT_ENV)
    proc = cocode(ws, recipe, "--timeout", "1s", "--max-restarts", "0")
    assert proc.returncode == 124, proc.stderr
    assert MARKER not in last_message(recipe["COCODE_REPO_PATH"])


@pytest.mark.parametrize(
    "name", ["COCODE_REPO_PATH", "COCODE_ISSUE_NUMBER", "COCODE_ISSUE_BODY_FILE"]
)
def test_a_missing_variable_exits_2_naming_it(
    ws: Workspace, recipe: dict[str, str], name: str
) -> None:
    proc = cocode(ws, {k: v for k, v in recipe.items() if k != name}, unset=(name,))
    assert proc.returncode == 2
    assert name in proc.stderr and name in log(proc)[-1]["message"]


@pytest.mark.parametrize(
    "name, value", [("COCODE_ISSUE_NUMBER", "one"), ("COCODE_REPO_PATH", "{not_a_repo}"),
                    ("COCODE_ISSUE_BODY_FILE", "{missing}")],
)  # fmt: skip
def test_a_wrong_variable_exits_2_naming_it(
    ws: Workspace, recipe: dict[str, str], name: str, value: str
) -> None:
    value = value.format(not_a_repo=ws.root.parent, missing=ws.path / "no-such-issue.txt")
    proc = cocode(ws, {**recipe, name: value})
    assert proc.returncode == 2 and name in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "body, fragment",
    [("/dev/zero", "is a device"), ("{fifo}", "is a FIFO"), ("{folder}", "is a folder")],
)
def test_an_issue_body_that_is_no_regular_file_exits_2_at_once(
    ws: Workspace, recipe: dict[str, str], body: str, fragment: str
) -> None:
    os.mkfifo(ws.path / "fifo")  # nobody writes to it: reading it would wait forever
    value = body.format(fifo=ws.path / "fifo", folder=ws.path)
    proc = cocode(ws, {**recipe, "COCODE_ISSUE_BODY_FILE": value})
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    assert f"COCODE_ISSUE_BODY_FILE {value!r} {fragment}, not a regular file" in line


def test_a_missing_agent_binary_exits_3(ws: Workspace, recipe: dict[str, str]) -> None:
    ws.config.write_text(
        "agents:\n  gone: {type: command, command: [no-such-agent-binary-here]}\n"
        f"defaults: {{agent: gone}}\nstorage: {{runs_dir: {ws.root}}}\n"
    )
    proc = cocode(ws, recipe)
    assert proc.returncode == 3, proc.stderr
    assert "no-such-agent-binary-here" in log(proc)[-1]["message"]


def test_cocode_runs_a_resolved_issue_again_and_a_changed_one_as_a_new_task(
    ws: Workspace, recipe: dict[str, str]
) -> None:
    """The host may run its agent again on a resolved issue (the door lets it, as asked); an
    issue whose text changed since its task began gets a task of its own, so TASK.md stays the
    prompt its runs were given."""
    ws.write_config(["--edit", "main.py"], env=GIT_ENV)
    assert cocode(ws, recipe).returncode == 0
    again = cocode(ws, recipe)
    assert again.returncode == 0, again.stderr
    assert [r.status.value for r in ws.runs("cocode", "issue-1")] == ["completed", "completed"]
    Path(recipe["COCODE_ISSUE_BODY_FILE"]).write_text("Fix another bug\n")
    changed = cocode(ws, recipe)
    assert changed.returncode == 0, changed.stderr
    assert len(ws.runs("cocode", "issue-1")) == 2
    (other,) = [t for t in (ws.root / "cocode").iterdir() if t.name.startswith("issue-1-")]
    assert "Fix another bug" in (other / "TASK.md").read_text()


def test_every_way_a_loop_ends_has_a_cocode_exit_code() -> None:
    # A loop stopped as stuck or at its budget ended the command with a KeyError's traceback.
    from runagent.cli.foreground import OUTCOME_EXIT
    from runagent.cli.issues import COCODE_EXIT
    from runagent.loop.events import Outcome

    assert set(COCODE_EXIT) == set(OUTCOME_EXIT) == set(Outcome)
    assert COCODE_EXIT[Outcome.STUCK] == COCODE_EXIT[Outcome.BUDGET] == COCODE_EXIT[Outcome.FAILED]
