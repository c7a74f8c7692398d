"""The Ray executor: each task's loop runs in a named, detached actor on a host of a Ray cluster.

Imported only when `executor.type` is `ray` (control.ray_executor), so nothing else pays for
Ray. The actor, named `project/task` in the configured namespace, starts today's detached
supervisor on its host (localexecutor.start_local) and watches it; the supervisor runs the loop
unchanged (restarts, timeouts, rate-limit waits, the reaper's tree kill). The actor's name is
the cluster-wide lock: a second start anywhere is refused, naming the host that holds the task.

Measured on Ray 2.60 (RESEARCH.md, Q1), and why stop goes the way it does: `ray.cancel` cannot
interrupt a blocking wait and `ray.kill` leaves `setsid` children alive, so a stop asks the actor,
which signals its supervisor; the supervisor's reaper kills the agent's whole tree; only then does
the actor end. The supervisor dies with the actor's worker (PR_SET_PDEATHSIG), so a host whose
worker is killed keeps no agent, and when a host dies, Ray restarts the actor on another one
(`max_restarts`): it starts a new supervisor, which marks the interrupted run `lost` and goes on
with the next attempt.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ray
from ray._private import state as ray_state  # the cluster's actor table and free resources
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayError

from runagent.config.overrides import LoopOverrides
from runagent.config.settings import ExecutorSettings
from runagent.errors import (
    AlreadyRunningError,
    MissingDependencyError,
    RunAgentError,
    error_for_exit,
)
from runagent.executors import local as localexecutor
from runagent.fleet.queue import Fleet, Turn, Waiting, needs_words, now
from runagent.record import record
from runagent.store import host, runfolder, taskfolder
from runagent.store.lock import Holder, already_running, live_holder
from runagent.store.pids import is_alive, process_start_time
from runagent.store.runfolder import TaskPaths

WORKER_ROOT_ENV = "RUN_AGENT_WORKER_ROOT"  # a host's own runs root, when the root is not shared
PLACEMENT_WAIT = 60.0  # seconds a start placed on a host waits for its loop to start there
PLACEMENT_LOOK = 2.0  # seconds a start waits for a host before it looks why it has none
QUEUED_LOOK = 0.2  # seconds a start with no host free waits before it looks again
PLACEMENT_GRACE = 10.0  # seconds a host that had room is given to start a worker for a loop
CALL_WAIT = 30.0  # seconds a call to an actor may take before it counts as unanswered
NAME_FREED_WAIT = 15.0  # seconds a stop waits for the actor's name to be free again
WATCH_TICK = 0.1
ANSWER_GRACE = 1.0  # seconds an actor lives on after answering a stop, so the answer arrives
LEASE_WAIT = 180.0  # seconds a restarted actor waits for a dead host's lock to be released
JUDGE_TTL = 1.0  # seconds a judgement of a foreign supervisor is reused
HOME = "home"  # the actor name of the server's runs root (serve holds it)
COPY_CHUNK = 4 << 20
MIRROR_TICK = 0.25  # seconds between mirrorings of a live task's folder to the server's root
HOME_RECHECK = 5.0  # seconds between looks for a server holding HOME
SEED_LIMIT = 1 << 20  # bytes of one file a restarted loop takes from the server's copy
# Files that only grow: mirrored by their new bytes (SSE offsets stay those of the original).
GROWING = {runfolder.STDOUT, runfolder.STDERR, runfolder.SUPERVISOR_LOG}
# Not taken by a restarted loop: what only grows (sent by offset, which a copy would break) and
# the lock, which is the dead host's.
SEEDED_NOT = {*GROWING, runfolder.LOCK}

_GONE = object()  # what a call to an actor that is not there returns
# The cluster's hosts and what each has free now (Ray leaves these untyped).
_hosts: Callable[[], list[dict[str, Any]]] = ray.nodes
_free_per_host: Callable[[], dict[str, dict[str, float]]] = ray_state.available_resources_per_node
_executors: dict[str, RayExecutor] = {}  # by settings: one view of the cluster per process


def worker_root() -> Path:
    """This host's own runs root (RUN_AGENT_WORKER_ROOT, set when it joined the cluster)."""
    given = os.environ.get(WORKER_ROOT_ENV)
    return Path(given) if given else Path.home() / ".local" / "share" / "run-agent" / "runs"


