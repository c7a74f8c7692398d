"""The Ray executor: task loops on the hosts of a Ray cluster, one long-lived agent per host.

Imported only when `executor.type` is `ray` (control.ray_executor), so nothing else pays for
Ray. Each task holds a named, detached placement group of what one loop takes of a host
(`executor.resources`, `agent_slot: 1` by default). Its name, the task's label, is the
cluster-wide lock: a second start anywhere is refused, naming the host that holds the task. Ray
places the group on a host with the slot free, or keeps it in Ray's queue while none has one; a
waiting group costs no process anywhere. On each host one detached actor, the host agent
(`host:<node id>`), starts and watches the supervisors of the groups placed there: today's
detached supervisor (localexecutor.start_local), which runs the loop unchanged. So a task costs
its supervisor, as locally, and no Ray worker of its own.

What a loop was started with (a LoopSpec) is kept in the cluster's key-value store beside its
group, so the host agent of a host the group is placed on later finds it: a group that waited
in Ray's queue, or one Ray moved there because its host died (the new supervisor marks the
interrupted run `lost` and goes on with the next attempt, at most `executor.max_restarts`
times). A loop's end (its exit code) is put there too, for the one that follows it. The groups
and the store live in the cluster's GCS: with GCS fault tolerance (an external Redis) they
outlive a head that dies, and the loops on the other hosts go on.

Measured on Ray 2.60 (RESEARCH.md, Q1), and why stop goes the way it does: `ray.kill` leaves
`setsid` children alive, so a stop asks the host agent, which signals the supervisor; the
supervisor's reaper kills the agent's whole tree. The supervisors die with their host agent's
worker (PR_SET_PDEATHSIG), so a host agent that is killed leaves no agent running; Ray starts it
again on its host, and it takes its groups up again as a moved loop.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
from ray._private import state as ray_state  # the cluster's tables: groups, free resources
from ray._raylet import PlacementGroupID
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayError
from ray.experimental import internal_kv
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

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
from runagent.fleet.queue import Fleet, Turn, Waiting, needs_words, now
from runagent.loop.context import QUEUED_SINCE
from runagent.record import record
from runagent.store import host, runfolder, taskfolder
from runagent.store.lock import Holder, already_running, live_holder
from runagent.store.pids import process_start_time
from runagent.store.runfolder import TaskPaths

WORKER_ROOT_ENV = "RUN_AGENT_WORKER_ROOT"  # a host's own runs root, when the root is not shared
AGENT = "host:"  # a host agent's actor name: host:<node id>
SPECS, ENDS = "spec/", "end/"  # the cluster's key-value store: a loop's spec, its end
PLACEMENT_WAIT = 60.0  # seconds a start placed on a host waits for its loop to start there
PLACEMENT_GRACE = 10.0  # seconds a group is given to be placed while a host has room
QUEUED_LOOK = 0.2  # seconds a start with no host free waits before it counts as queued
CALL_WAIT = 30.0  # seconds a call to a host agent may take before it counts as unanswered
LOCATE_WAIT = 5.0  # seconds a host agent waits for a starting loop before it says "starting"
ADOPT_TICK = 0.5  # seconds between a host agent's looks for groups placed on its host
EAGER_TICK, EAGER_FOR = 0.05, 3.0  # looks (seconds apart) for so long after a slot here freed
WATCH_TICK = 0.1  # seconds between a host agent's looks at its supervisors
STALE_SPEC = 30.0  # seconds a spec without its group counts as a start still being made
LEASE_WAIT = 180.0  # seconds a moved loop waits for a dead host's lock to be released
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
ENDED_KEPT = 256  # loops ended on a host that its agent remembers (HostAgent.ended)
WAITING_STATES = ("PENDING", "PREPARED", "RESCHEDULING")  # a group not (or no longer) placed
# Where the head keeps its state, as it records it on starting (Ray's usage tags, kept whether
# or not usage stats are reported).
GCS_STORAGE_KEY, USAGE_NAMESPACE = "extra_usage_tag_gcs_storage", "usage_stats"

# The cluster's hosts and what each has free now (Ray leaves these untyped).
_hosts: Callable[[], list[dict[str, Any]]] = ray.nodes
_free_per_host: Callable[[], dict[str, dict[str, float]]] = ray_state.available_resources_per_node
# The cluster's placement groups: all of them (by id) or one (by id), and one by name.
_group_table: Callable[..., dict[str, Any]] = ray_state.state.placement_group_table
_group_by_name: Callable[[str, str], dict[str, Any] | None] = (
    ray_state.state.get_placement_group_by_name
)
_executors: dict[str, RayExecutor] = {}  # by settings: one view of the cluster per process


def worker_root() -> Path:
    """This host's own runs root (RUN_AGENT_WORKER_ROOT, set when it joined the cluster)."""
    given = os.environ.get(WORKER_ROOT_ENV)
    return Path(given) if given else Path.home() / ".local" / "share" / "run-agent" / "runs"


