"""The change hub: one watchfiles watcher over the runs root that wakes every waiting stream.

Streams do not receive data from the hub, only a wake-up: each one then takes its file's bytes
from its own offset, through the file's shared `Tail` (kept here, one per streamed file), which
reads and encodes them once for every client at that offset. So the hub holds no per-client
buffer, and a slow client costs nothing but its own socket.

A wake-up is a future that is resolved and replaced on every change. Waiters share it without a
lock, so a client whose wait is cancelled (it went away) touches nothing any other client or the
shutdown depends on: an `asyncio.Condition` here let one cancelled waiter break another's
re-acquisition of the shared lock ("Lock is not acquired"), and that client froze.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from pathlib import Path

import watchfiles

from runagent.store import runfolder
from server.tail import Tail

log = logging.getLogger("run-agent.server")

# watchfiles groups changes: yield once nothing new came for STEP ms, or after DEBOUNCE ms.
STEP_MS = 1
DEBOUNCE_MS = 20
READY_WAIT = 10  # seconds start-up waits for the watcher to be set up


# Appends to these are the bulk of all changes and never change a listing or a status.
LOG_FILES = {runfolder.STDOUT, runfolder.STDERR}


class Hub:
    """Counts changes under `root`; `wait(seen)` returns once the count has moved past `seen`.

    `generation` moves on every change; `meta_generation` only on changes that can alter a
    listing or a status (anything but the agents' stdout and stderr).
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.generation = 0
        self.meta_generation = 0
        self._changed: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        # A tail lives while a stream holds it: the last client to go takes its chunks along.
        self._tails: weakref.WeakValueDictionary[tuple[Path, str], Tail] = (
            weakref.WeakValueDictionary()
        )

    def tail(self, path: Path, id_prefix: str, fence: str) -> Tail:
        """The tail of `path` (read while it lies inside `fence`, its project's) shared by every
        stream of it with this id prefix."""
        key = (path, id_prefix)
        tail = self._tails.get(key)
        if tail is None:
            tail = self._tails[key] = Tail(path, id_prefix, fence)
        return tail

    async def start(self) -> None:
        runfolder.make_folder(self.root)
        self._changed = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        ready = asyncio.Event()
        self._task = asyncio.create_task(self._watch(ready))
        # Wait until the watcher is set up, so no change right after start-up is missed. A
        # root of 100,000 runs is as many folders to watch: its watcher may take longer to
        # set up than a server should take to answer; it goes on setting up meanwhile.
        try:
            await asyncio.wait_for(asyncio.shield(ready.wait()), timeout=READY_WAIT)
        except TimeoutError:
            log.warning("run-agent: watching %s for changes takes more than %d s to set up "
                        "(a watch a folder); until it is, each stream looks every few seconds",
                        self.root, READY_WAIT)  # fmt: skip

    async def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self.notify(set())  # wake every waiter so it can notice the shutdown

    async def _watch(self, ready: asyncio.Event) -> None:
        assert self._stop is not None
        roots = {self.root, self.root.resolve()}  # as watchfiles may report either

        def wanted(_: watchfiles.Change, path: str) -> bool:
            return not any(runfolder.in_worktree(root, Path(path)) for root in roots)

        watcher = watchfiles.awatch(
            self.root,
            stop_event=self._stop,
            step=STEP_MS,
            debounce=DEBOUNCE_MS,
            recursive=True,
            # An issue run's worktree is a checkout: its edits change no listing or stream.
            watch_filter=wanted,
            ignore_permission_denied=True,
            yield_on_timeout=True,
            rust_timeout=200,
        )
        try:
            async for changes in watcher:
                ready.set()
                if changes:
                    await self.notify({Path(path) for _, path in changes})
        except (OSError, RuntimeError) as exc:  # past the system's inotify watches, say
            log.warning("run-agent: cannot watch %s for changes (%s); each stream looks every "
                        "few seconds instead", self.root, exc)  # fmt: skip

    async def notify(self, paths: set[Path]) -> None:
        if self._changed is None:
            return
        self.generation += 1
        if not paths or any(p.name not in LOG_FILES for p in paths):
            self.meta_generation += 1
        woken, self._changed = self._changed, asyncio.get_running_loop().create_future()
        woken.set_result(None)

    async def wait(self, seen: int, timeout: float, meta: bool = False) -> int:
        """The (meta) generation after `seen`, or the current one after `timeout` seconds.

        Cancelling a wait (a client that disconnects) cancels only that wait: `asyncio.wait`
        never cancels the shared future it watches.
        """
        assert self._changed is not None

        def current() -> int:
            return self.meta_generation if meta else self.generation

        deadline = asyncio.get_running_loop().time() + timeout
        while current() == seen:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            await asyncio.wait([self._changed], timeout=left)
        return current()
