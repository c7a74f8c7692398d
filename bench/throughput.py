"""An agent writing 1 GiB to stdout through run-agent, against `cmd > file` in a shell.

The agent's stdout is a file descriptor of the run folder, so no byte passes through Python:
the ratio should be close to 1. Interleaved repetitions; medians compared.

    python bench/throughput.py [--size-mib 1024] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    size = args.size_mib << 20
    writer = ["head", "-c", str(size), "/dev/zero"]
    with tempfile.TemporaryDirectory(prefix="bench-throughput-") as tmp:
        Path(tmp, "config.yaml").write_text(
            "agents:\n  writer:\n    type: command\n"
            f"    command: [head, -c, '{size}', /dev/zero]\n"
            "  noop:\n    type: command\n    command: ['true']\n"
            "defaults:\n  agent: writer\n  idle_timeout: 0\n"
        )
        direct, through, noop = [], [], []
        job = [sys.executable, "-m", "runagent", "job", "-q", "-p", "b", "--root",
               str(Path(tmp, "runs"))]  # fmt: skip
        for i in range(args.repeat):
            start = time.perf_counter()
            subprocess.run([*job, "-t", f"noop{i}", "--agent", "noop", "x"], cwd=tmp, check=True)
            noop.append(time.perf_counter() - start)
            target = Path(tmp, "direct.out")
            start = time.perf_counter()
            subprocess.run(f"{' '.join(writer)} > {target}", shell=True, check=True)
            direct.append(time.perf_counter() - start)
            assert target.stat().st_size == size
            target.unlink()
            start = time.perf_counter()
            subprocess.run([*job, "-t", f"t{i}", "x"], cwd=tmp, check=True)
            through.append(time.perf_counter() - start)
            run = next(Path(tmp, "runs", "b", f"t{i}", "runs").iterdir())
            stdout = run / "agent-stdout.txt"
            assert stdout.stat().st_size == size, "the run folder lost bytes"
            assert os.path.samefile(stdout, run / "output.md")  # linked, not copied
            stdout.unlink()
            (run / "output.md").unlink()
    d, t, n = statistics.median(direct), statistics.median(through), statistics.median(noop)
    print(f"{args.size_mib} MiB to stdout, median of {args.repeat}")
    print(f"  cmd > file                    {d:6.2f} s  ({args.size_mib / d:5.0f} MiB/s)")
    print(f"  through run-agent             {t:6.2f} s  ({args.size_mib / t:5.0f} MiB/s)")
    print(f"  run-agent job of a no-op      {n:6.2f} s  (its fixed cost, bench/overhead.py)")
    print(f"  ratio, whole command          {t / d:6.3f}")
    print(f"  ratio, less the fixed cost    {(t - n) / d:6.3f}  (the data path)")
    print("goal: under 1.05")


if __name__ == "__main__":
    main()
