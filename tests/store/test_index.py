"""The root's index (runagent/store/index.py): a listing through it says what the run folders
say, whatever happened to them since it was written, and a warm one reads no run's record."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from runagent import listing
from runagent.store import index, lock, runfolder, taskfolder, tasks
from runagent.store.runinfo import Reason, Usage
from server import metrics
from tests.conftest import Workspace, wait_for
from tests.server.test_metrics import counters, scrape
from tests.store.test_conductor_loop import COMPLETED, FAILED, TASK

OFF = {"RUN_AGENT_INDEX": "off"}


def listed(ws: Workspace, env: dict[str, str] | None = None) -> list[dict[str, object]]:
    done = ws.cli("list", "--json", env=env)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert isinstance(rows, list)
    return rows


def settle() -> None:
    """Past the index's racy window, so what was just written is trusted by its stamps."""
    time.sleep(index.RACY_NS / 1e9 + 0.1)


def a_varied_root(ws: Workspace) -> None:
    """Completed, failed, running, lost, unreadable, a run folder without a record, and
    conductor-loop's records."""
    ws.write_config(["--fail-first", "1", "--lines", "1"], max_restarts=2,
                    agents={"sleeper": ["--lines", "1", "--sleep", "120"]})  # fmt: skip
    assert ws.cli("run", "-p", "p", "-t", "flaky", "go").returncode == 0
    assert ws.cli("job", "-p", "p", "-t", "bad", "go").returncode == 1
    assert ws.cli("run", "-p", "q", "-t", "live", "--agent", "sleeper", "--detach",
                  "go").returncode == 0  # fmt: skip
    live = ws.task("q", "live")
    wait_for(lambda: ws.runs("q", "live"), 30, "the live run's record")
    lost = ws.start_cli("job", "-p", "q", "-t", "lost", "--agent", "sleeper", "go")
    wait_for(lambda: ws.runs("q", "lost"), 30, "the lost run's record")
    os.kill(ws.runs("q", "lost")[0].supervisor_pid or 0, signal.SIGKILL)
    lost.communicate(timeout=30)
    broken = ws.task("p", "broken").run_folder("20260101-0000000000-1")
    broken.mkdir(parents=True)
    (broken / runfolder.RUN_INFO).write_text("status: [unclosed\n")
    ws.task("p", "empty").run_folder("20260101-0000000000-2").mkdir(parents=True)
    for n, text in enumerate((FAILED, COMPLETED)):
        folder = ws.task("conductor", TASK).run_folder(f"20260205-12{n}0000000-8700{n}")
        folder.mkdir(parents=True)
        (folder / runfolder.RUN_INFO).write_text(text)
    assert live.run_ids()


def test_a_listing_through_the_index_says_what_the_folders_say(ws: Workspace) -> None:
    a_varied_root(ws)
    try:
        truth = listed(ws, OFF)
        assert listed(ws) == truth  # the first: the index built
        assert (ws.root / index.FILE).is_file()
        settle()
        assert listed(ws) == truth  # warm
        assert listed(ws) == listed(ws, OFF)
        # What changed since: another run, a run removed, a record rewritten (as run-agent
        # marks a run after its end), the live run stopped.
        assert ws.cli("run", "-p", "p", "-t", "flaky", "--again", "go").returncode == 0
        assert ws.cli("gc", "--keep-last", "1", "-p", "p").returncode == 0
        bad = ws.task("p", "bad")
        folder = bad.run_folder(bad.run_ids()[-1])
        info = runfolder.read_run_info(folder)
        assert info is not None
        runfolder.write_run_info(folder, info.replace(reason=Reason.STUCK, message="stuck: x"))
        assert ws.cli("stop", "-p", "q", "-t", "live").returncode == 0
        rows = listed(ws)
        assert rows == listed(ws, OFF)
        by = {(r["project_id"], r["task_id"]): r for r in rows}
        assert by["p", "bad"]["status"] == "stuck" and by["q", "live"]["status"] == "stopped"
        assert by["q", "lost"]["status"] == "lost" and by["p", "broken"]["status"] == "unreadable"
        assert by["p", "flaky"]["runs"] == 1
    finally:
        ws.cli("stop", "-p", "q", "-t", "live")


