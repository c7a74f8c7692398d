"""CPU used by a supervisor (and, separately, its reaper) while its agent sleeps.

python bench/idle_cpu.py [--seconds 30]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
        Path(tmp, "config.yaml").write_text(
            "agents:\n  sleeper:\n    type: command\n"
            f"    command: [sleep, '{args.seconds + 5}']\n"
            "defaults:\n  agent: sleeper\n  idle_timeout: 0\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "runagent", "job", "-q", "-p", "b", "-t", "t", "x"], cwd=tmp
        )
        try:
            supervisor = psutil.Process(proc.pid)
            deadline = time.monotonic() + 20
            while not (reapers := [c for c in supervisor.children()
                                   if "reaper.py" in " ".join(c.cmdline())]):  # fmt: skip
                assert time.monotonic() < deadline, "no reaper appeared"
                time.sleep(0.05)
            reaper = reapers[0]
            time.sleep(1)  # start-up is not idling
            s0, r0, w0 = supervisor.cpu_times(), reaper.cpu_times(), time.monotonic()
            time.sleep(args.seconds)
            s1, r1, w1 = supervisor.cpu_times(), reaper.cpu_times(), time.monotonic()
        finally:
            proc.terminate()
            proc.wait(30)
    wall = w1 - w0
    # CPU time is counted in 10 ms ticks: none counted means under one tick over the wall time.
    floor = 0.01 / wall * 100

    def share(before: object, after: object) -> str:
        used = max(0.0, after.user + after.system - before.user - before.system)  # type: ignore[attr-defined]
        return f"{used / wall * 100:.3f}%" if used else f"under {floor:.3f}% (no tick counted)"

    print(f"while the agent sleeps {wall:.1f} s:")
    print(f"  supervisor  {share(s0, s1)} of one core")
    print(f"  reaper      {share(r0, r1)} of one core")
    print("goal: supervisor under 1% of a core")


if __name__ == "__main__":
    main()
