"""The queue on a Ray cluster beside the local one, through the door (Service.start), from one run.

N tasks (default 24), each an agent that sleeps 3 seconds, are submitted at once against S slots
(default 4): locally `limits: {max_running: S}` (the keeper starts queued tasks), on the cluster
two hosts offering agent_slot S/2 each and no limits (Ray's queue holds their placement
groups). Prints, for each: how long a start takes to return (a queued one included), the most
agents alive at once (the process table sampled every 50 ms), how many completed, and the time
from the end of a run that freed a slot to the start of the next run (from the runs' own
run-info times). Every node shares this machine's cores. Nothing asserts on speed; everything
it starts is stopped and its temp folder removed.

    python bench/cluster_queue.py [--tasks 24] [--slots 4] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import backends  # noqa: E402
from bench.fleet import alive_together  # noqa: E402
from runagent import listing  # noqa: E402
from runagent.config.settings import ExecutorSettings, ExecutorType  # noqa: E402
from runagent.service import Service, StartRequest  # noqa: E402
from runagent.store.runfolder import TaskPaths, read_run_info  # noqa: E402

MARKER = "run-agent-bench-cluster-queue"
AGENT_SECONDS = 3  # long enough that the slots fill while the tasks are being submitted
AGENT = ["bash", "-c", f"sleep {AGENT_SECONDS}; true", MARKER]  # bash stays, named by MARKER


def write_config(folder: Path, root: Path, settings: ExecutorSettings, slots: int) -> Path:
    data: dict[str, object] = {
        "agents": {"sleeper": {"type": "command", "command": AGENT}},
        "defaults": {"agent": "sleeper", "max_restarts": 0, "idle_timeout": 0},
        "storage": {"runs_dir": str(root)},
        "executor": {"type": settings.type.value, "address": settings.address,
                     "namespace": settings.namespace},
    }  # fmt: skip
    if settings.type is ExecutorType.LOCAL:
        data["limits"] = {"max_running": slots}
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(data))
    return config


def agents_alive() -> int:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if MARKER in cmdline and "bash" in os.path.basename(cmdline[0] if cmdline else ""):
            found.append(proc)
    return alive_together(found)


def stamp(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


@dataclass
class Figures:
    returns_ms: list[float]
    queued: int
    peak: int
    completed: int
    hand_overs_ms: list[float]


def measure(settings: ExecutorSettings, folder: Path, n: int, slots: int) -> Figures:
    root = folder / "runs"
    root.mkdir(parents=True)
    config = write_config(folder, root, settings, slots)
    door = Service(root, config_path=config, backend_names=backends.known(),
                   executor=settings, workdir=folder)  # fmt: skip
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], agents_alive())
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    order = [TaskPaths(root, "q", f"t{i:03d}") for i in range(n)]
    returns, queued = [], 0
    for task in order:
        began = time.monotonic()
        started = door.start(StartRequest(task, "sleep"))
        returns.append((time.monotonic() - began) * 1000)
        queued += started.queued is not None
    deadline = time.monotonic() + n * 5 + 120
    while time.monotonic() < deadline:
        if all(listing.view(t).status.value in ("completed", "failed") for t in order):
            break
        time.sleep(0.25)
    stop.set()
    sampler.join()
    runs = []
    for task in order:
        for run_id in task.run_ids():
            info = read_run_info(task.run_folder(run_id))
            if info is not None and info.end_time:
                runs.append((stamp(info.start_time), stamp(info.end_time)))
    starts, ends = sorted(s for s, _ in runs), sorted(e for _, e in runs)
    hand_overs = [(starts[k] - ends[k - slots]) * 1000 for k in range(slots, len(starts))
                  if starts[k] >= ends[k - slots]]  # fmt: skip
    completed = sum(1 for t in order if listing.view(t).status.value == "completed")
    return Figures(returns, queued, peak[0], completed, hand_overs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="4 tasks on 2 slots (for the tests)")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.slots = 4, 2

    from ray.cluster_utils import Cluster

    from runagent.executors import ray as rayexecutor

    work = Path(tempfile.mkdtemp(prefix="bench-cluster-queue-"))
    os.environ["RAY_TMPDIR"] = str(work / "ray")
    (work / "ray").mkdir()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        for name in ("hostA", "hostB"):
            cluster.add_node(num_cpus=1, resources={"agent_slot": args.slots // 2},
                             env_vars={"RUN_AGENT_HOST": name})  # fmt: skip
        cluster.wait_for_nodes()
        results = {}
        for kind in (ExecutorType.LOCAL, ExecutorType.RAY):
            settings = ExecutorSettings(type=kind, address=cluster.address, namespace="bench")
            results[kind.value] = measure(settings, work / kind.value, args.tasks, args.slots)
        report(results, args.tasks, args.slots)
    finally:
        rayexecutor.disconnect()
        cluster.shutdown()
        shutil.rmtree(work, ignore_errors=True)


def report(results: dict[str, Figures], n: int, slots: int) -> None:
    local, ray_ = results["local"], results["ray"]
    rows = [
        ("a start returns, median (ms)", _median(local.returns_ms), _median(ray_.returns_ms)),
        ("starts answered as queued", str(local.queued), str(ray_.queued)),
        ("most agents alive at once", str(local.peak), str(ray_.peak)),
        ("completed", str(local.completed), str(ray_.completed)),
        ("freed slot to next start, median (ms)", _median(local.hand_overs_ms),
         _median(ray_.hand_overs_ms)),
        ("freed slot to next start, p90 (ms)", _p90(local.hand_overs_ms),
         _p90(ray_.hand_overs_ms)),
    ]  # fmt: skip
    print(f"{n} tasks of a {AGENT_SECONDS} s agent, {slots} slots, on {os.cpu_count()} cores")
    print(f"{'':40}{'local':>10}{'ray':>10}")
    for label, a, b in rows:
        print(f"{label:40}{a:>10}{b:>10}")


def _median(data: list[float]) -> str:
    return f"{statistics.median(data):.0f}" if data else "-"


def _p90(data: list[float]) -> str:
    return f"{sorted(data)[int(0.9 * (len(data) - 1))]:.0f}" if data else "-"


if __name__ == "__main__":
    main()
