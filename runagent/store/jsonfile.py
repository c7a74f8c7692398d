"""A JSON file run-agent keeps for itself (a queue record, the token file): read whole up to a
limit, or refused with the reason in a few words, never a traceback and never a stall.

Such a file is written by run-agent, but anything may have been left in its place: half a file
after a full disk, a FIFO that would hang the read, gigabytes that would fill the memory, or
brackets nested deeper than the parser recurses. The file is opened without blocking and checked
on its descriptor, read at most one byte past its limit, and its value must be a JSON object.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any


class Unreadable(ValueError):
    """The file is there but cannot be read as a JSON object; the message says why."""


def read_object(path: Path, limit: int) -> dict[str, Any]:
    """The JSON object in the file at `path`, of at most `limit` bytes; FileNotFoundError when
    there is none, Unreadable saying why when it cannot be read as one."""
    return parse_object(read_capped(path, limit))


def read_capped(
    path: Path, limit: int, *, follow: bool = True, opener: Callable[[Path, int], int] = os.open
) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them (a link not followed
    unless `follow`; opened by `opener`, which may refuse it with an OSError of its own);
    FileNotFoundError when there is none, Unreadable saying why when it is not a regular file,
    is larger, or cannot be read."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = opener(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Unreadable("a symbolic link, not a regular file") from None
        raise Unreadable(str(exc.strerror or exc)) from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable("not a regular file")
        if info.st_size > limit:  # refused before any read
            raise Unreadable(over(limit, info.st_size))
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise Unreadable(str(exc.strerror or exc)) from None
    if len(data) > limit:  # it grew since
        raise Unreadable(over(limit, len(data)))
    return data


def parse_object(data: bytes) -> dict[str, Any]:
    """The JSON object `data` holds; Unreadable saying why when it holds none."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Unreadable("not UTF-8 text") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise Unreadable("nests too deeply to be a record") from None
    except json.JSONDecodeError as exc:
        raise Unreadable(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise Unreadable("not a JSON object")
    return value


def over(limit: int, size: int) -> str:
    """`over 4 MiB (20971520 bytes)`."""
    cap = f"{limit >> 20} MiB" if limit % (1 << 20) == 0 else f"{limit} bytes"
    return f"over {cap} ({size} bytes)"
