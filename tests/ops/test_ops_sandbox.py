"""`sandbox: bwrap`: shell operations with no network and only the workspace of the host visible;
where bwrap cannot run, one line says so and nothing runs unconfined."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from runagent.errors import MissingDependencyError
from runagent.ops.protocol import Status
from runagent.ops.runtime import Runtime
from runagent.ops.sandbox import Bwrap, Sandbox
from tests.conftest import Workspace, wait_for
from tests.ops.test_policy import RUN_TIME_PATHS

UNUSABLE = Bwrap(Path("/")).problem()
# Skipped, with the reason, where bwrap cannot build a sandbox (no user namespaces); in CI, which
# installs it, a missing bwrap fails instead.
needs_bwrap = pytest.mark.skipif(
    UNUSABLE is not None and not (os.environ.get("CI") and shutil.which("bwrap") is None),
    reason=f"bwrap unusable: {UNUSABLE}",
)


def batch(*operations: Any) -> dict[str, Any]:
    return {"protocolVersion": "1.0", "operations": list(operations)}


def shell(runtime: Runtime, command: str, **fields: Any) -> dict[str, Any]:
    """The command's event; what the policy holds (a write outside the workspace) is approved,
    as a person might: the sandbox is what must stop it then."""
    reply = runtime.receive(batch({"type": "shell", "command": command, **fields}))
    if reply.status is Status.AWAITING_APPROVAL:
        reply = runtime.receive({"approval": {"decision": "approved"}})
    (event,) = reply.events
    return event


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "project"
    folder.mkdir()
    return folder


def runtime(tmp_path: Path, project: Path, sandbox: Sandbox = Sandbox.BWRAP) -> Runtime:
    return Runtime.create(tmp_path / "runs" / "r1", project, "permissive", sandbox)


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP server on the host's 127.0.0.1 that accepts connections; its port."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield int(server.getsockname()[1])


@needs_bwrap
def test_the_workspace_is_writable_and_the_setting_is_kept(tmp_path: Path, project: Path) -> None:
    rt = runtime(tmp_path, project)
    event = shell(rt, "echo made > out.txt && mkdir -p sub && pwd > sub/where && echo $HOME")
    assert event["success"], event
    assert (project / "out.txt").read_text() == "made\n"
    assert (project / "sub" / "where").read_text() == f"{project.resolve()}\n"
    assert event["stdout"] == "/tmp\n"
    assert Runtime.open(rt.paths.folder).settings.sandbox is Sandbox.BWRAP
    assert json.loads(rt.paths.ops_settings.read_text())["sandbox"] == "bwrap"


@needs_bwrap
def test_nothing_outside_the_workspace_is_visible(tmp_path: Path, project: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("outside")
    home = Path.home()
    rt = runtime(tmp_path, project)
    for command in (f"cat {secret}", f"ls -A {home}", f"ls {tmp_path / 'runs'}", "cat /etc/shadow"):
        event = shell(rt, command)
        assert not event["success"] and event["exitCode"] != 0, (command, event)
        assert "outside" not in event["stdout"]
    # The same read unconfined succeeds: the sandbox is what stops it.
    open_rt = Runtime.create(tmp_path / "runs" / "r2", project, "permissive", Sandbox.NONE)
    assert shell(open_rt, f"cat {secret}")["stdout"] == "outside"
    # System folders are there, read-only.
    assert shell(rt, "ls /usr/bin/env")["success"]
    denied = shell(rt, "touch /usr/new-file")
    assert not denied["success"] and not Path("/usr/new-file").exists()


@needs_bwrap
def test_no_network_not_even_the_hosts_loopback(
    tmp_path: Path, project: Path, listener: int
) -> None:
    connect = f"exec 3<>/dev/tcp/127.0.0.1/{listener} && echo connected"
    unconfined = Runtime.create(tmp_path / "runs" / "r2", project, "permissive", Sandbox.NONE)
    assert shell(unconfined, connect)["stdout"] == "connected\n"  # the test can tell
    event = shell(runtime(tmp_path, project), connect)
    assert not event["success"] and "connected" not in event["stdout"], event


@needs_bwrap
def test_a_timeout_still_kills_the_whole_tree(tmp_path: Path, project: Path) -> None:
    marker = f"{os.getpid() % 1000}.4242"  # a sleep length no other process uses
    event = shell(
        runtime(tmp_path, project),
        f"sleep {marker} & (sleep {marker} &) ; sleep {marker}",
        timeout=1000,
    )
    assert event["timedOut"] and event["exitCode"] == 124

    def sleepers() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and marker in (
                proc.info["cmdline"] or []
            ):
                found.append(proc)
        return found

    wait_for(lambda: not sleepers(), timeout=60, what="the sandboxed tree to be gone")


def fake_bwrap(folder: Path, stderr: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / "bwrap"
    path.write_text(f"#!/bin/sh\necho '{stderr}' >&2\nexit 1\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_missing_or_unusable_bwrap_is_one_line_and_nothing_runs(
    tmp_path: Path, project: Path
) -> None:
    missing = Bwrap(project, program="no-such-bwrap-here").problem()
    assert missing is not None and "not found on PATH" in missing and "\n" not in missing
    broken = fake_bwrap(tmp_path / "bin", "bwrap: No permissions to creating new namespace")
    said = Bwrap(project, program=str(broken)).problem()
    assert said is not None and "\n" not in said
    assert "No permissions to creating new namespace" in said and "user namespaces" in said
    with pytest.raises(MissingDependencyError, match="not found on PATH"):
        Bwrap(project, program="no-such-bwrap-here").check()


def test_the_cli_refuses_in_one_line_where_bwrap_cannot_run(
    ws: Workspace, tmp_path_factory: pytest.TempPathFactory
) -> None:
    (ws.path / "project").mkdir()
    installed = tmp_path_factory.mktemp("bin")  # not in the folder it runs in: never taken there
    fake_bwrap(installed, "bwrap: setting up uid map: Permission denied")
    message = json.dumps(batch({"type": "shell", "command": "echo ran > ran.txt"}))
    path = f"{installed}:{os.environ['PATH']}"
    done = ws.cli("ops", "apply", "-", "-w", "project", "--sandbox", "bwrap",
                  input=message, env={"PATH": path})  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "setting up uid map" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (ws.path / "project" / "ran.txt").exists()
    assert not list(ws.root.glob("*/*/runs/*"))  # no run was made


def test_a_sandboxed_run_whose_bwrap_broke_since_runs_nothing(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "runs" / "r1"
    folder.mkdir(parents=True)
    settings = {"workspace": str(project), "policy": "permissive", "sandbox": "bwrap"}
    (folder / "ops.json").write_text(json.dumps(settings))
    monkeypatch.setenv("PATH", str(fake_bwrap(tmp_path / "bin", "bwrap: no").parent))
    event = shell(Runtime.open(folder, environment={"PATH": "/usr/bin:/bin"}), "echo x > ran.txt")
    assert not event["success"] and "the command was not run" in event["error"]
    assert not (project / "ran.txt").exists()


@needs_bwrap
def test_by_default_shell_operations_run_sandboxed_and_the_events_say_so(
    tmp_path: Path, project: Path
) -> None:
    rt = Runtime.create(tmp_path / "runs" / "r1", project, "permissive")
    assert rt.settings.sandbox is Sandbox.BWRAP
    assert json.loads(rt.paths.ops_settings.read_text())["sandbox"] == "bwrap"
    event = shell(rt, f"touch {tmp_path}/escaped; echo in > inside.txt")
    assert event["sandbox"] == "sandboxed (bubblewrap)"
    assert (project / "inside.txt").exists() and not (tmp_path / "escaped").exists()
    # A later process goes on under the same sandbox.
    assert shell(Runtime.open(rt.paths.folder), "true")["sandbox"] == "sandboxed (bubblewrap)"


def test_auto_without_a_usable_bwrap_runs_unsandboxed_and_says_why(
    tmp_path: Path, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "nobin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "nobin"))  # no bwrap to be found
    rt = Runtime.create(
        tmp_path / "runs" / "r1", project, "permissive", environment={"PATH": "/usr/bin:/bin"}
    )
    assert rt.settings.sandbox is Sandbox.NONE
    event = shell(rt, "echo ran")
    assert event["stdout"] == "ran\n"
    assert event["sandbox"].startswith("not sandboxed: sandbox bwrap: 'bwrap' not found on PATH")
    chosen = Runtime.create(tmp_path / "runs" / "r2", project, "permissive", Sandbox.NONE)
    assert shell(chosen, "true")["sandbox"] == "not sandboxed: the sandbox is set to none"


def test_doctor_says_which_sandbox_is_in_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runagent import doctor

    line, _ = doctor.check_sandbox("none").findings
    assert line.ok and line.what == "shell operations: not sandboxed: the sandbox is set to none"
    if UNUSABLE is None:
        line, agents = doctor.check_sandbox("auto").findings
        assert line.ok and line.what == "shell operations: sandboxed (bubblewrap)"
        assert agents.ok and agents.what == "agents: bubblewrap works here (sandbox: bwrap)"
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap here
    line, agents = doctor.check_sandbox("auto").findings
    assert line.ok and line.what.startswith("shell operations: not sandboxed: sandbox bwrap:")
    assert agents.ok  # no agent asks for it: said, not a failure
    assert agents.what.startswith("agents: sandbox: bwrap cannot run here: ")
    line, agents = doctor.check_sandbox("bwrap", ["claude"]).findings
    assert not line.ok and "not found on PATH" in line.what
    assert not agents.ok and "(claude asks for it)" in agents.what
    assert "unprivileged user namespaces" in agents.fix


@needs_bwrap
@pytest.mark.parametrize("command", RUN_TIME_PATHS)
def test_what_the_policy_holds_still_cannot_write_outside_once_approved(
    tmp_path: Path, project: Path, command: str
) -> None:
    """The policy holds these (tests/ops/test_policy.py); a person who approves one anyway still
    gets nothing written outside the workspace, since the sandbox is on by default."""
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep").write_text("kept")
    (project / "notes.txt").write_text("a line\n")
    rt = Runtime.create(
        tmp_path / "runs" / "r1", project, "standard", environment={"PATH": "/usr/bin:/bin"}
    )

    def host() -> set[Path]:
        return {
            p for p in tmp_path.rglob("*") if project not in p.parents and p != project
            and tmp_path / "runs" not in (p, *p.parents)
        }  # fmt: skip

    before = host()
    held = rt.receive(batch({"type": "shell", "command": command.replace("OUT", str(outside))}))
    assert held.status is Status.AWAITING_APPROVAL, held.events
    (event,) = rt.receive({"approval": {"decision": "approved"}}).events
    assert event["sandbox"] == "sandboxed (bubblewrap)"
    assert host() == before and (outside / "keep").read_text() == "kept", event


def test_the_config_chooses_the_sandbox(tmp_path: Path) -> None:
    from runagent.config.file import load_config
    from runagent.errors import ConfigError
    from tests.config.test_config import BACKENDS

    path = tmp_path / "config.yaml"
    assert load_config(None, BACKENDS, tmp_path).ops.sandbox == "auto"
    path.write_text("ops:\n  sandbox: none\n")
    assert load_config(path, BACKENDS, tmp_path).ops.sandbox == "none"
    path.write_text("ops:\n  sandbox: docker\n")
    with pytest.raises(ConfigError, match=r"ops\.sandbox.*'docker'") as info:
        load_config(path, BACKENDS, tmp_path)
    assert "\n" not in str(info.value)


@needs_bwrap
def test_git_works_in_a_sandboxed_linked_worktree_and_its_hooks_stay_out_of_reach(
    tmp_path: Path,
) -> None:
    """An issue run's workspace is a linked worktree whose repository lies outside it: git must
    commit there under the sandbox, while hooks and config, which run on the host, stay
    read-only, in the worktree's git folders and in an ordinary checkout's."""
    from tests.gitrepo import GIT_ENV, git, make_repo

    repo = make_repo(tmp_path / "repo")
    tree = tmp_path / "tree"
    git(repo, "worktree", "add", "-q", "-b", "work", str(tree))
    rt = Runtime.create(tmp_path / "runs" / "r1", tree, "permissive", environment=GIT_ENV)
    assert rt.settings.sandbox is Sandbox.BWRAP
    made = shell(rt, "echo done > out.txt && git add out.txt && git commit -q -m 'sandboxed'")
    assert made["success"], made
    assert git(repo, "log", "-1", "--format=%s", "work") == "sandboxed"
    hooks = repo / ".git" / "hooks"
    for target in (hooks / "post-commit", repo / ".git" / "config"):
        tried = shell(rt, f"echo 'touch {tmp_path}/pwned' >> {target}")
        assert not tried.get("success"), tried
    assert not (hooks / "post-commit").exists()
    assert "pwned" not in (repo / ".git" / "config").read_text()
    # The same in a checkout that is the workspace itself.
    own = Runtime.create(tmp_path / "runs" / "r2", repo, "permissive", environment=GIT_ENV)
    # Through a variable, so the policy (which protects .git/**) only holds it, and it is
    # approved: the sandbox is what refuses.
    tried = shell(own, "g=.git; echo 'touch x' > $g/hooks/post-commit")
    assert not tried.get("success") and not (hooks / "post-commit").exists(), tried
    assert shell(own, "git status --short")["success"]
