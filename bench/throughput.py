"""An agent writing 1 GiB to stdout through run-agent, against `cmd > file` in a shell.

The agent's stdout is a file descriptor of the run folder, so no byte passes through Python:
the ratio should be close to 1. Repetitions are interleaved (the shell, run-agent, and a no-op
`run-agent job` for the fixed start-up cost) and medians compared. Every big file is checked
for its size and deleted as soon as it is timed; the page cache is synced before each timing.

    python bench/throughput.py [--size-mib 1024] [--repeat 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL = 1.05


def run_agent() -> list[str]:
    """The installed `run-agent` launcher beside this interpreter, else `python -m runagent`."""
    launcher = Path(sys.executable).with_name("run-agent")
    return [str(launcher)] if launcher.exists() else [sys.executable, "-m", "runagent"]


def timed(argv: list[str], cwd: str, env: dict[str, str]) -> float:
    """Seconds `argv` takes; it must succeed."""
    os.sync()  # the previous repetition's write-back is not this one's cost
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)  # fmt: skip
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{shlex.join(argv)} exited {done.returncode}:\n{done.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="8 MiB, 1 round (for the tests)")
    args = parser.parse_args()
    if args.quick:
        args.size_mib, args.repeat = 8, 1
    # SIGTERM unwinds like Ctrl-C, so the temporary folder and the processes go too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    size = args.size_mib << 20
    writer = ["head", "-c", str(size), "/dev/zero"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory(prefix="bench-throughput-") as tmp:
        config, root = Path(tmp, "config.yaml"), Path(tmp, "runs")
        config.write_text(
            "agents:\n"
            f"  writer:\n    type: command\n    command: [{', '.join(writer)}]\n"
            "  noop:\n    type: command\n    command: ['true']\n"
            "defaults:\n  idle_timeout: 0\n  timeout: 0\n"
        )
        job = [*run_agent(), "job", "-q", "--config", str(config), "--root", str(root),
               "--project", "b"]  # fmt: skip

        direct, through, noop = [], [], []
        target = Path(tmp, "direct.out")
        shell_line = f"{shlex.join(writer)} > {shlex.quote(str(target))}"
        timed([*job, "--task", "warm", "--agent", "noop", "x"], tmp, env)  # warm caches
        for i in range(args.repeat):
            noop.append(timed([*job, "--task", f"noop{i}", "--agent", "noop", "x"], tmp, env))
            direct.append(timed(["sh", "-c", shell_line], tmp, env))
            got = target.stat().st_size
            target.unlink()
            assert got == size, f"cmd > file wrote {got} bytes, not {size}"
            through.append(timed([*job, "--task", f"t{i}", "--agent", "writer", "x"], tmp, env))
            (folder,) = Path(root, "b", f"t{i}", "runs").iterdir()
            stdout, output = folder / "agent-stdout.txt", folder / "output.md"
            got = stdout.stat().st_size
            linked = output.exists() and os.path.samefile(stdout, output)
            stdout.unlink()
            output.unlink(missing_ok=True)
            assert got == size, f"the run folder's agent-stdout.txt holds {got} bytes, not {size}"
    d, t, n = statistics.median(direct), statistics.median(through), statistics.median(noop)
    mib = args.size_mib
    print(f"{mib} MiB to stdout ({shlex.join(writer)}), median of {args.repeat}, interleaved")
    print(f"{'':<32} {'median':>7}   {'min - max':>15}")
    for label, values, note in (
        ("cmd > file in a shell", direct, f"{mib / d:6.0f} MiB/s"),
        ("through run-agent job", through, f"{mib / t:6.0f} MiB/s"),
        ("run-agent job of a no-op", noop, "its fixed cost; bench/overhead.py"),
    ):
        spread = f"{min(values):.3f} - {max(values):.3f}"
        print(f"  {label:<30} {statistics.median(values):7.3f} s {spread:>15} s  ({note})")
    print(f"  agent-stdout.txt held {mib} MiB each time; output.md "
          f"{'a hard link to it' if linked else 'a copy'}")  # fmt: skip
    print(f"  ratio, whole command           {t / d:7.3f}")
    print(f"  ratio, less the fixed cost     {(t - n) / d:7.3f}  (the data path alone)")
    print(f"goal: ratio under {GOAL}")


if __name__ == "__main__":
    main()
