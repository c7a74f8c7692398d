"""Budgets that stop the loop: a run that crosses one is stopped (its whole tree), says which
budget and how much of what, and the loop ends with exit 4; a start with nothing left, or in a
project or root whose day's budget is spent, is refused; an agent that reports no usage cannot
be given one."""

from __future__ import annotations

import os
import re
import signal
import sys
from typing import Any

import pytest
import yaml

from runagent.config.settings import Budget, parse_budget
from runagent.errors import UsageError
from runagent.store.runinfo import Reason
from tests.conftest import REPO, TEST_DEFAULTS, Workspace, wait_for


def configure(ws: Workspace, kind: str, args: list[str], **extra: Any) -> None:
    """An agent `spender` of backend `kind` whose command is the fake agent."""
    ws.write_config([], max_restarts=3)
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["spender"] = {"type": kind, "command": ws.agent_argv(["--ignore-unknown",
                                                                        *args])}  # fmt: skip
    data["defaults"]["agent"] = "spender"
    data.update(extra)
    ws.config.write_text(yaml.safe_dump(data))


def test_a_token_budget_stops_the_run_while_it_reports_its_turns(ws: Workspace) -> None:
    configure(ws, "codex", ["--codex-usage", "1000", "--usage-lines", "50", "--interval", "0.2",
                            "--sleep", "60"])  # fmt: skip
    done = ws.cli("-p", "p", "-t", "t", "--budget", "3500tokens", "go")
    assert done.returncode == 4, done.stderr
    # Stopped at the first look after the usage crossed 3,500: 4,000 on a quiet machine; on a
    # loaded one a turn or two more (one every 0.2 s) may be reported before that look. Either
    # way long before the agent's 50 turns (50,000 tokens) were done.
    said = re.search(r"stopped by its budget: (\d+),000 of 3,500 tokens per task", done.stderr)
    assert said is not None and 4 <= int(said.group(1)) < 50, done.stderr
    (run,) = ws.runs()
    assert run.reason is Reason.BUDGET
    assert run.message == f"budget: {said.group(1)},000 of 3,500 tokens per task"
    stdout = (ws.task().run_folder(run.run_id) / "agent-stdout.txt").read_text()
    assert 4 <= stdout.count("turn.completed") < 50  # stopped mid-run, not at its end
    assert not ws.leftovers()  # its whole tree is gone


def test_a_token_budget_stops_claude_on_its_messages_before_its_result(ws: Workspace) -> None:
    turns = ["--usage-kind", "claude", "--codex-usage", "1000", "--usage-lines", "50"]
    configure(ws, "claude", [*turns, "--interval", "0.2", "--sleep", "60"])
    done = ws.cli("-p", "p", "-t", "t", "--budget", "2500tokens", "go")
    assert done.returncode == 4, done.stderr
    # 3,000 on a quiet machine; a turn or two more on a loaded one (as the codex test above).
    said = re.search(r"stopped by its budget: (\d+),000 of 2,500 tokens per task", done.stderr)
    assert said is not None and 3 <= int(said.group(1)) < 50, done.stderr
    (run,) = ws.runs()
    assert run.reason is Reason.BUDGET
    stdout = (ws.task().run_folder(run.run_id) / "agent-stdout.txt").read_text()
    assert '"result"' not in stdout and stdout.count('"assistant"') < 100  # stopped mid-run
    assert not ws.leftovers()


def test_a_cost_reported_at_the_end_ends_the_loop_and_no_budget_is_left(ws: Workspace) -> None:
    configure(ws, "claude", ["--claude-result", "0.3", "--exit", "1"])
    done = ws.cli("-p", "p", "-t", "t", "--budget", "0.50usd", "go")
    assert done.returncode == 4, done.stderr
    runs = ws.runs()
    assert len(runs) == 2  # $0.30, then $0.60 over all the task's runs: not a third
    assert runs[-1].reason is Reason.BUDGET and "$0.60 of $0.50 per task" in (
        runs[-1].message or ""
    )
    again = ws.cli("resume", "-p", "p", "-t", "t")  # remembered: nothing is left
    assert again.returncode == 4 and "has no budget left ($0.60 of $0.50 per task)" in again.stderr
    assert len(ws.runs()) == 2


def test_a_project_whose_day_is_spent_refuses_a_new_start(ws: Workspace) -> None:
    configure(ws, "claude", ["--claude-result", "0.3"],
              budgets={"projects": {"p": {"usd": 0.25}}})  # fmt: skip
    # The run that crosses it completes its task (a budget never takes a finished task back)...
    assert ws.cli("-p", "p", "-t", "a", "go").returncode == 0
    refused = ws.cli("-p", "p", "-t", "b", "go")  # ...but nothing else starts in p today
    assert refused.returncode == 4, refused.stderr
    assert "the budget is spent ($0.30 of $0.25 for project p today)" in refused.stderr
    assert not ws.task("p", "b").folder.exists()
    assert ws.cli("-p", "q", "-t", "c", "go").returncode == 0  # another project's day is its own


