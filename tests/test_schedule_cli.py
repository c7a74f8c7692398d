"""Schedules from the command line and the system crontab, and notifications to a webhook."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import yaml

from runagent.loop.notify import SIGNATURE_HEADER, signature
from tests.conftest import FAKE_AGENT, Workspace, wait_for

SECRET = "webhook-secret-for-tests"


def write_config(ws: Workspace, agent: list[str] | None, **schedule: Any) -> None:
    agents = {"fake": {"type": "command", "command": ws.agent_argv(agent or [])}}
    config = {
        "agents": agents,
        "defaults": {"agent": "fake", "restart_delay": "50ms", "kill_grace": "1s"},
        "storage": {"runs_dir": str(ws.root)},
        "schedules": {"nightly": {"cron": "0 2 * * *", "project": "p", "prompt": "tidy up",
                                  **schedule}},
    }  # fmt: skip
    ws.config.write_text(yaml.safe_dump(config))


def crontab_command(ws: Workspace, name: str = "nightly") -> str:
    """The command part of the crontab line `schedule crontab` prints for a schedule."""
    proc = ws.cli("schedule", "crontab")
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if f"schedule now {name} " in ln]
    fields = line.split(None, 5)
    assert " ".join(fields[:5]) == "0 2 * * *"
    assert "--config " + str(ws.config) in line and "--root " + str(ws.root) in line
    return fields[5]


def as_cron(ws: Workspace, command: str) -> subprocess.CompletedProcess[str]:
    """Run a crontab command as cron does: sh, no TTY, PATH=/usr/bin:/bin, almost no env."""
    return subprocess.run(
        ["/bin/sh", "-c", command],
        env={"PATH": "/usr/bin:/bin", "HOME": str(ws.path), "SHELL": "/bin/sh"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        start_new_session=True,
        timeout=60,
    )


def test_a_crontab_line_runs_with_crons_minimal_environment(ws: Workspace) -> None:
    write_config(ws, ["--lines", "1"])
    proc = as_cron(ws, crontab_command(ws))
    assert proc.returncode == 0, proc.stderr
    log = (ws.root / "schedule.log").read_text()
    assert "nightly: fired" in log
    task_id = log.strip().splitlines()[-1].split("/", 1)[1]
    assert task_id.startswith("nightly-")
    wait_for(lambda: ws.task("p", task_id).done.exists(), what="the fired task to complete")
    assert ws.runs("p", task_id)[-1].status == "completed"


def test_from_cron_a_missing_agent_binary_is_one_line(ws: Workspace) -> None:
    write_config(ws, None)
    config = yaml.safe_load(ws.config.read_text())
    config["agents"]["fake"]["command"] = ["agent-cli-not-on-path"]
    ws.config.write_text(yaml.safe_dump(config))
    proc = as_cron(ws, crontab_command(ws))
    assert proc.returncode == 3
    (line,) = (ws.root / "schedule.log").read_text().strip().splitlines()
    assert line == (
        "run-agent: schedule nightly: 'agent-cli-not-on-path' not found on PATH; "
        "install it, or set agents.fake.command"
    )


def test_overlapping_firings_of_one_task_never_run_two_supervisors(ws: Workspace) -> None:
    write_config(ws, ["--sleep", "60"], task="fixed-task")
    command = crontab_command(ws)
    first = as_cron(ws, command)
    assert first.returncode == 0, first.stderr
    wait_for(lambda: ws.agent_pids(), what="the first firing's agent")
    second = as_cron(ws, command)
    assert second.returncode == 75
    last = (ws.root / "schedule.log").read_text().strip().splitlines()[-1]
    assert "previous firing p/fixed-task is still running" in last
    stopped = ws.cli("stop", "--project", "p", "--task", "fixed-task")
    assert stopped.returncode == 0, stopped.stderr


def test_schedule_list_shows_next_firings_and_the_last_outcome(ws: Workspace) -> None:
    write_config(ws, [], timezone="Europe/Berlin")
    assert ws.cli("schedule", "now", "nightly").returncode == 0
    wait_for(
        lambda: any(ws.task("p", t).done.exists() for t in _tasks(ws)),
        what="the firing to complete",
    )
    rows = json.loads(ws.cli("schedule", "list", "--json").stdout)
    (row,) = rows
    assert row["name"] == "nightly" and len(row["next"]) == 3
    assert all(t.endswith(("+01:00", "+02:00")) and "T02:00:00" in t for t in row["next"])
    assert row["last_task"].startswith("nightly-")
    text = ws.cli("schedule", "list").stdout
    assert "nightly: '0 2 * * *' Europe/Berlin, overlap skip" in text


def _tasks(ws: Workspace) -> list[str]:
    project = ws.root / "p"
    return [p.name for p in project.iterdir() if p.is_dir()] if project.exists() else []


class Hooks:
    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.fail_first = 0


@pytest.fixture
def webhook() -> Iterator[tuple[str, Hooks]]:
    hooks = Hooks()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if hooks.fail_first > 0:  # a flaky receiver: run-agent retries
                hooks.fail_first -= 1
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            hooks.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(204)
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", hooks
    finally:
        server.shutdown()
        server.server_close()


def test_a_signed_webhook_reports_a_failed_run_and_the_completion(
    ws: Workspace, webhook: tuple[str, Hooks]
) -> None:
    url, hooks = webhook
    hooks.fail_first = 1
    config = {
        "agents": {"fake": {"type": "command", "command": ws.agent_argv(["--fail-first", "1"])}},
        "defaults": {"agent": "fake", "restart_delay": "50ms"},
        "storage": {"runs_dir": str(ws.root)},
        "notify": {"webhook": url, "secret_env": "HOOK_SECRET"},
    }
    ws.config.write_text(yaml.safe_dump(config))
    proc = ws.cli("--project", "p", "--task", "t", "x", env={"HOOK_SECRET": SECRET})
    assert proc.returncode == 0, proc.stderr
    wait_for(lambda: len(hooks.received) == 2, what="two notifications")
    events = []
    for headers, body in hooks.received:
        assert headers[SIGNATURE_HEADER.lower()] == signature(SECRET, body)
        events.append(json.loads(body))
    assert sorted(e["event"] for e in events) == ["completed", "failed"]
    failed = next(e for e in events if e["event"] == "failed")
    assert failed["project_id"] == "p" and failed["run"]["exit_code"] == 1
    assert "retrying" in proc.stderr  # the flaky receiver was retried, not given up on


def test_a_notification_command_gets_the_event_as_json(ws: Workspace) -> None:
    out = ws.path / "notified.jsonl"
    hook = f"cat >> {shlex.quote(str(out))}; echo >> {shlex.quote(str(out))}"
    config = {
        "agents": {"fake": {"type": "command", "command": [sys.executable, str(FAKE_AGENT),
                                                            "--exit", "1"]}},
        "defaults": {"agent": "fake", "max_restarts": 0},
        "storage": {"runs_dir": str(ws.root)},
        "notify": {"command": ["sh", "-c", hook], "on": ["gave_up"]},
    }  # fmt: skip
    ws.config.write_text(yaml.safe_dump(config))
    assert ws.cli("--project", "p", "--task", "t", "x").returncode == 1
    (event,) = [json.loads(line) for line in out.read_text().splitlines() if line]
    assert event["event"] == "gave_up" and event["outcome"] == "failed"


def test_schedule_run_starts_logs_and_stops_cleanly_on_ctrl_c(ws: Workspace) -> None:
    import os
    import signal

    write_config(ws, [])
    proc = ws.start_cli("schedule", "run")
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:  # the first line comes once the scheduler has started
        lines.append(line)
        if "scheduler started" in line:
            break
    assert "scheduler started: nightly" in lines[-1]
    state = ws.root / ".schedules.yaml"
    assert "last_checked" in state.read_text()  # it recorded when it began watching
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "scheduler stopped; runs it started go on" in out


def test_schedule_run_without_schedules_is_one_line(ws: Workspace) -> None:
    proc = ws.cli("schedule", "run")
    assert proc.returncode == 2
    assert "no schedules in the config; add a `schedules:` section" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_schedules_session_is_each_firings_and_a_bad_one_is_named(ws: Workspace) -> None:
    """`session: fresh` in a schedule: each firing's task starts its attempts afresh, as its
    task.yaml remembers; a value that is neither is a config error naming the key."""
    from runagent.store import taskfolder

    write_config(ws, [], session="fresh")
    assert ws.cli("schedule", "now", "nightly").returncode == 0
    wait_for(lambda: any(ws.task("p", t).done.exists() for t in _tasks(ws)), what="the firing")
    (task,) = _tasks(ws)
    assert taskfolder.read_task_settings(ws.task("p", task)).get("session") == "fresh"
    write_config(ws, [], session="sometimes")
    refused = ws.cli("schedule", "list")
    assert refused.returncode == 2 and "schedules.nightly.session" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
