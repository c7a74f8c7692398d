"""CPU used by a supervisor (the run-agent process and, separately, its reaper) while the agent
sleeps.

Starts `run-agent job` with the agent `sleep N`, finds the supervisor's reaper child (the one
running reaper.py), and samples both with psutil from one second after the agent started (start-up
is not idling) to half a second before its sleep ends. CPU seconds over wall seconds, as a
percentage of one core. psutil counts CPU in clock ticks (10 ms), so /proc's schedstat (in ns) is
shown beside it, and voluntary context switches tell how often each process woke.

    python bench/idle_cpu.py [--seconds 30] [--quick]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

GOAL_PERCENT = 1.0
SETTLE = 1.0  # seconds after the agent starts before sampling begins
END_MARGIN = 0.5  # seconds before the agent's sleep ends when sampling stops


def run_agent() -> list[str]:
    """The installed `run-agent` launcher beside this interpreter, else `python -m runagent`."""
    launcher = Path(sys.executable).with_name("run-agent")
    return [str(launcher)] if launcher.exists() else [sys.executable, "-m", "runagent"]


@dataclass(frozen=True)
class Sample:
    ticks: float  # user + system seconds from psutil (clock-tick resolution)
    sched: float  # seconds on a CPU from /proc/PID/task/*/schedstat (ns resolution)
    wakes: int  # voluntary context switches


def sample(proc: psutil.Process) -> Sample:
    times = proc.cpu_times()
    sched = 0
    for thread in proc.threads():
        try:
            with open(f"/proc/{proc.pid}/task/{thread.id}/schedstat") as f:
                sched += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return Sample(times.user + times.system, sched / 1e9, proc.num_ctx_switches().voluntary)


def wait_for(
    find: Callable[[], psutil.Process | None], what: str, timeout: float = 20.0
) -> psutil.Process:
    deadline = time.monotonic() + timeout
    while True:
        found = find()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            sys.exit(f"idle_cpu: no {what} appeared within {timeout:g} s")
        time.sleep(0.01)


def child_running(parent: psutil.Process, needle: str) -> psutil.Process | None:
    for child in parent.children():
        try:
            if needle in " ".join(child.cmdline()):
                return child
        except psutil.Error:
            pass
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument(
        "--quick", action="store_true", help="the shortest sleep it can sample (for the tests)"
    )
    args = parser.parse_args()
    if args.quick:
        args.seconds = SETTLE + END_MARGIN + 1
    # SIGTERM unwinds like Ctrl-C, so the temporary folder and the processes go too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if args.seconds < SETTLE + END_MARGIN + 1:
        parser.error(f"--seconds must be at least {SETTLE + END_MARGIN + 1:g}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
        config, root = Path(tmp, "config.yaml"), Path(tmp, "runs")
        config.write_text(
            f"agents:\n  sleeper:\n    type: command\n    command: [sleep, '{args.seconds:g}']\n"
            "defaults:\n  idle_timeout: 0\n  timeout: 0\n"
        )
        argv = [*run_agent(), "job", "-q", "--config", str(config), "--root", str(root),
                "--agent", "sleeper", "--project", "b", "--task", "t", "x"]  # fmt: skip
        with open(Path(tmp, "stderr.txt"), "w+") as stderr:
            job = subprocess.Popen(argv, cwd=tmp, env=env, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=stderr)  # fmt: skip
            try:
                supervisor = psutil.Process(job.pid)
                reaper = wait_for(lambda: child_running(supervisor, "reaper.py"), "reaper")
                agent = wait_for(lambda: child_running(reaper, "sleep"), "sleeping agent")
                agent_started = agent.create_time()
                time.sleep(max(0.0, agent_started + SETTLE - time.time()))
                s0, r0, w0 = sample(supervisor), sample(reaper), time.monotonic()
                time.sleep(max(0.0, agent_started + args.seconds - END_MARGIN - time.time()))
                s1, r1, w1 = sample(supervisor), sample(reaper), time.monotonic()
                totals = {
                    name: (sample(p), time.time() - p.create_time())
                    for name, p in (("supervisor", supervisor), ("reaper", reaper))
                }
                code = job.wait(timeout=END_MARGIN + 30)
            finally:
                if job.poll() is None:  # something went wrong: stop the loop and its agent
                    job.terminate()
                    try:
                        job.wait(timeout=20)
                    except subprocess.TimeoutExpired:
                        job.kill()
                        job.wait()
            if code != 0:
                stderr.seek(0)
                sys.exit(f"idle_cpu: run-agent job exited {code}:\n{stderr.read()}")

    wall = w1 - w0
    print(f"agent `sleep {args.seconds:g}`: sampled {wall:.2f} s of its sleep "
          f"({SETTLE:g} s after it started to {END_MARGIN:g} s before it ended)")  # fmt: skip
    print(f"{'':<12} {'psutil cpu_times':>18} {'schedstat':>12} {'wake-ups/s':>11}"
          f" {'whole life incl. start-up':>27}")  # fmt: skip
    for name, before, after in (("supervisor", s0, s1), ("reaper", r0, r1)):
        ticks = after.ticks - before.ticks
        tick_text = (
            f"{ticks / wall * 100:.3f}%" if ticks else f"<{0.01 / wall * 100:.3f}% (0 ticks)"
        )
        sched = (after.sched - before.sched) / wall * 100
        wakes = (after.wakes - before.wakes) / wall
        life_sample, life = totals[name]
        print(f"{name:<12} {tick_text:>18} {sched:>11.4f}% {wakes:>11.1f}"
              f" {life_sample.sched:>8.3f} s CPU in {life:5.1f} s")  # fmt: skip
    print(f"goal: supervisor under {GOAL_PERCENT:g}% of one core while the agent idles")


if __name__ == "__main__":
    main()