@record
class LoopSpec:
    """What a host agent needs to start a task's loop on its host."""

    project_id: str
    task_id: str
    root: Path  # the starter's runs root (the host's own, when it is shared)
    shared_root: bool
    command: str
    overrides: LoopOverrides
    config_path: Path | None
    cwd: Path
    schedule: str | None
    again: bool
    prompt: str | None  # TASK.md, carried to a host that does not share the root
    wait: float
    submitted: float  # when the starter made it (time.time(); a follower knows its end by it)
    max_moves: int  # executor.max_restarts
    node: str = ""  # the host whose agent started it last ("": not started yet)
    moves: int = 0  # times it was started again after its host (or host agent) died
    group: str = ""  # its placement group's id, once the group is made
    # When its start was queued before it came to the cluster (the keeper's queue), if it was.
    queued_since: str = ""

    @property
    def label(self) -> str:
        return f"{self.project_id}/{self.task_id}"


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


class _Loop:
    """A loop a host agent started (or is starting), and the supervisor it watches."""

    def __init__(self, spec: LoopSpec, task: TaskPaths) -> None:
        self.spec = spec
        self.task = task
        self.placed = threading.Event()  # set once it runs, or could not start
        self.where: Where | None = None
        self.process: Any = None  # the supervisor's Popen
        self.mirror = None if spec.shared_root else Mirror(task)
        self.finishing = False  # its end is being recorded and its group removed


