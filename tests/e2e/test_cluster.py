"""Task loops on a real multi-node Ray cluster (a head and two hosts, each with its own
`agent_slot` and root), and the same contract on the local executor.

Skipped when the `ray` extra is not installed, except under CI (`CI` set), where a missing
extra fails the module: the cluster tests are never silently left out there.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

try:
    import ray
    from ray.cluster_utils import Cluster
except ImportError:
    if os.environ.get("CI"):
        raise
    pytest.skip("the ray extra is not installed (pip install -e '.[ray]')", allow_module_level=True)

from runagent import listing, schedule
from runagent.config.overrides import LoopOverrides
from runagent.config.settings import ExecutorSettings, ExecutorType, ScheduleConfig
from runagent.errors import AlreadyRunningError, ExitCode
from runagent.executors import broker, control
from runagent.store import taskfolder, tasks
from runagent.store.host import this_host
from runagent.store.runfolder import TaskPaths, read_run_info
from runagent.store.runinfo import RunStatus
from tests import sse
from tests.conftest import Server, Workspace, alive, serving, wait_for

HOSTS = ("hostB", "hostC")
# Node failure is noticed within seconds, not Ray's default half-minute (a test budget); but
# not within 2 s (4 misses): a loaded machine kept live raylets from answering that long, they
# were declared dead and killed, and every later test met a cluster short of a host.
FAST_HEALTH = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 20,
}


@dataclass
class RayCluster:
    cluster: Cluster
    settings: ExecutorSettings
    base: Path
    nodes: dict[str, Any]

    def add_host(self, name: str) -> None:
        self.nodes[name] = self.cluster.add_node(
            num_cpus=1,
            resources={"agent_slot": 2},
            env_vars={"RUN_AGENT_HOST": name, "RUN_AGENT_WORKER_ROOT": str(self.base / name)},
        )

    def executor(self) -> Any:
        return control.ray_executor(self.settings)

    def lost_hosts(self) -> list[str]:
        """The hosts of HOSTS not running now: a test that killed one and could not add it
        again (a loaded machine's node start timing out), or one Ray declared dead."""
        return [
            n for n in HOSTS if n not in self.nodes or not self.nodes[n].remaining_processes_alive()
        ]

    def add_lost_hosts(self) -> list[str]:
        """The lost hosts, added again (the one that died removed first): their names."""
        lost = self.lost_hosts()
        for name in lost:
            if name in self.nodes:
                with contextlib.suppress(Exception):  # its processes are gone already
                    self.cluster.remove_node(self.nodes.pop(name), allow_graceful=False)
            self.add_host(name)
        if lost:
            self.cluster.wait_for_nodes(timeout=120)
        return lost


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    """One cluster for the module: its sockets live under a short temp folder (a socket path
    is at most 107 bytes), which goes with everything in it at the end."""
    base = tmp_path_factory.mktemp("cluster")
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray", dir=os.environ.get("TMPDIR", "/tmp")))
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = str(ray_tmp)
    head = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "_system_config": FAST_HEALTH},
    )
    made = RayCluster(
        head,
        ExecutorSettings(type=ExecutorType.RAY, address=head.address, namespace="test"),
        base,
        {},
    )
    try:
        for name in HOSTS:
            made.add_host(name)
        head.wait_for_nodes()
        made.executor()
        yield made
    finally:
        from runagent.executors import ray as rayexecutor

        rayexecutor.disconnect()
        head.shutdown()
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(params=["local", "ray"])
def executor(request: pytest.FixtureRequest) -> ExecutorSettings:
    """Each contract test runs on both executors."""
    if request.param == "local":
        return ExecutorSettings()
    made: RayCluster = request.getfixturevalue("cluster")
    for name in made.add_lost_hosts():  # as on_cluster does: a test meets the whole cluster
        warnings.warn(f"host {name} was lost by an earlier test; added again", stacklevel=1)
    return made.settings


def cluster_config(
    ws: Workspace, settings: ExecutorSettings, args: list[str], **defaults: Any
) -> None:
    ws.write_config(args, **defaults)
    data = yaml.safe_load(ws.config.read_text())
    data["executor"] = {
        "type": settings.type.value,
        "address": settings.address,
        "namespace": settings.namespace,
        "shared_root": settings.shared_root,
    }
    ws.config.write_text(yaml.safe_dump(data))


def start(
    ws: Workspace, settings: ExecutorSettings, task: TaskPaths, **overrides: Any
) -> control.Started:
    taskfolder.claim_task_prompt(task, "do the thing", "")
    return control.start_detached(
        task, "run", LoopOverrides(**overrides), config_path=ws.config, cwd=ws.path,
        executor=settings,
    )  # fmt: skip


def where_it_runs(settings: ExecutorSettings) -> set[str]:
    return set(HOSTS) if settings.type is ExecutorType.RAY else {this_host()}


def name_free(settings: ExecutorSettings, label: str) -> bool:
    if settings.type is not ExecutorType.RAY:
        return True
    return control.ray_executor(settings).locate(label) is None


def latest(task: TaskPaths) -> Any:
    ids = task.run_ids()
    return read_run_info(task.run_folder(ids[-1])) if ids else None


# The contract, on both executors --------------------------------------------------------------


def test_a_dispatched_loop_runs_and_its_run_names_its_host(
    ws: Workspace, executor: ExecutorSettings
) -> None:
    cluster_config(ws, executor, ["--lines", "3"])
    task = ws.task("p", f"dispatch-{executor.type}")
    started = start(ws, executor, task)
    assert started.holder is not None and started.holder.host in where_it_runs(executor)
    wait_for(lambda: task.done.exists(), 120, "the task to complete")
    info = latest(task)
    assert info.status is RunStatus.COMPLETED and info.host == started.holder.host
    assert "line 3" in task.run(info.run_id).stdout.read_text()
    wait_for(lambda: name_free(executor, task.label), 120, "the actor to end")
    assert listing.view(task).status is tasks.TaskStatus.COMPLETED


def test_a_failed_run_is_restarted_by_the_same_loop_on_the_same_host(
    ws: Workspace, executor: ExecutorSettings
) -> None:
    cluster_config(ws, executor, ["--fail-first", "2", "--lines", "1"])
    task = ws.task("p", f"restart-{executor.type}")
    started = start(ws, executor, task)
    wait_for(lambda: task.done.exists(), 120, "the third attempt to complete")
    runs = [read_run_info(task.run_folder(r)) for r in task.run_ids()]
    assert [(r.attempt, r.status) for r in runs] == [
        (1, RunStatus.FAILED), (2, RunStatus.FAILED), (3, RunStatus.COMPLETED)
    ]  # fmt: skip
    assert started.holder is not None and {r.host for r in runs} == {started.holder.host}
    assert runs[2].previous_run_id == runs[1].run_id
    wait_for(lambda: name_free(executor, task.label), 120, "the loop to end")


def test_a_second_start_is_refused_naming_the_holder(
    ws: Workspace, executor: ExecutorSettings
) -> None:
    cluster_config(ws, executor, ["--sleep", "60"])
    task = ws.task("p", f"twice-{executor.type}")
    first = start(ws, executor, task)
    with pytest.raises(AlreadyRunningError) as refused:
        start(ws, executor, task)
    assert refused.value.exit_code == ExitCode.ALREADY_RUNNING
    message = str(refused.value)
    assert f"task {task.label} is already running" in message
    assert first.holder is not None
    if executor.type is ExecutorType.RAY:
        assert f"on host {first.holder.host}" in message
    view = listing.view(task)
    assert view.status is tasks.TaskStatus.RUNNING and view.supervisor is not None
    assert view.supervisor.host == first.holder.host
    status = ws.invoke("status", "-p", "p", "-t", task.task_id)
    assert status.returncode == 0
    assert re.search(rf"supervisor +{re.escape(first.holder.describe())} since", status.stdout)
    control.stop(task, 20, executor)
    assert name_free(executor, task.label)


def test_stop_kills_the_whole_tree_setsid_grandchildren_too(
    ws: Workspace, executor: ExecutorSettings
) -> None:
    args = ["--grandchild", "--setsid-grandchild", "--wait-pids", "3", "--sleep", "120"]
    cluster_config(ws, executor, args)
    task = ws.task("p", f"stop-{executor.type}")
    start(ws, executor, task)
    pids = wait_for(lambda: len(ws.agent_pids()) >= 3 and ws.agent_pids(), 120, "three agents")
    asked = control.stop(task, 20, executor)
    assert asked is not None
    assert not [p for p in pids if alive(p)]
    assert latest(task).status is RunStatus.STOPPED
    assert not ws.leftovers()
    assert name_free(executor, task.label)
    assert control.stop(task, 5, executor) is None  # nothing left to stop


