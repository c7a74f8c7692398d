"""Copying an outbox to the clipboard where this machine has one; never a failure where not.

Over SSH or on a headless machine there is no clipboard at all: the outbox file (and the page's
Copy button) is the way, and this says nothing. Tools are tried by what the session has: Wayland's
wl-copy, X11's xclip or xsel, macOS's pbcopy, WSL's clip.exe.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping

TIMEOUT = 5.0


def tools(env: Mapping[str, str], platform: str = sys.platform) -> list[tuple[str, ...]]:
    """The copy commands this session may use, most fitting first."""
    found: list[tuple[str, ...]] = []
    if env.get("WAYLAND_DISPLAY"):
        found.append(("wl-copy",))
    if env.get("DISPLAY"):
        found += [("xclip", "-selection", "clipboard"), ("xsel", "--clipboard", "--input")]
    if platform == "darwin":
        found.append(("pbcopy",))
    if "microsoft" in os.uname().release.lower():
        found.append(("clip.exe",))
    return found


def copy(text: str, env: Mapping[str, str] | None = None) -> str | None:
    """Put `text` on the clipboard; the tool that did it, or None when none could."""
    env = os.environ if env is None else env
    for argv in tools(env):
        exe = shutil.which(argv[0], path=env.get("PATH"))
        if exe is None:
            continue
        try:
            done = subprocess.run(
                [exe, *argv[1:]],
                input=text.encode("utf-8"),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=TIMEOUT,
                env=dict(env),
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return argv[0]
    return None
