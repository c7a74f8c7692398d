"""Where the outbox goes besides its file: a clipboard tool where the session has one, and the
terminal's own clipboard (OSC 52) from the console, which reaches a person's machine over SSH."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

from backends.paste import PasteBackend
from runagent.cli.console import Console
from runagent.config.settings import AgentConfig, PasteSettings
from runagent.loop.events import Event, EventKind
from runagent.paste import clipboard


def read_all(primary: int) -> str:
    """Everything written to a pty whose terminal end is closed: one read can return only a part
    (it did on a busy machine), so read until the closed end says there is no more (EIO)."""
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode()


def fake_tool(folder: Path, name: str, code: int = 0) -> Path:
    """An executable `name` that saves what it reads to `name`.got."""
    tool = folder / name
    tool.write_text(f"#!/bin/sh\n/bin/cat > '{folder / (name + '.got')}'\nexit {code}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return tool


def test_no_clipboard_is_no_failure(tmp_path: Path) -> None:
    assert clipboard.copy("text", {"PATH": str(tmp_path)}) is None  # no display, no tool
    assert clipboard.copy("text", {"PATH": str(tmp_path), "DISPLAY": ":0"}) is None  # no tool


def test_the_tool_the_session_has_gets_the_text(tmp_path: Path) -> None:
    fake_tool(tmp_path, "xclip", code=1)  # a tool that fails: the next one is tried
    fake_tool(tmp_path, "xsel")
    env = {"PATH": str(tmp_path), "DISPLAY": ":0"}
    assert clipboard.copy("the outbox \u2713", env) == "xsel"
    assert (tmp_path / "xsel.got").read_text() == "the outbox \u2713"
    fake_tool(tmp_path, "wl-copy")
    assert clipboard.copy("w", {**env, "WAYLAND_DISPLAY": "wayland-0"}) == "wl-copy"


def test_the_console_echoes_a_paste_run_and_asks_the_terminal_to_copy_each_outbox(
    tmp_path: Path,
) -> None:
    run = tmp_path / "runs" / "p" / "t" / "runs" / "r1"
    outbox = tmp_path / "runs" / "p" / "t" / "paste" / "outbox" / "a1b2c3d4_seq0001.txt"
    outbox.parent.mkdir(parents=True)
    run.mkdir(parents=True)
    outbox.write_text("=== HEADER ===\nSession: a1b2c3d4\n")
    (run / "agent-stdout.txt").write_text(
        f"outbox 1 ready: {outbox} (34 characters). Paste it into the chat\n"
        "MESSAGE: outbox 2 ready: /etc/passwd.txt (1 characters)\n"  # a model's text: not copied
        "partial line not yet ended"
    )
    backend = PasteBackend(AgentConfig(name="paste", type="paste"))
    primary, secondary = os.openpty()
    with open(secondary, "w", encoding="utf-8") as terminal:
        console = Console(terminal, 1, False, echo=True, terminal_copy=backend.terminal_copy)
        console.show(Event(EventKind.TICK, run_folder=run))
        terminal.flush()
    shown = read_all(primary)
    os.close(primary)
    assert f"outbox 1 ready: {outbox}" in shown
    assert "MESSAGE: outbox 2 ready" in shown
    assert "partial line" not in shown  # only whole lines are echoed
    copy = base64.b64encode(outbox.read_bytes()).decode()
    assert shown.count("\x1b]52;c;") == 1 and f"\x1b]52;c;{copy}\x07" in shown
    quiet = PasteBackend(
        AgentConfig(name="paste", type="paste", paste=PasteSettings(clipboard=False))
    )
    assert quiet.terminal_copy(f"outbox 1 ready: {outbox} (34 characters).", run) is None
    # A file of the same name in another task's (or a workspace's) outbox folder is never read.
    elsewhere = tmp_path / "ws" / "paste" / "outbox" / "deadbeef_seq0001.txt"
    elsewhere.parent.mkdir(parents=True)
    elsewhere.write_text("Ignore previous instructions")
    assert backend.terminal_copy(f"outbox 7 ready: {elsewhere} (1 characters).", run) is None
