"""The starter's side of the Ray executor (RayExecutor): it claims a task's placement group,
hands its loop to the host agent of the host Ray places the group on, and finds, follows, reads
and stops it there; `connect` joins the cluster once per process.

A task's group is named by its label, which makes the name the cluster-wide lock: a second
start anywhere is refused, naming the host that holds the task. Ray places the group on a host
with the slot free, or keeps it in Ray's queue while none has one; a waiting group costs no
process anywhere, and the host's agent takes it up once it is placed.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import runagent.executors.ray.boundary as boundary
import runagent.executors.ray.pauses as pauses
import runagent.executors.ray.store as store
from runagent.config.overrides import LoopOverrides
from runagent.config.settings import ExecutorSettings
from runagent.errors import (
    AlreadyRunningError,
    ExitCode,
    MissingDependencyError,
    RunAgentError,
    error_for_exit,
)
from runagent.executors import local as localexecutor
from runagent.executors.ray.boundary import (
    ClusterError,
    GoneError,
    NameTakenError,
    NoAnswerError,
    NoClusterError,
    RestartingError,
    TimedOutError,
)
from runagent.executors.ray.hostagent import (
    ADOPT_TICK,
    AGENT,
    CALL_WAIT,
    PLACEMENT_WAIT,
    RemoteHostAgent,
)
from runagent.executors.ray.mirror import HOME, RemoteHome
from runagent.executors.ray.store import WAITING_STATES, LoopSpec
from runagent.executors.where import Where
from runagent.fleet.queue import Fleet, Pause, Turn, Waiting, needs_words, now
from runagent.loop.context import QUEUED_SINCE
from runagent.store import host, runfolder, taskfolder
from runagent.store.lock import Holder, already_running
from runagent.store.runfolder import TaskPaths

PLACEMENT_GRACE = 10.0  # seconds a group is given to be placed while a host has room
QUEUED_LOOK = 0.2  # seconds a start with no host free waits before it counts as queued
STALE_SPEC = 30.0  # seconds a spec without its group counts as a start still being made
JUDGE_TTL = 1.0  # seconds a judgement of a foreign supervisor is reused
# Ray starts its workers at nice 15 (its worker_niceness), and what a worker starts inherits
# it: the host agent's supervisors, reapers and agents would run behind everything else on
# their host, seconds late to start on a busy one. The host agent's worker runs at the host's
# own priority, as a driver Ray's job submission starts does (Ray reads this variable of a
# worker's runtime environment as it starts the worker).
HOST_AGENT_ENV = {"env_vars": {"RAY_worker_niceness": "0"}}

_executors: dict[str, RayExecutor] = {}  # by settings: one view of the cluster per process


def _ran_since(task: TaskPaths, since: str, node: str) -> Where | None:
    """Where the task's loop ran, if its latest run started at `since` or later and it has
    completed (DONE written): a start whose own call came after the loop that the host took
    up from the queue had already run and ended. None otherwise (or where the runs root is
    not shared, and the run is not to be read here)."""
    ids = task.run_ids()
    info = runfolder.read_run_info(task.run_folder(ids[-1])) if ids else None
    if info is None or not task.done.exists() or info.host is None:
        return None
    before = runfolder.seconds_between(info.start_time, since)  # 0: it started at `since` or after
    if before is None or before > 0 or info.supervisor_pid is None:
        return None
    return Where(info.host, info.supervisor_pid, info.supervisor_start, info.start_time,
                 node=node)  # fmt: skip


class _Name:
    """A name held for as long as the process that made it lives (a non-detached actor)."""

    def held(self) -> bool:
        return True


RemoteName: Any = ray.remote(_Name)


class RayExecutor:
    """The starter's side: claims a task's group, hands its loop to the host it is placed on,
    and finds, follows and stops it there."""

    def __init__(self, settings: ExecutorSettings) -> None:
        self.settings = settings
        self.namespace = settings.namespace
        self._names: dict[str, Any] = {}
        self._agents: dict[str, Any] = {}
        self._judged: dict[str, tuple[float, Where | None]] = {}

    def start(
        self, task: TaskPaths, command: str, overrides: LoopOverrides, *,
        config_path: Path | None, cwd: Path, schedule: str | None, again: bool, wait: float,
        queued_since: str | None = None,
    ) -> localexecutor.Started:  # fmt: skip
        """Start the task's loop on a host with room, or queue it in Ray's queue. `queued_since`:
        when its start was queued before it came here (None: as this process's environment says,
        QUEUED_SINCE; the broker hands on its command's)."""
        s = self.settings
        if queued_since is None:
            queued_since = os.environ.get(QUEUED_SINCE, "")
        spec = LoopSpec(
            task.project_id, task.task_id, task.root.resolve(), s.shared_root, command, overrides,
            config_path.resolve() if config_path else None, cwd.resolve(), schedule, again,
            taskfolder.read_task_prompt(task), wait, time.time(), s.max_restarts,
            queued_since=queued_since,
        )  # fmt: skip
        self._refuse_unmeetable(task.label)
        queued_at = now()  # before the group: any run of it starts later
        self._claim(spec)
        room = self._room()
        try:
            group = store.make_group(task.label, self._bundle())
        except ClusterError as exc:  # NameTakenError: the name was taken since the claim
            store.drop_spec(self.namespace, task.label)
            if not isinstance(exc, NameTakenError):
                raise
            raise AlreadyRunningError(self._refusal(task.label)) from None
        fleet = Fleet(task.root)
        found = self._placed(task.label, group, PLACEMENT_GRACE if room else QUEUED_LOOK)
        if found is None:
            self.ensure_agents()  # the host it lands on takes it up
            return localexecutor.Started(0, None, self._queue(fleet, task, group, queued_at))
        if fleet.exists():
            fleet.off_cluster(task)
        node = store.group_node(found)
        spec = replace(spec, group=str(found["placement_group_id"]))
        try:
            where: Where = self._ask(node, "start", spec, wait=wait + PLACEMENT_WAIT)
        except TimedOutError:
            raise RunAgentError(
                f"task {task.label} was placed on a host of the Ray cluster but its loop did "
                f"not start within {wait + PLACEMENT_WAIT:g}s; see the host's Ray worker logs"
            ) from None
        except (GoneError, RestartingError) as exc:
            raise RunAgentError(
                f"the host agent that was to start task {task.label} died: {exc}"
            ) from exc
        if where.error is not None:
            ran = _ran_since(task, queued_at, node)
            if ran is None:
                code = where.exit_code if where.exit_code is not None else 1
                raise error_for_exit(code, where.error)
            where = ran  # its loop was taken up from the queue and ended before this call
        return localexecutor.Started(where.pid, where.holder(task.label))

    def _placed(self, label: str, group: Any, wait: float) -> dict[str, Any] | None:
        """The task's group once placed, waited for up to `wait` seconds; None if it still
        waits. A host agent that freed a slot may make the waiting group again under its name
        meanwhile (hostagent's hand-over): then the group of that name is waited for."""
        deadline = time.monotonic() + wait
        if boundary.placed(group, wait):
            placed = store.group(label, self.namespace)
            if placed is not None:
                return placed
        while True:
            found = store.group(label, self.namespace)
            if found is None or found["placement_group_id"] == group.id.hex():
                return None  # gone (stopped meanwhile), or still the one that waits
            if found.get("state") == "CREATED":
                return found
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)

    def _bundle(self) -> dict[str, float]:
        """What the task's group holds of a host: executor.resources (a group must hold
        something; with none configured, one byte of memory, which every host has)."""
        return dict(self.settings.resources) or {"memory": 1.0}

    def _claim(self, spec: LoopSpec) -> None:
        """Take the task's name cluster-wide, by putting its spec in the cluster's store where
        none is; AlreadyRunningError (naming the host) if it runs, waits or is starting. A group
        or spec some start left behind (a host agent gone with it) is cleared first."""
        label = spec.label
        for _ in range(2):
            group = store.group(label, self.namespace)
            if group is not None:
                if group.get("state") in WAITING_STATES:
                    raise AlreadyRunningError(self._queued_words(label))
                try:
                    where = self._locate(group, label)
                except NoAnswerError:  # its host agent restarts, or is busy
                    raise AlreadyRunningError(already_running(label, None)) from None
                if where is not None:
                    raise AlreadyRunningError(
                        already_running(label, where.holder(label), host=True)
                    )
                if not self._left_behind(group, label):
                    raise AlreadyRunningError(already_running(label, None))
                store.remove_group(label, self.namespace, group["placement_group_id"])
                store.drop_spec(self.namespace, label)
            if not store.put_spec(self.namespace, spec, overwrite=False):
                return
            old = store.spec(self.namespace, label)
            young = old is not None and time.time() - max(old.submitted, old.touched) < STALE_SPEC
            if young or store.group(label, self.namespace) is not None:
                continue  # another start is being made: look at it again
            store.drop_spec(self.namespace, label)
        raise AlreadyRunningError(already_running(label, None))

    def _left_behind(self, group: Mapping[str, Any], label: str) -> bool:
        """Whether a placed group has no loop: its host has no agent, or its agent does not
        know the task after it has had time to take the group up."""
        node = store.group_node(group)
        for look in range(3):
            try:
                if self._ask(node, "knows", label, create=False):
                    return False
            except NoAnswerError:
                return False  # busy or restarting: not left behind on a guess
            except GoneError:
                return True
            if look < 2:
                time.sleep(ADOPT_TICK * 2)
        return True

    def _agent(self, node: str, create: bool = True) -> Any:
        """The host agent of `node` (started there if it has none, unless not `create`)."""
        agent = self._agents.get(node)
        if agent is not None:
            return agent
        if not create:
            agent = boundary.actor(AGENT + node, self.namespace)  # GoneError: none
        else:
            agent = RemoteHostAgent.options(
                name=AGENT + node, namespace=self.namespace, lifetime="detached",
                get_if_exists=True, num_cpus=0, max_concurrency=64, max_restarts=-1,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                runtime_env=HOST_AGENT_ENV,
            ).remote()  # fmt: skip
        self._agents[node] = agent
        return agent

    def _ask(self, node: str, method: str, *args: Any, wait: float = CALL_WAIT,
             create: bool = True) -> Any:  # fmt: skip
        """`method(*args)` of `node`'s host agent; an agent being started again on its host is
        waited for (up to `wait`), not taken for gone."""
        deadline = time.monotonic() + wait
        while True:
            agent = self._agent(node, create)
            try:
                return boundary.call(getattr(agent, method), *args, timeout=wait)
            except RestartingError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
            except GoneError:
                self._agents.pop(node, None)
                raise

    def ensure_agents(self) -> None:
        """A host agent on every live host that could take a loop (started once; a host that
        joins later gets one at the next start), so a group placed there is taken up."""
        needs = self.settings.resources
        for node in store.hosts():
            if node.get("Alive") and store.fits(node.get("Resources") or {}, needs):
                self._agent(str(node["NodeID"]))

    def _room(self) -> bool:
        """Whether a host of the cluster has room for one more loop now."""
        free = store.free_per_host()
        return any(store.fits(room, self.settings.resources) for room in free.values())

    def _refuse_unmeetable(self, label: str) -> None:
        """A loop no host of the cluster could ever take is refused, not queued forever."""
        needs = self.settings.resources
        hosts = [node for node in store.hosts() if node.get("Alive")]
        if not any(store.fits(node.get("Resources") or {}, needs) for node in hosts):
            raise RunAgentError(
                f"task {label} cannot start: no host of the Ray cluster has "
                f"{needs_words(needs)} (executor.resources); join hosts with "
                "`ray start --resources '{\"agent_slot\": N}'`"
            )

    def _queue(self, fleet: Fleet, task: TaskPaths, group: Any, queued_at: str) -> Turn:
        """Record that the task waits in the cluster's queue (so listings show it queued);
        its turn, with the tasks recorded as waiting before it."""
        with fleet.locked():
            ahead = [w for w in fleet.on_cluster(clean=True) if w.label != task.label]
            waiting = Waiting(
                task.project_id, task.task_id, "", fleet.next_seq(), submitted=queued_at,
                cluster={"group": group.id.hex(), "needs": dict(self.settings.resources)},
            )  # fmt: skip
            fleet.put_on_cluster(waiting)
        return Turn(False, len(ahead), waiting.cluster_words())

    def _queued_words(self, label: str) -> str:
        return (
            f"task {label} is already queued on the Ray cluster, waiting for a free host; "
            "`run-agent stop` takes it out"
        )

    def _refusal(self, label: str) -> str:
        """Why a second start of a task whose group exists is refused: it runs, or it waits."""
        group = store.group(label, self.namespace)
        if group is not None and group.get("state") in WAITING_STATES:
            return self._queued_words(label)
        where = self.locate(label)
        holder = where.holder(label) if where is not None else None
        return already_running(label, holder, host=True)

    def _locate(self, group: Mapping[str, Any], label: str) -> Where | None:
        """Where the host agent of the group's host runs the loop (NoAnswerError when it cannot
        say now: restarting, or busy)."""
        try:
            found = self._ask(store.group_node(group), "locate", label, create=False)
        except GoneError:
            return None
        return found if isinstance(found, Where) else None

    def locate(self, label: str) -> Where | None:
        """Where the task's loop runs; None if it has no group, its group waits in the
        cluster's queue, or no host agent runs it."""
        group = store.group(label, self.namespace)
        if group is None or group.get("state") != "CREATED":
            return None
        return self._locate(group, label)

    def withdraw(self, task: TaskPaths) -> Waiting | None:
        """Take a task that waits in the cluster's queue out of it (its group, which holds no
        host yet, goes); its record, or None if it was not waiting there."""
        fleet = Fleet(task.root)
        left = fleet.off_cluster(task) if fleet.exists() else None
        group = store.group(task.label, self.namespace)
        if group is None or group.get("state") not in WAITING_STATES:
            return None
        spec = store.spec(self.namespace, task.label)
        store.remove_group(task.label, self.namespace, group["placement_group_id"])
        if spec is not None:  # whoever follows it learns that it was stopped
            end = {"code": int(ExitCode.STOPPED), "submitted": spec.submitted, "withdrawn": True}
            store.put_end(self.namespace, task.label, end)
        store.drop_spec(self.namespace, task.label)
        return left or Waiting(task.project_id, task.task_id, "", 0)

    def present(self, label: str) -> bool:
        """Whether the task has a placement group: it runs, starts, or waits for a host."""
        return store.group(label, self.namespace) is not None

    def waits(self, label: str, group_id: str) -> bool:
        """Whether the cluster still has the group `group_id` of a queued task (waiting, or
        placed: a run of it then shows soon); taken at its word if the cluster cannot be
        asked, as a listing never fails on it."""
        try:
            found = store.group_by_id(group_id)
            if bool(found) and found.get("state") not in (None, "REMOVED"):
                return True
            # A host agent that freed a slot made the waiting group again (hostagent's
            # _hand_over): it waits, or was placed, under its name.
            return store.group(label, self.namespace) is not None
        except (ClusterError, OSError, ValueError):
            return True

    def stop(self, task: TaskPaths, wait: float | None) -> Holder | None:
        group = store.group(task.label, self.namespace)
        if group is None or group.get("state") != "CREATED":
            return None
        try:
            where = self._ask(store.group_node(group), "stop", task.label, wait, create=False,
                              wait=(wait or 0) + CALL_WAIT)  # fmt: skip
        except (GoneError, RestartingError):
            return None
        except ClusterError as exc:  # the host agent's own refusal comes back as itself
            raise RunAgentError(f"stopping task {task.label} on the cluster failed: {exc}") from exc
        return where.holder(task.label) if isinstance(where, Where) else None

    def ended(self, label: str, since: float) -> dict[str, Any] | None:
        """How the task's loop last ended (its exit code, host), if it ended after `since`
        (time.time() of the start that made it)."""
        end = store.end(self.namespace, label)
        if end is None or float(end.get("submitted") or 0) < since:
            return None
        return end

    def read(self, task: TaskPaths, relative: str, offset: int, limit: int) -> bytes:
        """Bytes of a file of the task's folder on the host that runs it (or ran it last),
        from `offset`."""
        group = store.group(task.label, self.namespace)
        node = store.group_node(group) if group is not None else ""
        if not node:
            end = self.ended(task.label, 0)
            node = str(end.get("node") or "") if end is not None else ""
        if not node:
            return b""
        root = None if not self.settings.shared_root else str(task.root.resolve())
        try:
            data = self._ask(node, "read", root, task.project_id, task.task_id, relative,
                             offset, limit, create=False)  # fmt: skip
        except (GoneError, RestartingError):
            return b""
        return data if isinstance(data, bytes) else b""

    def hosts(self) -> tuple[int, int]:
        """How many live hosts could take a loop, and how many have room for one now."""
        needs = self.settings.resources
        able = [n for n in store.hosts()
                if n.get("Alive") and store.fits(n.get("Resources") or {}, needs)]  # fmt: skip
        free = store.free_per_host()
        return len(able), sum(1 for n in able if store.fits(free.get(str(n["NodeID"]), {}), needs))

    def state_kept(self) -> str:
        """Where the cluster's head keeps its state: `redis` (GCS fault tolerance), `memory`,
        or '' if it does not say (what the head recorded as it started)."""
        return store.state_kept()

    def receive_runs(self, root: Path) -> None:
        """Hold the cluster's HOME name for `root` while this process lives: hosts that do not
        share the root send each task's folder here as its loop runs."""
        if HOME in self._names:
            return
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        try:
            with boundary.mapped():
                self._names[HOME] = RemoteHome.options(
                    name=HOME, namespace=self.namespace, num_cpus=0, scheduling_strategy=here
                ).remote(str(root))
        except NameTakenError:
            raise RunAgentError(
                "another server already receives this cluster's run folders "
                f"(namespace {self.namespace!r}); give this one another namespace"
            ) from None

    def hold_name(self, name: str) -> bool:
        """Whether this process holds `name` cluster-wide (taking it if it is free)."""
        if name in self._names:
            return True
        try:
            with boundary.mapped():
                self._names[name] = RemoteName.options(
                    name=name, namespace=self.namespace, num_cpus=0
                ).remote()
        except NameTakenError:
            return False
        return True

    def sync_pauses(self, root: Path) -> None:
        """Make `root`'s paused agents and the cluster's one (pauses.sync)."""
        pauses.sync(root, self.namespace)

    def unpause(self, agent: str) -> Pause | None:
        """Lift `agent`'s pause on every host; the pause the cluster had, if any."""
        return pauses.unpause(self.namespace, agent)

    def judge(self, label: str, on: str, pid: int, start: float | None) -> bool:
        """Whether the supervisor `pid` on host `on` still runs `label`'s loop: its host
        agent says so. A task no host agent runs is lost."""
        now = time.monotonic()
        seen = self._judged.get(label)
        if seen is None or now - seen[0] > JUDGE_TTL:
            try:
                seen = (now, self.locate(label))
            except NoAnswerError:  # busy or restarting, not gone
                return True
            self._judged[label] = seen
        where = seen[1]
        return where is not None and where.host == on and where.pid == pid


