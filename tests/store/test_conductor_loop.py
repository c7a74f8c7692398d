"""Runs conductor-loop wrote, and run-agent runs its reconciler rewrote, read as run-agent's own.

Each record below is literal YAML exactly as conductor-loop's `RunInfo` struct marshals it with
yaml.v3 (internal/storage/runinfo.go; field by field in RESEARCH.md, Q4): int pid, pgid and
exit_code always present, RFC 3339 times unquoted, Go's zero time as a running run's end, the
`*,omitempty` fields left out when empty, and none of run-agent's attempt, backend, reason,
message, supervisor or host fields.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from runagent.errors import ExitCode
from runagent.store.runfolder import TaskPaths
from tests.conftest import FAKE_AGENT, Workspace

TASK = "task-20260205-125153-docs-user"  # the shape its write commands insist on

RUNNING = """\
version: 1
run_id: 20260205-1251540000-{pid}
project_id: conductor
task_id: task-20260205-125153-docs-user
agent: claude
pid: {pid}
pgid: {pid}
start_time: 2026-02-05T12:51:54.123456789Z
end_time: 0001-01-01T00:00:00Z
exit_code: -1
status: running
cwd: /home/user/project
prompt_path: {folder}/prompt.md
output_path: {folder}/output.md
stdout_path: {folder}/agent-stdout.txt
stderr_path: {folder}/agent-stderr.txt
commandline: claude -p --input-format stream-json --output-format stream-json --verbose
"""

FAILED = """\
version: 1
run_id: 20260205-1240000000-87000
project_id: conductor
task_id: task-20260205-125153-docs-user
agent: codex
pid: 87000
pgid: 87000
start_time: 2026-02-05T12:40:00Z
end_time: 2026-02-05T12:41:30.5Z
exit_code: 1
status: failed
cwd: /home/user/project
stdout_path: /runs/conductor/task-20260205-125153-docs-user/runs/x/agent-stdout.txt
error_summary: 'agent exited with code 1: rate limit reached'
agent_version: 0.98.0
"""

COMPLETED = """\
version: 1
run_id: 20260205-1245000000-87500
previous_run_id: 20260205-1240000000-87000
project_id: conductor
task_id: task-20260205-125153-docs-user
agent: codex
pid: 87500
pgid: 87500
start_time: 2026-02-05T12:45:00Z
end_time: 2026-02-05T12:50:00Z
exit_code: 0
status: completed
agent_version: 0.98.0
"""

# A run-agent run whose supervisor died, after conductor-loop's `status` reconciled it: the
# file rewritten through its struct, run-agent's own fields gone, the status its own.
RECONCILED = """\
version: 1
run_id: {run_id}
project_id: p
task_id: t
agent: fake
pid: {pid}
pgid: {pid}
start_time: 2026-02-05T12:51:54.123Z
end_time: 2026-02-05T13:00:00Z
exit_code: -1
status: failed
cwd: {cwd}
commandline: {commandline}
error_summary: process {pid} is not running (reconciled)
"""


def write_run(root: Path, text: str, task: str = TASK) -> Path:
    run_id = text.split("run_id: ", 1)[1].split("\n", 1)[0]
    folder = TaskPaths(root, "conductor", task).run_folder(run_id)
    folder.mkdir(parents=True)
    for name in ("agent-stdout.txt", "agent-stderr.txt", "prompt.md"):
        (folder / name).write_text("")
    (folder / "run-info.yaml").write_text(text)
    return folder


def listed(ws: Workspace, project: str = "conductor", task: str = TASK) -> list[dict[str, object]]:
    proc = ws.cli("list", "-p", project, "-t", task, "--json")
    assert proc.returncode == 0, proc.stderr
    rows: list[dict[str, object]] = json.loads(proc.stdout)
    return rows


def test_conductor_loop_runs_are_read_with_its_status_and_error_summary(ws: Workspace) -> None:
    write_run(ws.root, FAILED)
    write_run(ws.root, COMPLETED)
    failed, completed = listed(ws)
    assert failed["status"] == "failed" and failed["exit_code"] == 1
    assert failed["message"] == "agent exited with code 1: rate limit reached"
    assert failed["backend"] == "codex" and failed["attempt"] == 1
    assert failed["end_time"] == "2026-02-05T12:41:30.500000+00:00"
    assert completed["status"] == "completed" and completed["attempt"] == 2
    assert completed["previous_run_id"] == failed["run_id"]
    status = ws.cli("status", "-p", "conductor", "-t", TASK)
    assert f"conductor/{TASK}: completed (2 runs)" in status.stdout, status.stdout


def test_a_live_conductor_loop_run_is_running_and_kept_then_lost(ws: Workspace) -> None:
    agent = subprocess.Popen(
        [sys.executable, str(FAKE_AGENT), "--marker", ws.marker, "--wait-for", str(ws.path / "go")]
    )
    try:
        task = TaskPaths(ws.root, "conductor", TASK)
        folder = task.run_folder(f"20260205-1251540000-{agent.pid}")
        write_run(ws.root, RUNNING.format(pid=agent.pid, folder=folder))
        # A running run has no end: gc dates it by its folder, which must be older than the
        # rule below however fast the test gets there.
        os.utime(folder, (time.time() - 3600, time.time() - 3600))
        (run,) = listed(ws)
        assert run["status"] == "running" and run["exit_code"] is None
        assert run["end_time"] is None  # Go's zero time is no end
        assert run["pid"] == agent.pid and run["start_time"].startswith("2026-02-05T12:51:54.1")
        # No run-agent lock holds the task, but the run's process is alive: never removed.
        gc = ws.cli("gc", "--older-than", "1s")
        assert gc.returncode == 0 and folder.is_dir()
        assert f"keeping conductor/{TASK}/{folder.name}: its process is alive" in gc.stderr
        refused = ws.cli("delete", "-p", "conductor", "-t", TASK, "--yes")
        assert refused.returncode == ExitCode.ALREADY_RUNNING, refused.stderr
        assert "its process is alive" in refused.stderr and "--force" in refused.stderr
        assert folder.is_dir()
    finally:
        agent.kill()
        agent.wait()
    assert listed(ws)[0]["status"] == "lost"
    assert ws.cli("gc", "--older-than", "1s").returncode == 0
    assert not folder.exists()


def test_a_run_agent_run_conductor_loop_reconciled_is_read_and_resumed(ws: Workspace) -> None:
    ws.write_config(["--exit", "1"], max_restarts=0)
    assert ws.cli("-p", "p", "-t", "t", "x").returncode == ExitCode.FAILED
    (before,) = ws.runs()
    folder = ws.task().run_folder(before.run_id)
    (folder / "run-info.yaml").write_text(
        RECONCILED.format(
            run_id=before.run_id, pid=before.pid, cwd=before.cwd, commandline=before.commandline
        )
    )
    (run,) = listed(ws, "p", "t")
    assert run["status"] == "failed" and run["backend"] == "fake" and run["attempt"] == 1
    assert run["message"] == f"process {before.pid} is not running (reconciled)"
    assert "p/t: failed (1 run)" in ws.cli("status", "-p", "p", "-t", "t").stdout
    ws.write_config(["--exit", "0"])
    assert ws.cli("resume", "-p", "p", "-t", "t").returncode == 0
    first, second = ws.runs()
    assert first.run_id == before.run_id and first.status.value == "failed"
    assert second.attempt == 2 and second.previous_run_id == before.run_id


def test_a_status_run_agent_does_not_know_shows_the_run_unreadable(ws: Workspace) -> None:
    folder = write_run(ws.root, COMPLETED.replace("status: completed", "status: unknown"))
    (run,) = listed(ws)
    assert run["status"] == "unreadable" and run["run_id"] == folder.name
    assert "status 'unknown' is none run-agent knows" in str(run["message"])
    shown = ws.cli("status", "-p", "conductor", "-t", TASK).stdout
    assert f"conductor/{TASK}: unreadable" in shown and "'unknown'" in shown


def test_a_checked_run_conductor_loop_reconciled_reads_as_failed(ws: Workspace) -> None:
    # conductor-loop's struct drops the check's fields (and the reason) when its `status`
    # rewrites a run-agent run: it reads as a failed run, with its error summary as the message.
    ws.write_config(["--exit", "0"], max_restarts=0, check="false")
    assert ws.cli("-p", "p", "-t", "t", "x").returncode == ExitCode.FAILED
    (before,) = ws.runs()
    assert before.check_exit_code == 1 and before.reason is not None
    folder = ws.task().run_folder(before.run_id)
    text = (folder / "run-info.yaml").read_text()
    assert "check_exit_code: 1" in text and "reason: check_failed" in text
    (folder / "run-info.yaml").write_text(
        RECONCILED.format(
            run_id=before.run_id, pid=before.pid, cwd=before.cwd, commandline=before.commandline
        )
    )
    (run,) = listed(ws, "p", "t")
    assert run["status"] == "failed" and "check_exit_code" not in run


# conductor-loop's own examples/hello-world/expected-output/run-info.yaml, as it ships: an older
# shape (`agent_type`, `restart_count`, no version, no cwd) that its reader still reads, each
# field it lacks at its zero value.
HELLO_WORLD = """\
run_id: run_20260205-115154-12345
project_id: hello-world
task_id: greeting
agent_type: codex
status: completed
start_time: 2026-02-05T11:51:54Z
end_time: 2026-02-05T11:52:10Z
exit_code: 0
pid: 12345
pgid: 12345
restart_count: 0
parent_run_id: ""
"""


def test_a_record_lacking_fields_reads_as_conductor_loops_reader_reads_it(ws: Workspace) -> None:
    folder = TaskPaths(ws.root, "hello-world", "greeting").run_folder("run_20260205-115154-12345")
    folder.mkdir(parents=True)
    (folder / "run-info.yaml").write_text(HELLO_WORLD)
    (run,) = listed(ws, "hello-world", "greeting")
    assert run["status"] == "completed" and run["exit_code"] == 0, run
    assert run["agent"] == "" and run["attempt"] == 1 and run["cwd"] == ""
    assert run["parent_run_id"] is None  # an empty string is none, as its omitempty writes it
    shown = ws.cli("status", "-p", "hello-world", "-t", "greeting")
    assert "hello-world/greeting: completed (1 run)" in shown.stdout, shown.stdout
    # Its reader takes the run id, project and task from the path where the file has none.
    bare = TaskPaths(ws.root, "conductor", TASK).run_folder("20260205-1245000000-87500-1")
    bare.mkdir(parents=True)
    (bare / "run-info.yaml").write_text("status: failed\nexit_code: 3\n")
    (run,) = listed(ws)
    assert (run["run_id"], run["project_id"], run["task_id"]) == (bare.name, "conductor", TASK)
    assert run["status"] == "failed" and run["exit_code"] == 3 and run["start_time"] == ""


def test_a_run_folder_without_a_record_shifts_no_attempt_number(ws: Workspace) -> None:
    task = TaskPaths(ws.root, "conductor", TASK)
    task.run_folder("20260205-1200000000-1-1").mkdir(parents=True)  # made, nothing written yet
    write_run(ws.root, FAILED)
    write_run(ws.root, COMPLETED)
    assert [r["attempt"] for r in listed(ws)] == [1, 2]


def test_a_live_conductor_loop_run_shows_its_task_running_and_its_output_live(
    ws: Workspace,
) -> None:
    """conductor-loop holds no run-agent lock: a run of its own whose process is alive (one it
    started, or an `external` one it only watches) is its task running, not lost, and `output`
    prints what it writes rather than saying the run ended."""
    agent = subprocess.Popen(
        [sys.executable, str(FAKE_AGENT), "--marker", ws.marker, "--wait-for", str(ws.path / "go")]
    )
    try:
        task = TaskPaths(ws.root, "conductor", TASK)
        run_id = f"20260205-1251540000-{agent.pid}-1"
        folder = task.run_folder(run_id)
        text = RUNNING.format(pid=agent.pid, folder=folder).replace(
            f"20260205-1251540000-{agent.pid}", run_id
        )
        write_run(
            ws.root, text.replace("status: running", "process_ownership: external\nstatus: running")
        )
        (folder / "agent-stdout.txt").write_text("working\n")
        shown = ws.cli("status", "-p", "conductor", "-t", TASK, "--json")
        assert json.loads(shown.stdout)["status"] == "running", shown.stdout
        out = ws.cli("output", "-p", "conductor", "-t", TASK)
        assert out.returncode == 0 and out.stdout == "working\n", out.stderr
        assert "ended" not in out.stderr
    finally:
        agent.kill()
        agent.wait()
    shown = ws.cli("status", "-p", "conductor", "-t", TASK, "--json")
    assert json.loads(shown.stdout)["status"] == "lost"
