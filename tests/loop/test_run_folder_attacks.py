"""What a sandboxed agent leaves in its own run folder (a link, a FIFO, a device in place of its
stdout or its run's record) is never followed or waited on by what reads the run afterwards or
beside it: real bubblewrap, a `type: command` agent running `python -c ...`, a runs root outside
/tmp and the home (`ws_outside`) and a fake home holding ~/.ssh."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from runagent.errors import ExitCode
from tests.conftest import Workspace, serving
from tests.loop.sandboxing import agent, needs_bwrap

pytestmark = needs_bwrap

KEY = "k" * 40


def test_a_stdout_link_never_brings_a_host_file_to_the_agent(
    ws_outside: Workspace, home: Path
) -> None:
    """The agent swaps its agent-stdout.txt for a link to ~/.ssh/id_ed25519; output.md, made on
    the host after the run, is the key, which its next attempt reads among its earlier runs."""
    ws = ws_outside
    key = home / ".ssh" / "id_ed25519"
    code = (
        "import glob, os, sys; rf, tf = os.environ['RUN_FOLDER'], os.environ['TASK_FOLDER'];"
        "old = [p for p in glob.glob(tf + '/runs/*/output.md') if not p.startswith(rf)];"
        "print('stolen: ' + open(old[0]).read()) if old else None;"
        "sys.exit(0) if old else None;"
        "os.unlink(rf + '/agent-stdout.txt');"
        f"os.symlink({str(key)!r}, rf + '/agent-stdout.txt'); sys.exit(1)"
    )
    agent(ws, code, max_restarts=1)
    done = ws.cli("-p", "p", "-t", "t", "go", env={"HOME": str(home)})
    assert done.returncode in (ExitCode.COMPLETED, ExitCode.FAILED), done.stderr
    task = ws.task("p", "t")
    for run in task.run_ids():
        output = task.run(run).output
        assert not output.exists() or "a private key" not in output.read_text()
        assert "a private key" not in task.run(run).stdout.read_text(errors="replace")


def test_a_stdout_fifo_never_stalls_the_loop(ws_outside: Workspace) -> None:
    """The agent leaves a FIFO as its agent-stdout.txt: making output.md opens it and waits for
    a writer forever (SIGTERM and `stop` do not end it; a link to /dev/zero eats the memory)."""
    ws = ws_outside
    code = (
        "import os; rf = os.environ['RUN_FOLDER']; os.unlink(rf + '/agent-stdout.txt');"
        "os.mkfifo(rf + '/agent-stdout.txt')"
    )
    agent(ws, code)
    proc = ws.start_cli("-p", "p", "-t", "t", "go")
    try:
        code_ = proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail("the loop never ended after its agent did (a FIFO as its stdout)")
    assert code_ in (ExitCode.COMPLETED, ExitCode.FAILED)  # it ended (its unlink is refused)


def test_the_agent_cannot_replace_its_output_files_and_its_record_comes_back(
    ws_outside: Workspace,
) -> None:
    """Its prompt.md, stdout and stderr are read-only over themselves inside the sandbox: a FIFO
    or a link cannot take their place (EBUSY), while its output still lands. Its run-info.yaml,
    which the supervisor replaces as the run goes on, it may replace: the supervisor's record
    is back when the run ends, and nothing read the FIFO meanwhile."""
    ws = ws_outside
    code = (
        "import os; rf = os.environ['RUN_FOLDER']\n"
        "for name in ('run-info.yaml', 'prompt.md', 'agent-stdout.txt', 'agent-stderr.txt'):\n"
        "    try:\n"
        "        os.unlink(rf + '/' + name); os.mkfifo(rf + '/' + name); print(name, 'replaced')\n"
        "    except OSError as e:\n"
        "        print(name, type(e).__name__)\n"
    )
    agent(ws, code)
    done = ws.cli("-p", "p", "-t", "t", "go")
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    (run,) = ws.runs()
    said = ws.task("p", "t").run(run.run_id).stdout.read_text()
    for name in ("prompt.md", "agent-stdout.txt", "agent-stderr.txt"):
        assert f"{name} OSError" in said, said
    assert run.status.value == "completed" and run.run_id in str(ws.task().run_folder(run.run_id))


def test_a_fifo_as_a_run_record_never_stalls_status_list_or_the_server(
    ws_outside: Workspace,
) -> None:
    """A FIFO, a link to a device or a huge file left as a run's run-info.yaml (by an agent
    without the sandbox, or any process) reads as an unreadable record, at once."""
    ws = ws_outside
    task = ws.task("p", "t")
    ws.write_config(["--write-done"])
    assert ws.cli("-p", "p", "-t", "t", "go").returncode == ExitCode.COMPLETED
    for made in ("fifo", "zero", "huge"):
        info = task.run(task.run_ids()[0]).info
        info.unlink()
        if made == "fifo":
            os.mkfifo(info)
        elif made == "zero":
            os.symlink("/dev/zero", info)
        else:
            with open(info, "wb") as f:
                f.truncate(1 << 31)  # sparse: 2 GiB that take no disk
        for args in (["status", "-p", "p", "-t", "t"], ["list", "--json"]):
            try:
                done = ws.cli(*args, timeout=20)
            except subprocess.TimeoutExpired:
                pytest.fail(f"`run-agent {' '.join(args)}` waited on a {made} run record")
            assert done.returncode == 0, (made, done.stderr)
        with serving(ws) as url:
            answer = httpx.get(f"{url}/api/tasks", timeout=20)
            assert answer.status_code == 200, answer.text


def test_a_stdout_link_to_a_device_never_fills_the_memory(ws_outside: Workspace) -> None:
    """Without the sandbox's read-only binds (an agent run before them, or any process), a
    link to /dev/zero left as agent-stdout.txt is removed once the agent has ended, never read."""
    ws = ws_outside
    code = (
        "import os; rf = os.environ['RUN_FOLDER']; os.unlink(rf + '/agent-stdout.txt');"
        "os.symlink('/dev/zero', rf + '/agent-stdout.txt')"
    )
    data = {
        "agents": {"evil": {"type": "command", "command": [sys.executable, "-c", code,
                                                           ws.marker]}},
        "defaults": {"agent": "evil", "max_restarts": 0, "until": "exit"},
        "storage": {"runs_dir": str(ws.root)},
    }  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))
    done = ws.cli("-p", "p", "-t", "t", "go", timeout=60)
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    (run,) = ws.runs()
    paths = ws.task("p", "t").run(run.run_id)
    assert not paths.stdout.is_symlink() and paths.stdout.read_text() == ""
    assert "removed what was no regular file: agent-stdout.txt" in paths.stderr.read_text()
