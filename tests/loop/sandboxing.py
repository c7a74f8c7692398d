"""What the tests of the agent's sandbox share: the mark that skips them where bubblewrap cannot
run, a config whose agent runs sandboxed, what the fake agent's probes said, and a home with a
private key in ~/.ssh (the `home` fixture of tests/loop/conftest.py)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from runagent.ops.sandbox import Bwrap
from tests.conftest import Workspace

needs_bwrap = pytest.mark.skipif(
    Bwrap(Path("/")).problem() is not None, reason="bubblewrap cannot run here"
)


def sandboxed(ws: Workspace, args: list[str], **agent: object) -> None:
    """A config whose fake agents run with `args`, under bwrap, with `agent`'s settings."""
    ws.write_config(args, max_restarts=0)
    data = yaml.safe_load(ws.config.read_text())
    for config in data["agents"].values():
        config.update({"sandbox": "bwrap", **agent})
    ws.config.write_text(yaml.safe_dump(data))


def probes(ws: Workspace, task: str = "t") -> dict[str, str]:
    """What the fake agent's probes said in each of the task's runs (`read PATH: outcome`)."""
    seen: dict[str, str] = {}
    for run in ws.runs("p", task):
        text = ws.task("p", task).run(run.run_id).stdout.read_text()
        seen.update(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    return seen


def agent(
    ws: Workspace, code: str, *, agent_type: str = "command", network: bool = False,
    env: dict[str, str] | None = None, **settings: object,
) -> None:  # fmt: skip
    """A config whose one agent, sandboxed (without network unless `network`), runs
    `python -c code` (the marker on its command line, so that a process left over is found)."""
    config = {"type": agent_type, "command": [sys.executable, "-c", code, ws.marker],
              "sandbox": "bwrap", "network": network, "env": env or {}}  # fmt: skip
    data = {
        "agents": {"evil": config},
        "defaults": {
            "agent": "evil",
            "max_restarts": 0,
            "until": "exit",
            "stuck_after": 0,
            **settings,
        },
        "storage": {"runs_dir": str(ws.root)},
    }
    ws.config.write_text(yaml.safe_dump(data))


def home_with_key(beside: Path) -> Iterator[Path]:
    """A home beside `beside` (not in it) with a private key in ~/.ssh; removed at the end."""
    folder = Path(tempfile.mkdtemp(prefix="run-agent-test-home-", dir=beside.parent))
    (folder / ".ssh").mkdir()
    (folder / ".ssh" / "id_ed25519").write_text("a private key")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
