"""The fleet at a glance (`run-agent fleet`, GET /api/fleet, the page's first view): counts, the
queue in the order it starts, today's spend against each daily budget, the tasks that need a
person with the command that answers each, and the tasks that wait on a task. Real loops, a real
queue and keeper, real run folders."""

from __future__ import annotations

import json
from typing import Any

import yaml

import backends
from runagent.service import StartRequest
from tests.conftest import LOCAL, Workspace, wait_for
from tests.fleet.test_queue import HOLD, go, keepers, listed, service


def busy_fleet(ws: Workspace) -> None:
    """Project p may run one task at a time: p/a runs (its agent holding), p/b and p/c (a
    higher priority) wait for the slot, p/d waits for p/b. In project q, q/x was stopped by its
    budget. The root and q have daily budgets."""
    ws.write_config(HOLD, max_restarts=0)
    data = yaml.safe_load(ws.config.read_text())
    data["limits"] = {"projects": {"p": 1}}
    data["budgets"] = {"daily": {"usd": 5}, "projects": {"q": {"usd": 0.5, "tokens": 100000}}}
    data["agents"]["spender"] = {"type": "claude", "command": ws.agent_argv(
        ["--ignore-unknown", "--claude-result", "0.3", "--exit", "1"])}  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))
    stopped = ws.cli("-p", "q", "-t", "x", "--agent", "spender", "--budget", "0.2usd", "go")
    assert stopped.returncode == 4, stopped.stderr
    door = service(ws)
    door.start(StartRequest(ws.task("p", "a"), "go"))
    wait_for(lambda: listed(ws)["p/a"]["status"] == "running", what="p/a running")
    wait_for(lambda: any("line 1" in p.read_text() for p in
                         ws.task("p", "a").folder.glob("runs/*/agent-stdout.txt")),
             what="p/a's first line")  # fmt: skip
    door.start(StartRequest(ws.task("p", "b"), "go"))
    door.start(StartRequest(ws.task("p", "c"), "go", priority=5))
    door.start(StartRequest(ws.task("p", "d"), "go", after=("p/b",)))


def settle(ws: Workspace) -> None:
    for task in "abcd":
        go(ws, task)
    wait_for(lambda: all(listed(ws)[f"p/{t}"]["status"] == "completed" for t in "abcd"),
             timeout=90, what="the fleet to complete")  # fmt: skip
    wait_for(lambda: not keepers(ws), what="the keeper to exit")


def check(found: dict[str, Any]) -> None:
    assert found["counts"] == {"running": 1, "races": 0, "queued": 2, "blocked": 1, "unreadable": 0,
                               "needs_person": 1, "tasks": 5}  # fmt: skip
    queue = [(row["task_id"], row["status"]) for row in found["queue"]]
    assert queue == [("c", "queued"), ("b", "queued"), ("d", "blocked")]
    assert found["queue"][0]["queue"]["ahead"] == 0 and found["queue"][1]["queue"]["ahead"] == 1
    spent = {s["what"]: s for s in found["spent"]}
    root, q = spent["the runs root today"], spent["project q today"]
    assert root["budget"] == {"usd": 5.0, "tokens": None} and not root["spent"]
    assert q["used"]["cost_usd"] == 0.3 and q["words"] == "$0.50 and 100,000 tokens"
    assert spent["project p today"]["budget"] is None
    (need,) = found["needs"]
    assert (need["project_id"], need["task_id"], need["waits_for"]) == ("q", "x", "over_budget")
    assert need["message"] == "stopped by its budget: $0.30 of $0.20 per task (exited with code 1)"
    assert need["answer"] == "run-agent resume -p q -t x --budget AMOUNT (a larger one)"
    assert found["limits"]["projects"] == {"p": 1}
    # The loops running come first, each with its agent, attempt, time and last lines.
    (loop,) = found["running"]
    assert (loop["project_id"], loop["task_id"], loop["agent"], loop["attempt"]) == (
        "p", "a", "fake", 1)  # fmt: skip
    assert loop["last_lines"][-1] == "line 1" and loop["seconds"] >= 0


def test_the_command_line_shows_the_fleet_and_who_waits_on_a_task(ws: Workspace) -> None:
    busy_fleet(ws)
    try:
        shown = ws.cli("fleet", "--json")
        assert shown.returncode == 0, shown.stderr
        check(json.loads(shown.stdout))
        text = ws.cli("fleet")
        assert text.returncode == 0, text.stderr
        lines = text.stdout.splitlines()
        assert lines[0] == "1 running · 2 queued · 1 blocked · 1 need a person · 5 tasks"
        assert lines[1] == "running:" and lines[2].startswith("  p/a  fake · attempt 1 · ")
        assert lines[2].endswith("s  line 1"), lines[2]
        queue = lines.index("queue, in the order it starts:")
        assert lines[queue + 1].startswith("  1. p/c  ") and lines[queue + 2].startswith("  2. p/b")
        assert "  p/d  waits for p/b" in lines
        assert "  project q today: 150 tokens, $0.30 of $0.50 and 100,000 tokens" in lines
        assert "    run-agent resume -p q -t x --budget AMOUNT (a larger one)" in lines
        # One word for the state, and no "budget: budget:" (the kind, then the run's words).
        assert "  q/x  stopped by its budget: $0.30 of $0.20 per task (exited with code 1)" in lines
        assert "budget: budget" not in text.stdout
        assert listed(ws)["q/x"]["status"] == "over_budget"
        shown_status = ws.cli("status", "-p", "q", "-t", "x", "--json")
        assert json.loads(shown_status.stdout)["status"] == "over_budget"
        status = ws.cli("status", "-p", "p", "-t", "b")
        assert "waited on by  p/d" in status.stdout, status.stdout
        assert json.loads(ws.cli("status", "-p", "p", "-t", "b", "--json").stdout)[
            "waited_on_by"] == ["p/d"]  # fmt: skip
    finally:
        settle(ws)
    after = json.loads(ws.cli("fleet", "--json").stdout)
    assert after["counts"]["running"] == after["counts"]["queued"] == 0 and not after["queue"]


