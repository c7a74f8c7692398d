"""Carrying out a reply's commands through the operations runtime, and what the next outbox shows.

Each command becomes one operations message of one operation, so the runtime's workspace sandbox,
shell policy, approvals and journals (operations.jsonl, events.jsonl) are the same ones an
agent-mode run has: CREATE_FILE is createFile with overwrite, EDIT_FILE an editFile of the whole
file with its line range spliced, DELETE_FILE deleteFile, READ_FILE readFile, RUN_COMMAND a shell
operation of 30 s (/bin/sh -c), MESSAGE a message. What the policy holds for approval waits for
the person at the keyboard.

Commands run in order, as the spec says: an EDIT_FILE's line range refers to the file as the
commands before it left it (so two edits of one file in one reply are numbered as CodingAgent
numbers them), and an end_line past the file's last line means "to the end", as there.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from runagent.ops.event import EventsMessage
from runagent.ops.operation import path_problem
from runagent.ops.protocol import EventType, Status
from runagent.ops.runtime import Runtime
from runagent.ops.workspace import WorkspaceError
from runagent.paste.parser import Command, Item, Problem
from runagent.paste.protocol import (
    COMMAND_TIMEOUT,
    OUTPUT_LIMIT,
    REJECTED,
    FileEntry,
    Listing,
    Name,
    Requested,
    Result,
)
from runagent.record import record

LISTING_LIMIT = 500  # files named in an outbox's listing; the rest are counted
FILE_LIMIT = 100_000  # characters of one requested file shown in an outbox
REQUESTED_LIMIT = 300_000  # characters of requested files in one outbox, all together
SKIPPED_FOLDERS = frozenset({".git"})
SHOWN = 120  # characters of a command line repeated in its result

Resolve = Callable[[EventsMessage], EventsMessage]


@record
class Applied:
    """What a reply did: a result per command, the files it asked to read, the messages it
    showed, and DONE's summary if it ended the task. While a reply is being carried out, it is
    also its progress, kept in the session after every step: `started` commands begun (the last
    may not have finished when a restart came)."""

    results: tuple[Result, ...] = ()
    read_requests: tuple[str, ...] = ()
    messages: tuple[str, ...] = ()
    summary: str | None = None
    ignored_after_done: int = 0
    started: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "results": [r.to_dict() for r in self.results],
            "readFileRequests": list(self.read_requests),
            "messages": list(self.messages),
        }

    @classmethod
    def from_dict(cls, data: Any) -> Applied:
        return cls(
            results=tuple(Result.from_dict(r) for r in data.get("results") or ()),
            read_requests=tuple(str(p) for p in data.get("readFileRequests") or ()),
            messages=tuple(str(m) for m in data.get("messages") or ()),
            started=int(data.get("started", 0)),
        )


MAX_COMMANDS = 500  # commands carried out from one reply; later ones are reported, not run
TOO_MANY = f"not carried out: a reply may hold at most {MAX_COMMANDS} commands; send the rest next"
LASTING = frozenset({Name.CREATE_FILE, Name.EDIT_FILE, Name.DELETE_FILE, Name.RUN_COMMAND})

INTERRUPTED = (
    "interrupted: run-agent was restarted while this ran, so it may have been carried out in "
    "part; it was not run again. Check its effect, and send it again if it is still needed"
)


class Applier:
    """Carries out the commands of replies in one workspace, through `runtime`; `resolve` waits
    for a person to answer a batch that paused for approval."""

    def __init__(
        self, runtime: Runtime, resolve: Resolve, show: Callable[[str], None] = lambda _: None
    ) -> None:
        self.runtime = runtime
        self.resolve = resolve
        self.show = show  # a MESSAGE's text, as it arrives
        self._id = "op-1"  # the id of the operation being carried out

    def apply(
        self, items: Iterable[Item], *, ids: str = "op",
        resume: Applied | None = None,
        checkpoint: Callable[[Applied], None] = lambda progress: None,
    ) -> Applied:  # fmt: skip
        """Carry out `items` in order. Each operation's id is `{ids}-{n}`, unique to the reply,
        so an answer to one pause can never approve another. `checkpoint` is handed the progress
        before and after each command; from a `resume`d progress, the commands that finished are
        not run again, and one that was begun but not finished is reported, not repeated."""
        state = resume or Applied()
        results = list(state.results)
        reads = list(state.read_requests)
        messages = list(state.messages)
        items = list(items)

        def progress(started: int, summary: str | None = None, ignored: int = 0) -> Applied:
            return Applied(
                tuple(results), tuple(dict.fromkeys(reads)), tuple(messages), summary, ignored,
                started,
            )  # fmt: skip

        for n, item in enumerate(items):
            if n < len(results):
                continue  # finished before a restart
            if isinstance(item, Command) and item.name is Name.DONE:
                return progress(n, (item.body or "").strip("\n"), len(items) - n - 1)
            name = item.command if isinstance(item, Problem) else item.name
            if n < state.started:  # begun before a restart, its end unknown
                results.append(Result(name, False, INTERRUPTED))
                checkpoint(progress(n + 1))
                continue
            if n >= MAX_COMMANDS:
                results.append(Result(name, False, TOO_MANY))
                continue
            # Progress is kept around what changes something; a message or a read done again
            # after a restart costs nothing, and skipping them keeps a long reply linear.
            lasting = isinstance(item, Command) and item.name in LASTING
            if lasting:
                checkpoint(progress(n + 1))
            results.append(self._step(item, f"{ids}-{n + 1}", reads, messages))
            if lasting:
                checkpoint(progress(n + 1))
        return progress(len(items))

    def _step(self, item: Item, op_id: str, reads: list[str], messages: list[str]) -> Result:
        if isinstance(item, Problem):
            return Result(item.command, False, f"{item.message} (line {item.line})")
        if item.name is Name.MESSAGE:
            text = (item.body or "").strip("\n")
            messages.append(text)
            self.show(text)
        self._id = op_id
        try:
            result = self._one(item)
        except Exception as exc:  # a fault of run-agent's, never of the reply: said, not fatal
            why = f"run-agent could not carry this out ({type(exc).__name__}: {exc})"
            result = Result(item.name, False, why)
        if item.name is Name.READ_FILE and result.success:
            reads.append(self._relative(item.path) or item.path)
        return result

    # One command -----------------------------------------------------------------------------

    def _one(self, command: Command) -> Result:
        name = command.name
        if name is Name.RUN_COMMAND:
            return self._run(command.body or "")
        if name is Name.MESSAGE:
            message = {"type": "message", "content": command.body or ""}
            return self._result(name, message, "Shown to the user")
        path = self._relative(command.path)
        if path is None:
            return Result(name, False, f"{REJECTED} ({_shown(command.path)})")
        problem = path_problem(path)
        if problem is None and command.path.rstrip().endswith(("/", "\\")):
            problem = "names a folder; name a file"
        if problem is None and not path.isprintable():
            problem = "holds a control or line-break character; name the file plainly"
        if problem is not None:
            return Result(name, False, f"the path {_shown(path)} {problem}")
        if name is Name.CREATE_FILE:
            # The lines between the tags joined, none added at the end (as CodingAgent writes
            # it): an empty last line gives the file its final line break.
            content = "\n".join(command.lines or ())
            op: dict[str, Any] = {"type": "createFile", "path": path, "content": content}
            op["overwrite"] = True  # the spec's CREATE_FILE replaces
            return self._result(name, op, f"Created '{path}'")
        if name is Name.DELETE_FILE:
            return self._result(name, {"type": "deleteFile", "path": path}, f"Deleted '{path}'")
        if name is Name.READ_FILE:
            op = {"type": "readFile", "path": path}
            return self._result(name, op, f"Read '{path}'")
        return self._edit(command, path)

    def _edit(self, command: Command, path: str) -> Result:
        """Lines start_line to end_line of the file as it is now replaced; an end_line past its
        last line reaches to the end (as in CodingAgent), and the result says so."""
        name = Name.EDIT_FILE
        try:
            text = self.runtime.workspace.read(path).decode("utf-8")
        except WorkspaceError as exc:
            return Result(name, False, _failure(str(exc), path))
        except UnicodeDecodeError:
            return Result(name, False, f"'{path}' is not UTF-8 text; replace it with CREATE_FILE")
        except OSError as exc:
            return Result(name, False, f"'{path}' cannot be read: {exc.strerror or exc}")
        lines = text.split("\n") if text else []
        final_newline = text.endswith("\n")
        if final_newline:
            lines.pop()
        if not lines:
            why = f"'{path}' is empty: it has no lines to replace; write it with CREATE_FILE"
            return Result(name, False, why)
        first, last = command.number("start_line"), command.number("end_line")
        if first > len(lines):
            return Result(
                name, False,
                f"start_line {first} is past the end of '{path}', which has {len(lines)} lines; "
                "nothing was changed (read it again for its line numbers)",
            )  # fmt: skip
        done = f"Edited '{path}' lines {first}-{last}"
        if last > len(lines):
            done = (
                f"Edited '{path}' lines {first}-{len(lines)} (end_line {last} is past its last "
                f"line, {len(lines)}: replaced to the end)"
            )
            last = len(lines)
        ending = "\r" if lines and all(line.endswith("\r") for line in lines) else ""
        new = [line + ending for line in command.lines or ()]
        lines[first - 1 : last] = new
        result_text = "\n".join(lines) + ("\n" if final_newline and lines else "")
        op = {
            "type": "editFile", "path": path,
            "edits": [{"oldContent": text, "newContent": result_text}],
        }  # fmt: skip
        if text == result_text:
            return Result(name, True, f"{done} (no change)")
        return self._result(name, op, done)

    def _run(self, command: str) -> Result:
        name = Name.RUN_COMMAND
        command = command.strip("\n")
        shown = " ".join(command.split())
        shown = shown if len(shown) <= SHOWN else shown[: SHOWN - 3] + "..."
        if not command.strip():
            return Result(name, False, "the command is empty; put the command between the tags")
        op = {"type": "shell", "command": command, "timeout": int(COMMAND_TIMEOUT * 1000)}
        event = self._event(op)
        if event.get("type") != EventType.SHELL.value:
            return Result(name, False, _refusal(event, shown))
        output = _cut("\n".join(s for s in (event.get("stdout", ""), event.get("stderr", "")) if s))
        code = event.get("exitCode")
        if event.get("timedOut"):
            why = (
                f"'{shown}' timed out after {COMMAND_TIMEOUT:g} s and was stopped with its children"
            )
            return Result(name, False, why, output or None)
        if event.get("error"):
            return Result(name, False, f"'{shown}': {event['error']}", output or None)
        return Result(name, code == 0, f"Ran '{shown}' (exit code {code})", output or None)

    # The runtime -----------------------------------------------------------------------------

    def _event(self, op: dict[str, Any]) -> dict[str, Any]:
        """The one event of a one-operation message, once any pause in it was answered."""
        op = {"id": self._id, **op}
        events = self.runtime.receive({"protocolVersion": "1.0", "operations": [op]})
        if events.status is Status.AWAITING_APPROVAL and self.runtime.pending is not None:
            events = self.resolve(events)
        found = [e for e in events.events if e.get("type") != EventType.APPROVAL_REQUIRED.value]
        return found[-1] if found else {"type": "error", "message": "no event came back"}

    def _result(self, name: Name, op: dict[str, Any], done: str) -> Result:
        event = self._event(op)
        path = str(op.get("path", ""))
        if event.get("type") == op["type"] and event.get("success"):
            if name is Name.READ_FILE:
                size = event.get("size", 0)
                return Result(
                    name, True, f"{done} ({size} bytes), shown under Requested File Contents"
                )
            return Result(name, True, done)
        return Result(name, False, _refusal(event, path))

    def _relative(self, path: str) -> str | None:
        """`path` as the runtime takes it (relative, normalised), or None when it leads out."""
        path = path.strip().replace("\\", "/")
        root = self.runtime.workspace.root.as_posix()
        if path.startswith("/"):
            if path != root and not path.startswith(root + "/"):
                return None
            path = path[len(root) :].lstrip("/")
        path = posixpath.normpath(path) if path else path
        if not path or path == "." or path == ".." or path.startswith("../"):
            return None
        return path

    # What the next outbox shows --------------------------------------------------------------

    def listing(self, limit: int = LISTING_LIMIT) -> Listing:
        return workspace_listing(self.runtime.workspace.root, limit)

    def requested(self, paths: Iterable[str], budget: int = REQUESTED_LIMIT) -> list[Requested]:
        """The files asked for, as the next outbox shows them: each cut at FILE_LIMIT
        characters, and none past `budget` characters in all (a paste no chat accepts)."""
        found = []
        for path in paths:
            if budget <= 0:
                found.append(Requested(path, "(not shown: this outbox is full; ask for it again)"))
                continue
            try:
                data = self.runtime.workspace.read(path)
            except (WorkspaceError, OSError) as exc:
                found.append(Requested(path, f"(cannot be read now: {exc})"))
                continue
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                found.append(Requested(path, f"(a binary file of {len(data)} bytes; not shown)"))
                continue
            if len(text) > FILE_LIMIT:
                text = text[:FILE_LIMIT] + (
                    f"\n[cut: the file has {len(text)} characters, the first {FILE_LIMIT} are "
                    f"shown; see the rest with RUN_COMMAND, e.g. sed -n '2000,2400p' {path}]"
                )
            budget -= len(text)
            found.append(Requested(path, text))
        return found


def workspace_listing(root: Path, limit: int = LISTING_LIMIT) -> Listing:
    """The regular files under `root` (links not followed, .git left out), sorted, at most
    `limit` of them named."""
    files: list[FileEntry] = []
    total = 0
    skipped = False
    for folder, folders, names in os.walk(root, followlinks=False):
        kept = sorted(f for f in folders if f not in SKIPPED_FOLDERS)
        skipped = skipped or len(kept) != len(folders)
        folders[:] = kept
        for name in names:
            path = Path(folder, name)
            try:
                info = path.lstat()
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode):
                continue
            total += 1
            files.append(FileEntry(path.relative_to(root).as_posix(), info.st_size))
    files.sort(key=lambda f: f.path)
    note = "the .git folder is not listed" if skipped else None
    return Listing(tuple(files[:limit]), max(0, total - limit), note)


def _shown(path: str, limit: int = SHOWN) -> str:
    """A path as a result repeats it: quoted, on one line, at most `limit` characters."""
    text = repr(path)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def _cut(output: str) -> str:
    if len(output) <= OUTPUT_LIMIT:
        return output
    return (
        output[:OUTPUT_LIMIT]
        + f"\n[output cut: {len(output)} characters, the first {OUTPUT_LIMIT} shown]"
    )


def _failure(error: str, path: str) -> str:
    if "leads out of the workspace" in error:
        return f"{REJECTED} ({path!r})"
    if error == "File not found":
        return f"File '{path}' not found"
    return f"'{path}': {error}" if path and path not in error else error


def _refusal(event: dict[str, Any], subject: str) -> str:
    """Why an operation did not succeed, from its event."""
    kind = event.get("type")
    if kind == EventType.POLICY_DENIED.value:
        suggestion = event.get("suggestion")
        return f"'{subject}' is not allowed: {event.get('reason', '')}" + (
            f" ({suggestion})" if suggestion else ""
        )
    if kind == EventType.ERROR.value:
        return str(event.get("message", "the operation failed"))
    return _failure(str(event.get("error", "the operation failed")), subject)
