"""The concurrency cap and its queue, and tasks that run after others: real `run-agent`
processes, real run folders, the keeper as the process it is. Orders and counts are asserted,
never durations."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

import backends
from runagent.config.settings import LimitsSettings
from runagent.errors import ConfigError, UsageError
from runagent.fleet.queue import Fleet, Holder, Waiting, decide
from runagent.service import Command, Service, StartRequest
from runagent.store.lock import live_holder
from runagent.store.runinfo import RunInfo
from tests.conftest import Workspace, wait_for

# Each agent prints a line, then waits for `go` in its own task folder.
HOLD = ["--lines", "1", "--wait-in-task", "go"]


def configure(ws: Workspace, limits: dict[str, Any] | None, args: list[str] = HOLD) -> None:
    ws.write_config(args, max_restarts=0)
    data = yaml.safe_load(ws.config.read_text())
    if limits is not None:
        data["limits"] = limits
    ws.config.write_text(yaml.safe_dump(data))


def listed(ws: Workspace) -> dict[str, dict[str, Any]]:
    done = ws.cli("list", "--json")
    assert done.returncode == 0, done.stderr
    return {f"{t['project_id']}/{t['task_id']}": t for t in json.loads(done.stdout)}


def go(ws: Workspace, task: str, project: str = "p") -> None:
    folder = ws.task(project, task).folder
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "go").touch()


def running(ws: Workspace, task: str) -> bool:
    return listed(ws).get(f"p/{task}", {}).get("status") == "running"


def only_run(ws: Workspace, task: str) -> RunInfo:
    (info,) = ws.runs("p", task)
    return info


def service(ws: Workspace) -> Service:
    return Service(ws.root, config_path=ws.config, backend_names=backends.known(),
                   workdir=ws.path)  # fmt: skip


def keepers(ws: Workspace) -> list[int]:
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "runagent.executors.keeper" in cmdline and str(ws.root.resolve()) in cmdline:
            found.append(proc.pid)
    return found


def one_runs_one_waits(ws: Workspace) -> tuple[subprocess.Popen[str], subprocess.Popen[str]]:
    """Under max_running 1: job p/a running (its agent holding), then job p/b queued."""
    configure(ws, {"max_running": 1})
    first = ws.start_cli("job", "-p", "p", "-t", "a", "first")
    wait_for(lambda: running(ws, "a"), what="a running")
    second = ws.start_cli("job", "-p", "p", "-t", "b", "second")
    wait_for(lambda: listed(ws).get("p/b", {}).get("status") == "queued", what="b queued")
    return first, second


# The decision itself.

LIMITS = LimitsSettings(max_running=2, projects={"web": 1})


def waiting(project: str, task: str, seq: int, priority: int = 0) -> Waiting:
    return Waiting(project, task, "fake", seq, priority)


def holder(project: str, task: str) -> Holder:
    return Holder(project, task, "fake", 1)


def test_a_task_goes_while_a_slot_is_free_and_none_ahead_can_take_it() -> None:
    assert decide(LIMITS, "p", "fake", [], []).go
    assert not decide(LIMITS, "p", "fake", [], [holder("p", "a"), holder("q", "b")]).go
    # One ahead that fits takes the one free slot first...
    turn = decide(LIMITS, "p", "fake", [waiting("q", "w", 1)], [holder("p", "a")])
    assert not turn.go and turn.ahead == 1 and turn.waits_for == "max_running 2"
    # ...but one ahead held back by its own project's cap does not hold this one back.
    assert decide(LIMITS, "p", "fake", [waiting("web", "w", 1)], [holder("web", "a")]).go
    turn = decide(LIMITS, "web", "fake", [], [holder("web", "a")])
    assert not turn.go and turn.waits_for == "project web's limit of 1"
    per_agent = LimitsSettings(agents={"claude": 1})
    assert not decide(per_agent, "p", "claude", [], [Holder("q", "x", "claude", 1)]).go
    assert decide(per_agent, "p", "codex", [], [Holder("q", "x", "claude", 1)]).go


def test_the_config_names_a_bad_limit(ws: Workspace) -> None:
    from runagent.config.file import load_config

    for limits, said in (
        ({"max_running": 0}, "limits.max_running: 0 would never start a task"),
        ({"max_running": -1}, "limits.max_running: -1 is not a whole number"),
        ({"agents": {"claude": "two"}}, "limits.agents.claude: 'two' is not a whole number"),
        ({"max_runing": 2}, "did you mean 'max_running'"),
    ):
        configure(ws, limits)
        with pytest.raises(ConfigError, match=said):
            load_config(ws.config, backends.known(), ws.path)


def every_limit() -> LimitsSettings:
    """LimitsSettings with each of its fields set, none to its default, so a limit added to it
    is here without a word; a kind of limit this cannot set fails, saying so."""
    values: dict[str, Any] = {}
    for n, f in enumerate(dataclasses.fields(LimitsSettings), start=1):
        if f.default is None:  # a cap: a whole number
            values[f.name] = n
        elif f.default_factory is dict:  # caps by name: NAME: a whole number
            values[f.name] = {f"other{n}": n}
        else:
            pytest.fail(f"LimitsSettings.{f.name} is a new kind of limit: teach every_limit()")
    full = LimitsSettings(**values)
    for f in dataclasses.fields(LimitsSettings):
        assert getattr(full, f.name) != getattr(LimitsSettings(), f.name), f.name
    return full


def test_a_detached_start_carries_every_limit_through_its_record_to_the_keeper(
    ws: Workspace,
) -> None:
    """The keeper starts a queued detached task under the limits its record carries (it was
    queued under them; the keeper reads no config): every field of LimitsSettings, as
    config.yaml says it, is in the record on disk and comes back from it as it was."""
    from runagent.config.file import load_config

    full = replace(every_limit(), max_running=1)  # one slot: p/b waits behind p/a
    as_yaml = {f.name: getattr(full, f.name) for f in dataclasses.fields(LimitsSettings)}
    configure(ws, {k: dict(v) if isinstance(v, dict) else v for k, v in as_yaml.items()})
    assert load_config(ws.config, backends.known(), ws.path).limits == full
    door = service(ws)
    door.start(StartRequest(ws.task("p", "a"), "go"))
    try:
        queued = door.start(StartRequest(ws.task("p", "b"), "go"))
        assert queued.pid == 0 and queued.queued is not None
        fleet = Fleet(ws.root)
        on_disk = json.loads(fleet.record_path("p", "b").read_text())["limits"]
        assert set(on_disk) == set(as_yaml), on_disk
        (record,) = fleet.waiting(clean=False)  # as the keeper reads it
        assert record.label == "p/b" and record.start is not None  # detached: the keeper's
        assert record.limit_settings() == full
    finally:
        go(ws, "a")
        go(ws, "b")
    wait_for(lambda: listed(ws)["p/b"]["status"] == "completed", timeout=60, what="b")
    wait_for(lambda: not keepers(ws), what="the keeper to exit")


def test_every_limit_goes_through_a_queue_record_and_the_fleet_listing_as_it_was(
    tmp_path: Path,
) -> None:
    from runagent.fleet.overview import overview

    full = every_limit()
    record = json.loads(json.dumps(Waiting("p", "t", "fake", 1, limits=full).to_json()))
    assert Waiting.from_json(record).limit_settings() == full
    assert LimitsSettings.from_record(overview(tmp_path, full).to_dict()["limits"]) == full


@pytest.mark.parametrize(
    "limits, said",
    [
        ("four", "limits 'four' is not an object"),
        ({"max_running": "four"}, "limits.max_running 'four' is not a whole number"),
        ({"per_project": 1.5}, "limits.per_project 1.5 is not a whole number"),
        ({"projects": [1]}, "limits.projects [1] is not an object"),
        ({"agents": {"claude": True}}, "limits.agents.claude true is not a whole number"),
    ],
)
def test_a_queue_record_whose_limits_are_not_limits_is_refused_naming_the_field(
    limits: object, said: str
) -> None:
    record = Waiting("p", "t", "fake", 1).to_json()
    with pytest.raises(ValueError) as refused:
        Waiting.from_json({**record, "limits": limits})
    assert str(refused.value) == said


# Foreground runs: each waits in its own process.


def test_a_run_over_the_cap_waits_its_turn_says_so_once_and_runs_after(ws: Workspace) -> None:
    first, second = one_runs_one_waits(ws)
    row = listed(ws)["p/b"]
    assert row["queue"]["ahead"] == 0 and row["queue"]["waits_for"] == "max_running 1"
    assert not ws.runs("p", "b")  # nothing of it ran
    go(ws, "b")
    go(ws, "a")
    assert first.wait(60) == 0 and second.wait(60) == 0
    said = second.stderr.read() if second.stderr else ""
    assert said.count("queued: 0 ahead (max_running 1)") == 1, said
    a, b = only_run(ws, "a"), only_run(ws, "b")
    assert b.start_time >= (a.end_time or "")  # never both at once
    assert not list(Fleet(ws.root).slots.iterdir())  # every slot given back
    assert a.queued_seconds is None  # it went at once
    queued_while(b, a)  # its wait, from queueing while a ran to its own start
    shown = ws.cli("status", "-p", "p", "-t", "b").stdout
    said = f"{b.queued_seconds:g}s in the queue before its loop began"
    assert re.search(rf"^queued +{re.escape(said)}$", shown, re.M), shown
    assert not re.search(r"^queued ", ws.cli("status", "-p", "p", "-t", "a").stdout, re.M)
    from prometheus_client.parser import text_string_to_metric_families

    from server import metrics

    scraped = metrics.render(ws.root, 0).decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(scraped)
               for s in f.samples if f.name == "run_agent_queue_wait_seconds"}  # fmt: skip
    assert samples["run_agent_queue_wait_seconds_count"] == 1  # b's wait alone
    assert samples["run_agent_queue_wait_seconds_sum"] == b.queued_seconds


def instant(stamp: str | None) -> float:
    return datetime.fromisoformat(stamp or "").timestamp()


def queued_while(run: RunInfo, other: RunInfo) -> None:
    """`run` records a wait in the queue that began while `other` ran (to the millisecond the
    records are written in)."""
    assert run.queued_seconds is not None, run
    queued = instant(run.start_time) - run.queued_seconds
    assert instant(other.start_time) - 0.002 <= queued <= instant(other.end_time) + 0.002


def test_ctrl_c_leaves_the_queue_with_130_and_no_task_behind(ws: Workspace) -> None:
    first, second = one_runs_one_waits(ws)
    os.killpg(second.pid, signal.SIGINT)
    assert second.wait(120) == 130
    assert "left the queue" in (second.stderr.read() if second.stderr else "")
    assert Fleet(ws.root).record_of(ws.task("p", "b")) is None
    assert not ws.task("p", "b").folder.exists()  # it never ran: nothing is left of it
    go(ws, "a")
    assert first.wait(60) == 0


def test_stop_takes_a_waiting_run_out_of_the_queue(ws: Workspace) -> None:
    first, second = one_runs_one_waits(ws)
    stopped = ws.cli("stop", "-p", "p", "-t", "b")
    assert stopped.returncode == 0 and "left the queue" in stopped.stdout
    assert second.wait(120) == 130
    assert "taken out of the queue" in (second.stderr.read() if second.stderr else "")
    go(ws, "a")
    assert first.wait(60) == 0


def test_a_holder_killed_by_sigkill_frees_its_slot(ws: Workspace) -> None:
    first, second = one_runs_one_waits(ws)
    go(ws, "b")
    os.killpg(first.pid, signal.SIGKILL)  # the supervisor and its whole group; its reaper lives
    first.wait(30)
    assert second.wait(60) == 0  # the dead holder's slot counted for nothing
    assert only_run(ws, "b").status.value == "completed"


# Detached starts (the API, schedules): a record each, one keeper for them all.


def test_detached_starts_queue_as_records_and_one_keeper_starts_them_in_order(
    ws: Workspace,
) -> None:
    configure(ws, {"max_running": 2, "projects": {"web": 1}},
              [*HOLD, "--echo-env", "RUN_AGENT_QUEUED_SINCE"])  # fmt: skip
    door = service(ws)
    started = {}
    for project, task, priority in (("p", "t1", 0), ("p", "t2", 0), ("p", "t3", 0),
                                    ("p", "t4", 5), ("web", "w1", 0)):  # fmt: skip
        started[task] = door.start(StartRequest(ws.task(project, task), "go", priority=priority))
    assert started["t1"].pid > 0 and started["t2"].pid > 0
    queued = {k: v.queued for k, v in started.items() if v.queued is not None}
    assert set(queued) == {"t3", "t4", "w1"}
    assert queued["w1"] is not None and queued["w1"].waits_for == "max_running 2"
    rows = listed(ws)
    # t4 was queued after t3, but with a higher priority: it is ahead of t3.
    assert rows["p/t4"]["status"] == "queued" and rows["p/t4"]["queue"]["ahead"] == 0
    assert rows["p/t3"]["queue"]["ahead"] == 1 and rows["p/t3"]["queue"]["detached"]
    assert len(keepers(ws)) == 1
    for task in ("t1", "t2", "t3", "t4"):
        go(ws, task)
    go(ws, "w1", project="web")
    wait_for(lambda: all(r["status"] == "completed" for r in listed(ws).values())
             and len(listed(ws)) == 5, timeout=60, what="all five to complete")  # fmt: skip
    runs = sorted(
        [only_run(ws, t) for t in ("t1", "t2", "t3", "t4")] + ws.runs("web", "w1"),
        key=lambda r: r.start_time,
    )
    assert [r.task_id for r in runs][2:] == ["t4", "t3", "w1"]  # the queue's order
    for run in runs[:2]:
        assert run.queued_seconds is None  # they went at once
    for run in runs[2:]:  # the keeper started them: their waits began while t1 ran
        queued_while(run, runs[0])
    said = (ws.task("p", "t3").run(runs[3].run_id).stdout).read_text()
    assert "RUN_AGENT_QUEUED_SINCE=\n" in said  # the keeper's word is for the loop alone
    for run in runs:  # never more than two at once: the most run at some run's start
        live = [o.task_id for o in runs if o.start_time <= run.start_time < (o.end_time or "")]
        assert len(live) <= 2, (run.task_id, live)
    wait_for(lambda: not keepers(ws), what="the keeper to exit with the queue empty")
    assert not Fleet(ws.root).waiting()


def test_the_keeper_forks_each_start_from_its_server_and_the_loops_outlive_both(
    ws: Workspace,
) -> None:
    """A freed slot waits for no interpreter's start: the keeper's fork server, which loaded
    the supervisor's modules once, forks each queued start. A detached loop is no one's to
    take down: the last one started goes on after the keeper and its server have exited."""
    import psutil

    configure(ws, {"max_running": 1})
    door = service(ws)
    assert door.start(StartRequest(ws.task("p", "a"), "go")).queued is None
    for task in ("b", "c"):
        assert door.start(StartRequest(ws.task("p", task), "go")).queued is not None
    (keeper,) = keepers(ws)

    def server() -> list[psutil.Process]:
        return [child for child in psutil.Process(keeper).children()
                if "runagent.executors.forkserver" in child.cmdline()]  # fmt: skip

    wait_for(server, what="the keeper's fork server")
    (forks,) = server()

    def supervisor(task: str) -> int:
        wait_for(lambda: running(ws, task), timeout=60, what=f"{task} running")
        holder = live_holder(ws.task("p", task).lock)
        assert holder is not None
        return holder.pid

    go(ws, "a")
    b = supervisor("b")
    assert psutil.Process(b).ppid() == forks.pid  # c still queued: the keeper waits on
    go(ws, "b")
    c = supervisor("c")
    wait_for(lambda: not keepers(ws), what="the keeper to exit with the queue empty")
    wait_for(lambda: not forks.is_running(), what="its fork server to exit with it")
    assert psutil.Process(c).is_running() and running(ws, "c")
    go(ws, "c")
    wait_for(lambda: listed(ws)["p/c"]["status"] == "completed", timeout=60, what="c")


def test_a_queued_start_whose_interpreter_settings_differ_is_started_as_a_new_interpreter(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forked supervisor keeps what its interpreter read as it started (PYTHONPATH, where
    plugins are found; the locale): a start whose environment sets them otherwise than the
    keeper's does is not forked, but started as a new interpreter, as before."""
    import psutil

    configure(ws, {"max_running": 1})
    door = service(ws)
    assert door.start(StartRequest(ws.task("p", "a"), "go")).queued is None
    assert door.start(StartRequest(ws.task("p", "b"), "go")).queued is not None
    monkeypatch.setenv("PYTHONPATH", str(ws.path / "plugins"))
    assert door.start(StartRequest(ws.task("p", "c"), "go")).queued is not None
    monkeypatch.delenv("PYTHONPATH")
    assert door.start(StartRequest(ws.task("p", "d"), "go")).queued is not None  # keeps it on
    (keeper,) = keepers(ws)

    def parent(task: str) -> int:
        wait_for(lambda: running(ws, task), timeout=60, what=f"{task} running")
        holder = live_holder(ws.task("p", task).lock)
        assert holder is not None
        return psutil.Process(holder.pid).ppid()

    go(ws, "a")
    assert parent("b") != keeper  # forked by the keeper's server
    go(ws, "b")
    assert parent("c") == keeper  # a new interpreter, the keeper's own child
    for task in ("c", "d"):
        go(ws, task)
    wait_for(lambda: listed(ws)["p/d"]["status"] == "completed", timeout=60, what="d")


