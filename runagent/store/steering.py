"""A person's messages to a task: every message kept in the task folder (messages.jsonl, one
JSON object a line, numbered from 1), and which run each was handed to (messages-read.json,
written only by the task's loop, which holds the task). A message not yet handed to a run waits
for the task's next attempt; one sent with `now` also ends the attempt that runs (the loop reads
it: runagent/loop/attempt.py). The door writes a message (runagent/service.py `steer`); both
files lie in the task folder, which a sandboxed agent sees read-only (runagent/loop/sandbox.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from runagent.record import record
from runagent.store import runfolder
from runagent.store.runfolder import TaskPaths

MAX_MESSAGE_CHARS = 64 * 1024  # of one message: words for an attempt, not a document


@record
class Message:
    """One message of a person to a task, one line of messages.jsonl."""

    number: int  # from 1, in the order they were sent
    at: str  # when it was sent (ISO 8601, UTC)
    text: str
    now: bool = False  # sent to end the running attempt
    by: str = ""  # the face that sent it: the command line, the API, MCP
    run_id: str | None = None  # the run it was handed to (None: it waits for the next attempt)

    def to_dict(self) -> dict[str, Any]:
        return {"number": self.number, "at": self.at, "text": self.text, "now": self.now,
                "by": self.by, "run_id": self.run_id}  # fmt: skip


@contextmanager
def _locked(task: TaskPaths) -> Iterator[None]:
    """Held while messages.jsonl is read, added to and written (two faces may send at once)."""
    with runfolder.exclusive(task.messages_lock):
        yield


def add(task: TaskPaths, text: str, *, now: bool = False, by: str = "") -> Message:
    """Keep a message for the task's next attempt (the task folder exists)."""
    with _locked(task):
        kept = _sent(task)
        message = Message(len(kept) + 1, runfolder.timestamp(), text, now, by)
        lines = [json.dumps(m.to_dict() | {"run_id": None}) for m in (*kept, message)]
        runfolder.atomic_write(task.messages, "\n".join(lines) + "\n")
    return message


def messages(task: TaskPaths) -> list[Message]:
    """Every message sent to the task, each with the run it was handed to (if it was)."""
    handed = _handed(task)
    return [_with_run(m, handed.get(m.number)) for m in _sent(task)]


def pending(task: TaskPaths) -> list[Message]:
    """The messages no run has been handed yet, oldest first."""
    return [m for m in messages(task) if m.run_id is None]


def hand(task: TaskPaths, run_id: str, given: Sequence[Message]) -> None:
    """Write down that run `run_id` was handed `given` (its loop alone writes this)."""
    if not given:
        return
    handed = _handed(task) | {m.number: run_id for m in given}
    data = {str(number): run for number, run in sorted(handed.items())}
    runfolder.atomic_write(task.messages_read, json.dumps(data, indent=1) + "\n")


def stamp(task: TaskPaths) -> tuple[int, int] | None:
    """What changes when a message is sent (messages.jsonl's size and time): read it again only
    then."""
    try:
        st = task.messages.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def now_waiting(task: TaskPaths) -> Message | None:
    """A message sent with `now` that no run was handed yet: the running attempt ends for it."""
    return next((m for m in pending(task) if m.now), None)


def _with_run(message: Message, run_id: str | None) -> Message:
    return Message(message.number, message.at, message.text, message.now, message.by, run_id)


def _sent(task: TaskPaths) -> list[Message]:
    """The messages of messages.jsonl; a line that cannot be read is left out."""
    try:  # a regular file of the task's project (a link swapped in leads nowhere)
        text = runfolder.read_text_in(task.fence, task.messages)
    except (OSError, UnicodeDecodeError):
        return []
    found = []
    for line in text.splitlines():
        try:
            item = json.loads(line)
            found.append(Message(int(item["number"]), str(item["at"]), str(item["text"]),
                                 item.get("now") is True, str(item.get("by") or "")))  # fmt: skip
        except (ValueError, KeyError, TypeError):
            continue
    return found


def _handed(task: TaskPaths) -> dict[int, str]:
    try:
        data = json.loads(runfolder.read_text_in(task.fence, task.messages_read))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {int(k): str(v) for k, v in data.items() if str(k).isdigit() and isinstance(v, str)}
