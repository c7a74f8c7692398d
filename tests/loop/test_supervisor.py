"""The Ralph loop, run in-process against the fake agent, asserting on run folders."""

from __future__ import annotations

import itertools
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from runagent.config.settings import Until
from runagent.errors import AlreadyRunningError
from runagent.loop.attempt import StopSignal
from runagent.loop.events import EventKind, Outcome
from runagent.process import AgentProcess, LaunchSpec, SpawnError
from runagent.store import runfolder
from runagent.store.lock import TaskLock
from runagent.store.runinfo import Reason, RunInfo, RunStatus
from tests.conftest import FAKE_AGENT, Workspace, alive, wait_for
from tests.gitrepo import GIT_ENV, commit, git, make_repo


def test_exit_zero_completes_the_task_with_a_full_run_folder(ws: Workspace) -> None:
    result = ws.supervisor(["--lines", "2", "--stderr", "note"], prompt="say hi").run()
    assert result.outcome is Outcome.COMPLETED
    (info,) = ws.runs()
    folder = ws.task().run_folder(info.run_id)
    assert sorted(p.name for p in folder.iterdir()) == [
        "agent-stderr.txt", "agent-stdout.txt", "output.md", "prompt.md", "run-info.yaml",
    ]  # fmt: skip
    assert info.status is RunStatus.COMPLETED and info.exit_code == 0
    assert info.attempt == 1 and info.previous_run_id is None
    assert info.pid and info.pgid == info.pid and info.supervisor_pid
    assert info.end_time and info.start_time <= info.end_time
    assert (folder / "agent-stdout.txt").read_text() == "line 1\nline 2\n"
    assert (folder / "output.md").read_text() == "line 1\nline 2\n"
    assert (folder / "agent-stderr.txt").read_text() == "note\n"
    assert ws.task().task_md.read_text() == "say hi"
    assert ws.task().done.exists()  # run-agent marks the completion
    prompt = (folder / "prompt.md").read_text()
    assert f"run `{info.run_id}`" in prompt and "project `p`" in prompt
    assert str(ws.task().folder) in prompt and "DONE" in prompt
    assert prompt.endswith("## Task\n\nsay hi\n")


def test_every_run_info_field_is_written() -> None:
    info = RunInfo("r", "p", "t", 1, "a", "command", "now", "/tmp")
    keys = set(info.to_dict())
    required = (
        "version run_id project_id task_id attempt previous_run_id parent_run_id agent "
        "agent_version pid pgid supervisor_pid start_time end_time exit_code status reason cwd "
        "commandline"
    )
    for name in required.split():
        assert name in keys


def test_failures_restart_with_a_new_run_that_knows_the_previous_one(ws: Workspace) -> None:
    result = ws.supervisor(["--fail-first", "2", "--lines", "1", "--line-text", "progress"]).run()
    assert result.outcome is Outcome.COMPLETED
    runs = ws.runs()
    assert [r.attempt for r in runs] == [1, 2, 3]
    assert [r.status for r in runs] == [RunStatus.FAILED, RunStatus.FAILED, RunStatus.COMPLETED]
    assert [r.exit_code for r in runs] == [1, 1, 0]
    assert runs[0].reason is Reason.EXIT_CODE
    assert runs[1].previous_run_id == runs[0].run_id
    assert runs[2].previous_run_id == runs[1].run_id
    assert len({r.run_id for r in runs}) == 3
    prompt = ws.task().run(runs[2].run_id).prompt.read_text()
    assert "attempt 3 of at most 4" in prompt
    assert f"Run `{runs[1].run_id}` (attempt 2) ended failed: exited with code 1" in prompt
    assert "progress 1" in prompt  # the tail of its output
    assert "attempt 2 fails" in prompt  # and of its stderr


def test_backoff_doubles_up_to_the_cap_and_is_honoured(ws: Workspace) -> None:
    sup = ws.supervisor(
        ["--fail-first", "9"], max_restarts=4, restart_delay=0.1, restart_delay_max=0.25
    )
    assert sup.run().outcome is Outcome.FAILED
    delays = [e.delay for e in ws.events if e.kind is EventKind.WAITING]
    assert delays == [0.1, 0.2, 0.25, 0.25]
    runs = ws.runs()
    assert len(runs) == 5  # 1 + max_restarts: the loop is bounded
    for before, after, delay in zip(runs, runs[1:], delays, strict=False):
        gap = _seconds(after.start_time) - _seconds(before.end_time or "")
        assert gap >= delay - 0.002  # never restarts sooner than the backoff says


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def test_a_loop_gives_up_after_max_restarts(ws: Workspace) -> None:
    result = ws.supervisor(["--exit", "1"], max_restarts=2).run()
    assert result.outcome is Outcome.FAILED
    assert "gave up after 3 failed attempts" in result.message
    assert len(ws.runs()) == 3
    assert not ws.task().done.exists()


