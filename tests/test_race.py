"""Races (`--race N`, `--agents a,b,c`), through the real command line, real git and real
processes: the first racer to complete wins and the others are stopped (`lost_race`, their
worktrees gone), a race where every racer gives up fails with each one's reason, and a race
stopped by `stop`, by Ctrl-C of the command line that follows it, or by its shared budget
stops every racer; no process outlives any of them (the `ws` fixture checks)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from runagent.errors import ExitCode
from runagent.store import race
from runagent.store.lock import live_holder
from runagent.store.runinfo import Reason, RunStatus
from tests.conftest import Workspace, wait_for
from tests.gitrepo import GIT_ENV, git, make_repo

WORK = ["--commit", "work of {attempt}"]
# A race needs a check: every race here is judged by one that passes (`true`), so that its
# racers complete as their agents say (a check that fails is the loop's: tests/loop/test_check.py).
PASSING = {"check": "true"}


def configure(
    ws: Workspace, agents: dict[str, list[str]], check: bool = True, **extra: Any
) -> Path:
    """A repository, and a config whose agents (the first the default) run the fake agent with
    their arguments, committing in their worktrees, judged by a check that passes; the
    repository's folder."""
    first, *_ = agents
    ws.write_config(agents[first], agents=agents, env=GIT_ENV)
    data = yaml.safe_load(ws.config.read_text())
    data["defaults"]["agent"] = first
    data["defaults"].update({**(PASSING if check else {}), **extra})
    ws.config.write_text(yaml.safe_dump(data))
    return make_repo(ws.path / "repo")


