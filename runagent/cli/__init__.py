"""The `run-agent` command line, a package of thin commands over the core.

`main` is the entry point (`run-agent`, `python -m runagent`, and the detached supervisors).
"""

from __future__ import annotations

from runagent.cli.group import cli

__all__ = ["cli", "main"]

# Each command's module is imported when that command runs (group.LAZY), not here.


def main() -> None:
    cli(prog_name="run-agent")
