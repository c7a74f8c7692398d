"""Listing a root of 10,000 runs over 100 tasks: `run-agent list` and the server's API.

Builds the root (100 tasks of 100 finished runs, each with run-info.yaml), then times
`run-agent list --json` (a whole process, start-up included), GET /api/tasks on a warm server, and
a scrape of GET /metrics: the server's first, its later ones (which parse only what changed), and
beside them a scrape that parses every run, as each one did before the server kept its tally.

    python bench/listing.py [--tasks 100] [--runs 100] [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.serving import serving  # noqa: E402
from runagent.store import runfolder, taskfolder  # noqa: E402
from runagent.store.runfolder import TaskPaths  # noqa: E402
from runagent.store.runinfo import Reason, RunInfo, RunStatus  # noqa: E402


def build(root: Path, tasks: int, runs: int) -> None:
    for t in range(tasks):
        task = TaskPaths(root, f"project-{t % 10}", f"task-{t:03d}")
        taskfolder.write_task_prompt(task, "bench")
        previous = None
        for r in range(runs):
            run_id = f"20260101-{t:02d}{r:04d}000-{1000 + t}"
            folder = runfolder.create_run_folder(task, run_id)
            done = r == runs - 1
            info = RunInfo(run_id, task.project_id, task.task_id, r + 1, "bench", "command",
                           "2026-01-01T00:00:00+00:00", str(root),
                           status=RunStatus.COMPLETED if done else RunStatus.FAILED,
                           reason=Reason.EXITED if done else Reason.EXIT_CODE,
                           exit_code=0 if done else 1, previous_run_id=previous,
                           end_time="2026-01-01T00:01:00+00:00")  # fmt: skip
            runfolder.write_run_info(folder, info)
            previous = run_id
        runfolder.atomic_write(task.done, "done\n")


def timed(action: object, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()  # type: ignore[operator]
        out.append((time.perf_counter() - start) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-list-") as tmp:
        root = Path(tmp) / "runs"
        started = time.perf_counter()
        build(root, args.tasks, args.runs)
        total = args.tasks * args.runs
        print(f"built {total} runs over {args.tasks} tasks in {time.perf_counter() - started:.1f}s")
        cli = [sys.executable, "-m", "runagent", "list", "--json", "--root", str(root)]

        def listing() -> None:
            out = subprocess.run(cli, cwd=tmp, capture_output=True, check=True)
            assert out.stdout.count(b'"task_id"') >= args.tasks

        noop = [sys.executable, "-m", "runagent", "--version"]
        cli_ms = timed(listing, args.repeat)
        start_ms = timed(lambda: subprocess.run(noop, capture_output=True, check=True), 3)
        with serving(root, tmp) as base:
            url = f"{base}/api/tasks"
            with httpx.Client() as http:
                api_ms = timed(lambda: http.get(url, timeout=30).raise_for_status(), args.repeat)

                def scrape() -> None:
                    http.get(f"{base}/metrics", timeout=60).raise_for_status()

                first_ms = timed(scrape, 1)
                again_ms = timed(scrape, args.repeat)
        from server import metrics

        whole_ms = timed(lambda: metrics.render(root, 0), 3)  # a tally of its own each time
        print(f"{'':<34} {'median':>8} {'max':>8}")
        print(f"{'run-agent list --json (process)':<34} {statistics.median(cli_ms):>6.0f}ms "
              f"{max(cli_ms):>6.0f}ms")  # fmt: skip
        print(f"{'  of which run-agent --version':<34} {statistics.median(start_ms):>6.0f}ms")
        print(f"{'GET /api/tasks (warm server)':<34} {statistics.median(api_ms):>6.0f}ms "
              f"{max(api_ms):>6.0f}ms")  # fmt: skip
        print(f"{'GET /metrics, the first scrape':<34} {first_ms[0]:>6.0f}ms")
        print(f"{'GET /metrics, later scrapes':<34} {statistics.median(again_ms):>6.0f}ms "
              f"{max(again_ms):>6.0f}ms")  # fmt: skip
        print(f"{'a scrape parsing every run':<34} {statistics.median(whole_ms):>6.0f}ms "
              f"(x{statistics.median(whole_ms) / statistics.median(again_ms):.1f} a later scrape, "
              "in-process)")  # fmt: skip
        print(f"goal: under 300 ms once warm, for {total} runs over {args.tasks} tasks")


if __name__ == "__main__":
    main()
