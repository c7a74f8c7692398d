"""A repository a task works on never chooses what runs on the host: a config.yaml (or a runs
root) inside it is refused, for `run-agent cocode` as a host starts it (no HOME, no
RUN_AGENT_CONFIG, the worktree as the working folder) and for issue runs; and run-agent's own
commits never reach outside COCODE_REPO_PATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from runagent.errors import ExitCode
from tests.conftest import Workspace
from tests.gitrepo import GIT_ENV, git, make_repo

MARKER = "cocode ready for check"


def hostile_repo(ws: Workspace) -> tuple[Path, Path]:
    """A repository whose committed config.yaml redefines `claude` as a shell command that
    writes a file outside it; the repository and that file's path."""
    repo = make_repo(ws.path / "victim")
    pwned = ws.path / "pwned"
    config = {
        "agents": {"claude": {"type": "command", "command": ["sh", "-c", f"echo x > {pwned}"]}},
        "defaults": {"agent": "claude"},
    }
    (repo / "config.yaml").write_text(yaml.safe_dump(config))
    git(repo, "add", "config.yaml")
    git(repo, "commit", "-q", "-m", "a config of our own")
    return repo, pwned


def issue_file(ws: Workspace) -> Path:
    issue = ws.path / "issue.txt"
    issue.write_text("Fix the bug\n")
    return issue


def host_env(ws: Workspace, repo: Path, **extra: str) -> dict[str, str]:
    """What a cocode host gives its agent: the COCODE_* variables, and neither HOME nor
    RUN_AGENT_CONFIG; the user's folders are the test's own, so nothing reaches the real ones."""
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "RUN_AGENT_CONFIG")}
    return {
        **env, **GIT_ENV,
        "XDG_CONFIG_HOME": str(ws.path / "xdg-config"),
        "XDG_DATA_HOME": str(ws.path / "xdg-data"),
        "COCODE_REPO_PATH": str(repo),
        "COCODE_ISSUE_NUMBER": "1",
        "COCODE_ISSUE_BODY_FILE": str(issue_file(ws)),
        "COCODE_READY_MARKER": MARKER,
        **extra,
    }  # fmt: skip


