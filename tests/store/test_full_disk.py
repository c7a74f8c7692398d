"""A disk that fills while a run runs: a real, small tmpfs mounted as the runs root, filled up
by the test, and unmounted at its end (skipped where mounting is not allowed)."""

from __future__ import annotations

import errno
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from runagent.errors import ExitCode
from runagent.store.runinfo import RunStatus
from tests.conftest import Workspace, wait_for


@pytest.fixture
def small_disk(ws: Workspace) -> Iterator[Path]:
    """The workspace's runs root as a 1 MiB tmpfs of its own."""
    ws.root.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command to make a small filesystem with")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(ws.root)],
        capture_output=True, text=True,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield ws.root
    finally:
        if subprocess.run(["umount", str(ws.root)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(ws.root)], check=True)


def fill(disk: Path) -> None:
    """Write a file until the filesystem refuses the next block."""
    with open(disk / "filler", "wb", buffering=0) as f:
        while True:
            try:
                f.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                return


def test_a_disk_that_fills_mid_run_records_the_run_s_end(ws: Workspace, small_disk: Path) -> None:
    go = ws.path / "go"  # on the real disk
    ws.write_config(["--lines", "200", "--wait-for", str(go)])
    loop = ws.start_cli("--project", "p", "--task", "t", "x")
    try:

        def waiting() -> bool:
            runs = ws.runs()
            stdout = ws.task().run(runs[0].run_id).stdout if runs else None
            return stdout is not None and stdout.read_text().endswith(" 200\n")

        wait_for(waiting, what="the agent to write its lines and wait")
        fill(small_disk)
    finally:
        go.touch()
        _, err = loop.communicate(timeout=30)
    assert loop.returncode == ExitCode.FAILED, err
    assert "Traceback" not in err
    why = "No space left on device writing output.md"
    assert why in err.strip().splitlines()[-1], err
    # Written on disk, not only said: the run is over, when, and why.
    (info,) = ws.runs()
    assert info.status is RunStatus.FAILED and info.reason == "write_error"
    assert info.end_time is not None and info.exit_code == 0 and why in (info.message or "")
    assert not list(ws.task().run_folder(info.run_id).glob(".unrecorded.*"))
    (listed,) = json.loads(ws.cli("list", "-p", "p", "-t", "t", "--json").stdout)
    assert listed["status"] == "failed" and listed["end_time"] == info.end_time
