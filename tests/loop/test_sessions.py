"""The loop continues the agent's session from attempt to attempt: the id the previous run's
agent gave, of the same agent in the same folder, under `session: continue`; a session the CLI
refused falls back to a fresh attempt, spending no restart. The agent is the fake agent behind a
backend that resumes sessions as the CLIs do (one id a session, kept when it is resumed); the
real CLIs are in tests/e2e/test_sessions.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

from backends.command import CommandBackend
from runagent.config.settings import AgentConfig, Session
from runagent.loop.context import RunContext
from runagent.loop.events import EventKind, Outcome
from runagent.process import LaunchSpec
from runagent.store import taskfolder
from tests.conftest import Workspace


class Sessions(CommandBackend):
    """A CLI with sessions: a new run starts one named after it, a resumed one keeps its id."""

    resumes_sessions = True
    gone: ClassVar[set[str]] = set()  # sessions it no longer has

    def launch(self, ctx: RunContext) -> LaunchSpec:
        spec = super().launch(ctx)
        resumed = (*spec.argv, "--resume")
        return spec if ctx.session is None else dataclasses.replace(spec, argv=resumed)

    def session_id(self, ctx: RunContext) -> str | None:
        if ctx.session in self.gone:
            return None
        return ctx.session or f"s-{ctx.run_id}"

    def session_refused(self, ctx: RunContext, exit_code: int) -> str | None:
        return "no such session" if ctx.session in self.gone else None


def backend(ws: Workspace, args: list[str]) -> Sessions:
    argv = ws.agent_argv(["--ignore-unknown", *args])
    return Sessions(AgentConfig(name="fake", type="command", command=tuple(argv)))


def test_each_attempt_continues_the_session_of_the_one_before(ws: Workspace) -> None:
    args = ["--fail-first", "2"]
    assert ws.supervisor(backend=backend(ws, args)).run().outcome is Outcome.COMPLETED
    first, second, third = ws.runs()
    assert first.session_id == f"s-{first.run_id}" and first.resumed_run_id is None
    assert second.resumed_run_id == first.run_id and third.resumed_run_id == second.run_id
    assert first.session_id == second.session_id == third.session_id
    assert "--resume" in (third.commandline or "")
    prompt = ws.task().run(third.run_id).prompt.read_text()
    assert f"This continues your session of run `{second.run_id}`" in prompt
    assert "## Previous attempt" in prompt and "## Task" not in prompt
    assert "attempt 2 fails" in prompt  # the failure's tail


def test_session_fresh_starts_every_attempt_anew(ws: Workspace) -> None:
    sup = ws.supervisor(backend=backend(ws, ["--fail-first", "1"]), session=Session.FRESH)
    assert sup.run().outcome is Outcome.COMPLETED
    _, second = ws.runs()
    assert second.resumed_run_id is None and second.session_id == f"s-{second.run_id}"
    assert ws.task().run(second.run_id).prompt.read_text().endswith("## Task\n\ndo the thing\n")


def test_a_run_in_another_folder_is_not_continued(ws: Workspace, tmp_path: Path) -> None:
    ws.supervisor(backend=backend(ws, ["--fail-first", "9"]), max_restarts=0).run()
    other = tmp_path / "elsewhere"
    other.mkdir()
    ws.supervisor(backend=backend(ws, []), cwd=other).run()
    first, second = ws.runs()
    assert first.session_id and second.resumed_run_id is None  # its CLI keeps it per folder


def test_a_refused_session_falls_back_fresh_spending_no_restart(ws: Workspace) -> None:
    ws.supervisor(backend=backend(ws, ["--fail-first", "1"]), max_restarts=0).run()
    (first,) = ws.runs()
    Sessions.gone.add(f"s-{first.run_id}")
    try:  # fails again: the refused resume, then a fresh attempt that completes
        sup = ws.supervisor(backend=backend(ws, ["--fail-first", "2"]), max_restarts=0)
        assert sup.run().outcome is Outcome.COMPLETED
    finally:
        Sessions.gone.clear()
    _, refused, fresh = ws.runs()
    assert refused.resumed_run_id == first.run_id and refused.session_id is None
    assert fresh.resumed_run_id is None and fresh.previous_run_id == first.run_id
    said = [e.message for e in ws.events if e.kind is EventKind.WAITING]
    assert said == [
        f"run {refused.run_id} could not resume session s-{first.run_id} (no such session): "
        "the next attempt starts a fresh session"
    ]
    stderr = ws.task().run(refused.run_id).stderr.read_text()
    assert f"run-agent: session s-{first.run_id} could not be resumed: no such session" in stderr
    prompt = ws.task().run(fresh.run_id).prompt.read_text()
    assert f"Run `{first.run_id}` (attempt 1)" in prompt and "## Task" in prompt


def test_fresh_is_for_one_loop_and_contradicting_session_continue_is_refused(
    ws: Workspace,
) -> None:
    ws.write_config(["--lines", "1"])
    assert ws.cli("-p", "p", "-t", "t", "--session", "fresh", "go").returncode == 0
    assert taskfolder.read_task_settings(ws.task())["session"] == "fresh"  # remembered
    again = ws.cli("resume", "-p", "p", "-t", "t", "--again", "--session", "continue", "--fresh")
    assert again.returncode == 2 and again.stderr.count("\n") == 1
    assert "--fresh and --session continue contradict each other" in again.stderr
    assert ws.cli("-p", "p", "-t", "u", "--fresh", "go").returncode == 0
    assert "session" not in taskfolder.read_task_settings(ws.task(task="u"))  # this loop only


def test_the_session_fields_are_written_only_when_known() -> None:
    from runagent.store.runinfo import RunInfo

    info = RunInfo("r", "p", "t", 1, "a", "claude", "now", "/tmp")
    assert not {"session_id", "resumed_run_id"} & set(info.to_dict())  # conductor-loop's shape
    known = info.replace(session_id="c05eb71d-26d5", resumed_run_id="q")
    assert RunInfo.from_dict(known.to_dict()) == known


def replay_claude(ws: Workspace) -> None:
    """A config whose agent is of type claude, replaying a captured claude stream (its session
    id in its first event) and failing: each run's record says which session it started or
    resumed, with real detached loops."""
    import yaml

    from tests.conftest import REPO, TEST_DEFAULTS

    chunks = (REPO / "tests" / "samples" / "claude-text.stdout.jsonl").read_bytes().hex()
    argv = ws.agent_argv(["--ignore-unknown", "--chunks", chunks, "--exit", "1"])
    ws.config.write_text(yaml.safe_dump({
        "agents": {"replay": {"type": "claude", "permissions": "none", "command": argv}},
        "defaults": {"agent": "replay", **TEST_DEFAULTS, "max_restarts": 0},
        "storage": {"runs_dir": str(ws.root)},
    }))  # fmt: skip


def test_fresh_on_a_detached_resume_starts_that_loop_fresh_and_only_that_one(
    ws: Workspace,
) -> None:
    from runagent.store.lock import live_holder
    from tests.conftest import wait_for

    replay_claude(ws)
    assert ws.cli("-p", "p", "-t", "t", "go").returncode == 1
    (first,) = ws.runs()
    assert first.session_id
    started = ws.cli("resume", "-p", "p", "-t", "t", "--fresh", "--detach")
    assert started.returncode == 0, started.stderr
    wait_for(lambda: len(ws.runs()) == 2 and ws.runs()[1].status != "running"
             and live_holder(ws.task().lock) is None, what="the detached loop to end")  # fmt: skip
    second = ws.runs()[1]
    assert second.resumed_run_id is None and "--resume" not in (second.commandline or "")
    assert "session" not in taskfolder.read_task_settings(ws.task())  # this loop only
    again = ws.cli("resume", "-p", "p", "-t", "t", "--detach")  # continues its session again
    assert again.returncode == 0, again.stderr
    wait_for(lambda: len(ws.runs()) == 3 and ws.runs()[2].status != "running"
             and live_holder(ws.task().lock) is None, what="the next loop to end")  # fmt: skip
    assert ws.runs()[2].resumed_run_id == second.run_id


def test_fresh_in_an_api_resume_starts_that_loop_fresh_and_a_bad_one_is_named(
    ws: Workspace,
) -> None:
    from starlette.testclient import TestClient

    from runagent.store.lock import live_holder
    from server.app import Settings, create_app
    from tests.conftest import LOCAL, wait_for

    replay_claude(ws)
    assert ws.cli("-p", "p", "-t", "t", "go").returncode == 1
    app = create_app(Settings(root=ws.root, config_path=ws.config, workdir=ws.path))
    with TestClient(app, base_url=LOCAL) as c:
        url = "/api/projects/p/tasks/t/resume"
        bad = c.post(url, json={"fresh": "maybe"})
        assert bad.status_code == 400
        assert bad.json()["error"] == "fresh: 'maybe' is not true or false"
        both = c.post(url, json={"fresh": True, "session": "continue"})
        assert both.status_code == 400
        assert both.json()["error"] == "fresh and session continue contradict each other; give one"
        assert c.post(url, json={"fresh": True}).status_code == 202
        wait_for(lambda: len(ws.runs()) == 2 and live_holder(ws.task().lock) is None,
                 what="the resumed loop to end")  # fmt: skip
    first, second = ws.runs()
    assert first.session_id and second.resumed_run_id is None
    assert "session" not in taskfolder.read_task_settings(ws.task())
