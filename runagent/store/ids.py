"""What a project or task id may be: a folder name under the runs root that cannot climb out of
it, hide, or pass for an option."""

from __future__ import annotations

import re

from runagent.errors import UsageError

MAX_ID_LENGTH = 128
_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]+")


def validate_id(kind: str, value: str) -> str:
    """Return `value` if it is a valid project or task id, else raise UsageError naming it."""
    rule = f"use 1-{MAX_ID_LENGTH} letters, digits, '.', '_' or '-'"
    if not value:
        raise UsageError(f"{kind} id is empty: {rule}")
    if len(value) > MAX_ID_LENGTH:
        raise UsageError(f"{kind} id {value[:40]!r}... is {len(value)} characters long: {rule}")
    if not _ID_PATTERN.fullmatch(value):
        raise UsageError(f"{kind} id {value!r} has characters that are not allowed: {rule}")
    if ".." in value or value.startswith("."):
        raise UsageError(f"{kind} id {value!r} may not contain '..' or start with '.': {rule}")
    if value.startswith("-"):  # most likely an option that took the place of a missing value
        raise UsageError(f"{kind} id {value!r} may not start with '-': {rule}")
    return value
