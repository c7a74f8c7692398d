"""The backend registry: one line per built-in backend, plus the `runagent.backends` entry points.

Modules load only when used, so a broken backend breaks only itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Iterator
from typing import Any

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


def _entry_points(name: str | None = None) -> list[Any]:
    # importlib.metadata scans every installed distribution: only pay for it when needed.
    from importlib.metadata import entry_points

    found = entry_points(group=ENTRY_POINT_GROUP)
    return [ep for ep in found if name is None or ep.name == name]


def names() -> list[str]:
    """Every backend name: the built-in ones and those third-party packages register."""
    return sorted({*BUILTIN, *(ep.name for ep in _entry_points())})


class _Known(Collection[str]):
    """Backend names that answer `in` for a built-in name without scanning distributions."""

    def __contains__(self, name: object) -> bool:
        return name in BUILTIN or (isinstance(name, str) and bool(_entry_points(name)))

    def __iter__(self) -> Iterator[str]:
        return iter(names())

    def __len__(self) -> int:
        return len(names())


def known() -> Collection[str]:
    return _Known()


def _factory(name: str) -> Callable[[AgentConfig], Backend]:
    try:
        if name in BUILTIN:
            module = importlib.import_module(BUILTIN[name])
            factory = module.create
        else:
            found = _entry_points(name)
            if not found:
                raise RunAgentError(f"unknown backend {name!r}; known: {', '.join(names())}")
            loaded = found[0].load()
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
