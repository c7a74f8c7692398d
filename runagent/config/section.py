"""One mapping of config.yaml, read with its key path, so every error names the key, the value
and, where it can, what was meant."""

from __future__ import annotations

import enum
from collections.abc import Collection
from typing import Any, TypeVar

from runagent.duration import parse_duration
from runagent.errors import ConfigError, shown

E = TypeVar("E", bound=enum.Enum)
# A flag written as a word (YAML 1.2 reads only true/false as booleans): still what it says.
WORDS_FOR_BOOL = {"yes": True, "no": False, "on": True, "off": False}


def did_you_mean(word: str, choices: Collection[str]) -> str:
    import difflib  # only a config with a mistake pays for it

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else ""


class Section:
    """A mapping from the YAML file that knows its own key path, for error messages."""

    def __init__(self, data: Any, path: str) -> None:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(
                f"{path or 'the file'}: expected a mapping of keys, got {shown(data)}"
            )
        self.data: dict[Any, Any] = data
        self.path = path

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def has(self, name: str) -> bool:
        return name in self.data

    def get(self, name: str, default: Any) -> Any:
        value = self.data.get(name, default)
        return default if value is None else value

    def only(self, *allowed: str) -> None:
        for name in self.data:
            if name not in allowed:
                hint = did_you_mean(str(name), allowed) or f"known keys: {', '.join(allowed)}"
                raise ConfigError(f"{self.key(str(name))}: unknown key; {hint}")

    def section(self, name: str) -> Section:
        return Section(self.data.get(name), self.key(name))

    def items_as_sections(self) -> list[tuple[str, Section]]:
        return [(str(k), Section(v, self.key(str(k)))) for k, v in self.data.items()]

    def string(self, name: str) -> str | None:
        value = self.data.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ConfigError(f"{self.key(name)}: {shown(value)} is not a string")
        return str(value)

    def argv(self, name: str) -> tuple[str, ...]:
        value = self.data.get(name)
        if value is None:
            return ()
        if isinstance(value, str):
            raise ConfigError(
                f"{self.key(name)}: {shown(value)} is a string; write the command as a list, "
                f"e.g. {shown(_words(value), limit=200)}"
            )
        if not isinstance(value, list) or not all(
            isinstance(v, str | int | float) and not isinstance(v, bool) for v in value
        ):
            raise ConfigError(f"{self.key(name)}: {shown(value)} is not a list of strings")
        return tuple(str(v) for v in value)

    def string_map(self, name: str) -> dict[str, str]:
        value = self.data.get(name) or {}
        if not isinstance(value, dict):
            raise ConfigError(f"{self.key(name)}: {shown(value)} is not a mapping of NAME: value")
        out: dict[str, str] = {}
        for k, v in value.items():
            if not isinstance(k, str) or isinstance(v, dict | list) or v is None:
                raise ConfigError(f"{self.key(name)}.{k}: {shown(v)} is not a plain value")
            out[k] = str(v).lower() if isinstance(v, bool) else str(v)
        return out

    def count(self, name: str, default: int) -> int:
        value = self.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{self.key(name)}: {shown(value)} is not a whole number >= 0")
        return value

    def choice(self, name: str, kind: type[E], default: E) -> E:
        """The member of the enum `kind` the key names by value; `default` when it is unset."""
        value = self.string(name)
        return member(kind, value, self.key(name)) if value else default

    def choices(self, name: str, kind: type[E]) -> list[E]:
        """The members of the enum `kind` a list of values names; empty when it is unset."""
        return [member(kind, value, self.key(name)) for value in self.argv(name)]

    def flag(self, name: str, default: bool) -> bool:
        value = self.get(name, default)
        if isinstance(value, str) and value.lower() in WORDS_FOR_BOOL:
            return WORDS_FOR_BOOL[value.lower()]  # yes/no and on/off still mean what they say
        if not isinstance(value, bool):
            raise ConfigError(f"{self.key(name)}: {shown(value)} is not true or false")
        return value

    def duration(self, name: str, default: float | None) -> float | None:
        if name not in self.data:
            return default
        return parse_duration(self.data[name], self.key(name))


def member(kind: type[E], value: str, where: str) -> E:
    for member in kind:
        if member.value == value:
            return member
    choices = ", ".join(str(m.value) for m in kind)
    raise ConfigError(f"{where}: {shown(value)} is not one of: {choices}")


def _words(command: str) -> list[str]:
    """A command line given as one string, split as a shell would (as a list it keeps each word
    whole, quotes and all, where the shell's split cannot be made)."""
    import shlex

    try:
        return shlex.split(command)
    except ValueError:  # an unclosed quote
        return command.split()
