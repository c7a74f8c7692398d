"""Any task in a git worktree of its own (`--worktree`), through the real command line and real
repositories: where it starts, that tasks on one repository never touch each other or the
user's checkout, and what is refused before anything runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

import backends
from runagent.config.overrides import LoopOverrides
from runagent.config.settings import ExecutorSettings, ExecutorType
from runagent.errors import ExitCode, UsageError
from runagent.service import Service, StartRequest
from tests.conftest import Server, Workspace, alive, wait_for
from tests.gitrepo import GIT_ENV, commit, git, make_repo
from tests.issues.test_issue_runs import locked_by_us, own_clone, setup_config

WORK = ["--commit", "work of {attempt}"]


def run(ws: Workspace, folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`run-agent ARGS` started in `folder` (the repository's checkout, or a folder of it)."""
    return subprocess.run(
        [*ws.cli_argv("--config", str(ws.config), "--root", str(ws.root), *args)],
        cwd=folder, env={**os.environ, **GIT_ENV}, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip


def start(ws: Workspace, folder: Path, *args: str) -> subprocess.Popen[str]:
    """`run-agent ARGS` started in `folder`, not waited for."""
    return subprocess.Popen(
        ws.cli_argv("--config", str(ws.config), "--root", str(ws.root), *args), cwd=folder,
        env={**os.environ, **GIT_ENV}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def test_a_worktree_run_works_on_a_branch_of_its_own_from_the_checkouts_head(
    ws: Workspace,
) -> None:
    """From a subfolder of a checkout on a feature branch, with uncommitted changes: the agent
    works at the same place in a worktree on a new branch from that HEAD, commits there, and the
    checkout is left as it was, its changes included."""
    repo = make_repo(ws.path / "repo")
    (repo / "web").mkdir()
    (repo / "web" / "app.txt").write_text("app\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a web folder")
    git(repo, "switch", "-q", "-c", "feature")
    head = commit(repo, "feature work")
    (repo / "README").write_text("an uncommitted change\n")
    setup_config(ws, ["--edit", "here.txt", *WORK])
    done = run(ws, repo / "web", "-p", "p", "-t", "t", "--worktree", "go")
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    task = ws.task("p", "t")
    (info,) = ws.runs("p", "t")
    assert info.cwd == str(task.worktree / "web") and info.branch == "run-agent/p/t"
    assert info.base_commit == head
    assert (task.worktree / "web" / "here.txt").read_text() == "edited by attempt 1\n"
    assert git(task.worktree, "log", "--format=%s", f"{head}..HEAD") == "work of 1"
    # The checkout: its branch, HEAD and uncommitted change as they were; nothing of the agent.
    assert git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "feature"
    assert git(repo, "rev-parse", "HEAD") == head
    assert (repo / "README").read_text() == "an uncommitted change\n"
    assert not (repo / "web" / "here.txt").exists()
    own_clone(repo, task)  # its own git folder; its branch brought back into the repository
    assert git(repo, "log", "--format=%s", f"{head}..run-agent/p/t") == "work of 1"
    assert locked_by_us(ws, "p/t") == ""
    record = yaml.safe_load(task.worktree_record.read_text())
    assert (record["branch"], record["fork"], record["issue"]) == ("run-agent/p/t", head, None)
    assert not task.issue_record.exists()
    remembered = yaml.safe_load((task.folder / "task.yaml").read_text())
    assert remembered["worktree"] is True and remembered["working_dir"] == str(repo / "web")
    listed = json.loads(ws.cli("worktrees", "--json", "--config", str(ws.config)).stdout)
    (row,) = listed
    assert row["path"] == str(task.worktree) and row["branch"] == "run-agent/p/t"
    pruned = ws.cli("worktrees", "prune", "--config", str(ws.config), env=GIT_ENV)
    assert pruned.returncode == 0, pruned.stderr
    assert not task.worktree.exists()
    assert git(repo, "rev-parse", "run-agent/p/t")  # not merged: its branch is kept


def test_two_tasks_on_one_repository_never_touch_each_others_files(ws: Workspace) -> None:
    repo = make_repo(ws.path / "repo")
    setup_config(ws, [*WORK, "--edit", "same-name.txt", "--wait-in-task", "go"])
    first, second = (start(ws, repo, "-p", "p", "-t", task, "--worktree", "go")
                     for task in ("a", "b"))  # fmt: skip
    a, b = ws.task("p", "a"), ws.task("p", "b")
    wait_for(lambda: ws.runs("p", "a") and ws.runs("p", "b"), 30, "both agents at work")
    for task in (a, b):
        (task.folder / "go").touch()
    assert first.wait(60) == ExitCode.COMPLETED, first.stderr
    assert second.wait(60) == ExitCode.COMPLETED, second.stderr
    assert git(a.worktree, "rev-parse", "--abbrev-ref", "HEAD") == "run-agent/p/a"
    assert git(b.worktree, "rev-parse", "--abbrev-ref", "HEAD") == "run-agent/p/b"
    assert git(repo, "status", "--porcelain") == ""  # the checkout saw nothing
    for task in (a, b):
        log = git(task.worktree, "log", "--format=%s", "main..HEAD").splitlines()
        assert log == ["work of 1"]
        assert (task.worktree / "same-name.txt").exists()
        own_clone(repo, task)  # two clones, each with its own git folder and branch
    assert a.worktree_git != b.worktree_git


def test_a_branch_that_exists_is_never_reused_and_base_picks_the_start(ws: Workspace) -> None:
    repo = make_repo(ws.path / "repo")
    first = git(repo, "rev-parse", "HEAD")
    commit(repo, "later work")
    git(repo, "branch", "run-agent/p/t")  # someone's branch of that name
    taken = git(repo, "rev-parse", "run-agent/p/t")
    setup_config(ws, WORK)
    done = run(ws, repo, "-p", "p", "-t", "t", "--worktree", "--base", first, "go")
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    (info,) = ws.runs("p", "t")
    assert info.branch == "run-agent/p/t-2" and info.base_commit == first
    assert git(repo, "rev-parse", "run-agent/p/t") == taken  # left as it was


def test_what_a_worktree_run_refuses_before_anything_runs(ws: Workspace) -> None:
    repo = make_repo(ws.path / "repo")
    setup_config(ws, WORK)
    bad = run(ws, repo, "-p", "p", "-t", "t", "--worktree", "--base", "no-such-ref", "go")
    assert bad.returncode == ExitCode.USAGE
    assert "--base 'no-such-ref' names no commit of the repository" in bad.stderr
    alone = run(ws, repo, "-p", "p", "-t", "t", "--base", "main", "go")
    assert alone.returncode == ExitCode.USAGE and "goes with --worktree" in alone.stderr
    plain = ws.path / "plain"
    plain.mkdir()
    outside = run(ws, plain, "-p", "p", "-t", "t", "--worktree", "go")
    assert outside.returncode == ExitCode.USAGE and "needs a git repository" in outside.stderr
    inside = subprocess.run(
        ws.cli_argv("--config", str(ws.config), "--root", str(repo / "runs"), "-p", "p", "-t",
                    "t", "--worktree", "go"),
        cwd=repo, env={**os.environ, **GIT_ENV}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert inside.returncode != 0 and "is inside the repository" in inside.stderr
    for proc in (bad, alone, outside, inside):
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not ws.task("p", "t").folder.exists() and not (repo / "runs").exists()


def test_resume_goes_on_in_the_same_worktree_and_an_agent_can_ask_for_one(
    ws: Workspace,
) -> None:
    repo = make_repo(ws.path / "repo")
    ws.write_config([*WORK, "--exit", "1"], env=GIT_ENV, max_restarts=0)
    data = yaml.safe_load(ws.config.read_text())
    for agent in data["agents"].values():
        agent["worktree"] = True  # no --worktree: the agent's config asks for it
    ws.config.write_text(yaml.safe_dump(data))
    failed = run(ws, repo, "-p", "p", "-t", "t", "go")
    assert failed.returncode == ExitCode.FAILED, failed.stderr
    task = ws.task("p", "t")
    again = run(ws, repo, "resume", "-p", "p", "-t", "t")
    assert again.returncode == ExitCode.FAILED, again.stderr
    first, second = ws.runs("p", "t")
    assert first.cwd == second.cwd == str(task.worktree)
    assert first.branch == second.branch == "run-agent/p/t"
    log = git(task.worktree, "log", "--format=%s", "main..HEAD").splitlines()
    assert len(log) == 2  # the second run went on from the first's commit
    own_clone(repo, task)
    inside = run(ws, task.worktree, "resume", "-p", "p", "-t", "t")  # from inside the clone
    assert inside.returncode == ExitCode.FAILED, inside.stderr
    assert [r.cwd for r in ws.runs("p", "t")] == [str(task.worktree)] * 3
    assert [r.repo for r in ws.runs("p", "t")] == [str(repo)] * 3  # never the clone's folder
    assert len(git(repo, "log", "--format=%s", "main..run-agent/p/t").splitlines()) == 3


def test_the_api_and_the_pages_form_start_a_worktree_run(ws: Workspace, server: Server) -> None:
    """Through the door as the page's form sends it (`worktree` ticked, a `base`): a detached
    loop in a worktree of its own; a base that names nothing is refused, nothing created."""
    import httpx

    repo = make_repo(ws.path / "repo")
    base = git(repo, "rev-parse", "HEAD")
    commit(repo, "not in the worktree")
    setup_config(ws, WORK)
    url = f"{server.url}/api/projects/p/tasks"
    bad = httpx.post(url, json={"task_id": "api", "prompt": "go", "worktree": "true",
                                "base": "nothing-here", "cwd": str(repo)}, timeout=30)  # fmt: skip
    assert bad.status_code == 400 and "names no commit" in bad.json()["error"]
    assert not ws.task("p", "api").folder.exists()
    started = httpx.post(url, json={"task_id": "api", "prompt": "go", "worktree": "true",
                                    "base": base, "cwd": str(repo)}, timeout=30)  # fmt: skip
    assert started.status_code == 202, started.text
    task = ws.task("p", "api")
    wait_for(
        lambda: httpx.get(f"{url}/api", timeout=30).json()["status"] == "completed", 60, "the run"
    )
    (info,) = ws.runs("p", "api")
    assert info.cwd == str(task.worktree) and info.base_commit == base
    assert git(task.worktree, "log", "--format=%s", f"{base}..HEAD") == "work of 1"


def test_a_schedule_fires_its_task_into_a_worktree_of_its_own(ws: Workspace) -> None:
    repo = make_repo(ws.path / "repo")
    setup_config(ws, WORK, schedules={"s": {
        "cron": "0 0 1 1 *", "project": "p", "task": "nightly", "prompt": "go",
        "worktree": True, "cwd": str(repo),
    }})  # fmt: skip
    fired = ws.cli("schedule", "now", "s", env=GIT_ENV)
    assert fired.returncode == 0, fired.stderr
    task = ws.task("p", "nightly")
    wait_for(lambda: ws.runs("p", "nightly") and ws.runs("p", "nightly")[0].end_time, 60, "run")
    (info,) = ws.runs("p", "nightly")
    assert info.cwd == str(task.worktree) and info.branch == "run-agent/p/nightly"
    assert git(repo, "status", "--porcelain") == ""


def test_a_sigkilled_worktree_run_is_taken_up_again_by_resume(ws: Workspace) -> None:
    repo = make_repo(ws.path / "repo")
    go = ws.path / "go"
    setup_config(ws, ["--wait-for", str(go)])
    proc = start(ws, repo, "-p", "p", "-t", "t", "--worktree", "go")
    task = ws.task("p", "t")
    wait_for(lambda: locked_by_us(ws, "p/t"), 30, "the worktree locked by the loop")
    wait_for(lambda: ws.runs("p", "t") and ws.runs("p", "t")[0].pid, 30, "the agent")
    commit(task.worktree, "partial work")
    os.kill(proc.pid, signal.SIGKILL)  # the supervisor dies; its reaper stops the agent
    proc.wait(30)
    pids = ws.agent_pids()
    wait_for(lambda: not any(alive(p) for p in pids), 30, "the agent stopped")
    go.touch()
    again = run(ws, repo, "resume", "-p", "p", "-t", "t")
    assert again.returncode == ExitCode.COMPLETED, again.stderr
    assert "partial work" in git(task.worktree, "log", "--format=%s")
    assert "partial work" in git(repo, "log", "--format=%s", "run-agent/p/t")
    assert locked_by_us(ws, "p/t") == ""
    own_clone(repo, task)
    assert [r.status.value for r in ws.runs("p", "t")] == ["lost", "completed"]


def test_a_worktree_run_on_a_cluster_without_a_shared_root_is_refused_in_one_line(
    ws: Workspace,
) -> None:
    """Its worktree is made where the loop runs, in the task's folder: on hosts that do not
    share the runs root it is refused before anything is made (no cluster is asked: the
    refusal comes first). With a shared root it goes (tests/e2e/test_cluster.py races there)."""
    repo = make_repo(ws.path / "repo")
    setup_config(ws, WORK)
    door = Service(ws.root, config_path=ws.config, backend_names=backends.known(), workdir=repo)
    ray = replace(door, executor=ExecutorSettings(type=ExecutorType.RAY, address="127.0.0.1:1",
                                                  shared_root=False))  # fmt: skip
    with pytest.raises(UsageError, match="needs hosts that share the runs root"):
        ray.start(StartRequest(ws.task("p", "t"), "go", overrides=LoopOverrides(worktree=True)))
    assert not ws.task("p", "t").folder.exists()


def test_a_branch_moved_in_the_repository_meanwhile_is_kept_and_the_failure_said(
    ws: Workspace,
) -> None:
    """Someone commits on the task's branch in the repository while its agent works: bringing
    the clone's branch back would lose that commit, so it is not done, and said where a person
    looks (the run's stderr, the loop's own lines), not swallowed; `merge` refuses, saying it."""
    repo = make_repo(ws.path / "repo")
    setup_config(ws, [*WORK, "--wait-in-task", "go"])
    proc = subprocess.Popen(
        ws.cli_argv("--config", str(ws.config), "--root", str(ws.root), "-p", "p", "-t", "t",
                    "--worktree", "go"),
        cwd=repo, env={**os.environ, **GIT_ENV}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    task = ws.task("p", "t")
    try:
        wait_for(lambda: ws.runs("p", "t"), 30, "the agent at work")
        fork = git(repo, "rev-parse", "run-agent/p/t")
        tree = git(repo, "rev-parse", "HEAD^{tree}")
        theirs = git(repo, "commit-tree", tree, "-p", fork, "-m", "the user's own")
        git(repo, "update-ref", "refs/heads/run-agent/p/t", theirs)
        (task.folder / "go").touch()
        _, said = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == ExitCode.COMPLETED, said  # the run's work is not the failure
    assert git(repo, "rev-parse", "run-agent/p/t") == theirs  # kept, not overwritten
    assert git(task.worktree, "log", "-1", "--format=%s") == "work of 1"  # kept in the clone
    (info,) = ws.runs("p", "t")
    noted = task.run(info.run_id).stderr.read_text()
    line = "run-agent/p/t cannot be brought back into"
    assert f"run-agent: {line}" in noted and "it was moved to" in noted
    assert line in said, said
    merged = ws.cli("merge", "-p", "p", "-t", "t", "--config", str(ws.config), env=GIT_ENV)
    assert merged.returncode != 0 and line in merged.stderr, merged.stderr
    assert len(merged.stderr.strip().splitlines()) == 1, merged.stderr
    assert git(repo, "rev-parse", "run-agent/p/t") == theirs
