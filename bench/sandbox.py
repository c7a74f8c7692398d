"""What isolation costs per attempt, measured side by side in one run: the agent under bubblewrap
(`sandbox: bwrap`) and the task in a worktree of its own (`--worktree`), against neither.

For each of plain, sandbox, worktree and both, --repeat (default 20) tasks of an agent that
stamps $EPOCHREALTIME in its run folder as its first act and exits, each a `run-agent job` in a
git repository: the attempt's start-up (run-info's start_time to the agent's stamp: the reaper,
bwrap when on, the agent's shell) and the whole command (its start to its exit: the worktree's
making when on), median and max. Nothing asserts on speed; its folder (under /var/tmp, as a
person's runs root is outside /tmp and the home, which the sandbox hides) goes at the end.

    python bench/sandbox.py [--repeat 20] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.fleet import make_repository

AGENT = 'printf "%s" "$EPOCHREALTIME" > "$RUN_FOLDER/stamp"'
KINDS = {"plain": [], "sandbox": ["--sandbox", "bwrap"], "worktree": ["--worktree"],
         "both": ["--sandbox", "bwrap", "--worktree"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="1 round of each kind (for the tests)")
    args = parser.parse_args()
    if args.quick:
        args.repeat = 1
    with tempfile.TemporaryDirectory(prefix="run-agent-bench-sandbox-", dir="/var/tmp") as tmp:
        repo, root, config = Path(tmp, "repo"), Path(tmp, "runs"), Path(tmp, "config.yaml")
        make_repository(repo)
        env = dict(os.environ)
        config.write_text(yaml.safe_dump({
            "agents": {"stamp": {"type": "command", "command": ["bash", "-c", AGENT]}},
            "defaults": {"agent": "stamp", "idle_timeout": 0},
        }))  # fmt: skip
        cli = [sys.executable, "-m", "runagent", "--config", str(config), "--root", str(root)]
        figures: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in KINDS}
        for i in range(args.repeat):  # the kinds take turns, so none has the machine to itself
            for kind, flags in KINDS.items():
                task = f"{kind}-{i:03d}"
                began = time.time()
                done = subprocess.run([*cli, "job", "-p", "b", "-t", task, *flags, "go"], cwd=repo,
                                      env=env, capture_output=True, text=True)  # fmt: skip
                whole = time.time() - began
                if done.returncode != 0:
                    sys.exit(f"bench: {kind} failed: {done.stderr.strip()}")
                folder = root / "b" / task
                (run,) = (folder / "runs").iterdir()
                info = yaml.safe_load((run / "run-info.yaml").read_text())
                start = datetime.fromisoformat(info["start_time"].replace("Z", "+00:00"))
                stamp = float((run / "stamp").read_text())
                figures[kind][0].append((stamp - start.timestamp()) * 1000)
                figures[kind][1].append(whole * 1000)
    report(figures, args.repeat)


def report(figures: dict[str, tuple[list[float], list[float]]], n: int) -> None:
    base = statistics.median(figures["plain"][0]), statistics.median(figures["plain"][1])
    print(f"per attempt, {n} runs of each, on {os.cpu_count()} cores (ms; ratio to plain)")
    print(f"{'':10}{'start-up median':>18}{'max':>8}{'ratio':>7}{'whole job median':>19}"
          f"{'max':>8}{'ratio':>7}")  # fmt: skip
    for kind, (startup, whole) in figures.items():
        a, b = statistics.median(startup), statistics.median(whole)
        print(f"{kind:10}{a:18.0f}{max(startup):8.0f}{a / base[0]:7.2f}{b:19.0f}"
              f"{max(whole):8.0f}{b / base[1]:7.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
