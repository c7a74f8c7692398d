"""Issue runs in git worktrees, through the real command line and real repositories."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import yaml

from runagent.errors import ExitCode
from runagent.store.lock import live_holder, read_holder
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import Reason, RunStatus
from tests.conftest import Server, Workspace, alive, wait_for
from tests.gitrepo import GIT_ENV, commit, git, make_repo

MARKER = "cocode ready for check"
# Local submodules are refused by default since git 2.38.1; the tests' own repositories are safe.
FILE_SUBMODULES = {
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "protocol.file.allow",
    "GIT_CONFIG_VALUE_0": "always",
}


def issue_run(ws: Workspace, repo: Path, *args: str, number: str = "1"):  # type: ignore[no-untyped-def]
    return ws.cli("-p", "p", "--issue", number, "--repo", str(repo), *args, env=GIT_ENV)


def setup_config(ws: Workspace, args: list[str], **extra: object) -> None:
    ws.write_config(args, env=GIT_ENV)
    data = yaml.safe_load(ws.config.read_text())
    data.update(extra)
    ws.config.write_text(yaml.safe_dump(data))


def worktrees(repo: Path) -> dict[str, dict[str, str]]:
    """`git worktree list --porcelain` of `repo`, by path."""
    found: dict[str, dict[str, str]] = {}
    for block in git(repo, "worktree", "list", "--porcelain").split("\n\n"):
        fields = dict(line.partition(" ")[::2] for line in block.splitlines())
        found[fields["worktree"]] = fields
    return found


def locked_by_us(ws: Workspace, label: str) -> str:
    """The lock `run-agent worktrees list` shows on a task's worktree, when run-agent's: a
    task's own clone is locked by its task's lock (git knows nothing of it), held by a live
    supervisor; a linked worktree of before, by `git worktree lock`."""
    listed = ws.cli("worktrees", "list", "--json", "--config", str(ws.config), env=GIT_ENV)
    assert listed.returncode == 0, listed.stderr
    row = next((w for w in json.loads(listed.stdout)
                if f"{w['project_id']}/{w['task_id']}" == label), {})  # fmt: skip
    reason = str(row.get("locked") or "")
    return reason if reason.startswith("run-agent") else ""


def own_clone(repo: Path, task: TaskPaths) -> None:
    """The task's worktree is a clone of its own, no worktree of `repo`'s git, its branch
    brought back into `repo` as it is in the clone."""
    assert str(task.worktree) not in worktrees(repo)
    assert git(task.worktree, "rev-parse", "--absolute-git-dir") == str(task.worktree_git)
    branch = git(task.worktree, "symbolic-ref", "--short", "HEAD")
    assert git(repo, "rev-parse", branch) == git(task.worktree, "rev-parse", "HEAD")


def legacy_worktree(repo: Path, task: TaskPaths) -> None:
    """Turn a task's clone into a linked worktree of `repo`, as run-agent made them before
    worktrees were clones (its record without `clone` and the git folders): such tasks go on."""
    record_path = task.issue_record if task.issue_record.exists() else task.worktree_record
    record = yaml.safe_load(record_path.read_text())
    shutil.rmtree(task.worktree)
    shutil.rmtree(task.worktree_git)
    git(repo, "worktree", "add", "-q", str(task.worktree), record["branch"])
    for key in ("clone", "git_dir", "common_dir", "synced"):
        record.pop(key, None)
    record_path.write_text(yaml.safe_dump(record))


def test_an_issue_run_works_in_a_fresh_worktree_of_the_default_branch(ws: Workspace) -> None:
    repo = make_repo(ws.path / "repo")
    main = git(repo, "rev-parse", "HEAD")
    git(repo, "switch", "-q", "-c", "feature")
    commit(repo, "unrelated work on a feature branch")
    git(repo, "switch", "-q", "main")
    clone = ws.path / "clone"
    git(ws.path, "clone", "-q", str(repo), str(clone))
    git(clone, "switch", "-q", "-c", "elsewhere", "origin/feature")  # not the default branch
    setup_config(
        ws,
        ["--commit", "progress {attempt}", "--ready-from", "2",
         "--echo-env", *[f"COCODE_{n}" for n in
                         ("REPO_PATH", "ISSUE_NUMBER", "ISSUE_URL", "ISSUE_BODY_FILE",
                          "READY_MARKER")]],
    )  # fmt: skip
    body = ws.path / "issue.txt"
    body.write_text("Fix the bug in main.py\n")
    proc = issue_run(
        ws, clone, "--issue-url", "https://example.invalid/issues/1", "--issue-body-file",
        str(body), number="1",
    )  # fmt: skip
    assert proc.returncode == ExitCode.COMPLETED, proc.stderr
    task = ws.task("p", "issue-1")
    tree = task.worktree
    first, second = ws.runs("p", "issue-1")
    assert (first.reason, second.reason) == (Reason.NO_READY_MARKER, Reason.READY_MARKER)
    # Both attempts worked in the one worktree, from the default branch's tip, on a new branch.
    assert {r.cwd for r in (first, second)} == {str(tree)}
    assert {(r.repo, r.branch, r.base_commit) for r in (first, second)} == {
        (str(clone), "run-agent/p/issue-1", main)
    }
    assert second.head_commit == git(tree, "rev-parse", "HEAD")
    log = git(tree, "log", "--format=%s", f"{main}..HEAD").splitlines()
    assert log == ["finish attempt 2", "progress 2", "progress 1"]
    stdout = task.run(first.run_id).stdout.read_text()
    assert f"COCODE_REPO_PATH={tree}" in stdout and "COCODE_ISSUE_NUMBER=1" in stdout
    assert "COCODE_ISSUE_URL=https://example.invalid/issues/1" in stdout
    assert f"COCODE_ISSUE_BODY_FILE={task.issue_body}" in stdout
    assert f"COCODE_READY_MARKER={MARKER}" in stdout
    assert task.issue_body.read_text() == "Fix the bug in main.py\n"
    assert task.task_md.read_text() == "Fix the bug in main.py\n"  # the body is the prompt
    settings = yaml.safe_load((task.folder / "task.yaml").read_text())
    assert (settings["until"], settings["timeout"]) == ("ready-marker", 1800.0)
    own_clone(clone, task)  # its git folder its own, the work brought back into --repo
    assert locked_by_us(ws, "p/issue-1") == ""  # unlocked once the loop ended
    assert live_holder(task.lock) is None
    assert git(clone, "rev-parse", "--abbrev-ref", "HEAD") == "elsewhere"  # left as it was


def test_the_worktree_is_locked_while_the_loop_runs(ws: Workspace) -> None:
    """What `git worktree lock` did for a linked worktree, the task's lock does for its own
    clone: shown as locked while the loop runs, never pruned then (`--all` neither), unlocked
    when the loop ends."""
    repo = make_repo(ws.path / "repo")
    go = ws.path / "go"
    setup_config(ws, ["--wait-for", str(go), "--ready-from", "1"])
    proc = ws.start_cli("-p", "p", "--issue", "2", "--repo", str(repo), "x", env=GIT_ENV)
    task = ws.task("p", "issue-2")
    try:
        wait_for(lambda: locked_by_us(ws, "p/issue-2"), what="the worktree locked by the loop")
        assert locked_by_us(ws, "p/issue-2").startswith("run-agent: task p/issue-2 is running")
        pruned = ws.cli("worktrees", "prune", "--all", "--force", "--json", env=GIT_ENV)
        assert pruned.returncode == 0, pruned.stderr
        assert [w["action"] for w in json.loads(pruned.stdout)] == ["kept_running"]
        assert task.worktree.is_dir() and task.worktree_git.is_dir()
    finally:
        go.touch()
    assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""
    proc.communicate()
    assert locked_by_us(ws, "p/issue-2") == ""
    own_clone(repo, task)


def test_a_stale_branch_is_never_reused_and_its_marker_never_counts(ws: Workspace) -> None:
    repo = make_repo(ws.path / "repo")
    git(repo, "branch", "run-agent/p/issue-3")
    git(repo, "switch", "-q", "run-agent/p/issue-3")
    commit(repo, f"old attempt\n\n{MARKER}")
    git(repo, "switch", "-q", "main")
    setup_config(ws, [])  # exits 0 without committing
    proc = issue_run(ws, repo, "--max-restarts", "0", "x", number="3")
    assert proc.returncode == ExitCode.FAILED, proc.stderr
    (info,) = ws.runs("p", "issue-3")
    assert (info.status, info.reason) == (RunStatus.FAILED, Reason.NO_READY_MARKER)
    assert info.branch == "run-agent/p/issue-3-2"
    assert info.base_commit == git(repo, "rev-parse", "main")


def test_submodules_are_initialised_and_setup_runs_once(ws: Workspace) -> None:
    sub = make_repo(ws.path / "sub")
    repo = make_repo(ws.path / "repo")
    env = {**os.environ, **GIT_ENV, **FILE_SUBMODULES}
    import subprocess

    subprocess.run(
        ["git", "-C", str(repo), "submodule", "add", "-q", str(sub), "lib"], env=env, check=True
    )
    git(repo, "commit", "-q", "-m", "add a submodule")
    setup_config(
        ws, ["--fail-first", "1", "--ready-from", "1"],
        issues={"setup": ["sh", "-c", "echo once >> ../setup-ran; touch .env"]},
    )  # fmt: skip
    proc = ws.cli("-p", "p", "--issue", "4", "--repo", str(repo), "x",
                  env={**GIT_ENV, **FILE_SUBMODULES})  # fmt: skip
    assert proc.returncode == ExitCode.COMPLETED, proc.stderr
    task = ws.task("p", "issue-4")
    assert (task.worktree / "lib" / "README").read_text() == "a repository\n"
    assert (task.worktree / ".env").exists()
    assert (task.folder / "setup-ran").read_text() == "once\n"  # not again for attempt 2


def test_a_crash_mid_run_leaves_nothing_that_blocks_the_next_run(ws: Workspace) -> None:
    repo = make_repo(ws.path / "repo")
    go = ws.path / "go"
    setup_config(ws, ["--wait-for", str(go)])
    proc = ws.start_cli("-p", "p", "--issue", "5", "--repo", str(repo), "x", env=GIT_ENV)
    task = ws.task("p", "issue-5")
    wait_for(lambda: locked_by_us(ws, "p/issue-5"), what="the worktree locked by the loop")
    wait_for(lambda: ws.runs("p", "issue-5") and ws.runs("p", "issue-5")[0].pid, what="a pid")
    commit(task.worktree, "partial work")  # what the agent did before the crash
    os.kill(proc.pid, signal.SIGKILL)  # the supervisor dies; its reaper stops the agent
    proc.communicate()
    pids = ws.agent_pids()
    wait_for(lambda: not any(alive(p) for p in pids), what="the agent stopped")
    left = read_holder(task.lock)  # left locked by the crash, by a supervisor that is dead
    assert left is not None and left.pid == proc.pid and not left.alive()
    assert locked_by_us(ws, "p/issue-5") == ""  # not shown as held: nothing blocks
    # The next run of the task takes its worktree back and goes on with the work.
    setup_config(ws, ["--ready-from", "1"])
    again = issue_run(ws, repo, "x", number="5")
    assert again.returncode == ExitCode.COMPLETED, again.stderr
    assert "partial work" in git(task.worktree, "log", "--format=%s")
    assert "partial work" in git(repo, "log", "--format=%s", "run-agent/p/issue-5")
    assert locked_by_us(ws, "p/issue-5") == "" and live_holder(task.lock) is None
    own_clone(repo, task)


def test_a_worktree_folder_deleted_while_locked_is_repaired(ws: Workspace) -> None:
    """A crash and a hasty cleanup: the worktree deleted, its clone's git folder left (set
    aside, never deleted); a linked worktree of before, locked, its folder deleted (the lock
    lifted, the registration pruned). Neither blocks the next run."""
    repo = make_repo(ws.path / "repo")
    setup_config(ws, ["--ready-from", "1"])
    task = ws.task("p", "issue-6")
    assert issue_run(ws, repo, "x", number="6").returncode == 0
    shutil.rmtree(task.worktree)
    proc = issue_run(ws, repo, "--again", "x", number="6")
    assert proc.returncode == ExitCode.COMPLETED, proc.stderr
    latest = ws.runs("p", "issue-6")[-1]
    assert latest.branch == "run-agent/p/issue-6-2"  # the old branch is kept, not reused
    assert [p.name for p in task.folder.glob("worktree.git.stale-*")]
    own_clone(repo, task)
    legacy_worktree(repo, task)
    git(repo, "worktree", "lock", "--reason", "run-agent: task p/issue-6", str(task.worktree))
    shutil.rmtree(task.worktree)
    proc = issue_run(ws, repo, "--again", "x", number="6")
    assert proc.returncode == ExitCode.COMPLETED, proc.stderr
    assert ws.runs("p", "issue-6")[-1].branch == "run-agent/p/issue-6-3"
    assert list(worktrees(repo)) == [str(repo)]  # the stale registration is gone
    own_clone(repo, task)


def test_issue_run_refusals(ws: Workspace) -> None:
    repo = make_repo(ws.path / "repo")
    cases = [
        (["--issue", "x", "--repo", str(repo), "p"], "--issue: 'x' is not an issue number"),
        (["--issue", "1", "p"], "--issue needs --repo"),
        (["--repo", str(repo), "p"], "go with --issue N"),
        (["--issue", "1", "--repo", str(ws.root.parent), "p"], "is not a git repository"),
        (["--issue", "1", "--repo", str(repo)], "needs the issue's text"),
        (["--issue", "1", "--repo", str(repo), "--cwd", str(repo), "p"], "--cwd does not go"),
    ]
    for args, fragment in cases:
        proc = ws.cli("-p", "p", *args, env=GIT_ENV)
        assert proc.returncode == ExitCode.USAGE, (args, proc.stderr)
        assert fragment in proc.stderr, (args, proc.stderr)
    assert not ws.task("p", "issue-1").folder.exists()
    bad = ws.cli("-p", "p", "-t", "x.lock", "--issue", "1", "--repo", str(repo), "p", env=GIT_ENV)
    assert bad.returncode == ExitCode.USAGE and "cannot name a git branch" in bad.stderr


def test_resume_goes_on_in_the_issue_worktree(ws: Workspace) -> None:
    repo = make_repo(ws.path / "repo")
    setup_config(ws, ["--commit", "first go"])
    assert issue_run(ws, repo, "--max-restarts", "0", "x", number="8").returncode == 1
    setup_config(ws, ["--ready-from", "1", "--echo-env", "COCODE_ISSUE_NUMBER"])
    proc = ws.cli("resume", "-p", "p", "-t", "issue-8", env=GIT_ENV)
    assert proc.returncode == ExitCode.COMPLETED, proc.stderr
    first, second = ws.runs("p", "issue-8")
    assert first.cwd == second.cwd == str(ws.task("p", "issue-8").worktree)
    assert first.branch == second.branch == "run-agent/p/issue-8"
    assert second.base_commit == first.head_commit  # each loop's base is its own start
    task = ws.task("p", "issue-8")
    assert "COCODE_ISSUE_NUMBER=8" in task.run(second.run_id).stdout.read_text()


def test_status_json_carries_the_issue_branch_commits_and_marker(ws: Workspace) -> None:
    import json

    repo = make_repo(ws.path / "repo")
    setup_config(ws, ["--commit", "progress {attempt}", "--ready-from", "2"])
    proc = issue_run(ws, repo, "--issue-url", "https://example.invalid/i/9", "x", number="9")
    assert proc.returncode == 0, proc.stderr
    shown = ws.cli("status", "-p", "p", "-t", "issue-9", "--json", env=GIT_ENV)
    assert shown.returncode == 0, shown.stderr
    work = json.loads(shown.stdout)["git"]
    assert work["issue"] == {"number": 9, "url": "https://example.invalid/i/9"}
    assert work["branch"] == "run-agent/p/issue-9" and work["repo"] == str(repo)
    # The latest loop's base: this loop's commits, newest first.
    assert [c["subject"] for c in work["commits"]] == [
        "finish attempt 2", "progress 2", "progress 1",
    ]  # fmt: skip
    assert work["marker_seen"] is True
    assert work["marker_commit"] == work["commits"][0]["sha"]
    setup_config(ws, [])
    failed = issue_run(ws, repo, "--max-restarts", "0", "x", number="10")
    assert failed.returncode == 1
    other = json.loads(ws.cli("status", "-p", "p", "-t", "issue-10", "--json").stdout)["git"]
    assert (other["commits"], other["marker_seen"]) == ([], False)
    text = ws.cli("status", "-p", "p", "-t", "issue-9").stdout
    assert "issue         #9 https://example.invalid/i/9" in text
    assert "3 commits since" in text and "ready marker  seen" in text


def test_the_api_task_detail_carries_the_git_work_for_the_page(ws: Workspace) -> None:
    from starlette.testclient import TestClient

    from server.app import Settings, create_app
    from tests.conftest import LOCAL

    repo = make_repo(ws.path / "repo")
    setup_config(ws, ["--ready-from", "1"])
    assert issue_run(ws, repo, "x", number="11").returncode == 0
    setup_config(ws, [])
    assert ws.cli("-p", "p", "-t", "plain", "x").returncode == 0
    app = create_app(Settings(root=ws.root, config_path=ws.config))
    with TestClient(app, base_url=LOCAL) as client:
        work = client.get("/api/projects/p/tasks/issue-11").json()["git"]
        assert work["issue"]["number"] == 11 and work["marker_seen"] is True
        assert [c["subject"] for c in work["commits"]] == ["finish attempt 1"]
        assert client.get("/api/projects/p/tasks/plain").json()["git"] is None


def test_a_setup_command_that_hangs_is_stopped_by_the_timeout(ws: Workspace) -> None:
    repo = make_repo(ws.path / "repo")
    setup_config(ws, ["--ready-from", "1"], issues={"setup": ws.agent_argv(["--sleep", "60"])})
    proc = issue_run(ws, repo, "--timeout", "1s", "x", number="13")
    assert proc.returncode == ExitCode.TIMED_OUT, proc.stderr
    assert "ran longer than 1s" in proc.stderr
    pids = ws.agent_pids()
    assert pids and not any(alive(p) for p in pids)  # its whole group was killed
    assert ws.runs("p", "issue-13") == []  # no agent started


def test_an_issue_run_starts_from_the_api_as_from_the_command_line(
    ws: Workspace, server: Server
) -> None:
    """The page's form and the API take the issue (number, repository, link; the prompt is its
    body) through the one door: a detached loop in a fresh worktree of the default branch,
    completed by the ready marker, with the COCODE_* variables. A repository that is none, or
    that holds the runs root, is refused before anything is made."""
    import httpx

    repo = make_repo(ws.path / "repo")
    main = git(repo, "rev-parse", "HEAD")
    setup_config(ws, ["--ready-from", "1", "--echo-env", "COCODE_ISSUE_NUMBER",
                      "COCODE_ISSUE_URL"])  # fmt: skip
    url = f"{server.url}/api/projects/p/tasks"
    issue = {"number": 7, "repo": str(repo), "url": "https://example.invalid/issues/7"}
    plain = ws.path / "plain"
    plain.mkdir()
    bad = httpx.post(url, json={"task_id": "i7", "prompt": "Fix it",
                                "issue": {**issue, "repo": str(plain)}}, timeout=30)  # fmt: skip
    assert bad.status_code == 400 and "not a git repository" in bad.json()["error"], bad.text
    assert not ws.task("p", "i7").folder.exists()
    started = httpx.post(url, json={"task_id": "i7", "prompt": "Fix the bug", "issue": issue},
                         timeout=30)  # fmt: skip
    assert started.status_code == 202, started.text
    task = ws.task("p", "i7")
    wait_for(
        lambda: httpx.get(f"{url}/i7", timeout=30).json()["status"] == "completed", 60, "the run"
    )
    (run,) = ws.runs("p", "i7")
    assert run.cwd == str(task.worktree) and run.base_commit == main
    assert run.reason == Reason.READY_MARKER
    stdout = task.run(run.run_id).stdout.read_text()
    assert "COCODE_ISSUE_NUMBER=7" in stdout
    assert "COCODE_ISSUE_URL=https://example.invalid/issues/7" in stdout
    assert task.issue_body.read_text() == "Fix the bug"
    record = yaml.safe_load(task.issue_record.read_text())
    assert (record["issue"], record["branch"]) == (7, "run-agent/p/i7")
    detail = httpx.get(f"{url}/i7", timeout=30).json()
    assert detail["git"]["issue"]["number"] == 7


def test_a_schedule_fires_an_issue_run(ws: Workspace) -> None:
    repo = make_repo(ws.path / "repo")
    setup_config(ws, ["--ready-from", "1"], schedules={"triage": {
        "cron": "0 9 * * 1", "project": "p", "task": "triage", "prompt": "Triage the issue",
        "issue": {"number": 12, "repo": str(repo)},
    }})  # fmt: skip
    fired = ws.cli("schedule", "now", "triage", env=GIT_ENV)
    assert fired.returncode == 0, fired.stderr
    task = ws.task("p", "triage")
    wait_for(lambda: ws.runs("p", "triage") and ws.runs("p", "triage")[0].end_time, 60, "run")
    (run,) = ws.runs("p", "triage")
    assert run.cwd == str(task.worktree) and run.reason == Reason.READY_MARKER
    assert yaml.safe_load(task.issue_record.read_text())["issue"] == 12


def test_an_issue_run_detached_from_the_command_line_runs_on_in_its_worktree(
    ws: Workspace,
) -> None:
    """`--detach` hands an issue run to a detached loop through the door (which writes the
    issue down for it) and returns at once; the loop works in the issue's worktree until the
    ready marker, as the foreground run does."""
    repo = make_repo(ws.path / "repo")
    main = git(repo, "rev-parse", "HEAD")
    setup_config(ws, ["--commit", "progress {attempt}", "--ready-from", "1",
                      "--echo-env", "COCODE_ISSUE_NUMBER"])  # fmt: skip
    proc = issue_run(ws, repo, "--detach", "Fix the bug", number="2")
    assert proc.returncode == 0, proc.stderr
    assert "task p/issue-2 started on local (supervisor pid" in proc.stderr
    task = ws.task("p", "issue-2")
    wait_for(lambda: task.done.exists() or (ws.runs("p", "issue-2") or [None])[-1], 30, "a run")
    run = wait_for(
        lambda: (r := ws.runs("p", "issue-2")) and r[-1].status is RunStatus.COMPLETED and r[-1],
        60, "the detached issue run to complete",
    )  # fmt: skip
    assert run.reason is Reason.READY_MARKER and run.cwd == str(task.worktree)
    assert (run.branch, run.base_commit) == ("run-agent/p/issue-2", main)
    assert "COCODE_ISSUE_NUMBER=2" in task.run(run.run_id).stdout.read_text()
    assert yaml.safe_load(task.issue_record.read_text())["issue"] == 2
    wait_for(lambda: not ws.leftovers(), 20, "its supervisor to exit")