@record
class LoopSpec:
    """What an actor needs to start a task's loop on its host."""

    project_id: str
    task_id: str
    root: Path  # the starter's runs root (the actor's own, when it is shared)
    shared_root: bool
    command: str
    overrides: LoopOverrides
    config_path: Path | None
    cwd: Path
    schedule: str | None
    again: bool
    prompt: str | None  # TASK.md, carried to a host that does not share the root
    wait: float


@record
class Where:
    """Where an actor's loop runs, or why it could not start."""

    host: str
    pid: int
    process_start: float | None
    since: str
    root: str
    error: str | None = None
    exit_code: int | None = None

    def holder(self, label: str) -> Holder:
        return Holder(self.pid, self.process_start, self.since, self.host, label)


class TaskLoop:
    """The actor: one task's supervisor on this host, watched until it ends."""

    def __init__(self, spec: LoopSpec) -> None:
        self.spec = spec
        root = spec.root if spec.shared_root else worker_root()
        self.task = runfolder.confine(TaskPaths(root, spec.project_id, spec.task_id))
        self.host = host.this_host()
        # This actor holds the task's name cluster-wide: a holder of it on another host is a
        # supervisor that died with its host (this is then the actor restarted elsewhere).
        label = self.task.label
        host.set_judge(lambda task, on, pid, start: task != label)
        self.where: Where
        if not spec.shared_root and ray.get_runtime_context().was_current_actor_reconstructed:
            self._seed()
        try:
            self._start()
        except RunAgentError as exc:
            self.where = Where(self.host, 0, None, "", str(root), str(exc), int(exc.exit_code))
        self._stopping = threading.Event()
        self._stop_asked, self._stop_answered = threading.Event(), threading.Event()
        self._located = threading.Event()  # the starter has asked where the loop runs
        self._unattended = False  # the starter did not wait: it waited in the cluster's queue
        self._mirror = Mirror(self.task)
        threading.Thread(target=self._watch, daemon=True).start()

    def _seed(self) -> None:
        """Restarted on this host after another died, with a root of its own: take the task's
        record from the server's copy (its runs' run-info, TASK.md, task.yaml), so the loop goes
        on where it was: the interrupted run is marked lost and the next attempt numbered on."""
        try:
            home = ray.get_actor(HOME, namespace=ray.get_runtime_context().namespace)
            found: Any = ray.get(home.task_files.remote(self.task.project_id, self.task.task_id))
            files: dict[str, bytes] = dict(found)
        except (ValueError, RayError):
            return  # no server holds the copy: the loop starts from this host's root
        for relative, data in files.items():
            path = self.task.folder / relative
            if not runfolder.within(self.task.root, path) or path.exists():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.seed")
            tmp.write_bytes(data)
            os.replace(tmp, path)

    def _start(self) -> None:
        s, task = self.spec, self.task
        if s.prompt is not None and taskfolder.read_task_prompt(task) is None:
            task.folder.mkdir(parents=True, exist_ok=True)
            taskfolder.write_task_prompt(task, s.prompt)
        argv = localexecutor.loop_argv(
            s.command, task, s.overrides, s.config_path, s.schedule, s.again
        )
        # Restarted after its host died: on a shared root over NFS, the dead host's flock holds
        # until the NFS server drops its lease; wait for that rather than give the loop up.
        moved = ray.get_runtime_context().was_current_actor_reconstructed
        deadline = time.monotonic() + (LEASE_WAIT if moved else 0)
        while True:
            try:
                started = localexecutor.start_local(
                    task, argv, cwd=s.cwd, wait=s.wait, die_with_parent=True
                )
                break
            except AlreadyRunningError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)
        holder = started.holder or live_holder(task.lock)
        self.where = Where(
            self.host,
            started.pid,
            process_start_time(started.pid),
            holder.since if holder is not None else "",
            str(task.root),
        )

    def _watch(self) -> None:
        """End the actor once its supervisor has ended (its name is then free again). When this
        host does not share the root, the task's folder is mirrored to the server's meanwhile,
        so `serve` shows and streams the live run as it would a local one."""
        w = self.where
        mirror = not self.spec.shared_root
        while w.error is None and is_alive(w.pid, w.process_start):
            if mirror:
                self._mirror.sync()
            time.sleep(MIRROR_TICK if mirror else WATCH_TICK)
        if self._stop_asked.is_set():  # let the stop's answer reach the one who asked
            self._stop_answered.wait(CALL_WAIT)
            time.sleep(ANSWER_GRACE)
        if w.error is not None:  # the starter reads the error first
            self._stopping.wait(CALL_WAIT)
            if self._unattended:  # nobody reads it but in the task's supervisor.log
                self._log(f"the loop could not start on host {self.host}: {w.error}")
        if mirror and (w.error is None or self._unattended):
            self._mirror.sync(final=True)
        # A loop that ended at once (a quick task) still lets its starter read where it ran:
        # an actor gone before that reads to the starter as one that died while starting.
        self._located.wait(CALL_WAIT)
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    def locate(self) -> Where:
        self._located.set()
        return self.where

    def stop(self, wait: float | None) -> Where:
        """Stop the loop through its supervisor (whose reaper kills the agent's tree)."""
        self._stop_asked.set()
        try:
            localexecutor.stop_local(self.task, wait)
        finally:
            self._stop_answered.set()
        return self.where

    def forget(self) -> None:
        """The starter has read why the loop could not start: the actor may end."""
        self._stopping.set()

    def unattended(self) -> None:
        """The starter went on while this actor waited in the cluster's queue: nobody waits
        to read where the loop runs or why it could not start (that goes to supervisor.log)."""
        self._unattended = True
        self._located.set()
        self._stopping.set()

    def _log(self, line: str) -> None:
        try:
            runfolder.append_line(runfolder.supervisor_log_path(self.task), f"run-agent: {line}")
        except OSError:
            pass

    def read(self, relative: str, offset: int, limit: int) -> bytes:
        """`limit` bytes of a file of the task's folder from byte `offset` (b'' past its end)."""
        path = (self.task.folder / relative).resolve()
        if not path.is_relative_to(self.task.folder.resolve()):
            raise ValueError(f"{relative!r} is outside the task's folder")
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return b""