def cli(
    ws: Workspace, folder: Path, *args: str, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ws.cli_argv("--config", str(ws.config), "--root", str(ws.root), *args), cwd=folder,
        env={**os.environ, **GIT_ENV}, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def start(ws: Workspace, folder: Path, *args: str) -> subprocess.Popen[str]:
    """`run-agent ARGS` in a session of its own (as a shell runs a foreground command)."""
    return subprocess.Popen(
        ws.cli_argv("--config", str(ws.config), "--root", str(ws.root), *args), cwd=folder,
        env={**os.environ, **GIT_ENV}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def status(ws: Workspace, folder: Path, task: str = "t") -> dict[str, Any]:
    done = cli(ws, folder, "status", "-p", "p", "-t", task, "--json")
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def racing(ws: Workspace, *racers: str) -> bool:
    """Every racer's agent at work (its first run started)."""
    return all(ws.runs("p", r) for r in racers)


def test_the_second_racer_wins_and_the_others_are_stopped_with_their_worktrees_gone(
    ws: Workspace,
) -> None:
    """--race 3: the agent waits for a word in its task folder; only t.2 is given it. It wins:
    t.1 and t.3 are stopped (their runs `lost_race`), their worktrees removed, and the race's
    task is completed with t.2's branch, which `merge` brings back."""
    repo = configure(ws, {"fake": [*WORK, "--wait-in-task", "go"]})
    follow = start(ws, repo, "-p", "p", "-t", "t", "--race", "3", "fix it")
    try:
        wait_for(lambda: racing(ws, "t.1", "t.2", "t.3"), 60, "three racers at work")
        (ws.task("p", "t.2").folder / "go").touch()
        _, err = follow.communicate(timeout=60)
    finally:
        if follow.poll() is None:
            os.killpg(follow.pid, signal.SIGKILL)
            follow.wait(10)
    assert follow.returncode == ExitCode.COMPLETED, err
    assert "racer p/t.2 won race p/t" in err and "race p/t won by p/t.2" in err
    record = race.read(ws.task())
    assert record is not None and record.winner == "t.2" and record.outcome == "completed"
    for loser in ("t.1", "t.3"):
        (run,) = ws.runs("p", loser)
        assert (run.status, run.reason) == (RunStatus.STOPPED, Reason.LOST_RACE)
        assert run.message == "lost the race to p/t.2"
        assert not ws.task("p", loser).worktree.exists()  # its tree gone
        # Its branch held no work (merged, as pruning judges it): gone with its worktree.
        assert not git(repo, "branch", "--list", f"run-agent/p/{loser}")
    (won,) = ws.runs("p", "t.2")
    assert won.status is RunStatus.COMPLETED and won.branch == "run-agent/p/t.2"
    shown = status(ws, repo)
    assert shown["status"] == "completed"
    rows = {r["task_id"]: r for r in shown["race"]["racers"]}
    assert rows["t.2"]["won"] and rows["t.2"]["reason"] is None
    assert rows["t.1"]["reason"] == rows["t.3"]["reason"] == "lost_race"
    # Its git work is the winner's: its branch and commits, for the page's Merge.
    assert shown["git"]["branch"] == "run-agent/p/t.2" and shown["git"]["ahead"] == 1
    assert [c["subject"] for c in shown["git"]["commits"]] == ["work of 1"]
    assert live_holder(ws.task().lock) is None
    merged = cli(ws, repo, "merge", "-p", "p", "-t", "t")
    assert merged.returncode == 0, merged.stderr
    assert "merged run-agent/p/t.2 into main" in merged.stdout
    assert git(repo, "log", "-1", "--format=%s") == "work of 1"


def test_the_second_agent_wins_on_its_second_attempt(ws: Workspace) -> None:
    """--agents slow,quick: quick fails its first attempt and completes its second, while slow
    is still at work: quick wins, slow loses."""
    repo = configure(ws, {"slow": ["--wait-in-task", "never"],
                          "quick": [*WORK, "--fail-first", "1"]})  # fmt: skip
    done = cli(ws, repo, "-p", "p", "-t", "t", "--agents", "slow,quick", "fix it")
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    record = race.read(ws.task())
    assert record is not None and record.winner == "t.quick"
    quick = ws.runs("p", "t.quick")
    assert [r.status for r in quick] == [RunStatus.FAILED, RunStatus.COMPLETED]
    (slow,) = ws.runs("p", "t.slow")
    assert slow.reason is Reason.LOST_RACE and slow.agent == "slow"
    assert not ws.task("p", "t.slow").worktree.exists()


def test_a_race_where_every_racer_gives_up_fails_with_each_ones_reason(ws: Workspace) -> None:
    repo = configure(ws, {"fake": ["--exit", "9"], "other": ["--exit", "1"]}, max_restarts=1)
    done = cli(ws, repo, "-p", "p", "-t", "t", "--agents", "fake,other", "fix it")
    assert done.returncode == ExitCode.FAILED, done.stderr
    assert "race p/t failed: every racer gave up" in done.stderr
    assert "p/t.fake exit_code" in done.stderr and "p/t.other exit_code" in done.stderr
    shown = status(ws, repo)
    assert shown["status"] == "failed" and shown["race"]["outcome"] == "failed"
    rows = {r["task_id"]: r for r in shown["race"]["racers"]}
    assert rows["t.fake"]["message"] == "exited with code 9"
    assert rows["t.other"]["status"] == "failed" and rows["t.other"]["attempt"] == 2
    text = cli(ws, repo, "status", "-p", "p", "-t", "t")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert "RACER    AGENT  STATUS  ATTEMPT  SPEND  CHECK  REASON" in lines
    assert any(line.split()[:4] == ["t.fake", "fake", "failed", "2"]
               and line.endswith("exit_code: exited with code 9") for line in lines)  # fmt: skip
    assert any(line.startswith("ended") and "every racer gave up" in line for line in lines)
    refused = cli(ws, repo, "merge", "-p", "p", "-t", "t")
    assert refused.returncode == ExitCode.USAGE and "has no winner" in refused.stderr


def test_deleting_a_race_deletes_its_racers_and_none_while_one_runs(ws: Workspace) -> None:
    repo = configure(ws, {"fake": ["--exit", "9"], "other": ["--wait-in-task", "go"]},
                     max_restarts=0)  # fmt: skip
    started = cli(ws, repo, "-p", "p", "-t", "t", "--agents", "fake,other", "--detach", "x")
    assert started.returncode == 0, started.stderr
    wait_for(lambda: racing(ws, "t.other"), 30, "the racers to run")
    refused = cli(ws, repo, "delete", "-p", "p", "-t", "t", "--yes")
    assert refused.returncode == ExitCode.ALREADY_RUNNING, refused.stderr
    assert "t.other" in refused.stderr or "p/t " in refused.stderr
    assert ws.task("p", "t.other").folder.is_dir() and ws.task().folder.is_dir()
    (ws.task("p", "t.other").folder / "go").touch()
    wait_for(lambda: status(ws, repo)["status"] in ("completed", "failed"), 60, "the race")
    wait_for(lambda: live_holder(ws.task().lock) is None, 30, "its watcher to end")
    deleted = cli(ws, repo, "delete", "-p", "p", "-t", "t", "--yes")
    assert deleted.returncode == 0, deleted.stderr
    for task in ("t", "t.fake", "t.other"):  # the race's task went with its racers
        assert not ws.task("p", task).folder.exists(), task


def test_a_race_whose_watcher_was_killed_is_judged_when_a_racer_ends(ws: Workspace) -> None:
    """The watcher of a detached race is SIGKILLed: the racers go on, and when one's loop ends
    a new watcher is started, which finds it won and stops the other."""
    repo = configure(ws, {"slow": ["--wait-in-task", "never"],
                          "quick": [*WORK, "--wait-in-task", "go"]})  # fmt: skip
    started = cli(ws, repo, "-p", "p", "-t", "t", "--agents", "slow,quick", "--detach", "x")
    assert started.returncode == 0, started.stderr
    wait_for(lambda: racing(ws, "t.slow", "t.quick"), 30, "the racers to run")
    watcher = live_holder(ws.task().lock)
    assert watcher is not None
    os.kill(watcher.pid, signal.SIGKILL)
    wait_for(lambda: live_holder(ws.task().lock) is None, 30, "the watcher gone")
    (ws.task("p", "t.quick").folder / "go").touch()
    wait_for(lambda: (r := race.read(ws.task())) is not None and r.over, 60, "the race judged")
    record = race.read(ws.task())
    assert record is not None and record.winner == "t.quick" and record.outcome == "completed"
    wait_for(lambda: ws.runs("p", "t.slow")[0].reason is Reason.LOST_RACE, 30, "slow stopped")
    wait_for(lambda: live_holder(ws.task().lock) is None, 30, "the new watcher to end")


def test_stop_stops_every_racer_of_a_detached_race(ws: Workspace) -> None:
    repo = configure(ws, {"fake": ["--wait-in-task", "never"]})
    done = cli(ws, repo, "-p", "p", "-t", "t", "--race", "2", "--detach", "fix it")
    assert done.returncode == 0, done.stderr
    assert "race p/t started (2 racers, watcher pid" in done.stderr
    wait_for(lambda: racing(ws, "t.1", "t.2"), 60, "both racers at work")
    assert status(ws, repo)["status"] == "running"
    stopped = cli(ws, repo, "stop", "-p", "p", "-t", "t")
    assert stopped.returncode == 0, stopped.stderr
    assert "task p/t stopped" in stopped.stdout
    for racer in ("t.1", "t.2"):
        assert live_holder(ws.task("p", racer).lock) is None
        (run,) = ws.runs("p", racer)
        assert run.status is RunStatus.STOPPED
    record = race.read(ws.task())
    assert record is not None and record.outcome == "stopped" and record.winner is None
    assert status(ws, repo)["status"] == "stopped"
    assert ws.task("p", "t.1").worktree.exists()  # no winner: the work is kept


def test_list_and_fleet_show_a_races_racers_side_by_side(ws: Workspace) -> None:
    repo = configure(ws, {"fake": ["--wait-in-task", "never"], "other": ["--wait-in-task", "x"]})
    done = cli(ws, repo, "-p", "p", "-t", "t", "--agents", "fake,other", "--detach", "fix it")
    assert done.returncode == 0, done.stderr
    assert cli(ws, repo, "-p", "p", "-t", "solo", "--detach", "alone").returncode == 0
    try:
        wait_for(lambda: racing(ws, "t.fake", "t.other", "solo"), 60, "the racers at work")
        listed = cli(ws, repo, "list")
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        assert lines[0].split() == ["PROJECT", "TASK", "STATUS", "RUNS", "LATEST", "RUN", "RACE"]
        (race_row,) = [line for line in lines if line.split()[:2] == ["p", "t"]]
        assert race_row.split()[2] == "running" and race_row.endswith("2 racers, racing")
        at = lines.index(race_row)  # its racers right under it, indented
        assert [line.split()[1] for line in lines[at + 1 : at + 3]] == ["t.fake", "t.other"]
        assert lines[at + 1].split()[2] == "running"
        assert lines[at + 1].endswith("fake · attempt 1")
        fleet = cli(ws, repo, "fleet")
        assert fleet.returncode == 0, fleet.stderr
        text = fleet.stdout.splitlines()
        assert text[0].startswith("3 running (1 race) · 0 queued")  # t.fake, t.other, solo
        at = text.index("races:")
        assert text[at + 1].split() == ["p/t", "2", "racers,", "racing"]
        assert text[at + 2].split()[:4] == ["t.fake", "fake", "running", "1"]
        assert text[at + 3].split()[:4] == ["t.other", "other", "running", "1"]
        shown = json.loads(cli(ws, repo, "fleet", "--json").stdout)
        (entry,) = shown["races"]
        assert [r["agent"] for r in entry["race"]["racers"]] == ["fake", "other"]
        assert shown["counts"]["running"] == 3 and shown["counts"]["races"] == 1
        from server.metrics import render

        scraped = render(ws.root, 0).decode()
        for racer, agent in (("t.fake", "fake"), ("t.other", "other")):
            labels = f'agent="{agent}",project="p",race="t",racer="{racer}"'
            assert f"run_agent_racer_attempt{{{labels}}} 1.0" in scraped
            assert f"run_agent_racer_tokens{{{labels}}} 0.0" in scraped
    finally:
        assert cli(ws, repo, "stop", "-p", "p", "-t", "t").returncode == 0
        assert cli(ws, repo, "stop", "-p", "p", "-t", "solo").returncode == 0


def test_ctrl_c_of_the_foreground_race_stops_every_racer(ws: Workspace) -> None:
    repo = configure(ws, {"fake": ["--wait-in-task", "never"]})
    follow = start(ws, repo, "-p", "p", "-t", "t", "--race", "2", "fix it")
    try:
        wait_for(lambda: racing(ws, "t.1", "t.2"), 60, "both racers at work")
        os.killpg(follow.pid, signal.SIGINT)  # what the terminal sends its foreground group
        _, err = follow.communicate(timeout=60)
    finally:
        if follow.poll() is None:
            os.killpg(follow.pid, signal.SIGKILL)
            follow.wait(10)
    assert follow.returncode == ExitCode.STOPPED, err
    assert "race p/t stopped" in err
    for racer in ("t.1", "t.2"):
        assert live_holder(ws.task("p", racer).lock) is None
        (run,) = ws.runs("p", racer)
        assert run.status is RunStatus.STOPPED
    assert status(ws, repo)["race"]["outcome"] == "stopped"


def test_the_racers_share_the_budget_and_crossing_it_stops_them_all(ws: Workspace) -> None:
    """Each racer reports 1,000 tokens every half second: alone none would cross 5,000 tokens
    for 3 seconds, but their sum does within about one; all are stopped (`budget`), exit 4."""
    # None reports before all three agents are up (their pids in the workspace's one pid file):
    # on a loaded machine the racers start seconds apart, and the first would cross alone.
    turns = ["--ignore-unknown", "--codex-usage", "1000", "--usage-lines", "40", "--interval",
             "0.5", "--wait-pids", "3"]  # fmt: skip
    repo = configure(ws, {"fake": []})
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["spender"] = {"type": "codex", "command": ws.agent_argv(turns),
                                 "env": GIT_ENV}  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))
    done = cli(ws, repo, "-p", "p", "-t", "t", "--agent", "spender", "--race", "3",
               "--budget", "5000tokens", "fix it")  # fmt: skip
    assert done.returncode == ExitCode.BUDGET, done.stderr
    assert "race p/t stopped by its budget: " in done.stderr
    assert "of 5,000 tokens over its racers" in done.stderr
    spent = 0
    for racer in ("t.1", "t.2", "t.3"):
        (run,) = ws.runs("p", racer)
        assert (run.status, run.reason) == (RunStatus.FAILED, Reason.BUDGET), run
        assert (run.tokens_in or 0) < 5000  # none reached the budget alone
        spent += run.tokens_in or 0
    # Each racer counts its fellows' spend in its own budget check: the sum stops past the
    # budget by no more than what the racers reported at the moment it was crossed (one report
    # each); judged by the race's watcher alone, it ran a second past it (9,000).
    assert 5000 < spent <= 5000 + 3 * 1000
    record = race.read(ws.task())
    assert record is not None and record.outcome == "budget"
    assert status(ws, repo)["status"] == "over_budget"  # one word for it, as everywhere


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--race", "1"], "--race: a race of 1 is no race"),
        (["--race", "2", "--agents", "fake,other"], "--race and --agents do not go together"),
        (["--agents", "fake,fake"], "--agents names fake twice"),
        (["--agents", "fake,nobody"], "nobody"),
        (["--race", "two"], "--race 'two' is not a whole number of racers"),
    ],
)
def test_a_race_that_is_none_is_refused_before_anything_starts(
    ws: Workspace, args: list[str], said: str
) -> None:
    repo = configure(ws, {"fake": [], "other": []})
    done = cli(ws, repo, "-p", "p", "-t", "t", *args, "fix it")
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not ws.task().folder.exists() and not (ws.root / "p").exists()


