"""The backend registry: one line per built-in backend, plus the `runagent.backends` entry points.

Modules load only when used, so a broken backend breaks only itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points

from runagent.backend import Backend
from runagent.config import AgentConfig
from runagent.errors import MissingDependencyError, RunAgentError

ENTRY_POINT_GROUP = "runagent.backends"

BUILTIN: dict[str, str] = {
    "claude": "backends.claude",
    "codex": "backends.codex",
    "command": "backends.command",
    "gemini": "backends.gemini",
    "perplexity": "backends.perplexity",
    "xai": "backends.xai",
}


def names() -> list[str]:
    """Every backend name: the built-in ones and those third-party packages register."""
    return sorted({*BUILTIN, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})


def _factory(name: str) -> Callable[[AgentConfig], Backend]:
    try:
        if name in BUILTIN:
            module = importlib.import_module(BUILTIN[name])
            factory = module.create
        else:
            (ep,) = entry_points(group=ENTRY_POINT_GROUP, name=name) or [None]
            if ep is None:
                raise RunAgentError(f"unknown backend {name!r}; known: {', '.join(names())}")
            loaded = ep.load()
            factory = getattr(loaded, "create", loaded)
    except RunAgentError:
        raise
    except Exception as exc:  # a broken module must not take run-agent down with it
        raise MissingDependencyError(
            f"backend {name!r} failed to load ({type(exc).__name__}: {exc}); "
            "reinstall the package that provides it"
        ) from exc
    return factory  # type: ignore[no-any-return]


def create(config: AgentConfig) -> Backend:
    """The backend object for one configured agent."""
    return _factory(config.type)(config)
