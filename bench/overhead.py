"""What `run-agent job` adds to a no-op agent, against spawning the same command directly.

Runs `true` directly and through `run-agent job` (a fresh task each time, a run folder, the
reaper, run-info written three times), interleaved, and prints medians and the difference.
Also shows where the time goes: a bare interpreter, and importing run-agent's command line.

    python bench/overhead.py [--repeat 30]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def clock(argv: list[str], cwd: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return (time.perf_counter() - start) * 1000


def job_args(i: int) -> list[str]:
    return ["job", "-q", "-p", "bench", "-t", f"t{i}", "x"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    true = shutil.which("true") or "/bin/true"
    # Bytecode caching is what an installed run-agent has; some machines turn it off.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        Path(tmp, "config.yaml").write_text(
            f"agents:\n  noop:\n    type: command\n    command: [{true}]\n"
            "defaults:\n  agent: noop\n  idle_timeout: 0\n"
        )
        py = [sys.executable]
        cases = {
            "true, spawned directly": lambda i: [true],
            "run-agent job (agent: true)": lambda i: [*py, "-m", "runagent", *job_args(i)],
            "  python -c pass": lambda i: [*py, "-c", "pass"],
            "  python -c 'import runagent.cli'": lambda i: [*py, "-c", "import runagent.cli"],
            "  python -I -S -c pass (the reaper)": lambda i: [*py, "-I", "-S", "-c", "pass"],
        }
        for argv in (c(0) for c in cases.values()):  # warm caches (and write bytecode)
            clock(argv, tmp, env)
        times: dict[str, list[float]] = {name: [] for name in cases}
        for i in range(1, args.repeat + 1):
            for name, make in cases.items():
                times[name].append(clock(make(i), tmp, env))
    direct = statistics.median(times["true, spawned directly"])
    job = statistics.median(times["run-agent job (agent: true)"])
    print(f"{'':<38} {'median':>8} {'p90':>8}")
    for name, values in times.items():
        p90 = sorted(values)[int(0.9 * (len(values) - 1))]
        print(f"{name:<38} {statistics.median(values):>6.1f}ms {p90:>6.1f}ms")
    print(f"run-agent job adds {job - direct:.1f} ms to a no-op agent (goal: under 100 ms)")


if __name__ == "__main__":
    main()
