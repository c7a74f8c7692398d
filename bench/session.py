"""What a second attempt sends the model when it continues the first attempt's session against
one that starts a fresh session with the failure's tail: the real claude, codex and gemini CLIs
against the fake model provider of the tests (tests/fake_models.py on 127.0.0.1).

Each task is `run-agent -p bench -t T --check CHECK --session continue|fresh` of one CLI: its
first attempt calls the shell tool, answers, and its check fails once; the second attempt is
the one measured. For it, the requests the CLI sent the provider (each carries the run's id in
its new message) are read: the conversation they carry (claude's `messages`, codex's `input`,
gemini's `contents`: the system prompt and the tools, the same in both, set apart), the whole
body, and the new message itself (the run's prompt.md). Tokens are estimated at 4 bytes each:
the fake provider reports fixed counts, so the figures are bytes sent. A provider's prompt
cache makes the part of a continued conversation it has seen before cheaper than new input;
the fake one has none, so that is not in the figures.

    python bench/session.py [--repeat 1] [--only claude] [--quick]

Needs the CLIs in .cache/agent-clis (as `.ci/run` installs them) or RUN_AGENT_TEST_CLIS.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runagent.store.runfolder import TaskPaths, read_run_info  # noqa: E402
from tests.fake_models import FakeModelServer  # noqa: E402

BIN = Path(os.environ.get("RUN_AGENT_TEST_CLIS") or REPO / ".cache/agent-clis/node_modules/.bin")
CLIS = ("claude", "codex", "gemini")
MODELS = {"claude": "claude-fake", "codex": "gpt-5.5", "gemini": "gemini-3.8-flash"}
CONVERSATION = {"claude": "messages", "codex": "input", "gemini": "contents"}
PROMPT = "Say hello, then write fake_tool_output.txt."
ONCE = (
    "import os, sys; e = os.path.exists('checked'); open('checked', 'a').close(); sys.exit(1 - e)"
)


def config(private: Path, root: Path, provider: FakeModelServer, cli: str) -> dict[str, Any]:
    for name in ("home", "tmp", "codex-home"):
        (private / name).mkdir(parents=True, exist_ok=True)
    env = {"HOME": str(private / "home"), "TMPDIR": str(private / "tmp"),
           "CODEX_HOME": str(private / "codex-home"), "CLAUDE_CODE_MAX_RETRIES": "0"}  # fmt: skip
    agent: dict[str, Any] = {
        "type": cli, "command": [str(BIN / cli)], "token": "fake-key-for-bench", "env": env,
        "base_url": provider.base_url + ("/v1" if cli == "codex" else ""), "model": MODELS[cli],
    }  # fmt: skip
    if cli == "codex":
        agent["args"] = ["-c", "analytics.enabled=false", "-c", "features.plugins=false"]
    return {
        "agents": {cli: agent},
        "defaults": {"agent": cli, "max_restarts": 1, "restart_delay": "100ms",
                     "timeout": "120s", "kill_grace": "2s", "stuck_after": 0},
        "storage": {"runs_dir": str(root)},
    }  # fmt: skip


def one(base: Path, cli: str, session: str, n: int, env: dict[str, str]) -> dict[str, Any]:
    folder = base / f"{cli}-{session}-{n}"
    root, work = folder / "runs", folder / "work"
    work.mkdir(parents=True)
    with FakeModelServer(scenario="tool") as provider:
        cfg = folder / "config.yaml"
        cfg.write_text(yaml.safe_dump(config(folder / "private", root, provider, cli)))
        done = subprocess.run(
            [sys.executable, "-m", "runagent", "--config", str(cfg), "-p", "bench", "-t", "t",
             "--cwd", str(work), "--check", f"{sys.executable} -c {json.dumps(ONCE)}",
             "--session", session, PROMPT],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        requests = [r.body for r in provider.requests if r.method == "POST" and r.body]
    task = TaskPaths(root, "bench", "t")
    infos = [read_run_info(task.run_folder(r)) for r in task.run_ids()]
    if done.returncode != 0 or len(infos) != 2 or infos[1] is None:
        raise SystemExit(f"bench/session.py: {cli} {session} did not run as planned:\n"
                         f"{done.stderr[-2000:]}")  # fmt: skip
    second = infos[1]
    mine = [b for b in requests if second.run_id in json.dumps(b)]
    key = CONVERSATION[cli]
    return {
        "requests": len(mine),
        "conversation": sum(len(json.dumps(b.get(key, ""))) for b in mine),
        "whole": sum(len(json.dumps(b)) for b in mine),
        "message": len(task.run(second.run_id).prompt.read_bytes()),
        "resumed": second.resumed_run_id is not None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--only", choices=CLIS, action="append")
    parser.add_argument("--quick", action="store_true", help="claude alone (for the tests)")
    args = parser.parse_args()
    if args.quick:
        args.only = ["claude"]
    wanted = args.only or list(CLIS)
    missing = [cli for cli in wanted if not (BIN / cli).exists()]
    if missing:
        sys.exit(f"bench/session.py: {', '.join(missing)} not in {BIN}: npm install them as "
                 ".ci/run does")  # fmt: skip
    # gemini refuses a settings folder under a world-writable one (/tmp): the cache is private.
    cache = Path.home() / ".cache" / f"run-agent-bench-{uuid.uuid4().hex[:8]}"
    cache.mkdir(parents=True, mode=0o700)
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="run-agent-bench-session-") as tmp:
            env = {**os.environ, "XDG_CACHE_HOME": str(cache), "RUN_AGENT_NO_CACHE": "1"}
            for cli in wanted:
                for session in ("continue", "fresh"):
                    results[cli, session] = [
                        one(Path(tmp), cli, session, n, env) for n in range(args.repeat)
                    ]
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(
        "what the second attempt sent the model, continuing the first attempt's session beside "
        f"a fresh one (median of {args.repeat}; bytes, ~tokens at 4 bytes each)"
    )
    print(f"  {'cli':<7} {'session':<9} {'requests':>8} {'new message':>16} "
          f"{'conversation':>18} {'whole requests':>18}")  # fmt: skip
    for (cli, session), runs in results.items():

        def med(key: str, runs: list[dict[str, Any]] = runs) -> int:
            return round(statistics.median(r[key] for r in runs))

        figures = [f"{med(k):>8,} (~{med(k) // 4:,})" for k in ("message", "conversation")]
        whole = f"{med('whole'):>9,} (~{med('whole') // 4:,})"
        resumed = "" if all(r["resumed"] for r in runs) == (session == "continue") else " (!)"
        print(f"  {cli:<7} {session:<9} {med('requests'):>8} {figures[0]:>16} "
              f"{figures[1]:>18} {whole:>18}{resumed}")  # fmt: skip


if __name__ == "__main__":
    main()