RemoteTaskLoop: Any = ray.remote(TaskLoop)


class Mirror:
    """A task's folder, copied to the server's root (the HOME actor `serve` holds) as it grows:
    files that only grow (the agent's output, supervisor.log) by their new bytes, the others
    (run-info.yaml, DONE, TASK.md) whole and atomically when they change. Without a server
    holding HOME, nothing is sent; the folder stays here, where `read` serves it."""

    def __init__(self, task: TaskPaths) -> None:
        self.task = task
        self.prefix = f"{task.project_id}/{task.task_id}"
        self.sent: dict[str, tuple[int, int]] = {}  # file -> (size, mtime) last sent
        self.home: Any = None
        self.looked = -HOME_RECHECK

    def _find_home(self, final: bool) -> Any:
        due = final or time.monotonic() - self.looked > HOME_RECHECK
        if self.home is None and due:
            self.looked = time.monotonic()
            try:
                self.home = ray.get_actor(HOME, namespace=ray.get_runtime_context().namespace)
            except ValueError:
                return None
        return self.home

    def sync(self, final: bool = False) -> None:
        home = self._find_home(final)
        if home is None:
            return
        try:
            for path in sorted(self.task.folder.rglob("*")):
                if path.is_file():  # the lock's note too: the server's view says who runs it
                    self._send(home, path)
        except RayError:  # the server went away: look for one again later
            self.home = None

    def _send(self, home: Any, path: Path) -> None:
        relative = str(path.relative_to(self.task.folder))
        st = path.stat()
        size, mtime = self.sent.get(relative, (0, 0))
        if (st.st_size, st.st_mtime_ns) == (size, mtime):
            return
        name = f"{self.prefix}/{relative}"
        if path.name in GROWING and st.st_size >= size:
            with open(path, "rb") as f:
                f.seek(size)
                offset = size
                while offset < st.st_size and (chunk := f.read(COPY_CHUNK)):
                    ray.get(home.put.remote(name, offset, chunk))
                    offset += len(chunk)
            if st.st_size == 0:
                ray.get(home.put.remote(name, 0, b""))
        else:
            ray.get(home.replace.remote(name, path.read_bytes()))
        self.sent[relative] = (st.st_size, st.st_mtime_ns)


class _Name:
    """A name held for as long as the process that made it lives (a non-detached actor)."""

    def held(self) -> bool:
        return True