@pytest.mark.parametrize("code", [2, 3, 126, 127])
def test_exit_codes_a_retry_cannot_fix_end_the_loop_at_once(ws: Workspace, code: int) -> None:
    result = ws.supervisor(["--exit", str(code)]).run()
    assert result.outcome is Outcome.FAILED
    assert "a retry cannot fix" in result.message
    assert ("`run-agent doctor`" in result.message) is (code == 3)
    assert len(ws.runs()) == 1


def test_non_retryable_exit_codes_are_configurable(ws: Workspace) -> None:
    result = ws.supervisor(["--exit", "7"], non_retryable_exit_codes=frozenset({7})).run()
    assert len(ws.runs()) == 1 and "a retry cannot fix" in result.message


def test_a_crash_loop_is_reported_not_repeated(ws: Workspace) -> None:
    result = ws.supervisor(
        ["--exit", "1"], max_restarts=10, crash_loop_runs=3, crash_loop_seconds=30
    ).run()
    assert result.outcome is Outcome.FAILED
    assert "crash loop" in result.message
    assert len(ws.runs()) == 3


def test_until_done_file_exit_zero_without_done_is_not_completion(ws: Workspace) -> None:
    # Exit 0 without DONE is not completion under --until done-file: each run is restarted.
    result = ws.supervisor(["--exit", "0"], until=Until.DONE_FILE).run()
    assert result.outcome is Outcome.FAILED  # never wrote DONE
    runs = ws.runs()
    assert len(runs) == 4
    assert {r.reason for r in runs} == {Reason.NO_DONE_FILE}
    assert not ws.task().done.exists()


def test_until_done_file_completes_when_done_is_written(ws: Workspace) -> None:
    result = ws.supervisor(["--write-done", "--exit", "1"], until=Until.DONE_FILE).run()
    assert result.outcome is Outcome.COMPLETED
    (info,) = ws.runs()
    assert ws.task().done.read_text() == f"done by {info.run_id}\n"


def test_until_ready_marker_restarts_until_a_commit_carries_the_marker(ws: Workspace) -> None:
    repo = make_repo(ws.path / "repo")
    commit(repo, "an old ready commit\n\ncocode ready for check")  # before the base: no count
    base = git(repo, "rev-parse", "HEAD")
    result = ws.supervisor(
        ["--commit", "progress {attempt}", "--ready-from", "2"],
        env=GIT_ENV, cwd=repo, until=Until.READY_MARKER,
    ).run()  # fmt: skip
    assert result.outcome is Outcome.COMPLETED
    first, second = ws.runs()
    assert (first.status, first.reason) == (RunStatus.FAILED, Reason.NO_READY_MARKER)
    assert (second.status, second.reason) == (RunStatus.COMPLETED, Reason.READY_MARKER)
    head = git(repo, "rev-parse", "HEAD")
    # Every attempt works in the same checkout, against the base recorded at the loop's start.
    assert {(r.repo, r.branch, r.base_commit) for r in ws.runs()} == {(str(repo), "main", base)}
    assert second.head_commit == head and first.head_commit != head
    assert ws.task().done.exists()
    prompt = ws.task().run(first.run_id).prompt.read_text()
    assert "`cocode ready for check`" in prompt


def test_a_stale_done_from_an_earlier_loop_never_completes_a_new_one(ws: Workspace) -> None:
    assert ws.supervisor(["--write-done"], until=Until.DONE_FILE).run().outcome is Outcome.COMPLETED
    first = ws.runs()[0]
    # A new loop on the same task, whose agent fails: the old DONE must not complete it.
    result = ws.supervisor(["--exit", "1"], until=Until.DONE_FILE, max_restarts=1).run()
    assert result.outcome is Outcome.FAILED
    assert not ws.task().done.exists()
    archived = ws.task().run_folder(first.run_id) / "DONE"
    assert archived.read_text() == f"done by {first.run_id}\n"  # kept, not lost
    assert any(e.kind is EventKind.DONE_ARCHIVED for e in ws.events)


def test_total_timeout_stops_the_run_and_says_which_timeout(ws: Workspace) -> None:
    # 10 s: time for the agent to start and print its line on a loaded machine, where an
    # interpreter alone can take several seconds.
    result = ws.supervisor(
        ["--lines", "1", "--sleep", "60", "--grandchild"], timeout=10.0, max_restarts=1
    ).run()
    assert result.outcome is Outcome.TIMED_OUT
    runs = ws.runs()
    assert [r.status for r in runs] == [RunStatus.TIMED_OUT] * 2
    assert {r.reason for r in runs} == {Reason.TIMEOUT}
    assert "timeout 10s" in (runs[0].message or "")
    # The partial output is kept.
    stdout = ws.task().run(runs[0].run_id).stdout.read_text()
    assert stdout == "line 1\n"
    assert not [p for p in ws.agent_pids() if alive(p)]


