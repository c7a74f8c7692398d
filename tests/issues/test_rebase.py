"""`run-agent rebase`, with real git and real loops: the branch a task's work goes back into,
moved on meanwhile, brought into its worktree; merged cleanly, `merge` is then a fast-forward;
on a conflict the task's agent is resumed, told the files, and the task completes only once no
conflict marker is left and the merge is committed (and its check passes)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from runagent.errors import ExitCode
from runagent.issues import rebasing
from runagent.ops.sandbox import Bwrap
from tests.conftest import Server, Workspace, wait_for
from tests.gitrepo import GIT_ENV, commit, git
from tests.issues.test_merge import cli, repository, worked

# An agent that leaves the conflict as it is on its first attempt, and resolves it on the next.
RESOLVE = (
    'n=$(cat "$(git rev-parse --git-dir)/tries" 2>/dev/null || echo 0); n=$((n + 1)); '
    'echo "$n" > "$(git rev-parse --git-dir)/tries"; '
    'if [ "$n" -ge 2 ] && [ -f "$(git rev-parse --git-dir)/MERGE_HEAD" ]; then '
    "printf 'both sides\\n' > shared.txt && git add shared.txt && git commit -q --no-edit; fi"
)


def agent_args(ws: Workspace, args: list[str], **extra: object) -> None:
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["fake"]["command"] = ws.agent_argv(args)
    data["defaults"].update(extra)
    ws.config.write_text(yaml.safe_dump(data))


def status(ws: Workspace, repo: Path) -> dict[str, object]:
    done = cli(ws, repo, "status", "-p", "p", "-t", "t", "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def settled(ws: Workspace, repo: Path) -> str:
    """The task's status once its loop has ended."""
    return str(wait_for(lambda: (s := status(ws, repo)["status"]) not in
                        ("running", "queued") and s, 90, "the resumed loop to end"))  # fmt: skip