def test_a_race_outside_a_repository_or_of_one_run_is_refused(ws: Workspace) -> None:
    repo = configure(ws, {"fake": []})
    done = cli(ws, ws.path, "-p", "p", "-t", "t", "--race", "2", "fix it")
    assert done.returncode == ExitCode.USAGE and "needs a git repository" in done.stderr
    assert not (ws.root / "p").exists()
    job = cli(ws, ws.path, "job", "-p", "p", "-t", "t", "--race", "2", "fix it")
    assert job.returncode == ExitCode.USAGE and "--race does not apply here" in job.stderr
    data = yaml.safe_load(ws.config.read_text())
    data["executor"] = {"type": "ray", "address": "127.0.0.1:9", "shared_root": False}
    ws.config.write_text(yaml.safe_dump(data))
    for detach in ([], ["--detach"]):  # refused before any cluster is asked for
        ray = cli(ws, repo, "-p", "p", "-t", "t", "--race", "2", *detach, "fix it")
        assert ray.returncode == ExitCode.USAGE, ray.stderr
        assert "needs hosts that share the runs root" in ray.stderr
        assert len(ray.stderr.strip().splitlines()) == 1
    assert not (ws.root / "p").exists()


def test_a_race_without_a_check_is_refused(ws: Workspace) -> None:
    """Nothing to judge by: refused in one line before anything starts; with --agents, naming
    the agent that has none (a check of an agent's own is that racer's)."""
    repo = configure(ws, {"fake": [], "other": []}, check=False)
    done = cli(ws, repo, "-p", "p", "-t", "t", "--race", "2", "fix it")
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert done.stderr.strip() == (
        "run-agent: a race needs a check: the first racer whose check passes wins, and without "
        "one there is nothing to judge by; give --check CMD (or check: in config.yaml)"
    )
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["fake"]["check"] = "true"
    ws.config.write_text(yaml.safe_dump(data))
    mixed = cli(ws, repo, "-p", "p", "-t", "t", "--agents", "fake,other", "fix it")
    assert mixed.returncode == ExitCode.USAGE, mixed.stderr
    assert "a race needs a check (agent other has none)" in mixed.stderr
    assert not (ws.root / "p").exists()
    given = cli(ws, repo, "-p", "p", "-t", "t", "--agents", "fake,other", "--check", "true",
                "--detach", "fix it")  # fmt: skip
    assert given.returncode == 0, given.stderr
    assert cli(ws, repo, "stop", "-p", "p", "-t", "t").returncode == 0


