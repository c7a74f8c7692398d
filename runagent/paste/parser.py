"""Reading a reply: the command blocks in it, by the spec's parsing rules, tolerant of what chat
windows do to text.

The rules: an opening tag is `[NAME` at the start of a trimmed line; attributes are `key="value"`;
a body is every line after the opening tag, verbatim, up to the line that is exactly `[/NAME]`
once trimmed; DELETE_FILE and READ_FILE have no body; text between blocks is ignored.

Refused, never guessed at: an attribute given twice, and text after a self-closing tag on its
line (a tag shown, as in `[DELETE_FILE path="x"] <- like this`, not a command), or after any
other tag that no closing tag follows (`[DONE] All tasks complete.`: as CodingAgent, no tag,
and what follows is read on; docs/guides/paste.md, "Reading the spec").

Tolerated: CRLF and lone CR line ends, a byte-order mark, typographic or single quotes around
attribute values, `startLine`/`start-line` for `start_line`, a block or the whole reply inside a
markdown code fence (fence lines outside blocks are text), a closing tag after a self-closing
command, a closing tag with a fence's backticks after it, and a one-line block
(`[MESSAGE]hi[/MESSAGE]`). Whatever cannot be read becomes a `Problem`, fed back to the model;
after an unclosed block nothing more is read (its lines were meant as content). Nothing here
raises on any text, and each line is read once (a long reply costs linear time).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import field
from types import MappingProxyType

from runagent.paste.protocol import REQUIRED, SELF_CLOSING, Name
from runagent.record import record

OPENING = re.compile(r"\[([A-Z][A-Z_]*)(?=[\s\]/])(.*)$")
# A tag-shaped line that names no command: a typo the model should hear about. Markdown's own
# bracketed text ("[x] done", "[1]: http://...") is not upper case with an underscore or 4+ letters.
TAG_LIKE = re.compile(r"\[/?([A-Z][A-Z_]{3,})(?:\s[^\]]*)?/?\]$")
# Quotes a chat window may put around a value: each kind closes with any quote of its kind, so an
# apostrophe inside a double-quoted value is part of it.
DOUBLE = '"\u201c\u201d\u201e\u201f\u2033\u00ab\u00bb'
SINGLE = "'\u2018\u2019\u201a\u201b\u2032"
# Names start only at a word's start, and are taken whole: a long run of letters is one try,
# not one per letter (which made a long tag quadratic).
ATTRIBUTE = re.compile(
    rf"(?<![\w-])([A-Za-z][\w-]*+)\s*=\s*(?:[{DOUBLE}]([^{DOUBLE}]*)[{DOUBLE}]|[{SINGLE}]([^{SINGLE}]*)[{SINGLE}]"
    rf"|([^\s\]{DOUBLE}{SINGLE}]+))"
)
FENCE_AFTER = re.compile(r"\s*`{3,}\s*[\w+-]*\s*")
LINE_ATTRIBUTES = ("start_line", "end_line")
MAX_DIGITS = 9  # a line number longer than this is no file's


@record
class Command:
    """One command block: its name, attributes, body lines (None for a self-closing command) and
    the line of the reply it starts on. A body of one empty line is one line, not none."""

    name: Name
    attributes: Mapping[str, str] = field(default_factory=dict)
    lines: tuple[str, ...] | None = None  # the body's lines, verbatim
    line: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "attributes", MappingProxyType(dict(self.attributes)))

    @property
    def body(self) -> str | None:
        return None if self.lines is None else "\n".join(self.lines)

    @property
    def path(self) -> str:
        return self.attributes.get("path", "")

    def number(self, key: str) -> int:
        """An attribute the parser checked is a whole number."""
        return int(self.attributes[key])


@record
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
    closed = _last_closings(lines)
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
        item, i = _block(name, opening.group(2), lines, i, closed)
        items.append(item)
    return items


def _name(word: str) -> Name | None:
    try:
        return Name(word)
    except ValueError:
        return None


def _last_closings(lines: list[str]) -> dict[str, int]:
    """The index of the last line that closes a block of each name (read once for the reply)."""
    found: dict[str, int] = {}
    for k, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("[/") and "]" in stripped:
            closing = stripped[: stripped.index("]") + 1]
            if _closes(stripped, closing):
                found[closing] = k
    return found


def _block(
    name: Name, rest: str, lines: list[str], i: int, closed: Mapping[str, int]
) -> tuple[Item, int]:
    """The block whose opening tag was line `i` (1-based), and the index after it; `closed`:
    the last line closing each kind of block."""
    closing = f"[/{name}]"
    head, after = _split_tag(rest)
    attributes, repeated = _attributes(head)
    if name in SELF_CLOSING:
        command = _checked(Command(name, attributes, None, i), i, repeated)
        if after is not None and not _alone(after, closing):
            # `[DELETE_FILE path="x"] <- like this` shows a tag; it does not ask for one.
            command = Problem(
                name,
                f"[{name}] has text after its tag ({_short(after.strip())!r}), so it is not a "
                "command and was not carried out; put a command's tag alone on its line",
                i,
            )
        # A closing tag the model added anyway (the next non-blank line) belongs to the block.
        j = i
        while j < len(lines) and not lines[j].strip():
            j += 1
        return command, (j + 1 if j < len(lines) and _closes(lines[j], closing) else i)
    if after is not None and after.strip().endswith(closing):  # [MESSAGE]hi[/MESSAGE]
        inline = after.strip()[: -len(closing)]
        return _checked(Command(name, attributes, (inline,), i), i, repeated), i
    if after is not None and not _alone(after, closing) and closed.get(closing, -1) < i:
        # `[DONE] All tasks complete.`: a tag with text after it that nothing closes is no
        # command (as CodingAgent reads it), and what follows is read on.
        return Problem(
            name,
            f"[{name}] has text after its tag ({_short(after.strip())!r}) and no {closing} "
            "follows, so it is not a command and was not carried out; put the tag alone on its "
            f"line, the text on the lines after it, then {closing}",
            i,
        ), i
    opened = i
    body: list[str] = []
    while i < len(lines):
        if _closes(lines[i], closing):
            command = Command(name, attributes, tuple(body), opened)
            return _checked(command, opened, repeated), i + 1
        body.append(lines[i])
        i += 1
    attributes_shown = head.strip() if len(head.strip()) <= 100 else head.strip()[:97] + "..."
    shown = f"[{name}{' ' + attributes_shown if attributes_shown else ''}]"
    # What follows an unclosed tag is what the model meant as its content: none of it is read
    # as commands (a file's text could hold command blocks).
    why = f"{shown} is not closed: no {closing} line follows it; nothing after it was carried out"
    return Problem(name, why, opened), len(lines)


def _closes(line: str, closing: str) -> bool:
    """Whether `line` is the closing tag: alone once trimmed, or with a code fence after it
    (```, ``` python: a chat window's rendering)."""
    stripped = line.strip()
    return stripped == closing or (
        stripped.startswith(closing) and FENCE_AFTER.fullmatch(stripped[len(closing) :]) is not None
    )


def _alone(after: str, closing: str) -> bool:
    """Whether what follows a self-closing tag's `]` leaves it alone on its line: nothing, its
    closing tag, or a code fence's backticks (a chat window's rendering)."""
    stripped = after.strip()
    return not stripped or _closes(stripped, closing) or FENCE_AFTER.fullmatch(stripped) is not None


def _short(text: str, limit: int = 60) -> str:
    """`text` at most `limit` characters long, for a problem's message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _split_tag(rest: str) -> tuple[str, str | None]:
    """The attribute text of an opening tag, and what follows its `]` (None: no `]`), reading
    the line once: a `]` inside a quoted value does not end the tag."""
    quote = ""  # the kind of quote a value is open in
    before = "="
    for k, c in enumerate(rest):
        if quote:
            if c in quote:
                quote = ""
        elif c in DOUBLE and before == "=":
            quote = DOUBLE
        elif c in SINGLE and before == "=":
            quote = SINGLE
        elif c == "]":
            return rest[:k].rstrip("/ "), rest[k + 1 :]
        if not c.isspace():
            before = c
    return rest, None


def _attributes(head: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The attributes of a tag by their spec names, and every value of each name given more
    than once (`startLine` and `start_line` are one name)."""
    found: dict[str, str] = {}
    repeated: dict[str, list[str]] = {}
    for match in ATTRIBUTE.finditer(head):
        key = re.sub(r"(?<=[a-z])(?=[A-Z])", "_", match.group(1)).replace("-", "_").lower()
        value = next(v for v in match.groups()[1:] if v is not None)
        if key in found:
            repeated.setdefault(key, [found[key]]).append(value)
        else:
            found[key] = value
    return found, repeated


def _checked(command: Command, line: int, repeated: Mapping[str, list[str]]) -> Item:
    """The command, or a Problem naming the attribute that is given twice, missing or not a
    number. Of an attribute given twice neither value is taken: which one was meant is a guess."""
    for key, values in repeated.items():
        shown = ", ".join(f'{key}="{_short(v, 40)}"' for v in values)
        return Problem(
            command.name,
            f"[{command.name}] gives the attribute {key} {len(values)} times ({shown}), so it "
            "was not carried out; give each attribute once",
            line,
        )
    for key in REQUIRED.get(command.name, ()):
        value = command.attributes.get(key, "")
        if not value.strip():
            return Problem(command.name, f'[{command.name}] has no {key}="..." attribute', line)
    if command.name is Name.EDIT_FILE:
        for key in LINE_ATTRIBUTES:
            value = command.attributes[key].strip()
            if not (value.isascii() and value.isdigit() and len(value) <= MAX_DIGITS) or (
                int(value) < 1
            ):
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