def test_a_queued_detached_task_is_stopped_before_it_starts(ws: Workspace) -> None:
    configure(ws, {"max_running": 1})
    door = service(ws)
    door.start(StartRequest(ws.task("p", "a"), "go"))
    queued = door.start(StartRequest(ws.task("p", "b"), "go"))
    assert queued.queued is not None and queued.pid == 0
    left = door.stop(ws.task("p", "b"), 5)
    assert isinstance(left, Waiting) and left.label == "p/b"
    assert listed(ws)["p/b"]["status"] == "stopped"  # before it ever started, and said so
    go(ws, "a")
    wait_for(lambda: listed(ws)["p/a"]["status"] == "completed", what="a to complete")
    wait_for(lambda: not keepers(ws), what="the keeper to exit")
    assert not ws.runs("p", "b")  # never started


# Tasks that run after others.


def test_a_run_after_another_is_blocked_until_it_completes(ws: Workspace) -> None:
    configure(ws, None)
    first = ws.start_cli("job", "-p", "p", "-t", "a", "first")
    wait_for(lambda: running(ws, "a"), what="a running")
    second = ws.start_cli("job", "-p", "p", "-t", "b", "--after", "p/a", "second")
    wait_for(lambda: listed(ws).get("p/b", {}).get("status") == "blocked", what="b blocked")
    assert listed(ws)["p/b"]["queue"]["waits_for"] == "waits for p/a"
    go(ws, "b")
    go(ws, "a")
    assert first.wait(60) == 0 and second.wait(60) == 0
    assert only_run(ws, "b").start_time >= (only_run(ws, "a").end_time or "")
    queued_while(only_run(ws, "b"), only_run(ws, "a"))  # blocked is a wait in the queue too


