"""The stand-in for claude the guides send a new user to (examples/stand-in-agent.py), run as the
loop guide configures it: a budget stops it, `--fail` is stopped as stuck, `--limit-once` pauses
its agent and then completes, and its session is continued. Real runs, real run folders."""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml

from runagent.store.runinfo import Reason
from tests.conftest import REPO, TEST_DEFAULTS, Workspace

STAND_IN = [sys.executable, str(REPO / "examples" / "stand-in-agent.py")]


def configure(ws: Workspace, *args: str, **defaults: Any) -> None:
    ws.config.write_text(yaml.safe_dump({
        "agents": {"stand-in": {"type": "claude", "command": STAND_IN,
                                "args": ["--interval", "0", *args]}},
        "defaults": {"agent": "stand-in", **TEST_DEFAULTS, **defaults},
        "storage": {"runs_dir": str(ws.root)},
    }))  # fmt: skip


def test_the_guides_budget_stops_it_at_its_third_message(ws: Workspace) -> None:
    configure(ws, "--turns", "3", "--tokens", "2000", "--cost", "0.02")
    done = ws.cli("-p", "demo", "-t", "budget", "--budget", "5000tokens", "Write the docs")
    assert done.returncode == 4, done.stderr
    (run,) = ws.runs("demo", "budget")
    assert run.reason is Reason.BUDGET and "6,600 of 5,000 tokens per task" in (run.message or "")
    listed = json.loads(ws.cli("list", "--json").stdout)
    assert [row["status"] for row in listed] == ["over_budget"]
    used = ws.cli("usage").stdout
    assert used.splitlines()[1].split()[:4] == ["demo", "1", "6000", "600"]


def test_fail_is_stopped_as_stuck(ws: Workspace) -> None:
    configure(ws, "--fail", "--turns", "1", max_restarts=5)
    done = ws.cli("-p", "demo", "-t", "stuck", "--stuck-after", "2", "go")
    assert done.returncode == 5, done.stderr
    assert len(ws.runs("demo", "stuck")) == 2
    assert json.loads(ws.cli("list", "--json").stdout)[0]["status"] == "stuck"


def test_limit_once_pauses_the_agent_then_completes_in_its_session(ws: Workspace) -> None:
    configure(ws, "--limit-once", "1", "--turns", "1", max_restarts=2, rate_limit_wait=1)
    done = ws.cli("-p", "demo", "-t", "limited", "go", timeout=120)
    assert done.returncode == 0, done.stderr
    first, second = ws.runs("demo", "limited")
    assert first.reason is Reason.RATE_LIMIT, first
    assert second.status.value == "completed" and second.session_id
