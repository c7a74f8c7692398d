"""Clients that come and go by the hundred never affect a steady client or the server's shutdown.

A real `run-agent serve`, a real agent writing, steady SSE clients that must each receive every
byte and the `end` event, and raw sockets that connect and drop (after the request, after the
first bytes, or with a reset) while the file grows.
"""

from __future__ import annotations

import socket
import struct
import threading
from urllib.parse import urlsplit

from tests import sse
from tests.conftest import Server, Workspace, wait_for
from tests.server.test_server_streams import start_task

CHURN_CLIENTS = 300
CHURN_THREADS = 6


def drop_in(url: str, path: str, how: int) -> None:
    """Connect, ask for `path`, and go away in one of three ways."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        head = f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept: text/event-stream\r\n"
        sock.sendall(f"{head}\r\n".encode())
        if how == 0:  # gone before the first byte of the answer
            return
        try:
            sock.recv(512)
            if how == 2:  # a reset instead of an orderly close
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass


def test_hundreds_of_clients_dropping_never_freeze_a_steady_client(
    ws: Workspace, server: Server
) -> None:
    go = ws.path / "go"
    ws.write_config(
        ["--lines", "300", "--interval", "0.01", "--line-text", "churn", "--wait-for", str(go)],
        max_restarts=0,
    )
    start_task(server)
    run_id = wait_for(lambda: ws.task().run_ids(), what="the run")[0]
    run_path = f"/api/projects/p/tasks/t/runs/{run_id}/stream/stdout"
    paths = [run_path, "/api/projects/p/tasks/t/stream", "/api/events"]

    received: dict[int, bytes] = {}
    ended: dict[int, bool] = {}

    def steady(n: int, path: str) -> None:
        data, ended[n] = b"", False
        for message in sse.stream(server.url + path, timeout=60):
            if message.event == "data":
                data += str(message.json()).encode()
            elif message.event == "end":
                ended[n] = True
                break
        received[n] = data

    steady_threads = [
        threading.Thread(target=steady, args=(n, path), daemon=True)
        for n, path in enumerate([run_path, run_path, paths[1]])
    ]
    for thread in steady_threads:
        thread.start()

    errors: list[BaseException] = []

    def churn(offset: int) -> None:
        for i in range(offset, CHURN_CLIENTS, CHURN_THREADS):
            try:
                drop_in(server.url, paths[i % len(paths)], i % 3)
            except OSError as exc:  # the server refusing a connection is a failure too
                errors.append(exc)

    churners = [threading.Thread(target=churn, args=(k,)) for k in range(CHURN_THREADS)]
    for thread in churners:
        thread.start()
    for thread in churners:
        thread.join(timeout=120)
    assert not errors, errors[:3]

    go.touch()  # the agent ends; every steady client must now get the rest and `end`
    for thread in steady_threads:
        thread.join(timeout=60)
    expected = ws.task().run(run_id).stdout.read_bytes()
    assert expected.count(b"\n") == 300
    assert all(ended.values()) and len(ended) == 3, ended
    assert [len(received[n]) for n in range(3)] == [len(expected)] * 3
    assert all(received[n] == expected for n in range(3))

    server.process.terminate()
    out, _ = server.process.communicate(timeout=30)
    assert server.process.returncode is not None
    assert "Traceback" not in out and "RuntimeError" not in out, out[-2000:]
