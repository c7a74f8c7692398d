"""A person steers a task: `resume --message` hands the next attempt their words (a stopped
task's resume starts with them; a running task's next attempt gets them), `--now` ends the
running attempt for them without counting a failure, and every message is kept in the task
folder. Real loops of the fake agent, detached as a person starts them."""

from __future__ import annotations

import json

import anyio
import httpx
import yaml

from runagent import listing
from runagent.errors import ExitCode
from runagent.store import steering, tokens
from runagent.store.runinfo import Reason, RunInfo, RunStatus
from tests.conftest import Workspace, serving, wait_for
from tests.loop.sandboxing import needs_bwrap, probes, sandboxed
from tests.server.test_mcp import call, stdio


def status(ws: Workspace, task: str = "t") -> str | None:
    found = ws.cli("status", "-p", "p", "-t", task, "--json")
    return yaml.safe_load(found.stdout).get("status") if found.returncode == 0 else None


def prompt_of(ws: Workspace, run: RunInfo) -> str:
    return ws.task().run(run.run_id).prompt.read_text()


def blocking_first(ws: Workspace, **defaults: object) -> None:
    """An agent whose first attempt waits (until `release` in the workspace, or its end), then
    fails; every later attempt exits 0."""
    counter = '"$TASK_FOLDER/fake-attempts"'  # each task's own
    shell = f'[ "$(cat {counter})" -gt 1 ] || while [ ! -e {ws.path}/release ]; do sleep 0.05; done'
    ws.write_config(["--fail-first", "1", "--lines", "1", "--shell", shell], **defaults)


def running(ws: Workspace) -> bool:
    runs = ws.runs()
    return bool(runs) and runs[-1].status is RunStatus.RUNNING and runs[-1].pid is not None


def test_a_message_resumes_a_failed_task_with_the_persons_words(ws: Workspace) -> None:
    ws.write_config(["--counter", str(ws.path / "n"), "--fail-first", "1"], max_restarts=0)
    assert ws.cli("run", "-p", "p", "-t", "t", "do it").returncode == ExitCode.FAILED
    words = "Use the blue button, not the red one."
    resumed = ws.cli("resume", "-p", "p", "-t", "t", "--message", words)
    assert resumed.returncode == 0, resumed.stderr
    first, second = ws.runs()
    assert words not in prompt_of(ws, first)
    prompt = prompt_of(ws, second)
    assert "## From a person" in prompt and words in prompt
    assert prompt.index("## Previous run of this task") < prompt.index(words)
    assert prompt.index(words) < prompt.index("## Task")
    kept = steering.messages(ws.task())
    assert [(m.number, m.text, m.run_id) for m in kept] == [(1, words, second.run_id)]
    again = ws.cli("resume", "-p", "p", "-t", "t", "--again")
    assert again.returncode == 0, again.stderr
    assert words not in prompt_of(ws, ws.runs()[-1])  # handed once, to one attempt


def test_a_message_to_a_running_task_waits_for_its_next_attempt(ws: Workspace) -> None:
    blocking_first(ws)
    started = ws.cli("run", "-p", "p", "-t", "t", "go", "--detach")
    assert started.returncode == 0, started.stderr
    wait_for(lambda: running(ws), 30, "the first attempt to run")
    sent = ws.cli("resume", "-p", "p", "-t", "t", "--message", "mind the tests")
    assert sent.returncode == 0, sent.stderr
    assert "kept for task p/t: its next attempt starts with it" in sent.stderr
    assert [m.run_id for m in steering.messages(ws.task())] == [None]
    (ws.path / "release").touch()
    wait_for(lambda: status(ws) == "completed", 60, "the loop to complete")
    first, second = ws.runs()
    assert first.status is RunStatus.FAILED and first.reason is Reason.EXIT_CODE
    assert "mind the tests" not in prompt_of(ws, first)
    assert "mind the tests" in prompt_of(ws, second)
    assert [m.run_id for m in steering.messages(ws.task())] == [second.run_id]


