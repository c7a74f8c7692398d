"""The events the runtime answers with, shaped as the spec shows them, and the events message."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from runagent.ops.protocol import PROTOCOL_VERSION, ErrorCategory, EventType, OperationType, Status
from runagent.record import record

Event = dict[str, Any]


def event(kind: EventType, operation_id: str | None, timestamp: str, **fields: Any) -> Event:
    """An event in the spec's key order: type, operationId (when there is one), timestamp, then
    the fields given; fields that are None are left out, as the spec's optional fields are."""
    found: Event = {"type": kind.value}
    if operation_id is not None:
        found["operationId"] = operation_id
    found["timestamp"] = timestamp
    found.update((k, v) for k, v in fields.items() if v is not None)
    return found


def error(
    category: ErrorCategory,
    message: str,
    timestamp: str,
    operation_id: str | None = None,
    details: Mapping[str, Any] | None = None,
) -> Event:
    return event(
        EventType.ERROR,
        operation_id,
        timestamp,
        category=category.value,
        message=message,
        details=dict(details or {}),
    )


def policy_denied(
    kind: OperationType, operation_id: str | None, timestamp: str, reason: str,
    suggestion: str | None,
) -> Event:  # fmt: skip
    return event(
        EventType.POLICY_DENIED,
        operation_id,
        timestamp,
        operationType=kind.value,
        reason=reason,
        suggestion=suggestion,
    )


def approval_required(
    kind: OperationType, operation_id: str, timestamp: str, reason: str, details: Mapping[str, str]
) -> Event:
    return event(
        EventType.APPROVAL_REQUIRED,
        operation_id,
        timestamp,
        operationType=kind.value,
        reason=reason,
        details=dict(details),
    )


@record
class EventsMessage:
    """What one operations message (or one answer to a pause) is answered with."""

    run_id: str
    status: Status
    events: tuple[Event, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "runId": self.run_id,
            "status": self.status.value,
            "events": list(self.events),
        }
