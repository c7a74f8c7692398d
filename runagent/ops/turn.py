"""The turn of an operations run: one message answered at a time, whichever process sends it
(`run-agent ops`, the server, an agent-mode run), so two batches never interleave and a pause is
never overwritten by another; a flock, which the kernel drops when its holder dies."""

from __future__ import annotations

from runagent.store.lock import TaskLock, read_holder


class TurnLock(TaskLock):
    """Held while a process answers one message of the run `label` (its run id)."""

    def _busy_message(self) -> str:
        holder = read_holder(self.path, self.label)
        who = f" (pid {holder.pid} since {holder.since})" if holder is not None else ""
        return f"run {self.label} is answering another message{who}"
