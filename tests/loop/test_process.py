"""runagent.process and the reaper: stdio on files, exit codes, and killing whole trees."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from runagent.process import AgentProcess, LaunchSpec, SpawnError
from runagent.store.pids import is_alive, process_start_time
from tests.conftest import Workspace, alive, wait_for


def start(ws: Workspace, *args: str, stdin: Path | None = None, grace: float = 1.0) -> AgentProcess:
    spec = LaunchSpec(
        argv=tuple(ws.agent_argv(args)), env=dict(os.environ), cwd=ws.path, stdin=stdin
    )
    return AgentProcess.start(spec, ws.path / "out.txt", ws.path / "err.txt", grace=grace)


def test_stdout_and_stderr_go_to_their_files_while_the_agent_runs(ws: Workspace) -> None:
    go = ws.path / "go"
    proc = start(ws, "--lines", "2", "--stderr", "warned", "--wait-for", str(go))
    try:
        # The agent is still blocked, yet its lines are already on disk: tail -f works mid-run.
        wait_for(lambda: (ws.path / "out.txt").read_text() == "line 1\nline 2\n", what="stdout")
        wait_for(lambda: (ws.path / "err.txt").read_text() == "warned\n", what="stderr")
        assert proc.poll() is None
        go.touch()
        assert proc.wait(15) == 0
    finally:
        proc.close()


def test_stdin_comes_from_the_given_file_and_is_never_an_open_pipe(ws: Workspace) -> None:
    prompt = ws.path / "prompt.md"
    prompt.write_text("hello agent\n")
    proc = start(ws, "--echo-stdin", stdin=prompt)
    assert proc.wait(15) == 0
    proc.close()
    assert (ws.path / "out.txt").read_text() == "hello agent\n"
    # Without a prompt file, stdin is /dev/null: reading it ends at once instead of hanging.
    proc = start(ws, "--echo-stdin")
    assert proc.wait(15) == 0
    proc.close()


@pytest.mark.parametrize("code", [0, 1, 3, 42])
def test_exit_code_is_reported(ws: Workspace, code: int) -> None:
    proc = start(ws, "--exit", str(code))
    assert proc.wait(15) == code
    proc.close()


def test_agent_runs_in_its_own_session(ws: Workspace) -> None:
    proc = start(ws, "--sleep", "30")
    try:
        assert os.getsid(proc.pid) == proc.pid
        assert os.getpgid(proc.pid) == proc.pgid == proc.pid
    finally:
        proc.stop(1.0)
        proc.close()


def test_stop_kills_the_whole_tree_including_setsid_and_term_ignoring_processes(
    ws: Workspace,
) -> None:
    proc = start(
        ws, "--grandchild", "--setsid-grandchild", "--orphan", "--ignore-term", "--sleep", "60",
        grace=0.5,
    )  # fmt: skip
    # agent + grandchild + setsid grandchild + orphaned setsid grandchild
    pids = wait_for(lambda: len(ws.agent_pids()) == 4 and ws.agent_pids(), what="4 pids")
    assert all(alive(p) for p in pids)
    code = proc.stop(0.5)
    proc.close()
    assert code == 128 + signal.SIGKILL  # SIGTERM was ignored, so SIGKILL after the grace
    assert not [p for p in pids if alive(p)]


def test_processes_left_behind_by_an_agent_that_exits_are_stopped(ws: Workspace) -> None:
    proc = start(ws, "--grandchild", "--setsid-grandchild", "--orphan", "--wait-pids", "4")
    assert proc.wait(60) == 0  # four interpreters, one after another, on a loaded machine
    proc.close()
    pids = ws.agent_pids()
    assert len(pids) == 4
    wait_for(lambda: not [p for p in pids if alive(p)], what="the leftovers to be gone")


def test_closing_the_lifeline_stops_the_tree(ws: Workspace) -> None:
    """What happens when the supervisor dies: its end of the pipe closes."""
    proc = start(ws, "--setsid-grandchild", "--sleep", "60")
    pids = wait_for(lambda: len(ws.agent_pids()) == 2 and ws.agent_pids(), what="2 pids")
    proc.close()
    wait_for(lambda: not [p for p in pids if alive(p)], what="the tree to be gone")


def test_a_missing_executable_is_refused_before_anything_starts(ws: Workspace) -> None:
    spec = LaunchSpec(argv=("no-such-agent-xyz",), env={"PATH": "/usr/bin:/bin"}, cwd=ws.path)
    with pytest.raises(SpawnError) as info:
        AgentProcess.start(spec, ws.path / "o", ws.path / "e", grace=1)
    assert info.value.code == 127
    assert "'no-such-agent-xyz' not found on PATH" in str(info.value)


def test_a_file_that_cannot_be_executed_is_an_error_126(ws: Workspace) -> None:
    script = ws.path / "agent.sh"
    script.write_text("#!/no/such/interpreter\n")
    script.chmod(0o755)
    spec = LaunchSpec(argv=(str(script),), env=dict(os.environ), cwd=ws.path)
    with pytest.raises(SpawnError) as info:
        AgentProcess.start(spec, ws.path / "o", ws.path / "e", grace=1)
    assert info.value.code in (126, 127)


def test_liveness_tells_a_reused_pid_from_the_original_process() -> None:
    me = os.getpid()
    started = process_start_time(me)
    assert started is not None
    assert is_alive(me, started)
    assert not is_alive(me, started - 100)  # same pid, another start time: not our process
    assert not is_alive(None, None)
    assert not is_alive(2**22 + 12345, None)


def test_exit_by_signal_is_reported_shell_style(ws: Workspace) -> None:
    proc = start(ws, "--sleep", "60")
    wait_for(lambda: ws.agent_pids(), what="the agent pid")
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(15) == 128 + signal.SIGKILL
    proc.close()
    time.sleep(0)  # nothing else to clean: the reaper collected the agent


def _parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    return int(stat[stat.rfind(b")") + 2 :].split()[1])


def test_the_reaper_started_early_is_the_one_the_agent_runs_under(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runagent import process

    monkeypatch.setattr(process, "_standby", None)
    process.start_reaper_early()
    assert process._standby is not None
    early = process._standby[0].pid
    # Relative folder and files: the reaper, which waits in /, is told them in full.
    spec = LaunchSpec(argv=tuple(ws.agent_argv(["--wait-for", "go", "--lines", "1"])),
                      env=dict(os.environ), cwd=Path(os.path.relpath(ws.path)))  # fmt: skip
    out = Path(os.path.relpath(ws.path / "out.txt"))
    proc = AgentProcess.start(spec, out, ws.path / "err.txt", grace=1.0)
    try:
        assert process._standby is None and _parent_of(proc.pid) == early
        (ws.path / "go").touch()  # in the agent's folder, so the reaper entered it
        assert proc.wait(15) == 0
    finally:
        proc.close()
    assert (ws.path / "out.txt").read_text() == "line 1\n"


def test_a_reaper_started_early_and_never_used_exits_having_started_nothing() -> None:
    from runagent import process

    reaper, lifeline, report = process._spawn_reaper()
    try:
        assert reaper.poll() is None  # it waits to be told what to start
        os.close(lifeline)  # this process lets go (as when it exits)
        assert reaper.wait(15) == 0
        assert os.read(report, 100) == b""  # it said nothing: it started nothing
    finally:
        os.close(report)


def test_a_reaper_that_died_before_it_was_used_is_replaced(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runagent import process

    monkeypatch.setattr(process, "_standby", None)
    process.start_reaper_early()
    assert process._standby is not None
    dead = process._standby[0]
    dead.kill()
    dead.wait()
    proc = start(ws, "--exit", "0")
    try:
        assert _parent_of(proc.pid) != dead.pid
        assert proc.wait(15) == 0
    finally:
        proc.close()


@pytest.mark.parametrize(
    ("args", "runs"),
    [
        (["-p", "p", "-t", "t", "go"], True),
        (["run", "-p", "p", "-t", "t", "go"], True),
        (["--root", "r", "job", "-p", "p"], True),
        (["--config=c.yaml", "resume", "-p", "p"], True),
        (["list"], False),
        (["--root", "r", "status"], False),
        (["run", "--help"], False),
        (["--version"], False),
        ([], False),
    ],
)
def test_which_command_lines_start_a_reaper_early(args: list[str], runs: bool) -> None:
    from runagent.cli import runs_an_agent

    assert runs_an_agent(args) is runs
