"""A task's paste channel seen from outside the run: the current outbox, the last round's results
and messages (for `run-agent paste` and the page), and handing in a reply."""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

from runagent.errors import DuplicateReplyError, NotFoundError, UsageError
from runagent.paste import inbox
from runagent.paste.session import Folders, Session, digest, latest
from runagent.store import runfolder
from runagent.store.runfolder import TaskPaths

MAX_REPLY = inbox.MAX_REPLY  # bytes of one reply handed in: what the channel reads at most


def current(task: TaskPaths) -> Session | None:
    """The task's session updated last, if it has one."""
    return latest(Folders.of(runfolder.confine(task)))


def outbox_path(task: TaskPaths, session: Session) -> Path:
    return Folders.of(task).outbox_file(session.session_id, session.sequence_number)


def view(task: TaskPaths) -> dict[str, Any] | None:
    """What a person needs to take the next step, or None when the task has no paste session."""
    session = current(task)
    if session is None:
        return None
    folders = Folders.of(task)
    path = outbox_path(task, session)
    try:
        text: str | None = runfolder.read_text_in(task.fence, path)  # never through a link out
    except OSError:
        text = None
    waiting = sorted(e.name for e in inbox.candidates(folders.inbox))
    return {
        "session": session.session_id,
        "sequence": session.sequence_number,
        "complete": session.is_complete,
        "task": session.task,
        "updated": session.updated_at,
        "outbox": None if session.is_complete else path.name,
        "outbox_path": None if session.is_complete else str(path),
        "text": None if session.is_complete else text,
        "size": None if text is None or session.is_complete else len(text),
        "inbox": str(folders.inbox),
        "waiting_replies": waiting,
        "results": [{**r.to_dict(), "lines": r.lines()} for r in session.last_results],
        "messages": list(session.messages),
        "summary": session.summary,
    }


def submit(task: TaskPaths, reply: str) -> Path:
    """Put `reply` into the task's inbox, whole (written aside, then renamed into place)."""
    session = current(task)
    if session is None:
        raise NotFoundError(
            f"task {task.label} has no paste session; start it with --agent paste first"
        )
    if session.is_complete:
        raise UsageError(
            f"the paste session {session.session_id} of {task.label} is complete (DONE was "
            "received); start the task again to send more"
        )
    reply = reply.encode("utf-8", "replace").decode("utf-8")  # a lone surrogate cannot be saved
    if not reply.strip():
        raise UsageError("the reply is empty; paste the chat's whole answer")
    data = reply.encode("utf-8")
    if len(data) > MAX_REPLY:
        raise UsageError(
            f"the reply is {len(data)} bytes, more than {MAX_REPLY}; send the chat's answer only"
        )
    folder = Folders.of(task).inbox
    runfolder.make_folder(folder)
    if not runfolder.within(task.root, folder):
        raise UsageError(
            f"the inbox {folder} leads out of the runs root (a link); replace it with a folder"
        )
    duplicate = _duplicate(session, folder, reply)
    if duplicate is not None:
        raise DuplicateReplyError(duplicate)
    name = f"reply-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}.txt"
    target = folder / name
    runfolder.atomic_write(target, reply)
    return target


def _duplicate(session: Session, folder: Path, reply: str) -> str | None:
    """Why `reply` is not saved, if the run would take it for a duplicate (the channel's rule:
    the same text as the reply before it is a paste made twice). The reply before it is the newest
    one waiting in the inbox, else the one being carried out, else the last one carried out."""
    seen = digest(reply)
    waiting = []
    for entry in inbox.candidates(folder):
        try:
            waiting.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.name))
        except OSError:
            continue
    for _, name in sorted(waiting, reverse=True):
        text = inbox.read(folder / name).text
        if text is None:  # an unreadable file is moved aside, never applied
            continue
        if digest(text) != seen:
            return None
        return (
            f"the reply is a duplicate of {name}, which waits in the inbox: it was not saved, so "
            "the reply is applied once"
        )
    if session.applying is not None:
        if session.applying.get("digest") != seen:
            return None
        return (
            "the reply is a duplicate of the one being carried out now: it was not saved, so the "
            "reply is applied once"
        )
    if not session.replies or session.replies[-1] != seen:
        return None
    return (
        f"the reply is a duplicate of the last one (the answer to outbox "
        f"{session.sequence_number - 1}), which was already applied: it was not saved nor applied "
        f"again; paste the chat's answer to outbox {session.sequence_number}"
    )


def waiting_tasks(root: Path) -> list[TaskPaths]:
    """The tasks under `root` whose latest paste session is not complete."""
    found = []
    for project in runfolder.project_ids(root):
        for task_id in runfolder.task_ids(root, project):
            task = TaskPaths(root, project, task_id)
            if not Folders.of(task).sessions.is_dir():
                continue
            session = current(task)
            if session is not None and not session.is_complete:
                found.append(task)
    return found
