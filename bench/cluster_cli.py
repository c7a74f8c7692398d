"""A command on a Ray cluster beside the same command on this machine, as a person runs it: a new
`run-agent` process each time, timed from its spawn.

Three ways side by side, taking turns in each round:

- local: `--executor local` (the loop's supervisor on this machine);
- ray, joining: `--executor ray` with RUN_AGENT_BROKER=0, the old path (each command imports
  Ray and joins the cluster as a driver);
- ray, broker: `--executor ray` through the runs root's cluster broker (executors/broker.py),
  started once by the first command (that first command is timed apart: it waits for the
  broker to join).

The commands: `run` in the foreground (to the agent's first act: it stamps $EPOCHREALTIME into
its task folder), `run --detach` (to the agent's stamp, and to the command's return), `status`
of that task while its agent runs, `list`, and `stop` of it (to the command's return, its agent
gone). Then a freed slot to the next start: N tasks of an agent that sleeps a moment against one
slot (locally `limits: {max_running: 1}` and the keeper; on the cluster one host of
`agent_slot` 1 and Ray's queue), from one run's end to the next run's start in their
run-info.yaml.

The cluster is a real in-process `ray.cluster_utils.Cluster` (a head without agent_slot and one
host, hostA), sharing this machine's cores. Nothing asserts on speed; everything it starts is
stopped and its temp folder removed.

    python bench/cluster_cli.py [--repeat 7] [--tasks 12] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runagent.executors import broker  # noqa: E402
from runagent.store.runfolder import TaskPaths, read_run_info  # noqa: E402

STAMP = 'printf "%s\\n" "$EPOCHREALTIME" > "$TASK_FOLDER/started"'
AGENTS = {
    "stamp": ["bash", "-c", STAMP],  # its first act, then it is done
    "sleeper": ["bash", "-c", f"{STAMP}; exec sleep 3600"],
    "nap": ["bash", "-c", "sleep 0.5"],
}
MODES = ("local", "ray-join", "ray-broker")


def run_agent() -> list[str]:
    launcher = Path(sys.executable).with_name("run-agent")
    return [str(launcher)] if launcher.exists() else [sys.executable, "-m", "runagent"]


def write_config(path: Path, root: Path, executor: dict[str, object], **extra: object) -> Path:
    data = {
        "agents": {name: {"type": "command", "command": argv} for name, argv in AGENTS.items()},
        "defaults": {"agent": "stamp", "max_restarts": 0, "idle_timeout": 0, "kill_grace": "1s"},
        "storage": {"runs_dir": str(root)},
        "executor": executor,
        **extra,
    }
    path.write_text(yaml.safe_dump(data))
    return path


class Mode:
    def __init__(self, name: str, work: Path, address: str) -> None:
        self.name = name
        self.root = work / name / "runs"
        self.root.mkdir(parents=True)
        kind = "local" if name == "local" else "ray"
        executor = {"type": kind, "address": address, "namespace": "bench"}
        self.config = write_config(work / name / "config.yaml", self.root, executor)
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        if name == "ray-join":
            self.env[broker.BROKER_ENV] = "0"
        self.cwd = work / name

    def argv(self, *args: str) -> list[str]:
        return [*run_agent(), *args, "--config", str(self.config)]

    def run(self, *args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
        """Milliseconds from spawn to exit; the command must succeed."""
        began = time.time()
        done = subprocess.run(
            self.argv(*args), cwd=self.cwd, env=self.env, text=True, stdin=subprocess.DEVNULL,
            capture_output=True, timeout=300,
        )  # fmt: skip
        took = (time.time() - began) * 1000
        if done.returncode != 0:
            log = ""
            if "-t" in args:
                task = TaskPaths(self.root, "b", args[args.index("-t") + 1])
                with contextlib.suppress(OSError):
                    log = (task.folder / "supervisor.log").read_text()[-3000:]
            sys.exit(f"bench: {self.name}: run-agent {' '.join(args)} exited {done.returncode}:\n"
                     f"{done.stderr}\nits supervisor.log ends:\n{log}")  # fmt: skip
        return took, done

    def to_first_act(self, task: str, *args: str) -> tuple[float, float]:
        """Milliseconds from spawn to the agent's stamp, and to the command's exit."""
        began = time.time()
        proc = subprocess.Popen(self.argv(*args), cwd=self.cwd, env=self.env, text=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)  # fmt: skip
        stamp = TaskPaths(self.root, "b", task).folder / "started"
        _, err = proc.communicate(timeout=300)
        returned = (time.time() - began) * 1000
        if proc.returncode != 0:
            sys.exit(f"bench: {self.name}: run-agent {' '.join(args)} exited {proc.returncode}:\n"
                     f"{err}")  # fmt: skip
        # The stamp's line written whole (the shell creates the file before it writes it).
        wait_for(lambda: stamp.exists() and stamp.read_text().endswith("\n"), 120,
                 f"{self.name} {task}'s agent to start")  # fmt: skip
        return (float(stamp.read_text()) - began) * 1000, returned


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.01)


def commands(modes: list[Mode], repeat: int) -> dict[str, dict[str, list[float]]]:
    figures: dict[str, dict[str, list[float]]] = {}

    def keep(row: str, mode: Mode, ms: float) -> None:
        figures.setdefault(row, {}).setdefault(mode.name, []).append(ms)

    for i in range(repeat):
        for mode in modes if i % 2 == 0 else list(reversed(modes)):
            first, _ = mode.to_first_act(f"run{i}", "run", "-p", "b", "-t", f"run{i}", "go")
            keep("run, to the agent's first act", mode, first)
            first, back = mode.to_first_act(
                f"det{i}", "run", "-d", "-p", "b", "-t", f"det{i}", "--agent", "sleeper", "go"
            )
            keep("run --detach, to the agent's first act", mode, first)
            keep("run --detach, to its return", mode, back)
            keep(
                "status -p b -t T (running)",
                mode,
                mode.run("status", "-p", "b", "-t", f"det{i}")[0],
            )
            keep("list", mode, mode.run("list")[0])
            keep("stop -p b -t T", mode, mode.run("stop", "-p", "b", "-t", f"det{i}")[0])
    return figures


def hand_over(work: Path, address: str, kind: str, n: int, slots: int) -> list[float]:
    """Each run's end to the start of the run that took its slot (ms): N tasks of `nap`
    against `slots` slots, started detached from the command line one after the other."""
    folder = work / f"handover-{kind}"
    root = folder / "runs"
    root.mkdir(parents=True)
    executor = {"type": kind, "address": address, "namespace": "bench-handover"}
    extra: dict[str, object] = {"limits": {"max_running": slots}} if kind == "local" else {}
    config = write_config(folder / "config.yaml", root, executor, **extra)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    tasks = [TaskPaths(root, "h", f"t{i:02d}") for i in range(n)]
    for task in tasks:
        done = subprocess.run(
            [*run_agent(), "run", "-d", "-p", "h", "-t", task.task_id, "--agent", "nap", "go",
             "--config", str(config)],
            cwd=folder, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        if done.returncode != 0:
            sys.exit(f"bench: {kind}: the start of {task.label} exited {done.returncode}:\n"
                     f"{done.stderr}")  # fmt: skip

    def ended() -> bool:
        return all(task.done.exists() or _ended_runs(task) for task in tasks)

    wait_for(ended, n * 10 + 120, f"{n} {kind} tasks to end")
    runs = [r for task in tasks for r in _ended_runs(task)]
    broker.stop_all(root)
    starts, ends = sorted(s for s, _ in runs), sorted(e for _, e in runs)
    return [(starts[k] - ends[k - slots]) * 1000 for k in range(slots, len(starts))
            if starts[k] >= ends[k - slots]]  # fmt: skip


def _ended_runs(task: TaskPaths) -> list[tuple[float, float]]:
    found = []
    for run_id in task.run_ids():
        info = read_run_info(task.run_folder(run_id))
        if info is not None and info.end_time:
            found.append((_epoch(info.start_time), _epoch(info.end_time)))
    return found


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--tasks", type=int, default=12, help="tasks for the freed-slot figure")
    parser.add_argument("--quick", action="store_true", help="2 rounds, 3 tasks (CI)")
    parser.add_argument(
        "--address", help="a running cluster's head (HOST:PORT) to use instead of one started "
        "here; its agent hosts' agent_slot, given as --slots",
    )  # fmt: skip
    parser.add_argument("--slots", type=int, default=1, help="with --address")
    parser.add_argument("--only", choices=("commands", "handover"), help="measure one part")
    args = parser.parse_args()
    if args.quick:
        args.repeat, args.tasks = 2, 3

    work = Path(tempfile.mkdtemp(prefix="bench-cluster-cli-"))
    ray_tmp = Path(tempfile.mkdtemp(prefix="ray"))  # a socket's path is at most 107 bytes
    os.environ["RAY_TMPDIR"] = str(ray_tmp)
    cluster = None
    modes: list[Mode] = []
    try:
        address = args.address
        if address is None:
            from ray.cluster_utils import Cluster

            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
            cluster.add_node(num_cpus=1, resources={"agent_slot": 1},
                             env_vars={"RUN_AGENT_HOST": "hostA"})  # fmt: skip
            cluster.wait_for_nodes()
            address, args.slots = cluster.address, 1
        figures: dict[str, dict[str, list[float]]] = {}
        cold = float("nan")
        if args.only != "handover":
            modes = [Mode(name, work, address) for name in MODES]
            # The broker's first command starts it and waits for it to join: timed apart.
            cold, _ = modes[2].to_first_act("cold", "run", "-p", "b", "-t", "cold", "go")
            figures = commands(modes, args.repeat)
        local: list[float] = []
        ray_: list[float] = []
        if args.only != "commands":
            local = hand_over(work, address, "local", args.tasks, args.slots)
            ray_ = hand_over(work, address, "ray", args.tasks, args.slots)
        report(figures, cold, local, ray_, args)
    finally:
        for mode in modes:
            broker.stop_all(mode.root)
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def report(figures: dict[str, dict[str, list[float]]], cold: float, local: list[float],
           ray_: list[float], args: argparse.Namespace) -> None:  # fmt: skip
    load = os.getloadavg()[0]
    print(f"on {os.cpu_count()} cores at load {load:.1f}")
    if figures:
        print(f"each command a new process, median of {args.repeat} (ms)")
        head = f"{'':40}{'local':>8}{'ray join':>10}{'ray broker':>12}{'join/local':>12}"
        print(f"{head}{'broker/local':>14}")
        for row, by in figures.items():
            a, b, c = (statistics.median(by[m]) for m in MODES)
            print(f"{row:40}{a:8.0f}{b:10.0f}{c:12.0f}{b / a:12.2f}{c / a:14.2f}")
        print(f"{'the first run, starting the broker':40}{'':8}{'':10}{cold:12.0f}")
    if not local and not ray_:
        return
    print(f"\na freed slot to the next start, {args.tasks} tasks against {args.slots} slot(s) "
          "(ms)")  # fmt: skip
    print(f"{'':40}{'local':>8}{'ray':>10}{'ratio':>12}")
    for name, f in (("median", statistics.median), ("max", max)):
        a, b = (f(x) if x else float("nan") for x in (local, ray_))
        print(f"{name:40}{a:8.0f}{b:10.0f}{b / a:12.2f}")


if __name__ == "__main__":
    main()
