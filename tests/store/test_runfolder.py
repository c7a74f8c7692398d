"""Run-folder files: atomic run-info, TASK.md written once, DONE archiving, tails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runagent.store import runfolder, taskfolder, tasks
from runagent.store.pids import process_start_time
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import Reason, RunInfo, RunStatus


def test_run_info_round_trips_and_leaves_no_temp_files(tmp_path: Path) -> None:
    info = RunInfo("r1", "p", "t", 2, "demo", "command", "2026-01-01T00:00:00.000+00:00", "/w",
                   status=RunStatus.FAILED, reason=Reason.EXIT_CODE, exit_code=1,
                   commandline="agent --flag")  # fmt: skip
    runfolder.write_run_info(tmp_path, info)
    assert runfolder.read_run_info(tmp_path) == info
    assert os.listdir(tmp_path) == ["run-info.yaml"]
    text = (tmp_path / "run-info.yaml").read_text()
    assert text.startswith("version: 1\nrun_id: r1\n")
    assert "status: failed" in text and "reason: exit_code" in text


def test_a_checked_run_records_its_check_and_an_unchecked_one_says_nothing_of_it(
    tmp_path: Path,
) -> None:
    plain = RunInfo("r1", "p", "t", 1, "demo", "command", "2026-01-01T00:00:00.000+00:00", "/w")
    runfolder.write_run_info(tmp_path, plain)
    assert "check" not in (tmp_path / "run-info.yaml").read_text()  # nothing new for a reader
    checked = plain.replace(
        status=RunStatus.FAILED, reason=Reason.CHECK_FAILED, exit_code=0,
        check_command="pytest -q", check_exit_code=1, check_seconds=0.25,
    )  # fmt: skip
    runfolder.write_run_info(tmp_path, checked)
    assert runfolder.read_run_info(tmp_path) == checked
    text = (tmp_path / "run-info.yaml").read_text()
    assert "reason: check_failed" in text and "check_exit_code: 1" in text
    assert "check_seconds: 0.25" in text and 'check_command: "pytest -q"' in text
    bad = text.replace("check_exit_code: 1", "check_exit_code: x")
    with pytest.raises(ValueError, match="check_exit_code"):
        RunInfo.from_dict(runfolder.load_yaml(bad))


def test_unreadable_run_info_is_none_not_an_error(tmp_path: Path) -> None:
    assert runfolder.read_run_info(tmp_path) is None
    (tmp_path / "run-info.yaml").write_text("{{{{ not yaml")
    assert runfolder.read_run_info(tmp_path) is None


def test_task_md_is_written_once(tmp_path: Path) -> None:
    task = TaskPaths(tmp_path, "p", "t")
    taskfolder.write_task_prompt(task, "first")
    taskfolder.write_task_prompt(task, "second")
    assert taskfolder.read_task_prompt(task) == "first"


def test_archive_done_keeps_the_content(tmp_path: Path) -> None:
    task = TaskPaths(tmp_path, "p", "t")
    assert runfolder.archive_done(task, None) is None
    folder = runfolder.create_run_folder(task, "r1")
    task.done.write_text("notes")
    moved = runfolder.archive_done(task, "r1")
    assert moved == folder / "DONE" and moved.read_text() == "notes"
    task.done.write_text("again")
    moved = runfolder.archive_done(task, "r1")  # the run folder already has one
    assert moved is not None and moved.parent == task.folder and moved.read_text() == "again"
    assert not task.done.exists()


def test_run_ids_sort_oldest_first(tmp_path: Path) -> None:
    task = TaskPaths(tmp_path, "p", "t")
    for run_id in ["20260101-000000002-9", "20260101-000000001-77", "20260101-000000003-1"]:
        runfolder.create_run_folder(task, run_id)
    assert task.run_ids() == ["20260101-000000001-77", "20260101-000000002-9",
                              "20260101-000000003-1"]  # fmt: skip


def test_tail_starts_at_a_line_boundary(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("".join(f"line {i}\n" for i in range(1000)))
    text = runfolder.tail(path, 100)
    assert text.endswith("line 999\n") and text.startswith("line ")
    assert len(text) <= 100
    assert runfolder.tail(tmp_path / "missing") == ""


def test_a_failed_atomic_write_names_the_file_not_its_temporary_copy(tmp_path: Path) -> None:
    target = tmp_path / "DONE"
    (target / "in-the-way").mkdir(parents=True)  # a folder where the file should go
    with pytest.raises(IsADirectoryError) as info:
        runfolder.atomic_write(target, "done\n")
    assert info.value.filename == str(target)
    assert sorted(os.listdir(tmp_path)) == ["DONE"]  # the temporary copy is gone


def test_a_running_run_whose_supervisor_is_gone_is_lost_and_marked_so(tmp_path: Path) -> None:
    me = os.getpid()
    running = RunInfo("r1", "p", "t", 1, "a", "command", "2026-01-01T00:00:00.000+00:00", "/w",
                      supervisor_pid=me, supervisor_start=process_start_time(me))  # fmt: skip
    assert not tasks.is_lost(running)  # its supervisor (this process) is alive
    dead = running.replace(supervisor_pid=1, supervisor_start=0.0)  # pid 1, but not its start
    assert tasks.is_lost(dead)
    assert not tasks.is_lost(dead.replace(status=RunStatus.FAILED))  # an ended run is not lost
    folder = runfolder.create_run_folder(TaskPaths(tmp_path, "p", "t"), "r1")
    paths = runfolder.RunPaths(folder)
    os.utime(paths.stdout, (1767225600.5, 1767225600.5))  # the last output: the run's end
    os.utime(paths.stderr, (1767225000.0, 1767225000.0))
    lost = runfolder.mark_lost(folder, dead)
    assert lost.status is RunStatus.LOST and lost.reason is Reason.SUPERVISOR_LOST
    assert lost.end_time == runfolder.timestamp(1767225600.5) == "2026-01-01T00:00:00.500+00:00"
    assert runfolder.read_run_info(folder) == lost


def test_files_of_an_issue_worktree_are_told_apart_from_run_folder_files(tmp_path: Path) -> None:
    from runagent.store.runfolder import in_worktree

    task = tmp_path / "p" / "t"
    assert in_worktree(tmp_path, task / "worktree" / "src" / "main.py")
    assert in_worktree(tmp_path, task / "worktree.stale-20261123-000000" / "a")
    assert not in_worktree(tmp_path, task / "worktree")  # made or removed: a listing changes
    assert not in_worktree(tmp_path, task / "worktree-20261123-000000.diff")
    assert not in_worktree(tmp_path, task / "runs" / "r1" / "agent-stdout.txt")
    assert not in_worktree(tmp_path / "elsewhere", task / "worktree" / "a")
