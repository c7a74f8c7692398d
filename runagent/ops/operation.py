"""The six operations a model may send, and checking a message of them against the spec's rules.

Anything a model sends is untrusted: `read_message` accepts any JSON value and never raises. An
operation that breaks a rule becomes an `Invalid` naming the field and the rule; the rest of its
batch still runs. The rules are the JSON Schema's (ops/schema.json, from the spec) plus the prose
rules the schema cannot say: a path's leading `/`, `..` and NUL, the 10 MB content limit, base64
that decodes, and environment names a process can be given.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from runagent.ops.protocol import (
    DEFAULT_TIMEOUT_MS,
    MAX_COMMAND_LENGTH,
    MAX_FILE_BYTES,
    MAX_MESSAGE_LENGTH,
    MAX_PATH_LENGTH,
    MAX_TIMEOUT_MS,
    MIN_TIMEOUT_MS,
    PROTOCOL_VERSION,
    Encoding,
    OperationType,
)
from runagent.record import record


@record
class Message:
    id: str | None
    content: str
    type: OperationType = OperationType.MESSAGE


@record
class CreateFile:
    id: str | None
    path: str
    data: bytes  # the content, decoded from its encoding
    overwrite: bool = False
    type: OperationType = OperationType.CREATE_FILE


@record
class ReadFile:
    id: str | None
    path: str
    encoding: Encoding = Encoding.UTF8
    type: OperationType = OperationType.READ_FILE


@record
class Edit:
    old: str
    new: str


@record
class EditFile:
    id: str | None
    path: str
    edits: tuple[Edit, ...]
    type: OperationType = OperationType.EDIT_FILE


@record
class DeleteFile:
    id: str | None
    path: str
    type: OperationType = OperationType.DELETE_FILE


@record
class Shell:
    id: str | None
    command: str
    cwd: str | None = None
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    env: tuple[tuple[str, str], ...] = ()
    type: OperationType = OperationType.SHELL


Operation = Message | CreateFile | ReadFile | EditFile | DeleteFile | Shell
FileOperation = CreateFile | ReadFile | EditFile | DeleteFile


@record
class Invalid:
    """An operation that breaks a rule: `field` is where (`operations[2].path`), `reason` what."""

    index: int
    id: str | None
    field: str
    reason: str

    @property
    def message(self) -> str:
        return f"{self.field}: {self.reason}"


@record
class Batch:
    """A well-formed operations message: each entry an operation or why it is not one."""

    entries: tuple[Operation | Invalid, ...]
    raw: tuple[Any, ...]  # the operations as sent, for the record and the approval hash


@record
class BadMessage:
    """A value that is not an operations message at all."""

    reason: str


class _Broken(Exception):
    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason


def read_message(value: object) -> Batch | BadMessage:
    """Check a decoded JSON value as an operations message; never raises."""
    if not isinstance(value, dict):
        return BadMessage(f"an operations message is a JSON object, not {_kind(value)}")
    if "protocolVersion" not in value:
        return BadMessage(
            f'protocolVersion is missing; send "protocolVersion": "{PROTOCOL_VERSION}"'
        )
    version = value["protocolVersion"]
    if version != PROTOCOL_VERSION or not isinstance(version, str):
        return BadMessage(
            f"protocolVersion {_show(version)} is not supported; use {PROTOCOL_VERSION!r}"
        )
    if "operations" not in value:
        return BadMessage("operations is missing: send a list of operations")
    operations = value["operations"]
    if not isinstance(operations, list):
        return BadMessage(f"operations must be a list, not {_kind(operations)}")
    entries = tuple(read_operation(op, i) for i, op in enumerate(operations))
    return Batch(entries, tuple(operations))


def read_operation(value: object, index: int) -> Operation | Invalid:
    """One operation, or the first rule it breaks."""
    where = f"operations[{index}]"
    op_id = value.get("id") if isinstance(value, dict) else None
    op_id = op_id if isinstance(op_id, str) else None
    try:
        if not isinstance(value, dict):
            raise _Broken(where, f"an operation is a JSON object, not {_kind(value)}")
        return _read(value, where, op_id)
    except _Broken as broken:
        return Invalid(index, op_id, broken.field, broken.reason)


def _read(op: Mapping[str, Any], where: str, op_id: str | None) -> Operation:
    kind = op.get("type")
    if not isinstance(kind, str) or kind not in OperationType.__members__.values():
        names = ", ".join(t.value for t in OperationType)
        raise _Broken(f"{where}.type", f"{_show(kind)} is not an operation type ({names})")
    if "id" in op and not isinstance(op["id"], str):
        raise _Broken(f"{where}.id", f"must be a string, not {_kind(op['id'])}")
    kind = OperationType(kind)
    if kind is OperationType.MESSAGE:
        return Message(op_id, _string(op, where, "content", MAX_MESSAGE_LENGTH))
    if kind is OperationType.SHELL:
        return _shell(op, where, op_id)
    path = _path(op, where, "path", required=True)
    assert path is not None
    if kind is OperationType.CREATE_FILE:
        content = _string(op, where, "content")
        encoding = _encoding(op, where)
        overwrite = op.get("overwrite", False)
        if not isinstance(overwrite, bool):
            raise _Broken(f"{where}.overwrite", f"must be true or false, not {_kind(overwrite)}")
        return CreateFile(op_id, path, _decode(content, encoding, where), overwrite)
    if kind is OperationType.READ_FILE:
        return ReadFile(op_id, path, _encoding(op, where))
    if kind is OperationType.EDIT_FILE:
        return EditFile(op_id, path, _edits(op, where))
    return DeleteFile(op_id, path)


def _shell(op: Mapping[str, Any], where: str, op_id: str | None) -> Shell:
    command = _string(op, where, "command", MAX_COMMAND_LENGTH)
    if "\0" in command:  # exec cannot pass it (the schema allows it)
        raise _Broken(f"{where}.command", "contains a NUL byte, which no command can carry")
    cwd = _path(op, where, "cwd", required=False)
    timeout = op.get("timeout", DEFAULT_TIMEOUT_MS)
    # JSON has one number type: 5000.0 is the integer 5000 (as the schema's "integer" reads it).
    if isinstance(timeout, bool) or not (
        isinstance(timeout, int) or (isinstance(timeout, float) and timeout.is_integer())
    ):
        raise _Broken(
            f"{where}.timeout", f"must be a whole number of milliseconds, not {_show(timeout)}"
        )
    if not MIN_TIMEOUT_MS <= timeout <= MAX_TIMEOUT_MS:
        raise _Broken(
            f"{where}.timeout",
            f"{_show(timeout)} ms is out of range {MIN_TIMEOUT_MS}..{MAX_TIMEOUT_MS}",
        )
    env = op.get("env", {})
    if not isinstance(env, dict):
        raise _Broken(f"{where}.env", f"must be an object of strings, not {_kind(env)}")
    for name, value in env.items():
        if not isinstance(value, str):
            raise _Broken(f"{where}.env.{name}", f"must be a string, not {_kind(value)}")
    for name, value in env.items():  # what exec cannot pass (the schema allows it)
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise _Broken(
                f"{where}.env",
                f"{_show(name)} cannot be set: a name must be non-empty "
                "with no '=' or NUL, and a value has no NUL",
            )
    return Shell(op_id, command, cwd, int(timeout), tuple(env.items()))


def _string(op: Mapping[str, Any], where: str, name: str, limit: int | None = None) -> str:
    if name not in op:
        raise _Broken(f"{where}.{name}", "is required")
    value = op[name]
    if not isinstance(value, str):
        raise _Broken(f"{where}.{name}", f"must be a string, not {_kind(value)}")
    if limit is not None and len(value) > limit:
        raise _Broken(f"{where}.{name}", f"is {len(value)} characters long; the limit is {limit}")
    return value


def _path(op: Mapping[str, Any], where: str, name: str, *, required: bool) -> str | None:
    if name not in op and not required:
        return None
    path = _string(op, where, name, MAX_PATH_LENGTH)
    problem = path_problem(path)
    if problem:
        raise _Broken(f"{where}.{name}", f"{_show(path)} {problem}")
    return path


def path_problem(path: str) -> str | None:
    """The spec's isValidPath, as a reason: None for a path it accepts."""
    if path.startswith("/"):
        return "is absolute; give a path relative to the workspace"
    if ".." in path:  # the spec refuses the two characters anywhere, as its isValidPath does
        return "contains '..'; parent traversal is not allowed"
    if "\0" in path:
        return "contains a NUL byte"
    if len(path) > MAX_PATH_LENGTH:
        return f"is longer than {MAX_PATH_LENGTH} characters"
    return None


