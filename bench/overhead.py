"""What `run-agent job` adds to a no-op agent, against spawning the same command directly.

Runs `true` directly and through `run-agent job` (a fresh task each time: run folder, reaper,
run-info written three times), interleaved, and prints median and p90 of both and the difference.
Beside them, in the same rounds, `run-agent --version` and `run-agent list` on an empty root
against a bare `python -c pass`, each with its goal, and the load of the machine while it ran.
Then shows where the time goes: a bare interpreter, importing run-agent's command line, the
reaper's interpreter, and the run itself as run-info.yaml's start_time -> end_time records it.

    python bench/overhead.py [--repeat 20] [--instructions] [--quick]

With --instructions it also counts, under valgrind's callgrind, the instructions each command's
own process runs: a figure a loaded machine does not move, to compare two versions by (a bare
interpreter's count beside them: over it, x1 is as much work again as starting python).
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
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

GOAL_MS = 100.0  # a no-op job over the agent spawned directly
GROUP = "import runagent.cli.group"  # click and the command group: what every command but
# `--version` alone loads first
START_GOAL_MS = 60.0  # --version, and list on an empty root, over a bare interpreter


def run_agent() -> list[str]:
    """The installed `run-agent` launcher beside this interpreter, else `python -m runagent`."""
    launcher = Path(sys.executable).with_name("run-agent")
    return [str(launcher)] if launcher.exists() else [sys.executable, "-m", "runagent"]


def bench_env() -> dict[str, str]:
    # An installed run-agent reads cached bytecode; some shells turn writing it off.
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def clock(argv: list[str], cwd: str, env: dict[str, str]) -> float:
    """Milliseconds from spawn to exit; the command must succeed."""
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    elapsed = (time.perf_counter() - start) * 1000
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr.decode()}")
    return elapsed


def instructions(argv: list[str], cwd: str, env: dict[str, str]) -> int:
    """Instructions the command's own process ran, as valgrind's callgrind counts them."""
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
                          cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} under valgrind exited {done.returncode}:\n{done.stderr}")
    return int(next(line for line in done.stderr.splitlines() if "Collected" in line).split()[-1])


def run_info_times(path: Path) -> dict[str, str]:
    """start_time and end_time of a run-info.yaml, read without a YAML library."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition(":")
        if key in ("start_time", "end_time"):
            found[key] = value.strip().strip("'\"")
    return found


