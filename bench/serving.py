"""A `run-agent serve` process for the benches: started on a free port, stopped on exit."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serving(
    root: Path, cwd: str, env: dict[str, str] | None = None, wait: bool = True
) -> Iterator[str]:
    """Serve `root` (with `env` added to the environment); yield the base URL once the server
    answers (and, with `wait`, its first listing is warm)."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "runagent", "serve", "--port", str(port), "--root", str(root)],
        cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=os.environ | (env or {}),
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # a loaded machine starts it slowly
        while True:
            try:
                httpx.get(f"{base}/api/tasks" if wait else f"{base}/api/health", timeout=600)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield base
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:  # a request still being answered: never left behind
            server.kill()
            server.wait()
