"""run-agent: a supervised run-folder loop runner for AI coding agents."""

import sys

__version__ = "0.1.0"
VERSION_LINE = "%(prog)s, version %(version)s"  # `run-agent --version`, with click or without


def python(*args: str) -> list[str]:
    """This interpreter, to run one of run-agent's own modules as a new process. `-P` keeps the
    working folder off its import path: `python -m` would put it first, and a detached start,
    the keeper, a broker or an API agent runs in the folder an agent works on, whose `json.py`
    (say), written by the agent or shipped in the repository, would then run on the host in
    place of the standard library's."""
    return [sys.executable, "-P", *args]
