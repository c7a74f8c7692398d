"""Which executor runs a task's loop: the local one (local.py, a detached supervisor on this
machine) or Ray (the package ray/, imported only when configured), which starts the same
supervisor on a host of a cluster. The service (service.py) starts and stops loops through here
and never asks which one runs them."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from runagent.config.overrides import LoopOverrides
from runagent.config.settings import ExecutorSettings, ExecutorType
from runagent.errors import MissingDependencyError, RunAgentError
from runagent.executors.local import (
    CLUSTER_ENV,
    LOCK_WAIT,
    START_WAIT,
    Started,
    loop_argv,
    start_local,
    stop_local,
)
from runagent.store import host
from runagent.store.lock import Holder
from runagent.store.runfolder import TaskPaths

if TYPE_CHECKING:  # a queued task's record: loaded where there is a queue
    from runagent.fleet.queue import Pause, Waiting

__all__ = ["LOCK_WAIT", "START_WAIT", "Started", "loop_argv", "start_detached", "stop"]


def start_detached(
    task: TaskPaths,
    command: str,
    overrides: LoopOverrides,
    *,
    config_path: Path | None,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    schedule: str | None = None,
    again: bool = False,
    wait: float | None = None,
    executor: ExecutorSettings | None = None,
) -> Started:
    """Start `run-agent COMMAND` for `task` on `executor` (None: this machine); return once its
    supervisor holds the task.

    Raises AlreadyRunningError if another supervisor holds the task (naming its host when that
    is another), and the error its exit code stands for (errors.error_for_exit), with the tail
    of supervisor.log, if the new one exits before taking the lock.
    """
    if executor is not None and executor.type is ExecutorType.RAY:
        return ray_executor(executor).start(
            task, command, overrides, config_path=config_path, cwd=cwd, schedule=schedule,
            again=again, wait=START_WAIT if wait is None else wait,
        )  # fmt: skip
    argv = loop_argv(command, task, overrides, config_path, schedule, again)
    return start_local(task, argv, cwd=cwd, env=env, wait=LOCK_WAIT if wait is None else wait)


def stop(
    task: TaskPaths, wait: float | None, executor: ExecutorSettings | None = None
) -> Holder | None:
    """Ask the task's supervisor to stop its loop, and wait up to `wait` seconds for it to exit
    (None: do not wait). Its agent's tree is killed by run-agent's own reaper, on whatever host.

    Returns the holder that was asked, or None if the task was not running. Raises
    RunAgentError if the supervisor is still alive after `wait`.
    """
    if executor is not None and executor.type is ExecutorType.RAY:
        asked = ray_executor(executor).stop(task, wait)
        if asked is not None:
            return asked
    return stop_local(task, wait)


def withdraw(task: TaskPaths, executor: ExecutorSettings | None) -> Waiting | None:
    """Take a task that waits in the cluster's queue out of it (`stop`); its record, or None
    if it does not wait there (a local queue is the fleet's: gate.dequeue)."""
    if executor is None or executor.type is not ExecutorType.RAY:
        return None
    return ray_executor(executor).withdraw(task)


class Located(Protocol):
    """Where a loop runs on another executor."""

    @property
    def log_from(self) -> int: ...  # where its lines begin in the task's supervisor.log

    @property
    def node(self) -> str: ...  # the cluster's id of its host

    def holder(self, label: str) -> Holder: ...


class Executor(Protocol):
    """What runs task loops elsewhere than in a detached supervisor on this machine."""

    def start(
        self, task: TaskPaths, command: str, overrides: LoopOverrides, *,
        config_path: Path | None, cwd: Path, schedule: str | None, again: bool, wait: float,
    ) -> Started: ...  # fmt: skip

    def stop(self, task: TaskPaths, wait: float | None) -> Holder | None: ...

    def withdraw(self, task: TaskPaths) -> Waiting | None: ...

    def hold_name(self, name: str) -> bool: ...

    def read(self, task: TaskPaths, relative: str, offset: int, limit: int) -> bytes: ...

    def locate(self, label: str) -> Located | None: ...

    def ended(self, label: str, since: float) -> dict[str, Any] | None: ...

    def hosts(self) -> tuple[int, int]: ...

    def present(self, label: str) -> bool: ...

    def state_kept(self) -> str: ...

    def receive_runs(self, root: Path) -> None: ...

    def judge(self, label: str, on: str, pid: int, start: float | None) -> bool: ...

    def waits(self, label: str, group_id: str) -> bool: ...

    def sync_pauses(self, root: Path) -> None: ...

    def unpause(self, agent: str) -> Pause | None: ...


_broker_root: Path | None = None  # the command line's runs root: its calls go by its broker


def use_broker(root: Path | None) -> None:
    """Hand this process's calls to the cluster to the broker of `root` (the command line, whose
    commands are short: joining would cost each about a second); None: join it here."""
    global _broker_root
    _broker_root = root


def ray_executor(settings: ExecutorSettings, direct: bool = False) -> Executor:
    """The Ray executor for `settings`: for the command line, the one its runs root's broker
    carries (executors/broker.py), unless `direct`, where none can answer, or in a process that
    joined the cluster already; else joined here. MissingDependencyError saying how to install
    the extra when Ray is not installed. Ray is imported here only: it costs a second."""
    if not direct and _broker_root is not None and not _joined() and not os.environ.get(
        CLUSTER_ENV
    ):  # fmt: skip
        from runagent.executors import broker

        if not broker.disabled():
            found = broker.reach(_broker_root, settings, lambda: ray_executor(settings, True))
            if found is not None:
                return found
    try:
        from runagent.executors import ray as rayexecutor
    except ImportError as exc:
        if exc.name is None or not exc.name.startswith("ray"):
            raise
        raise MissingDependencyError(
            "executor 'ray' needs Ray, which is not installed; install it with "
            "pip install 'run-agent[ray]', or use --executor local"
        ) from None
    return rayexecutor.connect(settings)


def _joined() -> bool:
    """Whether this process joined a Ray cluster already (Ray is not imported to ask)."""
    ray = sys.modules.get("ray")
    return ray is not None and bool(getattr(ray, "is_initialized", lambda: False)())


class ClusterSlot(Protocol):
    """A loop's agent_slot on the cluster it runs on (ray/slot.py), given back while its agent
    is paused and taken again on its host when the pause lifts."""

    def give_back(self) -> bool: ...

    @property
    def bundle(self) -> dict[str, float]: ...  # what it is to take again of its host

    def take_again(self, stopped: Callable[[float], bool]) -> bool: ...


def cluster_slot(task: TaskPaths) -> ClusterSlot | None:
    """The agent_slot of this process's loop of `task` on the cluster whose host agent started
    it, taken out of the environment (its agents do not inherit it); None for a loop that no
    host agent started."""
    said = os.environ.pop(CLUSTER_ENV, None)
    if not said:
        return None
    try:
        found = json.loads(said)
        held = {str(k): float(v) for k, v in (found.get("held") or {}).items()}
        if not (found.get("address") and found.get("namespace")):
            return None
    except (ValueError, TypeError, AttributeError):
        return None
    return _SlotLater(said, task.label, held)


class _SlotLater:
    """A loop's ClusterSlot (ray/slot.py), made, and so Ray imported, only when it is given back
    or taken again: every loop on a cluster host has one, and importing Ray costs it a second
    before its first run (seconds on a busy host), where most loops' agents are never paused."""

    def __init__(self, said: str, label: str, held: dict[str, float]) -> None:
        self.said, self.label, self.held = said, label, held
        self.slot: ClusterSlot | None = None

    def _made(self) -> ClusterSlot:
        if self.slot is None:
            from runagent.executors.ray.slot import Cluster, Slot

            cluster = Cluster.from_env({CLUSTER_ENV: self.said})
            if cluster is None:
                raise RunAgentError(f"{CLUSTER_ENV} does not name a cluster: {self.said!r}")
            self.slot = Slot(cluster, self.label)
        return self.slot

    def give_back(self) -> bool:
        return self._made().give_back()

    @property
    def bundle(self) -> dict[str, float]:
        return self.slot.bundle if self.slot is not None else dict(self.held)

    def take_again(self, stopped: Callable[[float], bool]) -> bool:
        return self._made().take_again(stopped)


def apart(executor: ExecutorSettings | None) -> bool:
    """Whether loops run on a Ray cluster whose hosts keep runs roots of their own."""
    return executor is not None and executor.apart


def sync_pauses(root: Path, executor: ExecutorSettings | None) -> None:
    """On a cluster whose hosts keep runs roots of their own: bring the agents paused on any
    host into `root` (and those paused under `root` to the cluster), so a start from here, the
    keeper and a listing of `root` see them (ray/pauses.py). Nothing elsewhere, nor in a loop a
    host agent started, whose agent does it for its host's root; a cluster that cannot be
    asked leaves `root` as it is (a start then fails on its own, saying why)."""
    if not apart(executor) or os.environ.get(CLUSTER_ENV):
        return
    assert executor is not None
    try:
        ray_executor(executor).sync_pauses(root)
    except RunAgentError:
        return


def unpause(executor: ExecutorSettings | None, agent: str) -> Pause | None:
    """Lift `agent`'s pause on every host of a cluster whose hosts keep runs roots of their own
    (`fleet unpause`); the pause the cluster had, if any. Nothing elsewhere."""
    if not apart(executor):
        return None
    assert executor is not None
    return ray_executor(executor).unpause(agent)


def hold_scheduler(executor: ExecutorSettings | None) -> bool:
    """Whether this process may fire schedules: always on this machine; on a cluster only the
    one process that holds the cluster-wide scheduler name (held until the process ends)."""
    if executor is None or executor.type is not ExecutorType.RAY:
        return True
    return ray_executor(executor).hold_name(SCHEDULER_NAME)


SCHEDULER_NAME = "scheduler"


def judge_foreign_hosts(executor: ExecutorSettings) -> None:
    """Have supervisors on other hosts, and tasks queued on the cluster, judged by the
    cluster, which is joined only when one is first met (a listing of local tasks never pays
    for Ray)."""

    def judge(label: str, on: str, pid: int, start: float | None) -> bool:
        try:
            cluster = ray_executor(executor)
        except RunAgentError:  # no cluster to ask: a run is never called lost on a guess
            return True
        return cluster.judge(label, on, pid, start)

    def waits(label: str, group_id: str) -> bool:
        try:
            cluster = ray_executor(executor)
        except RunAgentError:  # no cluster to ask: a queued task is taken at its word
            return True
        return cluster.waits(label, group_id)

    host.set_judge(judge)
    host.set_queue_judge(waits)