def test_a_race_through_the_api_answers_its_racers_and_is_judged_the_same(ws: Workspace) -> None:
    """POST a start with `race`: 202 naming the racers; the task's row carries them side by
    side; the second racer wins as on the command line; a race that is none is a 400."""
    from starlette.testclient import TestClient

    from tests.server.test_server_schedules import app_for

    repo = configure(ws, {"fake": [*WORK, "--wait-in-task", "go"]})
    with app_for(ws, run_schedules=False) as client:
        assert isinstance(client, TestClient)
        for body, said in [
            ({"race": 1}, "race: a race of 1 is no race"),
            ({"race": 2, "agents": ["fake"]}, "race and agents do not go together"),
            ({"agents": "fake,nobody"}, "nobody"),
        ]:
            refused = client.post("/api/projects/p/tasks",
                                  json={"task_id": "t", "prompt": "fix it", "cwd": str(repo),
                                        **body})  # fmt: skip
            assert refused.status_code == 400 and said in refused.json()["error"], refused.text
        assert not ws.task().folder.exists()
        started = client.post("/api/projects/p/tasks", json={
            "task_id": "t", "prompt": "fix it", "cwd": str(repo), "race": 2})  # fmt: skip
        assert started.status_code == 202, started.text
        assert started.json()["racers"] == ["p/t.1", "p/t.2"]
        wait_for(lambda: racing(ws, "t.1", "t.2"), 60, "both racers at work")
        row = client.get("/api/projects/p/tasks/t").json()
        assert row["status"] == "running"
        assert [r["task_id"] for r in row["race"]["racers"]] == ["t.1", "t.2"]
        (ws.task("p", "t.2").folder / "go").touch()
        wait_for(lambda: client.get("/api/projects/p/tasks/t").json()["status"] == "completed",
                 60, "the race won")  # fmt: skip
        row = client.get("/api/projects/p/tasks/t").json()
        assert row["race"]["winner"] == "t.2"
        merged = client.post("/api/projects/p/tasks/t/merge", json={})
        assert merged.status_code == 200 and "run-agent/p/t.2" in merged.json()["done"]


