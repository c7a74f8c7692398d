"""`run-agent usage`: what real runs spent, read from their run folders, summed and filtered."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from runagent.errors import ExitCode
from tests.conftest import REPO, Workspace

COST = 0.00014  # what one replay of claude's sample stream says it cost (10 tokens in, 5 out)


@pytest.fixture
def spent(ws: Workspace) -> Workspace:
    """Three claude-type runs (two in project a, one in b) and one run of an agent that reports
    no usage, all in real run folders."""
    sample = (REPO / "tests/samples/claude-text.stdout.jsonl").read_bytes().hex()
    replay = ws.agent_argv(["--ignore-unknown", "--chunks", sample])
    ws.config.write_text(yaml.safe_dump({
        "agents": {"claudeish": {"type": "claude", "permissions": "none", "command": replay},
                   "plain": {"type": "command", "command": ws.agent_argv()}},
        "defaults": {"agent": "claudeish", "max_restarts": 0},
        "storage": {"runs_dir": str(ws.root)},
    }))  # fmt: skip
    runs = [["-p", "a", "-t", "one"], ["-p", "a", "-t", "one", "--again"],
            ["-p", "b", "-t", "two"], ["-p", "b", "-t", "three", "--agent", "plain"]]  # fmt: skip
    for args in runs:
        proc = ws.invoke(*args, "x")
        assert proc.returncode == 0, proc.stderr
    return ws


def test_usage_sums_by_project_with_a_total_line(spent: Workspace) -> None:
    proc = spent.invoke("usage")
    assert proc.returncode == 0, proc.stderr
    lines = [line.split() for line in proc.stdout.splitlines()]
    assert lines == [
        ["project", "runs", "tokens", "in", "tokens", "out", "cost"],
        ["a", "2", "20", "10", "$0.0003"],
        ["b", "2", "10", "5", "$0.0001"],
        ["total", "4", "30", "15", "$0.0004"],
    ]
    assert proc.stderr == (
        "run-agent: 1 of 4 runs reported no usage (their agent does not say it); "
        "the sums leave them out\n"
    )


def test_usage_by_task_agent_and_day_as_json(spent: Workspace) -> None:
    proc = spent.invoke("usage", "--by", "agent", "--by", "day", "--json")
    data = json.loads(proc.stdout)
    today = datetime.now(UTC).date().isoformat()
    assert data["by"] == ["agent", "day"]
    rows = {(r["agent"], r["day"]): r for r in data["rows"]}
    assert set(rows) <= {("claudeish", today), ("plain", today)} | {
        ("claudeish", (datetime.now(UTC) - timedelta(days=1)).date().isoformat())
    }  # a run started just before midnight UTC counts for its own day
    assert data["total"]["runs"] == 4 and data["total"]["reported"] == 3
    assert data["total"]["tokens_in"] == 30
    assert data["total"]["cost_usd"] == pytest.approx(3 * COST)
    tasks = json.loads(spent.invoke("usage", "--by", "task", "--json", "-p", "b").stdout)
    assert [(r["task"], r["runs"], r["tokens_out"]) for r in tasks["rows"]] == [
        ("b/three", 1, None),  # no agent of it said: not 0 tokens
        ("b/two", 1, 5),
    ]
    assert tasks["rows"][0]["cost_usd"] is None  # no agent said: not a cost of 0
    text = spent.invoke("usage", "--by", "task", "-p", "b").stdout.splitlines()
    assert text[1].split(None, 2) == ["b/three", "1", "not reported  not reported  not reported"]


def test_usage_since_a_duration_or_a_day(spent: Workspace) -> None:
    week = json.loads(spent.invoke("usage", "--since", "7d", "--json").stdout)
    assert week["total"]["runs"] == 4
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).date().isoformat()
    later = spent.invoke("usage", "--since", tomorrow)
    assert later.returncode == 0 and later.stdout == ""
    assert later.stderr.startswith("run-agent: no runs under ") and f"since {tomorrow}" in (
        later.stderr
    )
    assert json.loads(spent.invoke("usage", "--since", tomorrow, "--json").stdout)["rows"] == []


def test_a_days_spend_reads_only_the_runs_that_may_have_started_that_day(
    spent: Workspace,
) -> None:
    """Run ids begin with their start's day (UTC): `--since`, a daily budget and the fleet's
    spend today read the runs of that day, not every run in history. A record in a folder
    named two days back is not read, whatever it says."""
    from runagent.store import runfolder, spend

    task = spent.task("a", "one")
    text = (task.run_folder(task.run_ids()[0]) / runfolder.RUN_INFO).read_text()
    old = task.run_folder(f"{datetime.now(UTC) - timedelta(days=2):%Y%m%d}-0000000000-1")
    old.mkdir()
    (old / runfolder.RUN_INFO).write_text(text.replace("tokens_in: 10", "tokens_in: 1000000"))
    week = json.loads(spent.invoke("usage", "--json").stdout)
    assert week["total"]["tokens_in"] == 1000030  # every run: the old folder's record too
    today = datetime.now(UTC).date()
    day = json.loads(spent.invoke("usage", "--since", today.isoformat(), "--json").stdout)
    assert day["total"]["tokens_in"] == 30  # its id says it started days ago: not read
    assert {r.run_id for r in spend.runs(spent.root, "a", today)} == set(task.run_ids()[1:])


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--since", "last week"], "--since 'last week' is neither a duration (7d, 12h) nor a day"),
        (["--by", "month"], "'month' is not one of 'project', 'task', 'agent', 'day'"),
        (["-p", "../x"], "project id"),
    ],
)
def test_bad_usage_options_are_one_line(ws: Workspace, args: list[str], said: str) -> None:
    proc = ws.invoke("usage", *args)
    assert proc.returncode == ExitCode.USAGE
    assert said in proc.stderr and proc.stderr.count("\n") == 1