def test_now_ends_the_running_attempt_and_the_next_starts_with_it_not_as_a_failure(
    ws: Workspace,
) -> None:
    blocking_first(ws, max_restarts=0)  # a failure counted would end the loop
    assert ws.cli("run", "-p", "p", "-t", "t", "go", "--detach").returncode == 0
    wait_for(lambda: running(ws), 30, "the first attempt to run")
    sent = ws.cli("resume", "-p", "p", "-t", "t", "--message", "stop that; do X", "--now")
    assert sent.returncode == 0, sent.stderr
    assert "its current attempt ends and the next starts with it" in sent.stderr
    wait_for(lambda: status(ws) == "completed", 60, "the loop to complete")
    first, second = ws.runs()
    assert (first.status, first.reason) == (RunStatus.STOPPED, Reason.STEERED)
    assert "person's message" in (first.message or "")
    assert "stop that; do X" in prompt_of(ws, second)
    assert second.status is RunStatus.COMPLETED
    assert (first.last_attempt, second.last_attempt) == (1, 2)  # the steered one spent none
    assert "attempt 2 of at most 2." in prompt_of(ws, second)
    log = json.loads(ws.task().messages_read.read_text())
    assert log == {"1": second.run_id}
    assert not (ws.path / "release").exists()  # nothing but the message ended the first


def test_bad_messages_are_refused_in_one_line(ws: Workspace) -> None:
    ws.write_config(["--lines", "1"])
    assert ws.cli("run", "-p", "p", "-t", "t", "go").returncode == 0
    for args, said in (
        (["--message", "  "], "the message is empty"),
        (["--now"], "--now ends the running attempt for a message: give --message"),
        (["--message", "x" * (steering.MAX_MESSAGE_CHARS + 1)], "over 65536"),
    ):
        refused = ws.cli("resume", "-p", "p", "-t", "t", "--again", *args)
        assert refused.returncode == ExitCode.USAGE, refused.stderr
        assert said in refused.stderr and "Traceback" not in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    assert not ws.task().messages.exists()
    assert len(ws.runs()) == 1


def test_messages_read_from_stdin(ws: Workspace) -> None:
    ws.write_config(["--lines", "1"])
    assert ws.cli("run", "-p", "p", "-t", "t", "go").returncode == 0
    resumed = ws.cli("resume", "-p", "p", "-t", "t", "--again", "--message", "-",
                     input="from a pipe\n")  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert "from a pipe" in prompt_of(ws, ws.runs()[-1])


@needs_bwrap
def test_a_sandboxed_agent_can_neither_forge_a_message_nor_mark_one_handed(ws: Workspace) -> None:
    """The task view shows the task folder's files read-only, and what the agent makes there
    lands in its own folder, never read back: its messages are a person's alone."""
    task = ws.task()
    forged = [task.messages, task.messages_read]
    sandboxed(ws, [arg for path in forged for arg in ("--probe-write", str(path))])
    assert ws.cli("run", "-p", "p", "-t", "t", "go").returncode == ExitCode.COMPLETED
    assert not task.messages.exists() and not task.messages_read.exists()
    assert steering.pending(task) == []
    resumed = ws.cli("resume", "-p", "p", "-t", "t", "--again", "--message", "the real one")
    assert resumed.returncode == ExitCode.COMPLETED, resumed.stderr
    seen = probes(ws)
    assert seen[f"write {task.messages}"] == "OSError"  # read-only once it is there
    last = ws.runs()[-1]
    assert [(m.text, m.run_id) for m in steering.messages(task)] == [("the real one", last.run_id)]
    assert json.loads(task.messages_read.read_text()) == {"1": last.run_id}