def test_a_race_over_mcp_starts_and_stops_its_racers(ws: Workspace) -> None:
    import anyio

    from tests.server.test_mcp import call, status_is, stdio

    repo = configure(ws, {"fake": ["--wait-in-task", "never"], "other": ["--wait-in-task", "x"]})

    async def main() -> None:
        async with stdio(ws) as client:
            started = await call(client, "start_task", project="p", task="t", prompt="fix it",
                                 cwd=str(repo), agents=["fake", "other"])  # fmt: skip
            assert started["racers"] == ["p/t.fake", "p/t.other"]
            row = await status_is(client, "p", "t", "running")
            assert [r["agent"] for r in row["race"]["racers"]] == ["fake", "other"]
            await status_is(client, "p", "t.fake", "running")
            await status_is(client, "p", "t.other", "running")
            stopped = await call(client, "stop_task", project="p", task="t")
            assert stopped["stopped"] is True and stopped["status"] == "stopped"

    anyio.run(main)
    for racer in ("t.fake", "t.other"):
        assert live_holder(ws.task("p", racer).lock) is None


def test_a_schedule_fires_a_race(ws: Workspace) -> None:
    """`race: 2` in a schedule: its firing starts a race through the door, as `run --race`."""
    from tests.server.test_server_schedules import app_for

    repo = configure(ws, {"fake": ["--wait-in-task", "never"]})
    data = yaml.safe_load(ws.config.read_text())
    data["schedules"] = {"tick": {"cron": "@daily", "project": "p", "task": "fixed",
                                  "prompt": "fix it", "cwd": str(repo), "race": 2}}  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))
    with app_for(ws, run_schedules=False) as client:
        fired = client.post("/api/schedules/tick/run", json={})
        assert fired.status_code == 202, fired.text
        wait_for(lambda: racing(ws, "fixed.1", "fixed.2"), 60, "both racers at work")
        row = client.get("/api/projects/p/tasks/fixed").json()
        assert row["status"] == "running" and len(row["race"]["racers"]) == 2
        again = client.post("/api/schedules/tick/run", json={})
        assert again.status_code == 409 and "still running" in again.json()["error"]
        assert client.post("/api/projects/p/tasks/fixed/stop", json={}).status_code == 200
    assert race.read(ws.task("p", "fixed")).outcome == "stopped"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ({"race": 1}, "schedules.tick.race: a race of 1 is no race"),
        ({"agents": ["fake", "nobody"]}, "schedules.tick.agents: unknown agent 'nobody'"),
        ({"race": 2, "agents": ["fake"]}, "do not go together"),
    ],
)
def test_a_schedule_whose_race_is_none_is_a_config_error(
    ws: Workspace, entry: dict[str, Any], said: str
) -> None:
    configure(ws, {"fake": []})
    data = yaml.safe_load(ws.config.read_text())
    data["schedules"] = {"tick": {"cron": "@daily", "project": "p", "prompt": "x", **entry}}
    ws.config.write_text(yaml.safe_dump(data))
    done = ws.cli("schedule", "list")
    assert done.returncode == ExitCode.USAGE and said in done.stderr, done.stderr