class HostAgent:
    """The actor on each host: starts the loops of the task groups placed on its host, watches
    their supervisors, stops them, and serves reads of their folders; one per host, long-lived,
    so a task costs no Ray worker of its own."""

    def __init__(self) -> None:
        context = ray.get_runtime_context()
        self.node = context.get_node_id()
        self.namespace = context.namespace
        self.host = host.this_host()
        self.loops: dict[str, _Loop] = {}
        # The loops that ended here lately, by task: the start they came from (its `submitted`)
        # and where they ran. A group placed at once may be taken up from the queue (`_adopt`)
        # and a quick loop end before its starter's own call arrives, which must not start it
        # again but learn where it ran.
        self.ended: dict[str, tuple[float, Where | None]] = {}
        self.lock = threading.Lock()
        self.freed = 0.0  # when a loop here last ended: a waiting group is placed here soon
        # Supervisors die with the thread that forked them (PR_SET_PDEATHSIG): all are forked
        # by this one, which lives as long as the agent's worker.
        self.spawner = ThreadPoolExecutor(1, thread_name_prefix="spawner")
        # A holder on another host of a task placed here is a supervisor that died with its
        # host: the task's group, the cluster-wide lock, has moved here.
        host.set_judge(lambda task, on, pid, start: task not in self.loops)
        threading.Thread(target=self._watch, daemon=True).start()

    # The starter's calls ----------------------------------------------------------------------

    def start(self, spec: LoopSpec) -> Where:
        """Start the loop of a group placed here (or, found here already, wait for it)."""
        loop, new = self._take(spec)
        if isinstance(loop, Where):  # taken up here from the queue, and ended, before this call
            return loop
        if new:
            self._launch(loop, attended=True)
        else:
            loop.placed.wait(spec.wait + PLACEMENT_WAIT)
        return loop.where or Where(self.host, 0, None, "", "its loop is still starting", 1)

    def locate(self, label: str) -> Where | None:
        """Where the task's loop runs; None if it runs nowhere here, or is still starting."""
        loop = self.loops.get(label)
        if loop is None or not loop.placed.wait(LOCATE_WAIT) or loop.where is None:
            return None
        return loop.where if loop.where.error is None and not loop.finishing else None

    def knows(self, label: str) -> bool:
        """Whether this agent runs (or is starting) the task's loop."""
        return label in self.loops

    def running(self) -> list[str]:
        return sorted(self.loops)

    def stop(self, label: str, wait: float | None) -> Where | None:
        """Stop the loop through its supervisor (whose reaper kills the agent's tree); with a
        wait, its group is gone when this returns, so a start right after finds the name free."""
        loop = self.loops.get(label)
        if loop is None or not loop.placed.wait(CALL_WAIT) or loop.where is None:
            return None
        if loop.where.error is not None:
            return None
        localexecutor.stop_local(loop.task, wait)
        if wait is not None and loop.process is not None:
            self._finish(loop, exit_code(loop.process.wait(CALL_WAIT)))
            deadline = time.monotonic() + CALL_WAIT  # the watch may be finishing it meanwhile
            while self.loops.get(label) is loop and time.monotonic() < deadline:
                time.sleep(0.01)
        return loop.where

    def read(self, root: str | None, project_id: str, task_id: str, relative: str, offset: int,
             limit: int) -> bytes:  # fmt: skip
        """`limit` bytes of a file of a task's folder on this host from byte `offset` (b''
        past its end); `root` None: this host's own root."""
        task = TaskPaths(Path(root) if root else worker_root(), project_id, task_id)
        folder = task.folder.resolve()
        path = (folder / relative).resolve()
        if not path.is_relative_to(folder):
            raise ValueError(f"{relative!r} is outside the task's folder")
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return b""

    # Starting ---------------------------------------------------------------------------------

    def _take(self, spec: LoopSpec) -> tuple[_Loop | Where, bool]:
        """The task's loop here: the one found (running or starting), or a new one to start;
        where it ran if the loop of this very start has run here and ended. A loop whose end is
        being recorded is waited out: this is a new start of the task."""
        deadline = time.monotonic() + CALL_WAIT
        while True:
            with self.lock:
                found = self.loops.get(spec.label)
                ended = self.ended.get(spec.label)
                if found is None and ended is not None and ended[0] == spec.submitted:
                    gone = Where(self.host, 0, None, "", "its loop ended before it was asked", 1)
                    return ended[1] or gone, False
                if found is None:
                    root = spec.root if spec.shared_root else worker_root()
                    task = runfolder.confine(TaskPaths(root, spec.project_id, spec.task_id))
                    made = self.loops[spec.label] = _Loop(spec, task)
                    return made, True
                if not found.finishing or time.monotonic() > deadline:
                    return found, False
            time.sleep(0.01)

    def _launch(self, loop: _Loop, attended: bool) -> None:
        """Start the loop's supervisor. A spec a host agent started before (this host's, whose
        worker died, or another's that died) is started again: the new supervisor marks the
        interrupted run lost and goes on, at most max_moves times."""
        spec, task = loop.spec, loop.task
        again = spec.node != ""
        try:
            if again:
                spec = replace(spec, moves=spec.moves + 1)
                if spec.moves > spec.max_moves:
                    raise RunAgentError(
                        f"task {spec.label} lost its host {spec.moves - 1} time(s) and is not "
                        f"started again (executor.max_restarts {spec.max_moves})"
                    )
            spec = loop.spec = replace(spec, node=self.node)
            _kv_put(self.namespace, SPECS + spec.label, pickle.dumps(spec))
            if again and not spec.shared_root:
                self._seed(task)
            loop.where = self._start(loop, again)
        except RunAgentError as exc:
            code = int(exc.exit_code)
            loop.where = Where(self.host, 0, None, "", str(exc), code, self.node)
        finally:
            loop.placed.set()
        if loop.where.error is not None:
            if not attended:  # nobody reads it but in the task's supervisor.log
                self._log(task, f"the loop could not start on host {self.host}: {loop.where.error}")
            self._finish(loop, loop.where.exit_code or 1)

    def _start(self, loop: _Loop, again: bool) -> Where:
        """Start the loop's supervisor here (`again`: after its host died). Every start on a
        cluster waits in Ray's queue for its placement, so its first run records since when,
        as a local loop that waited records it (a fraction of a second where a host was free)."""
        spec, task = loop.spec, loop.task
        since = spec.queued_since or runfolder.timestamp(spec.submitted)
        env = None if again else {**os.environ, QUEUED_SINCE: since}
        if spec.prompt is not None and taskfolder.read_task_prompt(task) is None:
            taskfolder.write_task_prompt(task, spec.prompt)  # its folder made with it
        argv = localexecutor.loop_argv(
            spec.command, task, spec.overrides, spec.config_path, spec.schedule, spec.again
        )
        log_from = _size(runfolder.supervisor_log_path(task))
        # Started again after its host died: on a shared root over NFS, the dead host's flock
        # holds until the NFS server drops its lease; wait for that rather than give it up.
        deadline = time.monotonic() + (LEASE_WAIT if again else 0)
        while True:
            try:
                spawned = self.spawner.submit(
                    localexecutor.spawn_local, task, argv, spec.cwd, env, True
                )
                started = localexecutor.await_lock(task, spawned.result(), spec.wait)
                break
            except AlreadyRunningError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)
        loop.process = started.process
        holder = started.holder or live_holder(task.lock)
        return Where(
            self.host, started.pid, process_start_time(started.pid),
            holder.since if holder is not None else "", node=self.node,
            log_from=log_from,
        )  # fmt: skip

    def _seed(self, task: TaskPaths) -> None:
        """Started again on this host after another died, with a root of its own: take the
        task's record from the server's copy (its runs' run-info, TASK.md, task.yaml), so the
        loop goes on where it was: the interrupted run is marked lost, the next numbered on."""
        try:
            home = ray.get_actor(HOME, namespace=self.namespace)
            found: Any = ray.get(home.task_files.remote(task.project_id, task.task_id))
            files: dict[str, bytes] = dict(found)
        except (ValueError, RayError):
            return  # no server holds the copy: the loop starts from this host's root
        for relative, data in files.items():
            path = task.folder / relative
            if not runfolder.within(task.root, path) or path.exists():
                continue
            runfolder.make_folder(path.parent)
            runfolder.atomic_write_bytes(path, data)

    # Watching ---------------------------------------------------------------------------------

    def _watch(self) -> None:
        """Each supervisor's end frees its task's group (and so its slot and its name); groups
        placed on this host that no loop here holds yet are taken up; folders that are not on a
        shared root are mirrored to the server's meanwhile."""
        adopted = 0.0
        while True:
            try:
                mirrored = self._look()
                eager = time.monotonic() - self.freed < EAGER_FOR
                if time.monotonic() - adopted > ADOPT_TICK or eager:
                    adopted = time.monotonic()
                    self._adopt()
            except Exception as exc:  # never let the watch die: every loop here depends on it
                print(f"run-agent host agent: {type(exc).__name__}: {exc}", file=sys.stderr)
                mirrored = eager = False
            time.sleep(EAGER_TICK if eager else MIRROR_TICK if mirrored else WATCH_TICK)

    def _look(self) -> bool:
        mirrored = False
        for loop in list(self.loops.values()):
            if loop.process is None or loop.finishing:
                continue
            code = loop.process.poll()
            if code is not None:
                self._finish(loop, exit_code(code))
            elif loop.mirror is not None:
                mirrored = True
                try:  # one folder that cannot be mirrored holds up no other loop
                    loop.mirror.sync()
                except (OSError, RayError) as exc:
                    print(f"run-agent host agent: mirroring {loop.spec.label}: {exc}",
                          file=sys.stderr)  # fmt: skip
        return mirrored

    def _adopt(self) -> None:
        """Start the loops of groups placed on this host that no loop here holds: one that
        waited in the cluster's queue, or one moved here from a host that died."""
        for group in _group_table().values():
            label = str(group.get("name") or "")
            if group.get("state") != "CREATED" or not label or label in self.loops:
                continue
            if self.node not in (group.get("bundles_to_node_id") or {}).values():
                continue
            mine = _group_by_name(label, self.namespace)
            if mine is None or mine.get("placement_group_id") != group["placement_group_id"]:
                continue  # another namespace's group of the same name
            if mine.get("state") != "CREATED":
                continue  # being removed
            spec = _spec(self.namespace, label)
            if spec is None:
                continue
            loop, new = self._take(replace(spec, group=str(group["placement_group_id"])))
            if isinstance(loop, _Loop) and new:
                threading.Thread(target=self._launch, args=(loop, False), daemon=True).start()

    def _finish(self, loop: _Loop, code: int) -> None:
        """The loop ended with `code`: say so to whoever follows it, and free its group."""
        spec = loop.spec
        with self.lock:  # it stays in `loops` meanwhile, so its group is not taken up again
            if self.loops.get(spec.label) is not loop or loop.finishing:
                return
            loop.finishing = True
        try:
            if loop.mirror is not None:
                try:
                    loop.mirror.sync(final=True)
                except (OSError, RayError):
                    pass
            log_from = loop.where.log_from if loop.where is not None else 0
            end = {"code": code, "submitted": spec.submitted, "host": self.host,
                   "node": self.node, "log_from": log_from}  # fmt: skip
            _kv_put(self.namespace, ENDS + spec.label, json.dumps(end).encode())
            _remove_group(spec.label, self.namespace, spec.group or None)
            left = _spec(self.namespace, spec.label)
            if left is not None and left.submitted == spec.submitted:
                _kv_del(self.namespace, SPECS + spec.label)
        finally:
            with self.lock:
                if self.loops.get(spec.label) is loop:
                    del self.loops[spec.label]
                self.ended.pop(spec.label, None)  # the newest last, the oldest let go of
                self.ended[spec.label] = (spec.submitted, loop.where)
                if len(self.ended) > ENDED_KEPT:
                    del self.ended[next(iter(self.ended))]
            self.freed = time.monotonic()

    def _log(self, task: TaskPaths, line: str) -> None:
        try:
            runfolder.append_line(runfolder.supervisor_log_path(task), f"run-agent: {line}")
        except OSError:
            pass


