"""One paste run: the session taken up (or begun), its outbox written, replies awaited in the
inbox and carried out, the next outbox written, until a reply says DONE.

The order of steps makes a restart safe at any point: a reply's commands are carried out, then the
session (with the reply's digest) is saved, then the reply is moved aside, then the next outbox is
written. A restarted run finds the session, writes a missing outbox again, and moves aside any
reply whose digest the session already holds instead of applying it twice.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from runagent.paste import inbox
from runagent.paste.apply import Applied, Applier
from runagent.paste.parser import parse
from runagent.paste.protocol import Result, render
from runagent.paste.session import Folders, Session, digest, resumable, save
from runagent.record import record
from runagent.store import runfolder

HEARTBEAT = 300.0  # seconds between "still waiting" lines when no idle timeout asks for more


class WaitExpired(Exception):
    """No reply came within `paste.wait`."""


@record
class Ended:
    summary: str
    sequence: int


class Channel:
    """The paste run of one task: its folders, the workspace runtime (through `applier`), the
    task's text, and where the person reads what happens (`out`: the run's stdout; `err`:
    progress and heartbeats on its stderr)."""

    def __init__(
        self, folders: Folders, applier: Applier, task: str, *, out: TextIO, err: TextIO,
        wait: float | None = None, heartbeat: float = HEARTBEAT, output: Path | None = None,
        announce: Callable[[Path, str], None] = lambda path, text: None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        """`wait` bounds the wait for each reply (None: no bound); `announce` is told of each
        outbox written (the clipboard); `output` the file DONE's summary is written to."""
        self.folders = folders
        self.applier = applier
        self.task = task
        self.out = out
        self.err = err
        self.wait = wait
        self.heartbeat = heartbeat
        self.announce = announce
        self.output = output  # where DONE's summary goes (the run's output.md)
        self.monotonic = monotonic
        applier.show = self._message

    def run(self) -> Ended:
        self.folders.make()
        session = resumable(self.folders, self.task)
        if session is None:
            session = Session.new(self.task, (p.stem for p in self.folders.sessions.iterdir()))
            save(self.folders, session)
            self._tell(f"paste session {session.session_id} begins")
        else:
            self._tell(
                f"paste session {session.session_id} goes on at sequence {session.sequence_number}"
            )
        self._outbox(session, fresh=not self._outbox_file(session).exists())
        while True:
            path = self._next_reply(session)
            session, ended = self._take(session, path)
            if ended is not None:
                return ended

    # Steps -----------------------------------------------------------------------------------

    def _take(self, session: Session, path: Path) -> tuple[Session, Ended | None]:
        """Carry out one reply file; the session after it, and how the run ended if it did."""
        reply = inbox.read(path)
        tag = f"{session.session_id}_seq{session.sequence_number:04d}"
        if reply.text is None:
            moved = inbox.move_aside(path, self.folders.processed, f"{tag}_unreadable")
            self._tell(f"{path.name} was not read: {reply.problem}; moved to {moved}")
            return session, None
        seen = digest(reply.text)
        if session.replies and seen == session.replies[-1] and session.applying is None:
            moved = inbox.move_aside(path, self.folders.processed, f"{tag}_duplicate")
            self._tell(
                f"{path.name} is the same reply as the last one (the answer to outbox "
                f"{session.sequence_number - 1}); it was not applied again (moved to {moved}). "
                "Paste the chat's new answer."
            )
            return session, None
        resume = abandoned = None
        if session.applying is not None and session.applying.get("digest") == seen:
            resume = Applied.from_dict(session.applying)
            self._tell(
                f"going on with {path.name} after a restart, from its command {resume.started}"
            )
        else:
            if session.applying is not None:  # a reply cut short, then taken out of the inbox
                abandoned = Applied.from_dict(session.applying)
            self._tell(f"reading {path.name} (the reply to outbox {session.sequence_number})")
        items = parse(reply.text)
        if not items:
            self._tell(f"no command blocks were found in {path.name}; the model is told so")
        current = session

        def checkpoint(progress: Applied) -> None:
            nonlocal current
            current = current.touched(applying={"digest": seen, **progress.to_dict()})
            save(self.folders, current)

        applied = self.applier.apply(
            items, ids=f"seq{session.sequence_number}", resume=resume, checkpoint=checkpoint
        )
        if abandoned is not None:
            applied = _after_abandoned(abandoned, applied)
        if applied.summary is not None and self.output is not None:
            # Written before the session says complete: a restart in between ends the same way.
            runfolder.atomic_write(
                self.output, (applied.summary or "(DONE without a summary)") + "\n"
            )
        session = self._after(current, applied, seen)
        save(self.folders, session)
        inbox.move_aside(path, self.folders.processed, tag)
        self._report(applied)
        if session.is_complete:
            self._tell(f"DONE: {session.summary or '(no summary)'}")
            return session, Ended(session.summary or "", session.sequence_number)
        self._outbox(session, fresh=True)
        return session, None

    def _after(self, session: Session, applied: Applied, seen: str) -> Session:
        done = applied.summary is not None
        return session.touched(
            sequence_number=session.sequence_number + (0 if done else 1),
            is_complete=done,
            last_results=applied.results,
            read_file_requests=applied.read_requests,
            replies=(*session.replies, seen),
            messages=(*session.messages, *applied.messages),
            summary=applied.summary,
            applying=None,
        )

    def _outbox(self, session: Session, *, fresh: bool) -> None:
        self.folders.make()  # a folder removed while the run waited is made again
        path = self._outbox_file(session)
        if fresh or not path.exists():
            text = render(
                session_id=session.session_id,
                sequence=session.sequence_number,
                task=session.task,
                listing=self.applier.listing(),
                results=session.last_results,
                requested=self.applier.requested(session.read_file_requests),
            )
            runfolder.atomic_write(path, text)
        else:
            text = path.read_text(encoding="utf-8")
        self._tell(
            f"outbox {session.sequence_number} ready: {path} ({len(text)} characters). Paste it "
            f"into the chat; save the whole reply as a .txt file in {self.folders.inbox}/ or "
            "send it with: run-agent paste reply FILE"
        )
        self.announce(path, text)

    def _next_reply(self, session: Session) -> Path:
        """The oldest whole reply in the inbox, waiting for one as long as `wait` allows."""
        began = last = self.monotonic()
        for _ in inbox.changes(self.folders.inbox):
            files, _ = inbox.ready(self.folders.inbox)
            if files:
                return files[0]
            now = self.monotonic()
            if self.wait is not None and now - began >= self.wait:
                raise WaitExpired(
                    f"no reply to outbox {session.sequence_number} came within paste.wait "
                    f"{self.wait:g}s"
                )
            if now - last >= self.heartbeat:
                self._say(
                    f"still waiting for the reply to outbox {session.sequence_number} "
                    f"({now - began:.0f}s) in {self.folders.inbox}"
                )
                last = now
        raise WaitExpired("the inbox can no longer be watched")  # watchfiles ended: not expected

    # Saying what happens ---------------------------------------------------------------------

    def _report(self, applied: Applied) -> None:
        lines: list[str] = []
        for result in applied.results:
            lines += _short(result)
        if applied.ignored_after_done:
            lines.append(f"{applied.ignored_after_done} command(s) after DONE were not carried out")
        for line in lines:
            self._tell(line)

    def _message(self, text: str) -> None:
        self._tell(f"MESSAGE: {text}")

    def _tell(self, text: str) -> None:
        """Lines for the person at the terminal (the run's stdout, which the console echoes)."""
        self.out.write(for_person(text))
        self.out.flush()

    def _say(self, text: str) -> None:
        """Progress of the wait (stderr: kept in the run, not shown in the terminal)."""
        self.err.write(f"run-agent: {text}\n")
        self.err.flush()

    def _outbox_file(self, session: Session) -> Path:
        return self.folders.outbox_file(session.session_id, session.sequence_number)


