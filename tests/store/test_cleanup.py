"""gc and delete over real run folders: the dry run lists exactly what a real run removes, and a
running task is never touched."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from starlette.testclient import TestClient

from runagent.cli.cleanup import human
from runagent.errors import ExitCode
from runagent.store import cleanup, runfolder
from server.app import Settings, create_app
from tests.conftest import LOCAL, Workspace, wait_for


def age(folder: Path, days: float) -> None:
    """Make a run look as if it ended `days` ago (its run-info end_time, and its mtime)."""
    info = runfolder.read_run_info(folder)
    assert info is not None
    ended = time.time() - days * 86400
    runfolder.write_run_info(folder, info.replace(end_time=runfolder.timestamp(ended)))
    os.utime(folder, (ended, ended))


def listed(output: str) -> list[str]:
    """The labels a gc output names, as `would remove X (size)` or `removing X (size)`."""
    return sorted(re.findall(r"^(?:would remove|removing) (\S+) ", output, re.M))


def test_the_dry_run_lists_exactly_what_gc_then_removes(ws: Workspace) -> None:
    ws.write_config(["--fail-first", "2"], max_restarts=3)  # failed, failed, completed
    assert ws.invoke("-p", "p", "-t", "old", "x").returncode == 0
    assert ws.invoke("-p", "p", "-t", "new", "x").returncode == 0
    old = ws.task("p", "old")
    for run_id in old.run_ids():
        age(old.run_folder(run_id), 40)
    args = ("gc", "--older-than", "30d", "--keep-last", "1")
    dry = ws.invoke(*args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    would = listed(dry.stdout)
    assert would == sorted(f"p/old/{r}" for r in old.run_ids()[:-1])  # the last one is kept
    assert all(old.run_folder(r).exists() for r in old.run_ids())  # nothing removed yet
    real = ws.invoke(*args)
    assert listed(real.stdout) == would
    assert len(old.run_ids()) == 1 and len(ws.task("p", "new").run_ids()) == 3
    assert ws.invoke(*args, "--dry-run").stdout == ""  # nothing left to remove


def test_keep_failed_keeps_what_did_not_complete(ws: Workspace) -> None:
    ws.write_config(["--fail-first", "1"], max_restarts=1)
    assert ws.invoke("-p", "p", "-t", "t", "x").returncode == 0
    for run_id in ws.task().run_ids():
        age(ws.task().run_folder(run_id), 10)
    assert ws.invoke("gc", "--older-than", "1d", "--keep-failed").returncode == 0
    assert [r.status.value for r in ws.runs()] == ["failed"]


def test_a_running_task_is_never_touched(ws: Workspace) -> None:
    go = ws.path / "go"
    ws.write_config(["--wait-for", str(go)], max_restarts=0)
    loop = ws.start_cli("-p", "p", "-t", "live", "x")
    try:
        wait_for(lambda: ws.runs("p", "live"), what="the run")
        for run_id in ws.task("p", "live").run_ids():
            age(ws.task("p", "live").run_folder(run_id), 100)
        gc = ws.invoke("gc", "--older-than", "1s")
        assert gc.returncode == 0 and "p/live" not in gc.stdout
        refused = ws.invoke("delete", "-p", "p", "-t", "live", "--yes")
        assert refused.returncode == ExitCode.ALREADY_RUNNING
        assert "is already running" in refused.stderr and "stop it first" in refused.stderr
        assert ws.task("p", "live").folder.exists()
    finally:
        go.touch()
        loop.communicate(timeout=30)


def test_delete_removes_a_finished_task_and_asks_first(ws: Workspace) -> None:
    assert ws.invoke("-p", "p", "-t", "t", "x").returncode == 0
    unasked = ws.invoke("delete", "-p", "p", "-t", "t")  # no terminal to ask in: refused
    assert unasked.returncode == ExitCode.USAGE and "needs --yes" in unasked.stderr
    assert ws.task().folder.exists()
    done = ws.invoke("delete", "-p", "p", "-t", "t", "--yes")
    assert done.returncode == 0 and "deleted task p/t" in done.stderr
    assert not ws.task().folder.exists()
    assert ws.invoke("gc").returncode == ExitCode.USAGE  # gc says what to keep, never all


def test_a_hard_linked_output_md_is_counted_once(ws: Workspace) -> None:
    # Over 1 MiB of stdout: output.md is then a hard link to it, not a copy.
    ws.write_config(["--lines", "20000", "--line-text", "x" * 60])
    assert ws.invoke("-p", "p", "-t", "t", "x").returncode == 0
    run = ws.task().run(ws.task().run_ids()[0])
    assert run.output.stat().st_ino == run.stdout.stat().st_ino
    on_disk = sum(p.stat().st_size for p in ws.task().folder.rglob("*") if p.is_file())
    once = on_disk - run.output.stat().st_size
    assert cleanup.folder_size(ws.task().folder) == once
    app = create_app(Settings(root=ws.root, config_path=ws.config))
    with TestClient(app, base_url=LOCAL) as client:
        assert client.get("/api/projects/p/tasks/t").json()["disk_bytes"] == once
    age(run.folder, 10)
    gc = ws.invoke("gc", "--older-than", "1d", "--dry-run")
    assert f"({human(cleanup.folder_size(run.folder))})" in gc.stdout
    assert cleanup.folder_size(run.folder) < 2 * run.stdout.stat().st_size
    deleted = ws.invoke("delete", "-p", "p", "-t", "t", "--yes")
    assert f"deleted task p/t ({human(once)}, 1 run)" in deleted.stderr


def test_a_run_whose_run_info_cannot_be_read_is_shown_and_never_removed(ws: Workspace) -> None:
    ws.write_config(["--fail-first", "1"], max_restarts=1)  # failed, completed
    assert ws.invoke("-p", "p", "-t", "t", "x").returncode == 0
    first, second = ws.task().run_ids()
    for run_id in (first, second):
        age(ws.task().run_folder(run_id), 40)
    broken = ws.task().run_folder(first) / "run-info.yaml"
    broken.write_text(broken.read_text()[:40] + "\n  [half: written")
    os.utime(broken.parent, (time.time() - 40 * 86400,) * 2)
    gc = ws.invoke("gc", "--older-than", "30d")
    assert gc.returncode == 0, gc.stderr
    assert listed(gc.stdout) == [f"p/t/{second}"]
    assert f"keeping p/t/{first}: run-info.yaml cannot be read: not YAML at line" in gc.stderr
    assert ws.task().run_ids() == [first]
    # Every reader shows it, with the reason, rather than dropping it.
    rows = ws.invoke("list", "-p", "p", "-t", "t").stdout
    assert f"{first}" in rows and "unreadable" in rows and "cannot be read: not YAML" in rows
    status = ws.invoke("status", "-p", "p", "-t", "t").stdout  # completed: its DONE says so
    assert f"{first}: unreadable" in status and "cannot be read: not YAML" in status
    ws.task().done.unlink()  # without it, the task is what its latest run is
    assert "unreadable" in ws.invoke("list").stdout.splitlines()[1].split()
    app = create_app(Settings(root=ws.root, config_path=ws.config))
    with TestClient(app, base_url=LOCAL) as client:
        (run,) = client.get("/api/projects/p/tasks/t").json()["runs_list"]
        assert run["status"] == "unreadable" and "cannot be read" in run["message"]
        one = client.get(f"/api/projects/p/tasks/t/runs/{first}").json()
        assert one["status"] == "unreadable"
    # delete asks for --force, then removes it.
    refused = ws.invoke("delete", "-p", "p", "-t", "t", "--yes")
    assert refused.returncode == ExitCode.USAGE and "--force" in refused.stderr
    assert f"run p/t/{first} is kept: run-info.yaml cannot be read" in refused.stderr
    assert ws.task().folder.exists()
    forced = ws.invoke("delete", "-p", "p", "-t", "t", "--yes", "--force")
    assert forced.returncode == 0 and not ws.task().folder.exists()