def test_the_racer_whose_check_passes_wins_though_all_say_they_are_done(ws: Workspace) -> None:
    """Three agents each exit 0 at every attempt; the check passes only for the answer `right`
    writes on its second attempt. Every other attempt fails as `check_failed`; right wins."""
    check = "grep -qx 'edited by attempt 2' answer.txt"
    agents = {"wrong": ["--edit", "other.txt"],
              "right": ["--counter", "tries", "--edit", "answer.txt"],  # its attempt, counted
              "late": ["--edit", "other.txt", "--sleep", "0.5"]}  # fmt: skip
    repo = configure(ws, agents, check=False, max_restarts=5)
    done = cli(ws, repo, "-p", "p", "-t", "t", "--agents", "wrong,right,late", "--check", check,
               "fix it")  # fmt: skip
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    record = race.read(ws.task())
    assert record is not None and record.winner == "t.right"
    right = ws.runs("p", "t.right")
    assert [(r.status, r.reason) for r in right] == [
        (RunStatus.FAILED, Reason.CHECK_FAILED),
        (RunStatus.COMPLETED, Reason.EXITED),
    ]
    for loser in ("t.wrong", "t.late"):
        runs = ws.runs("p", loser)
        assert all(r.reason in (Reason.CHECK_FAILED, Reason.LOST_RACE) for r in runs), runs
        assert not any(r.status is RunStatus.COMPLETED for r in runs)


