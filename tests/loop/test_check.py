"""The task's check (`--check`): a command that judges a run which says it is done, in the task's
working folder (its worktree where it has one), inside the agent's sandbox when it has one, with a
timeout of its own and the agent's tree kill. Real processes, real git and real bubblewrap, through
the real command line."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from runagent.errors import ExitCode
from runagent.store.runinfo import Reason, RunStatus
from tests.conftest import Workspace, wait_for
from tests.gitrepo import GIT_ENV, git, make_repo
from tests.loop.sandboxing import needs_bwrap, sandboxed

# A command agent that fixes a real repository once its prompt carries how the check failed, and
# before that says it is done with a change that is wrong (as a model that did not test would).
FIXER = """\
import os, pathlib, subprocess
prompt = pathlib.Path(os.environ["RUN_FOLDER"], "prompt.md").read_text()
fixed = "add(2, 2) is 5" in prompt
body = "return a + b" if fixed else "return a + b + 1"
pathlib.Path("app.py").write_text(f"def add(a, b):\\n    {body}\\n")
subprocess.run(["git", "commit", "-qam", "fix add" if fixed else "rewrite add"], check=True)
print("fixed add" if fixed else "rewrote add; done")
"""
CHECK_APP = 'from app import add\nassert add(2, 2) == 4, f"add(2, 2) is {add(2, 2)}"\nprint("ok")\n'
# A check that hangs, and leaves a grandchild in a session of its own.
HANG = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1]],"
    " start_new_session=True)\n"
    "print('hanging', flush=True)\n"
    "time.sleep(600)\n"
)


def command(ws: Workspace, code: str) -> str:
    """A check running `python -c code` with the workspace's marker on its command line."""
    return shlex.join([sys.executable, "-c", code, ws.marker])


