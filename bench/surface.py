"""What the machine-facing surface costs, side by side in one run against one `run-agent serve`:
the same request with the api_key and with a scoped token (a hash and a look at the token file
per request), and a task's status read over REST and through the MCP tool `task_status` (over
`/mcp`, with the official SDK's client, and over stdio with `run-agent mcp`). Prints medians and
ratios; nothing asserts on speed. The root holds 40 tasks of one run each.

    python bench/surface.py [--requests 200] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import httpx2
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.serving import free_port  # noqa: E402
from runagent.store import tokens  # noqa: E402

KEY = "bench-key-" + "k" * 30


# How long `serve` may take to answer: beside other work on 2 cores it took 29 s to start.
STARTUP_WAIT = 120


def make_root(folder: Path, tasks: int) -> Path:
    root = folder / "runs"
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump({
        "agents": {"echo": {"type": "command", "command": ["bash", "-c", "echo done"]}},
        "defaults": {"agent": "echo", "max_restarts": 0},
        "storage": {"runs_dir": str(root)},
    }))  # fmt: skip
    for n in range(tasks):
        subprocess.run([sys.executable, "-m", "runagent", "-p", "bench", "-t", f"t{n}", "--quiet",
                        "--config", str(config), "go"], cwd=folder, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return config


def timed(*calls: Callable[[], object], count: int) -> list[float]:
    """The median seconds of `count` calls of each of `calls`, taking turns (after 5 each to
    warm up), so neither is favoured by when it ran."""
    for _ in range(5):
        for call in calls:
            call()
    samples: list[list[float]] = [[] for _ in calls]
    for _ in range(count):
        for call, found in zip(calls, samples, strict=True):
            start = time.perf_counter()
            call()
            found.append(time.perf_counter() - start)
    return [statistics.median(found) for found in samples]


async def timed_async(call: Callable[[], Awaitable[object]], count: int) -> float:
    for _ in range(5):
        await call()
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


async def mcp_times(url: str, config: Path, folder: Path, count: int) -> tuple[float, float]:
    from mcp import Client, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client

    args = {"project": "bench", "task": "t7"}
    headers = {"Authorization": f"Bearer {KEY}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client,
    ):
        over_http = await timed_async(lambda: client.call_tool("task_status", args), count)
    command = StdioServerParameters(
        command=sys.executable, args=["-m", "runagent", "mcp", "--config", str(config)],
        cwd=str(folder),
    )  # fmt: skip
    async with Client(command) as client:
        over_stdio = await timed_async(lambda: client.call_tool("task_status", args), count)
    return over_http, over_stdio


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument(
        "--quick", action="store_true", help="10 requests each against 5 tasks (for the tests)"
    )
    options = parser.parse_args()
    if options.quick:
        options.requests, options.tasks = 10, 5
    folder = Path(tempfile.mkdtemp(prefix="run-agent-bench-surface-"))
    server = None
    try:
        config = make_root(folder, options.tasks)
        secret, _ = tokens.create(folder / "runs", tokens.Scope.READ, ["bench"])
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "runagent", "serve", "--port", str(port), "--config",
             str(config)], cwd=folder, env={**os.environ, "RUN_AGENT_API_KEY": KEY},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=30) as client:
            deadline = time.monotonic() + STARTUP_WAIT
            while True:
                try:
                    client.get("/api/health")
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            path = "/api/projects/bench/tasks/t7"
            key = {"Authorization": f"Bearer {KEY}"}
            token = {"Authorization": f"Bearer {secret}"}
            health_key, health_token = timed(
                lambda: client.get("/api/health", headers=key),
                lambda: client.get("/api/health", headers=token),
                count=options.requests,
            )
            (rest,) = timed(lambda: client.get(path, headers=key), count=options.requests)
        over_http, over_stdio = asyncio.run(mcp_times(url, config, folder, options.requests))
        ms = 1000
        print(f"GET /api/health with the api_key: {health_key * ms:.2f} ms median; with a "
              f"project-limited read token: {health_token * ms:.2f} ms "
              f"(x{health_token / health_key:.2f})")  # fmt: skip
        print(
            f"a task's status over REST (GET {path}): {rest * ms:.2f} ms median; the MCP tool "
            f"task_status over /mcp: {over_http * ms:.2f} ms (x{over_http / rest:.2f}); over "
            f"stdio (run-agent mcp): {over_stdio * ms:.2f} ms (x{over_stdio / rest:.2f})"
        )
        print(f"({options.requests} requests each, {options.tasks} tasks in the root)")
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
