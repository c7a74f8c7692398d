"""What a caller can hand a sandboxed agent: never a credential of run-agent itself, never a
folder among the run folders. A `--sandbox bwrap` agent (real bubblewrap, a `type: command`
agent running `python -c ...`) with its runs root outside /tmp and the home (`ws_outside`),
started by `cocode` and by an operate token limited to one project against a real `serve`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from pathlib import Path

import httpx
import pytest

from runagent import listing
from runagent.errors import ExitCode
from runagent.store import tokens
from tests.conftest import Workspace, serving, wait_for
from tests.gitrepo import GIT_ENV, make_repo
from tests.loop.sandboxing import agent, needs_bwrap

pytestmark = needs_bwrap

KEY = "k" * 40


def test_cocode_never_hands_the_servers_api_key_to_its_agent(ws_outside: Workspace) -> None:
    """`run` scrubs RUN_AGENT_API_KEY from the agent's environment; `cocode` does not."""
    ws = ws_outside
    repo = make_repo(ws.path / "repo")
    body = ws.path / "issue.md"
    body.write_text("fix it")
    agent(ws, "import os; print('key: ' + os.environ.get('RUN_AGENT_API_KEY', 'none'))")
    env = {
        "RUN_AGENT_API_KEY": KEY, "COCODE_REPO_PATH": str(repo), "COCODE_ISSUE_NUMBER": "1",
        "COCODE_ISSUE_BODY_FILE": str(body), "COCODE_READY_MARKER": "READY", **GIT_ENV,
    }  # fmt: skip
    done = ws.cli("cocode", env=env)
    assert done.returncode == 0, done.stderr
    task = next(iter((ws.root / "cocode").iterdir()))
    said = "".join((r / "agent-stdout.txt").read_text() for r in (task / "runs").iterdir())
    assert "key: none" in said, said


@pytest.mark.parametrize("where", ["tokens", "other project"])
def test_a_project_token_never_points_a_sandboxed_agent_at_a_host_folder(
    ws_outside: Workspace, home: Path, where: str
) -> None:
    """An operate token limited to project A starts A's sandboxed agent with `cwd` set to the
    runs root's .tokens or project B's task folder: the agent gets it read-write. (A token's
    `cwd` must lie in the server's workspaces, by default the config's folder, which in the
    README's layout holds the runs root; a home outside them is refused, and holds.)"""
    ws = ws_outside
    other = ws.task("B", "t")
    other.folder.mkdir(parents=True)
    (other.folder / "TASK.md").write_text("project B's prompt")
    operate, _ = tokens.create(ws.root, tokens.Scope.OPERATE, ["A"])
    cwd = {"tokens": ws.root / ".tokens", "other project": other.folder}[where]
    agent(ws, "import os; open('planted', 'w').write(str(os.listdir('.')))")
    env = {"HOME": str(home), "RUN_AGENT_API_KEY": KEY}
    with serving(ws, env=env) as url, httpx.Client(base_url=url, timeout=60) as client:
        body = {"prompt": "go", "task_id": "t", "cwd": str(cwd)}
        bearer = {"Authorization": f"Bearer {operate}"}
        answer = client.post("/api/projects/A/tasks", json=body, headers=bearer)
        if answer.status_code == 202:
            paths = ws.task("A", "t")
            wait_for(lambda: paths.run_ids() and listing.view(paths).status.value
                     in ("completed", "failed"), 60, "the task to end")  # fmt: skip
    assert answer.status_code in (400, 403), json.dumps(answer.json())
    assert not (cwd / "planted").exists()


def test_a_network_false_agent_reaches_no_socket_of_the_host(ws_outside: Workspace) -> None:
    """`network: false`: no network, and no unix socket of the host's file system either (a
    session bus, docker.sock, an ssh-agent), wherever it lies: socket(AF_UNIX) is refused."""
    ws = ws_outside
    path = ws.path / "host.sock"
    got: list[bytes] = []
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)
    server.settimeout(30)

    def accept() -> None:
        try:
            conn, _ = server.accept()
            got.append(conn.recv(100))
            conn.close()
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    code = (
        "import socket; s = socket.socket(socket.AF_UNIX);"
        f"s.connect({str(path)!r}); s.send(b'systemd-run --user evil')"
    )
    agent(ws, code)
    try:
        ws.cli("-p", "p", "-t", "t", "go")
    finally:
        server.close()
        thread.join()
    assert not got, got


def test_the_agent_is_not_told_where_the_host_sessions_sockets_are(ws_outside: Workspace) -> None:
    ws = ws_outside
    agent(
        ws,
        "import os; print([n for n in ('SSH_AUTH_SOCK', 'DBUS_SESSION_BUS_ADDRESS', "
        "'DOCKER_HOST') if n in os.environ])",
    )
    env = {"SSH_AUTH_SOCK": "/run/user/0/ssh.sock", "DOCKER_HOST": "unix:///run/docker.sock",
           "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/0/bus"}  # fmt: skip
    done = ws.cli("-p", "p", "-t", "t", "go", env=env)
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    (run,) = ws.runs()
    assert ws.task("p", "t").run(run.run_id).stdout.read_text().strip() == "[]"


def test_an_agent_without_network_still_runs_programs_that_talk_through_pipes(
    ws_outside: Workspace,
) -> None:
    """What the filter leaves: pipes, socketpair (a child's stdio), files, processes."""
    ws = ws_outside
    code = (
        "import socket, subprocess; a, b = socket.socketpair(); a.send(b'x');"
        "print(b.recv(1), subprocess.run(['sh', '-c', 'echo hi'], capture_output=True).stdout)"
    )
    agent(ws, code)
    done = ws.cli("-p", "p", "-t", "t", "go")
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    (run,) = ws.runs()
    assert ws.task("p", "t").run(run.run_id).stdout.read_text() == "b'x' b'hi\\n'\n"


def test_a_commondir_planted_in_the_git_folder_never_runs_on_host_git(
    ws_outside: Workspace,
) -> None:
    """An agent working in a checkout writes `.git/commondir` naming a git folder of its own
    whose config sets core.fsmonitor: the user's next `git status` runs it on the host."""
    ws = ws_outside
    repo = make_repo(ws.path / "repo")
    ran = ws.path / "host-ran"
    code = (
        "import os, shutil; g = os.path.abspath('.git'); evil = os.path.abspath('evil.git');"
        "shutil.copytree(g, evil, ignore=shutil.ignore_patterns('hooks'));"
        "f = open(evil + '/config', 'a');"
        f"f.write('[core]\\n\\tfsmonitor = \"touch {ran}; echo\"\\n'); f.close();"
        "open(g + '/commondir', 'w').write(evil + '\\n')"
    )
    agent(ws, code)
    done = ws.cli("-p", "p", "-t", "t", "--cwd", str(repo), "go", env=GIT_ENV)
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    subprocess.run(["git", "status", "--short"], cwd=repo, env={**os.environ, **GIT_ENV},
                   capture_output=True, check=False)  # fmt: skip
    assert not ran.exists(), "the user's git ran what the sandboxed agent wrote"
    planted = list((repo / ".git").glob("commondir.from-*"))
    assert len(planted) == 1 and not (repo / ".git" / "commondir").exists()
    (run,) = ws.runs()
    assert "moved aside" in ws.task("p", "t").run(run.run_id).stderr.read_text()
