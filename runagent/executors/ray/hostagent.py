"""The host agent: the one actor on each host of the cluster (`host:<node id>`, detached,
started again by Ray if its worker dies), which starts the loops of the task groups placed on
its host, watches their supervisors, stops them, and serves reads of their folders; so a task
costs its supervisor, as locally, and no Ray worker of its own.

A loop is started by the starter's call (`start`), or taken up from the cluster's table by the
agent's own watch (`_adopt`): a group that waited in Ray's queue, or one Ray moved here because
its host died. The supervisors die with the agent's worker (PR_SET_PDEATHSIG), so an agent that
is killed leaves no loop running; started again, it takes its groups up again as moved loops.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray

import runagent.executors.ray.mirror as mirror
import runagent.executors.ray.pauses as pauses
import runagent.executors.ray.store as store
from runagent.errors import AlreadyRunningError, RunAgentError
from runagent.executors import local as localexecutor
from runagent.executors.forkserver import Forked, ForkServer
from runagent.executors.ray.boundary import ClusterError, NameTakenError
from runagent.executors.ray.mirror import Mirror
from runagent.executors.ray.slot import CLUSTER_ENV, HOLD, SLOT, Cluster
from runagent.executors.ray.store import LoopSpec
from runagent.executors.where import Where
from runagent.loop.context import QUEUED_SINCE
from runagent.store import host, runfolder, taskfolder
from runagent.store.lock import live_holder
from runagent.store.pids import process_start_time
from runagent.store.runfolder import TaskPaths

WORKER_ROOT_ENV = "RUN_AGENT_WORKER_ROOT"  # a host's own runs root, when the root is not shared
AGENT = "host:"  # a host agent's actor name: host:<node id>
PLACEMENT_WAIT = 60.0  # seconds a start placed on a host waits for its loop to start there
CALL_WAIT = 30.0  # seconds a call to a host agent may take before it counts as unanswered
LOCATE_WAIT = 5.0  # seconds a host agent waits for a starting loop before it says "starting"
ADOPT_TICK = 0.5  # seconds between a host agent's looks for groups placed on its host
EAGER_TICK, EAGER_FOR = 0.05, 3.0  # looks (seconds apart) for so long after a slot here freed
WATCH_TICK = 0.1  # seconds between a host agent's looks at its supervisors
MIRROR_TICK = 0.25  # seconds between mirrorings of a live task's folder to the server's root
LEASE_WAIT = 180.0  # seconds a moved loop waits for a dead host's lock to be released
PAUSE_TICK = 0.5  # seconds between a host agent's looks at the agents paused (pauses.sync)
ENDED_KEPT = 256  # loops ended on a host that its agent remembers (HostAgent.ended)
ORPHAN_AFTER = 10.0  # seconds a group placed on a host may be no start's before it is removed
# A freed slot's hand-over: how long it waits for the host's resources to show the slot free,
# and for the group it made again to be placed, looking this often.
HAND_OVER_WAIT, HAND_OVER_TICK = 0.5, 0.005


def worker_root() -> Path:
    """This host's own runs root (RUN_AGENT_WORKER_ROOT, set when it joined the cluster)."""
    given = os.environ.get(WORKER_ROOT_ENV)
    return Path(given) if given else Path.home() / ".local" / "share" / "run-agent" / "runs"


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
        self.gcs = context.gcs_address
        self.host = host.this_host()
        self.loops: dict[str, _Loop] = {}
        # The loops that ended here lately, by task: the start they came from (its `submitted`)
        # and where they ran. A group placed at once may be taken up from the queue (`_adopt`)
        # and a quick loop end before its starter's own call arrives, which must not start it
        # again but learn where it ran.
        self.ended: dict[str, tuple[float, Where | None]] = {}
        self.lock = threading.Lock()
        self.freed = 0.0  # when a loop here last ended: a waiting group is placed here soon
        self.orphans: dict[str, float] = {}  # groups placed here that no start owns: since when
        # Whether loops here run under this host's own root (a start with shared_root false
        # came): only then are its paused agents and the cluster's made one (`_pauses`); a
        # host of a shared root leaves alone whatever root its user keeps here.
        self.apart = False
        # Supervisors die with the thread that forked them (PR_SET_PDEATHSIG): all are forked
        # by this one, which lives as long as the agent's worker.
        self.spawner = ThreadPoolExecutor(1, thread_name_prefix="spawner")
        # Which forks them from a process that loaded run-agent ahead (a new interpreter costs
        # a supervisor its imports, seconds on a loaded host), started now by that thread.
        self.forks = ForkServer()
        self.spawner.submit(self.forks.start, dict(os.environ))
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
        past its end, and for a path outside the folder); `root` None: this host's own root."""
        task = TaskPaths(Path(root) if root else worker_root(), project_id, task_id)
        folder = task.folder.resolve()
        path = (folder / relative).resolve()
        if not path.is_relative_to(folder):
            return b""  # never read; the starter's side answers such a read with b'' too
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
            store.put_spec(self.namespace, spec)
            if again and not spec.shared_root:
                mirror.seed(task, self.namespace)
            if not spec.shared_root:  # its loop's gate knows the cluster's paused agents
                self.apart = True
                self._pauses(first=True)
            loop.where = self._start(loop, again)
        except RunAgentError as exc:
            code = int(exc.exit_code)
            loop.where = Where(self.host, 0, None, "", str(exc), code, self.node)
        except Exception as exc:  # a fork that failed, say: the loop ends, its group with it
            loop.where = Where(self.host, 0, None, "", f"{type(exc).__name__}: {exc}", 1, self.node)
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
        # The loop learns its cluster, to give its slot back while its agent is paused.
        held = self._held_back(spec) if again else {}
        cluster = Cluster(self.gcs, self.namespace, self.node, held)
        env = {**os.environ, CLUSTER_ENV: cluster.to_env()}
        if not again:
            env[QUEUED_SINCE] = since
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
                    localexecutor.spawn_local, task, argv, spec.cwd, env, True, self._fork
                )
                started = localexecutor.await_lock(task, spawned.result(), spec.wait)
                break
            except AlreadyRunningError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)
        loop.process = started.process
        # Its end is met as it happens, not at the watch's next look: a freed slot waits for none.
        threading.Thread(target=self._await_end, args=(loop,), daemon=True).start()
        holder = started.holder or live_holder(task.lock)
        return Where(
            self.host, started.pid, process_start_time(started.pid),
            holder.since if holder is not None else "", node=self.node,
            log_from=log_from,
        )  # fmt: skip

    def _fork(self, argv: list[str], cwd: Path, env: Mapping[str, str], log: Path) -> Forked:
        """A supervisor forked by the fork server (started again if it died), in the spawner
        thread; OSError if it cannot be."""
        if not self.forks.start(dict(os.environ)):
            raise OSError("the fork server could not start")
        return self.forks.fork(argv, cwd, env, log)

    def _await_end(self, loop: _Loop) -> None:
        process = loop.process
        if process is None:
            return
        code = process.wait()
        self._finish(loop, exit_code(code))

    def _held_back(self, spec: LoopSpec) -> dict[str, float]:
        """What a loop started again here gave back of its host while its agent was paused, and
        had not taken again: its supervisor takes it again before its next attempt ({} when it
        holds its slot, or never gave it back)."""
        if not spec.held:
            return {}
        name = spec.label + SLOT
        again = store.group(name, self.namespace)
        if again is not None and again.get("state") == "CREATED":
            return {}
        if again is not None:  # asked for by the supervisor that died (on its old host, maybe)
            store.remove_group(name, self.namespace, again["placement_group_id"])
        return dict(spec.held)

    # Watching ---------------------------------------------------------------------------------

    def _watch(self) -> None:
        """Each supervisor's end frees its task's group (and so its slot and its name); groups
        placed on this host that no loop here holds yet are taken up; folders that are not on a
        shared root are mirrored to the server's meanwhile; the agents paused on this host's own
        root and on the cluster are made one (pauses.sync)."""
        adopted = synced = 0.0
        while True:
            try:
                mirrored = self._look()
                eager = time.monotonic() - self.freed < EAGER_FOR
                if time.monotonic() - adopted > ADOPT_TICK or eager:
                    adopted = time.monotonic()
                    self._adopt()
                if time.monotonic() - synced > PAUSE_TICK:
                    synced = time.monotonic()
                    self._pauses()
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
                except (OSError, ClusterError) as exc:
                    print(f"run-agent host agent: mirroring {loop.spec.label}: {exc}",
                          file=sys.stderr)  # fmt: skip
        return mirrored

    def _adopt(self, sweep: bool = True) -> None:
        """Start the loops of groups placed on this host that no loop here holds: one that
        waited in the cluster's queue, or one moved here from a host that died. Groups placed
        here that no start owns are removed once they have been so for a while (`sweep`: the
        watch's looks, not a hand-over's)."""
        orphans: dict[str, str] = {}
        for group in store.groups():
            label = str(group.get("name") or "")
            if group.get("state") != "CREATED" or not label or label in self.loops:
                continue
            if self.node not in (group.get("bundles_to_node_id") or {}).values():
                continue
            mine = store.group_by_name(label, self.namespace)
            if mine is None or mine.get("placement_group_id") != group["placement_group_id"]:
                continue  # another namespace's group of the same name
            if mine.get("state") != "CREATED":
                continue  # being removed
            base = label.removesuffix(SLOT)
            spec = store.spec(self.namespace, base)
            if spec is None and base not in self.loops:
                orphans[group["placement_group_id"]] = label
            if spec is None or base != label:
                continue
            loop, new = self._take(replace(spec, group=str(group["placement_group_id"])))
            if isinstance(loop, _Loop) and new:
                threading.Thread(target=self._launch, args=(loop, False), daemon=True).start()
        if sweep:
            self._remove_orphans(orphans)

    def _remove_orphans(self, found: Mapping[str, str]) -> None:
        """Remove the groups placed here that no start has owned for ORPHAN_AFTER seconds (by
        id, with their names): no spec names them and no loop here holds them, so nothing would
        ever remove them, and each would hold its share of this host for good. A start writes
        its spec before it makes its group, and a loop's end removes its groups before its
        spec, so only a moment's overlap is lawful; a group left by a process killed between
        the two, or by a stop that met a freed slot's hand-over, is not."""
        now = time.monotonic()
        self.orphans = {group_id: self.orphans.get(group_id, now) for group_id in found}
        for group_id, since in list(self.orphans.items()):
            if now - since < ORPHAN_AFTER:
                continue
            label = found[group_id]
            print(f"run-agent host agent: removing placement group {label!r} ({group_id}), "
                  f"which no start has owned for {ORPHAN_AFTER:g}s", file=sys.stderr)  # fmt: skip
            store.remove_group(label, self.namespace, group_id)
            del self.orphans[group_id]

    def _pauses(self, first: bool = False) -> None:
        """This host's own root (where loops run whose hosts do not share the runs root) and
        the cluster agree on which agents are paused: a pause a loop here wrote holds on every
        host, and one found elsewhere, or lifted by a person, holds or lifts here too. `first`:
        before a loop starts here (its root made if it is the first); one that cannot be
        agreed on now is said in the agent's log, and looked at again at the next tick."""
        root = worker_root()
        if not self.apart or not (first or root.is_dir()):
            return
        try:
            pauses.sync(root, self.namespace)
        except (OSError, ClusterError) as exc:
            print(f"run-agent host agent: the paused agents: {exc}", file=sys.stderr)

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
                except (OSError, ClusterError):
                    pass
            log_from = loop.where.log_from if loop.where is not None else 0
            end = {"code": code, "submitted": spec.submitted, "host": self.host,
                   "node": self.node, "log_from": log_from}  # fmt: skip
            store.put_end(self.namespace, spec.label, end)
            left = store.spec(self.namespace, spec.label)
            mine = left is not None and left.submitted == spec.submitted
            # Its group, and the group that held its slot again after a pause (slot.Slot). While
            # its spec is still this start's, whatever group bears its name is its own (no other
            # start can take the name meanwhile), whichever id it has now: a pause or a freed
            # slot's hand-over may have made it again since the spec was written (a hand-over
            # racing Ray's own placement of the group, which this loop was started from).
            held = store.group(spec.label, self.namespace)
            store.remove_group(spec.label, self.namespace, None if mine else spec.group or None)
            store.remove_group(spec.label + SLOT, self.namespace)
            if mine:
                store.drop_spec(self.namespace, spec.label)
            if held is not None and held.get("state") == "CREATED":
                # Its own thread: a `stop` that ended the loop does not wait for the next start.
                bundle = store.group_bundle(held)
                threading.Thread(target=self._hand_over, args=(bundle,), daemon=True).start()
        finally:
            with self.lock:
                if self.loops.get(spec.label) is loop:
                    del self.loops[spec.label]
                self.ended.pop(spec.label, None)  # the newest last, the oldest let go of
                self.ended[spec.label] = (spec.submitted, loop.where)
                if len(self.ended) > ENDED_KEPT:
                    del self.ended[next(iter(self.ended))]
            self.freed = time.monotonic()

    def _hand_over(self, freed: Mapping[str, float]) -> None:
        """Have the oldest group waiting in this namespace that `freed` (what an ended loop's
        group held here) fits placed now, here, and its loop started. Ray tries a waiting group
        again only after a back-off that grows to a second, and neither a freed slot nor a
        removed group wakes it: so that group is made again under its name (its spec says so
        meanwhile, as a start finds no group for a moment), which Ray tries at once. Ray frees
        a removed group's share of its host a moment after the removal: made again before
        that, the group would fail its try and wait out its back-off, so the hand-over first
        waits for this host's resources to show the slot free (the oldest waiting group is
        found meanwhile). Once the group is placed here, its loop starts at once, not at the
        watch's next look. A group waiting to take a paused loop's slot again goes first: none
        is made again while one waits. Nothing is lost if this fails: Ray places the waiting
        group at its next try, and the watch starts its loop."""
        if freed == HOLD:
            return  # a paused loop's group held no slot
        try:
            waiting = []
            for group in store.groups():
                name = str(group.get("name") or "")
                if group.get("state") != "PENDING" or not name:
                    continue
                mine = store.group_by_name(name, self.namespace)
                if mine is None or mine.get("placement_group_id") != group["placement_group_id"]:
                    continue  # another namespace's
                if name.endswith(SLOT):
                    return  # a paused loop taking its slot again comes first: Ray's to place
                bundle = store.group_bundle(group)
                spec = store.spec(self.namespace, name)
                if spec is not None and store.fits(freed, bundle):
                    waiting.append((spec.submitted, name, group["placement_group_id"], bundle))
            if not waiting:
                return
            _, name, group_id, bundle = min(waiting)
            spec = store.spec(self.namespace, name)
            if spec is None:
                return
            store.put_spec(self.namespace, replace(spec, touched=time.time()))
            self._until(lambda: store.fits(store.free_per_host().get(self.node, {}), freed))
            still = store.group(name, self.namespace)
            if still is None or still.get("state") != "PENDING":
                return  # placed by Ray meanwhile (a loop may run from it now), or gone
            store.remove_group(name, self.namespace, group_id)
            store.make_group(name, bundle, near=self.node)
            if self._until(lambda: _placed(store.group(name, self.namespace))):
                self._adopt(sweep=False)
        except Exception as exc:  # NameTakenError: another host agent made it again first
            if not isinstance(exc, NameTakenError):
                print(f"run-agent host agent: handing a freed slot over: {exc}", file=sys.stderr)

    @staticmethod
    def _until(done: Callable[[], bool]) -> bool:
        """Whether `done` came true within HAND_OVER_WAIT, looking every HAND_OVER_TICK."""
        deadline = time.monotonic() + HAND_OVER_WAIT
        while not done():
            if time.monotonic() > deadline:
                return False
            time.sleep(HAND_OVER_TICK)
        return True

    def _log(self, task: TaskPaths, line: str) -> None:
        try:
            runfolder.append_line(runfolder.supervisor_log_path(task), f"run-agent: {line}")
        except OSError:
            pass


RemoteHostAgent: Any = ray.remote(HostAgent)


def _placed(group: Mapping[str, Any] | None) -> bool:
    return group is not None and group.get("state") == "CREATED"


def exit_code(returned: int) -> int:
    """A process's exit code as a shell gives it: a death by signal N is 128 + N."""
    return 128 - returned if returned < 0 else returned


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