def test_a_failed_dependency_blocks_and_resume_starts_the_task_once_it_completed(
    ws: Workspace,
) -> None:
    configure(ws, None, ["--exit", "1"])
    assert ws.cli("job", "-p", "p", "-t", "a", "first").returncode == 1
    blocked = ws.cli("job", "-p", "p", "-t", "b", "--after", "p/a", "second")
    assert blocked.returncode == 6, blocked.stderr
    assert "blocked: it waits for p/a, which failed" in blocked.stderr
    row = listed(ws)["p/b"]
    assert row["status"] == "blocked" and "p/a, which failed" in row["queue"]["waits_for"]
    assert not ws.runs("p", "b")
    configure(ws, None, ["--exit", "0"])
    assert ws.cli("resume", "-p", "p", "-t", "b").returncode == 6  # a has still not completed
    assert ws.cli("resume", "-p", "p", "-t", "a").returncode == 0
    resumed = ws.cli("resume", "-p", "p", "-t", "b")
    assert resumed.returncode == 0, resumed.stderr
    assert only_run(ws, "b").status.value == "completed"


def test_unknown_tasks_itself_and_cycles_are_refused_at_submission(ws: Workspace) -> None:
    configure(ws, None, ["--exit", "1"])
    refusals = [("p/nope", "no such task"), ("p/b", "is the task itself"),
                ("nope", "is not PROJECT/TASK"), ("p/../x", "not allowed")]  # fmt: skip
    for after, said in refusals:
        done = ws.cli("job", "-p", "p", "-t", "b", "--after", after, "x")
        assert done.returncode == 2 and said in done.stderr, (after, done.stderr)
        assert not ws.task("p", "b").folder.exists()
    assert ws.cli("job", "-p", "p", "-t", "a", "x").returncode == 1
    assert ws.cli("job", "-p", "p", "-t", "c", "x").returncode == 1
    door = service(ws)
    blocked = door.start(StartRequest(ws.task("p", "a"), command=Command.RESUME, after=("p/c",)))
    assert blocked.queued is not None and blocked.queued.blocked
    with pytest.raises(UsageError, match="p/c -> p/a -> p/c would wait for itself"):
        door.start(StartRequest(ws.task("p", "c"), command=Command.RESUME, after=("p/a",)))
    assert door.stop(ws.task("p", "a"), 5) is not None


