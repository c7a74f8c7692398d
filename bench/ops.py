"""What the operations runtime costs: file operations per second, and the policy per command,
beside what starting a command costs anyway.

Sends the runtime (a real run folder and workspace in a temporary folder) batches of 1,000 small
createFile operations, then 1,000 readFile operations of those files, and prints operations per
second (median over --repeat batches; each batch is validated, judged by the policy, executed,
and recorded in operations.jsonl and events.jsonl, as a model's would be). Then the policy
decision per command over the corpus of tests/ops/test_policy.py (a small built-in list if that is
not importable), p50 and p99, interleaved with spawning `true` directly and with one `shell`
operation running `true` through the runtime. No assertion on speed.

    python bench/ops.py [--repeat 5] [--batch 1000] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runagent.ops.policy import Policy
from runagent.ops.runtime import Runtime

FALLBACK = [("ls -la", "standard"), ("git status && git diff", "standard"),
            ("cat a.txt | grep x > b.txt", "standard"), ("rm -rf build", "standard"),
            ("bash -c 'echo $(whoami)'", "standard"), ("sudo ls", "standard")]  # fmt: skip


def corpus() -> tuple[list[tuple[str, str]], str]:
    try:
        from tests.ops.test_policy import COMMAND_CASES
    except ImportError:
        return FALLBACK, "a built-in list (tests/ops/test_policy.py not importable)"
    return [(c, p) for c, p, _ in COMMAND_CASES], "the corpus of tests/ops/test_policy.py"


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def batch(kind: str, n: int, pass_no: int) -> dict[str, object]:
    def op(i: int) -> dict[str, object]:
        path = f"d{i % 20}/f{pass_no}-{i}.txt"
        if kind == "createFile":
            return {"type": kind, "id": f"c{i}", "path": path, "content": f"line {i}\n"}
        return {"type": kind, "id": f"r{i}", "path": path}

    return {"protocolVersion": "1.0", "operations": [op(i) for i in range(n)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="batches of each kind")
    parser.add_argument("--batch", type=int, default=1000, help="operations per batch")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 batch of 20 of each kind, a tenth of the corpus (for the tests)",
    )
    args = parser.parse_args()
    if args.quick:
        args.repeat, args.batch = 1, 20

    rates: dict[str, list[float]] = {"createFile": [], "readFile": []}
    shell_ms: list[float] = []
    spawn_ms: list[float] = []
    decide_ms: list[float] = []
    commands, where = corpus()
    if args.quick:  # a tenth of the corpus: each command also starts a shell op of `true`
        commands, where = commands[::10], f"every tenth of {where}"
    with tempfile.TemporaryDirectory(prefix="bench-ops-") as tmp:
        work = Path(tmp, "work")
        work.mkdir()
        runtime = Runtime.create(Path(tmp, "runs/run"), work, "standard")
        for n in range(args.repeat):
            for kind in ("createFile", "readFile"):
                message = batch(kind, args.batch, n)
                start = time.perf_counter()
                reply = runtime.receive(message)
                took = time.perf_counter() - start
                assert all(e.get("success") for e in reply.events), reply.events[:1]
                rates[kind].append(args.batch / took)
        policies = {name: Policy.preset(name) for name in ("restrictive", "standard", "permissive")}
        policies["standard"].check_command("ls")  # the grammar loads once, not per decision
        shell = {"protocolVersion": "1.0", "operations": [{"type": "shell", "command": "true"}]}
        for command, preset in commands:
            start = time.perf_counter()
            policies[preset].check_command(command)
            decide_ms.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            subprocess.run(["true"], check=True)
            spawn_ms.append((time.perf_counter() - start) * 1000)
            start = time.perf_counter()
            runtime.receive(shell)
            shell_ms.append((time.perf_counter() - start) * 1000)

    print(f"{args.repeat} batches of {args.batch} operations each, through Runtime.receive")
    print(f"{'':34}{'median ops/s':>14}{'min ops/s':>12}{'per op, µs':>12}")
    for kind, values in rates.items():
        median = statistics.median(values)
        print(f"{kind:34}{median:>14,.0f}{min(values):>12,.0f}{1e6 / median:>12.1f}")
    print(f"\n{len(commands)} commands of {where}, interleaved")
    print(f"{'':34}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}")
    rows = (
        ("policy decision per command", decide_ms),
        ("spawn `true` directly", spawn_ms),
        ("`shell` op `true` via the runtime", shell_ms),
    )
    for label, values in rows:
        row = [percentile(values, 0.5), percentile(values, 0.99), max(values)]
        print(f"{label:34}" + "".join(f"{v:>10.3f}" for v in row))


if __name__ == "__main__":
    main()
