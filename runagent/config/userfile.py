"""A file a person names (a prompt, an issue body, an operations message): regular files only,
read whole up to a limit, or refused in one line that names it.

A FIFO would hang the read and `/dev/zero` would fill the memory, so the file is opened without
blocking and checked on its descriptor (no swap between a check and the open), then read at most
one byte past its limit.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

from runagent.errors import UsageError

MAX_TEXT_BYTES = 10 << 20  # a prompt or an issue body is text a person wrote; more is a wrong file


def read_file(path: Path, limit: int, what: str) -> bytes:
    """The bytes of the regular file at `path` (links followed), at most `limit` of them;
    `what` names it in the error (`prompt file`, `COCODE_ISSUE_BODY_FILE`)."""
    named = f"{what} {str(path)!r}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"{named} cannot be opened ({exc.strerror or exc})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > limit:  # refused before any read
        os.close(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{named} is {_kind(info.st_mode)}, not a regular file; give a file")
        raise UsageError(too_large(named, limit))
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise UsageError(f"{named} cannot be read ({exc.strerror or exc})") from None
    if len(data) > limit:  # it grew, or its size said nothing (/proc)
        raise UsageError(too_large(named, limit))
    return data


def read_stream(stream: BinaryIO, limit: int, what: str) -> bytes:
    """At most `limit` bytes of `stream` (standard input), refused when there are more."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise UsageError(too_large(what, limit))
    return data


def too_large(named: str, limit: int) -> str:
    return f"{named} is larger than {describe_size(limit)}; is it the right file?"


def describe_size(limit: int) -> str:
    """`64 MiB`, or the bytes when the limit is not a whole number of MiB."""
    return f"{limit >> 20} MiB" if limit and limit % (1 << 20) == 0 else f"{limit} bytes"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"
