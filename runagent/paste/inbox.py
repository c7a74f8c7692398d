"""The inbox: reply files a person saves, taken oldest first once whole, then moved aside.

A file counts as whole once it has not changed for SETTLE seconds (an editor's save, a slow `cat >`
or a copy over the network all finish by then); names that start with a dot or do not end in .txt
are left alone, so a writer can save to `.reply.tmp` and rename. Links are not followed: the inbox
holds replies, not pointers to other files. watchfiles wakes the wait when something changes.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from runagent.record import record
from runagent.store import runfolder

SETTLE = 1.0  # seconds a reply file must stay unchanged before it is read
WAKE_MS = 500  # the longest the wait sleeps without looking (settling files, heartbeats)
MAX_REPLY = 10 * 1024 * 1024  # bytes of a reply file read; a larger one is refused


@record
class Reply:
    path: Path
    text: str | None  # None: the file could not be read as a reply (`problem` says why)
    problem: str | None = None


def candidates(inbox: Path) -> list[os.DirEntry[str]]:
    try:
        entries = list(os.scandir(inbox))
    except OSError:
        return []
    found = []
    for entry in entries:
        if entry.name.startswith(".") or not entry.name.endswith(".txt"):
            continue
        try:
            if entry.is_file(follow_symlinks=False):
                found.append(entry)
        except OSError:
            continue
    return found


def ready(inbox: Path, now: float | None = None) -> tuple[list[Path], bool]:
    """The whole reply files, oldest first by modification time; and whether a file is still
    being written."""
    now = time.time() if now is None else now
    whole, unsettled = [], False
    stamped = []
    for entry in candidates(inbox):
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        # A time ahead of this clock (a copy from a machine whose clock is ahead) cannot say
        # how recent the file is: it is taken as settled, rather than never taken.
        if 0 <= now - info.st_mtime < SETTLE:
            unsettled = True
            continue
        stamped.append((info.st_mtime_ns, entry.name, Path(entry.path)))
    whole = [p for _, _, p in sorted(stamped)]
    return whole, unsettled


def read(path: Path) -> Reply:
    """A reply's text (as UTF-8, undecodable bytes replaced), never following a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return Reply(path, None, f"it cannot be opened ({exc.strerror})")
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return Reply(path, None, "it is not a regular file")
        data = f.read(MAX_REPLY + 1)
    if len(data) > MAX_REPLY:
        return Reply(path, None, f"it is larger than {MAX_REPLY} bytes")
    return Reply(path, decode(data))


def decode(data: bytes) -> str:
    """A reply's text: UTF-8, or UTF-16 where a byte-order mark says so (a Windows editor's
    "Unicode"); bytes that are neither are replaced, never refused."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", errors="replace")
    return data.decode("utf-8", errors="replace")


def move_aside(path: Path, folder: Path, prefix: str) -> Path:
    """Move a processed reply into `folder` as `{prefix}_{name}`, never over another file."""
    runfolder.make_folder(folder)
    target = folder / f"{prefix}_{path.name}"
    n = 1
    while target.exists():
        n += 1
        target = folder / f"{prefix}_{n}_{path.name}"
    os.rename(path, target)
    return target


def changes(inbox: Path) -> Iterator[object]:
    """Wakes when the inbox changes, and at least every WAKE_MS."""
    import watchfiles  # only a paste run waits on a folder

    return iter(watchfiles.watch(inbox, yield_on_timeout=True, rust_timeout=WAKE_MS, debounce=50))
