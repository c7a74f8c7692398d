"""Latency from an append to a run file to its arrival at SSE clients, beside a 500 ms poller.

Starts `run-agent serve` on 127.0.0.1, makes a running run, appends timestamped lines to its
stdout, and measures when each line reaches every SSE client (1, then 100 at once), and when a
tail that polls every 500 ms (the interval of the most used tool of this kind) would see it.
The clients run in this process, on the same cores as the server, so their own parsing (about as
much CPU as the server's sending, by py-spy) is in the figures: a browser elsewhere costs nothing.

    python bench/sse_latency.py [--lines 200] [--interval 0.02] [--clients 1 100] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.serving import serving  # noqa: E402
from runagent.store import runfolder, taskfolder  # noqa: E402
from runagent.store.pids import process_start_time  # noqa: E402
from runagent.store.runfolder import TaskPaths  # noqa: E402
from runagent.store.runinfo import RunInfo  # noqa: E402

POLL_INTERVAL = 0.5


def make_running_run(root: Path) -> Path:
    task = TaskPaths(root, "bench", "latency")
    folder = runfolder.create_run_folder(task, "20260101-000000000-1")
    taskfolder.write_task_prompt(task, "bench")
    info = RunInfo("20260101-000000000-1", "bench", "latency", 1, "bench", "command",
                   "2026-01-01T00:00:00+00:00", str(root), supervisor_pid=os.getpid(),
                   supervisor_start=process_start_time(os.getpid()))  # fmt: skip
    runfolder.write_run_info(folder, info)
    return folder


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def client(url: str, lines: int, arrivals: list[float], ready: asyncio.Event) -> None:
    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(120)) as http,
        http.stream("GET", url) as response,
    ):
        ready.set()
        buffer, got, event = "", 0, ""
        async for line in response.aiter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event == "data":
                now = time.time()
                buffer += json.loads(line[5:].strip())
                while "\n" in buffer:
                    text, buffer = buffer.split("\n", 1)
                    if text.startswith("t="):
                        arrivals.append((now - float(text[2:])) * 1000)
                        got += 1
                if got >= lines:
                    return


def poller(path: Path, offset: int, lines: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """What a tail polling every 500 ms sees (in a process of its own, so nothing starves it)."""
    latencies: list[float] = []
    buffer = b""
    deadline = time.monotonic() + 300
    while len(latencies) < lines and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL)
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
        now = time.time()
        offset += len(data)
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.startswith(b"t="):
                latencies.append((now - float(line[2:])) * 1000)
    out.put(latencies)


async def measure(url: str, stdout: Path, clients: int, lines: int, interval: float) -> dict:
    arrivals: list[list[float]] = [[] for _ in range(clients)]
    readies = [asyncio.Event() for _ in range(clients)]
    offset = stdout.stat().st_size
    tasks = [asyncio.create_task(client(f"{url}?from={offset}", lines, arrivals[i], readies[i]))
             for i in range(clients)]  # fmt: skip
    await asyncio.gather(*(r.wait() for r in readies))
    await asyncio.sleep(0.5)
    results: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    poll_process = multiprocessing.Process(target=poller, args=(stdout, offset, lines, results))
    poll_process.start()
    await asyncio.sleep(0.2)
    with open(stdout, "a") as f:
        for _ in range(lines):
            f.write(f"t={time.time():.6f}\n")
            f.flush()
            await asyncio.sleep(interval)
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)
    polled = results.get(timeout=60)
    poll_process.join()
    sse = [v for a in arrivals for v in a]
    return {"clients": clients, "sse": sse, "poll": polled}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--interval", type=float, default=0.02)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 100])
    parser.add_argument(
        "--quick", action="store_true", help="20 lines to 1 and to 10 clients (for the tests)"
    )
    args = parser.parse_args()
    if args.quick:
        args.lines, args.clients = 20, [1, 10]
    with tempfile.TemporaryDirectory(prefix="bench-sse-") as tmp:
        root = Path(tmp) / "runs"
        folder = make_running_run(root)
        with serving(root, tmp) as base:
            url = f"{base}/api/projects/bench/tasks/latency/runs/{folder.name}/stream/stdout"
            stdout = runfolder.RunPaths(folder).stdout
            print(
                f"append -> arrival latency, {args.lines} lines every {args.interval * 1000:g} ms"
            )
            print(f"{'clients':>8} {'SSE p50':>9} {'SSE p99':>9} {'poll p50':>9} {'poll p99':>9}"
                  f" {'p50 ratio':>10}")  # fmt: skip
            for n in args.clients:
                r = asyncio.run(measure(url, stdout, n, args.lines, args.interval))
                sse50, sse99 = percentile(r["sse"], 50), percentile(r["sse"], 99)
                poll50, poll99 = percentile(r["poll"], 50), percentile(r["poll"], 99)
                print(f"{n:>8} {sse50:>7.1f}ms {sse99:>7.1f}ms {poll50:>7.1f}ms {poll99:>7.1f}ms"
                      f" {poll50 / sse50:>9.1f}x")  # fmt: skip
                print(f"{'':>8} ({len(r['sse'])} SSE arrivals, mean "
                      f"{statistics.mean(r['sse']):.1f} ms)")  # fmt: skip
            print("goal: SSE p50 under 20 ms and p99 under 100 ms, with 1 and with 100 clients")


if __name__ == "__main__":
    main()
