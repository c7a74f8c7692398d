"""A paste session's state and folders: what has been sent and answered, kept on disk so that a
restarted run-agent (or the loop's next attempt) goes on where it was.

The folders are the task's `paste/`: `outbox/` ({session}_seq{NNNN}.txt), `inbox/` (where the
person saves replies), `processed/` (replies moved aside once read) and `sessions/`
({session}.json, the spec's state, plus the hashes of the replies applied, so the same reply is
never applied twice). Every file is written to a temporary name and renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterable
from dataclasses import field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from runagent.paste.parser import normalize
from runagent.paste.protocol import Result, outbox_name
from runagent.record import record
from runagent.store import runfolder
from runagent.store.runfolder import TaskPaths

PASTE = "paste"


@record
class Folders:
    """The paste folders of one task."""

    root: Path

    @classmethod
    def of(cls, task: TaskPaths) -> Folders:
        return cls(task.folder / PASTE)

    @property
    def outbox(self) -> Path:
        return self.root / "outbox"

    @property
    def inbox(self) -> Path:
        return self.root / "inbox"

    @property
    def processed(self) -> Path:
        return self.root / "processed"

    @property
    def sessions(self) -> Path:
        return self.root / "sessions"

    def make(self) -> None:
        for folder in (self.outbox, self.inbox, self.processed, self.sessions):
            runfolder.make_folder(folder)

    def session_file(self, session_id: str) -> Path:
        return self.sessions / f"{session_id}.json"

    def outbox_file(self, session_id: str, sequence: int) -> Path:
        return self.outbox / outbox_name(session_id, sequence)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def digest(reply: str) -> str:
    """What makes two replies the same: their text, line ends and surrounding space aside."""
    return hashlib.sha256(normalize(reply).strip().encode("utf-8", "replace")).hexdigest()


@record
class Session:
    """The spec's session state (the first eight fields, under the spec's names on disk), and
    what run-agent keeps besides: the replies applied, the model's messages, the summary."""

    session_id: str
    task: str
    sequence_number: int = 1
    is_complete: bool = False
    created_at: str = field(default_factory=now)
    updated_at: str = field(default_factory=now)
    last_results: tuple[Result, ...] = ()
    read_file_requests: tuple[str, ...] = ()
    replies: tuple[str, ...] = ()  # digests of the replies applied, in order
    messages: tuple[str, ...] = ()  # MESSAGE texts, oldest first
    summary: str | None = None  # DONE's text
    # The reply being carried out: its digest and progress (apply.Applied.to_dict()), so that a
    # restart goes on after the last finished command instead of applying the reply again.
    applying: dict[str, Any] | None = None

    @classmethod
    def new(cls, task: str, taken: Iterable[str] = ()) -> Session:
        """A session with a fresh id, none of `taken`."""
        taken = set(taken)
        while (session_id := secrets.token_hex(4)) in taken:
            pass
        return cls(session_id, task)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sessionId": self.session_id,
            "task": self.task,
            "sequenceNumber": self.sequence_number,
            "isComplete": self.is_complete,
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
            "lastResults": [r.to_dict() for r in self.last_results],
            "readFileRequests": list(self.read_file_requests),
            "appliedReplies": list(self.replies),
            "messages": list(self.messages),
            "summary": self.summary,
            "applying": self.applying,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Session:
        """A session read back; ValueError (KeyError, TypeError) when the file is not one."""
        sequence = data["sequenceNumber"]
        if not isinstance(sequence, int) or sequence < 1:
            raise ValueError(f"sequenceNumber {sequence!r} is not a whole number from 1")
        return cls(
            session_id=str(data["sessionId"]),
            task=str(data["task"]),
            sequence_number=sequence,
            is_complete=bool(data["isComplete"]),
            created_at=str(data["createdAt"]),
            updated_at=str(data["updatedAt"]),
            last_results=tuple(Result.from_dict(r) for r in data.get("lastResults") or ()),
            read_file_requests=tuple(str(p) for p in data.get("readFileRequests") or ()),
            replies=tuple(str(d) for d in data.get("appliedReplies") or ()),
            messages=tuple(str(m) for m in data.get("messages") or ()),
            summary=None if data.get("summary") is None else str(data["summary"]),
            applying=data["applying"] if isinstance(data.get("applying"), dict) else None,
        )

    def touched(self, **changes: Any) -> Session:
        return replace(self, updated_at=now(), **changes)


def save(folders: Folders, session: Session) -> None:
    runfolder.atomic_write(
        folders.session_file(session.session_id), json.dumps(session.to_dict(), indent=2) + "\n"
    )


def load(path: Path) -> Session | None:
    """The session in `path`; None when it cannot be read as one (it is left where it is)."""
    try:
        return Session.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def sessions(folders: Folders) -> list[Session]:
    """Every readable session of the task, the most recently updated last."""
    try:
        paths = sorted(folders.sessions.glob("*.json"))
    except OSError:
        return []
    found = [s for s in (load(p) for p in paths) if s is not None]
    return sorted(found, key=lambda s: (s.updated_at, s.created_at))


def latest(folders: Folders) -> Session | None:
    found = sessions(folders)
    return found[-1] if found else None


def resumable(folders: Folders, task: str) -> Session | None:
    """The unfinished session of this task (the one updated last), to go on with."""
    open_ = [s for s in sessions(folders) if not s.is_complete and s.task == task]
    return open_[-1] if open_ else None
