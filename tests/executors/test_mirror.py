"""The mirror of a task's folder on a host that does not share the server's runs root: what the
server's copy says is never ahead of the output it holds."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from runagent.executors.ray import mirror
from runagent.store import runfolder
from runagent.store.runfolder import TaskPaths

RUN = "20261129-120000000-1"


def test_a_record_that_says_its_run_ended_reaches_the_server_with_all_its_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent ends in the middle of a pass: its last line and the record of its end are
    written after the pass read the output. The server's copy may lag, but never says the run
    ended while its last line is still missing (a page streaming it would end there)."""
    task = TaskPaths(tmp_path / "host", "p", "t")
    run = task.folder / "runs" / RUN
    run.mkdir(parents=True)
    stdout, record = run / runfolder.STDOUT, run / runfolder.RUN_INFO
    stdout.write_text("line 1\n")
    record.write_text("status: running\n")
    home = mirror._Home(str(tmp_path / "server"))

    def call(method: Any, *args: Any, timeout: float | None = None) -> Any:
        if method.__name__ == "put" and "completed" not in record.read_text():
            with open(stdout, "a") as f:  # the agent's last line, then its run's end
                f.write("line 2\n")
            record.write_text("status: completed\n")
        return method(*args)

    monkeypatch.setattr(mirror.boundary, "call", call)
    copy = tmp_path / "server" / "p" / "t" / "runs" / RUN
    kept = mirror.Mirror(task)
    kept.home, kept.looked = home, time.monotonic()
    kept.sync()
    said = (copy / runfolder.RUN_INFO).read_text()
    if "completed" in said:
        assert (copy / runfolder.STDOUT).read_text() == "line 1\nline 2\n"
    kept.sync(final=True)  # the next pass brings both
    assert (copy / runfolder.RUN_INFO).read_text() == "status: completed\n"
    assert (copy / runfolder.STDOUT).read_text() == "line 1\nline 2\n"
