"""What a sandboxed agent can write, tried as a hostile agent would: nothing it writes decides how
its task runs next or what runs on the host. Real bubblewrap, the fake agent probing, and a runs
root outside /tmp and the home, as a person's is (the sandbox hides both)."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from runagent.errors import ExitCode
from tests.conftest import FAKE_AGENT, Workspace
from tests.loop.sandboxing import agent, needs_bwrap, probes, sandboxed

pytestmark = needs_bwrap


def test_the_agent_cannot_write_what_decides_how_its_task_runs(ws_outside: Workspace) -> None:
    ws = ws_outside
    task, other = ws.task("p", "t"), ws.task("q", "other")
    other.folder.mkdir(parents=True)
    (other.folder / "TASK.md").write_text("another task")
    tokens = ws.root / ".tokens"
    tokens.mkdir(parents=True)
    (tokens / "tokens.json").write_text("{}")
    # The README's layout: config.yaml (and so the runs root) in the folder the agent works in.
    assert ws.root.is_relative_to(ws.path) and ws.config.parent == ws.path
    targets = [
        task.folder / "task.yaml", task.folder / "usage.json", task.folder / "worktree.yaml",
        task.folder / "TASK.md", ws.config, tokens / "tokens.json", ws.root / ".fleet" / "x",
        other.folder / "TASK.md", other.folder / "DONE", ws.root / "p" / "planted",
    ]  # fmt: skip
    sandboxed(ws, [arg for t in targets for arg in ("--probe-write", str(t))] + ["--write-done"])
    config_before = ws.config.read_text()
    done = ws.cli("-p", "p", "-t", "t", "go")
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    seen = probes(ws)
    for target in targets:  # refused, or landed where it is never read (its view, a tmpfs)
        assert not target.exists() or target.read_text() != "written", target
    for target in (ws.config, tokens / "tokens.json", other.folder / "TASK.md"):
        assert seen[f"write {target}"] != "ok", target  # what exists is read-only, or hidden
    assert ws.config.read_text() == config_before
    assert (other.folder / "TASK.md").read_text() == "another task"
    assert not (other.folder / "DONE").exists() and not (ws.root / "p" / "planted").exists()
    assert (tokens / "tokens.json").read_text() == "{}"
    assert not (ws.root / ".fleet" / "x").exists()
    recorded = yaml.safe_load((task.folder / "task.yaml").read_text())
    assert "sandbox" not in recorded or recorded["sandbox"] != "none"
    assert task.done.read_text().startswith("done by ")  # DONE is how it says so, and it works


def test_a_task_yaml_the_agent_appends_to_does_not_unsandbox_its_resume(
    ws_outside: Workspace,
) -> None:
    ws = ws_outside
    task = ws.task("p", "t")
    settings = task.folder / "task.yaml"
    home = ws.path / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_ed25519"
    key.write_text("a private key")
    append = (
        "import os, pathlib; p = pathlib.Path(os.environ['TASK_FOLDER'], 'task.yaml');"
        "print('append', p, end=': ');"
        'exec(\'try:\\n with open(p, "a") as f: f.write("sandbox: none\\\\nagent: evil\\\\n")'
        '\\n print("ok")\\nexcept OSError as e: print(type(e).__name__)\');'
        f"print('read {key}:', 'ok' if os.path.exists({str(key)!r}) else 'hidden')"
    )
    data = {
        "agents": {"fake": {"type": "command", "command": [sys.executable, "-c", append,
                                                           ws.marker], "sandbox": "bwrap"}},
        "defaults": {"agent": "fake", "max_restarts": 0, "until": "exit"},
        "storage": {"runs_dir": str(ws.root)},
    }  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))
    first = ws.cli("-p", "p", "-t", "t", "go", env={"HOME": str(home)})
    assert first.returncode == ExitCode.COMPLETED, first.stderr
    assert "sandbox: none" not in settings.read_text()
    again = ws.cli("resume", "-p", "p", "-t", "t", "--again", env={"HOME": str(home)})
    assert again.returncode == ExitCode.COMPLETED, again.stderr
    seen = probes(ws)
    assert seen[f"append {settings}"] != "ok"
    assert seen[f"read {key}"] == "hidden"  # the resume ran in the sandbox too


def test_the_agent_sees_its_task_and_earlier_runs_and_writes_its_own_run(
    ws_outside: Workspace,
) -> None:
    ws = ws_outside
    task = ws.task("p", "t")
    sandboxed(ws, ["--fail-first", "1", "--probe-read", str(task.task_md)])
    data = yaml.safe_load(ws.config.read_text())
    data["defaults"]["max_restarts"] = 1
    ws.config.write_text(yaml.safe_dump(data))
    done = ws.cli("-p", "p", "-t", "t", "go")
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    first, second = ws.runs()
    assert first.exit_code == 1 and second.exit_code == 0  # its attempt counter persisted
    assert probes(ws)[f"read {task.task_md}"] == "ok"
    assert not (task.folder / "fake-attempts").exists()  # it landed in its own view
    assert (task.sandbox_view / "fake-attempts").read_text() == "2"


def test_a_done_that_is_a_link_is_not_taken(ws_outside: Workspace) -> None:
    ws = ws_outside
    link = "import os; os.symlink('/etc/hostname', os.path.join(os.environ['TASK_FOLDER'], 'DONE'))"
    data = {
        "agents": {"fake": {"type": "command", "command": [sys.executable, "-c", link, ws.marker],
                            "sandbox": "bwrap"}},
        "defaults": {"agent": "fake", "max_restarts": 0, "until": "done-file"},
        "storage": {"runs_dir": str(ws.root)},
    }  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))
    done = ws.cli("-p", "p", "-t", "t", "go")
    assert done.returncode == ExitCode.FAILED, done.stderr
    assert not os.path.lexists(ws.task("p", "t").done)


@pytest.mark.parametrize("where", ["bin", "home"])
def test_an_agent_whose_program_lives_in_the_home_does_not_bring_the_home_back(
    ws_outside: Workspace, where: str
) -> None:
    ws = ws_outside
    home = ws.path / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_ed25519"
    key.write_text("a private key")
    folder = home / "bin" if where == "bin" else home
    folder.mkdir(exist_ok=True)
    script = folder / "agent.py"
    shutil.copy(FAKE_AGENT, script)
    argv = [sys.executable, str(script), "--marker", ws.marker, "--probe-read", str(key),
            "--probe-read", str(script)]  # fmt: skip
    data = {
        "agents": {"fake": {"type": "command", "command": argv, "sandbox": "bwrap"}},
        "defaults": {"agent": "fake", "max_restarts": 0, "until": "exit"},
        "storage": {"runs_dir": str(ws.root)},
    }
    ws.config.write_text(yaml.safe_dump(data))
    work = ws.path / "work"
    work.mkdir()
    done = ws.cli("-p", "p", "-t", "t", "--cwd", str(work), "go", env={"HOME": str(home)})
    (run,) = ws.runs()
    said = ws.task().run(run.run_id).stderr.read_text()
    assert done.returncode == ExitCode.COMPLETED, said
    seen = probes(ws)
    assert seen[f"read {key}"] == "FileNotFoundError"
    assert seen[f"read {script}"] == "ok"  # its own program, and that alone


def test_a_sandboxed_agent_is_refused_the_home_itself_as_its_working_folder(
    ws_outside: Workspace,
) -> None:
    ws = ws_outside
    home = ws.path / "home"
    home.mkdir()
    sandboxed(ws, ["--write-done"])
    refused = ws.cli("-p", "p", "-t", "t", "--cwd", str(home), "go", env={"HOME": str(home)})
    assert refused.returncode == ExitCode.USAGE, refused.stderr
    assert "home folder" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert not ws.task("p", "t").folder.exists()


def test_a_config_the_agent_plants_in_its_folder_is_not_what_a_resume_runs(
    ws_outside: Workspace,
) -> None:
    ws = ws_outside
    owner = ws.path / "owner"
    owner.mkdir()
    sandboxed(ws, ["--write-done"])
    named = owner / "config.yaml"
    ws.config.rename(named)  # the owner's config lives elsewhere; the agent works in ws.path
    planted = ws.path / "config.yaml"
    first = ws.cli("--config", str(named), "-p", "p", "-t", "t", "go")
    assert first.returncode == ExitCode.COMPLETED, first.stderr
    evil = yaml.safe_load(named.read_text())
    evil["agents"]["fake"]["sandbox"] = "none"
    planted.write_text(yaml.safe_dump(evil))  # what the agent could leave in its folder
    refused = ws.cli("resume", "-p", "p", "-t", "t", "--again")
    assert refused.returncode == ExitCode.USAGE, refused.stderr
    assert "not the one task p/t started with" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert len(ws.runs()) == 1  # nothing ran
    named_again = ws.cli("--config", str(named), "resume", "-p", "p", "-t", "t", "--again")
    assert named_again.returncode == ExitCode.COMPLETED, named_again.stderr


def test_an_agent_whose_program_is_reached_through_a_link_starts(ws_outside: Workspace) -> None:
    """A CLI installed in a folder reached through a symbolic link (a linked cache, a
    version manager's `current`): its folder is bound at its real path."""
    ws = ws_outside
    real = ws.path / "real-install"
    (real / "bin").mkdir(parents=True)
    shutil.copy(FAKE_AGENT, real / "bin" / "agent.py")
    (ws.path / "linked").symlink_to(real)
    argv = [sys.executable, str(ws.path / "linked" / "bin" / "agent.py"), "--marker", ws.marker]
    data = {
        "agents": {"fake": {"type": "command", "command": argv, "sandbox": "bwrap"}},
        "defaults": {"agent": "fake", "max_restarts": 0, "until": "exit"},
        "storage": {"runs_dir": str(ws.root)},
    }
    ws.config.write_text(yaml.safe_dump(data))
    done = ws.cli("-p", "p", "-t", "t", "go")
    assert done.returncode == ExitCode.COMPLETED, done.stderr


def said(ws: Workspace) -> str:
    return "".join(ws.task().run(r.run_id).stdout.read_text() for r in ws.runs())


@pytest.fixture
def outside() -> Iterator[Path]:
    """A folder outside the workspace, /tmp and the home (where a session keeps its sockets)."""
    folder = Path(tempfile.mkdtemp(prefix="run-agent-test-rt-", dir="/var/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_an_agent_run_as_root_cannot_unmount_what_hides_the_home(ws_outside: Workspace) -> None:
    """bwrap started by root keeps every capability unless told otherwise: the agent unmounts
    the tmpfs over the home (and the runs root), remounts / read-write, and reads ~/.ssh or
    rewrites task.yaml. Where run-agent runs as root (a container, CI), the sandbox must still
    hold; as another user the kernel already refuses."""
    ws = ws_outside
    home = ws.path / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_ed25519"
    key.write_text("a private key")
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "caps = open('/proc/self/status').read().split('CapEff:')[1].split()[0]\n"
        "print('caps:', caps)\n"
        "root = os.environ['TASK_FOLDER'].rsplit('/p/t', 1)[0]\n"
        "for place in (os.environ['HOME'], root):\n"
        "    libc.umount2(place.encode(), 2)  # MNT_DETACH\n"
        f"print('key:', open({str(key)!r}).read() if os.path.exists({str(key)!r}) else 'hidden')\n"
        "libc.mount(b'none', b'/', None, 0x1000 | 0x20 | 0x4000, None)  # remount,bind,rw\n"
        "try:\n"
        "    open(root + '/p/t/task.yaml', 'a').write('agent: pwn\\n'); print('task.yaml: ok')\n"
        "except OSError as e:\n"
        "    print('task.yaml:', type(e).__name__)\n"
    )
    agent(ws, code, network=True)
    done = ws.cli("-p", "p", "-t", "t", "go", env={"HOME": str(home)})
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    seen = dict(line.split(": ", 1) for line in said(ws).splitlines() if ": " in line)
    assert seen["key"] == "hidden"
    assert seen["task.yaml"] != "ok"
    assert "pwn" not in (ws.task().folder / "task.yaml").read_text()
    assert int(seen["caps"], 16) == 0, "the sandboxed agent holds capabilities"


def test_the_session_bus_is_out_of_reach_though_its_variable_is_unset(
    ws_outside: Workspace, outside: Path
) -> None:
    """The sandbox unsets DBUS_SESSION_BUS_ADDRESS, but with it unset a D-Bus client goes to
    $XDG_RUNTIME_DIR/bus, the same bus (systemd --user's is beside it: `systemd-run --user`
    runs a command on the host, outside the sandbox). With the host's network (the default),
    nothing stops socket(AF_UNIX), and $XDG_RUNTIME_DIR is neither hidden nor unset."""
    ws = ws_outside
    bus = socket.socket(socket.AF_UNIX)
    try:
        bus.bind(str(outside / "bus"))
        bus.listen(4)
        code = (
            "import os, socket\n"
            "s = socket.socket(socket.AF_UNIX)\n"
            "try:\n"
            "    s.connect(os.environ.get('XDG_RUNTIME_DIR', '/run/user/0') + '/bus')\n"
            "    s.sendall(b'AUTH EXTERNAL'); print('bus: reached')\n"
            "except OSError as e:\n"
            "    print('bus:', type(e).__name__)\n"
        )
        agent(ws, code, network=True)
        done = ws.cli("-p", "p", "-t", "t", "go", env={"XDG_RUNTIME_DIR": str(outside)})
        assert done.returncode == ExitCode.COMPLETED, done.stderr
        bus.setblocking(False)
        try:
            reached, _ = bus.accept()
            reached.close()
            got = True
        except BlockingIOError:
            got = False
    finally:
        bus.close()
    assert "bus: reached" not in said(ws)
    assert not got, "a sandboxed agent connected to the session bus of the host"