RemoteHostAgent: Any = ray.remote(HostAgent)


def exit_code(returned: int) -> int:
    """A process's exit code as a shell gives it: a death by signal N is 128 + N."""
    return 128 - returned if returned < 0 else returned


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _kv_put(namespace: str, key: str, value: bytes, overwrite: bool = True) -> bool:
    """Put `value` under `key` in the cluster's store; whether the key was there already."""
    return bool(internal_kv._internal_kv_put(key, value, overwrite, namespace=_kv(namespace)))


def _kv_get(namespace: str, key: str) -> bytes | None:
    found = internal_kv._internal_kv_get(key, namespace=_kv(namespace))
    return found if isinstance(found, bytes) else None


def _kv_del(namespace: str, key: str) -> None:
    internal_kv._internal_kv_del(key, namespace=_kv(namespace))


def _kv(namespace: str) -> str:
    return f"run-agent/{namespace}"


def _spec(namespace: str, label: str) -> LoopSpec | None:
    data = _kv_get(namespace, SPECS + label)
    try:
        found = pickle.loads(data) if data else None
    except Exception:  # a spec of another version of run-agent: not one to start
        return None
    return found if isinstance(found, LoopSpec) else None


def _group(label: str, namespace: str) -> dict[str, Any] | None:
    """The task's placement group in the cluster's table, or None."""
    found = _group_by_name(label, namespace)
    return found if isinstance(found, dict) and found.get("state") != "REMOVED" else None