def test_a_timeout_kills_the_tree_as_locally(ws: Workspace, executor: ExecutorSettings) -> None:
    cluster_config(ws, executor, ["--setsid-grandchild", "--wait-pids", "2", "--sleep", "120"])
    task = ws.task("p", f"timeout-{executor.type}")
    # Long enough for a loaded machine to start the agent and its grandchild (two interpreters)
    # before the timeout, which counts from the attempt's start.
    start(ws, executor, task, timeout=15.0, max_restarts=0)
    pids = wait_for(lambda: len(ws.agent_pids()) >= 2 and ws.agent_pids(), 120, "two agents")
    wait_for(lambda: (latest(task) or None) and latest(task).status is RunStatus.TIMED_OUT, 120,
             "the run to time out")  # fmt: skip
    assert not [p for p in pids if alive(p)]
    wait_for(lambda: name_free(executor, task.label), 120, "the loop to end")
    wait_for(lambda: not ws.leftovers(), 120, "its supervisor to exit")


def cli_with(ws: Workspace, *args: str) -> subprocess.CompletedProcess[str]:
    return ws.cli(*args, "--config", str(ws.config), timeout=120)


def test_run_follows_its_loop_and_exits_with_its_code(
    ws: Workspace, executor: ExecutorSettings
) -> None:
    """`run` and `job` are foreground on every executor: the loop's event lines as it goes,
    then its own exit code (0 completed, 1 failed, 124 timed out)."""
    kind = executor.type.value
    cluster_config(ws, executor, ["--fail-first", "1", "--lines", "1"], max_restarts=1)
    done = cli_with(ws, "run", "-p", "p", "-t", f"fg-{kind}", "go")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert any(re.match(r"run-agent: attempt 1/2: run \S+ started \(fake\)", ln) for ln in lines)
    assert any(re.match(r"run-agent: attempt 1: run \S+ failed", ln) for ln in lines)
    assert any(re.match(r"run-agent: attempt 2: run \S+ completed", ln) for ln in lines)
    assert lines[-1].startswith(f"run-agent: task p/fg-{kind} completed by run")
    failed = cli_with(ws, "job", "-p", "p", "-t", f"job-{kind}", "go")
    assert failed.returncode == ExitCode.FAILED, failed.stderr
    assert latest(ws.task("p", f"job-{kind}")).status is RunStatus.FAILED
    assert len(ws.task("p", f"job-{kind}").run_ids()) == 1  # a job runs once
    cluster_config(ws, executor, ["--sleep", "60"], max_restarts=0)
    slow = cli_with(ws, "run", "-p", "p", "-t", f"slow-{kind}", "--timeout", "1s", "go")
    assert slow.returncode == ExitCode.TIMED_OUT, slow.stderr
    quiet = cli_with(ws, "job", "-p", "p", "-t", f"quiet-{kind}", "-q", "--timeout", "1s", "go")
    assert quiet.returncode == ExitCode.TIMED_OUT
    assert len(quiet.stderr.strip().splitlines()) == 1, quiet.stderr  # the final line only
    wait_for(lambda: not ws.leftovers(), 120, "nothing left")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_run_stops_the_loop_wherever_it_runs(
    ws: Workspace, executor: ExecutorSettings, sig: signal.Signals
) -> None:
    cluster_config(ws, executor, ["--setsid-grandchild", "--wait-pids", "2", "--sleep", "120"])
    task = ws.task("p", f"sig-{executor.type.value}-{sig.name}")
    proc = subprocess.Popen(
        ws.cli_argv("run", "-p", "p", "-t", task.task_id, "--config", str(ws.config), "go"),
        cwd=ws.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        pids = wait_for(lambda: len(ws.agent_pids()) >= 2 and ws.agent_pids(), 120, "agents")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == ExitCode.STOPPED, err
    assert not [p for p in pids if alive(p)]
    assert latest(task).status is RunStatus.STOPPED
    assert name_free(executor, task.label)
    wait_for(lambda: not ws.leftovers(), 120, "nothing left")


def test_a_check_judges_a_loop_on_either_executor(
    ws: Workspace, executor: ExecutorSettings
) -> None:
    """The check runs where the loop runs: a first attempt it fails is a failed run (the next
    prompt told why), the second it passes completes the task."""
    kind = executor.type.value
    attempts = ws.path / f"attempts-{kind}"
    cluster_config(ws, executor, ["--counter", str(attempts), "--lines", "1"], max_restarts=2)
    check = f"sh -c 'test \"$(cat {attempts})\" -ge 2'"
    done = cli_with(ws, "run", "-p", "p", "-t", f"checked-{kind}", "--check", check, "go")
    assert done.returncode == 0, done.stderr
    task = ws.task("p", f"checked-{kind}")
    first, second = (read_run_info(task.run_folder(r)) for r in task.run_ids())
    assert first.status is RunStatus.FAILED and first.reason == "check_failed"
    assert first.check_exit_code == 1 and second.check_exit_code == 0
    assert second.status is RunStatus.COMPLETED
    assert "check" in task.run(second.run_id).prompt.read_text().lower()


def test_detach_starts_the_loop_says_where_and_returns(
    ws: Workspace, executor: ExecutorSettings
) -> None:
    cluster_config(ws, executor, HOLD, max_restarts=0)
    task = ws.task("p", f"detached-{executor.type.value}")
    done = cli_with(ws, "run", "-p", "p", "-t", task.task_id, "--detach", "go")
    try:
        assert done.returncode == 0, done.stderr
        found = re.search(r"started on (\w+) \(supervisor pid (\d+)(?: on host (\w+))?\)",
                          done.stderr)  # fmt: skip
        assert found is not None, done.stderr
        assert found[1] == executor.type.value
        if executor.type is ExecutorType.RAY:  # on a cluster, always the host (this may be one)
            assert found[3] in HOSTS
        view = wait_for(lambda: (v := listing.view(task)).status is tasks.TaskStatus.RUNNING
                        and v, 120, "the loop to run on")  # fmt: skip
        assert view.supervisor is not None and view.supervisor.pid == int(found[2])
        # Admitted by the door here, once: the loop where it runs is told so, not admitted again.
        assert "--admitted" in psutil.Process(view.supervisor.pid).cmdline()
    finally:
        go(task)
    wait_for(lambda: listing.view(task).status is tasks.TaskStatus.COMPLETED, 120, "completed")
    wait_for(lambda: name_free(executor, task.label), 120, "its loop to end")


# The cluster only ---------------------------------------------------------------------------


@pytest.fixture
def on_cluster(ws: Workspace, cluster: RayCluster) -> RayCluster:
    """The module's cluster as a test expects it: no task's placement group left on it. A
    group an earlier test's loops left (every process of that test was stopped, and its root
    is gone, so nothing will remove it) held a host's agent_slot, and every later test that
    counts the free slots failed after it (seen once under a CPU hog of twice the cores). Such
    a group is removed here, and named in a warning, so the test that left it can be found."""

    from runagent.executors.ray import store

    def left() -> list[dict[str, Any]]:
        return [g for g in store.groups() if g.get("state") != "REMOVED"]

    # A host an earlier test lost (it killed one and could not add it again) is added again:
    # left lost, every later test that counts the cluster's slots failed after it.
    for name in cluster.add_lost_hosts():
        warnings.warn(f"host {name} was lost by an earlier test; added again", stacklevel=1)

    # The host agents remove an ended loop's groups within moments: give them that first.
    deadline = time.monotonic() + 30
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    for group in left():
        warnings.warn(f"placement group {group.get('name')!r} ({group.get('state')}) was left "
                      "on the cluster by an earlier test; removed", stacklevel=1)  # fmt: skip
        with contextlib.suppress(Exception):  # gone meanwhile
            group_id = store.PlacementGroupID.from_hex(group["placement_group_id"])
            store.remove_placement_group(store.PlacementGroup(group_id))
    return cluster


def test_a_sandboxed_loop_on_the_cluster_runs_its_agent_under_bwrap(
    ws: Workspace, on_cluster: RayCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`sandbox: bwrap` holds on a host of the cluster as here: the loop that the actor starts
    there wraps its agent, which sees neither another folder nor a system it could write."""
    from runagent.ops.sandbox import Bwrap

    if Bwrap(Path("/")).problem() is not None:
        pytest.skip("bubblewrap cannot run here")
    secret = tmp_path_factory.mktemp("elsewhere") / "secret.txt"
    secret.write_text("another project's secret")
    cluster_config(ws, on_cluster.settings, ["--probe-read", str(secret), "--probe-write",
                                             "/usr/sandbox-probe.txt"], max_restarts=0)  # fmt: skip
    data = yaml.safe_load(ws.config.read_text())
    for agent in data["agents"].values():
        agent["sandbox"] = "bwrap"
    ws.config.write_text(yaml.safe_dump(data))
    task = ws.task("p", "sandboxed")
    start(ws, on_cluster.settings, task)
    info = wait_for(lambda: (i := latest(task)) and i.status is RunStatus.COMPLETED and i, 120,
                    "the sandboxed run on a host")  # fmt: skip
    assert info.host in HOSTS
    stdout = task.run(info.run_id).stdout.read_text()
    assert f"read {secret}: FileNotFoundError" in stdout
    assert "write /usr/sandbox-probe.txt: OSError" in stdout
    wait_for(lambda: name_free(on_cluster.settings, task.label), 120, "its loop to end")


def test_the_command_line_dispatches_and_serve_streams_the_run(
    ws: Workspace, on_cluster: RayCluster, server: Server
) -> None:
    cluster_config(ws, on_cluster.settings, ["--lines", "5", "--interval", "0.2"])
    done = ws.cli("run", "-p", "p", "-t", "cli", "--detach", "--config", str(ws.config), "hello")
    assert done.returncode == 0, done.stderr
    assert "task p/cli started on ray (supervisor pid" in done.stderr
    assert any(f"on host {h})" in done.stderr for h in HOSTS)
    task = ws.task("p", "cli")
    run_id = wait_for(lambda: task.run_ids(), 120, "the run")[0]
    path = f"/api/projects/p/tasks/cli/runs/{run_id}/stream/stdout"
    got, last = "", None
    for message in sse.stream(server.url + path, timeout=60):
        if message.event == "data":
            got, last = got + str(message.json()), message.id
            if "line 2" in got:
                break
    assert last is not None
    rest = ""  # a client that reconnects from its last offset gets the bytes it missed, once
    for message in sse.stream(server.url + path, {"Last-Event-ID": last}, timeout=60):
        if message.event == "data":
            rest += str(message.json())
        elif message.event == "end":
            break
    assert (got + rest).count("line 1\n") == 1 and "line 5" in got + rest
    run = wait_for(lambda: _api_run(server, run_id), 120, "the run to end")
    assert run["host"] in HOSTS
    stopped = ws.cli("stop", "-p", "p", "-t", "cli", "--config", str(ws.config))
    assert stopped.returncode == 0 and "is not running" in stopped.stdout


def test_the_pages_api_starts_and_stops_a_loop_on_the_cluster(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    import httpx

    cluster_config(ws, on_cluster.settings, ["--setsid-grandchild", "--wait-pids", "2",
                                             "--sleep", "120"])  # fmt: skip
    with serving(ws) as url:
        started = httpx.post(f"{url}/api/projects/p/tasks", timeout=90,
                             json={"task_id": "api", "prompt": "go"})  # fmt: skip
        assert started.status_code == 202, started.text
        assert started.json()["host"] in HOSTS
        pids = wait_for(lambda: len(ws.agent_pids()) >= 2 and ws.agent_pids(), 120, "agents")
        row = httpx.get(f"{url}/api/projects/p/tasks/api", timeout=30).json()
        assert row["status"] == "running" and row["supervisor_host"] in HOSTS
        again = httpx.post(f"{url}/api/projects/p/tasks", timeout=90,
                           json={"task_id": "api", "prompt": "go"})  # fmt: skip
        assert again.status_code == 409 and "on host" in again.text
        stopped = httpx.post(f"{url}/api/projects/p/tasks/api/stop", json={}, timeout=90)
        assert stopped.status_code == 200 and stopped.json()["stopped"] is True
        assert not [p for p in pids if alive(p)]
        assert name_free(on_cluster.settings, "p/api")


HOLD = ["--lines", "1", "--wait-in-task", "go"]  # each agent waits for `go` in its task folder


def listed(ws: Workspace) -> dict[str, dict[str, Any]]:
    done = ws.cli("list", "--json", "--config", str(ws.config))
    assert done.returncode == 0, done.stderr
    return {f"{t['project_id']}/{t['task_id']}": t for t in json.loads(done.stdout)}


def go(task: TaskPaths) -> None:
    task.folder.mkdir(parents=True, exist_ok=True)
    (task.folder / "go").touch()


def test_a_start_beyond_the_free_agent_slots_waits_in_the_clusters_queue(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    """The cluster's 4 agent_slots taken, a start returns at once as queued (Ray's queue holds
    its actor, no process of it waits here), listings show it queued with its place, `stop`
    takes one out, and the next starts on a host once a slot frees."""
    settings = on_cluster.settings
    cluster_config(ws, settings, HOLD, max_restarts=0)
    holders = [ws.task("p", f"hold{n}") for n in range(4)]
    queued = [ws.task("p", "q1"), ws.task("p", "q2")]
    try:
        for task in holders:
            start(ws, settings, task)
        wait_for(lambda: all(listing.view(t).status is tasks.TaskStatus.RUNNING for t in holders),
                 60, "four loops holding the four agent_slots")  # fmt: skip
        for n, task in enumerate(queued):
            done = ws.cli("run", "-p", "p", "-t", task.task_id, "-d", "--config", str(ws.config),
                          "go")  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert (
                f"task {task.label} queued: {n} ahead (a Ray host with agent_slot 1 free)"
                in done.stderr
            ), done.stderr
            assert task.run_ids() == []  # nothing of it runs
        rows = listed(ws)
        for n, task in enumerate(queued):
            assert rows[task.label]["status"] == "queued", rows[task.label]
            assert rows[task.label]["queue"]["ahead"] == n
            assert rows[task.label]["queue"]["waits_for"] == "a Ray host with agent_slot 1 free"
        fleet = json.loads(ws.cli("fleet", "--json", "--config", str(ws.config)).stdout)
        assert fleet["counts"]["queued"] == 2 and fleet["counts"]["running"] == 4
        again = ws.cli("run", "-p", "p", "-t", "q1", "-d", "--config", str(ws.config), "go")
        assert again.returncode == ExitCode.ALREADY_RUNNING
        assert "task p/q1 is already queued on the Ray cluster" in again.stderr
        left = ws.cli("stop", "-p", "p", "-t", "q2", "--config", str(ws.config))
        assert left.returncode == 0 and "left the queue" in left.stdout, left.stderr
        assert name_free(settings, "p/q2") and listed(ws)["p/q2"]["status"] == "pending"
        doomed = ws.task("p", "q3")  # a queued task deleted never starts either
        queue = ws.cli("run", "-p", "p", "-t", "q3", "-d", "--config", str(ws.config), "go")
        assert "queued: 1 ahead" in queue.stderr, queue.stderr
        gone = ws.cli("delete", "-p", "p", "-t", "q3", "--yes", "--config", str(ws.config))
        assert gone.returncode == 0, gone.stderr
        assert name_free(settings, "p/q3") and not doomed.folder.exists()
        # Followed in the foreground while it waits, and taken out of the queue elsewhere: the
        # follower says so and exits 130.
        follower = subprocess.Popen(
            ws.cli_argv("run", "-p", "p", "-t", "q4", "--config", str(ws.config), "go"),
            cwd=ws.path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            wait_for(lambda: listed(ws).get("p/q4", {}).get("status") == "queued", 60, "queued")
            assert ws.cli("stop", "-p", "p", "-t", "q4", "--config", str(ws.config)).returncode == 0
            _, err = follower.communicate(timeout=60)
        finally:
            follower.kill()
        assert follower.returncode == ExitCode.STOPPED, err
        assert "task p/q4 queued: 1 ahead" in err and "left the queue" in err, err
        freed = time.time()
        go(holders[0])  # its agent completes, its loop ends, its slot frees
        view = wait_for(
            lambda: (v := listing.view(queued[0])).status is tasks.TaskStatus.RUNNING and v, 120,
            "the queued task to start once a slot frees",
        )  # fmt: skip
        assert view.supervisor is not None and view.supervisor.host in HOSTS
        assert listed(ws)[queued[0].label]["queue"] is None
        # Its first run records its wait in Ray's queue, which began before a slot was freed
        # for it (every start on a cluster is placed through Ray's queue: one placed at once
        # records its moment there too).
        first = wait_for(lambda: tasks.latest_run(queued[0]), 120, "its first run's record")
        assert first.queued_seconds is not None, first
        began = datetime.fromisoformat(first.start_time).timestamp()
        assert began - first.queued_seconds < freed
        held = wait_for(lambda: ws.runs("p", "hold1"), 120, "hold1's run record")
        assert held[0].queued_seconds is not None
        assert queued[1].run_ids() == []  # taken out: never started
    finally:
        for task in [*holders, *queued]:
            go(task)
        for task in [*holders, *queued]:
            wait_for(lambda t=task: name_free(settings, t.label), 120, f"{task.label} to end")


# A command as a person runs it, its Ray calls carried by the root's broker: whether it loaded
# Ray is said on its stderr as it exits.
PROBE = """
import atexit, sys
atexit.register(lambda: print("ray " + ("loaded" if "ray" in sys.modules else "never loaded"),
                              file=sys.stderr))
from runagent.cli import main
main()
"""


def probed(ws: Workspace, *args: str, env: dict[str, str] | None = None) -> Any:
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args, "--config", str(ws.config)], cwd=ws.path,
        env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_commands_on_the_cluster_go_through_the_roots_broker_and_never_load_ray(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    """`run --detach`, `status` and `stop` of a loop on the cluster: none loads Ray (a second
    each), all go through the one broker the first started, whose folder and socket are the
    user's alone."""
    settings = on_cluster.settings
    cluster_config(ws, settings, HOLD, max_restarts=0)
    task = ws.task("p", "brokered")
    try:
        started = probed(ws, "run", "-p", "p", "-t", "brokered", "-d", "go")
        assert started.returncode == 0, started.stderr
        assert "started on ray" in started.stderr and "ray never loaded" in started.stderr
        folder = broker.folder(ws.root)
        [pid_file] = list(folder.glob("*.pid"))
        pid = int(pid_file.read_text())
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE(pid_file.with_suffix(".sock").stat().st_mode) == 0o600
        status = probed(ws, "status", "-p", "p", "-t", "brokered")
        assert status.returncode == 0 and "ray never loaded" in status.stderr, status.stderr
        # Its supervisor on another host, judged alive by the cluster through the broker.
        assert re.search(r"supervisor +pid \d+ on host host[BC] since", status.stdout)
        stopped = probed(ws, "stop", "-p", "p", "-t", "brokered")
        assert stopped.returncode == 0, stopped.stderr
        assert f"task {task.label} stopped" in stopped.stdout
        assert "ray never loaded" in stopped.stderr
        assert int(pid_file.read_text()) == pid and alive(pid)  # the one broker of them all
        assert latest(task).status is RunStatus.STOPPED
    finally:
        go(task)
        wait_for(lambda: name_free(settings, task.label), 120, "its loop to end")


def test_where_no_broker_can_answer_a_command_joins_the_cluster_itself_and_says_so(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    settings = on_cluster.settings
    cluster_config(ws, settings, HOLD, max_restarts=0)
    ws.root.mkdir(parents=True, exist_ok=True)
    broker.folder(ws.root).write_text("in the broker's way")
    task = ws.task("p", "joined")
    try:
        done = probed(ws, "run", "-p", "p", "-t", "joined", "-d", "go")
        assert done.returncode == 0, done.stderr
        said = [line for line in done.stderr.splitlines() if "no cluster broker" in line]
        assert len(said) == 1 and "this command joins the Ray cluster itself" in said[0], said
        assert "started on ray" in done.stderr and "ray loaded" in done.stderr
        # Turned off, a command joins the cluster without a word about it.
        quiet = probed(ws, "status", "-p", "p", "-t", "joined", env={broker.BROKER_ENV: "0"})
        assert quiet.returncode == 0 and "no cluster broker" not in quiet.stderr, quiet.stderr
        assert "running" in quiet.stdout
    finally:
        go(task)
        wait_for(lambda: name_free(settings, task.label), 120, "its loop to end")


def test_a_starters_call_that_comes_after_its_loop_ran_and_ended_starts_nothing_again(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    """A group placed at once may be taken up by its host's agent as from the queue, and a
    quick loop end, before the starter's own call to start it arrives: that late call learns
    where the loop ran and starts nothing (it once started it again, and the task, completed,
    refused: the starter said a task that had run fine could not start)."""
    from runagent.executors.ray import store

    settings = on_cluster.settings
    cluster_config(ws, settings, HOLD, max_restarts=0)
    task = ws.task("p", "late")
    started = start(ws, settings, task)
    # What its host agent was given, and which agent it is (the one that started it says so).
    spec = wait_for(lambda: (s := store.spec(settings.namespace, task.label)) and s.node
                    and s, 120, "the spec its host agent started")  # fmt: skip
    agent = ray.get_actor(f"host:{spec.node}", namespace=settings.namespace)
    go(task)
    wait_for(lambda: task.done.exists() and name_free(settings, task.label), 120, "its end")
    runs = task.run_ids()
    where = ray.get(agent.start.remote(spec), timeout=60)
    # Its supervisor: the start's own, or (a slot still held by the test before, so the start
    # was queued) the one its host agent started when it took the group up.
    supervisor = started.pid or latest(task).supervisor_pid
    assert where.error is None and where.pid == supervisor, where
    assert task.run_ids() == runs  # nothing ran again
    assert listing.view(task).status is tasks.TaskStatus.COMPLETED


def test_a_task_after_another_waits_here_then_runs_on_the_cluster(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    """--after on the cluster: the task waits blocked in this root's queue, and the keeper
    hands it to the cluster once the task it runs after has completed."""
    settings = on_cluster.settings
    cluster_config(ws, settings, HOLD, max_restarts=0)
    first, then = ws.task("p", "first"), ws.task("p", "then")
    done = ws.cli("run", "-p", "p", "-t", "first", "-d", "--config", str(ws.config), "go")
    assert done.returncode == 0 and "started on ray" in done.stderr, done.stderr
    after = ws.cli("run", "-p", "p", "-t", "then", "--after", "p/first", "-d", "--config",
                   str(ws.config), "go")  # fmt: skip
    assert after.returncode == 0, after.stderr
    assert "task p/then is blocked: it waits for p/first" in after.stderr
    assert listed(ws)["p/then"]["status"] == "blocked" and then.run_ids() == []
    go(then)  # its agent, once it runs, goes through at once
    released = time.time()
    go(first)
    wait_for(lambda: listed(ws)["p/first"]["status"] == "completed", 60, "the first task")
    row = wait_for(lambda: (r := listed(ws)["p/then"])["status"] == "completed" and r, 90,
                   "the task after it to run on the cluster and complete")  # fmt: skip
    assert row["latest_run"]["host"] in HOSTS
    # Its wait began in this root's queue, before the keeper handed it to the cluster.
    began = datetime.fromisoformat(row["latest_run"]["start_time"]).timestamp()
    assert began - row["latest_run"]["queued_seconds"] < released, row["latest_run"]
    # The keeper's claim on the start went as the hand-over's process was made (no loop here
    # takes it over): nothing is left for a later keeper to put back.
    assert not list((ws.root / ".fleet" / "starting").iterdir())
    wait_for(lambda: name_free(settings, then.label), 120, "its loop to end")


def _api_run(server: Server, run_id: str) -> dict[str, Any] | None:
    import httpx

    body = httpx.get(f"{server.url}/api/projects/p/tasks/cli/runs/{run_id}").json()
    info = body.get("info", body)
    return info if info.get("status") == "completed" else None


def test_a_host_agent_killed_loses_its_run_and_its_loop_goes_on_on_that_host(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    """The supervisors die with their host agent's worker (no agent is left running); Ray starts
    the agent again on its host, which takes the task's group up: the interrupted run is marked
    lost, and the loop goes on there with its next attempt."""
    cluster_config(ws, on_cluster.settings, ["--setsid-grandchild", "--wait-pids", "2",
                                             "--sleep", "120"])  # fmt: skip
    task = ws.task("p", "gone")
    started = start(ws, on_cluster.settings, task)
    assert started.holder is not None
    old = wait_for(lambda: len(ws.agent_pids()) >= 2 and ws.agent_pids(), 120, "the agents")
    first = latest(task)
    group = ray.util.placement_group_table(ray.util.get_placement_group(task.label))
    node = group["bundles_to_node_id"][0]
    agent = ray.get_actor(f"host:{node}", namespace=on_cluster.settings.namespace)
    ray.kill(agent, no_restart=False)  # what a crashed host agent looks like
    try:
        wait_for(lambda: not alive(started.pid), 120, "the supervisor to die with its agent")
        wait_for(lambda: not [p for p in old if alive(p)], 120, "the agent's tree to go")
        again = wait_for(
            lambda: (i := latest(task)) is not None and i.run_id != first.run_id
            and i.status is RunStatus.RUNNING and i, 120, "the loop to go on",
        )  # fmt: skip
        assert again.host == started.holder.host and again.attempt == 2
        assert read_run_info(task.run_folder(first.run_id)).status is RunStatus.LOST
        assert listing.view(task).status is tasks.TaskStatus.RUNNING
    finally:
        control.stop(task, 20, on_cluster.settings)
    assert name_free(on_cluster.settings, task.label)
    wait_for(lambda: not ws.leftovers(), 120, "nothing left")


def test_without_a_shared_root_serve_streams_the_live_run_and_reads_go_through_the_actor(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    settings = replace(on_cluster.settings, shared_root=False)
    go = ws.path / "go"
    cluster_config(ws, settings, ["--lines", "4", "--line-text", "apart", "--wait-for", str(go)])
    task = ws.task("p", "apart")
    with serving(ws) as url, stopped_at_the_end(task, settings, go):
        # serve holds the cluster's home: hosts mirror task folders to it
        started = start(ws, settings, task)
        assert started.holder is not None
        remote = TaskPaths(on_cluster.base / str(started.holder.host), "p", "apart")
        run_id = wait_for(lambda: remote.run_ids(), 120, "the run on its host")[0]
        # The live run is mirrored into serve's root: the page lists and streams it.
        mirrored = wait_for(lambda: task.run_ids() == [run_id] and latest(task), 120,
                            "the run mirrored while it runs")  # fmt: skip
        assert mirrored.status is RunStatus.RUNNING and mirrored.host in HOSTS
        view = wait_for(lambda: (v := listing.view(task)).supervisor and v, 120, "its holder")
        assert view.status is tasks.TaskStatus.RUNNING and view.supervisor.host == mirrored.host
        executor = control.ray_executor(settings)
        go.touch()
        stdout = f"runs/{run_id}/agent-stdout.txt"
        wait_for(lambda: b"apart 4" in executor.read(task, stdout, 0, 1 << 20), 120, "4 lines")
        whole = executor.read(task, stdout, 0, 1 << 20)
        assert executor.read(task, stdout, 7, 1 << 20) == whole[7:]  # by byte offset
        path = f"/api/projects/p/tasks/apart/runs/{run_id}/stream/stdout"
        first = next(m for m in sse.stream(url + path, timeout=60) if m.event == "data")
        assert first.id is not None
        rest = ""  # resumed from the offset it had: the bytes after it, once
        for message in sse.stream(url + path, {"Last-Event-ID": first.id}, timeout=60):
            if message.event == "data":
                rest += str(message.json())
            elif message.event == "end":
                break
        assert (str(first.json()) + rest).encode() == whole
        wait_for(lambda: name_free(settings, task.label), 120, "the loop to end")
        # The host sends the ended folder here as it finishes: its files arrive one by one.
        wait_for(lambda: task.done.exists() and latest(task).status is RunStatus.COMPLETED, 120,
                 "the ended run's folder sent back")  # fmt: skip
        assert (task.run_folder(run_id) / "agent-stdout.txt").read_bytes() == whole


def test_without_a_shared_root_run_follows_the_loop_on_its_host(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    """The follower reads the loop's lines and its end through the host agent."""
    settings = replace(on_cluster.settings, shared_root=False)
    cluster_config(ws, settings, ["--fail-first", "1", "--lines", "2"], max_restarts=1)
    done = ws.cli("run", "-p", "p", "-t", "fg-apart", "--config", str(ws.config), "go",
                  timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert re.search(r"attempt 1: run \S+ failed", done.stderr), done.stderr
    assert done.stderr.splitlines()[-1].startswith("run-agent: task p/fg-apart completed by run")
    assert not ws.task("p", "fg-apart").run_ids()  # nothing of it here: all on its host


@contextlib.contextmanager
def stopped_at_the_end(task: TaskPaths, settings: ExecutorSettings, go: Path) -> Iterator[None]:
    """Whatever the test asserted, its loop ends with it (a failure leaves nothing running)."""
    try:
        yield
    finally:
        go.touch()
        with contextlib.suppress(Exception):
            control.stop(task, 20, settings)


def test_schedules_fire_once_with_two_schedulers_up(
    ws: Workspace, on_cluster: RayCluster, tmp_path: Path
) -> None:
    from runagent.executors import ray as rayexecutor

    every = ScheduleConfig("every", "* * * * *", "UTC", "p", "tick-{datetime}", prompt="go")
    fired: list[str] = []

    def launch(firing: schedule.Firing) -> int:
        fired.append(firing.label)
        return 1

    def scheduler(n: int) -> schedule.Scheduler:
        # Each its own connection's view of the cluster-wide name, as two processes have.
        side = rayexecutor.RayExecutor(on_cluster.settings)
        return schedule.Scheduler(
            {"every": every}, tmp_path / f"root{n}", launch, log=lambda line: None,
            leader=lambda: side.hold_name("sched"),
        )  # fmt: skip

    schedulers = [scheduler(0), scheduler(1)]
    now = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    for s in schedulers:
        s.start(now)
    for minute in range(1, 4):
        for s in schedulers:
            s.tick(now + timedelta(minutes=minute))
    assert len(fired) == 3, fired  # one per firing, not one per scheduler


def test_the_scheduler_name_passes_on_when_its_holder_exits(on_cluster: RayCluster) -> None:
    from runagent.executors import ray as rayexecutor

    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, on_cluster.settings.address], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        waiting = rayexecutor.RayExecutor(on_cluster.settings)
        assert not waiting.hold_name(control.SCHEDULER_NAME)  # another scheduler leads
        holder.kill()
        holder.wait(10)
        wait_for(lambda: waiting.hold_name(control.SCHEDULER_NAME), 120, "the name to pass on")
    finally:
        holder.kill()
        holder.wait(10)


HOLDER = """
import sys, time
from runagent.executors import control
from runagent.config.settings import ExecutorSettings, ExecutorType
from runagent import listing
settings = ExecutorSettings(type=ExecutorType.RAY, address=sys.argv[1], namespace="test")
assert control.hold_scheduler(settings) and control.hold_scheduler(settings)
print("held", flush=True)
time.sleep(600)
"""


def test_a_host_that_dies_mid_run_moves_the_loop(ws: Workspace, on_cluster: RayCluster) -> None:
    args = ["--setsid-grandchild", "--wait-pids", "2", "--sleep", "120"]
    cluster_config(ws, on_cluster.settings, args)
    task = ws.task("p", "moved")
    first = start(ws, on_cluster.settings, task)
    assert first.holder is not None and first.holder.host in HOSTS
    dead = first.holder.host
    old = wait_for(lambda: len(ws.agent_pids()) >= 2 and ws.agent_pids(), 120, "the agents")
    first_run = latest(task).run_id
    on_cluster.cluster.remove_node(on_cluster.nodes.pop(str(dead)), allow_graceful=False)
    try:
        wait_for(lambda: not [p for p in old if alive(p)], 120, "the dead host's agents to go")
        moved = wait_for(
            lambda: (i := latest(task)) is not None and i.run_id != first_run
            and i.status is RunStatus.RUNNING and i, 120, "the loop on the other host",
        )  # fmt: skip
        assert moved.host != dead and moved.host in HOSTS
        assert read_run_info(task.run_folder(first_run)).status is RunStatus.LOST
        assert moved.previous_run_id == first_run and moved.attempt == 2
        assert control.stop(task, 20, on_cluster.settings) is not None
        assert not ws.leftovers()
    finally:
        with contextlib.suppress(Exception):  # leave nothing running for the next test
            control.stop(task, 20, on_cluster.settings)
        on_cluster.add_host(str(dead))


def test_without_a_shared_root_a_loop_moved_by_a_dead_host_numbers_on(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    settings = replace(on_cluster.settings, shared_root=False)
    cluster_config(ws, settings, ["--sleep", "120"])
    task = ws.task("p", "moved-apart")
    with serving(ws):
        first = start(ws, settings, task)
        assert first.holder is not None and first.holder.host in HOSTS
        dead = first.holder.host
        # The server's copy (the mirror) shows the first run before the host dies.
        running = wait_for(
            lambda: (i := latest(task)) is not None and i.status is RunStatus.RUNNING and i,
            120, "the first run in the server's copy",
        )  # fmt: skip
        on_cluster.cluster.remove_node(on_cluster.nodes.pop(str(dead)), allow_graceful=False)
        try:
            moved = wait_for(
                lambda: (i := latest(task)) is not None and i.run_id != running.run_id
                and i.status is RunStatus.RUNNING and i, 90, "the loop on the other host",
            )  # fmt: skip
            # The new host started from the server's record of the task, not from nothing.
            assert moved.host != dead and moved.host in HOSTS
            assert moved.attempt == 2 and moved.previous_run_id == running.run_id
            lost = wait_for(
                lambda: (i := read_run_info(task.run_folder(running.run_id))) is not None
                and i.status is RunStatus.LOST and i, 120, "the first run marked lost",
            )  # fmt: skip
            assert lost.status is RunStatus.LOST
            assert control.stop(task, 20, settings) is not None
        finally:
            with contextlib.suppress(Exception):
                control.stop(task, 20, settings)
            on_cluster.add_host(str(dead))


def test_a_race_on_the_cluster_is_won_by_the_racer_whose_check_passes(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    """Racers on the Ray cluster (the hosts share the runs root): each works in a worktree of
    its own wherever Ray places it; the one that completes wins, the other is stopped where it
    runs (lost_race, its worktree gone), and nothing is left."""
    from runagent.store import race
    from runagent.store.runinfo import Reason
    from tests.gitrepo import GIT_ENV, make_repo

    commit = ["--commit", "work of {attempt}"]
    agents = {"slow": ["--wait-in-task", "never"], "quick": [*commit, "--fail-first", "1"]}
    cluster_config(ws, on_cluster.settings, agents["slow"], max_restarts=2)
    data = yaml.safe_load(ws.config.read_text())
    for name, args in agents.items():
        data["agents"][name] = {"type": "command", "command": ws.agent_argv(args), "env": GIT_ENV}
    data["defaults"].update({"agent": "slow", "check": "true"})
    ws.config.write_text(yaml.safe_dump(data))
    repo = make_repo(ws.path / "repo")
    done = subprocess.run(
        ws.cli_argv("--config", str(ws.config), "--root", str(ws.root), "-p", "p", "-t", "t",
                    "--agents", "slow,quick", "fix it"),
        cwd=repo, env={**os.environ, **GIT_ENV}, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    record = race.read(ws.task())
    assert record is not None and record.winner == "t.quick"
    quick = ws.runs("p", "t.quick")
    assert [r.status for r in quick] == [RunStatus.FAILED, RunStatus.COMPLETED]
    assert {r.host for r in quick} <= set(HOSTS)  # run where Ray placed them
    (slow,) = ws.runs("p", "t.slow")
    assert slow.reason is Reason.LOST_RACE and slow.host in HOSTS
    assert not ws.task("p", "t.slow").worktree.exists()
    wait_for(lambda: not ws.leftovers(), 120, "nothing left")


def test_a_limit_found_on_a_host_pauses_the_agent_for_every_start_of_the_root(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    """A run on a host of the cluster limited by its provider pauses its agent under the shared
    runs root: a start of the agent from here waits in this root's queue, saying so, and the
    keeper hands it to the cluster once `fleet unpause` lifts the pause; the limited loop takes
    its next attempt on its host then, the limit having spent no restart."""
    settings = on_cluster.settings
    cluster_config(ws, settings, HOLD, max_restarts=0)
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["lim"] = {"type": "claude", "command": ws.agent_argv(
        ["--ignore-unknown", "--rate-limited", "600", "--counter", str(ws.path / "lim-runs"),
         *HOLD])}  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))
    first, second = ws.task("p", "first"), ws.task("p", "second")
    started = ws.cli("run", "-p", "p", "-t", "first", "--agent", "lim", "-d", "--config",
                     str(ws.config), "go")  # fmt: skip
    assert started.returncode == 0 and "started on ray" in started.stderr, started.stderr
    shown = wait_for(
        lambda: "lim paused until" in (s := ws.cli("fleet", "--config", str(ws.config)).stdout)
        and s, 120, "lim paused by the host's run",
    )  # fmt: skip
    words = next(line for line in shown.splitlines() if line.startswith("lim paused until"))
    queued = ws.cli("run", "-p", "p", "-t", "second", "--agent", "lim", "-d", "--config",
                    str(ws.config), "go")  # fmt: skip
    assert queued.returncode == 0, queued.stderr
    assert "queued: " in queued.stderr and "lim paused until" in queued.stderr, queued.stderr
    assert second.run_ids() == [] and listed(ws)["p/second"]["status"] == "queued"
    lifted = ws.cli("fleet", "unpause", "lim", "--config", str(ws.config))
    assert lifted.returncode == 0 and lifted.stdout.startswith("lifted: lim paused until"), words
    go(first)
    go(second)
    for task in (first, second):
        row = wait_for(lambda t=task: (r := listed(ws)[t.label])["status"] == "completed" and r,
                       90, f"{task.label} to complete on the cluster")  # fmt: skip
        assert row["latest_run"]["host"] in HOSTS
    limited, then = [read_run_info(first.run_folder(r)) for r in first.run_ids()]
    assert limited is not None and limited.reason == "rate_limit"
    assert then is not None and then.attempt == 2 and then.host == limited.host
    for task in (first, second):
        wait_for(lambda t=task: name_free(settings, t.label), 120, "its loop to end")


def free_slots() -> float:
    """The cluster's agent_slot free now, all hosts together."""
    from runagent.executors.ray import store

    return sum(room.get("agent_slot", 0) for room in store.free_per_host().values())


def test_a_limited_loop_on_the_cluster_gives_its_agent_slot_back_and_takes_one_again(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    """A loop whose run was limited gives its host's agent_slot back to the cluster while its
    agent is paused (so all four slots run tasks of another agent meanwhile), and once the
    pause lifts takes one again on its own host, waiting in Ray's queue while that host has
    none free: its next attempt runs there, holding it."""
    settings = on_cluster.settings
    cluster_config(ws, settings, HOLD, max_restarts=0)
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["lim"] = {"type": "claude", "command": ws.agent_argv(
        ["--ignore-unknown", "--rate-limited", "600", "--counter", str(ws.path / "lim-runs"),
         *HOLD])}  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))
    limited = ws.task("p", "limited")
    others = [ws.task("p", f"other{n}") for n in range(4)]
    try:
        wait_for(lambda: free_slots() == 4, 120, "the cluster's four agent_slots free")
        started = ws.cli("run", "-p", "p", "-t", "limited", "--agent", "lim", "-d", "--config",
                         str(ws.config), "go")  # fmt: skip
        assert started.returncode == 0 and "started on ray" in started.stderr, started.stderr
        wait_for(lambda: "lim paused until" in ws.cli("fleet", "--config", str(ws.config)).stdout,
                 60, "lim paused by the host's run")  # fmt: skip
        first = wait_for(lambda: latest(limited), 120, "the limited run's record")
        assert first.reason == "rate_limit" and first.host in HOSTS
        wait_for(lambda: free_slots() == 4, 120, "the limited loop's agent_slot given back")
        assert listed(ws)[limited.label]["status"] == "queued"
        for task in others:
            start(ws, settings, task)
        wait_for(lambda: all(listing.view(t).status is tasks.TaskStatus.RUNNING for t in others),
                 60, "four tasks of another agent on the four agent_slots")  # fmt: skip
        assert free_slots() == 0 and limited.run_ids() == [first.run_id]
        lifted = ws.cli("fleet", "unpause", "lim", "--config", str(ws.config))
        assert lifted.returncode == 0 and lifted.stdout.startswith("lifted: lim paused"), lifted
        # Its host full, it waits in Ray's queue for a slot there; one freed on its host is its.
        mates = [t for t in others if latest(t).host == first.host]
        assert len(mates) == 2, [latest(t).host for t in others]
        go(mates[0])
        then = wait_for(
            lambda: (
                len(ids := limited.run_ids()) == 2 and read_run_info(limited.run_folder(ids[1]))
            ),
            60,
            "its next attempt once a slot frees on its host",
        )
        assert then.attempt == 2 and then.host == first.host
        wait_for(lambda: name_free(settings, mates[0].label), 120, "the mate's loop to end")
        assert free_slots() == 0  # the limited loop holds the freed one again
        go(limited)
        wait_for(lambda: limited.done.exists(), 120, "the limited task to complete")
    finally:
        for task in (limited, *others):
            go(task)
    for task in (limited, *others):
        wait_for(lambda t=task: name_free(settings, t.label), 120, "its loop to end")
    wait_for(lambda: free_slots() == 4, 120, "every agent_slot free again")
    wait_for(lambda: not groups_of(limited), 120, "both of the limited loop's groups gone")


def groups_of(task: TaskPaths) -> list[str]:
    """The live placement groups of a task: its own, and the one that takes its slot again."""
    from runagent.executors.ray import store
    from runagent.executors.ray.slot import SLOT

    return [name for name in (task.label, task.label + SLOT) if store.group(name, "test")]


def swept(label: str) -> bool:
    """Whether a host agent said it removed the group `label` as one no start owned (the host
    agents' stderr, in the Ray workers' logs of the module's cluster)."""
    said = f"removing placement group {label!r}"
    logs = Path(os.environ["RAY_TMPDIR"]).glob("**/logs/worker-*.err")
    return any(said in log.read_text(errors="replace") for log in logs)


def test_a_group_placed_on_a_host_that_no_start_owns_is_removed_by_its_host_agent(
    on_cluster: RayCluster,
) -> None:
    """A placement group left on a host with no start's spec and no loop holding it (a process
    killed between removing a loop's group and its spec, a stop meeting a hand-over) would
    hold its share of the host for good: the host's agent removes it, and says so."""
    from runagent.executors.ray import store
    from runagent.executors.ray.slot import SLOT

    wait_for(lambda: free_slots() == 4, 120, "the cluster's four agent_slots free")
    on_cluster.executor().ensure_agents()
    left = [store.make_group("p/left", {"agent_slot": 1.0}),
            store.make_group("p/paused" + SLOT, {"agent_slot": 1.0})]  # fmt: skip
    try:
        wait_for(lambda: free_slots() == 2, 60, "both groups placed, each holding a slot")
        wait_for(lambda: free_slots() == 4, 120, "both removed by their hosts' agents")
        assert store.group("p/left", "test") is None
        assert store.group("p/paused" + SLOT, "test") is None
        assert swept("p/left") and swept("p/paused" + SLOT)
    finally:
        for group in left:
            with contextlib.suppress(Exception):
                store.remove_placement_group(group)


def test_a_loop_whose_group_a_hand_over_made_again_frees_that_group_as_it_ends(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    """A freed slot's hand-over makes a waiting group again under its name; when Ray placed the
    old one first and a host agent started the loop from it, the loop's spec names the old
    group's id while the new one holds its slot. The loop's end removes the group that bears
    its name, whichever id it has: the slot is free at once, not when the host agent's sweep
    of unowned groups comes to it."""
    from runagent.executors.ray import store
    from runagent.executors.ray.slot import _remade

    settings = on_cluster.settings
    cluster_config(ws, settings, HOLD, max_restarts=0)
    task = ws.task("p", "handed")
    try:
        wait_for(lambda: free_slots() == 4, 120, "the cluster's four agent_slots free")
        start(ws, settings, task)
        wait_for(lambda: listing.view(task).status is tasks.TaskStatus.RUNNING, 60, "running")
        first = store.group(task.label, "test")
        spec = store.spec("test", task.label)
        assert first is not None and spec is not None
        assert spec.group == first["placement_group_id"]
        node, bundle = store.group_node(first), store.group_bundle(first)
        store.remove_group(task.label, "test", first["placement_group_id"])
        _remade(lambda: store.make_group(task.label, bundle, near=node))
        again = wait_for(
            lambda: (g := store.group(task.label, "test")) and g["state"] == "CREATED" and g,
            60, "the group made again, placed",
        )  # fmt: skip
        assert again["placement_group_id"] != spec.group and store.group_node(again) == node
        wait_for(lambda: free_slots() == 3, 60, "the loop's slot held by the new group alone")
        go(task)
        wait_for(lambda: name_free(settings, task.label), 120, "its loop to end")
        wait_for(lambda: free_slots() == 4, 120, "its slot free")
        assert store.group(task.label, "test") is None
        assert not swept(task.label)  # freed by the loop's end, not by the sweep
    finally:
        go(task)
        wait_for(lambda: name_free(settings, task.label), 120, "its loop to end")


def test_a_loop_waiting_on_the_cluster_for_its_slot_again_is_stopped_cleanly(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    """Its agent's pause lifted while its host has no slot free, a loop waits in Ray's queue
    for one there (holding none); `stop` ends it then, and leaves neither of its groups."""
    settings = on_cluster.settings
    cluster_config(ws, settings, HOLD, max_restarts=0)
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["lim"] = {"type": "claude", "command": ws.agent_argv(
        ["--ignore-unknown", "--rate-limited", "600", "--counter", str(ws.path / "lim-runs"),
         *HOLD])}  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))
    limited = ws.task("p", "waits")
    others = [ws.task("p", f"full{n}") for n in range(4)]
    try:
        wait_for(lambda: free_slots() == 4, 120, "the cluster's four agent_slots free")
        started = ws.cli("run", "-p", "p", "-t", "waits", "--agent", "lim", "-d", "--config",
                         str(ws.config), "go")  # fmt: skip
        assert started.returncode == 0, started.stderr
        wait_for(lambda: free_slots() == 4 and latest(limited) is not None, 120,
                 "the limited loop's slot given back")  # fmt: skip
        for task in others:
            start(ws, settings, task)
        wait_for(lambda: free_slots() == 0, 120, "the four slots taken by another agent")
        assert ws.cli("fleet", "unpause", "lim", "--config", str(ws.config)).returncode == 0
        from runagent.executors.ray import store
        from runagent.executors.ray.slot import SLOT

        wanted = wait_for(lambda: store.group(limited.label + SLOT, "test"), 120,
                          "its group asking for a slot on its host")  # fmt: skip
        assert wanted["state"] == "PENDING" and len(limited.run_ids()) == 1
        stopped = ws.cli("stop", "-p", "p", "-t", "waits", "--config", str(ws.config))
        assert stopped.returncode == 0, stopped.stderr
        wait_for(lambda: name_free(settings, limited.label), 120, "its loop to end")
        wait_for(lambda: not groups_of(limited), 120, "both of its groups gone")
        assert len(limited.run_ids()) == 1 and free_slots() == 0
    finally:
        for task in others:
            go(task)
    for task in others:
        wait_for(lambda t=task: name_free(settings, t.label), 120, "its loop to end")
    wait_for(lambda: free_slots() == 4, 120, "every agent_slot free again")


def test_a_loop_started_again_while_its_agent_is_paused_takes_its_slot_again_first(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    """A paused loop whose host agent dies (its supervisor with it) is started again by the
    agent Ray brings back, and holds no slot while the pause lasts; once it lifts, the loop
    takes its host's slot again before its next attempt runs, as the loop that gave it back
    would have."""
    settings = on_cluster.settings
    cluster_config(ws, settings, HOLD, max_restarts=0)
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["lim"] = {"type": "claude", "command": ws.agent_argv(
        ["--ignore-unknown", "--rate-limited", "600", "--counter", str(ws.path / "lim-runs"),
         *HOLD])}  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))
    task = ws.task("p", "reborn")
    try:
        wait_for(lambda: free_slots() == 4, 120, "the cluster's four agent_slots free")
        started = ws.cli("run", "-p", "p", "-t", "reborn", "--agent", "lim", "-d", "--config",
                         str(ws.config), "go")  # fmt: skip
        assert started.returncode == 0, started.stderr
        wait_for(lambda: free_slots() == 4 and latest(task) is not None, 120,
                 "the limited loop's slot given back")  # fmt: skip
        from runagent.store.lock import live_holder

        before = wait_for(lambda: live_holder(task.lock), 120, "its supervisor")
        group = ray.util.placement_group_table(ray.util.get_placement_group(task.label))
        node = group["bundles_to_node_id"][0]
        agent = ray.get_actor(f"host:{node}", namespace=settings.namespace)
        ray.kill(agent, no_restart=False)  # what a crashed host agent looks like
        wait_for(lambda: not alive(before.pid), 120, "the supervisor to die with its agent")
        from runagent.fleet.queue import Fleet

        # Started again, it waits for the pause in the queue (a record of its new supervisor).
        wait_for(lambda: (r := Fleet(task.root).record_of(task)) is not None
                 and r.waiter not in (None, before.pid), 120, "its loop started again")  # fmt: skip
        assert free_slots() == 4 and len(task.run_ids()) == 1  # still paused: no slot held
        assert ws.cli("fleet", "unpause", "lim", "--config", str(ws.config)).returncode == 0
        then = wait_for(lambda: len(ids := task.run_ids()) == 2 and read_run_info(
            task.run_folder(ids[1])), 120, "its next attempt")  # fmt: skip
        assert then.attempt == 2 and free_slots() == 3  # it runs holding its host's slot
    finally:
        go(task)
        ws.cli("fleet", "unpause", "lim", "--config", str(ws.config))
    wait_for(lambda: name_free(settings, task.label), 120, "its loop to end")
    wait_for(lambda: not groups_of(task), 120, "both of its groups gone")
    wait_for(lambda: free_slots() == 4, 120, "every agent_slot free again")


def test_a_held_queue_holds_starts_to_the_cluster_and_stop_all_stops_its_loops(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    """`fleet hold` holds a start to the cluster in this root's queue, saying so; `fleet
    release` lets the keeper hand it over; `stop --all` stops the loops running on the hosts."""
    settings = on_cluster.settings
    cluster_config(ws, settings, HOLD, max_restarts=0)
    config = ("--config", str(ws.config))
    first, second = ws.task("p", "first"), ws.task("p", "second")
    held = ws.cli("fleet", "hold", *config)
    assert held.returncode == 0 and held.stdout.startswith("the queue is held since "), held
    queued = ws.cli("run", "-p", "p", "-t", "first", "-d", *config, "go")
    assert queued.returncode == 0, queued.stderr
    assert "queued: 0 ahead (the queue is held since " in queued.stderr, queued.stderr
    assert first.run_ids() == [] and listed(ws)["p/first"]["status"] == "queued"
    released = ws.cli("fleet", "release", *config)
    assert released.returncode == 0 and released.stdout.startswith("released: "), released
    started = ws.cli("run", "-p", "p", "-t", "second", "-d", *config, "go")
    assert started.returncode == 0 and "started on ray" in started.stderr, started.stderr
    for task in (first, second):
        wait_for(lambda t=task: listed(ws)[t.label]["status"] == "running", 90,
                 f"{task.label} running on the cluster")  # fmt: skip
    stopped = ws.cli("stop", "--all", *config)
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped 2 running: p/first, p/second" in stopped.stdout, stopped.stdout
    for task in (first, second):
        assert listed(ws)[task.label]["status"] == "stopped"
        wait_for(lambda t=task: name_free(settings, t.label), 120, "its loop to end")


def test_a_loop_ray_places_while_the_queue_is_held_waits_on_its_host(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    """A task waiting in Ray's own queue when the queue is held is placed on a host once a slot
    frees, and its loop waits there, in the shared root's queue, starting no run until `fleet
    release`; `stop --all` then stops every loop on the hosts."""
    settings = on_cluster.settings
    cluster_config(ws, settings, HOLD, max_restarts=0)
    config = ("--config", str(ws.config))
    holders = [ws.task("p", f"hold{n}") for n in range(4)]
    late = ws.task("p", "late")
    try:
        for task in holders:
            start(ws, settings, task)
        wait_for(lambda: all(listing.view(t).status is tasks.TaskStatus.RUNNING for t in holders),
                 60, "four loops holding the four agent_slots")  # fmt: skip
        queued = ws.cli("run", "-p", "p", "-t", "late", "-d", *config, "go")
        assert "queued: 0 ahead (a Ray host with agent_slot 1 free)" in queued.stderr, queued
        assert ws.cli("fleet", "hold", *config).returncode == 0
        go(holders[0])  # a slot frees: Ray places late on a host, where its loop waits
        row = wait_for(
            lambda: (
                (r := listed(ws)["p/late"])["queue"] is not None
                and r["queue"]["waits_for"].startswith("the queue is held")
                and r
            ),
            60,
            "late waiting on its host",
        )
        assert row["status"] == "queued" and late.run_ids() == [], row
        assert ws.cli("fleet", "release", *config).returncode == 0
        wait_for(lambda: listed(ws)["p/late"]["status"] == "running", 60, "late running")
        stopped = ws.cli("stop", "--all", *config)
        assert stopped.returncode == 0, stopped.stderr
        assert "stopped 4 running: p/hold1, p/hold2, p/hold3, p/late" in stopped.stdout, stopped
        assert len(late.run_ids()) == 1
    finally:
        ws.cli("fleet", "release", *config)
        for task in [*holders, late]:
            go(task)
        for task in [*holders, late]:
            wait_for(lambda t=task: name_free(settings, t.label), 120, f"{task.label} to end")


def test_without_a_shared_root_a_limit_found_on_one_host_pauses_the_agent_on_every_host(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    """Each host with a runs root of its own: a run limited on one host pauses its agent for the
    whole cluster (its pause kept in the cluster's store). `fleet` here shows it, a start of the
    agent from here waits in this root's queue instead of going to a host that would hit the same
    limit, and `fleet unpause` here lifts it on every host: the limited loop takes its next
    attempt on its own host, the queued task starts, and no restart was spent."""
    settings = replace(on_cluster.settings, shared_root=False)
    go_file = ws.path / "go"
    hold = ["--lines", "1", "--wait-for", str(go_file)]
    cluster_config(ws, settings, hold, max_restarts=0)
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["lim"] = {"type": "claude", "command": ws.agent_argv(
        ["--ignore-unknown", "--rate-limited", "600", "--counter", str(ws.path / "lim-runs"),
         *hold])}  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))
    first, second = ws.task("p", "first"), ws.task("p", "second")
    on_host = {name: TaskPaths(on_cluster.base / name, "p", "first") for name in HOSTS}
    try:
        started = ws.cli("run", "-p", "p", "-t", "first", "--agent", "lim", "-d", "--config",
                         str(ws.config), "go")  # fmt: skip
        assert started.returncode == 0 and "started on ray" in started.stderr, started.stderr
        # The pause is written on the limited run's host, under that host's own root.
        # The limited run's host: the one that holds its run (the pause it wrote there reaches
        # the other hosts' roots within a second, so it does not tell which host found it).
        limited_on = wait_for(lambda: next((name for name, t in on_host.items() if t.run_ids()
            and (t.root / ".fleet" / "paused" / "lim.json").exists()), None), 120,
            "lim paused on the limited run's host")  # fmt: skip
        shown = wait_for(lambda: "lim paused until" in (s := ws.cli("fleet", "--config",
                         str(ws.config)).stdout) and s, 120, "lim's pause shown here")  # fmt: skip
        assert "usage limit" in shown or "limit" in shown, shown
        queued = ws.cli("run", "-p", "p", "-t", "second", "--agent", "lim", "-d", "--config",
                        str(ws.config), "go")  # fmt: skip
        assert queued.returncode == 0, queued.stderr
        assert "queued: " in queued.stderr and "lim paused until" in queued.stderr, queued.stderr
        assert listed(ws)["p/second"]["status"] == "queued"
        status = ws.cli("status", "-p", "p", "-t", "second", "--config", str(ws.config))
        assert "lim paused until" in status.stdout, status.stdout
        assert not any((on_cluster.base / name / "p" / "second").exists() for name in HOSTS)
        lifted = ws.cli("fleet", "unpause", "lim", "--config", str(ws.config))
        assert lifted.returncode == 0 and lifted.stdout.startswith("lifted: lim paused"), lifted
        # Lifted on every host: the limited loop goes on on its own, the queued task starts.
        wait_for(lambda: not any((on_cluster.base / name / ".fleet" / "paused" / "lim.json")
                 .exists() for name in HOSTS), 120, "the pause lifted on every host")  # fmt: skip
        go_file.touch()
        for task in (first, second):  # no server holds this root: their folders stay there
            wait_for(lambda t=task: any(TaskPaths(on_cluster.base / name, "p", t.task_id).done
                     .exists() for name in HOSTS), 90, f"{task.label} to complete")  # fmt: skip
        there = on_host[limited_on]
        limited, then = [read_run_info(there.run_folder(r)) for r in there.run_ids()]
        assert limited is not None and limited.reason == "rate_limit"
        assert then is not None and then.attempt == 2 and then.host == limited_on
        assert "lim paused" not in ws.cli("fleet", "--config", str(ws.config)).stdout
    finally:
        go_file.touch()
        ws.cli("fleet", "unpause", "lim", "--config", str(ws.config))
        for task in (first, second):
            with contextlib.suppress(Exception):
                control.stop(task, 20, settings)
    for task in (first, second):
        wait_for(lambda t=task: name_free(settings, t.label), 120, "its loop to end")


def test_roots_of_their_own_agree_on_the_paused_agents_through_the_clusters_store(
    ws: Workspace, on_cluster: RayCluster
) -> None:
    """pauses.sync, as each host agent and the door run it: a pause found under one root holds
    under every other; the later of two holds; an unpause lifts it under every root and none
    brings it back; a limit found after the unpause pauses the agent again everywhere."""
    from runagent.executors.ray import pauses
    from runagent.fleet import gate
    from runagent.fleet.queue import Fleet

    namespace = "pauses-agree"  # the cluster's store, apart from the other tests'
    one, two = ws.path / "one", ws.path / "two"

    def paused(root: Path) -> float | None:
        pauses.sync(root, namespace)
        found = Fleet(root).pauses(clean=False).get("lim")
        return found.until if found is not None else None

    first = gate.pause(TaskPaths(one, "p", "a"), "lim", 600, "usage limit")
    assert paused(one) == first.until and paused(two) == first.until
    later = gate.pause(TaskPaths(two, "p", "b"), "lim", 900, "usage limit")
    assert paused(two) == later.until and paused(one) == later.until
    lifted = pauses.unpause(namespace, "lim")
    assert lifted is not None and lifted.until == later.until
    for _ in range(2):  # neither root brings the lifted pause back to the other
        assert paused(one) is None and paused(two) is None
    time.sleep(0.01)  # found after the unpause, by the clock its time of finding is read on
    again = gate.pause(TaskPaths(one, "p", "c"), "lim", 60, "usage limit")
    assert paused(one) == again.until and paused(two) == again.until
    assert pauses.unpause(namespace, "lim") is not None
    assert paused(one) is None and paused(two) is None