RemoteName: Any = ray.remote(_Name)


class _Home:
    """The server's runs root, as hosts that do not share it send finished task folders to it;
    held by `serve` (a non-detached actor on its own host, named HOME)."""

    def __init__(self, root: str) -> None:
        self.root = Path(root).resolve()

    def put(self, relative: str, offset: int, data: bytes) -> None:
        path = (self.root / relative).resolve()
        if not path.is_relative_to(self.root):
            raise ValueError(f"{relative!r} is outside the runs root")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "r+b" if offset else "wb") as f:
            f.seek(offset)
            f.write(data)

    def task_files(self, project_id: str, task_id: str) -> dict[str, bytes]:
        """The small files that record a task (not its agents' output, nor its lock), by path
        relative to its folder: what a loop restarted on a host with an empty root starts
        from."""
        folder = (self.root / project_id / task_id).resolve()
        if not folder.is_relative_to(self.root) or not folder.is_dir():
            return {}
        found: dict[str, bytes] = {}
        for path in folder.rglob("*"):
            if path.is_symlink() or not path.is_file() or path.name in SEEDED_NOT:
                continue
            if path.stat().st_size <= SEED_LIMIT:
                found[str(path.relative_to(folder))] = path.read_bytes()
        return found

    def replace(self, relative: str, data: bytes) -> None:
        """Write a whole file atomically (a reader never sees half a run-info.yaml)."""
        path = (self.root / relative).resolve()
        if not path.is_relative_to(self.root):
            raise ValueError(f"{relative!r} is outside the runs root")
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = path.with_name(f".{path.name}.mirror")
        fresh.write_bytes(data)
        os.replace(fresh, path)


RemoteHome: Any = ray.remote(_Home)