def test_the_api_queues_a_start_over_the_cap_and_says_where(ws: Workspace) -> None:
    from starlette.testclient import TestClient

    from server.app import create_app
    from server.settings import Settings
    from tests.conftest import LOCAL

    configure(ws, {"max_running": 1})
    app = create_app(Settings(root=ws.root, config_path=ws.config, workdir=ws.path,
                              backend_names=backends.known()))  # fmt: skip
    with TestClient(app, base_url=LOCAL) as c:
        first = c.post("/api/projects/p/tasks", json={"task_id": "a", "prompt": "go"})
        assert first.status_code == 202 and first.json()["queued"] is None
        second = c.post("/api/projects/p/tasks",
                        json={"task_id": "b", "prompt": "go", "priority": "3"})  # fmt: skip
        assert second.status_code == 202, second.text
        assert second.json()["queued"] == {"ahead": 0, "waits_for": "max_running 1",
                                           "blocked": False}  # fmt: skip
        assert second.json()["supervisor_pid"] is None
        bad = c.post("/api/projects/p/tasks", json={"task_id": "c", "prompt": "go",
                                                    "after": ["p/none"]})  # fmt: skip
        assert bad.status_code == 400 and "no such task" in bad.json()["error"]
        assert c.get("/api/projects/p/tasks/b").json()["queue"]["priority"] == 3
        go(ws, "a")
        go(ws, "b")
        wait_for(lambda: c.get("/api/projects/p/tasks/b").json()["status"] == "completed",
                 timeout=60, what="b to complete")  # fmt: skip
    wait_for(lambda: not keepers(ws), what="the keeper to exit")


def one_detached_waits(ws: Workspace) -> None:
    """Under max_running 1: p/a started detached (its agent holding), p/b queued behind it."""
    configure(ws, {"max_running": 1})
    door = service(ws)
    door.start(StartRequest(ws.task("p", "a"), "go"))
    door.start(StartRequest(ws.task("p", "b"), "go"))


def test_queue_records_hold_the_environment_for_the_owner_only(ws: Workspace) -> None:
    one_detached_waits(ws)
    fleet = Fleet(ws.root)
    (record,) = fleet.queue.iterdir()
    assert oct(record.stat().st_mode & 0o777) == "0o600"
    assert oct(fleet.folder.stat().st_mode & 0o777) == "0o700"
    go(ws, "a")
    go(ws, "b")
    wait_for(lambda: listed(ws)["p/b"]["status"] == "completed", timeout=60, what="b")
    wait_for(lambda: not keepers(ws), what="the keeper to exit")


def test_the_keeper_is_started_again_when_it_was_killed(ws: Workspace) -> None:
    one_detached_waits(ws)
    (keeper,) = keepers(ws)
    os.kill(keeper, signal.SIGKILL)
    wait_for(lambda: not keepers(ws), what="the keeper gone")
    go(ws, "b")
    go(ws, "a")  # a's loop ends: its supervisor sees a detached task waiting, with no keeper
    wait_for(lambda: listed(ws)["p/b"]["status"] == "completed", timeout=60, what="b")
    wait_for(lambda: not keepers(ws), what="the keeper to exit")


def test_a_start_whose_keeper_was_killed_midway_is_put_back_and_started_once(
    ws: Workspace,
) -> None:
    """The keeper takes c off the queue to start it and is killed (SIGKILL) before c's loop
    begins: c is not lost. `serve` sees that starts wait without a keeper and starts one, which
    puts c back in its place once its start has had START_WAIT to begin, and starts it."""
    import psutil

    from tests.conftest import serving

    configure(ws, {"max_running": 1})
    door = service(ws)
    for task in ("a", "b", "c"):
        door.start(StartRequest(ws.task("p", task), "go"))
    go(ws, "a")
    wait_for(lambda: running(ws, "b"), timeout=60, what="b running")
    holder = live_holder(ws.task("p", "b").lock)
    assert holder is not None
    forks = psutil.Process(psutil.Process(holder.pid).ppid())  # b was forked: the server is up
    assert "runagent.executors.forkserver" in forks.cmdline()
    keeper = forks.ppid()  # (a second keeper started as c was queued may still be leaving)
    assert keeper in keepers(ws)
    forks.suspend()  # the keeper's start of c waits for its answer...
    fleet = Fleet(ws.root)
    go(ws, "b")
    wait_for(lambda: fleet.record_of(ws.task("p", "c")) is None, timeout=60,
             what="c taken off the queue to start")  # fmt: skip
    os.kill(keeper, signal.SIGKILL)  # ...and the keeper dies before c's loop begins
    wait_for(lambda: not keepers(ws), what="the keeper gone")
    forks.resume()  # its late child is never told to go
    wait_for(lambda: not forks.is_running(), timeout=60, what="the fork server to leave")
    assert not running(ws, "c") and not ws.runs("p", "c")
    with serving(ws):
        wait_for(lambda: running(ws, "c"), timeout=90, what="c started again")
        go(ws, "c")
        wait_for(lambda: listed(ws)["p/c"]["status"] == "completed", timeout=60, what="c")
    assert len(ws.runs("p", "c")) == 1
    said = (fleet.folder / "keeper.log").read_text()
    assert (f"p/c is back in its place in the queue: the keeper that was starting it "
            f"(pid {keeper})") in said  # fmt: skip
    assert not list(fleet.starting.iterdir())
    wait_for(lambda: not keepers(ws), what="the keeper to exit")


def dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def claim_of(ws: Workspace, task: str, at: float, mode: int = 0o600) -> Path:
    """A claim on a start of p/TASK as a keeper killed `at` would have left it."""
    record = Waiting("p", task, "fake", 7, start={"argv": ["job", "-p", "p", "-t", task, "x"],
                                                  "cwd": str(ws.path), "env": {}})  # fmt: skip
    fleet = Fleet(ws.root)
    with fleet.locked():
        fleet.starting.mkdir(mode=0o700, exist_ok=True)
    path = fleet.starting / f"p@{task}.json"
    path.write_text(json.dumps({"record": record.to_json(), "pid": dead_pid(), "started": 1.0,
                                "at": at, "ticket": "t"}))  # fmt: skip
    path.chmod(mode)
    return path


def test_a_claim_is_put_back_only_once_its_start_had_time_to_begin_and_never_if_not_ours(
    ws: Workspace,
) -> None:
    import time

    from runagent.executors.keeper import Seen, _recover
    from runagent.executors.local import START_WAIT

    fleet = Fleet(ws.root)
    foreign = claim_of(ws, "foreign", time.time() - START_WAIT - 1, mode=0o666)
    (fleet.starting / "p@dir.json").mkdir()  # not a file: passed over
    (fleet.starting / "p@junk.json").write_text("{")
    with fleet.locked():
        assert not fleet.detached_waits()  # a claim that cannot be trusted summons no keeper
    fresh = claim_of(ws, "fresh", time.time())
    old = claim_of(ws, "old", time.time() - START_WAIT - 1)
    ran = claim_of(ws, "ran", time.time() - START_WAIT - 1)
    ws.task("p", "ran").runs.mkdir(parents=True)  # run by hand since: a run folder made
    with fleet.locked():
        assert fleet.detached_waits()  # claims of a keeper that is gone: a keeper must look
        assert _recover(fleet, Seen())  # `fresh` may yet begin: waited for
        assert fleet.record_of(ws.task("p", "old")) is not None  # put back, in its place
        assert fleet.record_of(ws.task("p", "old")).seq == 7  # type: ignore[union-attr]
        assert fleet.record_of(ws.task("p", "foreign")) is None  # never trusted
        assert fleet.record_of(ws.task("p", "fresh")) is None
        assert fleet.record_of(ws.task("p", "ran")) is None and not ran.exists()
    said = (ws.task("p", "ran").folder / "supervisor.log").read_text()
    assert "it is not put back in the queue: it ran since" in said
    assert fresh.exists() and not old.exists() and not foreign.exists()
    assert (fleet.starting / "p@dir.json").is_dir() and not (
        fleet.starting / "p@junk.json"
    ).exists()


def test_a_slow_start_keeps_its_claim_while_its_process_lives_and_is_dropped_after(
    ws: Workspace,
) -> None:
    """A loop the keeper started that has not taken its lock after START_WAIT keeps the claim
    (it may yet begin, and takes it off then); once its process ends without, the claim goes
    and the task's log says the queue could not start it (never put back: it would fail again)."""
    from runagent.executors.keeper import Seen, _recover

    fleet = Fleet(ws.root)
    ws.task("p", "slow").folder.mkdir(parents=True)  # made as its start began
    record = Waiting("p", "slow", "fake", 3, start={"argv": ["job"], "cwd": "/", "env": {}})
    with fleet.locked():
        fleet.claim(record)  # this process is the keeper
        fleet.hold(ws.task("p", "slow"), "fake")  # the slot it took for the start
    seen = Seen()
    child = subprocess.Popen(["sleep", "60"])
    seen.slow["p/slow"] = (child, None)
    try:
        with fleet.locked():
            assert _recover(fleet, seen)
            assert fleet.slot_of(ws.task("p", "slow")) is not None
    finally:
        child.kill()
        child.wait()
    with fleet.locked():
        assert not _recover(fleet, seen)
        assert fleet.record_of(ws.task("p", "slow")) is None
        assert fleet.slot_of(ws.task("p", "slow")) is None  # freed: the queue goes on
    assert not list(fleet.starting.iterdir()) and not seen.slow
    said = (ws.task("p", "slow").folder / "supervisor.log").read_text()
    assert "the queue could not start task p/slow: its loop ended before it began" in said


def test_a_loop_the_keeper_started_runs_only_while_its_claim_is_there(ws: Workspace) -> None:
    """Its claim taken off by a `stop`, or put back by a keeper that judged the start lost and
    claimed afresh, a loop that begins late does not run beside what replaced it."""
    import time

    from runagent.errors import StoppedError
    from runagent.fleet import gate

    fleet = Fleet(ws.root)
    claim_of(ws, "a", time.time())
    gate.take_over(ws.task("p", "a"), "t")  # its own claim: off
    assert not list(fleet.starting.iterdir())
    with pytest.raises(StoppedError, match="this start was taken back as it began"):
        gate.take_over(ws.task("p", "a"), "t")  # gone: never twice
    claim_of(ws, "a", time.time())
    with fleet.locked():  # claimed afresh by another keeper: another ticket
        record = Fleet(ws.root).drop_claim(ws.task("p", "a"))
        assert record is not None
        fleet.claim(record)
    with pytest.raises(StoppedError):
        gate.take_over(ws.task("p", "a"), "t")
    ws.task("p", "b").folder.mkdir(parents=True)
    claim_of(ws, "b", time.time())
    taken = gate.dequeue(ws.task("p", "b"))  # `stop` of a task the keeper is starting
    assert taken is not None and taken.label == "p/b"
    assert not (fleet.starting / "p@b.json").exists()
    with pytest.raises(StoppedError):
        gate.take_over(ws.task("p", "b"), "t")
    # A stale claim (its keeper gone) of a task that runs: `stop` is not told it left the
    # queue, and goes on to stop the loop.
    from runagent.store.lock import TaskLock

    claim_of(ws, "b", time.time())
    lock = TaskLock(ws.task("p", "b").lock, "p/b")
    lock.acquire()
    try:
        assert gate.dequeue(ws.task("p", "b")) is None
    finally:
        lock.release()
    # `stop --all` takes back the starts keepers are making as it takes records out.
    ws.task("p", "c").folder.mkdir(parents=True)
    claim_of(ws, "c", time.time())
    everything = service(ws).stop_everything(5)
    assert everything.left_queue == ("p/c",) and not (fleet.starting / "p@c.json").exists()


