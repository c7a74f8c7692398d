"""Listing a root of many runs: `run-agent list`, the server's API, the page's fleet view and
`/metrics`, through the root's index beside reading every run (the old path).

Builds the root as the supervisor writes it: one real `run-agent job` of a command agent, whose
run folder is then copied for every run (stdout, stderr, prompt, and run-info.yaml through
`runfolder.write_run_info` with the run's id, attempt, times and previous run; its host, pids
and agent kept), TASKS tasks of RUNS runs each, over ten projects. Then times, with the index
(runagent/store/index.py) and without it (RUN_AGENT_INDEX=off: every listing reads every task's
latest record, every scrape every run's, as before the index):

- `run-agent list --json` as a process: the first (which builds the index), then warm;
- GET /api/tasks on a warm server;
- GET /metrics: a fresh server's first scrape (the index on disk: "cold"), then later ones;
- with `--page`: the page's fleet view in Debian's chromium, from asking for the page to the
  fleet's counts on screen with every task listed beside them.

    python bench/listing.py [--tasks 1000] [--runs 100] [--repeat 5] [--page] [--quick]
                            [--jobs 2] [--index-only] [--root ROOT]

`--quick` (10 tasks of 5 runs, 1 repeat) runs in the tests, so the bench never rots.
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
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.serving import serving  # noqa: E402
from runagent.store import runfolder, taskfolder  # noqa: E402
from runagent.store.runfolder import TaskPaths  # noqa: E402
from runagent.store.runinfo import Reason, RunStatus  # noqa: E402

OFF = {"RUN_AGENT_INDEX": "off"}
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def real_run(tmp: Path) -> Path:
    """The folder of one real `run-agent job` of a command agent."""
    config = tmp / "config.yaml"
    config.write_text("agents:\n  bench:\n    type: command\n    command: [echo, done]\n")
    root = tmp / "seed"
    done = subprocess.run(
        [sys.executable, "-m", "runagent", "job", "-p", "seed", "-t", "seed", "--agent", "bench",
         "--config", str(config), "--root", str(root), "list the files"],
        cwd=tmp, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        sys.exit(f"the seed job failed: {done.stderr.strip()}")
    task = TaskPaths(root, "seed", "seed")
    return task.run_folder(task.run_ids()[-1])


def build(root: Path, seed: Path, tasks: int, runs: int, jobs: int = 1) -> None:
    """TASKS tasks of RUNS runs each, copies of `seed` as its supervisor wrote it; in JOBS
    processes, each a share of the tasks (a million runs take half an hour in one). Every run
    is in the past, the newest ended a minute ago, as in a fleet that ran until now: a run dated
    in the future would count in today's spend, which reads the runs of today."""
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=tasks * runs + 1)
    if jobs <= 1:
        _build(root, seed, range(tasks), runs, start)
        return
    from concurrent.futures import ProcessPoolExecutor

    shares = [range(first, tasks, jobs) for first in range(jobs)]
    with ProcessPoolExecutor(jobs) as pool:
        for done in [pool.submit(_build, root, seed, share, runs, start) for share in shares]:
            done.result()


def _build(root: Path, seed: Path, tasks: range, runs: int, start: datetime) -> None:
    info = runfolder.read_run_info(seed)
    assert info is not None
    files = {name: ((seed / name).read_bytes(), (seed / name).stat().st_mode & 0o777)
             for name in os.listdir(seed)
             if name != runfolder.RUN_INFO and (seed / name).is_file()}  # fmt: skip
    kept = {name: (seed.parent.parent / name).read_bytes()  # its task folder's own files
            for name in (".lock", runfolder.TASK_SETTINGS, runfolder.TASK_USAGE)
            if (seed.parent.parent / name).is_file()}  # fmt: skip
    fsync, os.fsync = os.fsync, lambda fd: None  # the same bytes, without a flush per file
    try:
        for t in tasks:
            task = TaskPaths(root, f"project-{t % 10}", f"task-{t:04d}")
            taskfolder.write_task_prompt(task, "list the files")
            for name, data in kept.items():
                runfolder.atomic_write_bytes(task.folder / name, data)
            previous = None
            for r in range(runs):
                began = start + timedelta(minutes=t * runs + r)
                run_id = f"{began:%Y%m%d-%H%M%S}000-{1000 + t}"
                folder = runfolder.create_run_folder(task, run_id)
                for name, (data, mode) in files.items():
                    (folder / name).write_bytes(data)
                    os.chmod(folder / name, mode)
                last = r == runs - 1
                runfolder.write_run_info(folder, info.replace(
                    run_id=run_id, project_id=task.project_id, task_id=task.task_id,
                    attempt=r + 1, previous_run_id=previous,
                    start_time=began.isoformat(),
                    end_time=(began + timedelta(seconds=30)).isoformat(),
                    status=RunStatus.COMPLETED if last else RunStatus.FAILED,
                    reason=Reason.EXITED if last else Reason.EXIT_CODE, exit_code=0 if last else 1,
                ))  # fmt: skip
                previous = run_id
            runfolder.atomic_write(task.done, "done\n")
            ended = (began + timedelta(seconds=30)).timestamp()  # as the folders were then
            os.utime(task.runs, (ended, ended))
    finally:
        os.fsync = fsync


