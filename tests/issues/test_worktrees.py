"""`run-agent worktrees list|prune`: issue worktrees listed, and pruned without losing work."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from runagent.errors import ExitCode
from tests.conftest import Workspace
from tests.gitrepo import GIT_ENV, git, make_repo
from tests.issues.test_issue_runs import issue_run, legacy_worktree, setup_config, worktrees


def listed(ws: Workspace) -> dict[str, dict[str, object]]:
    proc = ws.cli("worktrees", "list", "--json", env=GIT_ENV)
    assert proc.returncode == 0, proc.stderr
    return {f"{w['project_id']}/{w['task_id']}": w for w in json.loads(proc.stdout)}


def prune(ws: Workspace, *args: str) -> dict[str, dict[str, object]]:
    proc = ws.cli("worktrees", "prune", "--json", *args, env=GIT_ENV)
    assert proc.returncode == 0, proc.stderr
    return {f"{w['project_id']}/{w['task_id']}": w for w in json.loads(proc.stdout)}


def test_list_and_prune_completed_failed_dirty_and_merged(ws: Workspace) -> None:
    repo = make_repo(ws.path / "repo")
    setup_config(ws, ["--commit", "work {attempt}", "--ready-from", "1"])
    assert issue_run(ws, repo, "x", number="1").returncode == 0  # completed, 2 commits
    setup_config(ws, ["--ready-from", "1"])
    assert issue_run(ws, repo, "x", number="2").returncode == 0  # completed, to be merged
    setup_config(ws, ["--commit", "half"])
    assert issue_run(ws, repo, "--max-restarts", "0", "x", number="3").returncode == 1
    setup_config(ws, ["--ready-from", "1"])
    assert issue_run(ws, repo, "x", number="4").returncode == 0
    (ws.task("p", "issue-4").worktree / "scratch.txt").write_text("uncommitted work\n")
    git(repo, "merge", "-q", "--ff-only", "run-agent/p/issue-2")  # issue 2 was merged

    rows = listed(ws)
    assert set(rows) == {"p/issue-1", "p/issue-2", "p/issue-3", "p/issue-4"}
    one = rows["p/issue-1"]
    assert (one["status"], one["branch"], one["ahead"], one["dirty"], one["locked"]) == (
        "completed", "run-agent/p/issue-1", 2, False, None,
    )  # fmt: skip
    assert rows["p/issue-3"]["status"] == "failed" and rows["p/issue-4"]["dirty"] is True
    table = ws.cli("worktrees", env=GIT_ENV)
    assert table.returncode == 0 and "run-agent/p/issue-4" in table.stdout
    assert "dirty" in table.stdout

    done = prune(ws)
    assert {k: v["action"] for k, v in done.items()} == {
        "p/issue-1": "removed", "p/issue-2": "removed", "p/issue-3": "kept_unfinished",
        "p/issue-4": "kept_dirty",
    }  # fmt: skip
    assert (done["p/issue-1"]["branch_deleted"], done["p/issue-2"]["branch_deleted"]) == (
        False, True,
    )  # unmerged work stays on its branch; merged branches go  # fmt: skip
    branches = git(repo, "branch", "--format=%(refname:short)").split()
    assert "run-agent/p/issue-1" in branches and "run-agent/p/issue-2" not in branches
    assert not ws.task("p", "issue-1").worktree.exists()
    assert str(ws.task("p", "issue-1").worktree) not in worktrees(repo)
    assert set(listed(ws)) == {"p/issue-3", "p/issue-4"}

    dirty = ws.task("p", "issue-4")
    forced = prune(ws, "--all", "--force")
    assert forced["p/issue-4"]["action"] == "removed"
    saved = Path(str(forced["p/issue-4"]["saved_diff"]))
    assert saved.parent == dirty.folder and "scratch.txt" in saved.read_text()
    assert "+uncommitted work" in saved.read_text()
    assert forced["p/issue-3"]["action"] == "removed"
    assert listed(ws) == {}
    git(repo, "worktree", "prune")
    assert list(worktrees(repo)) == [str(repo)]


def test_a_dirty_worktree_is_never_removed_without_force(ws: Workspace) -> None:
    repo = make_repo(ws.path / "repo")
    setup_config(ws, ["--ready-from", "1"])
    assert issue_run(ws, repo, "x", number="1").returncode == 0
    tree = ws.task("p", "issue-1").worktree
    (tree / "README").write_text("changed, not committed\n")
    assert prune(ws, "--all")["p/issue-1"]["action"] == "kept_dirty"
    assert (tree / "README").read_text() == "changed, not committed\n"
    assert not list(ws.task("p", "issue-1").folder.glob("worktree-*.diff"))


def test_stale_registrations_are_repaired_not_fatal(ws: Workspace) -> None:
    """A linked worktree of before, locked by run-agent, its folder deleted: the lock lifted
    and the registration pruned; a clone whose worktree was deleted: its git folder removed.
    Neither makes prune fail."""
    import shutil

    repo = make_repo(ws.path / "repo")
    setup_config(ws, ["--ready-from", "1"])
    assert issue_run(ws, repo, "x", number="1").returncode == 0
    assert issue_run(ws, repo, "x", number="2").returncode == 0
    task, cloned = ws.task("p", "issue-1"), ws.task("p", "issue-2")
    legacy_worktree(repo, task)
    git(repo, "worktree", "lock", "--reason", "run-agent: task p/issue-1", str(task.worktree))
    shutil.rmtree(task.worktree)
    shutil.rmtree(cloned.worktree)
    rows = listed(ws)
    assert rows["p/issue-1"]["registered"] is True and rows["p/issue-2"]["registered"] is True
    done = prune(ws)
    assert {k: v["action"] for k, v in done.items()} == {"p/issue-1": "removed",
                                                         "p/issue-2": "removed"}  # fmt: skip
    assert list(worktrees(repo)) == [str(repo)]
    assert not cloned.worktree_git.exists()
    assert git(repo, "rev-parse", "run-agent/p/issue-2")  # its branch, not merged, is kept
    assert ws.cli("worktrees", "list", "--force").returncode == ExitCode.USAGE


def test_a_worktree_locked_by_someone_else_is_kept(ws: Workspace) -> None:
    """`git worktree lock` by someone else holds a linked worktree of before; a clone is
    locked by its task's lock alone, which a loop holds (tested with the loop that runs:
    test_the_worktree_is_locked_while_the_loop_runs), and git cannot lock it."""
    repo = make_repo(ws.path / "repo")
    setup_config(ws, ["--ready-from", "1"])
    assert issue_run(ws, repo, "x", number="1").returncode == 0
    task = ws.task("p", "issue-1")
    tree = task.worktree
    refused = subprocess.run(
        ["git", "-C", str(repo), "worktree", "lock", str(tree)],  # a clone: not git's to lock
        capture_output=True, text=True, env={**os.environ, **GIT_ENV},
    )  # fmt: skip
    assert refused.returncode != 0 and "not a working tree" in refused.stderr
    legacy_worktree(repo, task)
    git(repo, "worktree", "lock", "--reason", "on a USB disk", str(tree))
    assert prune(ws)["p/issue-1"]["action"] == "kept_locked"
    assert tree.is_dir()