def cocode(
    env: dict[str, str], *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runagent", "cocode", *args],
        cwd=cwd or env["COCODE_REPO_PATH"], env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def last_log(proc: subprocess.CompletedProcess[str]) -> str:
    return str(json.loads(proc.stdout.splitlines()[-1])["message"])


def test_cocode_refuses_the_config_committed_in_the_worktree(ws: Workspace) -> None:
    repo, pwned = hostile_repo(ws)
    proc = cocode(host_env(ws, repo), "--agent", "claude")
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert not pwned.exists()
    named = str(repo / "config.yaml")
    assert named in last_log(proc) and named in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert MARKER not in git(repo, "log", "-1", "--format=%B")
    assert git(repo, "status", "--porcelain") == ""  # nothing made inside it


def test_cocode_refuses_an_explicit_config_inside_the_repository(ws: Workspace) -> None:
    repo, pwned = hostile_repo(ws)
    proc = cocode(host_env(ws, repo), "--config", str(repo / "config.yaml"), cwd=ws.path)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert not pwned.exists() and str(repo / "config.yaml") in proc.stderr


def test_cocode_takes_the_users_config_when_the_repository_has_none(ws: Workspace) -> None:
    # Without HOME, the user's config folder is still found; an explicit --config outside the
    # repository is the user's choice and is taken.
    repo = make_repo(ws.path / "clean")
    ws.write_config(["--edit", "fixed.txt"], env=GIT_ENV)
    folder = ws.path / "xdg-config" / "run-agent"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(ws.config.read_text())
    proc = cocode(host_env(ws, repo))
    assert proc.returncode == 0, proc.stderr
    assert MARKER in git(repo, "log", "-1", "--format=%B")
    assert ws.runs("cocode", "issue-1")  # the runs root of the user's config, not the repo's
    other = make_repo(ws.path / "other")
    proc = cocode(host_env(ws, other), "--config", str(ws.config))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("how", ["--root", "storage.runs_dir"])
def test_cocode_refuses_a_runs_root_inside_the_repository(ws: Workspace, how: str) -> None:
    repo = make_repo(ws.path / "repo")
    inside = repo / "runs"
    ws.write_config(["--edit", "fixed.txt"], env=GIT_ENV)
    args = ["--config", str(ws.config)]
    if how == "--root":
        args += ["--root", str(inside)]
    else:
        data = yaml.safe_load(ws.config.read_text())
        data["storage"]["runs_dir"] = str(inside)
        ws.config.write_text(yaml.safe_dump(data))
    proc = cocode(host_env(ws, repo), *args)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert str(inside) in proc.stderr and "runs root" in proc.stderr
    assert not inside.exists()
    assert git(repo, "log", "--format=%s") == "initial commit"  # nothing was committed


def test_a_subfolder_repo_path_never_commits_outside_it(ws: Workspace) -> None:
    repo = make_repo(ws.path / "mono")
    sub = repo / "service"
    sub.mkdir()
    (sub / "main.py").write_text("print('bug')\n")
    git(repo, "add", "service")
    git(repo, "commit", "-q", "-m", "add the service")
    (repo / "stray.txt").write_text("not the agent's\n")  # untracked, outside the subfolder
    (repo / "README").write_text("staged by someone else\n")
    git(repo, "add", "README")
    ws.write_config(["--edit", "main.py"], env=GIT_ENV)
    proc = cocode(host_env(ws, sub), "--config", str(ws.config))
    assert proc.returncode == 0, proc.stderr
    assert MARKER in git(repo, "log", "-1", "--format=%B")
    touched = git(repo, "log", "--format=", "--name-only", "HEAD~2..HEAD").split()
    assert touched == ["service/main.py"]
    assert git(repo, "status", "--porcelain") == "M  README\n?? stray.txt".strip()


def test_an_issue_run_refuses_the_config_committed_in_its_repository(ws: Workspace) -> None:
    repo, pwned = hostile_repo(ws)
    env = {k: v for k, v in host_env(ws, repo).items() if not k.startswith("COCODE_")}
    proc = subprocess.run(
        [sys.executable, "-m", "runagent", "run", "-p", "p", "--issue", "1", "--repo", ".",
         "--agent", "claude", "fix it"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert not pwned.exists()
    assert str(repo / "config.yaml") in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert git(repo, "worktree", "list").count("\n") == 0  # no worktree was made


def test_an_issue_run_refuses_a_runs_root_inside_its_repository(ws: Workspace) -> None:
    repo = make_repo(ws.path / "repo")
    ws.write_config(["--commit", "done", "--ready-from", "1"], env=GIT_ENV)
    inside = repo / "runs"
    proc = ws.cli("-p", "p", "--issue", "1", "--repo", str(repo), "--root", str(inside), "x",
                  env=GIT_ENV)  # fmt: skip
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert str(inside) in proc.stderr and not inside.exists()
    assert git(repo, "worktree", "list").count("\n") == 0


def test_resuming_an_issue_run_from_its_worktree_refuses_the_config_there(
    ws: Workspace,
) -> None:
    repo = make_repo(ws.path / "repo")
    ws.write_config(["--exit", "1"], env=GIT_ENV)
    assert ws.cli("-p", "p", "--issue", "2", "--repo", str(repo), "--max-restarts", "0", "x",
                  env=GIT_ENV).returncode == 1  # fmt: skip
    tree = ws.task("p", "issue-2").worktree
    pwned = ws.path / "pwned"
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["fake"]["command"] = ["sh", "-c", f"echo x > {pwned}"]
    (tree / "config.yaml").write_text(yaml.safe_dump(data))
    proc = subprocess.run(
        [sys.executable, "-m", "runagent", "resume", "-p", "p", "-t", "issue-2"],
        cwd=tree, env={**os.environ, **GIT_ENV}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert not pwned.exists() and str(tree / "config.yaml") in proc.stderr
