"""The operations runtime: JSON operations from a model, run in a confined workspace under a policy,
answered with events (spec/operations-protocol.md)."""

from __future__ import annotations

from runagent.ops.event import EventsMessage
from runagent.ops.protocol import PROTOCOL_VERSION, Status
from runagent.ops.runtime import Runtime, Settings
from runagent.ops.sandbox import Sandbox
from runagent.ops.workspace import OutsideWorkspaceError, Workspace, WorkspaceError

__all__ = [
    "PROTOCOL_VERSION",
    "EventsMessage",
    "OutsideWorkspaceError",
    "Runtime",
    "Sandbox",
    "Settings",
    "Status",
    "Workspace",
    "WorkspaceError",
]
