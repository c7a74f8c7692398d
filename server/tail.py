"""A streamed run file's recent chunks, read, decoded and framed once for every client of it.

Every client streaming a file is woken by the same change; those caught up with the end of the
file are all at the same offset, so the first of them reads the new bytes, decodes them, encodes
them as JSON and frames the SSE event, and the others take that event from here. A client at any
other offset (a backlog, a reconnect, a slow socket) reads from its own offset, and what it reads
is kept too, for a client that follows it. The chunks are kept least recently used first out, up
to KEEP_BYTES per file, so a lagging client costs memory only through its own socket's buffer.
"""

from __future__ import annotations

import codecs
import json
import os
import stat
from collections import OrderedDict
from pathlib import Path

from sse_starlette import ServerSentEvent

from runagent.record import record
from runagent.store import follow, runfolder

CHUNK = follow.CHUNK  # the most bytes one event carries: the core's read size, one owner
# Framed bytes kept per file: several chunks, so a client a step behind still shares.
KEEP_BYTES = 1024 * 1024
SEP = "\r\n"  # the line separator of sse-starlette's EventSourceResponse, which sends these frames


def decode(data: bytes, final: bool) -> tuple[str, int]:
    """The text of `data` and how many bytes it used: a split character at the end waits."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(data, final=final)
    return text, len(data) - len(decoder.getstate()[0])


def read_at(fence: str, path: Path, offset: int, size: int = CHUNK) -> bytes:
    """Up to `size` bytes of a run file at `offset`, if it lies inside `fence` (its project's,
    runfolder.fence) when it is opened: a run folder swapped for a link to another project's
    under a stream already open reads as empty. Run files are never symbolic links, so one is
    not followed (O_NOFOLLOW): a link swapped in for a run file reads as empty too, and so does
    anything but a regular file (nor is a FIFO left in its place waited on)."""
    try:
        fd = runfolder.open_in(fence, path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return b""
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return b""
        try:
            return os.pread(f.fileno(), size, offset)
        except (OSError, OverflowError):
            return b""


def file_size(fence: str, path: Path) -> int:
    """The size `read_at` sees: 0 for anything but a regular file inside `fence` (a link at
    the end is not followed)."""
    st = runfolder.stat_in(fence, path, follow=False)
    return st.st_size if st is not None and stat.S_ISREG(st.st_mode) else 0


@record
class Chunk:
    """Whole characters of a file from `start` to `end`, as one SSE `data` event whose id is
    `end` (after the stream's id prefix)."""

    start: int
    end: int
    data: str  # the text, JSON-encoded
    event_id: str
    wire: bytes  # the whole event as sent

    @classmethod
    def of(cls, start: int, end: int, text: str, id_prefix: str) -> Chunk:
        data = json.dumps(text, ensure_ascii=False)
        event_id = f"{id_prefix}{end}"
        wire = ServerSentEvent(data, event="data", id=event_id, sep=SEP).encode()
        return cls(start, end, data, event_id, wire)


class Tail:
    """The chunks of one file (under one id prefix) that its clients read last."""

    def __init__(self, path: Path, id_prefix: str, fence: str) -> None:
        self.path = path
        self.id_prefix = id_prefix
        self.fence = fence  # what the file must lie inside when it is read: its project
        self._chunks: OrderedDict[int, Chunk] = OrderedDict()
        self._bytes = 0
        self._size: tuple[int, int] | None = None  # (hub generation, size then)
        self.reads = 0  # chunks read from the file (the rest were shared)
        # (offset, size) of the last read that held only the first bytes of a character: every
        # client at that offset waits for the rest without reading the same bytes again.
        self._short: tuple[int, int] | None = None

    def size(self, generation: int, fresh: bool = False) -> int:
        """The file's size, looked at once per hub generation (an append moves it), or now."""
        if fresh or self._size is None or self._size[0] != generation:
            self._size = (generation, file_size(self.fence, self.path))
        return self._size[1]

    def chunk_at(self, offset: int, size: int) -> Chunk | None:
        """The whole characters at `offset` of the file's first `size` bytes, if there are any."""
        chunk = self._chunks.get(offset)
        if chunk is not None:
            self._chunks.move_to_end(offset)
            return chunk
        if offset >= size or self._short == (offset, size):
            return None
        # No further than `size`, so every client at this offset in this generation gets the
        # same chunk, whatever was appended since.
        data = read_at(self.fence, self.path, offset, min(CHUNK, size - offset))
        self.reads += 1
        text, used = decode(data, final=False)
        if used == 0:
            self._short = (offset, size)
            return None  # only the first bytes of a character so far
        chunk = Chunk.of(offset, offset + used, text, self.id_prefix)
        self._keep(chunk)
        return chunk

    def _keep(self, chunk: Chunk) -> None:
        self._chunks[chunk.start] = chunk
        self._bytes += len(chunk.wire)
        while self._bytes > KEEP_BYTES and len(self._chunks) > 1:
            _, old = self._chunks.popitem(last=False)
            self._bytes -= len(old.wire)

    def kept(self) -> tuple[int, int]:
        """How many chunks and framed bytes are kept (for the tests of the bound)."""
        return len(self._chunks), self._bytes
