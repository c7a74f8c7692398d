"""The way back from a task's worktree (`run-agent merge`), with real git: a fast-forward, a
merge commit, a conflict, a dirty checkout, a branch no worktree has checked out, a push."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from runagent.errors import ExitCode
from tests.conftest import Server, Workspace
from tests.gitrepo import GIT_ENV, commit, git, make_repo
from tests.issues.test_issue_runs import setup_config


def cli(ws: Workspace, folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ws.cli_argv("--config", str(ws.config), "--root", str(ws.root), *args), cwd=folder,
        env={**os.environ, **GIT_ENV}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def worked(ws: Workspace, repo: Path, task: str = "t", *extra: str) -> str:
    """A completed --worktree task whose agent wrote shared.txt and committed it; its tip."""
    done = cli(ws, repo, "-p", "p", "-t", task, "--worktree", *extra, "go")
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    return git(ws.task("p", task).worktree, "rev-parse", "HEAD")


def repository(ws: Workspace) -> Path:
    repo = make_repo(ws.path / "repo")
    commit(repo, "the shared file", name="shared.txt", text="original\n")
    setup_config(ws, ["--edit", "shared.txt", "--commit", "work of {attempt}"])
    return repo


def merged(ws: Workspace, task: str = "t") -> dict[str, object]:
    record = yaml.safe_load(ws.task("p", task).worktree_record.read_text())
    return dict(record.get("merged") or {})


def test_a_branch_comes_back_by_fast_forward_into_the_checkout_it_started_from(
    ws: Workspace,
) -> None:
    repo = repository(ws)
    tip = worked(ws, repo)
    done = cli(ws, repo, "merge", "-p", "p", "-t", "t")
    assert done.returncode == 0, done.stderr
    assert f"merged run-agent/p/t into main (fast-forward, {tip[:12]})" in done.stdout
    assert git(repo, "rev-parse", "HEAD") == tip and git(repo, "status", "--porcelain") == ""
    assert (repo / "shared.txt").read_text() == "edited by attempt 1\n"
    assert merged(ws)["how"] == "fast-forward"
    again = cli(ws, repo, "merge", "-p", "p", "-t", "t")
    assert again.returncode == 0 and "already merged into main" in again.stdout


def test_a_base_that_moved_on_gets_a_merge_commit_or_ff_only_refuses(ws: Workspace) -> None:
    repo = repository(ws)
    tip = worked(ws, repo)
    other = commit(repo, "meanwhile on main", name="other.txt")
    data = yaml.safe_load(ws.config.read_text())
    data["issues"] = {"merge": "ff-only"}
    ws.config.write_text(yaml.safe_dump(data))
    refused = cli(ws, repo, "merge", "-p", "p", "-t", "t")
    assert refused.returncode == ExitCode.CONFLICT and "cannot be fast-forwarded" in refused.stderr
    assert git(repo, "rev-parse", "HEAD") == other  # nothing changed
    data["issues"] = {"merge": "ff"}
    ws.config.write_text(yaml.safe_dump(data))
    done = cli(ws, repo, "merge", "-p", "p", "-t", "t")
    assert done.returncode == 0 and "(merge commit, " in done.stdout, done.stderr
    assert git(repo, "rev-parse", "HEAD^1") == other and git(repo, "rev-parse", "HEAD^2") == tip
    assert "Merge run-agent/p/t (run-agent task p/t)" in git(repo, "log", "-1", "--format=%s")


def test_a_conflict_or_a_dirty_checkout_is_refused_and_nothing_changes(ws: Workspace) -> None:
    repo = repository(ws)
    tip = worked(ws, repo)
    (repo / "README").write_text("uncommitted\n")
    dirty = cli(ws, repo, "merge", "-p", "p", "-t", "t")
    assert dirty.returncode == ExitCode.CONFLICT, dirty.stderr
    assert "the checkout of main" in dirty.stderr and "uncommitted changes" in dirty.stderr
    git(repo, "checkout", "--", "README")
    theirs = commit(repo, "main changed it too", name="shared.txt", text="main's line\n")
    conflict = cli(ws, repo, "merge", "-p", "p", "-t", "t")
    assert conflict.returncode == ExitCode.CONFLICT, conflict.stderr
    assert "conflicts with main in shared.txt" in conflict.stderr
    for proc in (dirty, conflict):
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert git(repo, "rev-parse", "HEAD") == theirs and git(repo, "status", "--porcelain") == ""
    assert git(repo, "rev-parse", "run-agent/p/t") == tip and not merged(ws)


def test_a_branch_no_worktree_has_checked_out_moves_without_a_checkout(ws: Workspace) -> None:
    repo = repository(ws)
    git(repo, "switch", "-q", "-c", "develop")
    tip = worked(ws, repo)  # from develop's HEAD: it goes back into develop
    git(repo, "switch", "-q", "main")  # develop is checked out nowhere now
    (repo / "README").write_text("the user's own uncommitted work\n")
    done = cli(ws, repo, "merge", "-p", "p", "-t", "t")
    assert done.returncode == 0 and "into develop (fast-forward" in done.stdout, done.stderr
    assert git(repo, "rev-parse", "develop") == tip
    assert (repo / "README").read_text() == "the user's own uncommitted work\n"  # untouched
    second = worked(ws, repo, "u", "--base", "main")
    commit(repo, "main moved on", name="third.txt")
    main = git(repo, "rev-parse", "main")
    git(repo, "switch", "-q", "develop")
    done = cli(ws, repo, "merge", "-p", "p", "-t", "u")
    assert done.returncode == 0 and "into main (merge commit" in done.stdout, done.stderr
    assert git(repo, "rev-parse", "main^1") == main and git(repo, "rev-parse", "main^2") == second


def test_push_sends_the_branch_and_what_is_not_ready_is_refused(ws: Workspace) -> None:
    repo = repository(ws)
    remote = ws.path / "remote.git"
    git(ws.path, "init", "-q", "--bare", str(remote))
    git(repo, "remote", "add", "origin", str(remote))
    plain = cli(ws, repo, "-p", "p", "-t", "plain", "go")
    assert plain.returncode == 0, plain.stderr
    none = cli(ws, repo, "merge", "-p", "p", "-t", "plain")
    assert none.returncode == ExitCode.USAGE and "has no worktree of its own" in none.stderr
    data = yaml.safe_load(ws.config.read_text())
    for agent in data["agents"].values():
        agent["args"] = [*agent.get("args", []), "--exit", "1"]
    data["defaults"]["max_restarts"] = 0
    ws.config.write_text(yaml.safe_dump(data))
    failed = cli(ws, repo, "-p", "p", "-t", "t", "--worktree", "go")
    assert failed.returncode == ExitCode.FAILED, failed.stderr
    refused = cli(ws, repo, "merge", "-p", "p", "-t", "t")
    assert refused.returncode == ExitCode.USAGE and "is failed, not completed" in refused.stderr
    unknown = cli(ws, repo, "merge", "-p", "p", "-t", "t", "--push", "nowhere", "--force")
    assert unknown.returncode == ExitCode.USAGE and "no remote 'nowhere'" in unknown.stderr
    pushed = cli(ws, repo, "merge", "-p", "p", "-t", "t", "--push", "origin", "--force")
    assert pushed.returncode == 0 and "pushed run-agent/p/t to origin" in pushed.stdout
    tip = git(ws.task("p", "t").worktree, "rev-parse", "HEAD")
    assert git(remote, "rev-parse", "run-agent/p/t") == tip
    assert git(repo, "rev-parse", "main") != tip  # pushed, not merged


def test_the_api_merges_and_answers_a_conflict_with_409(ws: Workspace, server: Server) -> None:
    import httpx

    repo = repository(ws)
    tip = worked(ws, repo)
    url = f"{server.url}/api/projects/p/tasks/t/merge"
    theirs = commit(repo, "main changed it too", name="shared.txt", text="main's line\n")
    conflict = httpx.post(url, json={}, timeout=30)
    assert conflict.status_code == 409 and "conflicts with main" in conflict.json()["error"]
    detail = httpx.get(f"{server.url}/api/projects/p/tasks/t", timeout=30).json()
    assert detail["git"]["into"] == "main" and detail["git"]["ahead"] == 1
    assert detail["git"]["merged"] is None
    git(repo, "reset", "-q", "--hard", "HEAD~1")  # main's change taken back
    done = httpx.post(url, json={}, timeout=30)
    assert done.status_code == 200 and "fast-forward" in done.json()["done"], done.text
    assert git(repo, "rev-parse", "main") == tip != theirs
    detail = httpx.get(f"{server.url}/api/projects/p/tasks/t", timeout=30).json()
    assert detail["git"]["merged"]["into"] == "main"


def test_the_commits_listed_are_those_counted_and_the_diff_itself_is_shown(
    ws: Workspace, server: Server
) -> None:
    """Two loops, a commit each: the page's list holds both commits its count says, and the
    diff since the fork is there to read before a merge (not only its stat)."""
    import httpx

    repo = repository(ws)
    worked(ws, repo)
    again = cli(ws, repo, "resume", "-p", "p", "-t", "t", "--again")
    assert again.returncode == ExitCode.COMPLETED, again.stderr
    task = f"{server.url}/api/projects/p/tasks/t"
    found = httpx.get(task, timeout=30).json()["git"]
    assert found["ahead"] == 2 == len(found["commits"]), found
    assert len({c["sha"] for c in found["commits"]}) == 2
    diff = httpx.get(f"{task}/diff", timeout=30)
    assert diff.status_code == 200, diff.text
    body = diff.json()
    assert body["fork_commit"] == found["fork_commit"] and not body["truncated"]
    assert body["tip"] == git(repo, "rev-parse", "run-agent/p/t")
    assert "+edited by attempt" in body["diff"] and "-original" in body["diff"]
    assert " shared.txt " in body["diff"] and "2 files changed" in body["diff"]
    plain = cli(ws, repo, "-p", "p", "-t", "plain", "go")
    assert plain.returncode == 0, plain.stderr
    refused = httpx.get(f"{server.url}/api/projects/p/tasks/plain/diff", timeout=30)
    assert refused.status_code == 400 and "no worktree" in refused.json()["error"]
    assert httpx.get(f"{server.url}/api/projects/p/tasks/nope/diff", timeout=30).status_code == 404


SECRET = "pa55-never-printed"


def test_a_password_in_a_remote_url_is_never_repeated(ws_outside: Workspace) -> None:
    """`merge --push` with a URL holding a password, as given and as a remote's URL (git fails
    to connect to a closed port and says so), on the command line and through the API: the
    password is in no line run-agent prints, answers or writes."""
    from starlette.testclient import TestClient

    import backends
    from runagent.issues.repository import GitError
    from runagent.issues.repository import git as run_agent_git
    from server.app import create_app
    from server.settings import Settings
    from tests.conftest import LOCAL, free_port

    ws = ws_outside
    repo = repository(ws)
    worked(ws, repo)
    url = f"http://user:{SECRET}@127.0.0.1:{free_port()}/x"
    given = cli(ws, repo, "merge", "-p", "p", "-t", "t", "--push", url)
    assert given.returncode == ExitCode.USAGE, given.stderr
    assert SECRET not in given.stdout + given.stderr and "user:***@127.0.0.1" in given.stderr
    git(repo, "remote", "add", "origin", url)
    failed = cli(ws, repo, "merge", "-p", "p", "-t", "t", "--push", "origin")
    assert failed.returncode == ExitCode.FAILED, failed.stderr
    assert SECRET not in failed.stdout + failed.stderr and "git push origin" in failed.stderr
    with pytest.raises(GitError) as raised:  # git's words and the command line, in one line
        run_agent_git(repo, "ls-remote", url)
    assert SECRET not in str(raised.value) and "user:***@" in str(raised.value)
    app = create_app(Settings(root=ws.root, config_path=ws.config, workdir=ws.path,
                              backend_names=backends.known()))  # fmt: skip
    with TestClient(app, base_url=LOCAL) as c:
        for push in (url, "origin"):
            answer = c.post("/api/projects/p/tasks/t/merge", json={"push": push})
            assert answer.status_code in (400, 500) and SECRET not in answer.text, answer.text
    written = [p for p in ws.root.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not written