def test_a_racer_that_cannot_start_leaves_no_other_racing(ws: Workspace) -> None:
    """t.2 is already running as a task of its own: the race's start stops t.1, which it had
    started, says why in one line (exit 75), and the race is recorded as failed."""
    repo = configure(ws, {"fake": ["--wait-in-task", "never"]})
    taken = cli(ws, repo, "-p", "p", "-t", "t.2", "--worktree", "--detach", "fix it")
    assert taken.returncode == 0, taken.stderr
    try:
        done = cli(ws, repo, "-p", "p", "-t", "t", "--race", "2", "fix it")
        assert done.returncode == ExitCode.ALREADY_RUNNING, done.stderr
        assert "task p/t.2 is already running" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        assert live_holder(ws.task("p", "t.1").lock) is None
        assert live_holder(ws.task().lock) is None
        record = race.read(ws.task())
        assert record is not None and record.outcome == "failed"
        assert "could not start all its racers" in (record.message or "")
    finally:
        assert cli(ws, repo, "stop", "-p", "p", "-t", "t.2").returncode == 0


def test_a_stop_while_the_server_starts_a_race_is_refused_not_sent_to_the_server(
    ws: Workspace, tmp_path: Path
) -> None:
    # While it starts a race's racers the server holds the race's task itself; a stop then
    # signalled the holder, the server, which stopped.
    import httpx

    from tests.conftest import serving, slow_loops

    repo = configure(ws, {"fake": [*WORK, "--wait-in-task", "go"]})
    body = {"task_id": "t", "prompt": "fix it", "cwd": str(repo), "race": 2}
    env = {**slow_loops(tmp_path, 4), **GIT_ENV}  # each racer's start
    with serving(ws, env=env) as url, ThreadPoolExecutor(1) as pool:
        starting = pool.submit(httpx.post, f"{url}/api/projects/p/tasks", json=body, timeout=300)
        wait_for(lambda: race.read(ws.task()) is not None, 120, "the race to begin")
        refused = httpx.post(f"{url}/api/projects/p/tasks/t/stop", json={}, timeout=60)
        assert refused.status_code == 409, refused.text
        assert (
            "race p/t is still starting its racers; stop it once it has started"
            in (refused.json()["error"])
        )
        started = starting.result()
        assert started.status_code == 202, started.text
        stopped = httpx.post(f"{url}/api/projects/p/tasks/t/stop", json={}, timeout=120)
        assert stopped.status_code == 200, stopped.text
        tasks = [ws.task("p", t) for t in ("t", "t.1", "t.2")]
        wait_for(lambda: not [t for t in tasks if live_holder(t.lock)], 120, "the race to stop")
