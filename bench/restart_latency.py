"""Time from an agent's exit to the next attempt's start, beyond the configured restart delay.

The agent records the moment it starts and the moment it exits (in the task folder);
run-agent's loop restarts it with restart_delay 0.2 s. Reported: exit -> next agent start,
minus the delay, and the same from run-info.yaml's end_time -> next start_time.

    python bench/restart_latency.py [--restarts 10]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import yaml

DELAY = 0.2
# A shell agent, so that the figure is run-agent's and not an interpreter's start-up.
AGENT = """
echo "start $(date +%s.%N)" >> "$TASK_FOLDER/moments"
count=$(grep -c start "$TASK_FOLDER/moments")
echo "exit $(date +%s.%N)" >> "$TASK_FOLDER/moments"
[ "$count" -gt "$1" ]
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restarts", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
        Path(tmp, "agent.sh").write_text(AGENT)
        Path(tmp, "config.yaml").write_text(
            "agents:\n  flaky:\n    type: command\n"
            f"    command: [sh, agent.sh, '{args.restarts}']\n"
            f"defaults:\n  agent: flaky\n  restart_delay: {DELAY}s\n  restart_delay_max: {DELAY}s\n"
            f"  max_restarts: {args.restarts}\n  crash_loop_runs: 0\n  idle_timeout: 0\n"
        )
        subprocess.run([sys.executable, "-m", "runagent", "-q", "-p", "b", "-t", "t", "x"],
                       cwd=tmp, check=True)  # fmt: skip
        task = Path(tmp, "runs", "b", "t")
        moments = [line.split() for line in (task / "moments").read_text().splitlines()]
        starts = [float(t) for k, t in moments if k == "start"]
        exits = [float(t) for k, t in moments if k == "exit"]
        agent_gaps = [(s - e - DELAY) * 1000 for e, s in zip(exits, starts[1:], strict=False)]
        infos = [yaml.safe_load((run / "run-info.yaml").read_text())
                 for run in sorted((task / "runs").iterdir())]  # fmt: skip
        stamp = lambda s: datetime.fromisoformat(s).timestamp()  # noqa: E731
        info_gaps = [(stamp(b["start_time"]) - stamp(a["end_time"]) - DELAY) * 1000
                     for a, b in itertools.pairwise(infos)]  # fmt: skip
    print(
        f"{len(agent_gaps)} restarts with restart_delay {DELAY * 1000:g} ms; time beyond the delay:"
    )
    print(f"  agent exit -> next agent start      median {statistics.median(agent_gaps):5.1f} ms"
          f"  max {max(agent_gaps):5.1f} ms")  # fmt: skip
    print(f"  run-info end_time -> next start     median {statistics.median(info_gaps):5.1f} ms"
          f"  max {max(info_gaps):5.1f} ms")  # fmt: skip
    print("goal: under 50 ms")


if __name__ == "__main__":
    main()