def timed(action: Callable[[], object], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        out.append((time.perf_counter() - start) * 1000)
    return out


def listing(root: Path, tmp: str, tasks: int, env: dict[str, str]) -> Callable[[], None]:
    cli = [sys.executable, "-m", "runagent", "list", "--json", "--root", str(root)]

    def run() -> None:
        out = subprocess.run(cli, cwd=tmp, capture_output=True, check=True, env=os.environ | env)
        assert out.stdout.count(b'"task_id"') >= tasks

    return run


def served(
    root: Path, tmp: str, env: dict[str, str], args: argparse.Namespace, repeat: int
) -> dict[str, list[float]]:
    """What a fresh server answers: /metrics first (cold), /api/tasks and /metrics warm, and
    the page's fleet view, each `repeat` times."""
    found: dict[str, list[float]] = {}
    with serving(root, tmp, env=env, wait=False) as base, httpx.Client(timeout=900) as http:
        found["scrape_first"] = timed(lambda: http.get(f"{base}/metrics").raise_for_status(), 1)
        found["api"] = timed(lambda: http.get(f"{base}/api/tasks").raise_for_status(), repeat)
        found["scrape"] = timed(lambda: http.get(f"{base}/metrics").raise_for_status(), repeat)
        if args.page:
            found["page"] = page(base, args.tasks, repeat)
    return found


def page(base: str, tasks: int, repeat: int) -> list[float]:
    """From asking for the page to the fleet's counts on screen, every task listed beside."""
    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=["--no-sandbox", "--disable-gpu"])  # fmt: skip
        for _ in range(repeat):
            view = browser.new_page(viewport={"width": 1400, "height": 900})
            started = time.perf_counter()
            view.goto(f"{base}/")
            view.wait_for_function(  # the fleet's counts, and every task in the list beside
                "document.querySelector('#fleet-counts li') !== null && "
                f"document.querySelectorAll('a[data-task]').length === {tasks}",
                timeout=120000,
            )
            out.append((time.perf_counter() - started) * 1000)
            view.close()
        browser.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--page", action="store_true", help="time the page's fleet view too")
    parser.add_argument("--quick", action="store_true", help="10 tasks of 5 runs, once")
    parser.add_argument("--jobs", type=int, default=1, help="processes that build the root")
    parser.add_argument("--index-only", action="store_true", help="time the index alone (at a "
                        "million runs the old path's scrape takes many minutes)")  # fmt: skip
    parser.add_argument("--root", type=Path, help="a root this bench built before (kept; its "
                        "index is removed first), instead of building one")  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.runs, args.repeat = 10, 5, 1
    with tempfile.TemporaryDirectory(prefix="bench-list-") as tmp:
        root = Path(tmp) / "runs"
        total = args.tasks * args.runs
        if args.root is not None:
            root = args.root
            for found in root.glob(".index.sqlite*"):
                found.unlink()
            print(f"the root {root}, {total:,} runs over {args.tasks:,} tasks as built before")
        else:
            started = time.perf_counter()
            build(root, real_run(Path(tmp)), args.tasks, args.runs, args.jobs)
            took = time.perf_counter() - started
            print(f"built {total:,} runs over {args.tasks:,} tasks as the supervisor writes them "
                  f"in {took:.0f} s")  # fmt: skip
        print(f"load average {os.getloadavg()[0]:.1f}")
        skip: dict[str, list[float]] = {k: [] for k in ("api", "scrape_first", "scrape", "page")}
        old_cli = [] if args.index_only else timed(listing(root, tmp, args.tasks, OFF), args.repeat)
        first_cli = timed(listing(root, tmp, args.tasks, {}), 1)  # builds the index
        warm_cli = timed(listing(root, tmp, args.tasks, {}), args.repeat)
        # Every run read: a scrape of 100,000 takes most of a minute, so twice is enough.
        old = skip if args.index_only else served(root, tmp, OFF, args, min(args.repeat, 2))
        new = served(root, tmp, {}, args, args.repeat)
        index_size = (root / ".index.sqlite").stat().st_size

        # Said before the root goes: a million runs take minutes to remove.
        def row(name: str, before: list[float], after: list[float], goal: str) -> None:
            a = statistics.median(after)
            if not before:  # --index-only
                print(f"{name:<38} {'-':>9} {a:>9.0f} {'-':>8}  {goal}")
                return
            b = statistics.median(before)
            print(f"{name:<38} {b:>9.0f} {a:>9.0f} {b / a:>7.1f}x  {goal}")

        print(f"{'median, ms':<38} {'every run':>9} {'index':>9} {'ratio':>8}  goal (index)")
        row("run-agent list --json (process)", old_cli, warm_cli, "< 300")
        row("  the first, building the index", old_cli, first_cli, "once")
        row("GET /api/tasks (warm server)", old["api"], new["api"], "< 100")
        row(
            "GET /metrics, a server's first scrape",
            old["scrape_first"],
            new["scrape_first"],
            "< 3,000",
        )
        row("GET /metrics, later scrapes", old["scrape"], new["scrape"], "< 300")
        if args.page:
            row("page: the fleet view on screen", old["page"], new["page"], "< 1,000")
        print(f"the index: {index_size / 1e6:.1f} MB for {total:,} runs")


if __name__ == "__main__":
    main()