def test_idle_timeout_fires_only_without_output(ws: Workspace) -> None:
    # Prints every 0.2s for 6s: never idle for 5s (the idle clock runs from before the agent's
    # start, which a loaded machine slows), so it completes despite running longer.
    ok = ws.supervisor(["--lines", "30", "--interval", "0.2"], idle_timeout=5, task="busy").run()
    assert ok.outcome is Outcome.COMPLETED
    # Silent for 60s: stopped as idle, the whole tree with it.
    result = ws.supervisor(
        ["--lines", "1", "--sleep", "60", "--setsid-grandchild"], idle_timeout=0.6, max_restarts=0
    ).run()
    assert result.outcome is Outcome.TIMED_OUT
    (info,) = ws.runs()
    assert info.reason is Reason.IDLE_TIMEOUT and "idle_timeout 0.6s" in (info.message or "")
    assert not [p for p in ws.agent_pids() if alive(p)]


def test_stop_request_stops_the_loop_not_just_the_run(ws: Workspace) -> None:
    sup = ws.supervisor(["--sleep", "60", "--grandchild", "--ignore-term"], kill_grace=0.3)
    result: list[Outcome] = []
    thread = threading.Thread(target=lambda: result.append(sup.run().outcome))
    thread.start()
    wait_for(lambda: len(ws.agent_pids()) == 2, what="agent and grandchild")
    sup.request_stop()
    thread.join(20)
    assert result == [Outcome.STOPPED]
    (info,) = ws.runs()  # nothing restarted
    assert info.status is RunStatus.STOPPED and info.reason is Reason.STOPPED
    assert not [p for p in ws.agent_pids() if alive(p)]


def test_stop_during_the_backoff_ends_the_loop(ws: Workspace) -> None:
    sup = ws.supervisor(["--exit", "1"], restart_delay=30, restart_delay_max=30)
    result: list[Outcome] = []
    thread = threading.Thread(target=lambda: result.append(sup.run().outcome))
    thread.start()
    wait_for(lambda: any(e.kind is EventKind.WAITING for e in ws.events), what="the backoff")
    sup.request_stop()
    thread.join(10)
    assert result == [Outcome.STOPPED]
    assert len(ws.runs()) == 1


def test_a_second_supervisor_of_a_running_task_is_refused(ws: Workspace) -> None:
    holder = TaskLock(ws.task().lock, "p/t")
    holder.acquire()
    try:
        with pytest.raises(AlreadyRunningError) as info:
            ws.supervisor(["--exit", "0"]).run()
        message = str(info.value)
        assert message.startswith("task p/t is already running (supervisor pid ")
        assert " since " in message
    finally:
        holder.release()
    assert ws.supervisor(["--exit", "0"]).run().outcome is Outcome.COMPLETED  # lock released


def test_a_run_whose_supervisor_died_is_written_lost_by_the_next_supervisor(
    ws: Workspace,
) -> None:
    ws.supervisor(["--exit", "1"], max_restarts=0).run()
    (first,) = ws.runs()
    folder = ws.task().run_folder(first.run_id)
    # Make it look like a run whose supervisor was killed mid-run: running, dead supervisor.
    runfolder.write_run_info(
        folder,
        first.replace(status=RunStatus.RUNNING, end_time=None, exit_code=None, supervisor_pid=1,
                      supervisor_start=0.0),
    )  # fmt: skip
    ws.supervisor(["--exit", "0"]).run()
    lost = runfolder.read_run_info(folder)
    assert lost is not None and lost.status is RunStatus.LOST
    assert lost.reason is Reason.SUPERVISOR_LOST and lost.end_time
    assert ws.runs()[-1].previous_run_id == first.run_id


def test_missing_binary_ends_the_loop_with_a_clear_reason(ws: Workspace) -> None:
    from backends.command import CommandBackend
    from runagent.config.settings import AgentConfig

    ghost = CommandBackend(AgentConfig("ghost", "command", command=("no-such-agent-xyz",)))
    result = ws.supervisor(backend=ghost).run()
    assert result.outcome is Outcome.MISSING_DEPENDENCY
    (info,) = ws.runs()
    assert info.reason is Reason.MISSING_BINARY and info.exit_code == 127
    stderr = ws.task().run(info.run_id).stderr.read_text()
    assert "'no-such-agent-xyz' not found on PATH" in stderr
    assert ws.task().run(info.run_id).output.exists()