def test_the_api_gives_the_same_fleet_and_a_task_its_waiters(ws: Workspace) -> None:
    from starlette.testclient import TestClient

    from server.app import create_app
    from server.settings import Settings

    busy_fleet(ws)
    app = create_app(Settings(root=ws.root, config_path=ws.config, workdir=ws.path,
                              backend_names=backends.known()))  # fmt: skip
    try:
        with TestClient(app, base_url=LOCAL) as c:
            found = c.get("/api/fleet")
            assert found.status_code == 200, found.text
            check(found.json())
            assert c.get("/api/projects/p/tasks/b").json()["waited_on_by"] == ["p/d"]
            assert c.get("/api/projects/p/tasks/a").json()["waited_on_by"] == []
    finally:
        settle(ws)


def test_a_task_blocked_by_one_it_runs_after_needs_a_person_and_their_command_unblocks_it(
    ws: Workspace,
) -> None:
    """p/deploy runs after p/build, which fails, and after p/lint, which is stopped: deploy needs
    a person, with the command that unblocks it; following it, deploy runs. A task it waits
    for that was deleted: taken out of the queue and started again, without it."""
    ws.write_config(["--counter", str(ws.path / "n"), "--fail-first", "1"], max_restarts=0,
                    agents={"holder": ["--lines", "1", "--sleep", "60"]})  # fmt: skip
    assert ws.cli("run", "-p", "p", "-t", "build", "go").returncode == 1  # its first run fails
    waiting = ws.cli("run", "-p", "p", "-t", "deploy", "--after", "p/build", "go", "--detach")
    assert waiting.returncode == 0 and "which failed" in waiting.stderr, waiting.stderr

    def needs() -> list[dict[str, Any]]:
        shown = ws.cli("fleet", "--json")
        assert shown.returncode == 0, shown.stderr
        found: list[dict[str, Any]] = json.loads(shown.stdout)["needs"]
        return found

    (need,) = needs()
    assert need == {
        "project_id": "p", "task_id": "deploy", "waits_for": "blocked", "on": "p/build",
        "message": "waits for p/build, which failed",
        "answer": "run-agent resume -p p -t build, then run-agent resume -p p -t deploy",
    }  # fmt: skip
    printed = ws.cli("fleet").stdout
    assert "p/deploy  blocked: waits for p/build, which failed" in printed
    assert "run-agent resume -p p -t build, then run-agent resume -p p -t deploy" in printed
    for command in need["answer"].split(", then "):  # as a person types it
        done = ws.cli(*command.split()[1:])
        assert done.returncode == 0, done.stderr
    assert listed(ws)["p/deploy"]["status"] == "completed" and needs() == []
    # A task it waits for that is stopped (a holding loop, stopped by a person).
    lint = ws.cli("run", "-p", "p", "-t", "lint", "--agent", "holder", "go", "--detach")
    assert lint.returncode == 0, lint.stderr
    wait_for(lambda: listed(ws)["p/lint"]["status"] == "running", what="p/lint running")
    ship = ws.cli("run", "-p", "p", "-t", "ship", "--after", "p/lint", "go", "--detach")
    assert ship.returncode == 0, ship.stderr
    assert needs() == []  # it waits for a task that runs: nothing for a person yet
    assert ws.cli("stop", "-p", "p", "-t", "lint").returncode == 0
    (need,) = needs()
    assert need["message"] == "waits for p/lint, which was stopped"
    assert need["answer"] == "run-agent resume -p p -t lint, then run-agent resume -p p -t ship"
    # The task it waits for deleted: the answer takes it out of the queue and starts it again.
    assert ws.cli("delete", "-p", "p", "-t", "lint", "--yes").returncode == 0
    (need,) = needs()
    assert need["message"] == "waits for p/lint, which was deleted"
    assert need["answer"] == (
        "run-agent stop -p p -t ship, then run-agent resume -p p -t ship (it no longer waits "
        "for p/lint)"
    )
    for command in need["answer"].split(" (")[0].split(", then "):
        done = ws.cli(*command.split()[1:])
        assert done.returncode == 0, done.stderr
    assert listed(ws)["p/ship"]["status"] == "completed" and needs() == []
