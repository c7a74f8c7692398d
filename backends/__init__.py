"""The backend registry: one line per built-in backend, plus the `runagent.backends` entry points.

A line names where the backend's class is and the provider variable prefixes it owns. Each
backend is handed the prefixes of every other registered one, so an agent never sees another
provider's credentials, and a new provider needs no edit anywhere else. Modules load only when
used, so a broken backend breaks only itself.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Collection, Iterator, Sequence
from importlib.machinery import PathFinder
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runagent.config import parsed
from runagent.config.settings import AgentConfig, Mode
from runagent.errors import ConfigError, MissingDependencyError, NotFoundError, RunAgentError
from runagent.record import record

if TYPE_CHECKING:  # the interface loads with the first backend, not with the registry
    from runagent.backend import Backend, LineRule

ENTRY_POINT_GROUP = "runagent.backends"


@record
class Registered:
    """A built-in backend: `module:Class` (or a module with `create(config)`), and the prefixes
    of the provider variables (keys, endpoints) that belong to it and to no other agent."""

    target: str
    prefixes: tuple[str, ...] = ()


BUILTIN: dict[str, Registered] = {
    "chat_completions": Registered(
        "backends.chat_completions:ChatCompletionsBackend", ("CHAT_COMPLETIONS_",)
    ),
    "claude": Registered("backends.claude:ClaudeBackend", ("ANTHROPIC_", "CLAUDE_")),
    "codex": Registered("backends.codex:CodexBackend", ("OPENAI_", "CODEX_")),
    "command": Registered("backends.command:CommandBackend"),
    "gemini": Registered("backends.gemini:GeminiBackend", ("GEMINI_", "GOOGLE_")),
    "paste": Registered("backends.paste:PasteBackend"),
    "perplexity": Registered("backends.perplexity:PerplexityBackend", ("PERPLEXITY_",)),
    "xai": Registered("backends.xai:XaiBackend", ("XAI_",)),
}


def _entry_points(name: str | None = None) -> list[Any]:
    # Importing importlib.metadata and reading every distribution costs each run ~12 ms, and
    # most installations declare no backend at all: look for one cheaply first.
    if not _declared():
        return []
    from importlib.metadata import entry_points

    found = entry_points(group=ENTRY_POINT_GROUP)
    return [ep for ep in found if name is None or ep.name == name]


def _declared() -> bool:
    """False only when no distribution on sys.path can declare a backend (each one's
    entry_points.txt lacks the group); True when one may. The answer is kept
    (runagent/config/parsed.py) while no distribution's entry_points.txt changes: a command
    would otherwise read every installed package's file each time it starts."""
    if any(f is not PathFinder and hasattr(f, "find_distributions") for f in sys.meta_path):
        return True  # distributions found some other way: only importlib.metadata can tell
    files: list[Path] = []
    for folder in sys.path:
        try:
            entries = list(os.scandir(folder or "."))
        except NotADirectoryError:
            return True  # a zip archive may hold distributions
        except OSError:
            continue  # a folder that is not there (or a path hook's name) holds none
        files += [Path(e.path, "entry_points.txt") for e in entries
                  if e.name.endswith((".dist-info", ".egg-info"))]  # fmt: skip
    stamps = [_stamp(f) for f in files]
    return bool(parsed.remembered("entry-points", stamps, lambda: _any_declares(files), os.environ))


def _stamp(file: Path) -> list[object]:
    """What tells a changed file: its path, size, modification and change times."""
    try:
        st = file.stat()
    except OSError:
        return [str(file)]
    return [str(file), st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _any_declares(files: list[Path]) -> bool:
    section = f"[{ENTRY_POINT_GROUP}]"
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # importlib.metadata finds no entry points there either
        if section in text:
            return True
    return False


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


def owned_prefixes() -> dict[str, tuple[str, ...]]:
    """The provider variable prefixes of every registered backend, by name.

    A backend from another package states its own as `env_prefixes` on the class its entry
    point names; one that fails to load cannot run, and is left out.
    """
    owned = {name: line.prefixes for name, line in BUILTIN.items()}
    for ep in _entry_points():
        if ep.name in owned:
            continue  # a built-in name is never replaced
        try:
            prefixes = getattr(ep.load(), "env_prefixes", ())
        except Exception:  # it says why when it is asked to run
            continue
        owned[ep.name] = (prefixes,) if isinstance(prefixes, str) else tuple(prefixes)
    return owned


def _load(target: str) -> Any:
    module, _, attribute = target.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, attribute) if attribute else loaded


def _loaded(name: str) -> Any:
    """What the registry line or entry point of backend `name` names, loaded: a Backend class,
    a create(config) function, or a module that has one."""
    try:
        if name in BUILTIN:
            return _load(BUILTIN[name].target)
        found = _entry_points(name)
        if not found:
            raise NotFoundError(f"unknown backend {name!r}; known: {', '.join(names())}")
        return found[0].load()
    except RunAgentError:
        raise
    except Exception as exc:  # a broken module must not take run-agent down with it
        raise MissingDependencyError(
            f"backend {name!r} failed to load ({type(exc).__name__}: {exc}); "
            "reinstall the package that provides it"
        ) from exc


def _factory(name: str) -> Callable[[AgentConfig], Backend]:
    loaded = _loaded(name)
    return getattr(loaded, "create", loaded)  # type: ignore[no-any-return]


def lines_of(name: str) -> Sequence[LineRule]:
    """How the stdout lines of backend `name`'s agent read (runagent/loop/lines.py): the `lines`
    of its class, or of the module whose create(config) makes it; none where it states none."""
    lines: Sequence[LineRule] = getattr(_loaded(name), "lines", ())
    return lines  # runagent.loop.lines.checked says what is wrong with a list not well made


def create(config: AgentConfig) -> Backend:
    """The backend object for one configured agent, told which provider variables are whose."""
    backend = _factory(config.type)(config)
    if config.mode is Mode.AGENT and not getattr(backend, "agent_mode", False):
        raise ConfigError(
            f"agents.{config.name}.mode: 'agent' is for the chat-completions backends "
            f"(perplexity, xai, chat_completions), not {config.type!r}, which acts on its own"
        )
    owned = owned_prefixes()
    if config.type in BUILTIN:
        backend.env_prefixes = owned[config.type]
    backend.foreign_prefixes = tuple(
        sorted({p for name, prefixes in owned.items() if name != config.type for p in prefixes})
    )
    return backend
