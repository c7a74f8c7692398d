"""The simple commands, assignments and redirections a bash command line is made of, read with the
tree-sitter bash grammar."""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from runagent.record import record

if TYPE_CHECKING:
    from tree_sitter import Node, Parser

# A word is its text once quotes and escapes are gone, or None when only the running shell knows
# it (a parameter expansion, a substitution, a brace expansion that may become several words).
Word = str | None

WRITE_OPERATORS = frozenset({">", ">>", ">|", "&>", "&>>", ">&", "<>"})


class Stdin(enum.Enum):
    """Where a simple command's standard input comes from, as far as the text says."""

    INHERITED = "inherited"
    PIPE = "pipe"  # an earlier stage of a pipeline, or a >(...) substitution
    TEXT = "text"  # a heredoc or here-string whose text is known
    COMPUTED = "computed"  # a heredoc or here-string with expansions in it
    FILE = "file"


@record
class Assignment:
    """`NAME=value`, before a command or on its own; value None when it is computed."""

    name: str
    value: Word


@record
class Redirect:
    """A redirection to or from a file; `target` None when the file name is computed."""

    operator: str
    target: Word

    @property
    def writes(self) -> bool:
        return self.operator in WRITE_OPERATORS


@record
class SimpleCommand:
    """One argv the shell will run, with what feeds its standard input."""

    words: tuple[Word, ...]
    assignments: tuple[Assignment, ...] = ()
    stdin: Stdin = Stdin.INHERITED
    stdin_text: str | None = None
    # The first words of the pipeline stages before this one: `curl x | sh` gives ("curl",).
    upstream: tuple[Word, ...] = ()


Step = SimpleCommand | Redirect | Assignment


@record
class Script:
    """A parsed command line: its steps in the order the shell meets them, and what could not be
    read (any problem makes the whole line unknown to a policy)."""

    steps: tuple[Step, ...]
    problems: tuple[str, ...]


@functools.cache
def _parser() -> Parser:
    # Imported here so that importing the policy costs nothing until a command is judged.
    import tree_sitter
    import tree_sitter_bash

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))


def parse(command: str) -> Script:
    """The steps of `command`; never raises: what the grammar cannot read becomes a problem."""
    tree = _parser().parse(command.encode("utf-8", "surrogateescape"))
    reader = _Reader()
    reader.visit(tree.root_node, _Feed())
    if tree.root_node.has_error and not reader.problems:
        # A missing token (`ls |`, `echo $(ls`) is an unnamed node the walk does not meet.
        reader.problems.append(f"bash finds {command[:60]!r} incomplete")
    return Script(tuple(reader.steps), tuple(reader.problems))


@record
class _Feed:
    stdin: Stdin = Stdin.INHERITED
    text: str | None = None
    upstream: tuple[Word, ...] = ()


def _text(node: Node) -> str:
    return (node.text or b"").decode("utf-8", "replace")


