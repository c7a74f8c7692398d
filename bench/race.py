"""Races, measured: who wins, how fast the losers go, what is left, and the shared budget.

Judging: --races races (`run-agent run --agents wrong,right,late --check ...`, in the
foreground, in a git repository) of three agents that all say they are done at every attempt,
where only `right`'s answer passes the check, on its second attempt. For each race: whether
`right` won; from the winner's run's end (run-info.yaml) to the last moment a loser's process
(supervisor, reaper, agent or check) was seen in the process table, sampled every 10 ms; and
the processes of the bench's folder left once the command returned.

Budget: --budget-races races of three agents that each report 1,000 tokens every 0.5 s (as codex
turns) under `--budget 5000tokens`: what the three spent together, against the budget.

Nothing asserts on speed. Its folder (a repository, a config, a runs root) goes at the end.

    python bench/race.py [--races 20] [--budget-races 5] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from runagent.store import race  # noqa: E402
from runagent.store.runfolder import TaskPaths, read_run_info  # noqa: E402

FAKE = REPO / "tests" / "fake_agent.py"
GIT_ENV = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid",
           "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.invalid",
           "GIT_CONFIG_NOSYSTEM": "1"}  # fmt: skip
CHECK = "grep -qx 'edited by attempt 2' answer.txt"
GOAL_GONE = 1.0  # seconds from the win to no loser's process left


def run_agent() -> list[str]:
    launcher = Path(sys.executable).with_name("run-agent")
    return [str(launcher)] if launcher.exists() else [sys.executable, "-m", "runagent"]


def agent(folder: Path, marker: str, *args: str) -> list[str]:
    return [sys.executable, str(FAKE), "--marker", f"{folder}/{marker}", *args]


def setup(folder: Path) -> tuple[Path, Path, Path]:
    """A repository, a config of the racing agents and a runs root."""
    repo = folder / "repo"
    repo.mkdir()
    env = {**os.environ, **GIT_ENV}
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True, env=env)
    (repo / "README").write_text("a repository\n")
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "start"], check=True, env=env)
    turns = ["--ignore-unknown", "--codex-usage", "1000", "--usage-lines", "60", "--interval",
             "0.5"]  # fmt: skip
    config = {
        "agents": {
            "wrong": {"type": "command", "command": agent(folder, "wrong", "--edit", "other.txt",
                                                          "--sleep", "0.2")},
            "right": {"type": "command", "command": agent(folder, "right", "--counter", "tries",
                                                          "--edit", "answer.txt")},
            "late": {"type": "command", "command": agent(folder, "late", "--edit", "other.txt",
                                                         "--sleep", "0.5")},
            "spender": {"type": "codex", "command": agent(folder, "spender", *turns)},
        },
        "defaults": {"agent": "right", "max_restarts": 20, "restart_delay": "50ms",
                     "restart_delay_max": "200ms", "kill_grace": "1s", "stuck_after": 0,
                     "crash_loop_runs": 0},
        "storage": {"runs_dir": str(folder / "runs")},
    }  # fmt: skip
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return repo, path, folder / "runs"


class Sampler:
    """The process table every 10 ms: when a process naming `words` was last seen."""

    def __init__(self, words: tuple[str, ...]) -> None:
        self.words = words
        self.last: float | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for proc in psutil.process_iter(["cmdline"]):
                try:
                    line = " ".join(proc.info["cmdline"] or [])
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                if any(word in line for word in self.words):
                    self.last = time.time()
                    break
            self.stop.wait(0.01)

    def close(self) -> float | None:
        self.stop.set()
        self.thread.join()
        return self.last


def left(folder: Path) -> list[str]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            line = " ".join(proc.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if str(folder) in line and proc.pid != os.getpid():
            found.append(line[:120])
    return found


def seconds(iso: str | None) -> float:
    from datetime import datetime

    return datetime.fromisoformat(str(iso)).timestamp()


def one_race(folder: Path, repo: Path, config: Path, root: Path, n: int) -> tuple[bool, float]:
    """One judged race: whether `right` won, and the seconds from its win to the last loser's
    process seen."""
    task = f"r{n}"
    losers = (f"{folder}/wrong", f"{folder}/late", f"--task {task}.wrong", f"--task {task}.late")
    sampler = Sampler(losers)
    done = subprocess.run(
        [*run_agent(), "--config", str(config), "--root", str(root), "-p", "bench", "-t", task,
         "--agents", "wrong,right,late", "--check", CHECK, "-q", "race"],
        cwd=repo, env={**os.environ, **GIT_ENV}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    last = sampler.close()
    record = race.read(TaskPaths(root, "bench", task))
    won = done.returncode == 0 and record is not None and record.winner == f"{task}.right"
    winner = TaskPaths(root, "bench", f"{task}.right")
    info = read_run_info(winner.run_folder(winner.run_ids()[-1])) if winner.run_ids() else None
    end = seconds(info.end_time) if info is not None and info.end_time else time.time()
    return won, max(0.0, (last or end) - end)


def one_budget(repo: Path, config: Path, root: Path, n: int) -> int:
    """One race under a shared budget of 5,000 tokens: what its three racers spent together."""
    task = f"b{n}"
    subprocess.run(
        [*run_agent(), "--config", str(config), "--root", str(root), "-p", "bench", "-t", task,
         "--agent", "spender", "--race", "3", "--check", "true", "--budget", "5000tokens", "-q",
         "spend"],
        cwd=repo, env={**os.environ, **GIT_ENV}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    spent = 0
    for racer in range(1, 4):
        paths = TaskPaths(root, "bench", f"{task}.{racer}")
        for run_id in paths.run_ids():
            info = read_run_info(paths.run_folder(run_id))
            spent += (info.tokens_in or 0) if info is not None else 0
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--races", type=int, default=20)
    parser.add_argument("--budget-races", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 races and 1 budget race")
    args = parser.parse_args()
    races, budgets = (2, 1) if args.quick else (args.races, args.budget_races)
    folder = Path(tempfile.mkdtemp(prefix="run-agent-bench-race-", dir="/var/tmp"))
    try:
        repo, config, root = setup(folder)
        results = [one_race(folder, repo, config, root, n) for n in range(races)]
        leftover = left(folder)
        spent = [one_budget(repo, config, root, n) for n in range(budgets)]
        leftover += left(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    gone = [g for _, g in results]
    wins = sum(w for w, _ in results)
    load = os.getloadavg()[0]
    print(f"race bench, load {load:.1f} on {os.cpu_count()} cores")
    print(f"{'measure':<44} {'figure':>22}  goal")
    print(f"{'the racer whose check passes won':<44} {f'{wins} of {races}':>22}  every time")
    print(
        f"{'win to losers gone, median / max (s)':<44} "
        f"{f'{statistics.median(gone):.3f} / {max(gone):.3f}':>22}  under {GOAL_GONE:g} s"
    )
    print(f"{'processes left':<44} {len(leftover):>22}  0")
    shown = ", ".join(f"{s:,}" for s in spent)
    print(
        f"{'3 racers spent together, budget 5,000':<44} {shown:>22}  "
        f"past it by no more than one report per racer ({5000 + 3 * 1000:,})"
    )
    print("  (each racer publishes its spend and reads its fellows' every 0.2 s, and the first")
    print("  report that takes their sum past the budget stops the racer that makes it; what")
    print("  the others reported meanwhile, already spent, counts too)")
    for line in leftover:
        print(f"  left: {line}")


if __name__ == "__main__":
    main()
