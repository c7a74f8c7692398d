"""What a person sees in a terminal during a foreground run (through a real pseudo-terminal)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time

from tests.conftest import Workspace


def terminal_session(ws: Workspace, line_text: str, shown: str) -> tuple[str, int]:
    """A foreground run in a pseudo-terminal whose agent prints two lines of `line_text` and
    waits until `shown` was shown: everything the terminal received, and the exit code."""
    go = ws.path / "go"
    ws.write_config(["--lines", "2", "--line-text", line_text, "--wait-for", str(go)])
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        ws.cli_argv("--project", "p", "--task", "t", "x"),
        cwd=ws.path,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 120  # a deadline for a broken run, not a speed
    try:
        while shown.encode() not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                seen += os.read(master, 65536)
        go.touch()
        while proc.poll() is None and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    seen += os.read(master, 65536)
                except OSError:
                    break
    finally:
        proc.wait(60)
        os.close(master)
    assert proc.returncode is not None
    return seen.decode(errors="replace"), proc.returncode


def test_a_foreground_run_in_a_terminal_shows_a_live_status_line(ws: Workspace) -> None:
    text, code = terminal_session(ws, "compiling module", "compiling module 2")
    assert "attempt 1/4 · running · 00:0" in text  # attempt, status and elapsed time
    assert "compiling module 2" in text  # the agent's latest output, without opening a file
    assert "\r\x1b[K" in text  # redrawn in place, not scrolled
    assert "task p/t completed" in text
    assert code == 0


def test_the_status_line_drops_the_agents_colour_codes(ws: Workspace) -> None:
    text, code = terminal_session(ws, "\x1b[33mwarn-ish\x1b[0m", "warn-ish 2")
    assert "warn-ish 2" in text
    assert "[33m" not in text and "[0m" not in text
    assert code == 0


def test_watch_redraws_tasks_in_place_and_leaves_cleanly_on_ctrl_c(ws: Workspace) -> None:
    import signal

    assert ws.invoke("-p", "p", "-t", "first", "x").returncode == 0
    master, slave = pty.openpty()
    proc = subprocess.Popen(ws.cli_argv("watch"), cwd=ws.path, stdin=slave, stdout=slave,
                            stderr=slave, start_new_session=True)  # fmt: skip
    os.close(slave)
    seen = b""

    def read_until(needle: bytes) -> bool:
        nonlocal seen
        deadline = time.monotonic() + 20
        while needle not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                seen += os.read(master, 65536)
        return needle in seen

    try:
        assert read_until(b"p/first") and b"completed" in seen
        assert ws.invoke("-p", "p", "-t", "second", "x").returncode == 0
        assert read_until(b"p/second")  # a new task appears without restarting watch
        assert b"\x1b[H\x1b[2J" in seen  # redrawn in place, not scrolled
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    assert b"Traceback" not in seen
