"""One message at a time per operations run, across processes (the run's turn lock), and an
`ops apply` stopped by a signal: what ran is recorded, the rest is not run, exit 130."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil
import pytest
from starlette.testclient import TestClient

from server.app import Settings, create_app
from tests.conftest import LOCAL, Workspace, wait_for


def batch(*operations: Any) -> str:
    return json.dumps({"protocolVersion": "1.0", "operations": list(operations)})


def shell(command: str, **fields: Any) -> dict[str, Any]:
    return {"type": "shell", "command": command, **fields}


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


class Apply:
    """A real `run-agent ops apply FILE --run RUN` process; its output goes to files, so that
    a test can read what it says while it waits."""

    def __init__(self, ws: Workspace, name: str, message: str, *args: str, **popen: Any) -> None:
        self.message = ws.path / f"{name}.json"
        self.message.write_text(message)
        self.out, self.err = ws.path / f"{name}.out", ws.path / f"{name}.err"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.process = subprocess.Popen(
                ws.cli_argv("ops", "apply", str(self.message), *args), cwd=ws.path,
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, **popen,
            )  # fmt: skip

    def wait(self) -> int:
        try:
            return self.process.wait(timeout=60)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()

    @property
    def stderr(self) -> str:
        return self.err.read_text()

    @property
    def reply(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.out.read_text())
        return found


def new_run(ws: Workspace, policy: str = "standard") -> tuple[str, Path]:
    (ws.path / "project").mkdir()
    made = ws.cli("ops", "apply", "-", "-w", "project", "--policy", policy, input=batch())
    assert made.returncode == 0, made.stderr
    run = json.loads(made.stdout)["runId"]
    return run, ws.root / "ops" / "ops" / "runs" / run


def test_two_applies_at_once_are_served_in_turn_and_a_pause_is_never_overwritten(
    ws: Workspace,
) -> None:
    run, folder = new_run(ws)
    project = ws.path / "project"
    (project / "va").mkdir()
    (project / "vb").mkdir()  # `rm -r` of either needs approval under `standard`
    first = Apply(ws, "a", batch(
        shell("touch a-started; while [ ! -e gate ]; do sleep 0.05; done"),
        shell("rm -r va", id="rm-a"),
        shell("echo a-after >> log"),
    ), "--run", run)  # fmt: skip
    try:
        wait_for(lambda: (project / "a-started").exists(), what="the first batch to run")
        second = Apply(ws, "b", batch(shell("rm -r vb", id="rm-b"), shell("echo b >> log")),
                       "--run", run)  # fmt: skip
        try:
            wait_for(lambda: "waiting for its turn" in second.stderr, what="the second to queue")
            assert f"run {run} is answering another message (pid {first.process.pid}" in (
                second.stderr
            )
            (project / "gate").touch()
            assert first.wait() == 0, first.stderr
            assert second.wait() == 2, second.stderr
        finally:
            second.wait()
    finally:
        first.wait()
    assert first.reply["status"] == "awaiting_approval"
    assert first.reply["events"][-1]["operationId"] == "rm-a"
    refusal = second.stderr.strip().splitlines()[-1]
    assert f"run {run} awaits approval of operation 'rm-a'" in refusal
    assert "this message was not applied" in refusal and "Traceback" not in second.stderr
    # The first batch's pause is whole: approving it runs the rest of that batch.
    approved = ws.cli("ops", "approve", run, "rm-a")
    assert approved.returncode == 0, approved.stderr
    assert json.loads(approved.stdout)["status"] == "completed"
    assert not (project / "va").exists() and (project / "vb").is_dir()
    assert (project / "log").read_text() == "a-after\n"
    received = [line.get("message") for line in lines(folder / "operations.jsonl")]
    assert not any("rm -r vb" in json.dumps(m) for m in received)  # the refused one is not kept


def ignore_sigint() -> None:
    """What a shell does for a job started with `&`: SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize(
    "sig, popen",
    [
        (signal.SIGINT, {"start_new_session": True}),
        (signal.SIGINT, {"preexec_fn": ignore_sigint}),  # in the background
        (signal.SIGTERM, {"start_new_session": True}),
    ],
    ids=["SIGINT", "SIGINT-background", "SIGTERM"],
)
def test_a_stopped_apply_records_what_ran_and_exits_130(
    ws: Workspace, sig: signal.Signals, popen: dict[str, Any]
) -> None:
    run, folder = new_run(ws, policy="permissive")
    project = ws.path / "project"
    # A sleep this test can tell from any other, also from its own runs on other xdist workers.
    naps = f"4613.{os.getpid()}"
    applying = Apply(ws, "slow", batch(
        shell("echo one > one.txt", id="one"),
        shell(f"touch started; sleep {naps}", id="slow"),
        shell("echo three > three.txt", id="three"),
    ), "--run", run, **popen)  # fmt: skip
    try:
        wait_for(lambda: (project / "started").exists(), what="the slow operation to start")
        os.kill(applying.process.pid, sig)
        assert applying.wait() == 130, applying.stderr
    finally:
        applying.wait()
    assert (project / "one.txt").exists() and not (project / "three.txt").exists()
    assert f"stopped by {sig.name}" in applying.stderr and "Traceback" not in applying.stderr
    interrupted = lines(folder / "operations.jsonl")[-1]["interrupted"]
    assert interrupted == {
        "signal": sig.name, "answered": [0], "stopped": 1, "operationId": "slow", "notRun": [2],
    }  # fmt: skip
    recorded = lines(folder / "events.jsonl")[-1]
    assert recorded == applying.reply and recorded["status"] == "error"
    assert [e["type"] for e in recorded["events"]] == ["shell", "error"]
    assert recorded["events"][0]["success"] is True
    assert recorded["events"][1]["message"].startswith(f"interrupted by {sig.name}")
    wait_for(lambda: not sleeping(naps), what="the stopped command's tree to be gone")
    # The turn went with the process: the run takes the next message at once.
    after = ws.cli("ops", "apply", "-", "--run", run, input=batch(shell("true")), timeout=30)
    assert after.returncode == 0 and json.loads(after.stdout)["status"] == "completed"