def import_profile(env: dict[str, str]) -> tuple[float, list[tuple[str, float]]]:
    """From `-X importtime`: ms spent in `site`, and the command group's direct imports by their
    cumulative ms (a module shared by several counts under the first that imports it)."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", "import runagent.cli.group"],
                         env=env, capture_output=True, text=True, check=True).stderr  # fmt: skip
    site = 0.0
    children: list[tuple[str, float]] = []
    pending: list[tuple[str, float]] = []
    for line in err.splitlines()[1:]:
        _, cumulative, name = line.split("|")
        depth = (len(name) - len(name.lstrip())) // 2
        name, ms = name.strip(), int(cumulative) / 1000
        if depth == 0:
            if name == "site":
                site = ms
            elif name == "runagent.cli.group":
                children = pending
            pending = []
        elif depth == 1:
            pending.append((name, ms))
    return site, sorted(children, key=lambda c: -c[1])


def p90(values: list[float]) -> float:
    return sorted(values)[round(0.9 * (len(values) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="2 rounds (for the tests)")
    parser.add_argument(
        "--instructions", action="store_true",
        help="also count each command's instructions under valgrind (unmoved by a loaded machine)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.repeat = 2
    if args.instructions and shutil.which("valgrind") is None:
        sys.exit("bench/overhead.py: --instructions needs valgrind (apt-get install valgrind)")
    true = shutil.which("true") or "/bin/true"
    env = bench_env()
    py = sys.executable
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        config, root = Path(tmp, "config.yaml"), Path(tmp, "runs")
        empty = Path(tmp, "empty")
        empty.mkdir()
        config.write_text(
            f"agents:\n  noop:\n    type: command\n    command: [{true}]\n"
            "defaults:\n  agent: noop\n  idle_timeout: 0\n  timeout: 0\n"
        )
        job = [*run_agent(), "job", "-q", "--config", str(config), "--root", str(root),
               "--agent", "noop", "--project", "bench"]  # fmt: skip
        cases: dict[str, Callable[[int], list[str]]] = {
            "true, spawned directly": lambda i: [true],
            "run-agent job (agent: true)": lambda i: [*job, "--task", f"t{i}", "x"],
            "  python -c pass": lambda i: [py, "-c", "pass"],
            "  python -c 'import runagent.cli.group'": lambda i: [py, "-c", GROUP],
            "  python -I -S -c pass (reaper's)": lambda i: [py, "-I", "-S", "-c", "pass"],
            "run-agent --version": lambda i: [*run_agent(), "--version"],
            "run-agent list (empty root)": lambda i: [*run_agent(), "list", "--config",
                                                      str(config), "--root", str(empty)],
        }  # fmt: skip
        for make in cases.values():  # warm the page cache and write bytecode; not counted
            clock(make(0), tmp, env)
        times: dict[str, list[float]] = {name: [] for name in cases}
        for i in range(1, args.repeat + 1):
            for name, make in cases.items():
                times[name].append(clock(make(i), tmp, env))
        inside = []  # run-info start_time -> end_time: the reaper, the agent, output.md
        for i in range(1, args.repeat + 1):
            (run,) = Path(root, "bench", f"t{i}", "runs").iterdir()
            stamps = run_info_times(run / "run-info.yaml")
            start, end = (datetime.fromisoformat(stamps[k]) for k in ("start_time", "end_time"))
            inside.append((end - start).total_seconds() * 1000)
        counted = {}
        if args.instructions:
            for name in ("  python -c pass", "run-agent --version", "run-agent list (empty root)"):
                counted[name] = instructions(cases[name](0), tmp, env)
            counted["run-agent job (agent: true)"] = instructions(
                [*job, "--task", "ir", "x"], tmp, env
            )

    load_after = os.getloadavg()
    site, imports_by_module = import_profile(env)
    med = {name: statistics.median(values) for name, values in times.items()}
    print(f"{args.repeat} repetitions each, interleaved, on {os.cpu_count()} cores; load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after")  # fmt: skip
    print(f"{'':<40} {'median':>9} {'p90':>9}")
    for name, values in times.items():
        print(f"{name:<40} {med[name]:7.1f}ms {p90(values):7.1f}ms")
    print(f"{'  run-info start_time -> end_time':<40} {statistics.median(inside):7.1f}ms "
          f"{p90(inside):7.1f}ms")  # fmt: skip
    direct, whole = times["true, spawned directly"], times["run-agent job (agent: true)"]
    added = med["run-agent job (agent: true)"] - med["true, spawned directly"]
    print(f"run-agent job adds {added:.1f} ms median, {p90(whole) - p90(direct):.1f} ms p90 "
          f"to a no-op agent (goal: under {GOAL_MS:g} ms)")  # fmt: skip
    interp = med["  python -c pass"]
    over_python = med["run-agent job (agent: true)"] - interp
    print(f"run-agent job is {over_python:.1f} ms median over a bare `python -c pass` (the "
          f"issue's measure; goal: under {GOAL_MS:g} ms)")  # fmt: skip
    for name in ("run-agent --version", "run-agent list (empty root)"):
        over, over90 = med[name] - interp, p90(times[name]) - p90(times["  python -c pass"])
        print(f"{name} adds {over:.1f} ms median, {over90:.1f} ms p90 to a bare "
              f"`python -c pass` (goal: under {START_GOAL_MS:g} ms)")  # fmt: skip
    imports = med["  python -c 'import runagent.cli.group'"] - interp
    the_run = statistics.median(inside)
    rest = med["run-agent job (agent: true)"] - interp - imports - the_run
    print("where the median goes:")
    for label, value in (
        ("interpreter start-up (python -c pass)", interp),
        ("importing the command group (click, ...)", imports),
        ("the run (reaper start, agent, run files)", the_run),
        ("the rest, by difference (options, config, lock)", rest),
    ):
        print(f"  {label:<50} {value:6.1f} ms")
    if counted:
        bare = counted["  python -c pass"]
        print("instructions of each process itself, under valgrind's callgrind (its children not "
              "counted; the same on a loaded machine as on a quiet one):")  # fmt: skip
        for name, n in counted.items():
            over = (
                f"  {(n - bare) / 1e6:7.1f} M over it, x{(n - bare) / bare:.2f} of it"
                if n != bare
                else ""
            )
            print(f"  {name.strip():<38} {n / 1e6:7.1f} M{over}")
    print("one `python -X importtime -c 'import runagent.cli.group'` (inflated by its own "
          "timing):")  # fmt: skip
    print(f"  {'site (with the editable install path finder)':<50} {site:6.1f} ms")
    for name, ms in imports_by_module[:8]:
        print(f"  {name:<50} {ms:6.1f} ms")


if __name__ == "__main__":
    main()
