"""A provider's limit pauses its agent across the fleet: a run of it that is rate limited, its
agent saying until when, pauses the agent under the runs root; its queued tasks do not start, the
limited loop gives its slot back and waits as a queue record, tasks of other agents take the
slots, and no attempt is spent; `fleet unpause` lifts it. Real loops, a real queue and keeper,
the fake agent speaking claude's stream."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from subprocess import Popen
from typing import Any

import yaml

from runagent.fleet.queue import Fleet, Pause, decide
from runagent.service import StartRequest
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import Reason
from tests.conftest import Workspace, wait_for
from tests.fleet.test_queue import HOLD, LIMITS, go, holder, keepers, listed, service, waiting

LONG = 600  # seconds the limited agent says its limit lasts: far past any test


def limited_fleet(
    ws: Workspace, limits: dict[str, Any], seconds: float = LONG, first: int = 1
) -> None:
    """Agent `lim` (claude's stream) is limited on its `first` runs in the fleet for `seconds`,
    then works as `fake` does: a line, then it waits for `go` in its task folder."""
    ws.write_config(HOLD, max_restarts=0)
    data = yaml.safe_load(ws.config.read_text())
    data["limits"] = limits
    data["agents"]["lim"] = {"type": "claude", "command": ws.agent_argv(
        ["--ignore-unknown", "--rate-limited", str(seconds), "--limited-first", str(first),
         "--counter", str(ws.path / "lim-runs"), *HOLD])}  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))


def paused(ws: Workspace) -> dict[str, Pause]:
    return Fleet(ws.root).pauses(clean=False)


def test_a_paused_agent_s_tasks_wait_and_take_no_slot_from_those_behind() -> None:
    pause = Pause("fake", time.time() + 60, "rate limited")
    turn = decide(LIMITS, "p", "fake", [], [], {"fake": pause})
    assert not turn.go and turn.waits_for.startswith("fake paused until ")
    assert turn.waits_for.endswith(" UTC: rate limited")
    # One of a paused agent ahead does not take the one free slot.
    other = waiting("q", "w", 1)
    assert decide(LIMITS, "p", "codex", [other], [holder("p", "a")], {"fake": pause}).go
    assert not decide(LIMITS, "p", "codex", [other], [holder("p", "a")]).go


def test_a_limit_pauses_the_agent_its_loop_gives_the_slot_back_and_others_run(
    ws: Workspace,
) -> None:
    limited_fleet(ws, {"max_running": 1})
    door = service(ws)
    door.start(StartRequest(ws.task("p", "a"), "go", overrides=_agent("lim")))
    wait_for(lambda: "lim" in paused(ws), what="lim paused by a's limited run")
    pause = paused(ws)["lim"]
    assert pause.by == "p/a" and "five_hour" in pause.why
    assert LONG - 30 < pause.until - time.time() <= LONG + 1
    # a's loop waits in the queue, not in a slot; a second task of lim waits too.
    wait_for(lambda: listed(ws)["p/a"].get("queue") is not None, what="a back in the queue")
    door.start(StartRequest(ws.task("p", "b"), "go", overrides=_agent("lim")))
    # A task of another agent takes the slot the limited loop gave back.
    door.start(StartRequest(ws.task("p", "c"), "go"))
    wait_for(lambda: listed(ws)["p/c"]["status"] == "running", what="c running")
    rows = listed(ws)
    for task in ("a", "b"):
        assert rows[f"p/{task}"]["queue"]["waits_for"] == pause.words(), rows[f"p/{task}"]
    assert len(ws.runs("p", "a")) == 1 and not ws.runs("p", "b")
    (limited,) = ws.runs("p", "a")
    assert limited.reason is Reason.RATE_LIMIT
    holders = [h.label for h in Fleet(ws.root).holders(clean=False)]
    assert holders == ["p/c"]
    # Lifted by a person: the queue goes on (c still holds the one slot: a waits for it).
    lifted = ws.cli("fleet", "unpause", "lim")
    assert lifted.returncode == 0, lifted.stderr
    assert lifted.stdout.strip() == f"lifted: {pause.words()}"
    assert "lim" not in paused(ws)
    again = ws.cli("fleet", "unpause", "lim")
    assert again.returncode == 0 and again.stdout.strip() == "agent lim is not paused"
    go(ws, "c")
    wait_for(lambda: len(ws.runs("p", "a")) == 2, what="a's second attempt")
    for task in ("a", "b"):
        go(ws, task)
    wait_for(lambda: all(listed(ws)[f"p/{t}"]["status"] == "completed" for t in "abc"),
             timeout=60, what="all three to complete")  # fmt: skip
    first, second = ws.runs("p", "a")
    assert (first.attempt, second.attempt) == (1, 2)  # max_restarts 0: the limit spent none
    assert second.reason is None or second.reason is not Reason.RATE_LIMIT
    wait_for(lambda: not keepers(ws), what="the keeper to exit")
    assert not list(Fleet(ws.root).slots.iterdir())


def test_a_pause_lifts_by_itself_when_its_time_comes(ws: Workspace) -> None:
    limited_fleet(ws, {"max_running": 2}, seconds=2)
    shown = ws.start_cli("-p", "p", "-t", "a", "--agent", "lim", "go")
    wait_for(lambda: len(ws.runs("p", "a")) == 2, what="a's second attempt")
    assert "lim" not in paused(ws)
    go(ws, "a")
    assert shown.wait(60) == 0
    said = shown.stderr.read() if shown.stderr else ""
    assert "rate limited: lim paused until " in said, said
    assert "its slot given back meanwhile (no restart spent)" in said


def test_a_limit_that_says_no_reset_time_pauses_for_rate_limit_wait(ws: Workspace) -> None:
    limited_fleet(ws, {"max_running": 1}, seconds=-1)
    data = yaml.safe_load(ws.config.read_text())
    data["defaults"]["rate_limit_wait"] = 300
    ws.config.write_text(yaml.safe_dump(data))
    before = time.time()
    service(ws).start(StartRequest(ws.task("p", "a"), "go", overrides=_agent("lim")))
    wait_for(lambda: "lim" in paused(ws), what="lim paused")
    pause = paused(ws)["lim"]
    assert before + 300 <= pause.until <= time.time() + 301
    assert ws.cli("stop", "-p", "p", "-t", "a").returncode == 0
    wait_for(lambda: listed(ws)["p/a"]["status"] not in ("running", "queued"), what="a's end")


def test_a_stopped_loop_leaves_the_queue_while_its_agent_is_paused(ws: Workspace) -> None:
    limited_fleet(ws, {"max_running": 1})
    door = service(ws)
    door.start(StartRequest(ws.task("p", "a"), "go", overrides=_agent("lim")))
    wait_for(lambda: listed(ws)["p/a"].get("queue") is not None, what="a back in the queue")
    stopped = ws.cli("stop", "-p", "p", "-t", "a")
    assert stopped.returncode == 0, stopped.stderr
    wait_for(lambda: listed(ws)["p/a"]["status"] not in ("running", "queued"), what="a's end")
    said = (ws.task("p", "a").folder / "supervisor.log").read_text()
    assert "task p/a stopped" in said, said
    assert not Fleet(ws.root).waiting(clean=False)
    assert "lim" in paused(ws)  # the agent stays paused: its limit is its provider's


def test_the_pause_shows_in_fleet_status_and_metrics_and_the_api_lifts_it(
    ws: Workspace,
) -> None:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from runagent.fleet import gate
    from server import metrics
    from tests.conftest import serving

    limited_fleet(ws, {"max_running": 1}, first=0)
    pause = gate.pause(ws.task("p", "x"), "lim", LONG, "rate limited (five_hour limit reached)")
    assert pause.words().startswith("lim paused until ")
    door = service(ws)
    started = door.start(StartRequest(ws.task("p", "b"), "go", overrides=_agent("lim")))
    assert started.queued is not None and started.queued.waits_for == pause.words()
    text = ws.cli("fleet").stdout.splitlines()
    assert f"{pause.words()} (`run-agent fleet unpause lim` lifts it)" in text, text
    (shown,) = json.loads(ws.cli("fleet", "--json").stdout)["paused"]
    assert (shown["agent"], shown["words"], shown["by"]) == ("lim", pause.words(), "p/x")
    status = ws.cli("status", "-p", "p", "-t", "b").stdout
    assert pause.words() in status, status
    scraped = metrics.render(ws.root, 0).decode()
    (sample,) = [s for f in text_string_to_metric_families(scraped) for s in f.samples
                 if s.name == "run_agent_agent_paused_until_seconds"]  # fmt: skip
    assert sample.labels == {"agent": "lim", "why": pause.why}
    assert sample.value == pause.until
    with serving(ws) as url:
        bad = httpx.post(f"{url}/api/fleet/unpause", json={"agent": 7})
        assert bad.status_code == 400 and "agent 7" in bad.json()["error"], bad.text
        lifted = httpx.post(f"{url}/api/fleet/unpause", json={"agent": "lim"})
        assert lifted.status_code == 200, lifted.text
        assert lifted.json() == {"agent": "lim", "lifted": pause.words()}
    wait_for(lambda: listed(ws)["p/b"]["status"] == "running", what="b started once lifted")
    go(ws, "b")
    wait_for(lambda: listed(ws)["p/b"]["status"] == "completed", what="b to complete")
    wait_for(lambda: not keepers(ws), what="the keeper to exit")


def test_without_limits_a_start_of_a_paused_agent_waits_and_goes_when_lifted(
    ws: Workspace,
) -> None:
    from runagent.fleet import gate

    limited_fleet(ws, {}, first=0)  # no cap at all: only the pause holds it
    pause = gate.pause(ws.task("p", "x"), "lim", LONG, "rate limited")
    shell = ws.start_cli("job", "-p", "p", "-t", "a", "--agent", "lim", "go")
    wait_for(lambda: listed(ws).get("p/a", {}).get("status") == "queued", what="a queued")
    assert listed(ws)["p/a"]["queue"]["waits_for"] == pause.words()
    assert not ws.runs("p", "a")
    assert ws.cli("fleet", "unpause", "lim").returncode == 0
    wait_for(lambda: listed(ws)["p/a"]["status"] == "running", what="a running once lifted")
    go(ws, "a")
    assert shell.wait(60) == 0
    said = shell.stderr.read() if shell.stderr else ""
    assert said.count(f"task p/a queued: 0 ahead ({pause.words()})") == 1, said


def test_a_pause_record_that_cannot_be_read_or_names_another_agent_counts_for_nothing(
    ws: Workspace,
) -> None:
    from runagent.fleet import gate

    gate.pause(ws.task("p", "x"), "lim", LONG, "rate limited")
    fleet = Fleet(ws.root)
    record = fleet.paused / "lim.json"
    record.write_text('{"agent": "lim", "until": "soon"')  # half written
    assert fleet.pauses(clean=False) == {}
    other = json.dumps({"agent": "other", "until": time.time() + LONG, "why": "x"})
    record.write_text(other)  # a record under another agent's name
    assert fleet.pauses(clean=False) == {}
    with fleet.locked():
        assert fleet.pauses() == {} and not record.exists()  # a writer tidies it


def test_unpause_names_an_agent_no_config_knows(ws: Workspace) -> None:
    ws.write_config(HOLD)
    done = ws.cli("fleet", "unpause", "nobody")
    assert done.returncode == 0 and done.stdout.strip() == "agent nobody is not paused"
    as_json = ws.cli("fleet", "--json")
    assert json.loads(as_json.stdout)["paused"] == []


def cocode_of(ws: Workspace, number: int) -> tuple[Popen[str], TaskPaths]:
    """`run-agent cocode --agent lim` started on issue `number` in a repository of its own, as
    a cocode host starts its agent; and its task."""
    from tests.gitrepo import GIT_ENV, make_repo

    repo = make_repo(ws.path / f"repo-{number}")
    issue = ws.path / f"issue-{number}.txt"
    issue.write_text(f"Fix bug {number}\n")
    env = {**GIT_ENV, "COCODE_REPO_PATH": str(repo), "COCODE_ISSUE_NUMBER": str(number),
           "COCODE_ISSUE_BODY_FILE": str(issue)}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "runagent", "cocode", "--config", str(ws.config), "--agent",
         "lim", "--max-restarts", "0"], cwd=repo, env={**os.environ, **env},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    return proc, ws.task("cocode", f"issue-{number}")


def test_a_cocode_loop_pauses_its_agent_across_the_fleet_and_honours_the_pause(
    ws: Workspace,
) -> None:
    """`run-agent cocode` is a loop like any: its limited run pauses the agent for the fleet,
    it gives its slot back and waits as a queue record (a task of another agent takes the
    slot), a second cocode of the agent waits for the pause, and once it is lifted both
    resolve their issues, the limit having spent no restart."""
    limited_fleet(ws, {"max_running": 1})
    first, one = cocode_of(ws, 1)
    second: Popen[str] | None = None
    try:
        wait_for(lambda: "lim" in paused(ws), timeout=30, what="lim paused by cocode's run")
        pause = paused(ws)["lim"]
        assert pause.by == one.label and "five_hour" in pause.why
        wait_for(lambda: listed(ws)[one.label].get("queue") is not None, what="back in queue")
        door = service(ws)
        door.start(StartRequest(ws.task("p", "c"), "go"))
        wait_for(lambda: listed(ws)["p/c"]["status"] == "running", what="c on the slot")
        second, two = cocode_of(ws, 2)
        wait_for(lambda: listed(ws).get(two.label, {}).get("status") == "queued",
                 what="the second cocode queued")  # fmt: skip
        assert listed(ws)[two.label]["queue"]["waits_for"] == pause.words()
        assert len(ws.runs("cocode", "issue-1")) == 1 and not ws.runs("cocode", "issue-2")
        assert ws.cli("fleet", "unpause", "lim").returncode == 0
        go(ws, "c")
        for task in (one, two):
            task.folder.mkdir(parents=True, exist_ok=True)
            (task.folder / "go").touch()
        assert first.wait(60) == 0 and second.wait(60) == 0
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    out = first.stdout.read() if first.stdout else ""
    said = [json.loads(line)["message"] for line in out.splitlines()]
    assert any(f"rate limited: {pause.words()}; its slot given back" in m for m in said), said
    waited = second.stdout.read() if second.stdout else ""
    assert f"task {two.label} queued: " in waited and pause.words() in waited, waited
    limited, then = ws.runs("cocode", "issue-1")
    assert limited.reason is Reason.RATE_LIMIT and then.attempt == 2  # max_restarts 0
    wait_for(lambda: not keepers(ws), what="the keeper to exit")


def _agent(name: str) -> Any:
    from runagent.config.overrides import LoopOverrides

    return LoopOverrides(agent=name)
