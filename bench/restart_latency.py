"""Time from an agent's exit to the next attempt's start, beyond the configured restart delay.

`run-agent run` restarts a bash agent that exits 1 at once N times, then (a counter file in
$TASK_FOLDER) exits 0; restart_delay and restart_delay_max are both 0.2 s, crash-loop detection
is off. The agent stamps its own start and exit ($EPOCHREALTIME, no fork) in the task folder, so
two figures come out, each less the delay:

- agent exit -> next agent start: everything the restart costs, as the agent sees it;
- run-info.yaml end_time of run N -> start_time of run N+1 (milliseconds, UTC): the loop's own
  bookkeeping between runs, with the pieces on either side of it shown too.

    python bench/restart_latency.py [--restarts 10] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

GOAL_MS = 50.0
DELAY = 0.2
AGENT = """\
printf 'start %s\\n' "$EPOCHREALTIME" >> "$TASK_FOLDER/moments"
n=0
[ -f "$TASK_FOLDER/count" ] && read -r n < "$TASK_FOLDER/count"
n=$((n + 1))
echo "$n" > "$TASK_FOLDER/count"
code=1
[ "$n" -gt "$1" ] && code=0
printf 'exit %s\\n' "$EPOCHREALTIME" >> "$TASK_FOLDER/moments"
exit $code
"""


def run_agent() -> list[str]:
    """The installed `run-agent` launcher beside this interpreter, else `python -m runagent`."""
    launcher = Path(sys.executable).with_name("run-agent")
    return [str(launcher)] if launcher.exists() else [sys.executable, "-m", "runagent"]


def run_info(path: Path) -> dict[str, str]:
    """The top-level scalar fields of a run-info.yaml, read without a YAML library."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        key, sep, value = line.partition(": ")
        if sep and not line.startswith(" "):
            found[key] = value.strip().strip("'\"")
    return found


def stamp(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def summary(label: str, values_ms: list[float]) -> str:
    return (
        f"  {label:<46} median {statistics.median(values_ms):6.1f} ms"
        f"   max {max(values_ms):6.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="2 restarts (for the tests)")
    args = parser.parse_args()
    if args.quick:
        args.restarts = 2
    bash = shutil.which("bash")
    if bash is None:
        sys.exit("restart_latency: needs bash (for $EPOCHREALTIME)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
        agent, config, root = Path(tmp, "agent.sh"), Path(tmp, "config.yaml"), Path(tmp, "runs")
        agent.write_text(AGENT)
        config.write_text(
            f"agents:\n  flaky:\n    type: command\n"
            f"    command: [{bash}, {agent}, '{args.restarts}']\n"
            f"defaults:\n  restart_delay: {DELAY}s\n  restart_delay_max: {DELAY}s\n"
            f"  max_restarts: {args.restarts + 5}\n  crash_loop_runs: 0\n"
            "  idle_timeout: 0\n  timeout: 0\n"
        )
        argv = [*run_agent(), "run", "-q", "--config", str(config), "--root", str(root),
                "--agent", "flaky", "--project", "b", "--task", "t", "x"]  # fmt: skip
        done = subprocess.run(argv, cwd=tmp, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            sys.exit(f"restart_latency: run-agent run exited {done.returncode}:\n{done.stderr}")
        task = Path(root, "b", "t")
        moments = [line.split() for line in (task / "moments").read_text().splitlines()]
        starts = [float(t) for kind, t in moments if kind == "start"]
        exits = [float(t) for kind, t in moments if kind == "exit"]
        infos = [run_info(run / "run-info.yaml") for run in sorted((task / "runs").iterdir())]
    runs = len(infos)
    if runs != args.restarts + 1 or len(starts) != runs or len(exits) != runs:
        sys.exit(f"restart_latency: expected {args.restarts + 1} runs, got {runs} run folders, "
                 f"{len(starts)} starts, {len(exits)} exits")  # fmt: skip
    statuses = [info["status"] for info in infos]
    if statuses != ["failed"] * args.restarts + ["completed"]:
        sys.exit(f"restart_latency: unexpected run statuses {statuses}")
    starts_info = [stamp(i["start_time"]) for i in infos]
    ends_info = [stamp(i["end_time"]) for i in infos]
    ms = 1000.0
    whole = [(starts[n + 1] - exits[n] - DELAY) * ms for n in range(runs - 1)]
    between = [(starts_info[n + 1] - ends_info[n] - DELAY) * ms for n in range(runs - 1)]
    exit_to_end = [(ends_info[n] - exits[n]) * ms for n in range(runs - 1)]
    start_to_agent = [(starts[n + 1] - starts_info[n + 1]) * ms for n in range(runs - 1)]
    print(f"{runs - 1} restarts, restart_delay {DELAY * ms:g} ms; time beyond the delay:")
    print(summary("agent exit -> next agent start", whole))
    print(summary("run-info end_time -> next start_time", between))
    print("  made of:")
    print(summary("  agent exit -> its run-info end_time", exit_to_end))
    print(summary("  end_time -> next start_time, less the delay", between))
    print(summary("  start_time -> the agent's first line", start_to_agent))
    print(f"goal: under {GOAL_MS:g} ms (agent exit -> next agent start)")


if __name__ == "__main__":
    main()
