"""The `run-agent` command line, a package of thin commands over the core.

`main` is the entry point (`run-agent`, `python -m runagent`, and the detached supervisors).
"""

from __future__ import annotations

from runagent.cli import checks, cleanup, issues, ops, paste, run, schedule, serve, show, watch
from runagent.cli import usage as usage_command
from runagent.cli.group import cli

__all__ = ["cli", "main"]

# Imported for the commands they register.
_COMMANDS = (checks, cleanup, issues, ops, paste, run, schedule, serve, show, usage_command, watch)


def main() -> None:
    cli(prog_name="run-agent")
