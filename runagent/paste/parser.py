"""Reading a reply: the command blocks in it, by the spec's parsing rules, tolerant of what chat
windows do to text.

The rules: an opening tag is `[NAME` at the start of a trimmed line; attributes are `key="value"`;
a body is every line after the opening tag, verbatim, up to the line that is exactly `[/NAME]`
once trimmed; DELETE_FILE and READ_FILE have no body; text between blocks is ignored.

Tolerated: CRLF and lone CR line ends, a byte-order mark, typographic or single quotes around
attribute values, `startLine`/`start-line` for `start_line`, a block or the whole reply inside a
markdown code fence (fence lines outside blocks are text), a closing tag after a self-closing
command, and a one-line block (`[MESSAGE]hi[/MESSAGE]`). Whatever cannot be read becomes a
`Problem`, fed back to the model; nothing here raises on any text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from runagent.paste.protocol import REQUIRED, SELF_CLOSING, Name

OPENING = re.compile(r"\[([A-Z][A-Z_]*)(?=[\s\]/])(.*)$")
# A tag-shaped line that names no command: a typo the model should hear about. Markdown's own
# bracketed text ("[x] done", "[1]: http://...") is not upper case with an underscore or 4+ letters.
TAG_LIKE = re.compile(r"\[/?([A-Z][A-Z_]{3,})(?:\s[^\]]*)?/?\]$")
QUOTES = "\"'\u201c\u201d\u201e\u201f\u2018\u2019\u201a\u201b\u00ab\u00bb\u2033\u2032"
ATTRIBUTE = re.compile(
    rf"([A-Za-z][\w-]*)\s*=\s*(?:[{QUOTES}]([^{QUOTES}]*)[{QUOTES}]|([^\s\]{QUOTES}]+))"
)
LINE_ATTRIBUTES = ("start_line", "end_line")


@dataclass(frozen=True)
class Command:
    """One command block: its name, attributes, body (None for a self-closing command) and the
    line of the reply it starts on."""

    name: Name
    attributes: Mapping[str, str] = field(default_factory=dict)
    body: str | None = None
    line: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "attributes", MappingProxyType(dict(self.attributes)))

    @property
    def path(self) -> str:
        return self.attributes.get("path", "")

    def number(self, key: str) -> int:
        """An attribute the parser checked is a whole number."""
        return int(self.attributes[key])


@dataclass(frozen=True)
class Problem:
    """A block that could not be read, at `line`; `command` is the name it seemed to have."""

    command: str
    message: str
    line: int


Item = Command | Problem


def normalize(text: str) -> str:
    """The reply with Unix line ends and no byte-order mark."""
    return text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


def parse(text: str) -> list[Item]:
    """Every command block of a reply, in order, and a Problem for each block that is broken."""
    lines = normalize(text).split("\n")
    items: list[Item] = []
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        i += 1
        opening = OPENING.match(stripped)
        name = _name(opening.group(1)) if opening else None
        if opening is None or name is None:
            odd = TAG_LIKE.match(stripped)
            if odd and _name(odd.group(1)) is None:
                items.append(Problem(odd.group(1), f"unknown command [{odd.group(1)}]", i))
            elif odd and stripped.startswith("[/"):
                items.append(
                    Problem(
                        odd.group(1), f"[/{odd.group(1)}] closes a block that was not opened", i
                    )
                )
            continue
        item, i = _block(name, opening.group(2), lines, i)
        items.append(item)
    return items


def _name(word: str) -> Name | None:
    try:
        return Name(word)
    except ValueError:
        return None


def _block(name: Name, rest: str, lines: list[str], i: int) -> tuple[Item, int]:
    """The block whose opening tag was line `i` (1-based), and the index after it."""
    closing = f"[/{name}]"
    head, inline = _split_tag(rest, closing)
    attributes = _attributes(head)
    if name in SELF_CLOSING:
        command = _checked(Command(name, attributes, None, i), i)
        # A closing tag the model added anyway (the next non-blank line) belongs to the block.
        j = i
        while j < len(lines) and not lines[j].strip():
            j += 1
        return command, (j + 1 if j < len(lines) and lines[j].strip() == closing else i)
    if inline is not None:
        return _checked(Command(name, attributes, inline, i), i), i
    opened = i
    body: list[str] = []
    while i < len(lines):
        if lines[i].strip() == closing:
            return _checked(Command(name, attributes, "\n".join(body), opened), opened), i + 1
        body.append(lines[i])
        i += 1
    shown = f"[{name}{' ' + head.strip() if head.strip() else ''}]"
    # The lines after an unclosed tag are read again as commands: a forgotten closing tag
    # costs only its own block.
    return Problem(name, f"{shown} is not closed: no {closing} line follows it", opened), opened


def _split_tag(rest: str, closing: str) -> tuple[str, str | None]:
    """The attribute text of an opening tag, and the body when the block is on one line."""
    end = rest.find("]")
    while end >= 0 and _inside_quotes(rest[:end]):
        end = rest.find("]", end + 1)
    if end < 0:
        return rest, None
    head, after = rest[:end].rstrip("/ "), rest[end + 1 :]
    if after.strip().endswith(closing):
        return head, after.strip()[: -len(closing)]
    return head, None


def _inside_quotes(text: str) -> bool:
    return sum(text.count(q) for q in QUOTES) % 2 == 1


def _attributes(head: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for match in ATTRIBUTE.finditer(head):
        key = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", match.group(1)).replace("-", "_").lower()
        value = match.group(2) if match.group(2) is not None else match.group(3)
        found.setdefault(key, value)
    return found


def _checked(command: Command, line: int) -> Item:
    """The command, or a Problem naming the attribute that is missing or not a number."""
    for key in REQUIRED.get(command.name, ()):
        value = command.attributes.get(key, "")
        if not value.strip():
            return Problem(command.name, f'[{command.name}] has no {key}="..." attribute', line)
    if command.name is Name.EDIT_FILE:
        for key in LINE_ATTRIBUTES:
            value = command.attributes[key].strip()
            if not value.isascii() or not value.isdigit() or int(value) < 1:
                return Problem(
                    command.name, f"{key}={value!r} is not a line number (a whole number from 1)",
                    line,
                )  # fmt: skip
        if command.number("end_line") < command.number("start_line"):
            return Problem(
                command.name,
                f"end_line {command.number('end_line')} is before start_line "
                f"{command.number('start_line')}",
                line,
            )
    return command