@dataclass
class _Reader:
    steps: list[Step] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def visit(self, node: Node, feed: _Feed) -> None:
        kind = node.type
        if kind == "ERROR" or node.is_missing:
            self.problems.append(f"bash cannot parse {_text(node)[:60]!r}")
        elif kind == "command":
            self._command(node, feed)
        elif kind == "pipeline":
            self._pipeline(node.named_children, feed)
        elif kind == "redirected_statement":
            self._redirected(node, feed)
        elif kind in ("file_redirect", "heredoc_redirect", "herestring_redirect"):
            self._redirect(node, None)
        elif kind == "variable_assignment":
            self._assignment(node)
        elif kind == "process_substitution":
            # `tee >(sh)` feeds sh from a pipe, like `| sh`.
            writes = bool(node.children) and node.children[0].type == ">("
            inner = _Feed(Stdin.PIPE) if writes else _Feed()
            for child in node.named_children:
                self.visit(child, inner)
        elif kind in ("command_substitution", "function_definition", "subshell"):
            inner = feed if kind == "subshell" else _Feed()
            for child in node.named_children:
                self.visit(child, inner)
        elif kind != "comment":
            for child in node.named_children:
                self.visit(child, feed)

    def _pipeline(self, stages: list[Node], feed: _Feed) -> None:
        upstream: list[Word] = list(feed.upstream)
        for index, stage in enumerate(stages):
            self.visit(stage, feed if index == 0 else _Feed(Stdin.PIPE, None, tuple(upstream)))
            upstream.append(_first_word(stage))

    def _redirected(self, node: Node, feed: _Feed) -> None:
        body = node.child_by_field_name("body")
        # The grammar hangs `cd d && echo x > f` as (cd && echo) > f, though the redirection is
        # the last command's alone: after a list it comes last, so it sees the cd. Elsewhere it
        # is set up before the body runs, so it comes first.
        late = body is not None and body.type == "list"
        if late and body is not None:
            self.visit(body, feed)
        for redirect in node.children_by_field_name("redirect"):
            feed = self._redirect(redirect, body) or feed
        if body is not None and not late:
            self.visit(body, feed)

    def _redirect(self, node: Node, body: Node | None) -> _Feed | None:
        """Record a redirection; the input it gives the statement's body, if it gives one."""
        kind = node.type
        if kind == "file_redirect":
            operator = next((c.type for c in node.children if not c.is_named), "")
            target = node.child_by_field_name("destination")
            value = self.word(target) if target is not None else None
            duplicate = (target is not None and target.type == "number") or value == "-"
            if operator in (">&", "<&") and duplicate:
                return None  # 2>&1, >&2, <&-: descriptors, no file
            self.steps.append(Redirect(operator, value))
            return _Feed(Stdin.FILE) if operator in ("<", "<>") else None
        if kind == "herestring_redirect":
            word = next(iter(node.named_children), None)
            value = self.word(word) if word is not None else None
            return _Feed(Stdin.TEXT, value + "\n") if value is not None else _Feed(Stdin.COMPUTED)
        if kind != "heredoc_redirect":
            self.visit(node, _Feed())
            return None
        quoted = False
        result = _Feed(Stdin.TEXT, "")
        for child in node.named_children:
            if child.type == "heredoc_start":
                quoted = any(mark in _text(child) for mark in "'\"\\")
            elif child.type == "heredoc_body":
                expands = not quoted and any(c.type != "heredoc_content" for c in child.children)
                if expands:
                    for part in child.named_children:
                        self.visit(part, _Feed())
                result = _Feed(Stdin.COMPUTED) if expands else _Feed(Stdin.TEXT, _text(child))
            elif child.type == "pipeline":
                # `cat <<EOF | sh`: the grammar keeps the rest of the pipeline in the heredoc.
                first = _first_word(body) if body is not None else None
                for stage in child.named_children:
                    self.visit(stage, _Feed(Stdin.PIPE, None, (first,)))
            elif child.type not in ("heredoc_end",):
                # `cat <<EOF > f`, and `cat <<EOF && rm x`, which the grammar also keeps here.
                self.visit(child, _Feed())
        return result

    def _assignment(self, node: Node) -> Assignment:
        name = node.child_by_field_name("name")
        value = node.child_by_field_name("value")
        if name is not None and name.type != "variable_name":
            self.visit(name, _Feed())  # a[$(cmd)]=1 runs cmd
        assignment = Assignment(
            _text(name) if name is not None else "",
            self.word(value) if value is not None else "",
        )
        self.steps.append(assignment)
        return assignment

    def _command(self, node: Node, feed: _Feed) -> None:
        words: list[Word] = []
        assignments: list[Assignment] = []
        for child in node.named_children:
            if child.type == "variable_assignment":
                assignments.append(self._assignment(child))
            elif child.type in ("file_redirect", "heredoc_redirect", "herestring_redirect"):
                feed = self._redirect(child, node) or feed
            elif child.type == "command_name":
                words.append(self.word(child.named_children[0]) if child.named_children else None)
            elif child.type != "comment":
                words.append(self.word(child))
        self.steps.append(
            SimpleCommand(tuple(words), tuple(assignments), feed.stdin, feed.text, feed.upstream)
        )

    def word(self, node: Node) -> Word:
        """The text of a word once the shell has removed quotes; None if it is computed. Commands
        inside it (substitutions) are recorded as steps of their own."""
        kind = node.type
        if kind == "word":
            return _unescape(_text(node), set())
        if kind == "number":
            return _text(node)
        if kind == "raw_string":
            return _text(node)[1:-1]
        if kind == "ansi_c_string":
            body = _text(node)[2:-1]
            return None if "\\" in body else body
        parts: list[Word] = []
        if kind == "string":
            for child in node.named_children:
                if child.type == "string_content":
                    parts.append(_unescape(_text(child), {"$", "`", '"', "\\", "\n"}))
                else:
                    parts.append(self.word(child))
            return None if None in parts else "".join(p for p in parts if p is not None)
        if kind == "concatenation":
            children = node.named_children
            parts = [self.word(child) for child in children]
            # An unquoted `{` starts a brace expansion (`{rm,-rf,x}` is three words).
            brace = any(c.type == "word" and _text(c) == "{" for c in children)
            if (brace and ("," in _text(node) or ".." in _text(node))) or None in parts:
                return None
            return "".join(p for p in parts if p is not None)
        self.visit(node, _Feed())
        return None


def _unescape(text: str, escapable: set[str]) -> str:
    """Remove backslash escapes: every one in a bare word, only `escapable` ones in quotes."""
    if "\\" not in text:
        return text
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char == "\\" and index + 1 < len(text):
            following = text[index + 1]
            if not escapable or following in escapable:
                if following != "\n":
                    out.append(following)
                index += 2
                continue
        out.append(char)
        index += 1
    return "".join(out)


def _first_word(node: Node | None) -> Word:
    """The command name of the first simple command in `node`, for naming a pipeline's stages."""
    if node is None:
        return None
    if node.type == "command":
        name = node.child_by_field_name("name")
        if name is None or not name.named_children:
            return None
        text = _text(name.named_children[0])
        return text.rsplit("/", 1)[-1]
    for child in node.named_children:
        if child.type not in ("file_redirect", "heredoc_redirect", "herestring_redirect"):
            return _first_word(child)
    return None
