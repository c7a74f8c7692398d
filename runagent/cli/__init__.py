"""The `run-agent` command line, a package of thin commands over the core.

`main` is the entry point (`run-agent`, `python -m runagent`, and the detached supervisors).
"""

from __future__ import annotations

import gc
import sys

__all__ = ["main"]

# Each command's module is imported when that command runs (group.LAZY), not here; click itself
# only once a command line needs parsing (`run-agent --version` alone needs none). The command
# group is `runagent.cli.group.cli`.


# The commands that run an agent in this process (`run` also when no command is named).
RUNS_HERE = frozenset(("run", "job", "resume", "cocode"))


def main() -> None:
    if sys.argv[1:] == ["--version"]:  # asked by scripts and health checks: no click for it
        from runagent import VERSION_LINE, __version__

        sys.stdout.write(f"{VERSION_LINE % {'prog': 'run-agent', 'version': __version__}}\n")
        return
    # What a command loads is kept for its whole life: the collector finds no garbage in it,
    # yet every few hundred objects made it would walk them all (a tenth of a job's work).
    # It runs again, over what is made from then on, once the command starts (see `collect`).
    gc.disable()
    from runagent.cli.group import cli, collect

    try:
        if runs_an_agent(sys.argv[1:]):
            from runagent.process import start_reaper_early

            start_reaper_early()  # it boots while the command loads and checks, not after
        cli(prog_name="run-agent")
    finally:
        collect()


def runs_an_agent(args: list[str]) -> bool:
    """Whether a command line most likely runs an agent in this process: a guess, made before
    parsing, that costs a spare reaper's start when wrong (it exits with this process)."""
    from runagent.cli.group import COMMON

    if any(a in ("--help", "-h", "--version") for a in args):
        return False
    i = 0
    while i < len(args) and args[i].partition("=")[0] in COMMON:
        i += 1 if "=" in args[i] else 2
    first = args[i] if i < len(args) else ""
    return first in RUNS_HERE or first.startswith("-")