def test_the_metrics_through_the_index_count_what_the_folders_hold(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    a_varied_root(ws)
    try:
        first = counters(scrape(metrics.render(ws.root, 0).decode()))
        settle()
        index.for_root(ws.root).close()  # as a fresh server would, from the file
        assert counters(scrape(metrics.render(ws.root, 0).decode())) == first
        assert ws.cli("run", "-p", "p", "-t", "flaky", "--again", "go").returncode == 0
        assert ws.cli("delete", "-p", "p", "-t", "bad", "--yes").returncode == 0
        assert ws.cli("gc", "--keep-last", "1").returncode == 0
        now = counters(scrape(metrics.render(ws.root, 0).decode()))
        monkeypatch.setenv("RUN_AGENT_INDEX", "off")  # every run read, as before the index
        assert now == counters(scrape(metrics.render(ws.root, 0).decode()))
        assert all(now[key] >= value for key, value in first.items() if key in now)
    finally:
        ws.cli("stop", "-p", "q", "-t", "live")


def test_a_warm_listing_and_scrape_read_no_run_record(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a listing costs is what it shows: from the file, a process that lists the root
    parses no run-info.yaml of an ended run (it stats them)."""
    ws.write_config(["--fail-first", "2", "--lines", "1"], max_restarts=3)
    for task in ("a", "b", "c"):
        assert ws.cli("run", "-p", "p", "-t", task, "go").returncode == 0  # three runs each
    assert len(listed(ws)) == 3
    settle()
    assert len(listed(ws)) == 3  # the index now holds what it read past its racy window
    index.for_root(ws.root).close()
    reads: list[Path] = []
    read = runfolder.read_run_record

    def counted(folder: Path, fence: str | None = None) -> object:
        reads.append(folder)
        return read(folder, fence)

    monkeypatch.setattr(runfolder, "read_run_record", counted)
    views = listing.all_tasks(ws.root)
    assert [v.status.value for v in views] == ["completed"] * 3
    assert [v.run_count for v in views] == [3, 3, 3]
    metrics.render(ws.root, 0)
    assert reads == []
    monkeypatch.setenv("RUN_AGENT_INDEX", "off")
    listing.all_tasks(ws.root)
    assert len(reads) == 3  # the old path: each task's latest record


def test_an_index_file_that_is_not_one_is_built_afresh(ws: Workspace) -> None:
    ws.write_config(["--lines", "1"])
    assert ws.cli("run", "-p", "p", "-t", "t", "go").returncode == 0
    truth = listed(ws, OFF)
    (ws.root / index.FILE).write_bytes(b"not a database, not at all" * 100)
    assert listed(ws) == truth
    with sqlite3.connect(ws.root / index.FILE) as db:  # built afresh, of this version
        assert db.execute("SELECT value FROM meta").fetchone() == (str(index.VERSION),)
        db.execute("UPDATE meta SET value = '999'")
    assert listed(ws) == truth  # another version: built afresh too
    with sqlite3.connect(ws.root / index.FILE) as db:
        assert db.execute("SELECT value FROM meta").fetchone() == (str(index.VERSION),)


def test_a_link_in_the_index_files_place_is_not_followed(ws: Workspace, tmp_path: Path) -> None:
    """Whoever could plant a link in the root does not make run-agent write through it: the
    listing goes on from the folders, and the file the link names is untouched."""
    ws.write_config(["--lines", "1"])
    assert ws.cli("run", "-p", "p", "-t", "t", "go").returncode == 0
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("mine\n")
    (ws.root / index.FILE).symlink_to(elsewhere)
    assert listed(ws) == listed(ws, OFF)
    assert elsewhere.read_text() == "mine\n"
    assert (ws.root / index.FILE).is_symlink()


def test_reindex_builds_the_index_afresh_from_the_folders(ws: Workspace) -> None:
    ws.write_config(["--fail-first", "1", "--lines", "1"], max_restarts=2)
    for task in ("a", "b"):
        assert ws.cli("run", "-p", "p", "-t", task, "go").returncode == 0
    truth = listed(ws, OFF)
    (ws.root / index.FILE).write_bytes(b"")
    done = ws.cli("reindex")
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("run-agent: indexed 4 runs of 2 tasks under ")
    with sqlite3.connect(ws.root / index.FILE) as db:
        assert db.execute("SELECT count(*) FROM run").fetchone() == (4,)
    assert listed(ws) == truth


def by_task(rows: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    return {f"{r['project_id']}/{r['task_id']}": r for r in rows}


def test_a_settled_tasks_row_is_kept_and_made_afresh_when_what_it_shows_changes(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A settled task's row comes from the index while the stamps it was made from hold, and
    each change that no new run makes (a supervisor taking the task, its sum of usage, a DONE
    written, a place in the queue) shows at the very next look."""
    ws.write_config(["--lines", "1"], max_restarts=0, agents={"bad": ["--fail-first", "1"]})
    assert ws.cli("run", "-p", "p", "-t", "a", "go").returncode == 0
    assert ws.cli("run", "-p", "p", "-t", "b", "--agent", "bad", "go").returncode == 1
    listed(ws)
    settle()
    assert listed(ws) == listed(ws, OFF)  # the rows made past their racy window, and kept
    index.for_root(ws.root).close()  # as a new process would, from the file
    reads: list[str] = []

    def counted(name: str, read: Callable[..., object]) -> Callable[..., object]:
        def reading(*args: object, **kwargs: object) -> object:
            reads.append(name)
            return read(*args, **kwargs)

        return reading

    for module, name in ((runfolder, "read_run_record"), (lock, "read_holder"),
                         (taskfolder, "read_task_usage"), (tasks, "view")):  # fmt: skip
        monkeypatch.setattr(module, name, counted(name, getattr(module, name)))
    kept = listing.rows(ws.root)
    assert reads == []  # no record, lock note, usage or view read: five stats a task
    assert [json.loads(row)["status"] for row in kept.values()] == ["completed", "failed"]
    monkeypatch.undo()

    a, b = ws.task("p", "a"), ws.task("p", "b")
    taskfolder.add_task_usage(a, Usage(1000, 200, 0.5))
    assert by_task(listed(ws))["p/a"]["usage"] == {"tokens_in": 1000, "tokens_out": 200,
                                                    "cost_usd": 0.5}  # fmt: skip
    runfolder.atomic_write(b.done, "done\n")
    assert by_task(listed(ws))["p/b"]["status"] == "completed"
    settle()
    assert listed(ws) == listed(ws, OFF)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path; "
         "from runagent.store.lock import TaskLock; TaskLock(Path(sys.argv[1]), 'p/a').acquire(); "
         "print('held', flush=True); sys.stdin.read()", str(a.lock)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        row = by_task(listed(ws))["p/a"]
        assert (row["status"], row["supervisor_pid"]) == ("running", holder.pid)
    finally:
        holder.kill()
        holder.wait()
    assert by_task(listed(ws))["p/a"]["status"] == "completed"
    assert listed(ws) == listed(ws, OFF)
    settle()
    listed(ws)
    place = tasks.QueuePlace(ahead=2, waits_for="max_running 1")
    found = tasks.all_paths(ws.root)
    queued = json.loads(index.for_root(ws.root).rows(found, {"p/a": place})["p/a"])
    assert queued["status"] == "queued" and queued["queue"]["ahead"] == 2
