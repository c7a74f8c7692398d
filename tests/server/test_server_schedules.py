"""`run-agent serve` fires the schedules, lists them, and runs one on request."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import yaml
from starlette.testclient import TestClient

from runagent.config.file import load_config
from runagent.schedule import seconds_to_next_minute
from server.app import Settings, create_app
from tests.conftest import LOCAL, Workspace, wait_for


def config_with_schedule(ws: Workspace, cron: str = "* * * * *", **extra: object) -> None:
    config = {
        "agents": {"fake": {"type": "command", "command": ws.agent_argv(["--lines", "1"])}},
        "defaults": {"agent": "fake"},
        "storage": {"runs_dir": str(ws.root)},
        "schedules": {"tick": {"cron": cron, "project": "p", "prompt": "scheduled", **extra}},
    }
    ws.config.write_text(yaml.safe_dump(config))


def app_for(ws: Workspace, **settings: object) -> TestClient:
    """The server as `run-agent serve` wires it: firings go through the one door, with the
    backends' agent check, to detached supervisors."""
    import backends
    from runagent.cli.options import usable_backend

    config = load_config(ws.config, ["command"], ws.path)
    return TestClient(
        create_app(
            Settings(root=ws.root, config_path=ws.config, schedules=config.schedules,
                     workdir=ws.path, check_agent=usable_backend, backend_names=backends.known(),
                     **settings)  # type: ignore[arg-type]
        ),
        base_url=LOCAL,
    )  # fmt: skip


class ShortOfAMinute:
    """A clock that reads `short` seconds before a minute boundary at its first look (the
    scheduler's start, however long a loaded machine makes the server take to get there), and
    runs on from there: the schedule is due that many seconds after the scheduler started."""

    def __init__(self, short: float) -> None:
        self.short = short
        self.offset: timedelta | None = None

    def __call__(self) -> datetime:
        real = datetime.now(UTC)
        if self.offset is None:
            self.offset = timedelta(seconds=seconds_to_next_minute(real) - self.short)
        return real + self.offset


def test_the_server_fires_a_due_schedule_in_the_background(ws: Workspace) -> None:
    config_with_schedule(ws)
    with app_for(ws, clock=ShortOfAMinute(1.0)) as client:
        wait_for(lambda: client.get("/api/schedules").json()[0]["last_task"],
                 what="the schedule to fire")  # fmt: skip
        (row,) = client.get("/api/schedules").json()
        assert row["scheduler"] == "running" and row["last_task"].startswith("tick-")
        wait_for(lambda: ws.task("p", row["last_task"]).done.exists(), what="its run to finish")
        wait_for(lambda: client.get("/api/schedules").json()[0]["last_outcome"] == "completed",
                 what="the outcome to be recorded")  # fmt: skip


def test_run_now_from_the_api_and_overlap_refusal(ws: Workspace) -> None:
    config_with_schedule(ws, "@daily", task="fixed")
    config = yaml.safe_load(ws.config.read_text())
    config["agents"]["fake"]["command"] = ws.agent_argv(["--sleep", "60"])
    ws.config.write_text(yaml.safe_dump(config))
    with app_for(ws, run_schedules=False) as client:
        (row,) = client.get("/api/schedules").json()
        assert row["scheduler"] == "off" and len(row["next"]) == 3
        fired = client.post("/api/schedules/tick/run", json={})
        assert fired.status_code == 202, fired.text
        assert fired.json() == {"schedule": "tick", "project_id": "p", "task_id": "fixed"}
        again = client.post("/api/schedules/tick/run", json={})
        assert again.status_code == 409 and "still running" in again.json()["error"]
        assert client.post("/api/schedules/nope/run", json={}).status_code == 404
        assert client.post("/api/projects/p/tasks/fixed/stop", json={}).status_code == 200


def test_no_schedules_keeps_the_scheduler_off(ws: Workspace) -> None:
    config_with_schedule(ws)
    real = datetime.now(UTC)
    offset = timedelta(seconds=seconds_to_next_minute(real) - 0.5)
    with app_for(ws, run_schedules=False, clock=lambda: datetime.now(UTC) + offset) as client:
        import time

        time.sleep(1.5)  # past the due minute: an active scheduler would have fired by now
        assert client.get("/api/schedules").json()[0]["scheduler"] == "off"
    assert not (ws.root / "p").exists()  # nothing was fired