def _encoding(op: Mapping[str, Any], where: str) -> Encoding:
    value = op.get("encoding", Encoding.UTF8.value)
    if not isinstance(value, str) or value not in Encoding.__members__.values():
        raise _Broken(f"{where}.encoding", f"{_show(value)} is not 'utf-8' or 'base64'")
    return Encoding(value)


def _decode(content: str, encoding: Encoding, where: str) -> bytes:
    if encoding is Encoding.BASE64:
        if len(content) > (MAX_FILE_BYTES // 3 + 1) * 4:
            raise _Broken(f"{where}.content", f"decodes to more than {MAX_FILE_BYTES} bytes")
        try:
            data = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise _Broken(f"{where}.content", "is not valid base64") from None
    else:
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (\ud800) decoded from JSON
            raise _Broken(f"{where}.content", "is not valid Unicode (a lone surrogate)") from None
    if len(data) > MAX_FILE_BYTES:
        raise _Broken(f"{where}.content", f"is {len(data)} bytes; the limit is {MAX_FILE_BYTES}")
    return data


def _edits(op: Mapping[str, Any], where: str) -> tuple[Edit, ...]:
    if "edits" not in op:
        raise _Broken(f"{where}.edits", "is required")
    edits = op["edits"]
    if not isinstance(edits, list):
        raise _Broken(f"{where}.edits", f"must be a list, not {_kind(edits)}")
    found = []
    for i, edit in enumerate(edits):
        at = f"{where}.edits[{i}]"
        if not isinstance(edit, dict):
            raise _Broken(at, f"an edit is an object, not {_kind(edit)}")
        found.append(Edit(_string(edit, at, "oldContent"), _string(edit, at, "newContent")))
    return tuple(found)


def _kind(value: object) -> str:
    names = {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)


def _show(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