def test_a_start_taken_back_before_its_turn_in_the_batch_is_not_made(ws: Workspace) -> None:
    from runagent.executors.keeper import _start

    fleet = Fleet(ws.root)
    record = Waiting("p", "x", "fake", 1, start={"argv": ["job", "-p", "p", "-t", "x", "go"],
                                                 "cwd": str(ws.path), "env": {}})  # fmt: skip
    with fleet.locked():
        ticket = fleet.claim(record)
        fleet.hold(ws.task("p", "x"), "fake")
        fleet.drop_claim(ws.task("p", "x"))  # `stop` meanwhile
    _start(fleet, record, None, ticket)
    assert fleet.slot_of(ws.task("p", "x")) is None and not ws.task("p", "x").folder.exists()


def test_the_keepers_ticket_is_never_handed_on(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runagent.loop.context import START_TICKET

    monkeypatch.setenv(START_TICKET, "t")
    assert START_TICKET not in service(ws).started_env(None)


@pytest.mark.parametrize("damage", ["another command", "writable by others"])
def test_the_keeper_starts_no_record_it_cannot_trust(ws: Workspace, damage: str) -> None:
    one_detached_waits(ws)
    fleet = Fleet(ws.root)
    path = fleet.record_path("p", "b")
    if damage == "another command":
        record = json.loads(path.read_text())
        record["start"]["argv"] = ["serve", "--host", "0.0.0.0"]
        path.write_text(json.dumps(record))
    else:
        path.chmod(0o666)
    go(ws, "a")
    wait_for(lambda: listed(ws)["p/a"]["status"] == "completed", timeout=60, what="a")
    wait_for(lambda: not keepers(ws), what="the keeper to exit")
    assert not path.exists() and not ws.runs("p", "b")  # dropped, never started
    assert "dropped the queue record of p/b" in (fleet.folder / "keeper.log").read_text()


def test_a_loop_on_the_ray_cluster_that_runs_after_others_waits_here_blocked_for_the_cluster(
    ws: Workspace,
) -> None:
    """A start on the cluster with --after waits as `blocked` in this root's queue, not in
    Ray's, which cannot wait for other tasks; its record hands it to the cluster when its turn
    comes (the command line says `--executor ray`), and limits: on this machine do not count it
    (the cluster's agent_slot does). No cluster is asked while it waits (its address here is
    one nothing listens on). tests/e2e/test_cluster.py runs the hand-over on a real cluster."""
    from runagent.config.settings import ExecutorSettings, ExecutorType

    configure(ws, {"max_running": 1})
    door = service(ws)
    door.start(StartRequest(ws.task("p", "a"), "go"))
    ray = replace(door, executor=ExecutorSettings(type=ExecutorType.RAY, address="127.0.0.1:1"),
                  env={**os.environ, "DEPLOY_TOKEN": SECRET})  # fmt: skip
    started = ray.start(StartRequest(ws.task("p", "b"), "go", after=("p/a",)))
    assert started.pid == 0 and started.queued is not None and started.queued.blocked
    record = Fleet(ws.root).record_of(ws.task("p", "b"))
    assert record is not None and record.start is not None and record.after == ("p/a",)
    assert record.start["argv"][:5] == ["run", "--project", "p", "--task", "b"]
    assert record.start["argv"][-3:] == ["--detach", "--executor", "ray"]
    # The root is the cluster's too: its secret is kept by name (the loop on a host takes its
    # credentials from that host's `ray start`; none travels with the start).
    assert "DEPLOY_TOKEN" in record.start["withheld"] and SECRET not in fleet_text(ws)
    assert record.limit_settings() == LimitsSettings()  # the cluster's own cap holds it
    assert listed(ws)["p/b"]["status"] == "blocked"
    stopped = ws.cli("stop", "-p", "p", "-t", "b")
    assert stopped.returncode == 0 and "left the queue" in stopped.stdout, stopped.stderr
    go(ws, "a")
    wait_for(lambda: listed(ws)["p/a"]["status"] == "completed", timeout=60, what="a")


# Secrets: a queued start keeps the names of its secret variables, never their values.

SECRET = "s3cret-value-never-on-disk"


def fleet_text(ws: Workspace) -> str:
    """Every byte under the root's .fleet/, as text."""
    folder = Fleet(ws.root).folder
    return "".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())


