"""A paused batch and the answers that resume it: what is persisted while an approval is awaited.

The pending state (the batch, the position, the events so far, a hash of the exact operation) is
one file in the run folder, so another process can resume it. Resuming first renames the file
away: of two processes answering at once exactly one gets it, and an approval is used once.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from runagent.errors import UsageError
from runagent.ops.event import Event
from runagent.record import record
from runagent.store import runfolder

APPROVED = frozenset({"approved", "approve", "yes"})
DENIED = frozenset({"denied", "deny", "no"})


def digest(operation: object) -> str:
    """The hash an approval is bound to: of the operation exactly as the model sent it."""
    text = json.dumps(operation, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@record
class Pending:
    operation_id: str
    position: int
    operations: tuple[Any, ...]
    events: tuple[Event, ...]  # the events of the batch so far, the approvalRequired last
    digest: str
    suggestion: str | None = None  # what a denial will suggest

    def to_dict(self) -> dict[str, Any]:
        return {
            "operationId": self.operation_id,
            "position": self.position,
            "digest": self.digest,
            "suggestion": self.suggestion,
            "operations": list(self.operations),
            "events": list(self.events),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Pending:
        return cls(
            str(data["operationId"]),
            int(data["position"]),
            tuple(data["operations"]),
            tuple(data["events"]),
            str(data["digest"]),
            data.get("suggestion"),
        )


class NotAwaitedError(UsageError):
    """An answer to an operation the run does not await (now): exit 2, a 409 over HTTP."""

    http_status = 409


def awaited(pending: Pending | None, run_id: str, operation: str) -> Pending:
    """`pending`, if it is the operation `operation` a person answers; else NotAwaitedError."""
    if pending is None:
        raise NotAwaitedError(f"run {run_id} awaits no approval")
    if pending.operation_id != operation:
        raise NotAwaitedError(
            f"run {run_id} awaits approval of {pending.operation_id!r}, not {operation[:80]!r}"
        )
    return pending


def save(path: Path, pending: Pending) -> None:
    runfolder.atomic_write(path, json.dumps(pending.to_dict()))


def peek(path: Path) -> Pending | None:
    """The pending state, without taking it; None when nothing awaits approval."""
    try:
        return _load(path)
    except FileNotFoundError:
        return None


def take(path: Path) -> Pending | None:
    """Take the pending state (it is gone for everyone else); None if another process took it."""
    taken = path.with_name(f"{path.name}.{os.getpid()}.taken")
    try:
        os.rename(path, taken)
    except FileNotFoundError:
        return None
    try:
        return _load(taken)
    finally:
        taken.unlink(missing_ok=True)


def _load(path: Path) -> Pending:
    """The pause kept in `path` (in a run folder, read only inside the run's project)."""
    try:
        text = runfolder.read_text_in(runfolder.RunPaths(path.parent).fence, path)
        return Pending.from_dict(json.loads(text))
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path} cannot be read ({exc}); delete it to drop the pause") from exc


@record
class Answer:
    """A decision on a paused operation: structured, or a userMessage "approved"/"denied"."""

    approved: bool
    operation_id: str | None = None  # None: the one operation that awaits
    reason: str | None = None
    digest: str | None = None  # when given, it must be the awaited operation's


def read_answer(value: object) -> Answer | str:
    """The answer `value` is, or why it is not one (never raises)."""
    if not isinstance(value, dict):
        return "an answer is a JSON object"
    if value.get("type") == "userMessage":
        content = value.get("content")
        word = content.strip().lower().rstrip(".!") if isinstance(content, str) else ""
        if word in APPROVED | DENIED:
            return Answer(word in APPROVED)
        return 'a userMessage answers a pause with "approved" or "denied"'
    approval = value.get("approval")
    if not isinstance(approval, dict):
        return 'an answer is {"approval": {...}} or a userMessage'
    decision = approval.get("decision")
    if decision not in ("approved", "denied"):
        return 'approval.decision must be "approved" or "denied"'
    fields = {k: approval.get(k) for k in ("operationId", "reason", "operationHash")}
    for name, field in fields.items():
        if field is not None and not isinstance(field, str):
            return f"approval.{name} must be a string"
    return Answer(
        decision == "approved", fields["operationId"], fields["reason"], fields["operationHash"]
    )


def is_answer(value: object) -> bool:
    """Whether `value` means to answer a pause rather than to send operations."""
    return isinstance(value, dict) and ("approval" in value or value.get("type") == "userMessage")
