"""The queue held across the runs root (`fleet hold`, `fleet release`) and every loop stopped at
once (`stop --all`): while the queue is held no queued task starts, neither by the keeper nor by
a foreground run waiting its turn, and the loops that run go on; `stop --all` holds the queue
while it stops every loop and empties the queue, so stopping one does not let the next start.
Real loops, a real queue and keeper, a real server."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx

from runagent.fleet.queue import Fleet, QueueHold, decide
from runagent.store import tokens
from tests.conftest import Workspace, serving, wait_for
from tests.fleet.test_queue import LIMITS, configure, go, keepers, listed, waiting


def rows(ws: Workspace) -> dict[str, dict[str, Any]]:
    return listed(ws)


def status(ws: Workspace, label: str) -> str:
    return str(rows(ws).get(label, {}).get("status"))


def fleet_json(ws: Workspace) -> dict[str, Any]:
    done = ws.cli("fleet", "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_a_held_queue_starts_nothing_and_takes_no_place_from_anyone() -> None:
    today = datetime.now(UTC).date().isoformat()  # a hold of another day shows its date
    held = QueueHold(f"{today}T05:10:00.000Z", "run-agent fleet hold")
    turn = decide(LIMITS, "p", "fake", [], [], held=held)
    assert not turn.go and turn.waits_for == held.words()
    assert held.words() == "the queue is held since 05:10 UTC"
    assert decide(LIMITS, "p", "fake", [waiting("q", "w", 1)], [], held=None).go


def test_hold_keeps_queued_starts_queued_running_loops_go_on_and_release_lets_them_go(
    ws: Workspace,
) -> None:
    configure(ws, None)  # no limits at all: the hold alone queues a start
    first = ws.cli("run", "-p", "p", "-t", "a", "-d", "go")
    assert first.returncode == 0, first.stderr
    wait_for(lambda: status(ws, "p/a") == "running", what="a running")
    held = ws.cli("fleet", "hold")
    assert held.returncode == 0, held.stderr
    assert held.stdout.startswith("the queue is held since "), held.stdout
    assert "`run-agent fleet release` lets it go" in held.stdout
    again = ws.cli("fleet", "hold")
    assert again.returncode == 0 and again.stdout.startswith("the queue was held already"), again
    queued = ws.cli("run", "-p", "p", "-t", "b", "-d", "go")
    assert queued.returncode == 0, queued.stderr
    assert "queued: 0 ahead (the queue is held since " in queued.stderr, queued.stderr
    row = rows(ws)["p/b"]
    assert row["status"] == "queued" and row["queue"]["waits_for"].startswith("the queue is held")
    # A foreground run waits its turn in its own process, and says why.
    fore = ws.start_cli("job", "-p", "p", "-t", "c", "go")
    wait_for(lambda: status(ws, "p/c") == "queued", what="c queued in the foreground")
    # What runs goes on: a completes while the queue is held.
    go(ws, "a")
    wait_for(lambda: status(ws, "p/a") == "completed", what="a to complete while held")
    assert not ws.task("p", "b").run_ids() and not ws.task("p", "c").run_ids()
    shown = ws.cli("fleet")
    assert shown.returncode == 0, shown.stderr
    line = next(x for x in shown.stdout.splitlines() if x.startswith("the queue is held"))
    assert "no queued task starts" in line and "`run-agent fleet release`" in line, line
    hold = fleet_json(ws)["hold"]
    assert hold["since"] and hold["words"].startswith("the queue is held since "), hold
    # The per-agent pause is another thing: unpause names an agent and lifts no hold.
    assert ws.cli("fleet", "unpause", "fake").stdout.strip() == "agent fake is not paused"
    assert fleet_json(ws)["hold"] is not None
    released = ws.cli("fleet", "release")
    assert released.returncode == 0, released.stderr
    assert released.stdout.startswith("released: the queue was held since "), released.stdout
    assert ws.cli("fleet", "release").stdout.strip() == "the queue is not held"
    wait_for(lambda: status(ws, "p/b") == "running", what="b started by the keeper")
    wait_for(lambda: status(ws, "p/c") == "running", what="c's own turn")
    go(ws, "b")
    go(ws, "c")
    assert fore.wait(60) == 0, fore.stderr.read() if fore.stderr else ""
    wait_for(lambda: status(ws, "p/b") == "completed", what="b to complete")
    assert fleet_json(ws)["hold"] is None
    wait_for(lambda: not keepers(ws), what="the keeper to exit")


def test_pause_and_resume_are_the_hold_s_other_names(ws: Workspace) -> None:
    configure(ws, None)
    paused = ws.cli("fleet", "pause")
    assert paused.returncode == 0 and paused.stdout.startswith("the queue is held since "), paused
    assert Fleet(ws.root).queue_hold() is not None
    resumed = ws.cli("fleet", "resume")
    assert resumed.returncode == 0 and resumed.stdout.startswith("released: "), resumed
    assert Fleet(ws.root).queue_hold() is None


def test_stop_all_stops_every_loop_and_empties_the_queue_starting_none(ws: Workspace) -> None:
    configure(ws, {"max_running": 2})
    for project, task in (("p", "a"), ("q", "b"), ("p", "c"), ("q", "d")):
        done = ws.cli("run", "-p", project, "-t", task, "-d", "go")
        assert done.returncode == 0, done.stderr
    wait_for(lambda: status(ws, "p/a") == status(ws, "q/b") == "running", what="a, b running")
    assert status(ws, "p/c") == status(ws, "q/d") == "queued"
    stopped = ws.cli("stop", "--all")
    assert stopped.returncode == 0, stopped.stderr
    said = stopped.stdout
    assert "run-agent: stopped 2 running: p/a, q/b" in said, said
    assert "run-agent: took 2 out of the queue, never started: p/c, q/d" in said, said
    for label in ("p/a", "q/b"):
        assert status(ws, label) == "stopped", rows(ws)[label]
    assert not ws.task("p", "c").run_ids() and not ws.task("q", "d").run_ids()
    assert not Fleet(ws.root).waiting(clean=False)
    assert Fleet(ws.root).queue_hold() is None  # released as it was
    nothing = ws.cli("stop", "--all")
    assert nothing.returncode == 0 and nothing.stdout.strip() == "run-agent: nothing runs or waits"


def test_stop_all_of_one_project_leaves_the_others_and_a_hold_as_it_was(ws: Workspace) -> None:
    configure(ws, {"max_running": 2})
    for project, task in (("p", "a"), ("q", "b"), ("p", "c")):
        assert ws.cli("run", "-p", project, "-t", task, "-d", "go").returncode == 0
    wait_for(lambda: status(ws, "p/a") == status(ws, "q/b") == "running", what="a, b running")
    assert ws.cli("fleet", "hold").returncode == 0
    stopped = ws.cli("stop", "--all", "-p", "p")
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped 1 running: p/a" in stopped.stdout, stopped.stdout
    assert "took 1 out of the queue, never started: p/c" in stopped.stdout, stopped.stdout
    assert status(ws, "q/b") == "running"
    assert Fleet(ws.root).queue_hold() is not None  # held before: held still
    bad = ws.cli("stop", "--all", "-t", "a")
    assert bad.returncode == 2 and "--all" in bad.stderr and "-t" in bad.stderr, bad.stderr
    assert ws.cli("fleet", "release").returncode == 0
    assert ws.cli("stop", "-p", "q", "-t", "b").returncode == 0


def test_the_api_holds_releases_and_stops_all_within_a_token_s_reach(ws: Workspace) -> None:
    configure(ws, {"max_running": 3})
    mine, _ = tokens.create(ws.root, tokens.Scope.OPERATE, ["p"])
    everything, _ = tokens.create(ws.root, tokens.Scope.OPERATE)
    reader, _ = tokens.create(ws.root, tokens.Scope.READ)
    for project, task in (("p", "a"), ("q", "b")):
        assert ws.cli("run", "-p", project, "-t", task, "-d", "go").returncode == 0
    wait_for(lambda: status(ws, "p/a") == status(ws, "q/b") == "running", what="a, b running")
    with serving(ws) as url, httpx.Client(base_url=url, timeout=60) as client:

        def post(path: str, secret: str, **body: object) -> httpx.Response:
            return client.post(path, json=body, headers={"Authorization": f"Bearer {secret}"})

        assert post("/api/fleet/hold", reader).status_code == 403
        refused = post("/api/fleet/hold", mine)
        assert refused.status_code == 403 and "every project" in refused.json()["error"]
        held = post("/api/fleet/hold", everything)
        assert held.status_code == 200, held.text
        assert held.json()["hold"]["words"].startswith("the queue is held since ")
        fleet = client.get("/api/fleet", headers={"Authorization": f"Bearer {reader}"}).json()
        assert fleet["hold"]["words"] == held.json()["hold"]["words"]
        queued = post("/api/projects/q/tasks", everything, prompt="go", task_id="c")
        assert queued.status_code == 202 and queued.json()["queued"]["waits_for"].startswith(
            "the queue is held")  # fmt: skip
        # A token limited to p stops what p has, and nothing of q.
        outside = post("/api/stop-all", mine, project="q")
        assert outside.status_code == 403, outside.text
        bad = post("/api/stop-all", mine, project=7)
        assert bad.status_code == 400, bad.text
        stopped = post("/api/stop-all", mine)
        assert stopped.status_code == 200, stopped.text
        assert stopped.json() == {"stopped": ["p/a"], "left_queue": [], "held": True}
        assert status(ws, "q/b") == "running" and status(ws, "q/c") == "queued"
        released = post("/api/fleet/release", everything)
        assert released.status_code == 200, released.text
        assert released.json()["released"].startswith("the queue was held since ")
        wait_for(lambda: status(ws, "q/c") == "running", what="c started once released")
        every = post("/api/stop-all", everything)
        assert every.status_code == 200, every.text
        assert every.json()["stopped"] == ["q/b", "q/c"] and every.json()["held"] is False
    wait_for(lambda: not keepers(ws), what="the keeper to exit")


def test_a_hold_whose_record_cannot_be_read_still_holds_until_released(ws: Workspace) -> None:
    configure(ws, None)
    fleet = Fleet(ws.root)
    with fleet.locked():
        (fleet.folder / "hold.json").write_text('{"since": 7')
    held = fleet.queue_hold()
    assert held is not None and held.unreadable is not None
    assert held.words().startswith("the queue is held (its record .fleet/hold.json cannot be read")
    queued = ws.cli("run", "-p", "p", "-t", "a", "-d", "go")
    assert queued.returncode == 0 and "queued: 0 ahead (the queue is held (its record" in (
        queued.stderr), queued.stderr  # fmt: skip
    released = ws.cli("fleet", "release")
    assert released.returncode == 0 and released.stdout.startswith("released: the queue was held")
    wait_for(lambda: status(ws, "p/a") == "running", what="a started once released")
    go(ws, "a")
    wait_for(lambda: status(ws, "p/a") == "completed", what="a to complete")
    wait_for(lambda: not keepers(ws), what="the keeper to exit")


def test_metrics_say_whether_the_queue_is_held(ws: Workspace) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from server import metrics

    def held() -> float:
        scraped = metrics.render(ws.root, 0).decode()
        (sample,) = [s for f in text_string_to_metric_families(scraped) for s in f.samples
                     if s.name == "run_agent_queue_held"]  # fmt: skip
        return sample.value

    configure(ws, None)
    assert held() == 0
    assert ws.cli("fleet", "hold").returncode == 0
    assert held() == 1
    assert ws.cli("fleet", "release").returncode == 0
    assert held() == 0
