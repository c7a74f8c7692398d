"""Budget overshoot: from the usage event that crossed a task's budget to no process of the
agent's tree alive, with the real claude, codex and gemini CLIs against the fake model provider
of the tests (tests/fake_models.py on 127.0.0.1), and the fake agent beside them.

Each run is `run-agent -p bench -t T --budget Ntokens` of one agent. A sampler reads the run's
stdout every 5 ms and, with the agent's own backend, the usage it reports so far (what run-agent
reads too); the moment that first crosses the budget is the event. It samples the agent's process
tree (the run's `pid` and every descendant ever seen) at the same pace; the first sample with none
alive ends the overshoot. claude reports each message's tokens as it starts, so its budget is
crossed mid-run (the provider asks for a tool call on every turn, for ever); codex and gemini
report usage at the end of their turn only, so theirs is crossed by their last line, and the
figure is how soon the tree is gone after it. The fake agent prints a codex turn every 0.1 s and
would sleep a minute after.

    python bench/budget.py [--repeat 3] [--only claude] [--quick]

Needs the CLIs in .cache/agent-clis (as `.ci/run` installs them) or RUN_AGENT_TEST_CLIS.
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
import uuid
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import backends  # noqa: E402
from runagent.config.settings import AgentConfig  # noqa: E402
from runagent.loop.context import RunContext  # noqa: E402
from runagent.store.runfolder import RunPaths, TaskPaths  # noqa: E402
from runagent.store.runinfo import Usage  # noqa: E402
from tests.fake_models import FakeModelServer  # noqa: E402

BIN = Path(os.environ.get("RUN_AGENT_TEST_CLIS") or REPO / ".cache/agent-clis/node_modules/.bin")
MODELS = {"claude": "claude-fake", "codex": "gpt-5.5", "gemini": "gemini-3.8-flash"}
# The scenario each CLI runs, and a budget its usage crosses part of the way through.
PLAN = {
    "claude": ("tool_forever", 40),  # 11 tokens a message: crossed by the 4th
    "codex": ("tool", 10),  # its one turn reports 60: crossed by turn.completed
    "gemini": ("tool", 10),  # its result reports 45
    "fake": ("", 3500),  # 1,000 a turn: crossed by the 4th of 50
}
SAMPLE = 0.005


def config(work: Path, root: Path, provider: FakeModelServer) -> dict[str, Any]:
    private = {name: work / name for name in ("home", "tmp", "codex-home")}
    for folder in private.values():
        folder.mkdir(parents=True, exist_ok=True)
    env = {"HOME": str(private["home"]), "TMPDIR": str(private["tmp"]),
           "CODEX_HOME": str(private["codex-home"]), "CLAUDE_CODE_MAX_RETRIES": "0"}  # fmt: skip
    agents: dict[str, Any] = {
        cli: {"type": cli, "command": [str(BIN / cli)], "token": "fake-key-for-bench",
              "base_url": provider.base_url + ("/v1" if cli == "codex" else ""),
              "model": MODELS[cli], "env": env}
        for cli in MODELS
    }  # fmt: skip
    agents["codex"]["args"] = ["-c", "analytics.enabled=false", "-c", "features.plugins=false"]
    fake = [
        sys.executable,
        str(REPO / "tests" / "fake_agent.py"),
        "--ignore-unknown",
        "--codex-usage",
        "1000",
        "--usage-lines",
        "50",
        "--interval",
        "0.1",
        "--sleep",
        "60",
    ]
    agents["fake"] = {"type": "codex", "command": fake}
    return {
        "agents": agents,
        "defaults": {"agent": "fake", "max_restarts": 0, "timeout": "120s", "kill_grace": "2s",
                     "stuck_after": 0},
        "storage": {"runs_dir": str(root)},
    }  # fmt: skip


class Sampler(threading.Thread):
    """Watches one run: when its reported usage first crosses `budget`, and when its agent's
    tree (every process ever seen under the run's pid) is gone after that."""

    def __init__(self, task: TaskPaths, agent: str, budget: int) -> None:
        super().__init__(daemon=True)
        self.task, self.budget = task, budget
        self.backend = backends.create(AgentConfig(name=agent, type=agent if agent != "fake"
                                                   else "codex"))  # fmt: skip
        self.crossed_at: float | None = None
        self.gone_at: float | None = None
        self.used: Usage | None = None
        self.seen: dict[int, float] = {}
        self.done = threading.Event()

    def run(self) -> None:
        ctx, pid = None, None
        while not self.done.is_set():
            now = time.monotonic()
            if ctx is None:
                ctx, pid = self._run_started()
            if ctx is not None and pid is not None:
                self._look(pid)
                if self.crossed_at is None:
                    used = self.backend.usage(ctx)
                    if used is not None and used.tokens > self.budget:
                        self.crossed_at, self.used = now, used
                elif not self._alive():
                    self.gone_at = now
                    return
            time.sleep(SAMPLE)

    def _run_started(self) -> tuple[RunContext | None, int | None]:
        ids = self.task.run_ids() if self.task.folder.is_dir() else []
        if not ids:
            return None, None
        folder = self.task.run_folder(ids[-1])
        try:
            info = yaml.safe_load((folder / "run-info.yaml").read_text()) or {}
        except (OSError, yaml.YAMLError):  # not written yet, or being replaced
            return None, None
        if not isinstance(info, dict) or not info.get("pid"):
            return None, None
        ctx = RunContext(ids[-1], self.task, "", folder, RunPaths(folder), {})
        return ctx, int(info["pid"])

    def _look(self, pid: int) -> None:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        for proc in procs:
            try:
                self.seen.setdefault(proc.pid, proc.create_time())
            except psutil.Error:
                pass

    def _alive(self) -> bool:
        for pid, created in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    return True
            except psutil.Error:
                continue
        return False


def one(
    cfg: Path, root: Path, work: Path, agent: str, n: int, env: dict[str, str]
) -> dict[str, Any]:
    budget = PLAN[agent][1]
    task = TaskPaths(root, "bench", f"{agent}-{n}")
    sampler = Sampler(task, agent, budget)
    sampler.start()
    done = subprocess.run(
        [sys.executable, "-m", "runagent", "--config", str(cfg), "-p", "bench", "-t", task.task_id,
         "--agent", agent, "--cwd", str(work), "--budget", f"{budget}tokens",
         "Say hello, then write fake_tool_output.txt."],
        capture_output=True, text=True, env=env, timeout=240,
    )  # fmt: skip
    sampler.join(10)
    sampler.done.set()
    overshoot = None
    if sampler.crossed_at is not None and sampler.gone_at is not None:
        overshoot = sampler.gone_at - sampler.crossed_at
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    return {
        "exit": done.returncode,
        "overshoot": overshoot,
        "used": sampler.used,
        "processes": len(sampler.seen),
        "said": last,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=list(PLAN), action="append")
    parser.add_argument(
        "--quick", action="store_true", help="1 run of claude and of the fake agent (for the tests)"
    )
    args = parser.parse_args()
    if args.quick:
        args.repeat, args.only = 1, ["claude", "fake"]
    wanted = args.only or list(PLAN)
    missing = [cli for cli in wanted if cli != "fake" and not (BIN / cli).exists()]
    if missing:
        sys.exit(f"bench/budget.py: {', '.join(missing)} not in {BIN}: npm install them as "
                 ".ci/run does, or pass --only fake")  # fmt: skip
    # gemini refuses a settings folder under a world-writable one (/tmp): the cache is private.
    cache = Path.home() / ".cache" / f"run-agent-bench-{uuid.uuid4().hex[:8]}"
    cache.mkdir(parents=True, mode=0o700)
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="run-agent-bench-budget-") as tmp:
            base = Path(tmp)
            root, work = base / "runs", base / "work"
            work.mkdir()
            env = {**os.environ, "XDG_CACHE_HOME": str(cache), "RUN_AGENT_NO_CACHE": "1"}
            for agent in wanted:
                with FakeModelServer(scenario=PLAN[agent][0] or "text") as provider:
                    cfg = base / f"config-{agent}.yaml"
                    cfg.write_text(yaml.safe_dump(config(base / "private", root, provider)))
                    results[agent] = [one(cfg, root, work, agent, n, env)
                                      for n in range(args.repeat)]  # fmt: skip
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(
        f"budget overshoot: usage event that crossed the budget -> no process of the agent's "
        f"tree alive (sampled every {SAMPLE * 1000:.0f} ms), {args.repeat} runs each; goal < 1 s"
    )
    for agent, runs in results.items():
        times = [r["overshoot"] for r in runs if r["overshoot"] is not None]
        exits = sorted({r["exit"] for r in runs})
        used = [r["used"] for r in runs if r["used"] is not None]
        tokens = f"{used[0].tokens} tokens at the event" if used else "-"
        if times:
            figure = (f"median {statistics.median(times) * 1000:.0f} ms, max "
                      f"{max(times) * 1000:.0f} ms")  # fmt: skip
        else:
            figure = "not measured"
        print(
            f"  {agent:<7} {figure}; budget {PLAN[agent][1]} tokens, {tokens}; "
            f"exit {exits}; tree of {max(r['processes'] for r in runs)} processes"
        )
        print(f"          {runs[-1]['said']}")


if __name__ == "__main__":
    main()
