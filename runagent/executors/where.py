"""Where a loop runs on a host of a cluster, as its host agent says it (ray/hostagent.py): kept
out of the Ray package so that a command that asks the cluster's broker (broker.py) reads the
answer without importing Ray."""

from __future__ import annotations

from runagent.record import record
from runagent.store.lock import Holder


@record
class Where:
    """Where a loop runs, or why it could not start."""

    host: str
    pid: int
    process_start: float | None
    since: str
    error: str | None = None
    exit_code: int | None = None
    node: str = ""
    log_from: int = 0  # where the loop's lines begin in the task's supervisor.log

    def holder(self, label: str) -> Holder:
        return Holder(self.pid, self.process_start, self.since, self.host, label)
