"""A provider's limit under a fleet, from one run: N tasks of agent `lim` and N of agent `other`
(default 20 each, each an agent that sleeps 1 s), submitted at once through the door
(Service.start) under `limits: {max_running: S}` (default 4), while `lim`'s provider says it is
limited for L seconds (default 60; the fake agent speaks claude's stream: a rejected
`rate_limit_event` with its reset time, every run of it until then).

Prints: the runs of `lim` that found the limit (attempts spent on it; goal: one, the run that
found it, or as many as had started before the pause was written), the most slots held at once
by loops waiting out the limit (the fleet's slots sampled every 100 ms, those of tasks whose
latest run ended limited; goal 0), how many of `other`'s tasks started while the limit lasted
(goal: all that fit, every one when they take less than L), and whether every task completed.
Nothing asserts on speed; everything it starts is stopped and its temp folder removed.

    python bench/pause.py [--tasks 20] [--slots 4] [--limit 60] [--quick]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import backends  # noqa: E402
from runagent import listing  # noqa: E402
from runagent.config.overrides import LoopOverrides  # noqa: E402
from runagent.fleet.queue import Fleet  # noqa: E402
from runagent.service import Service, StartRequest  # noqa: E402
from runagent.store.runfolder import TaskPaths, read_run_info  # noqa: E402
from runagent.store.runinfo import Reason  # noqa: E402

FAKE = REPO / "tests" / "fake_agent.py"


def write_config(folder: Path, root: Path, slots: int, until: Path) -> Path:
    fake = [sys.executable, str(FAKE), "--ignore-unknown", "--sleep", "1"]
    data = {
        "agents": {
            "lim": {"type": "claude", "command": [*fake, "--limited-until", str(until)]},
            "other": {"type": "command", "command": fake},
        },
        "defaults": {"agent": "other", "max_restarts": 0, "idle_timeout": 0},
        "storage": {"runs_dir": str(root)},
        "limits": {"max_running": slots},
    }
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(data))
    return config


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--limit", type=float, default=60.0)
    ap.add_argument(
        "--quick", action="store_true", help="2 + 2 tasks, 1 slot, a 3 s limit (for the tests)"
    )
    args = ap.parse_args()
    if args.quick:
        args.tasks, args.slots, args.limit = 2, 1, 3.0
    folder = Path(tempfile.mkdtemp(prefix="run-agent-bench-pause-"))
    root = folder / "runs"
    try:
        return run(folder, root, args.tasks, args.slots, args.limit)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run(folder: Path, root: Path, n: int, slots: int, limit: float) -> int:
    until = folder / "limited-until"
    config = write_config(folder, root, slots, until)
    door = Service(root, config_path=config, backend_names=backends.known(), workdir=folder)
    held_by_waiting = 0
    stop = threading.Event()

    def sample() -> None:
        nonlocal held_by_waiting
        fleet = Fleet(root)
        while not stop.wait(0.1):
            if not fleet.exists():
                continue
            with fleet.locked():
                holders = fleet.holders(clean=False)
            # A slot whose loop waits out the limit: the task's latest run ended limited.
            held = 0
            for holder in holders:
                task = TaskPaths(root, holder.project, holder.task)
                runs = task.run_ids()
                latest = read_run_info(task.run_folder(runs[-1])) if runs else None
                held += latest is not None and latest.reason is Reason.RATE_LIMIT
            held_by_waiting = max(held_by_waiting, held)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    limit_ends = time.time() + limit
    until.write_text(f"{limit_ends}\n")
    tasks = []
    for i in range(n):
        for agent in ("lim", "other"):
            task = TaskPaths(root, "bench", f"{agent}-{i:02d}")
            door.start(StartRequest(task, "go", overrides=LoopOverrides(agent=agent)))
            tasks.append((agent, task))
    deadline = time.time() + limit + 60 + 5 * n
    while time.time() < deadline:
        views = [listing.view(task) for _, task in tasks]
        if all(v.status.value in ("completed", "failed", "stopped") for v in views):
            break
        time.sleep(0.5)
    stop.set()
    sampler.join()
    limited = started_during = 0
    completed = 0
    for agent, task in tasks:
        runs = [read_run_info(task.run_folder(r)) for r in task.run_ids()]
        infos = [r for r in runs if r is not None]
        limited += sum(r.reason is Reason.RATE_LIMIT for r in infos)
        if agent == "other" and infos and _epoch(infos[0].start_time) < limit_ends:
            started_during += 1
        completed += listing.view(task).status.value == "completed"
    print(f"{n} tasks of lim and {n} of other, max_running {slots}, lim limited for {limit:g} s")
    print(f"{'figure':<48} {'measured':>9} {'goal':>22}")
    print(f"{'runs of lim that found the limit':<48} {limited:>9} {'1 (those under way)':>22}")
    print(f"{'most slots held by loops waiting the limit out':<48} {held_by_waiting:>9} {'0':>22}")
    print(f"{'tasks of other started while the limit lasted':<48} {started_during:>9} "
          f"{'all that fit':>22}")  # fmt: skip
    print(f"{'tasks completed':<48} {completed:>9} {2 * n:>22}")
    return 0 if completed == 2 * n else 1


def _epoch(stamp: str | None) -> float:
    from datetime import datetime

    return datetime.fromisoformat((stamp or "").replace("Z", "+00:00")).timestamp()


if __name__ == "__main__":
    sys.exit(main())
