"""The agent itself under bubblewrap (`sandbox: bwrap`, `--sandbox bwrap`): real bwrap, the fake
agent probing what it can read, write and reach, a real stop and a real SIGKILL-proof tree."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from runagent.errors import ExitCode
from tests.conftest import Workspace, alive, wait_for
from tests.loop.sandboxing import needs_bwrap, probes, sandboxed

pytestmark = needs_bwrap


def test_the_agent_sees_its_folders_and_not_the_home_or_other_folders(
    ws: Workspace, tmp_path_factory: pytest.TempPathFactory
) -> None:
    home = tmp_path_factory.mktemp("home")
    (home / ".ssh").mkdir()
    secret = home / ".ssh" / "id_ed25519"
    secret.write_text("a private key")
    login = home / ".claude"  # what a CLI keeps: visible when its backend says so, not here
    login.mkdir()
    (login / "token").write_text("a login")
    elsewhere = tmp_path_factory.mktemp("another-project") / "notes.txt"
    elsewhere.write_text("another project's file")
    work = ws.path / "work"
    work.mkdir()
    task = ws.task("p", "t")
    scratch = Path("/tmp") / f"run-agent-sandbox-probe-{ws.path.name}"  # /tmp is its own
    sandboxed(ws, [
        "--probe-read", str(secret), "--probe-read", str(login / "token"),
        "--probe-read", str(elsewhere), "--probe-read", "/etc/hostname",
        "--probe-write", str(work / "made.txt"), "--probe-write", "/usr/made.txt",
        "--probe-write", str(elsewhere), "--probe-write", str(scratch),
        "--probe-write", str(task.folder / "DONE"),
    ])  # fmt: skip
    done = ws.cli("-p", "p", "-t", "t", "--cwd", str(work), "go", env={"HOME": str(home)})
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    seen = probes(ws)
    assert seen[f"read {secret}"] == "FileNotFoundError"  # the home is an empty one
    assert seen[f"read {login / 'token'}"] == "FileNotFoundError"
    assert seen[f"read {elsewhere}"] == "FileNotFoundError"  # /tmp is its own
    assert seen["read /etc/hostname"] == "ok"  # the system, read-only
    assert seen[f"write {work / 'made.txt'}"] == "ok" and (work / "made.txt").exists()
    assert seen["write /usr/made.txt"] == "OSError"  # read-only (EROFS)
    assert seen[f"write {task.folder / 'DONE'}"] == "ok"
    assert seen[f"write {scratch}"] == "ok" and not scratch.exists()
    assert elsewhere.read_text() == "another project's file"  # untouched
    (run,) = ws.runs("p", "t")
    assert "bwrap" not in (run.commandline or "")  # the agent's own command line is recorded


def test_network_false_cuts_the_agent_off_and_the_default_does_not(ws: Workspace) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    where = f"127.0.0.1:{listener.getsockname()[1]}"
    try:
        sandboxed(ws, ["--probe-connect", where])
        assert ws.cli("-p", "p", "-t", "on", "go").returncode == 0
        assert probes(ws, "on")[f"connect {where}"] == "ok"
        sandboxed(ws, ["--probe-connect", where], network=False)
        assert ws.cli("-p", "p", "-t", "off", "go").returncode == 0
        assert probes(ws, "off")[f"connect {where}"] in ("ConnectionRefusedError", "OSError")
    finally:
        listener.close()


def test_stop_leaves_nothing_of_a_sandboxed_tree(ws: Workspace) -> None:
    sandboxed(ws, ["--setsid-grandchild", "--orphan", "--wait-pids", "3", "--sleep", "120"])
    proc = ws.start_cli("-p", "p", "-t", "t", "go")
    # The pids the agents write are their own namespace's: they are found on the host by name.
    wait_for(lambda: len(ws.agent_pids()) >= 3, 30, "three agents")
    agents = [p for p in ws.leftovers() if "fake_agent.py" in " ".join(p.cmdline())]
    assert len(agents) >= 3
    stopped = ws.cli("stop", "-p", "p", "-t", "t")
    assert stopped.returncode == 0, stopped.stderr
    assert proc.wait(30) == ExitCode.STOPPED
    wait_for(lambda: not [p for p in agents if alive(p.pid)], 60, "every agent process gone")
    wait_for(lambda: not ws.leftovers(), 60, "bwrap's own process gone too")


def test_a_sandbox_that_cannot_start_is_refused_never_run_unsandboxed(ws: Workspace) -> None:
    ws.write_config(["--write-done"], max_restarts=0)
    refused = ws.cli("-p", "p", "-t", "t", "--sandbox", "bwrap", "go", env={"PATH": "/nowhere"})
    assert refused.returncode == ExitCode.MISSING_DEPENDENCY, refused.stderr
    assert "sandbox bwrap: 'bwrap' not found on PATH" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert not ws.task("p", "t").folder.exists()
    bad = ws.cli("-p", "p", "-t", "t", "--sandbox", "firejail", "go")
    assert bad.returncode == ExitCode.USAGE and "firejail" in bad.stderr
