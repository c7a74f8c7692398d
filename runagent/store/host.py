"""Which host this process runs on, and how a process on another host is judged alive.

A lock holder and a run name their host, so that a reader on another host of a cluster neither
says "pid 1234" of a process it cannot see nor calls it dead by looking in its own /proc. How a
foreign holder is judged is up to whoever knows the cluster (the Ray executor registers its
judge when it connects); without one, a foreign holder counts as alive: a run is never called
lost on a guess. A task waiting in the cluster's queue is judged the same way: by the cluster,
which still has its placement group or not, else taken at its word.
"""

from __future__ import annotations

import os
from collections.abc import Callable

HOST_ENV = "RUN_AGENT_HOST"  # names this host where its name is not what the cluster calls it

# (task label, host, pid, process start) -> whether that supervisor is still alive
Judge = Callable[[str, str, int, float | None], bool]
_judge: Judge | None = None
# (task label, placement group id) -> whether the cluster still has that group (waiting, or placed)
QueueJudge = Callable[[str, str], bool]
_queue_judge: QueueJudge | None = None


def this_host() -> str:
    return os.environ.get(HOST_ENV) or os.uname().nodename  # gethostname, without socket


def is_here(host: str | None) -> bool:
    """Whether a record naming `host` (None: written before hosts were recorded) is of here."""
    return host is None or host == this_host()


def set_judge(judge: Judge | None) -> None:
    global _judge
    _judge = judge


def foreign_alive(label: str, host: str, pid: int, start: float | None) -> bool:
    return True if _judge is None else _judge(label, host, pid, start)


def set_queue_judge(judge: QueueJudge | None) -> None:
    global _queue_judge
    _queue_judge = judge


def waits_on_cluster(label: str, group: str) -> bool:
    """Whether a task queued on the cluster still waits there (taken at its word when this
    process does not know the cluster)."""
    return True if _queue_judge is None else _queue_judge(label, group)
