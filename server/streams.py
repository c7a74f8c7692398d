"""Server-sent event streams of run files, of a task's loop, and of changes under the root.

A run file stream sends the file from the client's offset on: `data` events whose `id` is the
byte offset after their data, so a client that reconnects with Last-Event-ID gets exactly what it
missed. Text is JSON-encoded in `data` (SSE would turn a lone \\r into a line break), and a
UTF-8 character split across writes is held back until it is whole, so offsets always fall on
character boundaries. The bytes come through the file's shared `Tail`: clients at the same
offset share one read and one encoding of them, and each client is at an offset of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio

from runagent import listing
from runagent.store import follow, runfolder, tasks
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import RunInfo, RunStatus
from server.hub import Hub
from server.tail import Chunk as Chunk  # re-exported: the app and ops read run files here
from server.tail import Tail, decode
from server.tail import file_size as file_size
from server.tail import read_at as read_at

V = TypeVar("V")

RECHECK = 5.0  # seconds between checks when nothing changes (a supervisor killed by SIGKILL)

# One SSE event: a dict of sse-starlette's fields, or (every `data` event of a run file) a chunk
# of the file, framed once for all its clients.
Event = dict[str, Any] | Chunk


def event(kind: str, data: Any, event_id: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"event": kind, "data": json.dumps(data, ensure_ascii=False)}
    if event_id is not None:
        out["id"] = event_id
    return out


@dataclass
class RunWatch:
    """The state one client keeps about one run file."""

    folder: Path
    tail: Tail
    offset: int
    status: RunStatus | None = None
    _info_key: tuple[int, int] | None = None
    _info: RunInfo | None = None
    _meta: int | None = None

    def current(self, recheck: bool, meta_generation: int) -> RunInfo | None:
        """The run's info, re-read only when run-info.yaml changed (or on a recheck, which also
        notices a supervisor that died without a word). Only a change of the hub's meta
        generation can be one of run-info.yaml, so appends to the logs cost no look at it."""
        if meta_generation == self._meta and not recheck:
            return self._info
        self._meta = meta_generation
        try:
            st = os.stat(runfolder.RunPaths(self.folder).info)
            key = (st.st_mtime_ns, st.st_size)
        except OSError:
            key = None
        if key != self._info_key or (recheck and self._info is not None):
            self._info_key = key
            info = runfolder.read_run_info(self.folder)
            self._info = tasks.effective(info, self.folder) if info is not None else None
        return self._info

    def chunks(self, size: int, final: bool) -> list[Event]:
        """Events for every whole character past the offset up to `size`, advancing it; once
        `final`, a character the file ends inside of is sent as a replacement character."""
        out: list[Event] = []
        while (chunk := self.tail.chunk_at(self.offset, size)) is not None:
            self.offset = chunk.end
            out.append(chunk)
        if final and self.offset < size:
            # The file's last bytes, never to be whole: not kept, as no one else ends here.
            data = read_at(self.tail.fence, self.tail.path, self.offset, size - self.offset)
            text, used = decode(data, True)
            if used:
                self.offset += used
                out.append(Chunk.of(self.offset - used, self.offset, text, self.tail.id_prefix))
        return out


async def run_file_events(
    hub: Hub, folder: Path, name: str, offset: int, id_prefix: str = ""
) -> AsyncIterator[Event]:
    """A run file's bytes from `offset`, `status` events, then `end` when all is sent; read
    only while the run folder lies inside its project (a link swapped in for it reads as
    nothing, and as no record)."""
    fence = runfolder.RunPaths(folder).fence
    watch = RunWatch(folder, hub.tail(folder / name, id_prefix, fence), offset)
    seen = hub.generation
    recheck = True
    while True:
        info = watch.current(recheck, hub.meta_generation)
        status = info.status if info is not None else None
        finished = status is not None and status is not RunStatus.RUNNING
        # A recheck (or the end) looks at the file itself: nothing may have woken the hub.
        size = watch.tail.size(seen, fresh=recheck or finished)
        for item in watch.chunks(size, final=finished):
            yield item
        if status is not watch.status:
            watch.status = status
            yield event("status", info.to_dict() if info is not None else None)
        if finished and size <= watch.offset:
            yield event("end", info.to_dict() if info else None, f"{id_prefix}{watch.offset}")
            return
        before = seen
        seen = await hub.wait(seen, RECHECK)
        recheck = seen == before  # nothing changed for RECHECK seconds


async def task_events(
    hub: Hub, task: TaskPaths, name: str, run_id: str | None, offset: int
) -> AsyncIterator[Event]:
    """Follow a task's loop: the current run's file, then each next run's, until the loop ends."""
    seen = hub.generation
    while run_id is None:
        ids = task.run_ids()
        if ids:
            run_id = ids[-1]
            break
        if not follow.loop_alive(task):
            yield event("end", {"task": task.task_id, "runs": 0})
            return
        seen = await hub.wait(seen, RECHECK)
    while True:
        # A run's folder appears a moment before its run-info: announce it once it is there.
        info = runfolder.read_run_info(task.run_folder(run_id))
        while info is None and follow.loop_alive(task):
            seen = await hub.wait(seen, RECHECK)
            info = runfolder.read_run_info(task.run_folder(run_id))
        yield event("run", info.to_dict() if info else {"run_id": run_id}, f"{run_id}:{offset}")
        async for item in run_file_events(
            hub, task.run_folder(run_id), name, offset, id_prefix=f"{run_id}:"
        ):
            if isinstance(item, Chunk) or item["event"] != "end":
                yield item
        # The run is over: wait for the loop's next run, or for the loop to end.
        while True:
            later = follow.next_run_id(task, run_id)
            if later is not None:
                run_id, offset = later, 0
                break
            if not follow.loop_alive(task):
                view = listing.view(task)
                yield event("end", {"task": task.task_id, "status": view.status.value})
                return
            seen = await hub.wait(seen, RECHECK)