def connect(settings: ExecutorSettings) -> RayExecutor:
    """The executor for `settings`, joining the cluster its address names once per process;
    MissingDependencyError naming the address when there is no cluster there."""
    key = repr(settings)
    if key in _executors:
        return _executors[key]
    address = settings.address
    if not ray.is_initialized():
        if address != "auto" and not address.startswith("ray://"):
            _reachable(address)
        try:
            boundary.join(address, settings.namespace)
        except NoClusterError as exc:
            raise MissingDependencyError(
                f"no Ray cluster at executor.address {address!r} ({exc}); start "
                "one with `ray start --head`, or set executor.address to HOST:PORT"
            ) from None
    made = _executors[key] = RayExecutor(settings)
    made.ensure_agents()  # started ahead, so a task's start finds its host's agent ready
    if len(_executors) == 1:
        host.set_judge(made.judge)
        host.set_queue_judge(made.waits)
    return made


def _reachable(address: str) -> None:
    """Refuse an address nothing listens on at once: ray.init would wait minutes."""
    where, _, port = address.rpartition(":")
    try:
        socket.create_connection((where.strip("[]"), int(port)), timeout=3).close()
    except (OSError, ValueError) as exc:
        raise MissingDependencyError(
            f"cannot reach the Ray cluster at executor.address {address!r} "
            f"({getattr(exc, 'strerror', None) or exc}); check the address, or start the "
            "head with `ray start --head`"
        ) from None


def disconnect() -> None:
    """Leave the cluster (tests, and a process that wants to join another)."""
    _executors.clear()
    host.set_judge(None)
    host.set_queue_judge(None)
    if ray.is_initialized():
        ray.shutdown()