def test_a_queued_start_keeps_the_names_of_its_secrets_and_takes_their_values_when_it_starts(
    ws_outside: Workspace, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    ws = ws_outside
    configure(ws, {"max_running": 1},
              [*HOLD, "--echo-env", "DEPLOY_TOKEN", "UPSTREAM", "PLAIN"])  # fmt: skip
    upstream = f"https://deploy:{SECRET}@127.0.0.1:9/x"
    monkeypatch.setenv("DEPLOY_TOKEN", SECRET)  # the keeper's environment: this process's
    monkeypatch.setenv("UPSTREAM", upstream)
    monkeypatch.setenv("PLAIN", "a plain value")
    door = service(ws)
    door.start(StartRequest(ws.task("p", "a"), "go"))
    assert door.start(StartRequest(ws.task("p", "b"), "go")).queued is not None
    record = json.loads(Fleet(ws.root).record_path("p", "b").read_text())
    assert SECRET not in fleet_text(ws)
    assert {"DEPLOY_TOKEN", "UPSTREAM"} <= set(record["start"]["withheld"])
    assert record["start"]["env"]["PLAIN"] == "a plain value"  # what is no secret stays
    go(ws, "a")
    go(ws, "b")
    wait_for(lambda: listed(ws)["p/b"]["status"] == "completed", timeout=60, what="b")
    said = ws.task("p", "b").run(only_run(ws, "b").run_id).stdout.read_text()
    assert f"DEPLOY_TOKEN={SECRET}\n" in said and f"UPSTREAM={upstream}\n" in said
    assert "PLAIN=a plain value\n" in said
    wait_for(lambda: not keepers(ws), what="the keeper to exit")


def test_a_queued_start_whose_secret_the_keeper_lacks_is_blocked_naming_it(
    ws_outside: Workspace, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Two starters with different environments: the keeper, started by the first, lacks the
    second's secret; that start is blocked, saying which, never started without it."""
    ws = ws_outside
    configure(ws, {"max_running": 1}, [*HOLD, "--echo-env", "DEPLOY_TOKEN"])
    monkeypatch.delenv("DEPLOY_TOKEN", raising=False)
    plain = replace(service(ws), env=dict(os.environ))
    with_secret = replace(service(ws), env={**os.environ, "DEPLOY_TOKEN": SECRET})
    plain.start(StartRequest(ws.task("p", "a"), "go"))
    assert plain.start(StartRequest(ws.task("p", "c"), "go")).queued is not None  # the keeper
    assert with_secret.start(StartRequest(ws.task("p", "b"), "go")).queued is not None
    assert SECRET not in fleet_text(ws)
    wait_for(lambda: listed(ws)["p/b"]["status"] == "blocked", what="b blocked")
    waits = listed(ws)["p/b"]["queue"]["waits_for"]
    assert "DEPLOY_TOKEN" in waits and "\n" not in waits, waits
    status = ws.cli("status", "-p", "p", "-t", "b")
    assert "blocked" in status.stdout and "DEPLOY_TOKEN" in status.stdout, status.stdout
    fleet = ws.cli("fleet")
    assert "1 blocked" in fleet.stdout and "DEPLOY_TOKEN" in fleet.stdout, fleet.stdout
    assert "DEPLOY_TOKEN" in (Fleet(ws.root).folder / "keeper.log").read_text()
    go(ws, "a")
    go(ws, "c")
    wait_for(lambda: listed(ws)["p/c"]["status"] == "completed", timeout=60, what="c")
    wait_for(lambda: not keepers(ws), what="the keeper to exit: nothing it can start is left")
    assert not ws.runs("p", "b")  # never started without it
    # Resumed from an environment that sets it, the task starts.
    go(ws, "b")
    resumed = ws.cli("resume", "-p", "p", "-t", "b", env={"DEPLOY_TOKEN": SECRET})
    assert resumed.returncode == 0, resumed.stderr
    said = ws.task("p", "b").run(only_run(ws, "b").run_id).stdout.read_text()
    assert f"DEPLOY_TOKEN={SECRET}\n" in said
    assert SECRET not in fleet_text(ws)


# A damaged queue record: shown as `unreadable` with its reason, said once in keeper.log, never
# dropped, until a person resumes, stops or deletes the task.

RECORD_CAP = 4 * 1024 * 1024


def _retyped(text: str) -> str:
    record = json.loads(text)
    record["seq"] = "first"
    return json.dumps(record)


def _huge(text: str) -> str:
    record = json.loads(text)
    record["pad"] = "x" * (RECORD_CAP + 1)  # still a record in every other way
    return json.dumps(record)


DAMAGES = {
    "truncated JSON": (lambda text: text[: len(text) // 2], "not JSON"),
    "not an object": (lambda text: "[1, 2, 3]", "not a JSON object"),
    "wrong types": (_retyped, "seq 'first' is not a whole number"),
    "deep nesting": (lambda text: "[" * 200_000 + "]" * 200_000, "nests too deeply"),
    "huge": (_huge, "over 4 MiB"),
    "not UTF-8": (lambda text: "\udcff" + text, "not UTF-8"),
}


def damage(ws: Workspace, task: str, kind: str) -> bytes:
    """Damage p/TASK's queue record as `kind` says; the bytes it holds now."""
    path = Fleet(ws.root).record_path("p", task)
    spoil, _ = DAMAGES[kind]
    data = spoil(path.read_text(encoding="utf-8")).encode("utf-8", "surrogateescape")
    spoilt = path.with_name(".spoilt")  # whole at once: the keeper reads it as it is left
    spoilt.write_bytes(data)
    spoilt.replace(path)
    return data


def keeper_log(ws: Workspace) -> str:
    log = Fleet(ws.root).folder / "keeper.log"
    return log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""


@pytest.mark.parametrize("kind", list(DAMAGES))
def test_a_damaged_queue_record_shows_as_unreadable_and_is_never_dropped(
    ws: Workspace, kind: str
) -> None:
    one_detached_waits(ws)
    data = damage(ws, "b", kind)
    _, why = DAMAGES[kind]
    path = Fleet(ws.root).record_path("p", "b")
    said = wait_for(lambda: [line for line in keeper_log(ws).splitlines() if "p/b" in line],
                    what="the keeper to say so")  # fmt: skip
    assert why in said[0] and "unreadable" in said[0] and "resume" in said[0], said
    row = listed(ws)["p/b"]
    assert row["status"] == "unreadable" and why in row["queue"]["unreadable"], row
    status = ws.cli("status", "-p", "p", "-t", "b")
    assert status.returncode == 0 and "p/b: unreadable (0 runs)" in status.stdout, status
    assert why in status.stdout and "Traceback" not in status.stderr
    fleet = ws.cli("fleet")
    assert fleet.returncode == 0 and "1 unreadable" in fleet.stdout, fleet
    assert f"p/b  its queue record cannot be read: {why}" in fleet.stdout
    assert json.loads(ws.cli("fleet", "--json").stdout)["counts"]["unreadable"] == 1
    go(ws, "a")
    wait_for(lambda: listed(ws)["p/a"]["status"] == "completed", timeout=60, what="a")
    wait_for(lambda: not keepers(ws), what="the keeper to exit")
    assert path.read_bytes() == data and not ws.runs("p", "b")  # kept as it was, never run
    assert listed(ws)["p/b"]["status"] == "unreadable"
    assert len([line for line in keeper_log(ws).splitlines() if "p/b" in line]) == 1


def test_a_person_resumes_stops_or_deletes_a_task_whose_queue_record_is_unreadable(
    ws: Workspace,
) -> None:
    from starlette.testclient import TestClient

    from server.app import create_app
    from server.settings import Settings
    from tests.conftest import LOCAL

    configure(ws, {"max_running": 1})
    door = service(ws)
    for task in "abcd":
        door.start(StartRequest(ws.task("p", task), "go"))
    for task in "bcd":
        damage(ws, task, "truncated JSON")
    app = create_app(Settings(root=ws.root, config_path=ws.config, workdir=ws.path,
                              backend_names=backends.known()))  # fmt: skip
    with TestClient(app, base_url=LOCAL) as c:  # the page reads these fields
        fleet = c.get("/api/fleet").json()
        assert fleet["counts"]["unreadable"] == 3 and fleet["counts"]["queued"] == 0
        row = next(row for row in fleet["queue"] if row["task_id"] == "b")
        assert row["status"] == "unreadable" and "not JSON" in row["queue"]["unreadable"]
        task = c.get("/api/projects/p/tasks/b").json()
        assert task["status"] == "unreadable" and "not JSON" in task["queue"]["waits_for"]
    stopped = ws.cli("stop", "-p", "p", "-t", "c")
    assert stopped.returncode == 0 and "left the queue" in stopped.stdout, stopped
    assert "could not be read" in stopped.stdout
    assert not Fleet(ws.root).record_path("p", "c").exists()
    assert listed(ws)["p/c"]["status"] == "stopped"  # it left the queue before it ever ran
    assert ws.cli("delete", "-p", "p", "-t", "d", "--yes").returncode == 0
    assert not Fleet(ws.root).record_path("p", "d").exists() and "p/d" not in listed(ws)
    go(ws, "a")
    wait_for(lambda: listed(ws)["p/a"]["status"] == "completed", timeout=60, what="a")
    wait_for(lambda: not keepers(ws), what="the keeper to exit")
    assert listed(ws)["p/b"]["status"] == "unreadable" and not ws.runs("p", "b")
    go(ws, "b")
    resumed = ws.cli("resume", "-p", "p", "-t", "b")
    assert resumed.returncode == 0, resumed.stderr
    assert listed(ws)["p/b"]["status"] == "completed"
    assert not Fleet(ws.root).record_path("p", "b").exists()


def test_a_foreground_run_whose_queue_record_is_damaged_ends_saying_so(ws: Workspace) -> None:
    first, second = one_runs_one_waits(ws)
    damage(ws, "b", "not an object")
    assert second.wait(60) == 1
    said = second.stderr.read() if second.stderr else ""
    assert "its queue record cannot be read: not a JSON object" in said, said
    assert "Traceback" not in said
    assert listed(ws)["p/b"]["status"] == "unreadable"
    go(ws, "a")
    assert first.wait(60) == 0
    assert listed(ws)["p/b"]["status"] == "unreadable" and not ws.runs("p", "b")


def test_listings_show_the_queue_in_its_order_with_how_many_are_ahead(ws: Workspace) -> None:
    """`list`, `status` and `watch` show a queued task with how many start before it and what it
    waits for, the queue in the order it starts (not by name: q10 was submitted first), and
    the other tasks by name as a person counts (t2 before t10)."""
    from runagent.cli.options import setup
    from runagent.cli.watch import screen

    configure(ws, {"max_running": 1}, ["--exit", "0"])
    for name in ("t10", "t2"):
        assert ws.cli("job", "-p", "p", "-t", name, "go").returncode == 0
    configure(ws, {"max_running": 1})
    door = service(ws)
    door.start(StartRequest(ws.task("p", "a"), "go"))
    wait_for(lambda: running(ws, "a"), what="a running")
    for name in ("q10", "q2", "q1"):
        door.start(StartRequest(ws.task("p", name), "go"))
    try:
        shown = ws.cli("list")
        assert shown.returncode == 0, shown.stderr
        rows = [line.split(None, 2) for line in shown.stdout.splitlines()[1:] if line.strip()]
        names = [row[1] for row in rows if row[0] == "p"]
        assert names == ["a", "t2", "t10", "q10", "q2", "q1"], shown.stdout
        by_name = {row[1]: row[2] for row in rows if row[0] == "p"}
        assert by_name["q10"].startswith("queued: 0 ahead (max_running 1)")
        assert by_name["q1"].startswith("queued: 2 ahead (max_running 1)")
        in_json = [r["task_id"] for r in json.loads(ws.cli("list", "--json").stdout)]
        assert in_json == names
        status = ws.cli("status", "-p", "p", "-t", "q2")
        assert "1 ahead (max_running 1)" in status.stdout, status.stdout
        frame = screen(setup(ws.config, ws.root), "p")
        assert [line.split()[0] for line in frame[1:]] == [f"p/{n}" for n in names]
        assert "queued: 1 ahead (max_running 1)" in frame[5]
    finally:
        for name in ("a", "q10", "q2", "q1"):
            go(ws, name)
        wait_for(lambda: all(listed(ws)[f"p/{t}"]["status"] == "completed"
                             for t in ("a", "q10", "q2", "q1")), timeout=90,
                 what="the queue to empty")  # fmt: skip
        wait_for(lambda: not keepers(ws), what="the keeper to exit")


def test_a_task_that_runs_after_one_stopped_in_the_queue_is_blocked(ws: Workspace) -> None:
    """p/b never ran: it was taken out of the queue. p/c, which runs after it, is blocked for
    it ("which was stopped"), not left waiting for a task that will never start."""
    configure(ws, {"max_running": 1})
    door = service(ws)
    door.start(StartRequest(ws.task("p", "a"), "go"))
    wait_for(lambda: running(ws, "a"), what="a running")
    door.start(StartRequest(ws.task("p", "b"), "go"))
    door.start(StartRequest(ws.task("p", "c"), "go", after=("p/b",)))
    try:
        assert isinstance(door.stop(ws.task("p", "b"), 5), Waiting)
        row = listed(ws)["p/c"]
        assert row["status"] == "blocked" and "which was stopped" in row["queue"]["waits_for"], row
    finally:
        go(ws, "a")
        wait_for(lambda: listed(ws)["p/a"]["status"] == "completed", what="a to complete")
        door.stop(ws.task("p", "c"), 5)
        wait_for(lambda: not keepers(ws), what="the keeper to exit")


def test_serves_look_for_a_missing_keeper_makes_nothing_where_nothing_waits(
    tmp_path: Path,
) -> None:
    # `serve` looks every 5 s; on a root whose queue is empty the look took the fleet's lock and
    # opened the queue's index, making `.fleet/lock` and `.fleet/queue.db` under a reader's feet
    # (a test that compares the root before and after a refused request met them in CI).
    from runagent.fleet import gate

    root = tmp_path / "runs"
    fleet = Fleet(root)
    fleet.folder.mkdir(parents=True)
    (fleet.queue).mkdir()  # emptied: every start it held has gone
    assert gate.keeper_wanted(root) is False
    made = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    assert made == [".fleet", ".fleet/queue"]
