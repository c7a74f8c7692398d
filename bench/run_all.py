"""Run the four run-agent benches in sequence with their default sizes, printing each result.

    python bench/run_all.py [--quick]

With `--quick` each runs in its own quick mode (small sizes: the tests run it so). Otherwise it
takes about a minute on a 2-core machine (idle_cpu alone sleeps 30 s) and needs
about 1 GiB of free disk for a moment (throughput). The SSE and listing benches need a server
and are run on their own (bench/README.md).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHES = ["overhead.py", "throughput.py", "idle_cpu.py", "restart_latency.py"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="each in its quick mode (for the tests)"
    )
    args = parser.parse_args()
    failed = []
    for name in BENCHES:
        argv = [sys.executable, str(HERE / name), *(["--quick"] if args.quick else [])]
        print(f"== {shlex.join(argv)}", flush=True)
        start = time.monotonic()
        code = subprocess.run(argv, stdin=subprocess.DEVNULL).returncode
        print(f"-- {name} exited {code} after {time.monotonic() - start:.1f} s\n", flush=True)
        if code != 0:
            failed.append(name)
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
