"""The `run-agent` command line, a package of thin commands over the core.

`main` is the entry point (`run-agent`, `python -m runagent`, and the detached supervisors).
"""

from __future__ import annotations

from runagent.cli import checks, issues, run, schedule, serve, show
from runagent.cli.group import cli

__all__ = ["cli", "main"]

_COMMANDS = (checks, issues, run, schedule, serve, show)  # imported for the commands they register


def main() -> None:
    cli(prog_name="run-agent")
