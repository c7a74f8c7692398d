"""What a task's check costs beyond the check command's own time.

The check as the loop runs it (runagent/loop/check.py: the command under a reaper of its own,
its output into the run's check.txt, its exit read from the reaper's report, its tree stopped
whole) runs `true`, against spawning `true` directly: with its reaper booted ahead, as the loop
boots it while the agent works (the goal's figure), and started for it, as `run-agent check`
does; then under bubblewrap, as a sandboxed agent's check runs (sandbox.wrap of the task's
view), against that bwrap command line spawned directly; and a whole `run-agent job` of a no-op
agent with `--check true` against one without. Each pair takes turns, --repeat times; median
and p90 of each side and the difference of the medians, with the goal for the first. Nothing
asserts on speed. Its folder (under /var/tmp: the sandbox hides /tmp and the home) goes at the
end.

    python bench/check_overhead.py [--repeat 30] [--quick]
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from runagent.loop import check, sandbox
from runagent.process import LaunchSpec, drop_reaper_early, start_reaper_early
from runagent.store.runfolder import TaskPaths

GOAL_MS = 30.0  # a check's cost over its command's own time


def run_agent() -> list[str]:
    """The installed `run-agent` launcher beside this interpreter, else `python -m runagent`."""
    launcher = Path(sys.executable).with_name("run-agent")
    return [str(launcher)] if launcher.exists() else [sys.executable, "-m", "runagent"]


Step = Callable[[], object]


def timed(step: Step, before: Step | None = None) -> float:
    """Milliseconds `step` takes, `before` (untimed) done first."""
    if before is not None:
        before()
    start = time.perf_counter()
    step()
    return (time.perf_counter() - start) * 1000


def reaper_booted() -> None:
    """A reaper started ahead, as the loop starts the check's while the agent works (it has
    minutes to boot there: here 50 ms, untimed)."""
    start_reaper_early()
    time.sleep(0.05)


def spawn(argv: list[str] | tuple[str, ...], cwd: Path, env: dict[str, str]) -> None:
    done = subprocess.run(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr.decode()}")


def checked(given: check.Check, cwd: Path, env: dict[str, str], output: Path,
            reach: sandbox.Reach | None = None) -> None:  # fmt: skip
    output.unlink(missing_ok=True)
    result = check.run(given, cwd=cwd, env=env, output=output, reach=reach)
    if not result.passed:
        sys.exit(f"the check failed: {result.words()}\n{output.read_text()}")


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]


def row(label: str, values: list[float]) -> str:
    return f"  {label:<34} median {statistics.median(values):7.1f} ms   p90 {p90(values):7.1f} ms"


def pair(
    title: str, plain: tuple[str, Step], through: tuple[str, Step], repeat: int,
    goal: float | None = None, before: Step | None = None,
) -> None:  # fmt: skip
    """Time both sides taking turns (one warm-up each; `before` untimed ahead of the second),
    and print them with the difference of the medians."""
    plain[1](), through[1]()
    a: list[float] = []
    b: list[float] = []
    for _ in range(repeat):
        a.append(timed(plain[1]))
        b.append(timed(through[1], before))
    over = statistics.median(b) - statistics.median(a)
    said = "" if goal is None else f"   goal < {goal:g} ms: {'met' if over < goal else 'NOT met'}"
    print(title)
    print(row(plain[0], a))
    print(row(through[0], b))
    print(f"  {'difference of the medians':<34} {over:7.1f} ms{said}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="3 rounds: for the tests")
    args = parser.parse_args()
    repeat = 3 if args.quick else args.repeat
    true = shutil.which("true") or "/bin/true"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="run-agent-bench-check-", dir="/var/tmp") as tmp:
        folder = Path(tmp)
        work, root = folder / "work", folder / "runs"
        work.mkdir()
        output = folder / "check.txt"
        given = check.Check(true, timeout=60.0, grace=1.0)
        print(f"{repeat} rounds each, taking turns; load average {load[0]:.2f} at the start")
        pair("the check of `true` as the loop runs it (its reaper booted while the agent "
             "worked) against `true` spawned directly",
             ("true spawned", lambda: spawn([true], work, env)),
             ("check `true`", lambda: checked(given, work, env, output)),
             repeat, GOAL_MS, before=reaper_booted)  # fmt: skip
        pair("the same with its reaper started for it (`run-agent check`)",
             ("true spawned", lambda: spawn([true], work, env)),
             ("check `true`, reaper started", lambda: checked(given, work, env, output)),
             repeat)  # fmt: skip
        from runagent.ops.sandbox import Bwrap

        if Bwrap(folder).problem() is None:
            task = TaskPaths(root, "p", "t")
            task.folder.mkdir(parents=True)
            reach = sandbox.Reach(task, None)
            wrapped = sandbox.wrap(LaunchSpec((true,), env, work), reach).argv
            pair("under bubblewrap, as a sandboxed agent's check runs (its reaper booted ahead)",
                 ("bwrap ... true spawned", lambda: spawn(wrapped, work, env)),
                 ("sandboxed check `true`", lambda: checked(given, work, env, output, reach)),
                 repeat, before=reaper_booted)  # fmt: skip
        else:
            print("(bubblewrap cannot run here: the sandboxed figures are left out)")
        config = folder / "config.yaml"
        config.write_text(
            f"agents:\n  noop:\n    type: command\n    command: [{true}]\n"
            f"defaults:\n  agent: noop\n  idle_timeout: 0\nstorage:\n  runs_dir: {root}\n"
        )
        count = iter(range(10**6))

        def job(*extra: str) -> None:
            spawn([*run_agent(), "--config", str(config), "job", "-p", "bench", "-t",
                   f"t{next(count)}", "-q", *extra, "go"], work, env)  # fmt: skip

        drop_reaper_early()
        pair("a whole `run-agent job` of a no-op agent, with and without the check",
             ("job", lambda: job()), ("job --check true", lambda: job("--check", true)),
             repeat)  # fmt: skip


if __name__ == "__main__":
    main()