def test_the_agent_gets_the_environment_contract(ws: Workspace) -> None:
    names = ["TASK_FOLDER", "RUN_FOLDER", "JRUN_PROJECT_ID", "JRUN_TASK_ID", "JRUN_ID",
             "JRUN_PARENT_ID", "JRUN_RUNS_DIR", "MY_SETTING"]  # fmt: skip
    sup = ws.supervisor(["--echo-env", *names], env={"MY_SETTING": "42"})
    sup.run()
    (info,) = ws.runs()
    folder = ws.task().run_folder(info.run_id)
    lines = dict(
        line.split("=", 1) for line in runfolder.RunPaths(folder).stdout.read_text().splitlines()
    )
    assert lines == {
        "TASK_FOLDER": str(ws.task().folder),
        "RUN_FOLDER": str(folder),
        "JRUN_PROJECT_ID": "p",
        "JRUN_TASK_ID": "t",
        "JRUN_ID": info.run_id,
        "JRUN_PARENT_ID": "",
        "JRUN_RUNS_DIR": str(ws.root),
        "MY_SETTING": "42",
    }


def test_a_missing_credential_ends_the_loop_as_a_missing_dependency(ws: Workspace) -> None:
    from backends.xai import XaiBackend
    from runagent.config.settings import AgentConfig

    grok = XaiBackend(AgentConfig("grok", "xai", token_file=ws.path / "no-key-file"))
    result = ws.supervisor(backend=grok).run()
    assert result.outcome is Outcome.MISSING_DEPENDENCY
    (info,) = ws.runs()
    assert info.reason is Reason.AUTH and info.exit_code == 3
    assert "no-key-file" in (info.message or "")


def test_a_stop_before_the_first_run_starts_nothing(ws: Workspace) -> None:
    sup = ws.supervisor(["--sleep", "60"])
    sup.request_stop()
    assert sup.run().outcome is Outcome.STOPPED
    assert ws.runs() == [] and ws.agent_pids() == []


def test_an_argument_exec_cannot_take_fails_the_run_instead_of_leaving_it_running(
    ws: Workspace,
) -> None:
    # A NUL byte reaching the command line (here through {prompt}) is refused by exec itself.
    result = ws.supervisor(["--line-text", "{prompt}"], prompt="a\0b", max_restarts=0).run()
    assert result.outcome is Outcome.FAILED
    (info,) = ws.runs()
    assert info.status is RunStatus.FAILED and info.reason is Reason.SPAWN_ERROR
    assert info.exit_code == 126 and "null byte" in (info.message or "")
    assert not ws.agent_pids()


def test_the_clock_is_a_seam_that_durations_are_measured_by(ws: Workspace) -> None:
    # Quick failures are a crash loop by the real clock; by one where each reading is a minute
    # later, every run lasts minutes, so the loop spends its restarts instead.
    readings = itertools.count(step=60.0)
    settings = {"max_restarts": 4, "crash_loop_runs": 3, "crash_loop_seconds": 30}
    quick = ws.supervisor(["--exit", "1"], task="quick", **settings).run()
    assert "crash loop" in quick.message and len(ws.runs(task="quick")) == 3
    slow = ws.supervisor(
        ["--exit", "1"], task="slow", seams={"clock": lambda: next(readings)}, **settings
    ).run()
    assert "gave up after 5 failed attempts" in slow.message and len(ws.runs(task="slow")) == 5


def test_the_start_of_an_agent_process_is_a_seam(ws: Workspace) -> None:
    started: list[tuple[LaunchSpec, Path]] = []

    def start(spec: LaunchSpec, stdout: Path, stderr: Path, *, grace: float) -> AgentProcess:
        started.append((spec, stdout))
        if len(started) == 1:  # the first start fails, as a transport can for a while
            raise SpawnError("the host is busy", 75)
        return AgentProcess.start(spec, stdout, stderr, grace=grace)

    result = ws.supervisor(["--exit", "0"], seams={"start": start}).run()
    assert result.outcome is Outcome.COMPLETED
    first, _ = ws.runs()
    assert first.reason is Reason.SPAWN_ERROR and first.exit_code == 75
    assert "the host is busy" in ws.task().run(first.run_id).stderr.read_text()
    assert [stdout for _, stdout in started] == [ws.task().run(r.run_id).stdout for r in ws.runs()]
    assert started[1][0].argv[1] == str(FAKE_AGENT)


def test_a_stop_signal_wakes_a_wait_at_once_and_is_harmless_once_closed() -> None:
    signal = StopSignal()
    assert signal.wait(0.01) is False  # nobody asked: the whole wait passes
    threading.Timer(0.05, signal.request).start()
    began = time.monotonic()
    assert signal.wait(30) is True
    assert time.monotonic() - began < 10
    signal.close()
    signal.request()  # after close: no write to a descriptor number another file may now hold
    assert signal.requested
