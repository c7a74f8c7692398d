"""A task that becomes blocked (a task it runs after failed, was stopped or was deleted) needs a
person: the notifiers tell it (`needs_input`, `waits_for: blocked`) with the command that unblocks
it, once for each blocking, whoever finds it first. Real loops, a real queue and keeper, a real
notification command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import Workspace, wait_for
from tests.fleet.test_queue import listed

# One write each, appended: notifications are sent from threads and processes, maybe at once.
WRITE = ("import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT);"
         " os.write(fd, sys.stdin.buffer.read() + b'\\n')")  # fmt: skip


def told(path: Path) -> list[dict[str, Any]]:
    """The blockings told so far, as (task, message, answer)."""
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in events if e["event"] == "needs_input" and e["waits_for"] == "blocked"]


def test_a_blocked_task_is_told_once_for_each_blocking_with_what_unblocks_it(
    ws: Workspace,
) -> None:
    said = ws.path / "told.jsonl"
    ws.write_config(["--lines", "1", "--sleep", "60"], max_restarts=0)
    data = yaml.safe_load(ws.config.read_text())
    data["notify"] = {"command": ["python3", "-c", WRITE, str(said)]}
    ws.config.write_text(yaml.safe_dump(data))
    assert ws.cli("-p", "p", "-t", "build", "go", "--detach").returncode == 0
    wait_for(lambda: listed(ws)["p/build"]["status"] == "running", what="p/build running")
    waiting = ws.cli("-p", "p", "-t", "deploy", "--after", "p/build", "go", "--detach")
    assert waiting.returncode == 0, waiting.stderr
    assert told(said) == []  # it waits for a task that runs: nobody needed yet
    # The loop it waits for is stopped: its end tells that deploy needs a person.
    assert ws.cli("stop", "-p", "p", "-t", "build").returncode == 0
    (need,) = wait_for(lambda: told(said), what="the blocking to be told")
    assert (need["project_id"], need["task_id"]) == ("p", "deploy")
    assert need["message"] == "waits for p/build, which was stopped"
    assert need["answer"] == "run-agent resume -p p -t build, then run-agent resume -p p -t deploy"
    # A start after the stopped task is blocked at once, and told by the door; deploy is not
    # told again, however often the queue is looked at.
    ship = ws.cli("-p", "p", "-t", "ship", "--after", "p/build", "go", "--detach")
    assert ship.returncode == 0 and "which was stopped" in ship.stderr, ship.stderr
    assert ws.cli("fleet").returncode == 0
    wait_for(lambda: len(told(said)) == 2, what="ship's blocking to be told")
    assert [n["task_id"] for n in told(said)] == ["deploy", "ship"]
    # The task they wait for deleted: a blocking of its own, told with its own way out.
    assert ws.cli("delete", "-p", "p", "-t", "build", "--yes").returncode == 0
    wait_for(lambda: len(told(said)) == 4, what="the deletion's blockings to be told")
    gone = {n["task_id"]: n for n in told(said)[2:]}
    assert gone["deploy"]["message"] == "waits for p/build, which was deleted"
    assert gone["ship"]["answer"] == (
        "run-agent stop -p p -t ship, then run-agent resume -p p -t ship (it no longer waits "
        "for p/build)"
    )
    assert ws.cli("fleet").returncode == 0
    assert len(told(said)) == 4
    for task in ("deploy", "ship"):
        assert ws.cli("stop", "-p", "p", "-t", task).returncode == 0


def test_a_foreground_start_blocked_by_a_failed_task_is_told_too(ws: Workspace) -> None:
    said = ws.path / "told.jsonl"
    ws.write_config(["--lines", "1", "--exit", "1"], max_restarts=0)
    data = yaml.safe_load(ws.config.read_text())
    data["notify"] = {"command": ["python3", "-c", WRITE, str(said)], "on": ["needs_input"]}
    ws.config.write_text(yaml.safe_dump(data))
    assert ws.cli("-p", "p", "-t", "build", "go").returncode == 1
    blocked = ws.cli("-p", "p", "-t", "deploy", "--after", "p/build", "go")
    assert blocked.returncode == 6, blocked.stderr
    (need,) = told(said)
    assert (need["task_id"], need["message"]) == ("deploy", "waits for p/build, which failed")
    assert need["answer"] == "run-agent resume -p p -t build, then run-agent resume -p p -t deploy"
    assert ws.cli("stop", "-p", "p", "-t", "deploy").returncode == 0
