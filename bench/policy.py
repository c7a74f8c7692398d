"""What the policy gate costs per shell command, beside what starting the command costs anyway.

Judges every command of the policy corpus (tests/ops/test_policy.py) with its preset and spawns
`true` right after each one, interleaved, then prints p50, p99 and max of both. The first decision,
which loads the bash grammar, is shown apart. No assertion on speed.

    python bench/policy.py [--repeat 20] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runagent.ops.policy import Policy
from tests.ops.test_policy import COMMAND_CASES


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, help="passes over the corpus")
    parser.add_argument("--quick", action="store_true", help="1 pass (for the tests)")
    args = parser.parse_args()
    if args.quick:
        args.repeat = 1

    policies = {name: Policy.preset(name) for name in ("restrictive", "standard", "permissive")}
    start = time.perf_counter()
    policies["standard"].check_command("ls")
    cold_ms = (time.perf_counter() - start) * 1000

    decide: list[float] = []
    spawn: list[float] = []
    slowest: dict[str, float] = {}
    for _ in range(args.repeat):
        for command, preset, _expected in COMMAND_CASES:
            start = time.perf_counter()
            policies[preset].check_command(command)
            took = (time.perf_counter() - start) * 1000
            decide.append(took)
            slowest[command] = max(took, slowest.get(command, 0.0))
            start = time.perf_counter()
            subprocess.run(["true"], check=True)
            spawn.append((time.perf_counter() - start) * 1000)

    print(f"{len(COMMAND_CASES)} commands x {args.repeat} passes, interleaved with spawning `true`")
    print(f"first decision (loads the bash grammar): {cold_ms:.2f} ms")
    print(f"{'':24}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}")
    for label, values in (("policy decision", decide), ("spawn `true`", spawn)):
        row = [percentile(values, 0.5), percentile(values, 0.99), max(values)]
        print(f"{label:24}" + "".join(f"{v:>10.3f}" for v in row))
    ratio = statistics.median(decide) / statistics.median(spawn)
    print(f"median decision / median spawn: {ratio:.1%}")
    worst = sorted(slowest.items(), key=lambda item: -item[1])[:3]
    print("slowest commands: " + "; ".join(f"{c[:40]!r} {ms:.2f} ms" for c, ms in worst))


if __name__ == "__main__":
    main()