def test_a_branch_that_moved_on_is_merged_in_cleanly_and_merge_is_then_a_fast_forward(
    ws: Workspace,
) -> None:
    repo = repository(ws)
    tip = worked(ws, repo)
    other = commit(repo, "meanwhile on main", name="other.txt")
    done = cli(ws, repo, "rebase", "-p", "p", "-t", "t")
    assert done.returncode == 0, done.stderr
    assert f"merged main ({other[:12]}) into run-agent/p/t" in done.stdout
    assert "fast-forward" in done.stdout and "watch" not in done.stdout
    tree = ws.task("p", "t").worktree
    new = git(tree, "rev-parse", "HEAD")
    assert git(tree, "rev-parse", "HEAD^1") == tip and git(tree, "rev-parse", "HEAD^2") == other
    assert (tree / "other.txt").exists() and git(tree, "status", "--porcelain") == ""
    assert git(repo, "rev-parse", "run-agent/p/t") == new  # brought back into the repository
    subject = git(tree, "log", "-1", "--format=%s")
    assert subject == "Merge main into run-agent/p/t (run-agent rebase)"
    assert rebasing.last(ws.task("p", "t")).state == rebasing.MERGED  # type: ignore[union-attr]
    again = cli(ws, repo, "rebase", "-p", "p", "-t", "t", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["how"] == "up to date"
    merged = cli(ws, repo, "merge", "-p", "p", "-t", "t")
    assert merged.returncode == 0 and "(fast-forward, " in merged.stdout, merged.stderr
    assert git(repo, "rev-parse", "main") == new
    assert status(ws, repo)["status"] == "completed"


def test_a_conflict_goes_to_the_agent_and_the_task_completes_only_once_it_is_resolved(
    ws: Workspace,
) -> None:
    repo = repository(ws)
    worked(ws, repo)
    theirs = commit(repo, "main changed it too", name="shared.txt", text="main's line\n")
    refused = cli(ws, repo, "merge", "-p", "p", "-t", "t")
    assert refused.returncode == ExitCode.CONFLICT
    assert "`run-agent rebase -p p -t t` brings main into the task's worktree" in refused.stderr
    agent_args(ws, ["--shell", RESOLVE], max_restarts=3)
    done = cli(ws, repo, "rebase", "-p", "p", "-t", "t")
    assert done.returncode == 0, done.stderr
    assert f"merging main ({theirs[:12]}) into run-agent/p/t conflicts in shared.txt" in done.stdout
    assert "its loop goes on to resolve them" in done.stdout
    assert settled(ws, repo) == "completed"
    task = ws.task("p", "t")
    runs = sorted(p for p in (task.folder / "runs").iterdir())
    first, second = (yaml.safe_load((r / "run-info.yaml").read_text()) for r in runs[1:3])
    assert first["reason"] == "unresolved_conflict"  # it exited 0 with the markers left
    assert "conflict markers are left in shared.txt" in first["message"]
    assert second["status"] == "completed"
    prompt = (runs[1] / "prompt.md").read_text()
    assert "## Conflicts to resolve" in prompt and "- `shared.txt`" in prompt
    tree = task.worktree
    assert (tree / "shared.txt").read_text() == "both sides\n"
    assert git(tree, "rev-parse", "HEAD^2") == theirs
    assert rebasing.last(task).state == rebasing.RESOLVED  # type: ignore[union-attr]
    assert "Conflicts to resolve" not in rebasing_prompt_after(ws, repo)
    merged = cli(ws, repo, "merge", "-p", "p", "-t", "t")
    assert merged.returncode == 0 and "fast-forward" in merged.stdout, merged.stderr


def rebasing_prompt_after(ws: Workspace, repo: Path) -> str:
    """The prompt of one more run of the task (its rebase settled: not told again)."""
    agent_args(ws, ["--exit", "0"], max_restarts=0)
    again = cli(ws, repo, "resume", "-p", "p", "-t", "t", "--again")
    assert again.returncode == 0, again.stderr
    runs = sorted((ws.task("p", "t").folder / "runs").iterdir())
    return (runs[-1] / "prompt.md").read_text()


def test_a_rebase_left_unresolved_is_undone_by_abort(ws: Workspace) -> None:
    repo = repository(ws)
    tip = worked(ws, repo)
    commit(repo, "main changed it too", name="shared.txt", text="main's line\n")
    agent_args(ws, ["--exit", "1"], max_restarts=0)
    done = cli(ws, repo, "rebase", "-p", "p", "-t", "t")
    assert done.returncode == 0, done.stderr
    assert settled(ws, repo) == "failed"
    tree = ws.task("p", "t").worktree
    assert "<<<<<<<" in (tree / "shared.txt").read_text()
    twice = cli(ws, repo, "rebase", "-p", "p", "-t", "t")
    assert twice.returncode == ExitCode.CONFLICT and "rebase --abort" in twice.stderr
    undone = cli(ws, repo, "rebase", "-p", "p", "-t", "t", "--abort")
    assert undone.returncode == 0 and "undone" in undone.stdout, undone.stderr
    assert git(tree, "rev-parse", "HEAD") == tip and git(tree, "status", "--porcelain") == ""
    assert rebasing.last(ws.task("p", "t")) is None
    none = cli(ws, repo, "rebase", "-p", "p", "-t", "t", "--abort")
    assert none.returncode == ExitCode.USAGE and "no rebase waiting" in none.stderr


def test_a_check_that_fails_on_the_merge_sends_the_task_back_to_its_agent(
    ws: Workspace,
) -> None:
    """Merged cleanly, but the task's check (no file named other.txt may exist) fails on the
    result: the loop is resumed and told the check's output; it completes once it passes."""
    repo = repository(ws)
    check = "sh -c 'test ! -e other.txt || { echo other.txt must go; exit 1; }'"
    worked(ws, repo, "t", "--check", check)
    commit(repo, "meanwhile on main", name="other.txt")
    agent_args(ws, ["--shell", "git rm -q other.txt && git commit -q -m gone"], max_restarts=2)
    done = cli(ws, repo, "rebase", "-p", "p", "-t", "t")
    assert done.returncode == 0, done.stderr
    assert "but its check fails on the result" in done.stdout
    assert settled(ws, repo) == "completed"
    runs = sorted((ws.task("p", "t").folder / "runs").iterdir())
    prompt = (runs[1] / "prompt.md").read_text()
    assert "## The check fails after a merge" in prompt and "other.txt must go" in prompt
    assert not (ws.task("p", "t").worktree / "other.txt").exists()


def test_what_cannot_be_rebased_is_refused_in_one_line(ws: Workspace) -> None:
    repo = repository(ws)
    plain = cli(ws, repo, "-p", "p", "-t", "plain", "go")
    assert plain.returncode == 0, plain.stderr
    worked(ws, repo)
    cases = {
        ("-t", "plain"): (ExitCode.USAGE, "has no worktree of its own"),
        ("-t", "t", "--onto", "nope"): (ExitCode.USAGE, "branch 'nope' does not exist"),
        ("-t", "t", "--onto", "main", "--abort"): (ExitCode.USAGE, "do not go together"),
        ("-t", "missing"): (ExitCode.USAGE, "not found"),
    }
    (ws.task("p", "t").worktree / "shared.txt").write_text("uncommitted\n")
    cases[("-t", "t")] = (ExitCode.CONFLICT, "uncommitted changes")
    for args, (code, words) in cases.items():
        done = cli(ws, repo, "rebase", "-p", "p", *args)
        assert done.returncode == code, (args, done.stderr)
        assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_conflict_markers_are_read_only_inside_the_worktree_and_only_from_files(
    tmp_path: Path,
) -> None:
    """What an agent leaves where a conflicted file was (a link out, a FIFO) is not read."""
    tree, outside = tmp_path / "tree", tmp_path / "outside.txt"
    tree.mkdir()
    outside.write_text("<<<<<<< HEAD\n")
    (tree / "real.txt").write_text("a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> main\n")
    (tree / "clean.txt").write_text("=======\na rule, not a marker\n")
    (tree / "link.txt").symlink_to(outside)
    (tree / "dir").symlink_to(tmp_path)
    os.mkfifo(tree / "fifo.txt")
    assert rebasing._has_markers(tree, "real.txt")
    for name in ("clean.txt", "link.txt", "dir/outside.txt", "fifo.txt", "../outside.txt",
                 "gone.txt"):  # fmt: skip
        assert not rebasing._has_markers(tree, name), name


@pytest.mark.skipif(Bwrap(Path("/")).problem() is not None, reason="bubblewrap cannot run here")
def test_a_sandboxed_task_is_rebased_in_its_sandbox(ws_outside: Workspace) -> None:
    """The merge runs where the agent runs, under bubblewrap, whose view of the worktree's git
    folder (its config, its hooks read-only) is enough to merge, conflicts and all."""
    ws = ws_outside
    repo = repository(ws)
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["fake"]["sandbox"] = "bwrap"
    ws.config.write_text(yaml.safe_dump(data))
    worked(ws, repo)
    other = commit(repo, "meanwhile on main", name="other.txt")
    done = cli(ws, repo, "rebase", "-p", "p", "-t", "t")
    assert done.returncode == 0, done.stderr
    tree = ws.task("p", "t").worktree
    assert git(tree, "rev-parse", "HEAD^2") == other
    commit(repo, "main changed it too", name="shared.txt", text="main's line\n")
    agent_args(ws, ["--shell", RESOLVE], max_restarts=3)
    conflict = cli(ws, repo, "rebase", "-p", "p", "-t", "t")
    assert conflict.returncode == 0 and "conflicts in shared.txt" in conflict.stdout
    assert settled(ws, repo) == "completed"
    assert (tree / "shared.txt").read_text() == "both sides\n"


def test_the_api_rebases_and_a_running_task_is_refused(ws: Workspace, server: Server) -> None:
    repo = repository(ws)
    worked(ws, repo)
    other = commit(repo, "meanwhile on main", name="other.txt")
    url = f"{server.url}/api/projects/p/tasks/t/rebase"
    bad = httpx.post(url, json={"onto": 5}, timeout=30)
    assert bad.status_code == 400 and "onto" in bad.json()["error"]
    done = httpx.post(url, json={}, timeout=60)
    assert done.status_code == 200, done.text
    assert done.json()["how"] == "merged" and done.json()["commit"] == other
    detail = httpx.get(f"{server.url}/api/projects/p/tasks/t", timeout=30).json()
    assert detail["git"]["behind"] == 0 and detail["git"]["rebase"]["state"] == "merged"
    commit(repo, "more on main", name="more.txt")
    detail = httpx.get(f"{server.url}/api/projects/p/tasks/t", timeout=30).json()
    assert detail["git"]["behind"] == 1
    agent_args(ws, ["--wait-in-task", "go-on"], max_restarts=0)
    running = subprocess.Popen(
        ws.cli_argv("--config", str(ws.config), "--root", str(ws.root), "resume", "-p", "p",
                    "-t", "t", "--again"),
        cwd=repo, env={**os.environ, **GIT_ENV}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: status(ws, repo)["status"] == "running", 30, "the loop to run")
        busy = httpx.post(url, json={}, timeout=30)
        assert busy.status_code == 409 and "running" in busy.json()["error"], busy.text
    finally:
        (ws.task("p", "t").folder / "go-on").write_text("")
        running.wait(60)
