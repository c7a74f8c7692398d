"""Waiting for a person to answer a pause: the events of a batch that stopped for approval, once
every pause in it has been answered (by `run-agent ops approve|deny`, the page's approvals panel,
or the API), or at once denied where nobody is there to answer.

Whoever answers runs the rest of the batch in their own process and appends its events to the run's
events.jsonl; the waiter reads them there. While it waits it says so every `heartbeat` seconds, so
that a supervisor's idle timeout sees a run waiting for a person, not a silent agent.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

from runagent.ops import Approvals
from runagent.ops.event import Event, EventsMessage
from runagent.ops.protocol import EventType, Status
from runagent.ops.runtime import Runtime

# Heartbeats while a pause waits: often enough for the supervisor's idle timeout, never chatty.
HEARTBEAT_MAX = 30.0
HEARTBEAT_MIN = 0.2
POLL = 0.2


@dataclasses.dataclass
class Waiter:
    """Answers for the pauses of one runtime; `say` shows one line to the person watching."""

    runtime: Runtime
    say: Callable[[str], None]
    heartbeat: float = HEARTBEAT_MAX
    sleep: Callable[[float], None] = time.sleep
    monotonic: Callable[[], float] = time.monotonic
    beat: Callable[[str], None] | None = None  # where "still waiting" goes (default: `say`)

    def resolve(self, events: EventsMessage, approvals: Approvals) -> EventsMessage:
        """The events of a batch that paused, once a person has answered every pause in it (in
        `wait` mode), or at once denied (in `deny` mode, for a pause the policy did not deny,
        such as one left by another process)."""
        so_far = list(events.events)
        while events.status is Status.AWAITING_APPROVAL and (waiting := self.runtime.pending):
            so_far = [e for e in so_far if e.get("type") != EventType.APPROVAL_REQUIRED.value]
            if approvals is Approvals.DENY:
                reason = "this run is unattended (ops.approvals: deny)"
                answer = {"operationId": waiting.operation_id, "decision": "denied"}
                events = self.runtime.receive({"approval": {**answer, "reason": reason}})
            else:
                events = self._wait(waiting.operation_id, waiting.events[-1:])
            so_far.extend(events.events)
        return dataclasses.replace(events, events=tuple(so_far))

    def _wait(self, operation_id: str, asked: tuple[Event, ...]) -> EventsMessage:
        """Wait for another process to answer the pause, and read what it appended."""
        run = self.runtime.run_id
        details = asked[0].get("details", {}) if asked else {}
        what = details.get("command") or details.get("path") or ""
        rule = details.get("policy")
        self.say(
            f"waiting for approval of operation {operation_id!r}"
            + (f" ({what})" if what else "")
            + (f", asked by rule {rule}" if rule else "")
            + f": run-agent ops approve {run} {operation_id}  (or: run-agent ops deny {run} "
            f"{operation_id})"
        )
        start = self._size()
        began = last = self.monotonic()
        while True:
            if self.runtime.pending is None:
                answered = self._appended(start)
                if answered is not None:
                    self.say(f"operation {operation_id!r} was answered; going on")
                    return answered
            now = self.monotonic()
            if now - last >= self.heartbeat:
                (self.beat or self.say)(
                    f"still waiting for approval of operation {operation_id!r} ({now - began:.0f}s)"
                )
                last = now
            self.sleep(POLL)

    def _size(self) -> int:
        try:
            return self.runtime.paths.events.stat().st_size
        except FileNotFoundError:
            return 0

    def _appended(self, start: int) -> EventsMessage | None:
        """The last whole events message appended to events.jsonl after byte `start`."""
        try:
            with self.runtime.paths.events.open("rb") as f:
                f.seek(start)
                data = f.read()
        except FileNotFoundError:
            return None
        lines = [line for line in data.split(b"\n")[:-1] if line.strip()]  # whole lines only
        for line in reversed(lines):
            try:
                found: Any = json.loads(line)
                status = Status(found["status"])
                return EventsMessage(str(found["runId"]), status, tuple(found["events"]))
            except (ValueError, KeyError, TypeError):
                continue
        return None
