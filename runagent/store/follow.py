"""Following a task's file across its runs: which run comes next, whether the loop is still going,
and the bytes as they are written, for `run-agent output --follow` and the server's task stream.

A reader holds a cursor (run id, byte offset). When its run is over it moves to the next run of
the loop, and it stops once the loop has ended and the last run's file is read to its end.
"""

from __future__ import annotations

import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from runagent.store import runfolder, tasks
from runagent.store.lock import live_holder
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import RunStatus

CHUNK = 64 * 1024  # bytes of a run file read at a time, here and by the server's streams
RECHECK_MS = 1000  # a change can go unseen (a supervisor killed by SIGKILL writes nothing)


def next_run_id(task: TaskPaths, run_id: str) -> str | None:
    """The run the loop started after `run_id`, if any (ids sort in start order)."""
    later = [r for r in task.run_ids() if r > run_id]
    return later[0] if later else None


def loop_alive(task: TaskPaths) -> bool:
    """Whether a supervisor still holds the task, or its latest run is conductor-loop's and
    alive (its loop holds no lock of run-agent's), so more may come."""
    return live_holder(task.lock) is not None or tasks.live_unsupervised(task)


def run_over(task: TaskPaths, run_id: str) -> bool:
    """Whether the run has ended (or its supervisor is gone), liveness-checked."""
    folder = task.run_folder(run_id)
    info = runfolder.read_run_info(folder)
    return info is not None and tasks.effective(info, folder).status is not RunStatus.RUNNING


def changes(folder: Path, stop: threading.Event | None = None) -> Iterator[object]:
    """Wakes on every change under `folder`, and at least every RECHECK_MS; ends once `stop`
    is set."""
    import watchfiles  # only a follower needs it

    return iter(
        watchfiles.watch(
            folder, yield_on_timeout=True, rust_timeout=RECHECK_MS, debounce=50, stop_event=stop
        )
    )


def follow(
    task: TaskPaths,
    run_id: str,
    name: str,
    wake: Iterable[object],
    announce: Callable[[str, str], None] = lambda previous, run: None,
) -> Iterator[bytes]:
    """The bytes of file `name` in run `run_id` as they are written, then in each next run
    (`announce(previous, next)` marks the step), until the loop has ended; between reads it
    waits for the next item of `wake`."""
    waits = iter(wake)
    offset = 0
    while True:
        path = task.run_folder(run_id) / name
        try:
            with runfolder.open_regular(path, task.fence) as f:  # never through a link out
                f.seek(offset)
                while chunk := f.read(CHUNK):
                    offset += len(chunk)
                    yield chunk
        except OSError as exc:
            if exc.errno not in runfolder.NOT_THERE:
                raise
        # A run whose record cannot be read (or leads out) is over once no loop holds the task.
        if run_over(task, run_id) or not loop_alive(task):
            later = next_run_id(task, run_id)
            if later is not None:
                announce(run_id, later)
                run_id, offset = later, 0
                continue
            if not loop_alive(task) and _size(task, path) <= offset:
                return
        next(waits, None)


def _size(task: TaskPaths, path: Path) -> int:
    """The size of a run file as `follow` reads it: 0 where it is not there or is a link."""
    found = runfolder.stat_in(task.fence, path, follow=False)
    return found.st_size if found is not None and stat.S_ISREG(found.st_mode) else 0
