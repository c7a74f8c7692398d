"""The backend interface: how run-agent asks an agent module what to start and what it said."""

from __future__ import annotations

import abc
import shlex
from collections.abc import Iterable
from typing import ClassVar

from runagent.config import AgentConfig
from runagent.context import RunContext
from runagent.process import LaunchSpec

REDACTED = "***"


class Backend(abc.ABC):
    """One kind of agent. `launch` is pure: it builds a LaunchSpec and touches nothing.

    Subclasses set `name` (the registry key, module name, CLI choice and config type, all one)
    and may override `final_output` to parse the agent's stream into output.md.
    """

    name: ClassVar[str]

    def __init__(self, config: AgentConfig) -> None:
        self.config = config

    @abc.abstractmethod
    def launch(self, ctx: RunContext) -> LaunchSpec:
        """The process that runs this agent for `ctx`."""

    def final_output(self, ctx: RunContext) -> str | None:
        """The agent's final answer parsed from its output, or None to copy stdout."""
        return None

    def version(self) -> str | None:
        """The agent's version, if the backend can tell it."""
        return None

    def secrets(self) -> Iterable[str]:
        """Values that must never be written anywhere (tokens)."""
        return [s for s in (self.config.token,) if s]

    def commandline(self, spec: LaunchSpec) -> str:
        """The command line as it may be recorded: every secret replaced by ***."""
        text = shlex.join(spec.argv)
        for secret in self.secrets():
            text = text.replace(secret, REDACTED)
        return text
