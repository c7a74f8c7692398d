"""The run-agent command line, run as a real subprocess against the fake agent."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys

import pytest
import yaml

from runagent.errors import ExitCode
from runagent.store.runinfo import RunStatus
from tests.conftest import REPO, Workspace, alive, wait_for


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got: {text!r}"
    assert "Traceback" not in text
    return lines[0]


def test_run_is_the_default_command_and_shows_failure_restart_completion(ws: Workspace) -> None:
    ws.write_config(["--fail-first", "1", "--lines", "1"])
    proc = ws.cli("--project", "p", "--task", "t", "fix the bug")
    assert proc.returncode == ExitCode.COMPLETED, proc.stderr
    assert "attempt 1/4: run" in proc.stderr and "failed: exited with code 1" in proc.stderr
    assert "restarting in" in proc.stderr
    assert "task p/t completed by run" in proc.stderr
    assert [r.status for r in ws.runs()] == [RunStatus.FAILED, RunStatus.COMPLETED]


def test_python_dash_m_and_version_and_help(ws: Workspace) -> None:
    version = ws.cli("--version")
    assert version.returncode == 0 and "run-agent, version" in version.stdout
    for command in ["run", "job", "list", "status", "output", "stop", "resume"]:
        helped = ws.cli(command, "--help")
        assert helped.returncode == 0 and "Usage:" in helped.stdout, command


def test_the_task_id_is_generated_and_printed_when_omitted(ws: Workspace) -> None:
    proc = ws.cli("--project", "p", "hello")
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stderr.splitlines() if "task id" in ln)
    task_id = line.rsplit(" ", 1)[1]
    assert task_id.startswith("task-")
    assert ws.task("p", task_id).task_md.read_text() == "hello"


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--project", "bad/id", "--task", "t", "x"], "project id 'bad/id'"),
        (["--project", "p", "--task", "..", "x"], "task id '..'"),
        (["--project", "p", "--task", "a" * 129, "x"], "129 characters"),
        (["--project", "p", "--task", "t"], "no prompt"),
        (["--project", "p", "--task", "t", "--agent", "nope", "x"], "unknown agent 'nope'"),
        (["--project", "p", "--task", "t", "--timeout", "soon", "x"], "--timeout: 'soon'"),
        (["--project", "p", "--task", "t", "--cwd", "/no/such/dir", "x"], "/no/such/dir"),
        (["status", "--project", "p", "--task", "missing"], "project 'p' not found"),
    ],
)
def test_bad_input_is_one_line_with_exit_code_2(
    ws: Workspace, args: list[str], fragment: str
) -> None:
    proc = ws.invoke(*args)
    assert proc.returncode == ExitCode.USAGE
    assert fragment in one_line(proc.stderr)


def test_a_bad_config_names_the_key_path_and_suggests_the_fix(ws: Workspace) -> None:
    ws.config.write_text("defaults:\n  max_restart: 3\n")
    proc = ws.cli("--project", "p", "--task", "t", "x")
    assert proc.returncode == ExitCode.USAGE
    line = one_line(proc.stderr)
    assert "defaults.max_restart: unknown key; did you mean 'max_restarts'?" in line


def test_a_missing_agent_binary_exits_3_with_a_clear_line(ws: Workspace) -> None:
    ws.config.write_text(
        "agents:\n  ghost:\n    type: command\n    command: [no-such-agent-xyz]\n"
        f"defaults:\n  agent: ghost\nstorage:\n  runs_dir: {ws.root}\n"
    )
    proc = ws.cli("--project", "p", "--task", "t", "x")
    assert proc.returncode == ExitCode.MISSING_DEPENDENCY
    # Refused once, before anything starts: no "attempt 1 started", no run folder, no task.
    assert one_line(proc.stderr).endswith("'no-such-agent-xyz' not found on PATH; install it, "
                                          "or set agents.ghost.command")  # fmt: skip
    assert not ws.task().folder.exists()


def test_a_missing_absolute_path_is_not_called_missing_on_path(ws: Workspace) -> None:
    ws.config.write_text(
        "agents:\n  ghost:\n    type: command\n    command: [/opt/none/agent]\n"
        f"defaults:\n  agent: ghost\nstorage:\n  runs_dir: {ws.root}\n"
    )
    proc = ws.invoke("--project", "p", "--task", "t", "x")
    assert proc.returncode == ExitCode.MISSING_DEPENDENCY
    assert "'/opt/none/agent' not found (no executable file there)" in one_line(proc.stderr)


def test_an_unknown_agent_gets_a_did_you_mean(ws: Workspace) -> None:
    proc = ws.invoke("--project", "p", "--task", "t", "--agent", "fkae", "x")
    assert proc.returncode == ExitCode.USAGE
    assert "unknown agent 'fkae'; did you mean 'fake'?" in one_line(proc.stderr)
    assert not ws.root.exists()


def test_job_runs_once_without_restarts(ws: Workspace) -> None:
    ws.write_config(["--exit", "1"])
    proc = ws.cli("job", "--project", "p", "--task", "t", "x")
    assert proc.returncode == ExitCode.FAILED
    assert len(ws.runs()) == 1


def test_timeout_exit_code_is_124(ws: Workspace) -> None:
    ws.write_config(["--sleep", "60"])
    proc = ws.cli("job", "--project", "p", "--task", "t", "--timeout", "0.5s", "x")
    assert proc.returncode == ExitCode.TIMED_OUT, proc.stderr
    assert ws.runs()[0].reason == "timeout"


def test_a_second_run_agent_on_a_running_task_exits_at_once(ws: Workspace) -> None:
    ws.write_config(["--sleep", "60"])
    first = ws.start_cli("--project", "p", "--task", "t", "x")
    try:
        wait_for(lambda: ws.agent_pids(), what="the first agent")
        second = ws.cli("--project", "p", "--task", "t", "x", timeout=20)
        assert second.returncode == ExitCode.ALREADY_RUNNING
        line = one_line(second.stderr)
        assert line.startswith(
            f"run-agent: task p/t is already running (supervisor pid {first.pid}"
        )
    finally:
        os.killpg(first.pid, signal.SIGINT)
        first.communicate(timeout=20)


def test_stop_stops_the_loop_and_nothing_restarts(ws: Workspace) -> None:
    ws.write_config(["--sleep", "60", "--grandchild", "--setsid-grandchild"])
    loop = ws.start_cli("--project", "p", "--task", "t", "x")
    pids = wait_for(lambda: len(ws.agent_pids()) == 3 and ws.agent_pids(), what="3 processes")
    stopped = ws.cli("stop", "--project", "p", "--task", "t")
    assert stopped.returncode == 0, stopped.stderr
    assert "task p/t stopped" in stopped.stdout
    _, err = loop.communicate(timeout=20)
    assert loop.returncode == ExitCode.STOPPED, err
    assert not [p for p in pids if alive(p)]
    (info,) = ws.runs()
    assert info.status is RunStatus.STOPPED
    status = json.loads(ws.cli("status", "--project", "p", "--task", "t", "--json").stdout)
    assert status["status"] == "stopped"
    again = ws.cli("stop", "--project", "p", "--task", "t")
    assert again.returncode == 0 and "not running" in again.stdout


def test_ctrl_c_stops_the_loop_and_the_whole_tree(ws: Workspace) -> None:
    ws.write_config(["--sleep", "60", "--setsid-grandchild", "--ignore-term"])
    loop = ws.start_cli("--project", "p", "--task", "t", "x")
    pids = wait_for(lambda: len(ws.agent_pids()) == 2 and ws.agent_pids(), what="2 processes")
    os.killpg(loop.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
    _, err = loop.communicate(timeout=20)
    assert loop.returncode == ExitCode.STOPPED, err
    assert "task p/t stopped" in err
    assert not [p for p in pids if alive(p)]
    assert [r.status for r in ws.runs()] == [RunStatus.STOPPED]


@pytest.mark.parametrize("group", [False, True], ids=["alone", "whole-group"])
def test_sigkill_of_the_supervisor_takes_the_agent_tree_down_and_the_run_reads_lost(
    ws: Workspace, group: bool
) -> None:
    ws.write_config(["--sleep", "60", "--grandchild", "--setsid-grandchild", "--orphan"])
    # In its own session and group, as `timeout`, a CI runner or a shell's job control starts it.
    loop = ws.start_cli("--project", "p", "--task", "t", "x")
    pids = wait_for(lambda: len(ws.agent_pids()) == 4 and ws.agent_pids(), what="4 processes")
    if group:  # `timeout -s KILL`, a CI job's cancel: every process of the group at once
        os.killpg(loop.pid, signal.SIGKILL)
    else:
        os.kill(loop.pid, signal.SIGKILL)
    loop.communicate(timeout=60)
    wait_for(lambda: not [p for p in pids if alive(p)], timeout=60, what="the tree to die")
    wait_for(lambda: not ws.leftovers(), timeout=60, what="no process of the run, reaper included")
    # Until someone writes it, the run is shown as lost by every reader...
    status = json.loads(ws.cli("status", "--project", "p", "--task", "t", "--json").stdout)
    assert status["status"] == "lost"
    assert status["latest_run"]["status"] == "lost"
    listed = ws.cli("list", "--project", "p", "--task", "t", "--json")
    assert json.loads(listed.stdout)[0]["status"] == "lost"
    # ...and the next supervisor of the task writes it down, and is not blocked by a stale lock.
    ws.write_config(["--exit", "0"])
    resumed = ws.cli("resume", "--project", "p", "--task", "t")
    assert resumed.returncode == 0, resumed.stderr
    first, second = ws.runs()
    assert first.status is RunStatus.LOST and first.reason == "supervisor_lost"
    assert second.status is RunStatus.COMPLETED and second.previous_run_id == first.run_id


def test_resume_runs_the_loop_again_from_task_md(ws: Workspace) -> None:
    ws.write_config(["--exit", "1"], max_restarts=0)
    assert ws.cli("--project", "p", "--task", "t", "original prompt").returncode == 1
    ws.write_config(["--echo-stdin"])
    resumed = ws.cli("resume", "--project", "p", "--task", "t")
    assert resumed.returncode == 0, resumed.stderr
    last = ws.runs()[-1]
    stdout = ws.task().run(last.run_id).stdout.read_text()
    assert stdout.endswith("## Task\n\noriginal prompt\n")
    assert "## Previous run of this task" in stdout
    done = ws.cli("resume", "--project", "p", "--task", "t")
    assert done.returncode == ExitCode.USAGE and "already completed" in done.stderr


def test_run_and_resume_share_one_rule_for_a_completed_task(ws: Workspace) -> None:
    assert ws.invoke("-p", "p", "-t", "t", "the prompt").returncode == 0
    for args in (["-p", "p", "-t", "t", "the prompt"], ["resume", "-p", "p", "-t", "t"]):
        refused = ws.invoke(*args)
        assert refused.returncode == ExitCode.USAGE
        assert "already completed" in one_line(refused.stderr) and "--again" in refused.stderr
    assert len(ws.runs()) == 1
    again = ws.invoke("-p", "p", "-t", "t", "--again", "the prompt")
    assert again.returncode == 0 and len(ws.runs()) == 2
    first = ws.runs()[0]
    assert (ws.task().run_folder(first.run_id) / "DONE").exists()  # archived, not lost
    assert ws.invoke("resume", "-p", "p", "-t", "t", "--again").returncode == 0
    assert len(ws.runs()) == 3


def test_a_run_started_by_an_agent_records_its_parent(ws: Workspace) -> None:
    proc = ws.cli("--project", "p", "--task", "child", "x", env={"JRUN_ID": "20260101-000000000-1"})
    assert proc.returncode == 0, proc.stderr
    (info,) = ws.runs("p", "child")
    assert info.parent_run_id == "20260101-000000000-1"


def test_the_agent_finds_run_agent_on_its_path(ws: Workspace) -> None:
    ws.write_config(["--echo-env", "PATH"])
    assert ws.cli("--project", "p", "--task", "t", "x").returncode == 0
    out = ws.task().run(ws.runs()[0].run_id).stdout.read_text()
    first = out.strip().split("=", 1)[1].split(os.pathsep)[0]
    assert first == os.path.dirname(sys.executable)


def test_list_status_and_output(ws: Workspace) -> None:
    ws.write_config(["--lines", "2", "--stderr", "err text"])
    assert ws.cli("--project", "p", "--task", "t", "the prompt").returncode == 0
    listed = ws.cli("list")
    assert listed.returncode == 0
    assert listed.stdout.splitlines()[0].split() == [
        "PROJECT",
        "TASK",
        "STATUS",
        "RUNS",
        "LATEST",
        "RUN",
    ]
    assert listed.stdout.splitlines()[1].split()[:4] == ["p", "t", "completed", "1"]
    tasks_json = json.loads(ws.cli("list", "--json").stdout)
    assert tasks_json[0]["status"] == "completed" and tasks_json[0]["runs"] == 1
    runs_json = json.loads(ws.cli("list", "-p", "p", "-t", "t", "--json").stdout)
    assert runs_json[0]["exit_code"] == 0
    assert ws.cli("output", "-p", "p", "-t", "t").stdout == "line 1\nline 2\n"
    assert ws.cli("output", "-p", "p", "-t", "t", "--file", "stderr").stdout == "err text\n"
    prompt = ws.cli("output", "-p", "p", "-t", "t", "--file", "prompt").stdout
    assert prompt.endswith("the prompt\n")
    as_json = json.loads(ws.cli("output", "-p", "p", "-t", "t", "--json").stdout)
    assert as_json["content"] == "line 1\nline 2\n"
    text = ws.cli("status", "-p", "p", "-t", "t").stdout
    assert "p/t: completed (1 run)" in text


def test_output_follow_streams_across_restarts_until_the_loop_ends(ws: Workspace) -> None:
    go = ws.path / "go"
    ws.write_config(
        ["--fail-first", "1", "--lines", "3", "--interval", "0.05", "--wait-for", str(go)]
    )
    loop = ws.start_cli("--project", "p", "--task", "t", "x")
    try:
        wait_for(lambda: ws.runs(), what="the first run")
        follow = subprocess.Popen(
            ws.cli_argv("output", "-p", "p", "-t", "t", "--follow"),  # stdout by default
            cwd=ws.path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert follow.stdout is not None
        # The first run's lines arrive while it waits for `go`: only then may the loop go on,
        # so the follower is surely on the first run when the second begins.
        first_lines = [follow.stdout.readline() for _ in range(3)]
        go.touch()
        rest, err = follow.communicate(timeout=30)
    finally:
        loop.communicate(timeout=30)
    out = "".join(first_lines) + rest
    assert out == "line 1\nline 2\nline 3\n" * 2  # both attempts, nothing lost or repeated
    first, second = ws.runs()
    assert f"--- run {first.run_id} ended; next run {second.run_id} ---" in err


def test_output_of_a_live_run_shows_its_stdout_and_an_empty_file_says_why(ws: Workspace) -> None:
    go = ws.path / "go"
    ws.write_config(["--lines", "2", "--wait-for", str(go)], max_restarts=0)
    loop = ws.start_cli("--project", "p", "--task", "t", "x")
    try:
        wait_for(lambda: ws.cli("output", "-p", "p", "-t", "t").stdout == "line 1\nline 2\n",
                 what="the live run's stdout by default")  # fmt: skip
        empty = ws.cli("output", "-p", "p", "-t", "t", "--file", "stderr")
        assert empty.stdout == "" and "still empty" in empty.stderr
    finally:
        go.touch()
        loop.communicate(timeout=30)
    assert ws.cli("output", "-p", "p", "-t", "t").stdout == "line 1\nline 2\n"  # output.md now


def test_config_is_found_in_the_current_folder_and_runs_root_is_relative_to_it(
    ws: Workspace,
) -> None:
    ws.config.write_text(
        "agents:\n  echo:\n    type: command\n"
        f"    command: [{sys.executable}, -c, 'print(1)']\n"
        "defaults:\n  agent: echo\nstorage:\n  runs_dir: my-runs\n"
    )
    assert ws.cli("--project", "p", "--task", "t", "x").returncode == 0
    assert (ws.path / "my-runs" / "p" / "t" / "TASK.md").exists()


def test_the_example_config_in_the_repository_is_valid(ws: Workspace) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "runagent", "list", "--config", str(REPO / "config.yaml"),
         "--root", str(ws.root)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_prompts_that_are_not_text_or_are_empty_are_refused(ws: Workspace) -> None:
    bad = ws.path / "bad.txt"
    bad.write_bytes(b"\xff\xfe not utf-8")
    proc = ws.cli("--project", "p", "--task", "t", "--prompt-file", str(bad))
    assert proc.returncode == ExitCode.USAGE
    assert "is not UTF-8 text" in one_line(proc.stderr)
    empty = ws.cli("--project", "p", "--task", "t2", "-", input="  \n")
    assert empty.returncode == ExitCode.USAGE
    assert "the prompt on standard input is empty" in one_line(empty.stderr)
    piped = ws.cli("--project", "p", "--task", "t3", "-", input="from stdin\n")
    assert piped.returncode == 0
    assert ws.task("p", "t3").task_md.read_text() == "from stdin\n"


def test_a_runs_root_that_cannot_be_created_is_one_line(ws: Workspace) -> None:
    blocker = ws.path / "blocker"
    blocker.write_text("a file where a folder should be")
    proc = ws.cli("--project", "p", "--task", "t", "--root", str(blocker / "runs"), "x")
    assert proc.returncode == ExitCode.FAILED
    assert "blocker" in one_line(proc.stderr)


def test_the_agent_inherits_no_descriptor_but_its_stdio(ws: Workspace) -> None:
    ws.write_config(["--echo-fds"])
    assert ws.cli("--project", "p", "--task", "t", "x").returncode == 0
    out = ws.task().run(ws.runs()[0].run_id).stdout.read_text()
    assert out.split() == ["0", "1", "2"]  # no lock, no pipe, no wake-up descriptor


def _fill_the_disk_under(loop: subprocess.Popen[str], max_file_size: int) -> None:
    """From now on, any file the supervisor writes fails past `max_file_size` bytes (EFBIG).

    A real kernel refusal of a real write, in the running supervisor only (its agent already
    runs and keeps its own limit), as a full disk refuses the write that needs one block more.
    """
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.prlimit(loop.pid, resource.RLIMIT_FSIZE, (max_file_size, hard))


def _start_a_run_with_output_bigger_than(ws: Workspace, size: int) -> subprocess.Popen[str]:
    """A supervisor whose agent has written more than `size` bytes and waits for `ws/go`."""
    ws.write_config(["--lines", "2000", "--wait-for", str(ws.path / "go")])
    loop = ws.start_cli("--project", "p", "--task", "t", "x")

    def written() -> bool:
        runs = ws.runs()
        return bool(runs) and ws.task().run(runs[0].run_id).stdout.stat().st_size > size

    wait_for(written, what="the agent's output")
    return loop


def test_a_full_disk_writing_output_md_fails_the_run_and_says_which_file(ws: Workspace) -> None:
    loop = _start_a_run_with_output_bigger_than(ws, 8192)
    _fill_the_disk_under(loop, 4096)
    (ws.path / "go").touch()
    _, err = loop.communicate(timeout=30)
    assert loop.returncode == ExitCode.FAILED, err
    assert "Traceback" not in err
    why = "File too large writing output.md; output.md is truncated"
    assert why in err.strip().splitlines()[-1]
    assert "agent-stdout.txt" not in err
    (info,) = ws.runs()  # a full disk is not something a restart fixes
    assert info.status is RunStatus.FAILED and info.reason == "write_error"
    assert info.exit_code == 0 and why in (info.message or "")
    status = json.loads(ws.cli("status", "-p", "p", "-t", "t", "--json").stdout)
    assert status["status"] == "failed" and why in status["latest_run"]["message"]


def test_a_run_whose_run_info_could_not_be_written_is_not_called_lost(ws: Workspace) -> None:
    loop = _start_a_run_with_output_bigger_than(ws, 8192)
    _fill_the_disk_under(loop, 64)  # run-info.yaml does not fit either
    (ws.path / "go").touch()
    _, err = loop.communicate(timeout=30)
    assert loop.returncode == ExitCode.FAILED, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert "File too large writing run-info.yaml" in last and "not recorded" in last
    # On disk the run still says `running`; every reader tells why, not "its supervisor died".
    text = ws.cli("status", "-p", "p", "-t", "t").stdout
    assert "p/t: failed" in text and "File too large writing run-info.yaml" in text
    listed = json.loads(ws.cli("list", "-p", "p", "-t", "t", "--json").stdout)
    assert listed[0]["status"] == "failed" and listed[0]["reason"] == "write_error"
    # The next supervisor writes it down as such, not as lost.
    ws.write_config(["--exit", "0"])
    assert ws.cli("resume", "-p", "p", "-t", "t").returncode == 0
    first, second = ws.runs()
    assert first.status is RunStatus.FAILED and first.reason == "write_error"
    assert "File too large writing run-info.yaml" in (first.message or "")
    assert second.status is RunStatus.COMPLETED


def hostile_files(ws: Workspace) -> None:
    """The bad files the hostile invocations below name, relative to the workspace."""
    (ws.path / "folder").mkdir()
    (ws.path / "empty.yaml").write_text("")
    (ws.path / "list.yaml").write_text("- a\n- b\n")
    (ws.path / "broken.yaml").write_text("agents: [\n")
    (ws.path / "latin1.yaml").write_bytes("agents: {caf\xe9: {}}\n".encode("latin-1"))
    (ws.path / "nul.txt").write_bytes(b"fix the\0bug\n")


OK = ["-p", "p", "-t", "t"]  # a good task, so that only the value under test is bad
HOSTILE = [
    ([*OK, "--restart-delay", "inf", "x"], "'inf'"),
    ([*OK, "--restart-delay", "1e12", "x"], "'1e12'"),
    ([*OK, "--restart-delay", "nan", "x"], "'nan'"),
    ([*OK, "--restart-delay", "-1", "x"], "'-1'"),
    ([*OK, "--timeout", "1e400", "x"], "'1e400'"),
    ([*OK, "--timeout", "99999999d", "x"], "'99999999d'"),
    ([*OK, "--idle-timeout", "inf", "x"], "'inf'"),
    ([*OK, "--idle-timeout", "-5m", "x"], "'-5m'"),
    ([*OK, "--max-restarts", "nan", "x"], "'nan'"),
    ([*OK, "--max-restarts", "-1", "x"], "-1"),
    ([*OK, "--max-restarts", "1e3", "x"], "'1e3'"),
    ([*OK, "--until", "never", "x"], "'never'"),
    (["-p", "p", "-t", "", "x"], "task id is empty"),
    (["job", "-p", "p", "-t", "", "x"], "task id is empty"),
    (["-p", "", "-t", "t", "x"], "project id is empty"),
    (["-p", "p", "-t", "-q", "x"], "task id '-q'"),  # -t missing its value
    (["-p", "p", "-t", "a b", "x"], "task id 'a b'"),
    (["-p", "p/q", "-t", "t", "x"], "project id 'p/q'"),
    (["-p", "p", "-t", "t" * 300, "x"], "300 characters"),
    ([*OK, "--agent", "", "x"], "--agent ''"),
    ([*OK, "--cwd", "", "x"], "'--cwd': '' is empty"),
    ([*OK, "--root", "", "x"], "'--root': '' is empty"),
    ([*OK, "--prompt-file", "missing.txt"], "'missing.txt'"),
    ([*OK, "--prompt-file", "folder"], "'folder'"),
    ([*OK, "--prompt-file", "nul.txt"], "'nul.txt' contains a NUL byte"),
    ([*OK, "--prompt-file", "/dev/zero"], "'/dev/zero' is a device, not a regular file"),
    (
        ["--issue", "1", "--repo", "folder", "--issue-body-file", "/dev/zero", "x"],
        "--issue-body-file '/dev/zero' is a device, not a regular file",
    ),
    ([*OK, "--config", "folder", "x"], "'folder'"),
    ([*OK, "--config", "", "x"], "'--config': '' is empty"),
    ([*OK, "--config", "list.yaml", "x"], "list.yaml: the file: expected a mapping"),
    ([*OK, "--config", "broken.yaml", "x"], "broken.yaml: not valid YAML"),
    ([*OK, "--config", "latin1.yaml", "x"], "latin1.yaml: not UTF-8"),
    ([*OK, "--config", "empty.yaml", "x"], "no agent"),
    (["list", "--config", "latin1.yaml"], "latin1.yaml: not UTF-8"),
    (["doctor", "--port", "-5"], "-5"),
    (["schedule", "list", "--count", "-1"], "-1"),
]


@pytest.mark.parametrize("args, fragment", HOSTILE, ids=[" ".join(a)[:60] for a, _ in HOSTILE])
def test_hostile_input_is_refused_in_one_line_before_any_run(
    ws: Workspace, args: list[str], fragment: str
) -> None:
    hostile_files(ws)
    proc = ws.invoke(*args)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert fragment in one_line(proc.stderr)
    assert not ws.agent_pids()  # no agent was started
    assert not ws.task().folder.exists()


@pytest.mark.parametrize("run_id", ["..", ".", "", "/etc", "../t", "r" * 300])
def test_output_of_a_bad_run_id_is_an_error(ws: Workspace, run_id: str) -> None:
    assert ws.cli(*OK, "x").returncode == 0
    proc = ws.invoke("output", *OK, "--run", run_id)
    assert proc.returncode == ExitCode.USAGE, proc.stdout
    line = one_line(proc.stderr)
    assert "run id" in line and (run_id[:40] in line or "is empty" in line)
    assert proc.stdout == ""


def test_a_prompt_in_task_md_with_a_nul_byte_starts_no_agent(ws: Workspace) -> None:
    ws.task().folder.mkdir(parents=True)
    ws.task().task_md.write_bytes(b"left by\0an API call")  # as a started task would hold it
    proc = ws.cli(*OK)
    assert proc.returncode == ExitCode.USAGE
    assert "contains a NUL byte" in one_line(proc.stderr)
    assert not ws.agent_pids() and not ws.runs()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["stauts", "-p", "p", "-t", "typo-test"], "did you mean `run-agent status`"),
        (["staus", "-p", "p", "-t", "t"], "did you mean `run-agent status`"),
        (["lsit"], "did you mean `run-agent list`"),
        (["-p", "p", "-t", "t", "status"], "looks like the command `status`"),
        (["-p", "p", "lsit"], "looks like the command `list`"),  # no -t: a typo, maybe
        (["-p", "p", "-t", "t", "Stop"], "looks like the command `stop`"),
        (["--root", "elsewhere", "-p", "p", "-t", "t", "stop"], "looks like the command `stop`"),
        (["hello", "-p", "p"], "unknown command 'hello'"),
        (
            ["job", "-p", "p", "-t", "t", "--max-restarts", "3", "x"],
            "--max-restarts does not apply",
        ),
    ],
)
def test_a_typo_or_an_option_a_command_ignores_never_starts_a_run(
    ws: Workspace, args: list[str], fragment: str
) -> None:
    proc = ws.invoke(*args)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert fragment in one_line(proc.stderr)
    assert not ws.agent_pids() and not ws.root.exists()


def test_a_one_word_prompt_that_looks_like_a_command_runs_when_run_is_spelled_out(
    ws: Workspace,
) -> None:
    assert ws.invoke("run", "-p", "p", "-t", "t", "status").returncode == 0
    assert ws.invoke("-p", "p", "-t", "t2", "fix the status line").returncode == 0
    assert ws.invoke("-p", "p", "-t", "t3", "refactor").returncode == 0  # no command is close


@pytest.mark.parametrize("position", ["before", "after", "equals"])
def test_config_and_root_work_before_or_after_the_command_name(
    ws: Workspace, position: str
) -> None:
    other = ws.path / "other-root"
    assert ws.invoke("--root", str(other), "-p", "demo", "-t", "t", "go").returncode == 0
    given = ["--root", str(other), "--config", str(ws.config)]
    equals = [f"--root={other}", f"--config={ws.config}"]
    common = {"before": given, "after": [], "equals": equals}[position]
    tail = given if position == "after" else []
    listed = ws.invoke(*common, "list", "-p", "demo", "--json", *tail)
    assert listed.returncode == 0, listed.stderr
    assert [t["task_id"] for t in json.loads(listed.stdout)] == ["t"]
    schedules = ws.invoke(*common, "schedule", "list", *tail)
    assert schedules.returncode == 0, schedules.stderr
    assert len(ws.agent_pids()) == 1  # the one run above; no listing became a run


def test_doctor_without_a_config_says_what_is_missing(ws: Workspace) -> None:
    bare = ws.path / "bare"
    bare.mkdir()
    env = {"RUN_AGENT_CONFIG": "", "XDG_CONFIG_HOME": str(bare), "HOME": str(bare)}
    proc = subprocess.run(
        ws.cli_argv("doctor", "--port", "0"), cwd=bare, env={**os.environ, **env},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == ExitCode.MISSING_DEPENDENCY, proc.stdout
    assert "everything run-agent needs is in place" not in proc.stdout
    assert "no config.yaml found" in proc.stdout
    assert "a run without --agent fails; set defaults.agent" in proc.stdout
    ran = subprocess.run(
        ws.cli_argv("-p", "p", "-t", "t", "x"), cwd=bare, env={**os.environ, **env},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == ExitCode.USAGE and "no agent" in ran.stderr


def test_shell_completion_completes_commands_as_the_readme_says(ws: Workspace) -> None:
    env = {**os.environ, "_RUN_AGENT_COMPLETE": "bash_complete", "COMP_WORDS": "run-agent st",
           "COMP_CWORD": "1"}  # fmt: skip
    done = subprocess.run(ws.cli_argv(), env=env, capture_output=True, text=True, timeout=60)
    words = {line.split(",")[-1] for line in done.stdout.splitlines()}
    assert {"status", "stop"} <= words, done.stdout + done.stderr
    readme = (REPO / "docs" / "reference" / "cli.md").read_text()
    assert "_RUN_AGENT_COMPLETE=bash_source run-agent" in readme


def test_every_option_of_every_command_has_help() -> None:
    import click

    from runagent.cli.group import cli

    def commands(group: click.Group, path: str) -> list[tuple[str, click.Command]]:
        found = []
        context = click.Context(group)
        for name in group.list_commands(context):  # imports each lazily registered command
            command = group.get_command(context, name)
            assert command is not None, name
            found.append((f"{path} {name}", command))
            if isinstance(command, click.Group):
                found += commands(command, f"{path} {name}")
        return found

    missing = [
        f"{where} {param.opts[0]}"
        for where, command in commands(cli, "run-agent")
        for param in command.params
        if isinstance(param, click.Option) and not param.hidden and not param.help
        and param.opts[0] not in ("--help",)
    ]  # fmt: skip
    assert not missing


def test_attempt_numbers_go_on_across_a_resume(ws: Workspace) -> None:
    ws.write_config(["--exit", "1"], max_restarts=1)
    first = ws.invoke("-p", "p", "-t", "t", "the prompt")
    assert first.returncode == ExitCode.FAILED
    assert "gave up after 2 failed attempts" in first.stderr
    ws.write_config(["--exit", "0"], max_restarts=1)
    resumed = ws.invoke("resume", "-p", "p", "-t", "t")
    assert resumed.returncode == 0, resumed.stderr
    assert [r.attempt for r in ws.runs()] == [1, 2, 3]  # never "#1 #1"
    assert [r.last_attempt for r in ws.runs()] == [2, 2, 4]  # what the page's "N of M" shows
    assert "attempt 3/4: run" in resumed.stderr and "(attempt 3)" in resumed.stderr


def test_resume_runs_the_task_as_it_was_started_and_remembers_what_it_changes(
    ws: Workspace,
) -> None:
    elsewhere = ws.path / "work"
    elsewhere.mkdir()
    ws.write_config(["--exit", "1"], agents={"ticker": ["--echo-env", "PWD", "--exit", "1"]},
                    max_restarts=0)  # fmt: skip
    started = ws.invoke("-p", "p", "-t", "t", "--agent", "ticker", "--cwd", str(elsewhere),
                        "--timeout", "5m", "the prompt")  # fmt: skip
    assert started.returncode == ExitCode.FAILED
    resumed = ws.invoke("resume", "-p", "p", "-t", "t")  # from the workspace, no options
    assert resumed.returncode == ExitCode.FAILED
    second = ws.runs()[1]
    assert second.agent == "ticker" and second.cwd == str(elsewhere)
    status = ws.invoke("status", "-p", "p", "-t", "t").stdout
    assert f"started with  agent ticker, cwd {elsewhere}, timeout 300" in status
    # An option given to resume wins, and is remembered for the next one.
    assert ws.invoke("resume", "-p", "p", "-t", "t", "--agent", "fake").returncode == 1
    assert ws.invoke("resume", "-p", "p", "-t", "t").returncode == 1
    assert [r.agent for r in ws.runs()] == ["ticker", "ticker", "fake", "fake"]
    assert {r.cwd for r in ws.runs()} == {str(elsewhere)}


def test_without_a_config_runs_go_to_one_place_and_every_empty_answer_says_which(
    ws: Workspace,
) -> None:
    home, one, two = ws.path / "home", ws.path / "one", ws.path / "two"
    for folder in (home, one, two):
        folder.mkdir()
    env = {**os.environ, "HOME": str(home), "RUN_AGENT_CONFIG": "", "XDG_CONFIG_HOME": "",
           "XDG_DATA_HOME": "", "RUN_AGENT_ROOT": ""}  # fmt: skip

    def cli(folder: object, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(ws.cli_argv(*args), cwd=folder, env=env, capture_output=True,
                              text=True, timeout=60)  # fmt: skip

    default_root = home / ".local/share/run-agent/runs"
    said = f"no tasks under {default_root} (the runs root from the default, as no config.yaml"
    assert said in cli(one, "list").stderr
    assert said in cli(two, "list").stderr  # the same place, whatever the current folder
    missing = cli(two, "status", "-p", "p", "-t", "nope")
    assert missing.returncode == ExitCode.USAGE
    assert (
        str(default_root) in missing.stderr and "the runs root from the default" in missing.stderr
    )
    rooted = cli(two, "--root", str(ws.root), "list")
    assert f"no tasks under {ws.root} (the runs root from --root)" in rooted.stderr
    configured = subprocess.run(ws.cli_argv("list", "-p", "nope"), cwd=ws.path, env=env,
                                capture_output=True, text=True, timeout=60)  # fmt: skip
    assert f"storage.runs_dir in {ws.config}" in configured.stderr


def test_a_reader_that_stops_reading_is_not_an_error(ws: Workspace) -> None:
    """`run-agent backends | head -1`: the pipe closes early; no 'Broken pipe', exit 0."""
    proc = subprocess.Popen(ws.cli_argv("backends"), cwd=ws.path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # as `head -1` does once it has its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0
    assert "Broken pipe" not in err and "Traceback" not in err, err


def test_status_sums_what_a_tasks_runs_used(ws: Workspace) -> None:
    """A claude-type agent (the fake agent replaying claude's real stream) run twice."""
    sample = (REPO / "tests/samples/claude-text.stdout.jsonl").read_bytes().hex()
    replay = ws.agent_argv(["--ignore-unknown", "--chunks", sample])
    ws.config.write_text(yaml.safe_dump({
        "agents": {"claudeish": {"type": "claude", "permissions": "none", "command": replay}},
        "defaults": {"agent": "claudeish", "max_restarts": 0},
        "storage": {"runs_dir": str(ws.root)},
    }))  # fmt: skip
    assert ws.invoke("-p", "p", "-t", "t", "x").returncode == 0, ws.runs()
    assert ws.invoke("-p", "p", "-t", "t", "--again", "x").returncode == 0
    assert [(r.tokens_in, r.tokens_out) for r in ws.runs()] == [(10, 5), (10, 5)]
    status = ws.invoke("status", "-p", "p", "-t", "t")
    assert "usage         20 tokens in, 10 out, $0.0003" in status.stdout
    data = json.loads(ws.invoke("status", "-p", "p", "-t", "t", "--json").stdout)
    assert data["usage"]["tokens_in"] == 20 and data["usage"]["cost_usd"] == pytest.approx(0.00028)
    runs = json.loads(ws.invoke("list", "-p", "p", "-t", "t", "--json").stdout)
    assert runs[0]["tokens_out"] == 5
    # Summed per task in every listing, and per project.
    listed = json.loads(ws.invoke("list", "--json").stdout)
    assert listed[0]["usage"]["tokens_in"] == 20
    assert "p: 20 tokens in, 10 out, $0.0003" in ws.invoke("list").stdout
    from starlette.testclient import TestClient

    from server.app import Settings, create_app
    from tests.conftest import LOCAL

    with TestClient(create_app(Settings(root=ws.root)), base_url=LOCAL) as client:
        (project,) = client.get("/api/projects").json()
        assert project["usage"]["tokens_out"] == 10
        assert client.get("/api/tasks").json()[0]["usage"]["cost_usd"] == pytest.approx(0.00028)


def test_until_ready_marker_on_the_command_line(ws: Workspace) -> None:
    from tests.gitrepo import GIT_ENV, make_repo

    repo = make_repo(ws.path / "repo")
    ws.write_config(["--ready-from", "1"], env=GIT_ENV)
    proc = ws.cli("-p", "p", "-t", "t", "--until", "ready-marker", "--cwd", str(repo), "go")
    assert proc.returncode == ExitCode.COMPLETED, proc.stderr
    (info,) = ws.runs()
    assert info.reason is not None and info.reason.value == "ready_marker"
    plain = ws.path / "plain"  # in no git repository
    plain.mkdir()
    refused = ws.cli("-p", "p", "-t", "u", "--until", "ready-marker", "--cwd", str(plain), "go")
    assert refused.returncode == ExitCode.USAGE
    assert "is not in a git repository" in one_line(refused.stderr)
    assert not ws.task("p", "u").folder.exists()