def sleeping(naps: str) -> bool:
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if naps in " ".join(proc.info["cmdline"] or []):
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return False


def test_the_api_and_the_cli_share_the_turn(ws: Workspace) -> None:
    run, _ = new_run(ws, policy="permissive")
    project = ws.path / "project"
    holding = Apply(ws, "hold", batch(
        shell("touch started; while [ ! -e gate ]; do sleep 0.05; done")
    ), "--run", run)  # fmt: skip
    try:
        wait_for(lambda: (project / "started").exists(), what="the CLI's batch to run")
        app = create_app(Settings(root=ws.root, config_path=ws.config, workdir=ws.path))
        with TestClient(app, base_url=LOCAL) as client:
            busy = client.post(f"/api/ops/runs/{run}/messages", json=json.loads(batch()))
            assert busy.status_code == 409, busy.text
            said = busy.json()["error"]
            assert f"is answering another message (pid {holding.process.pid}" in said
            (project / "gate").touch()
            assert holding.wait() == 0, holding.stderr
            free = client.post(f"/api/ops/runs/{run}/messages", json=json.loads(batch()))
            assert free.status_code == 200 and free.json()["status"] == "completed"
    finally:
        holding.wait()


def test_ops_list_shows_each_runs_state(ws: Workspace) -> None:
    done, _ = new_run(ws, policy="permissive")
    project = ws.path / "project"
    (project / "victim").mkdir()
    paused = ws.cli("ops", "apply", "-", "-w", "project", input=batch(
        shell("rm -r victim", id="rm-1"))
    )  # fmt: skip
    awaiting = json.loads(paused.stdout)["runId"]
    busy, _ = new_run_in(ws)
    holding = Apply(ws, "hold", batch(
        shell("touch started; while [ ! -e gate ]; do sleep 0.05; done")
    ), "--run", busy)  # fmt: skip
    try:
        wait_for(lambda: (project / "started").exists(), what="the batch to run")
        listed = ws.cli("ops", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        rows = {r["runId"]: r for r in json.loads(listed.stdout)}
        assert {k: (r["state"], r["pending"] and r["pending"]["operationId"])
                for k, r in rows.items()} == {
            done: ("done", None), awaiting: ("awaiting_approval", "rm-1"), busy: ("running", None),
        }  # fmt: skip
        table = ws.cli("ops", "list").stdout.splitlines()
        assert table[0].split() == [
            "RUN", "PROJECT", "TASK", "STATE", "AWAITING", "POLICY", "WORKSPACE"
        ]  # fmt: skip
        assert any(line.split()[:5] == [awaiting, "ops", "ops", "awaiting_approval", "rm-1"]
                   for line in table)  # fmt: skip
        (project / "gate").touch()
        assert holding.wait() == 0, holding.stderr
    finally:
        holding.wait()
    after = {r["runId"]: r["state"] for r in json.loads(ws.cli("ops", "list", "--json").stdout)}
    assert after[busy] == "done"


def new_run_in(ws: Workspace) -> tuple[str, Path]:
    """Another run on the same workspace folder."""
    made = ws.cli("ops", "apply", "-", "-w", "project", "--policy", "permissive", input=batch())
    run = json.loads(made.stdout)["runId"]
    return run, ws.root / "ops" / "ops" / "runs" / run


def test_ops_list_with_no_runs_says_so(ws: Workspace) -> None:
    empty = ws.invoke("ops", "list")
    assert empty.returncode == 0 and empty.stdout == ""
    assert empty.stderr.startswith("no operations runs")
    assert json.loads(ws.invoke("ops", "list", "--json").stdout) == []


def test_the_task_of_operations_runs_says_what_they_do(ws: Workspace) -> None:
    """`list` and the API derive ops/ops's status from its runs, which write no run-info:
    awaiting approval while one is paused, idle once every batch is answered, never `pending`."""

    def status() -> str:
        listed = ws.cli("list", "--json")
        assert listed.returncode == 0, listed.stderr
        (row,) = [
            r
            for r in json.loads(listed.stdout)
            if (r["project_id"], r["task_id"]) == ("ops", "ops")
        ]
        return str(row["status"])

    new_run(ws, policy="permissive")
    assert status() == "idle"
    (ws.path / "project" / "victim").mkdir()
    paused = ws.cli("ops", "apply", "-", "-w", "project", input=batch(
        shell("rm -r victim", id="rm-1"))
    )  # fmt: skip
    awaiting = json.loads(paused.stdout)["runId"]
    assert status() == "awaiting_approval"
    denied = ws.cli("ops", "deny", awaiting, "rm-1")
    assert denied.returncode == 0, denied.stderr
    assert status() == "idle"
