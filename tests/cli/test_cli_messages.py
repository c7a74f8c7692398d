"""What the command line says where it used to say something wrong or nothing useful: help,
prompts, counts, refusals, and how a loop's end is worded."""

from __future__ import annotations

import fcntl
import os
import platform
import select
import subprocess
import termios
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from runagent.errors import ExitCode
from tests.conftest import Workspace, wait_for


def test_top_level_help_shows_the_options_every_command_takes(ws: Workspace) -> None:
    proc = ws.invoke("--help")
    assert proc.returncode == 0
    section = proc.stdout.split("Options of every command (before or after its name):")[1]
    for option in ("--config FILE", "--root DIRECTORY", "--executor [local|ray]"):
        assert option in section.split("Commands:")[0]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["schedule", "add"], "unknown command 'add'; `run-agent schedule` has: crontab, list, "),
        (["schedule", "lst"], "unknown command 'lst'; did you mean `run-agent schedule list`?"),
        (["paste", "shwo"], "unknown command 'shwo'; did you mean `run-agent paste show`?"),
        (["ops", "aply"], "unknown command 'aply'; did you mean `run-agent ops apply`?"),
    ],
)
def test_every_group_answers_an_unknown_command_with_its_commands(
    ws: Workspace, args: list[str], said: str
) -> None:
    proc = ws.invoke(*args)
    assert proc.returncode == ExitCode.USAGE
    assert proc.stderr.startswith(f"run-agent: {said}") and proc.stderr.count("\n") == 1


def _one_run(ws: Workspace) -> None:
    assert ws.invoke("-p", "p", "-t", "t", "x").returncode == 0


class Terminal:
    """`run-agent ARGS` on a pseudo-terminal of its own, as a person at a shell would run it."""

    def __init__(self, ws: Workspace, *args: str) -> None:
        self.master, slave = os.openpty()

        def own_terminal() -> None:  # runs in the child, after setsid: the pty is its terminal
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen(
            ws.cli_argv(*args), cwd=ws.path, stdin=slave, stdout=slave, stderr=slave,
            start_new_session=True, preexec_fn=own_terminal,
        )  # fmt: skip
        os.close(slave)
        self.seen = b""

    def read_until(self, text: str) -> None:
        def arrived() -> bool:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if ready:
                try:
                    self.seen += os.read(self.master, 4096)
                except OSError:  # the child closed the terminal
                    pass
            return text.encode() in self.seen

        wait_for(arrived, what=f"{text!r} on the terminal")

    def reading(self) -> bool:
        """Whether the program is blocked in read(2) on its terminal: a ^C typed before that
        would wait in Python's signal flag until the read returned (a key a person types after
        seeing the prompt comes later than that; a test's might not)."""
        read = {"x86_64": 0, "aarch64": 63}[platform.machine()]
        try:
            fields = Path(f"/proc/{self.proc.pid}/syscall").read_text().split()
        except OSError:
            return False
        return fields[:2] == [str(read), "0x0"]

    def type(self, data: bytes) -> None:
        wait_for(self.reading, what="the program to wait for a key")
        os.write(self.master, data)

    def finish(self) -> tuple[int, str]:
        try:
            code = self.proc.wait(timeout=120)  # a loaded machine: its event, not a time
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if not ready:
                break
            try:
                chunk = os.read(self.master, 4096)
            except OSError:
                break
            if not chunk:
                break
            self.seen += chunk
        os.close(self.master)
        return code, self.seen.decode(errors="replace")


def test_ctrl_c_at_deletes_prompt_exits_130_and_deletes_nothing(ws: Workspace) -> None:
    _one_run(ws)
    term = Terminal(ws, "delete", "-p", "p", "-t", "t")
    term.read_until("Delete task p/t (")
    term.type(b"\x03")  # the terminal turns it into SIGINT for the foreground group
    code, seen = term.finish()
    assert code == ExitCode.STOPPED, seen
    assert "1 run)?" in seen and "1 runs" not in seen
    assert "run-agent: interrupted; p/t is not deleted" in seen
    assert ws.task().folder.exists()


def test_no_at_deletes_prompt_says_so_and_keeps_the_task(ws: Workspace) -> None:
    _one_run(ws)
    term = Terminal(ws, "delete", "-p", "p", "-t", "t")
    term.read_until("[y/N]")
    term.type(b"n\n")
    code, seen = term.finish()
    assert code == ExitCode.FAILED and "run-agent: p/t is not deleted" in seen
    assert ws.task().folder.exists()


def test_counts_of_one_are_singular(ws: Workspace) -> None:
    _one_run(ws)
    dry = ws.invoke("gc", "--keep-last", "1", "--older-than", "0s", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    deleted = ws.invoke("delete", "-p", "p", "-t", "t", "--yes")
    assert deleted.stderr.startswith("run-agent: deleted task p/t (") and "1 run)" in deleted.stderr


def test_gc_keep_last_0_alone_is_refused_for_what_it_is(ws: Workspace) -> None:
    proc = ws.invoke("gc", "--keep-last", "0")
    assert proc.returncode == ExitCode.USAGE
    assert proc.stderr == (
        "run-agent: --keep-last 0 alone keeps no run: it would remove every run of every task "
        "that is not running; add --older-than DURATION, or keep more (--keep-last 1)\n"
    )
    assert "say what to keep" in ws.invoke("gc").stderr


def test_schedule_run_with_every_schedule_disabled_says_so(ws: Workspace) -> None:
    config: dict[str, Any] = yaml.safe_load(ws.config.read_text())
    config["schedules"] = {
        "nightly": {"cron": "@daily", "project": "p", "prompt": "x", "enabled": False},
        "weekly": {"cron": "@weekly", "project": "p", "prompt": "x", "enabled": False},
    }
    ws.config.write_text(yaml.safe_dump(config))
    proc = ws.invoke("schedule", "run")
    assert proc.returncode == ExitCode.USAGE
    assert proc.stderr == (
        "run-agent: every schedule in the config is disabled (nightly, weekly); set "
        "`enabled: true` on one\n"
    )


def test_clean_exits_without_the_done_file_are_not_called_a_crash_loop(ws: Workspace) -> None:
    ws.write_config([], crash_loop_runs=3, crash_loop_seconds="30s", max_restarts=5)
    proc = ws.invoke("-p", "p", "-t", "t", "--until", "done-file", "x")
    assert proc.returncode == ExitCode.FAILED
    assert "3 runs in a row ended within 30s without completing the task, not restarting" in (
        proc.stderr
    )
    assert "crash loop" not in proc.stderr


def test_a_resumed_loop_that_gives_up_counts_as_its_console_did(ws: Workspace) -> None:
    ws.write_config(["--exit", "1"], max_restarts=0)
    assert ws.invoke("-p", "p", "-t", "t", "x").returncode == ExitCode.FAILED
    resumed = ws.invoke("resume", "-p", "p", "-t", "t")
    assert "attempt 2/2: run" in resumed.stderr
    assert "gave up after 1 failed attempt in this loop (attempt 2) (max_restarts 0)" in (
        resumed.stderr
    )
    ws.write_config(["--exit", "1"], max_restarts=1)
    again = ws.invoke("resume", "-p", "p", "-t", "t")
    assert "gave up after 2 failed attempts in this loop (attempts 3-4)" in again.stderr
