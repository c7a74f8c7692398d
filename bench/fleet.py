"""The fleet under load: N tasks submitted at once through a real `run-agent serve`, with
`limits: {max_running: M}`, each a no-op agent that sleeps a second.

Samples the process table every 50 ms for the agents alive, and prints: the most alive at once
(never more than M), whether the runs started in the order they were submitted (FIFO), whether
every task completed (none lost), the processes and memory the waiting tasks held right after
submission (the keeper, against a resident process per queued task), and, for each run that
took a freed slot, the time from the end of the run that freed it to its own start. With
`--kill-serve`, the server is SIGKILLed after half the submissions and started again.

    python bench/fleet.py [--tasks 200] [--max-running 4] [--kill-serve]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx
import psutil
import yaml

MARKER = "run-agent-bench-fleet"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(config: Path, root: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "runagent", "serve", "--config", str(config), "--root", str(root),
         "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    sys.exit("serve did not come up")


def ours() -> list[psutil.Process]:
    """run-agent's own processes of this bench (supervisors, reapers, the keeper)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if MARKER in cmdline and "sleep" not in cmdline and "runagent" in cmdline:
            found.append(proc)
    return found


def agents_alive() -> int:
    count = 0
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if len(cmdline) >= 3 and cmdline[0] == "sh" and MARKER in cmdline[-1]:
            count += 1
    return count


def stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--max-running", type=int, default=4)
    parser.add_argument("--kill-serve", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix=f"{MARKER}-") as tmp:
        root, config = Path(tmp, "runs"), Path(tmp, "config.yaml")
        config.write_text(yaml.safe_dump({
            "agents": {"sleeper": {"type": "command",
                                   "command": ["sh", "-c", "sleep 1", f"{MARKER}-agent"]}},
            "defaults": {"agent": "sleeper", "max_restarts": 0, "idle_timeout": 0},
            "limits": {"max_running": args.max_running},
        }))  # fmt: skip
        port = free_port()
        server = serve(config, root, port)
        peak, samples, stop = [0], [0], threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], agents_alive())
                samples[0] += 1
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        order = [f"t{i:04d}" for i in range(args.tasks)]
        started = time.monotonic()
        held: tuple[int, float] | None = None
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            for i, task in enumerate(order):
                if args.kill_serve and i == args.tasks // 2:
                    os.killpg(server.pid, signal.SIGKILL)
                    server.wait()
                    server = serve(config, root, port)
                answer = client.post("/api/projects/bench/tasks",
                                     json={"task_id": task, "prompt": "sleep"})  # fmt: skip
                if answer.status_code != 202:
                    sys.exit(f"{task}: {answer.status_code} {answer.text}")
            submitted = time.monotonic() - started
            procs = ours()
            rss = sum(p.memory_info().rss for p in procs if p.is_running())
            held = (len(procs), rss / 2**20)
            deadline = time.monotonic() + args.tasks * 3 + 60
            while time.monotonic() < deadline:
                rows = client.get("/api/projects/bench/tasks").json()
                if sum(1 for r in rows if r["status"] in ("completed", "failed")) == args.tasks:
                    break
                time.sleep(0.5)
            rows = client.get("/api/projects/bench/tasks").json()
        stop.set()
        sampler.join()
        os.killpg(server.pid, signal.SIGTERM)
        server.wait()
        elapsed = time.monotonic() - started
        runs = []
        for task in order:
            for info_path in (root / "bench" / task / "runs").glob("*/run-info.yaml"):
                info = yaml.safe_load(info_path.read_text())
                runs.append(
                    (task, stamp(info["start_time"]), stamp(info["end_time"] or info["start_time"]))
                )
        completed = sum(1 for r in rows if r["status"] == "completed")
        by_start = sorted(runs, key=lambda r: r[1])
        fifo = [t for t, _, _ in by_start] == order[: len(by_start)]
        ends = sorted(end for _, _, end in runs)
        waits = [
            (by_start[k][1] - ends[k - args.max_running]) * 1000
            for k in range(args.max_running, len(by_start))
            if by_start[k][1] >= ends[k - args.max_running]
        ]
    print(f"{args.tasks} tasks, max_running {args.max_running}, on {os.cpu_count()} cores"
          f"{', serve SIGKILLed and restarted halfway' if args.kill_serve else ''}")  # fmt: skip
    print(f"  submitted in {submitted:.1f} s; all done in {elapsed:.1f} s")
    print(f"  most agents alive at once: {peak[0]} (sampled {samples[0]} times every 50 ms; "
          f"limit {args.max_running})")  # fmt: skip
    print(f"  started in submission order (FIFO): {fifo}")
    print(f"  completed: {completed} of {args.tasks}; runs recorded: {len(runs)} (none lost: "
          f"{completed == args.tasks == len(runs)})")  # fmt: skip
    if held is not None:
        print(f"  right after submission: {held[0]} run-agent processes ({held[1]:.0f} MiB RSS "
              f"in all) for {args.tasks} tasks, against {args.tasks - args.max_running} "
              f"resident waiting processes of ~20 MiB each")  # fmt: skip
    if waits:
        p90 = sorted(waits)[int(0.9 * (len(waits) - 1))]
        print(f"  a freed slot to the next run's start: median {statistics.median(waits):.0f} ms, "
              f"p90 {p90:.0f} ms over {len(waits)} hand-overs")  # fmt: skip


if __name__ == "__main__":
    main()