class RayExecutor:
    """The starter's side: creates, finds and stops task actors."""

    def __init__(self, settings: ExecutorSettings) -> None:
        self.settings = settings
        self._names: dict[str, Any] = {}
        self._judged: dict[str, tuple[float, Where | None]] = {}

    def start(
        self, task: TaskPaths, command: str, overrides: LoopOverrides, *,
        config_path: Path | None, cwd: Path, schedule: str | None, again: bool, wait: float,
    ) -> localexecutor.Started:  # fmt: skip
        s = self.settings
        spec = LoopSpec(
            task.project_id, task.task_id, task.root.resolve(), s.shared_root, command, overrides,
            config_path.resolve() if config_path else None, cwd.resolve(), schedule, again,
            taskfolder.read_task_prompt(task), wait,
        )  # fmt: skip
        self._refuse_unmeetable(task.label)
        queued_at = now()  # before the actor: any run of it starts later
        room = self._room()
        try:
            actor = RemoteTaskLoop.options(
                name=task.label,
                namespace=s.namespace,
                lifetime="detached",
                num_cpus=0,
                resources=dict(s.resources),
                max_restarts=s.max_restarts,
                max_concurrency=4,  # stop and reads are answered while the loop is watched
            ).remote(spec)
        except ValueError as exc:  # ActorAlreadyExistsError is a ValueError
            if "already taken" not in str(exc):
                raise
            raise AlreadyRunningError(self._refusal(task.label)) from None
        try:
            where = self._placed(actor, task.label, wait, room)
        except RayActorError as exc:
            raise RunAgentError(
                f"the actor of task {task.label} died while starting: {exc}"
            ) from exc
        fleet = Fleet(task.root)
        if where is None:  # no host has room: it waits in Ray's queue, and this start returns
            actor.unattended.remote()
            return localexecutor.Started(0, None, self._queue(fleet, task, actor, queued_at))
        if fleet.exists():
            fleet.off_cluster(task)
        if where.error is not None:
            actor.forget.remote()
            code = where.exit_code if where.exit_code is not None else 1
            raise error_for_exit(code, where.error)
        return localexecutor.Started(where.pid, where.holder(task.label))

    def _placed(self, actor: Any, label: str, wait: float, room: bool) -> Where | None:
        """Where the new actor's loop runs, once it does; None if it waits in the cluster's
        queue: no host's worker has taken it and every host that could is full. When a host
        had `room` as it was made, that host is given PLACEMENT_GRACE to start a worker for it
        (its slot is taken meanwhile, so the cluster looks full)."""
        answer = actor.locate.remote()
        began = time.monotonic()
        look = PLACEMENT_LOOK if room else QUEUED_LOOK
        while True:
            try:
                found: Where = ray.get(answer, timeout=look)
                return found
            except GetTimeoutError:
                look = 0.5
            waited = time.monotonic() - began
            if (not room or waited > PLACEMENT_GRACE) and self._waiting(actor):
                return None
            if waited > wait + PLACEMENT_WAIT:
                ray.kill(actor, no_restart=True)
                raise RunAgentError(
                    f"the actor of task {label} was taken by a host of the Ray "
                    f"cluster but its loop did not start within {wait + PLACEMENT_WAIT:g}s; "
                    "see the host's Ray worker logs"
                )

    def _waiting(self, actor: Any) -> bool:
        """Whether the actor waits for a host: no worker has taken it, and none has room."""
        return _state(actor) == ("PENDING_CREATION", False) and not self._room()

    def _room(self) -> bool:
        """Whether a host of the cluster has room for one more loop now."""
        free = _free_per_host()
        return any(_fits(room, self.settings.resources) for room in free.values())

    def _refuse_unmeetable(self, label: str) -> None:
        """A loop no host of the cluster could ever take is refused, not queued forever."""
        needs = self.settings.resources
        hosts = [node for node in _hosts() if node.get("Alive")]
        if not any(_fits(node.get("Resources") or {}, needs) for node in hosts):
            raise RunAgentError(
                f"task {label} cannot start: no host of the Ray cluster has "
                f"{needs_words(needs)} (executor.resources); join hosts with "
                "`ray start --resources '{\"agent_slot\": N}'`"
            )

    def _queue(self, fleet: Fleet, task: TaskPaths, actor: Any, queued_at: str) -> Turn:
        """Record that the task waits in the cluster's queue (so listings show it queued);
        its turn, with the tasks recorded as waiting before it."""
        with fleet.locked():
            ahead = [w for w in fleet.on_cluster(clean=True) if w.label != task.label]
            waiting = Waiting(
                task.project_id, task.task_id, "", fleet.next_seq(), submitted=queued_at,
                cluster={"actor": actor._actor_id.hex(), "needs": dict(self.settings.resources)},
            )  # fmt: skip
            fleet.put_on_cluster(waiting)
        return Turn(False, len(ahead), waiting.cluster_words())

    def _queued(self, label: str) -> bool:
        """Whether the task's actor waits in the cluster's queue: no host has taken it."""
        actor = self._actor(label)
        return actor is not None and _state(actor) == ("PENDING_CREATION", False)

    def _refusal(self, label: str) -> str:
        """Why a second start of a task whose actor exists is refused: it runs, or it waits."""
        if self._queued(label):
            return (
                f"task {label} is already queued on the Ray cluster, waiting for a free host; "
                "`run-agent stop` takes it out"
            )
        where = self.locate(label)
        return already_running(label, where.holder(label) if where is not None else None)

    def _actor(self, label: str) -> Any | None:
        try:
            return ray.get_actor(label, namespace=self.settings.namespace)
        except ValueError:
            return None

    def _call(self, label: str, method: str, *args: Any, wait: float = CALL_WAIT) -> Any:
        """`method(*args)` of the task's actor; _GONE if it has no actor or it died. An actor
        being restarted on another host is waited for (up to `wait`), not taken for gone."""
        deadline = time.monotonic() + wait
        while True:
            actor = self._actor(label)
            if actor is None:
                return _GONE
            try:
                return ray.get(getattr(actor, method).remote(*args), timeout=wait)
            except ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
            except RayActorError:
                return _GONE

    def locate(self, label: str) -> Where | None:
        """Where the task's actor runs its loop; None if it has no actor (or it died), or its
        actor waits in the cluster's queue (and would answer only once it has a host)."""
        if self._queued(label):
            return None
        where = self._call(label, "locate")
        return where if isinstance(where, Where) and where.error is None else None

    def withdraw(self, task: TaskPaths) -> Waiting | None:
        """Take a task that waits in the cluster's queue out of it (its actor, which holds no
        host yet, goes); its record, or None if it was not waiting there."""
        fleet = Fleet(task.root)
        left = fleet.off_cluster(task) if fleet.exists() else None
        actor = self._actor(task.label)
        if actor is None or _state(actor) != ("PENDING_CREATION", False):
            return None
        ray.kill(actor, no_restart=True)
        return left or Waiting(task.project_id, task.task_id, "", 0)

    def waits(self, label: str, actor_id: str) -> bool:
        """Whether the cluster still has the actor `actor_id` of a queued task (waiting, or
        starting: a run of it then shows soon); taken at its word if the cluster cannot be
        asked, as a listing never fails on it."""
        try:
            state, _ = _state_of(actor_id)
        except (RayError, OSError, ValueError):
            return True
        return state not in ("", "DEAD")

    def stop(self, task: TaskPaths, wait: float | None) -> Holder | None:
        before = self.locate(task.label)
        if before is None:
            return None
        try:
            where = self._call(task.label, "stop", wait, wait=(wait or 0) + CALL_WAIT)
        except RunAgentError:
            raise
        except RayError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, RunAgentError):
                raise cause from None
            raise RunAgentError(f"stopping task {task.label} on the cluster failed: {exc}") from exc
        if where is _GONE:  # it ended as it stopped, and took the answer with it
            where = before
        if wait is not None:  # a start right after the stop must find the name free
            deadline = time.monotonic() + NAME_FREED_WAIT
            while self._actor(task.label) is not None and time.monotonic() < deadline:
                time.sleep(0.05)
        assert isinstance(where, Where)
        return where.holder(task.label)

    def read(self, task: TaskPaths, relative: str, offset: int, limit: int) -> bytes:
        """Bytes of a file of the task's folder on the host that runs it, from `offset`."""
        data = self._call(task.label, "read", relative, offset, limit)
        return data if isinstance(data, bytes) else b""

    def receive_runs(self, root: Path) -> None:
        """Hold the cluster's HOME name for `root` while this process lives: hosts that do not
        share the root send each task's folder here when its loop ends."""
        if HOME in self._names:
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        try:
            self._names[HOME] = RemoteHome.options(
                name=HOME, namespace=self.settings.namespace, num_cpus=0, scheduling_strategy=here
            ).remote(str(root))
        except ValueError:
            raise RunAgentError(
                "another server already receives this cluster's run folders "
                f"(namespace {self.settings.namespace!r}); give this one another namespace"
            ) from None

    def hold_name(self, name: str) -> bool:
        """Whether this process holds `name` cluster-wide (taking it if it is free)."""
        if name in self._names:
            return True
        try:
            self._names[name] = RemoteName.options(
                name=name, namespace=self.settings.namespace, num_cpus=0
            ).remote()
        except ValueError:
            return False
        return True

    def judge(self, label: str, on: str, pid: int, start: float | None) -> bool:
        """Whether the supervisor `pid` on host `on` still runs `label`'s loop: its actor
        lives and says so. A task whose actor is gone is lost."""
        now = time.monotonic()
        seen = self._judged.get(label)
        if seen is None or now - seen[0] > JUDGE_TTL:
            try:
                seen = (now, self.locate(label))
            except (GetTimeoutError, ActorUnavailableError):  # busy or moving, not gone
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
            ray.init(
                address=address,
                namespace=settings.namespace,
                logging_level=logging.ERROR,
                log_to_driver=False,
            )
        except ConnectionError as exc:
            raise MissingDependencyError(
                f"no Ray cluster at executor.address {address!r} ({_first_line(exc)}); start "
                "one with `ray start --head`, or set executor.address to HOST:PORT"
            ) from None
    made = _executors[key] = RayExecutor(settings)
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


def _state(actor: Any) -> tuple[str, bool]:
    """The actor's state in the cluster's table (`PENDING_CREATION`, `ALIVE`, ...; '' if it
    has none), and whether a host's worker has taken it (the worker's pid is known)."""
    return _state_of(actor._actor_id.hex())


def _state_of(actor_id: str) -> tuple[str, bool]:
    info = ray_state.actors(actor_id=actor_id)
    if not info:
        return "", False
    return str(info.get("State") or ""), bool(info.get("Pid"))


def _fits(room: Mapping[str, float], needs: Mapping[str, float]) -> bool:
    return all(room.get(name, 0) >= amount for name, amount in needs.items())


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def disconnect() -> None:
    """Leave the cluster (tests, and a process that wants to join another)."""
    _executors.clear()
    host.set_judge(None)
    host.set_queue_judge(None)
    if ray.is_initialized():
        ray.shutdown()