def _after_abandoned(abandoned: Applied, applied: Applied) -> Applied:
    """What this reply did, after what the reply before it did before a restart cut it short
    and it was taken out of the inbox: the model hears of both."""
    note = Result(
        "REPLY", False,
        "run-agent was restarted while it carried out your previous reply, and that reply was "
        "then taken out of the inbox: the results above are all it did; the rest of it was not "
        "carried out",
    )  # fmt: skip
    return dataclasses.replace(
        applied,
        results=(*abandoned.results, note, *applied.results),
        read_requests=tuple(dict.fromkeys((*abandoned.read_requests, *applied.read_requests))),
        messages=(*abandoned.messages, *applied.messages),
    )


def for_person(text: str) -> str:
    """`text` as lines for the terminal: every line after the first indented, whatever breaks
    it (a CR, U+2028, ...), so that no text a model wrote can pass for a line of run-agent's
    own, such as `outbox N ready`."""
    first, *rest = text.splitlines() or [""]
    return "".join([first, *(f"\n  {line}" for line in rest), "\n"])


def _short(result: Result) -> list[str]:
    """A result as the terminal shows it: its line, and at most a few lines of output."""
    lines = result.lines()
    return lines[:1] + lines[1:6] + (["    ..."] if len(lines) > 6 else [])