def test_the_api_steers_a_running_task_and_a_token_only_its_own_projects(ws: Workspace) -> None:
    blocking_first(ws, max_restarts=0)
    assert ws.cli("run", "-p", "mine", "-t", "t", "go", "--detach").returncode == 0
    assert ws.cli("run", "-p", "theirs", "-t", "t", "go", "--detach").returncode == 0
    mine, theirs = ws.task("mine", "t"), ws.task("theirs", "t")
    operate, _ = tokens.create(ws.root, tokens.Scope.OPERATE, ["mine"])
    read, _ = tokens.create(ws.root, tokens.Scope.READ)
    try:
        wait_for(lambda: all(running_task(ws, t) for t in ("mine", "theirs")), 30, "both")
        with serving(ws) as url, httpx.Client(base_url=url, timeout=30) as client:

            def steer(project: str, secret: str, **body: object) -> httpx.Response:
                return client.post(f"/api/projects/{project}/tasks/t/resume", json=body,
                                   headers={"Authorization": f"Bearer {secret}"})  # fmt: skip

            for project, secret in (("theirs", operate), ("mine", read)):
                refused = steer(project, secret, message="sneak", now=True)
                assert refused.status_code == 403, refused.text
            for body, said in (({"message": 3}, "message 3 is not text"),
                               ({"message": "x", "now": "yes"}, "now 'yes' is not true or false"),
                               ({"now": True}, "give --message")):  # fmt: skip
                bad = steer("mine", operate, **body)
                assert bad.status_code == 400 and said in bad.json()["error"], bad.text
            assert not mine.messages.exists() and not theirs.messages.exists()
            kept = steer("mine", operate, message="over the API", now=True)
            assert kept.status_code == 202, kept.text
            assert kept.json()["steered"] is True and kept.json()["message"]["by"] == "API"
            wait_for(lambda: listing.view(mine).status.value == "completed", 60, "mine")
            detail = client.get("/api/projects/mine/tasks/t",
                                headers={"Authorization": f"Bearer {read}"}).json()  # fmt: skip
            (shown,) = detail["messages"]
            assert shown["text"] == "over the API" and shown["run_id"] == ws.runs("mine")[-1].run_id
        assert "over the API" in mine.run(ws.runs("mine")[-1].run_id).prompt.read_text()
        assert listing.view(theirs).status.value == "running"  # never reached
    finally:
        ws.cli("stop", "-p", "theirs", "-t", "t")


def test_mcp_resume_task_takes_a_message(ws: Workspace) -> None:
    ws.write_config(["--counter", str(ws.path / "n"), "--fail-first", "1"], max_restarts=0)
    assert ws.cli("run", "-p", "p", "-t", "t", "go").returncode == ExitCode.FAILED

    async def main() -> None:
        async with stdio(ws) as client:
            resumed = await call(client, "resume_task", project="p", task="t",
                                 message="through MCP")  # fmt: skip
            assert resumed["supervisor_pid"]

    anyio.run(main)
    wait_for(lambda: listing.view(ws.task()).status.value == "completed", 60, "the resume")
    assert "through MCP" in prompt_of(ws, ws.runs()[-1])
    assert [m.by for m in steering.messages(ws.task())] == ["MCP"]


def running_task(ws: Workspace, project: str) -> bool:
    runs = ws.runs(project)
    return bool(runs) and runs[-1].status is RunStatus.RUNNING and runs[-1].pid is not None


def test_loop_options_with_a_message_to_a_running_task_are_refused(ws: Workspace) -> None:
    """Its loop runs with its own options: a message with others would drop them unsaid."""
    blocking_first(ws, max_restarts=0)
    assert ws.cli("run", "-p", "p", "-t", "t", "go", "--detach").returncode == 0
    try:
        wait_for(lambda: running(ws), 30, "the first attempt to run")
        refused = ws.cli("resume", "-p", "p", "-t", "t", "--message", "x", "--timeout", "5m")
        assert refused.returncode == ExitCode.USAGE, refused.stderr
        assert "is running: its loop goes on with its own options" in refused.stderr
        assert not ws.task().messages.exists()
    finally:
        ws.cli("stop", "-p", "p", "-t", "t")
