"""The closed sets and limits of the operations protocol, version 1.0 (the spec's own numbers)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from datetime import UTC, datetime

PROTOCOL_VERSION = "1.0"

MAX_PATH_LENGTH = 255
MAX_FILE_BYTES = 10 * 1024 * 1024  # "Max 10MB for files": read as MiB, of the decoded bytes
MAX_MESSAGE_LENGTH = 100_000  # the JSON Schema's maxLength for a message's content
MAX_COMMAND_LENGTH = 4096
# Bytes of one operations message, however it comes (a file, stdin, the API): a few files at the
# 10 MB cap, JSON-escaped; a larger message is refused whole, never recorded.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MIN_TIMEOUT_MS = 1000
MAX_TIMEOUT_MS = 3_600_000
DEFAULT_TIMEOUT_MS = 30_000
SHELL_EXIT_TIMED_OUT = 124  # what `timeout(1)` exits with, as the spec's timeout event shows


class OperationType(enum.StrEnum):
    MESSAGE = "message"
    CREATE_FILE = "createFile"
    READ_FILE = "readFile"
    EDIT_FILE = "editFile"
    DELETE_FILE = "deleteFile"
    SHELL = "shell"


class EventType(enum.StrEnum):
    USER_MESSAGE = "userMessage"
    MESSAGE = "message"
    CREATE_FILE = "createFile"
    READ_FILE = "readFile"
    EDIT_FILE = "editFile"
    DELETE_FILE = "deleteFile"
    SHELL = "shell"
    APPROVAL_REQUIRED = "approvalRequired"
    POLICY_DENIED = "policyDenied"
    ERROR = "error"


class Status(enum.StrEnum):
    """The status of an events message."""

    COMPLETED = "completed"
    AWAITING_APPROVAL = "awaiting_approval"
    ERROR = "error"


class ErrorCategory(enum.StrEnum):
    VALIDATION = "validation"
    POLICY = "policy"
    EXECUTION = "execution"
    TIMEOUT = "timeout"
    SYSTEM = "system"


class Encoding(enum.StrEnum):
    UTF8 = "utf-8"
    BASE64 = "base64"


Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    """An event timestamp: ISO 8601 in UTC with a `Z`, as the spec writes them."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
