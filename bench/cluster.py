"""Dispatch on a Ray cluster beside the local executor, through control (the one door).

Two figures, each measured on both executors from one run:

- dispatch latency: `control.start_detached` called -> the agent running (the bash agent stamps
  $EPOCHREALTIME in its task folder as its first act), median and max over --repeat tasks;
- N tasks of a sleeping agent (default 100): time until every agent runs, and memory per task
  per host (the sum of RSS and of USS over the tasks' processes, divided by their number: for
  Ray the host's agent, a Ray worker shared by every task on its host, and each task's
  supervisor, reaper and agent; locally each task's supervisor, reaper and agent).

The first start on a cluster may wait for a host's agent to start (once per host and cluster
lifetime, begun when a process first connects): that is the dispatch max.

The cluster is a real in-process `ray.cluster_utils.Cluster`: a head (no agent_slot) and two
more nodes, hostA, hostB and hostC, each offering agent_slot N/3 rounded up; every node shares
this machine's cores, so Ray's figures include running three raylets here. Nothing asserts on
speed; everything it starts is stopped and its temp folder removed.

    python bench/cluster.py [--tasks 100] [--repeat 5] [--quick]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runagent.config.overrides import LoopOverrides  # noqa: E402
from runagent.config.settings import ExecutorSettings, ExecutorType  # noqa: E402
from runagent.executors import control  # noqa: E402
from runagent.store import taskfolder  # noqa: E402
from runagent.store.runfolder import TaskPaths  # noqa: E402

AGENT = 'printf "%s\\n" "$EPOCHREALTIME" > "$TASK_FOLDER/started"; exec sleep 3600'


def write_config(folder: Path, root: Path, settings: ExecutorSettings) -> Path:
    config = folder / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "agents": {"sleeper": {"type": "command", "command": ["bash", "-c", AGENT]}},
                "defaults": {"agent": "sleeper", "max_restarts": 0, "idle_timeout": 0},
                "storage": {"runs_dir": str(root)},
                "executor": {"type": settings.type.value, "address": settings.address,
                             "namespace": settings.namespace},
            }
        )
    )  # fmt: skip
    return config


def started_at(task: TaskPaths) -> float | None:
    try:
        return float((task.folder / "started").read_text())
    except (OSError, ValueError):
        return None


def wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.02)


def dispatch(settings: ExecutorSettings, config: Path, task: TaskPaths) -> float:
    """Seconds from start_detached to the agent's own first stamp."""
    taskfolder.claim_task_prompt(task, "sleep", "")
    began = time.time()
    control.start_detached(task, "run", LoopOverrides(), config_path=config, cwd=config.parent,
                           executor=settings)  # fmt: skip
    wait(lambda: started_at(task) is not None, 120, f"{task.label} to run")
    stamp = started_at(task)
    assert stamp is not None
    return stamp - began


def processes_of(pids: list[int]) -> list[psutil.Process]:
    found: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            top = psutil.Process(pid)
            for p in [top, *top.children(recursive=True)]:
                found[p.pid] = p
        except psutil.NoSuchProcess:
            continue
    return list(found.values())


def memory(procs: list[psutil.Process]) -> tuple[float, float]:
    """(RSS, USS) summed over `procs`, in MiB."""
    rss = uss = 0
    for p in procs:
        try:
            info = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss, uss = rss + info.rss, uss + info.uss
    return rss / 2**20, uss / 2**20