def snapshot(root: Path) -> dict[str, str]:
    """Every task's listing row as JSON text, keyed by `project/task` (runagent.listing.rows:
    a settled task's from the root's index)."""
    return listing.rows(root)


def json_array(texts: Iterable[str]) -> str:
    """Rows already written as JSON text, as one JSON array."""
    return "[" + ",".join(texts) + "]"


PASTE_PARTS = ("outbox", "inbox", "sessions")  # of a task's paste/ folder (runagent.paste)


def paste_marks(root: Path) -> dict[str, tuple[tuple[str, str, int, int, int], ...]]:
    """What each task's paste folders hold (names, sizes, times): a new outbox, a reply waiting
    or taken, a session saved change it, though none changes the task's row."""
    marks = {}
    for project in runfolder.project_ids(root):
        bounds = runfolder.fence(root, project)
        for task_id in runfolder.task_ids(root, project):
            folder = root / project / task_id / "paste"
            if not folder.is_dir():
                continue
            entries = []
            for part in PASTE_PARTS:
                if not runfolder.holds(bounds, folder / part):
                    continue
                try:
                    with os.scandir(folder / part) as found:
                        for e in found:
                            if e.name.startswith("."):  # a file being written, to be renamed
                                continue
                            info = e.stat(follow_symlinks=False)
                            entries.append(
                                (part, e.name, info.st_size, info.st_mtime_ns, info.st_ino)
                            )
                except OSError:
                    continue
            marks[f"{project}/{task_id}"] = tuple(sorted(entries))
    return marks


