"""The fleet under load: N tasks submitted at once through a real `run-agent serve`, with
`limits: {max_running: M}`, each a no-op agent that sleeps a second.

Samples the process table every 50 ms for the agents alive, and prints: the most alive at once
(never more than M), whether the runs started in the order they were submitted (FIFO), whether
every task completed (none lost), the processes and memory the waiting tasks held right after
submission (the keeper, against a resident process per queued task), and, for each run that
took a freed slot, the time from the end of the run that freed it to its own start. With
`--kill-serve`, the server is SIGKILLed after half the submissions and started again. With
`--mixed`, the submissions take turns between the API, the command line (`run-agent job`, which
waits in its own process, as a shell's run does) and a schedule fired as cron fires it
(`run-agent schedule now`), each submitted once the one before is in the queue.

    python bench/fleet.py [--tasks 200] [--max-running 4] [--kill-serve] [--mixed] [--isolated]
                          [--quick]
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
from collections import Counter
from datetime import datetime
from pathlib import Path

import httpx
import psutil
import yaml

MARKER = "run-agent-bench-fleet"


# How long `serve` may take to answer: beside other work on 2 cores it took 29 s to start.
STARTUP_WAIT = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


STARTED: list[subprocess.Popen[bytes]] = []  # every serve started: none outlives the bench


def serve(config: Path, root: Path, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "runagent", "serve", "--config", str(config), "--root", str(root),
         "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    STARTED.append(proc)
    deadline = time.monotonic() + STARTUP_WAIT
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
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if len(cmdline) >= 3 and os.path.basename(cmdline[0]) == "sh" and MARKER in cmdline[-1]:
            found.append(proc)  # (under bwrap the agent is started by its full path)
    return alive_together(found)


def alive_together(found: list[psutil.Process]) -> int:
    """How many agents of `found` are alive at one moment. Walking the process table takes
    tens of milliseconds, during which an agent that ends and the next one that starts in its
    slot would both be seen: those found are looked at again, together, at its end. A shell's
    child is counted with its shell (between fork and exec it bears the shell's command line)."""
    pids = {proc.pid for proc in found}
    count = 0
    for proc in found:
        try:
            alive = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
            count += alive and proc.ppid() not in pids
        except psutil.NoSuchProcess:
            continue
    return count


def overlapping(spans: list[tuple[float, float]]) -> int:
    """The most of `spans` (start, end) that overlap at one moment (an end before a start at
    the same instant)."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def submitted_by(client: httpx.Client, task: str) -> None:
    """Wait until a `job` started for `task` is in the queue (or already past it)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        answer = client.get(f"/api/projects/bench/tasks/{task}")
        if answer.status_code == 200 and answer.json()["status"] != "pending":
            return
        time.sleep(0.02)
    sys.exit(f"{task}: the job never reached the queue")


def make_repository(folder: Path) -> None:
    """A git repository with one commit, for the agents' worktrees."""
    folder.mkdir()
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "bench",
        "GIT_AUTHOR_EMAIL": "bench@example.invalid",
        "GIT_COMMITTER_NAME": "bench",
        "GIT_COMMITTER_EMAIL": "bench@example.invalid",
    }
    for argv in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "start"]):
        subprocess.run(["git", "-C", str(folder), *argv], env=env, check=True)


def stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--max-running", type=int, default=4)
    parser.add_argument("--kill-serve", action="store_true")
    parser.add_argument("--mixed", action="store_true")
    parser.add_argument(
        "--isolated",
        action="store_true",
        help="every task in a worktree of its own and its agent under bwrap",
    )
    parser.add_argument("--quick", action="store_true", help="6 tasks, 2 at once (for the tests)")
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.max_running = 6, 2
    # A loop that has just ended may still be writing its last lines as the folder goes: its
    # removal is tried again (remove_tree) rather than failing the bench at its very end.
    with tempfile.TemporaryDirectory(prefix=f"{MARKER}-", ignore_cleanup_errors=True) as tmp:
        root, config = Path(tmp, "runs"), Path(tmp, "config.yaml")
        work = Path(tmp, "repo")  # where the agents work (a repository: their worktrees')
        make_repository(work)
        defaults: dict[str, object] = {"agent": "sleeper", "max_restarts": 0, "idle_timeout": 0}
        if args.isolated:
            defaults.update(worktree=True, sandbox="bwrap")
        config.write_text(yaml.safe_dump({
            "agents": {"sleeper": {"type": "command",
                                   "command": ["sh", "-c", "sleep 1", f"{MARKER}-agent"]}},
            "defaults": defaults,
            "limits": {"max_running": args.max_running},
            "schedules": {"s": {"cron": "0 0 1 1 *", "project": "bench", "prompt": "sleep",
                                "overlap": "allow", "cwd": str(work)}},
        }))  # fmt: skip
        cli = [sys.executable, "-m", "runagent", "--config", str(config), "--root", str(root)]
        waiters: list[subprocess.Popen[bytes]] = []
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
        order: list[str] = []
        ways = ("api", "cli", "schedule") if args.mixed else ("api",)
        started = time.monotonic()
        held: tuple[int, float] | None = None
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            for i in range(args.tasks):
                if args.kill_serve and i == args.tasks // 2:
                    os.killpg(server.pid, signal.SIGKILL)
                    server.wait()
                    server = serve(config, root, port)
                task, way = f"t{i:04d}", ways[i % len(ways)]
                if way == "api":
                    answer = client.post("/api/projects/bench/tasks", json={
                        "task_id": task, "prompt": "sleep", "cwd": str(work)})  # fmt: skip
                    if answer.status_code != 202:
                        sys.exit(f"{task}: {answer.status_code} {answer.text}")
                elif way == "cli":
                    waiters.append(subprocess.Popen(
                        [*cli, "job", "-p", "bench", "-t", task, "--cwd", str(work), "sleep"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        start_new_session=True,
                    ))  # fmt: skip
                    submitted_by(client, task)
                else:
                    fired = subprocess.run([*cli, "schedule", "now", "s"], capture_output=True,
                                           text=True, check=True)  # fmt: skip
                    task = fired.stdout.strip().rpartition("/")[2]
                order.append(task)
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
        for waiter in waiters:
            waiter.wait(30)
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
        place = {task: n for n, task in enumerate(order)}
        # How far from its place in the queue each run started (0 everywhere: FIFO).
        displaced = [abs(place[t] - n) for n, (t, _, _) in enumerate(by_start) if t in place]
        # Which doors the runs that started ahead of their place came through.
        ahead = Counter(ways[place[t] % len(ways)] for n, (t, _, _) in enumerate(by_start)
                        if t in place and place[t] > n)  # fmt: skip
        ends = sorted(end for _, _, end in runs)
        waits = [
            (by_start[k][1] - ends[k - args.max_running]) * 1000
            for k in range(args.max_running, len(by_start))
            if by_start[k][1] >= ends[k - args.max_running]
        ]
    remove_tree(tmp)
    how = ", submitted in turn through the API, `job` and `schedule now`" if args.mixed else ""
    how += ", each in a worktree of its own with its agent under bwrap" if args.isolated else ""
    print(f"{args.tasks} tasks, max_running {args.max_running}, on {os.cpu_count()} cores{how}"
          f"{', serve SIGKILLed and restarted halfway' if args.kill_serve else ''}")  # fmt: skip
    print(f"  submitted in {submitted:.1f} s; all done in {elapsed:.1f} s")
    print(f"  most agents alive at once: {peak[0]} (sampled {samples[0]} times every 50 ms; "
          f"limit {args.max_running}); most runs overlapping by their run-info times: "
          f"{overlapping([(s, e) for _, s, e in runs])}")  # fmt: skip
    moved = sum(1 for d in displaced if d)
    print(f"  started in submission order (FIFO): {fifo}"
          + ("" if fifo else f" ({moved} runs started out of place, by at most "
                             f"{max(displaced)} places; those ahead came through "
                             f"{dict(ahead)})"))  # fmt: skip
    print(f"  completed: {completed} of {args.tasks}; runs recorded: {len(runs)} (none lost: "
          f"{completed == args.tasks == len(runs)})")  # fmt: skip
    if held is not None:
        foreground = f", {len(waiters)} of them `job` waiting in its own process" if waiters else ""
        resident = args.tasks - args.max_running
        print(f"  right after submission: {held[0]} run-agent processes ({held[1]:.0f} MiB RSS "
              f"in all{foreground}) for {args.tasks} tasks, against {resident} resident "
              "waiting processes of ~20 MiB each")  # fmt: skip
    if waits:
        p90 = sorted(waits)[int(0.9 * (len(waits) - 1))]
        print(f"  a freed slot to the next run's start: median {statistics.median(waits):.0f} ms, "
              f"p90 {p90:.0f} ms over {len(waits)} hand-overs")  # fmt: skip


def remove_tree(folder: str) -> None:
    """Remove `folder`, trying again for a few seconds while something still writes in it."""
    import shutil

    deadline = time.monotonic() + 10
    while os.path.exists(folder) and time.monotonic() < deadline:
        shutil.rmtree(folder, ignore_errors=True)
        time.sleep(0.2)


if __name__ == "__main__":
    try:
        main()
    finally:  # a bench that fails halfway leaves no server behind
        for started in STARTED:
            if started.poll() is None:
                os.killpg(started.pid, signal.SIGKILL)
                started.wait()