def many(
    settings: ExecutorSettings, config: Path, root: Path, n: int, hosts: dict[str, int]
) -> dict[str, object]:
    """Start n tasks at once (one after the other, without waiting for each to run); time until
    all run; memory per task per host (by the pid that holds each task)."""
    tasks = [TaskPaths(root, "many", f"t{i:03d}") for i in range(n)]
    began = time.time()
    holders = []
    for task in tasks:
        taskfolder.claim_task_prompt(task, "sleep", "")
        holders.append(
            control.start_detached(task, "run", LoopOverrides(), config_path=config,
                                   cwd=config.parent, executor=settings).holder
        )  # fmt: skip
    wait(lambda: all(started_at(t) is not None for t in tasks), 900, f"all {n} agents")
    all_running = max(s for t in tasks if (s := started_at(t)) is not None) - began
    per_host: dict[str, list[int]] = {}
    for holder in holders:
        assert holder is not None
        per_host.setdefault(str(holder.host), []).append(holder.pid)
    rows = {}
    for name, pids in sorted(per_host.items()):
        # On Ray the host agent is the supervisors' parent: counted once, shared by its tasks.
        tops = pids if name not in hosts else [psutil.Process(p).ppid() for p in pids]
        rss, uss = memory(processes_of(tops))
        rows[name] = (len(pids), rss / len(pids), uss / len(pids))
    for task in tasks:
        control.stop(task, 60, settings)
    return {"all_running": all_running, "hosts": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--quick", action="store_true", help="3 tasks on one host, 1 dispatch round (for the tests)"
    )
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.repeat = 3, 1

    from ray.cluster_utils import Cluster

    from runagent.executors import ray as rayexecutor

    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    os.environ["RAY_TMPDIR"] = str(work / "ray")
    (work / "ray").mkdir()
    slots = math.ceil(args.tasks / 3)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    hosts = {"hostA": slots, "hostB": slots, "hostC": slots}
    if args.quick:  # one host: a node fewer to start is most of the quick mode's time
        hosts = {"hostA": args.tasks}
    try:
        for name, n in hosts.items():
            cluster.add_node(num_cpus=1, resources={"agent_slot": n},
                             env_vars={"RUN_AGENT_HOST": name})  # fmt: skip
        cluster.wait_for_nodes()
        results: dict[str, dict[str, object]] = {}
        for kind in (ExecutorType.LOCAL, ExecutorType.RAY):
            settings = ExecutorSettings(type=kind, address=cluster.address, namespace="bench")
            folder = work / kind.value
            root = folder / "runs"
            root.mkdir(parents=True)
            config = write_config(folder, root, settings)
            latencies = []
            for i in range(args.repeat):
                task = TaskPaths(root, "latency", f"t{i}")
                latencies.append(dispatch(settings, config, task))
                control.stop(task, 60, settings)
            results[kind.value] = {"latency": latencies,
                                   **many(settings, config, root, args.tasks, hosts)}  # fmt: skip
        report(results, args.tasks)
    finally:
        rayexecutor.disconnect()
        cluster.shutdown()
        shutil.rmtree(work, ignore_errors=True)


def report(results: dict[str, dict[str, object]], n: int) -> None:
    print(f"{'':28}{'local':>14}{'ray':>14}{'ratio':>9}")
    lat = {k: v["latency"] for k, v in results.items()}
    for name, f in (("dispatch median (ms)", statistics.median), ("dispatch max (ms)", max)):
        local, ray_ = f(lat["local"]) * 1000, f(lat["ray"]) * 1000  # type: ignore[arg-type]
        print(f"{name:28}{local:14.0f}{ray_:14.0f}{ray_ / local:9.2f}")
    local_all = float(results["local"]["all_running"])  # type: ignore[arg-type]
    ray_all = float(results["ray"]["all_running"])  # type: ignore[arg-type]
    print(f"{f'{n} tasks all running (s)':28}{local_all:14.1f}{ray_all:14.1f}"
          f"{ray_all / local_all:9.2f}")  # fmt: skip
    print("\nmemory per task, by host: tasks, RSS MiB, USS MiB")
    for kind, res in results.items():
        for host, (count, rss, uss) in res["hosts"].items():  # type: ignore[attr-defined]
            print(f"  {kind:6} {host:12} {count:4d} {rss:10.1f} {uss:10.1f}")


if __name__ == "__main__":
    main()