def _group_node(group: Mapping[str, Any]) -> str:
    nodes = list((group.get("bundles_to_node_id") or {}).values())
    return str(nodes[0]) if nodes else ""


def _remove_group(label: str, namespace: str, group_id: str | None = None) -> None:
    found = _group(label, namespace)
    if found is None or (group_id is not None and found["placement_group_id"] != group_id):
        return
    remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(found["placement_group_id"])))


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
        self.lock = threading.Lock()

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
        """Send what changed; one pass at a time (a stop's final pass waits for the watch's
        pass in flight, so an older run-info.yaml never lands after the last one), and DONE
        last, as the supervisor writes it: a reader of the server's root never sees DONE
        beside a run-info.yaml that still says running."""
        with self.lock:
            self._sync(final)

    def _sync(self, final: bool) -> None:
        home = self._find_home(final)
        if home is None:
            return
        try:
            for path in sorted(
                self.task.folder.rglob("*"), key=lambda p: (p.name == runfolder.DONE, p)
            ):
                if path.is_file():  # the lock's note too: the server's view says who runs it
                    try:
                        self._send(home, path)
                    except FileNotFoundError:  # a temporary file renamed meanwhile: the
                        continue  # rest of the folder is still sent, and it next time
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
        runfolder.make_folder(path.parent)
        with open(path, "r+b" if offset else "wb", opener=runfolder.private) as f:
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
        runfolder.make_folder(path.parent)
        runfolder.atomic_write_bytes(path, data)  # flushed to disk, as every record is