def test_a_loop_a_daily_budget_stopped_is_told_what_lifts_it(ws: Workspace) -> None:
    """No larger task budget lifts a project's daily budget: the loop, `fleet` and the page's
    needs say what does (config.yaml's budgets:, or tomorrow), and the task reads over_budget
    wherever it is shown."""
    import json

    configure(ws, "claude", ["--claude-result", "0.3", "--exit", "1"],
              budgets={"projects": {"p": {"usd": 0.25}}})  # fmt: skip
    stopped = ws.cli("-p", "p", "-t", "a", "go")
    assert stopped.returncode == 4, stopped.stderr
    assert "a larger daily budget (budgets: in config.yaml), or tomorrow (UTC)" in stopped.stderr
    assert "a larger --budget" not in stopped.stderr
    found = json.loads(ws.cli("fleet", "--json").stdout)
    (need,) = found["needs"]
    assert need["waits_for"] == "over_budget" and "--budget" not in need["answer"]
    assert need["answer"].startswith("raise the daily budget under budgets: in config.yaml")
    listed = json.loads(ws.cli("list", "--json").stdout)
    assert [row["status"] for row in listed] == ["over_budget"]


def test_tasks_running_at_once_count_toward_the_day_while_they_run(ws: Workspace) -> None:
    """Under a project's daily budget each run writes its usage so far into its run-info, so a
    task started meanwhile counts it from its start, and a task already running counts what the
    other spent when it reads the day again: both are stopped, neither waited for the other's
    end."""
    # After its turns each agent goes on printing (no usage): the day is read again all the same.
    configure(ws, "codex", ["--codex-usage", "1000", "--usage-lines", "3", "--interval", "0.1",
                            "--lines", "1000"],
              budgets={"projects": {"p": {"tokens": 4500}}})  # fmt: skip
    first = ws.start_cli("-p", "p", "-t", "a", "go")
    try:
        wait_for(lambda: [r.tokens_in for r in ws.runs("p", "a")] == [3000], what="a's 3,000")
        second = ws.cli("-p", "p", "-t", "b", "go")  # 3,000 before it: its 2nd turn crosses
        assert second.returncode == 4, second.stderr
        # Alone it would spend 3,000 and never cross: it counted a's (5,000, or 6,000 when two
        # of its turns came within one look).
        assert re.search(r"[56],000 of 4,500 tokens for project p today", second.stderr)
        _, err = first.communicate(timeout=30)  # a reads the day again: 3,000 + b's 2,000
    finally:
        if first.poll() is None:  # a failed expectation: nothing of it may outlive the test
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(10)
    assert first.returncode == 4, err
    assert re.search(r"[56],000 of 4,500 tokens for project p today", err)
    (run,) = ws.runs("p", "a")
    assert run.reason is Reason.BUDGET and run.tokens_in == 3000
    assert not ws.leftovers()


def test_an_agent_that_reports_no_usage_cannot_be_given_a_budget(ws: Workspace) -> None:
    ws.write_config(["--exit", "0"])
    done = ws.cli("-p", "p", "-t", "t", "--budget", "1usd", "go")
    assert done.returncode == 2 and "reports no usage" in done.stderr
    assert not ws.runs()


@pytest.mark.parametrize(
    ("values", "budget"),
    [(["0.50usd"], Budget(0.5)), (["$2"], Budget(2.0)), (["200k-tokens"], Budget(None, 200_000)),
     (["1.5mtokens", "3usd"], Budget(3.0, 1_500_000)), (["42 tokens"], Budget(None, 42))],
)  # fmt: skip
def test_budget_amounts_read_as_written(values: list[str], budget: Budget) -> None:
    assert parse_budget(values, "--budget") == budget


def test_a_budget_that_is_no_amount_is_refused_naming_it() -> None:
    with pytest.raises(UsageError, match="--budget '5' is not a budget; give a cost"):
        parse_budget(["5"], "--budget")


def test_one_outcome_for_one_usage_whatever_the_timing(ws: Workspace) -> None:
    """Runs of claude's stand-in (examples/stand-in-agent.py) that end at once: one whose
    messages cross the task's budget while it works ends `budget` every time (exit 4), though
    it exits before the watch could read them; one whose closing report alone crosses a
    project's daily budget completes every time (exit 0), whenever it is read."""
    stand_in = [sys.executable, str(REPO / "examples" / "stand-in-agent.py")]
    data = {
        "agents": {"stand-in": {"type": "claude", "command": stand_in,
                                "args": ["--turns", "3", "--tokens", "1000", "--interval", "0"]}},
        "defaults": {"agent": "stand-in", **TEST_DEFAULTS, "max_restarts": 0},
        "storage": {"runs_dir": str(ws.root)},
    }  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))
    for n in range(3):  # 1,100 tokens a message: the third crosses 2,500 while it works
        done = ws.cli("-p", "p", "-t", f"work{n}", "--budget", "2500tokens", "go")
        assert done.returncode == 4, done.stderr
        (run,) = ws.runs("p", f"work{n}")
        assert run.reason is Reason.BUDGET, run
        assert "3,300 of 2,500 tokens per task" in (run.message or "")
    data["agents"]["stand-in"]["args"] = ["--turns", "1", "--tokens", "10", "--cost", "0.3",
                                          "--interval", "0"]  # fmt: skip
    data["budgets"] = {"projects": {"q": {"usd": 0.25}}}
    ws.config.write_text(yaml.safe_dump(data))
    first = ws.cli("-p", "q", "-t", "closing", "go")  # its result alone: $0.30 of $0.25
    assert first.returncode == 0, first.stderr
    assert ws.cli("-p", "q", "-t", "next", "go").returncode == 4  # the day is spent
