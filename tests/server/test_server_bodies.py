"""A body over the API's limit, sent to a real `run-agent serve` on 127.0.0.1 by what scripts use
(urllib, requests, httpx): each reads the 413 and its one-line error, never a reset connection,
and nothing is started."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import httpx
import pytest
import requests

from tests.conftest import Server, Workspace, serving

MiB = 1024 * 1024
JSON = {"Content-Type": "application/json"}


def by_urllib(url: str, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, headers=JSON, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def by_requests(url: str, body: bytes) -> tuple[int, str]:
    answer = requests.post(url, data=body, headers=JSON, timeout=60)
    return answer.status_code, answer.text


def by_httpx(url: str, body: bytes) -> tuple[int, str]:
    answer = httpx.post(url, content=body, headers=JSON, timeout=60)
    return answer.status_code, answer.text


CLIENTS: dict[str, Callable[[str, bytes], tuple[int, str]]] = {
    "urllib": by_urllib,
    "requests": by_requests,
    "httpx": by_httpx,
}
TOOL_CALL = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {
        "name": "start_task",
        "arguments": {"project": "p", "task": "t", "prompt": "x" * (30 * MiB)},
    },
}
BODIES = {
    "a 30 MiB body": (
        "/api/projects/p/tasks",
        b'{"task_id": "t", "note": "' + b"x" * (30 * MiB) + b'"}',
    ),
    "a 10 MiB prompt": (
        "/api/projects/p/tasks",
        json.dumps({"task_id": "t", "prompt": "x" * (10 * MiB)}).encode(),
    ),
    "a 30 MiB tool call": ("/mcp", json.dumps(TOOL_CALL).encode()),
}


@pytest.mark.parametrize("client", list(CLIENTS))
def test_a_body_over_the_limit_is_a_413_every_client_reads(
    ws: Workspace, server: Server, client: str
) -> None:
    send = CLIENTS[client]
    for what, (path, body) in BODIES.items():
        status, text = send(server.url + path, body)
        assert status == 413, (what, status, text[:300])
        error = json.loads(text)["error"]
        assert error == "the body is over 4 MiB (4194304 bytes); send less"
        assert not ws.task("p", "t").folder.exists(), what  # nothing was started
    # The server goes on answering, on a new connection as on the old.
    assert httpx.get(f"{server.url}/api/health", timeout=10).status_code == 200


def test_a_body_of_unknown_length_or_one_announced_and_held_back_is_refused_too(
    ws: Workspace, server: Server
) -> None:
    def chunks() -> Iterator[bytes]:  # sent chunked: no Content-Length to refuse it by
        yield b'{"task_id": "t", "prompt": "'
        for _ in range(30):
            yield b"x" * MiB
        yield b'"}'

    answer = httpx.post(f"{server.url}/api/projects/p/tasks", content=chunks(), headers=JSON,
                        timeout=60)  # fmt: skip
    assert answer.status_code == 413 and "over 4 MiB" in answer.json()["error"]
    # A client that asks before sending (Expect: 100-continue) gets the answer and sends nothing.
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as conn:
        conn.sendall(f"POST /api/projects/p/tasks HTTP/1.1\r\nHost: {host}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {30 * MiB}\r\n"
                     "Expect: 100-continue\r\n\r\n".encode())  # fmt: skip
        said = b""
        while b"\r\n\r\n" not in said:
            said += conn.recv(65536)
        assert said.startswith(b"HTTP/1.1 413 "), said[:200]
    assert not ws.task("p", "t").folder.exists()


def test_any_refusal_of_a_large_body_is_read_not_only_a_413(ws: Workspace) -> None:
    with serving(ws, env={"RUN_AGENT_API_KEY": "k" * 40}) as url:  # no key sent: a 401
        for send in CLIENTS.values():
            status, text = send(f"{url}/api/projects/p/tasks", b"x" * (30 * MiB))
            assert status == 401 and "missing, wrong" in json.loads(text)["error"], text[:300]