RemoteHome: Any = ray.remote(_Home)


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
    ) -> localexecutor.Started:  # fmt: skip
        s = self.settings
        spec = LoopSpec(
            task.project_id, task.task_id, task.root.resolve(), s.shared_root, command, overrides,
            config_path.resolve() if config_path else None, cwd.resolve(), schedule, again,
            taskfolder.read_task_prompt(task), wait, time.time(), s.max_restarts,
            queued_since=os.environ.get(QUEUED_SINCE, ""),
        )  # fmt: skip
        self._refuse_unmeetable(task.label)
        queued_at = now()  # before the group: any run of it starts later
        self._claim(spec)
        room = self._room()
        try:
            group = placement_group(
                [self._bundle()], strategy="STRICT_PACK", name=task.label, lifetime="detached"
            )
        except RayError as exc:  # the name was taken between the claim and here
            _kv_del(self.namespace, SPECS + task.label)
            if "already exists" not in str(exc):
                raise
            raise AlreadyRunningError(self._refusal(task.label)) from None
        fleet = Fleet(task.root)
        if not group.wait(PLACEMENT_GRACE if room else QUEUED_LOOK):
            self.ensure_agents()  # the host it lands on takes it up
            return localexecutor.Started(0, None, self._queue(fleet, task, group, queued_at))
        if fleet.exists():
            fleet.off_cluster(task)
        found = _group(task.label, self.namespace)
        node = _group_node(found) if found is not None else ""
        spec = replace(spec, group=group.id.hex())
        try:
            where: Where = self._ask(node, "start", spec, wait=wait + PLACEMENT_WAIT)
        except GetTimeoutError:
            raise RunAgentError(
                f"task {task.label} was placed on a host of the Ray cluster but its loop did "
                f"not start within {wait + PLACEMENT_WAIT:g}s; see the host's Ray worker logs"
            ) from None
        except (RayActorError, ActorUnavailableError) as exc:
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
            group = _group(label, self.namespace)
            if group is not None:
                if group.get("state") in WAITING_STATES:
                    raise AlreadyRunningError(self._queued_words(label))
                try:
                    where = self._locate(group, label)
                except (GetTimeoutError, ActorUnavailableError):  # its host agent restarts
                    raise AlreadyRunningError(already_running(label, None)) from None
                if where is not None:
                    raise AlreadyRunningError(
                        already_running(label, where.holder(label), host=True)
                    )
                if not self._left_behind(group, label):
                    raise AlreadyRunningError(already_running(label, None))
                _remove_group(label, self.namespace, group["placement_group_id"])
                _kv_del(self.namespace, SPECS + label)
            if not _kv_put(self.namespace, SPECS + label, pickle.dumps(spec), overwrite=False):
                return
            old = _spec(self.namespace, label)
            young = old is not None and time.time() - old.submitted < STALE_SPEC
            if young or _group(label, self.namespace) is not None:
                continue  # another start is being made: look at it again
            _kv_del(self.namespace, SPECS + label)
        raise AlreadyRunningError(already_running(label, None))

    def _left_behind(self, group: Mapping[str, Any], label: str) -> bool:
        """Whether a placed group has no loop: its host has no agent, or its agent does not
        know the task after it has had time to take the group up."""
        node = _group_node(group)
        for look in range(3):
            try:
                if self._ask(node, "knows", label, create=False):
                    return False
            except (GetTimeoutError, ActorUnavailableError):
                return False  # busy or restarting: not left behind on a guess
            except (RayActorError, ValueError):
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
            agent = ray.get_actor(AGENT + node, namespace=self.namespace)  # ValueError: none
        else:
            agent = RemoteHostAgent.options(
                name=AGENT + node, namespace=self.namespace, lifetime="detached",
                get_if_exists=True, num_cpus=0, max_concurrency=64, max_restarts=-1,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
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
                return ray.get(getattr(agent, method).remote(*args), timeout=wait)
            except ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
            except RayActorError:
                self._agents.pop(node, None)
                raise

    def ensure_agents(self) -> None:
        """A host agent on every live host that could take a loop (started once; a host that
        joins later gets one at the next start), so a group placed there is taken up."""
        needs = self.settings.resources
        for node in _hosts():
            if node.get("Alive") and _fits(node.get("Resources") or {}, needs):
                self._agent(str(node["NodeID"]))

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
        group = _group(label, self.namespace)
        if group is not None and group.get("state") in WAITING_STATES:
            return self._queued_words(label)
        where = self.locate(label)
        holder = where.holder(label) if where is not None else None
        return already_running(label, holder, host=True)

    def _locate(self, group: Mapping[str, Any], label: str) -> Where | None:
        """Where the host agent of the group's host runs the loop (ActorUnavailableError and
        GetTimeoutError when it cannot say now: restarting, or busy)."""
        try:
            found = self._ask(_group_node(group), "locate", label, create=False)
        except ActorUnavailableError:
            raise
        except (RayActorError, ValueError):
            return None
        return found if isinstance(found, Where) else None

    def locate(self, label: str) -> Where | None:
        """Where the task's loop runs; None if it has no group, its group waits in the
        cluster's queue, or no host agent runs it."""
        group = _group(label, self.namespace)
        if group is None or group.get("state") != "CREATED":
            return None
        return self._locate(group, label)

    def withdraw(self, task: TaskPaths) -> Waiting | None:
        """Take a task that waits in the cluster's queue out of it (its group, which holds no
        host yet, goes); its record, or None if it was not waiting there."""
        fleet = Fleet(task.root)
        left = fleet.off_cluster(task) if fleet.exists() else None
        group = _group(task.label, self.namespace)
        if group is None or group.get("state") not in WAITING_STATES:
            return None
        spec = _spec(self.namespace, task.label)
        _remove_group(task.label, self.namespace, group["placement_group_id"])
        if spec is not None:  # whoever follows it learns that it was stopped
            end = {"code": int(ExitCode.STOPPED), "submitted": spec.submitted, "withdrawn": True}
            _kv_put(self.namespace, ENDS + task.label, json.dumps(end).encode())
        _kv_del(self.namespace, SPECS + task.label)
        return left or Waiting(task.project_id, task.task_id, "", 0)

    def present(self, label: str) -> bool:
        """Whether the task has a placement group: it runs, starts, or waits for a host."""
        return _group(label, self.namespace) is not None

    def waits(self, label: str, group_id: str) -> bool:
        """Whether the cluster still has the group `group_id` of a queued task (waiting, or
        placed: a run of it then shows soon); taken at its word if the cluster cannot be
        asked, as a listing never fails on it."""
        try:
            found = _group_table(PlacementGroupID.from_hex(group_id))
        except (RayError, OSError, ValueError):
            return True
        return bool(found) and found.get("state") not in (None, "REMOVED")

    def stop(self, task: TaskPaths, wait: float | None) -> Holder | None:
        group = _group(task.label, self.namespace)
        if group is None or group.get("state") != "CREATED":
            return None
        try:
            where = self._ask(_group_node(group), "stop", task.label, wait, create=False,
                              wait=(wait or 0) + CALL_WAIT)  # fmt: skip
        except (RayActorError, ValueError):
            return None
        except RayError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, RunAgentError):
                raise cause from None
            raise RunAgentError(f"stopping task {task.label} on the cluster failed: {exc}") from exc
        return where.holder(task.label) if isinstance(where, Where) else None

    def ended(self, label: str, since: float) -> dict[str, Any] | None:
        """How the task's loop last ended (its exit code, host), if it ended after `since`
        (time.time() of the start that made it)."""
        data = _kv_get(self.namespace, ENDS + label)
        try:
            end = json.loads(data) if data else None
        except ValueError:
            return None
        if not isinstance(end, dict) or float(end.get("submitted") or 0) < since:
            return None
        return end

    def read(self, task: TaskPaths, relative: str, offset: int, limit: int) -> bytes:
        """Bytes of a file of the task's folder on the host that runs it (or ran it last),
        from `offset`."""
        group = _group(task.label, self.namespace)
        node = _group_node(group) if group is not None else ""
        if not node:
            end = self.ended(task.label, 0)
            node = str(end.get("node") or "") if end is not None else ""
        if not node:
            return b""
        root = None if not self.settings.shared_root else str(task.root.resolve())
        try:
            data = self._ask(node, "read", root, task.project_id, task.task_id, relative,
                             offset, limit, create=False)  # fmt: skip
        except (RayActorError, ValueError):
            return b""
        return data if isinstance(data, bytes) else b""

    def hosts(self) -> tuple[int, int]:
        """How many live hosts could take a loop, and how many have room for one now."""
        needs = self.settings.resources
        able = [n for n in _hosts() if n.get("Alive") and _fits(n.get("Resources") or {}, needs)]
        free = _free_per_host()
        return len(able), sum(1 for n in able if _fits(free.get(str(n["NodeID"]), {}), needs))

    def state_kept(self) -> str:
        """Where the cluster's head keeps its state: `redis` (GCS fault tolerance), `memory`,
        or '' if it does not say (what the head recorded as it started)."""
        found = internal_kv._internal_kv_get(GCS_STORAGE_KEY, namespace=USAGE_NAMESPACE)
        return found.decode() if isinstance(found, bytes) else ""

    def receive_runs(self, root: Path) -> None:
        """Hold the cluster's HOME name for `root` while this process lives: hosts that do not
        share the root send each task's folder here as its loop runs."""
        if HOME in self._names:
            return
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        try:
            self._names[HOME] = RemoteHome.options(
                name=HOME, namespace=self.namespace, num_cpus=0, scheduling_strategy=here
            ).remote(str(root))
        except ValueError:
            raise RunAgentError(
                "another server already receives this cluster's run folders "
                f"(namespace {self.namespace!r}); give this one another namespace"
            ) from None

    def hold_name(self, name: str) -> bool:
        """Whether this process holds `name` cluster-wide (taking it if it is free)."""
        if name in self._names:
            return True
        try:
            self._names[name] = RemoteName.options(
                name=name, namespace=self.namespace, num_cpus=0
            ).remote()
        except ValueError:
            return False
        return True

    def judge(self, label: str, on: str, pid: int, start: float | None) -> bool:
        """Whether the supervisor `pid` on host `on` still runs `label`'s loop: its host
        agent says so. A task no host agent runs is lost."""
        now = time.monotonic()
        seen = self._judged.get(label)
        if seen is None or now - seen[0] > JUDGE_TTL:
            try:
                seen = (now, self.locate(label))
            except (GetTimeoutError, ActorUnavailableError):  # busy or restarting, not gone
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