def in_folder(ws: Workspace, folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`run-agent ARGS` started in `folder`, with git's identity for the agent's commits."""
    return subprocess.run(
        ws.cli_argv("--config", str(ws.config), "--root", str(ws.root), *args), cwd=folder,
        env={**os.environ, **GIT_ENV}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_check_that_fails_then_passes_as_the_agent_fixes_a_real_repository(
    ws: Workspace,
) -> None:
    repo = make_repo(ws.path / "repo")
    (repo / "app.py").write_text("def add(a, b):\n    return a - b\n")
    (repo / "check_app.py").write_text(CHECK_APP)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "add, and its check")
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["fixer"] = {"type": "command", "command": [sys.executable, "-c", FIXER,
                                                              ws.marker]}  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))
    check = f"{sys.executable} check_app.py"
    done = in_folder(ws, repo, "-p", "p", "-t", "t", "--agent", "fixer", "--worktree",
                     "--check", check, "make add work")  # fmt: skip
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    first, second = ws.runs()
    assert first.status is RunStatus.FAILED and first.reason is Reason.CHECK_FAILED
    assert first.exit_code == 0 and first.check_exit_code == 1 and first.check_command == check
    assert first.check_seconds is not None and first.check_seconds > 0
    assert f"check `{check}` failed: exited with code 1" in (first.message or "")
    task = ws.task()
    assert "add(2, 2) is 5" in task.run(first.run_id).check.read_text()
    assert second.status is RunStatus.COMPLETED and second.check_exit_code == 0
    prompt = task.run(second.run_id).prompt.read_text()
    assert f"the check `{check}` failed (exit code 1)" in prompt and "add(2, 2) is 5" in prompt
    assert "says it is done; checking with" in done.stderr
    # It ran in the task's worktree: the user's checkout is as it was.
    assert "a - b" in (repo / "app.py").read_text()
    assert "a + b\n" in (task.worktree / "app.py").read_text()
    shown = ws.cli("output", "-p", "p", "-t", "t", "--check")
    assert shown.returncode == 0 and shown.stdout == "ok\n", shown.stderr
    again = ws.cli("check", "-p", "p", "-t", "t")
    assert again.returncode == 0, again.stderr
    assert again.stdout == "ok\n" and f"check `{check}` passed" in again.stderr
    (task.worktree / "app.py").write_text("def add(a, b):\n    return 5\n")
    broken = ws.cli("check", "-p", "p", "-t", "t")
    assert broken.returncode == ExitCode.FAILED, broken.stderr
    assert "add(2, 2) is 5" in broken.stdout and "failed: exited with code 1" in broken.stderr
    assert len(ws.runs()) == 2  # no agent was started


def test_a_check_that_hangs_is_stopped_at_its_timeout_with_its_whole_tree(ws: Workspace) -> None:
    ws.write_config([], max_restarts=0)
    check = command(ws, HANG)
    # check_timeout counts from the check's start: 5 s, as a Python check took more than 1 s
    # to print its first line under a CPU hog of twice the cores.
    done = ws.cli("-p", "p", "-t", "t", "--check", check, "--check-timeout", "5", "go")
    assert done.returncode == ExitCode.FAILED, done.stderr
    (run,) = ws.runs()
    assert run.reason is Reason.CHECK_FAILED and run.check_exit_code is not None
    assert run.check_exit_code > 128  # killed
    assert "ran longer than check_timeout 5s" in (run.message or "")
    said = ws.task().run(run.run_id).check.read_text()
    assert said.startswith("hanging\n") and "its processes were stopped" in said
    wait_for(lambda: not ws.leftovers(), 60, "no process of the check left")
    assert not ws.task().done.exists()


def test_a_stop_during_the_check_stops_its_tree_and_the_loop(ws: Workspace) -> None:
    ws.write_config([], max_restarts=3)
    proc = ws.start_cli("-p", "p", "-t", "t", "--check", command(ws, HANG), "go")
    try:
        check = wait_for(lambda: ws.runs() and ws.task().run(ws.runs()[0].run_id).check, 30)
        wait_for(lambda: check.exists() and "hanging" in check.read_text(), 30, "the check")
        stopped = ws.cli("stop", "-p", "p", "-t", "t")
        assert stopped.returncode == 0, stopped.stderr
        assert proc.wait(30) == ExitCode.STOPPED
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    (run,) = ws.runs()
    assert run.status is RunStatus.STOPPED and "stopped on request" in (run.message or "")
    wait_for(lambda: not ws.leftovers(), 60, "no process of the check left")


@pytest.mark.parametrize("how", ["missing", "not executable", "config"])
def test_a_check_that_cannot_run_is_refused_before_any_agent_starts(
    ws: Workspace, how: str
) -> None:
    script = ws.path / "check.sh"
    script.write_text("#!/bin/sh\nexit 0\n")  # not executable
    given = {"missing": "no-such-check-program --all", "not executable": "./check.sh"}
    if how == "config":
        ws.write_config(["--write-done"], check="no-such-check-program --all")
        args = ["-p", "p", "-t", "t", "go"]
    else:
        ws.write_config(["--write-done"])
        args = ["-p", "p", "-t", "t", "--check", given[how], "go"]
    refused = ws.cli(*args)
    assert refused.returncode == ExitCode.MISSING_DEPENDENCY, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    named = given.get(how, "no-such-check-program --all")
    assert f"check `{named}` cannot run" in line
    assert ("is not executable" if how == "not executable" else "not found on PATH") in line
    assert not ws.task().folder.exists() and not ws.pid_file.exists()  # nothing started


def test_a_check_failing_the_same_way_makes_the_loop_stuck(ws: Workspace) -> None:
    ws.write_config(["--counter", str(ws.path / "n"), "--edit", "work.txt"], max_restarts=5,
                    stuck_after=2)  # fmt: skip
    check = command(ws, "print('3 tests failed'); raise SystemExit(1)")
    done = ws.cli("-p", "p", "-t", "t", "--check", check, "go")
    assert done.returncode == ExitCode.STUCK, done.stderr
    first, second = ws.runs()
    assert first.reason is Reason.CHECK_FAILED and second.reason is Reason.STUCK
    assert "2 attempts in a row failed the same way (check" in (second.message or "")
    assert "3 tests failed" in (second.message or "")


def test_a_done_the_check_refuses_is_moved_into_its_run_and_the_next_must_say_it_again(
    ws: Workspace,
) -> None:
    ws.write_config(["--write-done"], until="done-file")
    counts = ws.path / "checks"
    code = (
        f"import pathlib, sys; p = pathlib.Path({str(counts)!r}); "
        "n = int(p.read_text()) + 1 if p.exists() else 1; p.write_text(str(n)); "
        "print('check', n); sys.exit(0 if n > 1 else 1)"
    )
    done = ws.cli("-p", "p", "-t", "t", "--check", command(ws, code), "go")
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    first, second = ws.runs()
    task = ws.task()
    assert first.reason is Reason.CHECK_FAILED and task.run(first.run_id).done.exists()
    assert second.status is RunStatus.COMPLETED and second.reason is Reason.DONE_FILE
    assert task.done.read_text().startswith("done by ")


def test_the_check_of_a_task_is_run_again_only_for_a_task_that_has_one(ws: Workspace) -> None:
    ws.write_config([])
    assert ws.cli("-p", "p", "-t", "t", "go").returncode == 0
    none = ws.cli("check", "-p", "p", "-t", "t")
    assert none.returncode == ExitCode.USAGE, none.stderr
    (line,) = none.stderr.strip().splitlines()
    assert "task p/t has no check" in line and "--check" in line


@pytest.fixture
def outside() -> Iterator[Path]:
    """A folder outside the workspace, /tmp and the home."""
    folder = Path(tempfile.mkdtemp(prefix="run-agent-test-check-", dir="/var/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@needs_bwrap
def test_a_check_runs_in_the_agents_sandbox_and_cannot_write_outside_or_read_the_home(
    ws_outside: Workspace, home: Path, outside: Path
) -> None:
    ws = ws_outside
    key = home / ".ssh" / "id_ed25519"
    planted = outside / "planted"
    task = ws.task()
    probe = (
        "import os, pathlib\n"
        "def attempt(what, do):\n"
        "    try:\n"
        "        do(); print(what + ': ok')\n"
        "    except OSError as e:\n"
        "        print(what + ': ' + type(e).__name__)\n"
        f"attempt('write outside', lambda: pathlib.Path({str(planted)!r}).write_text('x'))\n"
        f"attempt('read key', lambda: pathlib.Path({str(key)!r}).read_text())\n"
        f"attempt('write task.yaml', lambda: open({str(task.folder / 'task.yaml')!r}, 'a')"
        ".write('agent: pwn'))\n"
        "attempt('write DONE', lambda: pathlib.Path(os.environ['TASK_FOLDER'], 'DONE')"
        ".write_text('by the check'))\n"
        "attempt('write here', lambda: pathlib.Path('checked.txt').write_text('x'))\n"
    )
    sandboxed(ws, [], check=command(ws, probe))
    env = {"HOME": str(home)}
    done = ws.cli("-p", "p", "-t", "t", "go", env=env)
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    (run,) = ws.runs()
    assert run.check_exit_code == 0
    again = ws.cli("check", "-p", "p", "-t", "t", env=env)
    assert again.returncode == 0, again.stderr
    for said in (task.run(run.run_id).check.read_text(), again.stdout):
        seen = dict(line.split(": ", 1) for line in said.splitlines() if ": " in line)
        assert seen["write outside"] != "ok" and seen["read key"] != "ok", said
        assert seen["write task.yaml"] != "ok" and seen["write here"] == "ok", said
    assert not planted.exists() and key.read_text() == "a private key"
    assert "pwn" not in (task.folder / "task.yaml").read_text()
    assert task.done.read_text().startswith("completed by run")  # not the check's DONE
    assert (ws.path / "checked.txt").exists()  # where the agent works, the check works