def loop_marks(root: Path) -> dict[str, tuple[int, int]]:
    """Each task's supervisor.log (size, time): a detached loop prints how it ended there after
    it let go of the task, so its last word arrives after the row's last change."""
    marks = {}
    for project in runfolder.project_ids(root):
        for task_id in runfolder.task_ids(root, project):
            path = root / project / task_id / runfolder.SUPERVISOR_LOG
            try:
                info = path.stat(follow_symlinks=False)
            except OSError:
                continue
            marks[f"{project}/{task_id}"] = (info.st_size, info.st_mtime_ns)
    return marks


def of_projects(rows: dict[str, V], reaches: Callable[[str], bool]) -> dict[str, V]:
    """The entries of `rows` (keyed `project/task`) whose project `reaches` lets through."""
    return {key: row for key, row in rows.items() if reaches(key.partition("/")[0])}


Look = tuple[dict[str, str], dict[str, Any], dict[str, tuple[int, int]]]


class Shared:
    """The root as every task-list stream of a server sees it after one change: its rows,
    paste marks and loop marks, worked out once for all the streams waiting on that change (a
    hundred pages open cost one listing a change, not a hundred), in a worker thread, so the
    event loop serves the logs meanwhile. Looked at again at least every RECHECK seconds."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = anyio.Lock()
        self._key: tuple[int, int] | None = None
        self._found: Look = ({}, {}, {})

    async def look(self, generation: int) -> Look:
        key = (generation, int(time.monotonic() // RECHECK))
        async with self._lock:
            if self._key != key:
                self._found = await anyio.to_thread.run_sync(self._walk)
                self._key = key
            return self._found

    def _walk(self) -> Look:
        return snapshot(self.root), paste_marks(self.root), loop_marks(self.root)


_shared: weakref.WeakKeyDictionary[Hub, Shared] = weakref.WeakKeyDictionary()


async def root_events(
    hub: Hub, root: Path, reaches: Callable[[str], bool] = lambda project: True
) -> AsyncIterator[Event]:
    """The task list once, then a `task` event for every task whose row changed, a `paste`
    event (its ids) for every task whose paste session changed (GET .../paste reads it), and a
    `loop` event (its ids) when a task's detached loop said more (the detail's `loop_message`);
    of the projects `reaches` lets through (a token's)."""
    shared = _shared.setdefault(hub, Shared(root))
    seen = hub.meta_generation
    whole, paste, loop = await shared.look(seen)
    rows = of_projects(whole, reaches)
    marks = of_projects(paste, reaches)
    said = of_projects(loop, reaches)
    yield {"event": "snapshot", "data": json_array(rows.values())}
    while True:
        seen = await hub.wait(seen, RECHECK, meta=True)
        whole, paste, loop = await shared.look(seen)
        fresh = of_projects(whole, reaches)
        for key, row in fresh.items():
            if rows.get(key) != row:
                yield {"event": "task", "data": row}
        for key in rows.keys() - fresh.keys():
            project, _, task = key.partition("/")
            yield event("removed", {"project_id": project, "task_id": task})
        rows = fresh
        now = of_projects(paste, reaches)
        for key, mark in now.items():
            if marks.get(key) != mark:
                project, _, task = key.partition("/")
                yield event("paste", {"project_id": project, "task_id": task})
        marks = now
        now_said = of_projects(loop, reaches)
        for key, size_time in now_said.items():
            if said.get(key) != size_time:
                project, _, task = key.partition("/")
                yield event("loop", {"project_id": project, "task_id": task})
        said = now_said


async def until(
    stop: anyio.Event, events: AsyncIterator[Event]
) -> AsyncIterator[dict[str, Any] | bytes]:
    """`events` until `stop` is set (the server is shutting down): the stream then ends as a
    stream ends, with its response completed, instead of being cut off mid-response. A chunk
    goes out as the bytes it was framed in once, for every client."""
    source = aiter(events)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        while True:
            step = asyncio.ensure_future(anext(source))
            await asyncio.wait({step, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await step
                return
            try:
                item = step.result()
            except StopAsyncIteration:
                return
            yield item.wire if isinstance(item, Chunk) else item
    finally:
        stopping.cancel()
