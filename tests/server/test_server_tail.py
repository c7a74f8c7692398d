"""The SSE fan-out shares one read and one encoding per change, and keeps every guarantee:
many clients at different offsets, a reconnect mid-file, a slow client. Real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from runagent.store import runfolder, taskfolder
from runagent.store.pids import process_start_time
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import RunInfo, RunStatus
from server import tail
from server.app import Settings, create_app
from server.hub import Hub
from tests import sse
from tests.conftest import Server, Workspace, free_port, wait_for
from tests.server.test_server_streams import start_task

RUN_ID = "20260101-000000000-1"


def running_run(root: Path) -> tuple[Path, RunInfo]:
    """A run whose supervisor is this test process, so it reads as running until marked done."""
    task = TaskPaths(root, "p", "t")
    folder = runfolder.create_run_folder(task, RUN_ID)
    taskfolder.write_task_prompt(task, "x")
    info = RunInfo(RUN_ID, "p", "t", 1, "fake", "command", "2026-01-01T00:00:00+00:00",
                   str(root), supervisor_pid=os.getpid(),
                   supervisor_start=process_start_time(os.getpid()))  # fmt: skip
    runfolder.write_run_info(folder, info)
    return folder, info


@contextlib.contextmanager
def serving_in_process(root: Path) -> Iterator[tuple[str, Hub]]:
    """The app under uvicorn in a thread of this process, so a test can look at its hub."""
    port = free_port()
    app = create_app(Settings(root=root))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, what="uvicorn")
        yield f"http://127.0.0.1:{port}", app.state.hub
    finally:
        server.should_exit = True
        thread.join(30)
    assert not thread.is_alive()


class Client:
    """An SSE client in a thread: what it received, and the ids that came with it."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.received = b""
        self.start = int((headers or {}).get("Last-Event-ID", "0"))
        self.ids: list[str] = []
        self.ended = False
        self.status = False  # a status event came: the stream is up
        self.error: BaseException | None = None
        self.stop_after: int | None = None  # bytes after which to hang up
        self._thread = threading.Thread(target=self._run, args=(url, headers), daemon=True)
        self._thread.start()

    def _run(self, url: str, headers: dict[str, str] | None) -> None:
        try:
            for message in sse.stream(url, headers=headers, timeout=60):
                if message.event == "data":
                    self.received += str(message.json()).encode()
                    assert message.id == str(self.start + len(self.received)), message.id
                    self.ids.append(message.id)
                    if self.stop_after is not None and len(self.received) >= self.stop_after:
                        return
                elif message.event == "status":
                    self.status = True
                elif message.event == "end":
                    assert message.id == str(self.start + len(self.received))
                    self.ended = True
        except BaseException as exc:  # reported by join()
            self.error = exc

    def join(self) -> None:
        self._thread.join(60)
        assert not self._thread.is_alive(), "the client did not finish"
        assert self.error is None, repr(self.error)


def test_clients_at_the_same_offset_share_one_read_of_each_chunk(ws: Workspace) -> None:
    folder, info = running_run(ws.root)
    stdout = runfolder.RunPaths(folder).stdout
    with serving_in_process(ws.root) as (base, hub):
        shared = hub.tail(
            stdout, "", runfolder.RunPaths(folder).fence
        )  # held here, so it outlives the streams for the count
        url = f"{base}/api/projects/p/tasks/t/runs/{RUN_ID}/stream/stdout"
        clients = [Client(url) for _ in range(20)]
        wait_for(lambda: all(c.status for c in clients), what="every stream to be up")
        # Appends one at a time, each seen by every client before the next: "é" and "€" are
        # each split across two writes and must wait there, whole.
        writes = [f"line {i}\n".encode() for i in range(10)]
        writes += [b"\xc3", b"\xa9\n", b"\xe2\x82", b"\xac\n", b"last\n"]
        written = b""
        for data in writes:
            with stdout.open("ab") as f:
                f.write(data)
            written += data
            whole = written.decode("utf-8", "ignore").encode()
            wait_for(lambda: all(c.received == whole for c in clients), what="every client")  # noqa: B023
        runfolder.write_run_info(folder, info.replace(status=RunStatus.COMPLETED, exit_code=0))
        for client in clients:
            client.join()
            assert client.ended and client.received == stdout.read_bytes()
        chunks = {i for c in clients for i in c.ids}
        assert clients[0].ids == sorted(chunks, key=int)  # all got the same chunks...
        # ...and each was read from the file once; each of the two writes that ends inside a
        # character is read once more if the server looks before the rest comes (a loaded
        # machine), by whichever client wakes first: the others wait without reading.
        assert len(chunks) <= shared.reads <= len(chunks) + 2


def test_many_clients_at_different_offsets_each_get_exactly_their_bytes(
    ws: Workspace, server: Server
) -> None:
    chunks = ["c3", "a90a", "e282", "ac0a", "0d", "6c617374", "0a"]
    ws.write_config(["--lines", "60", "--interval", "0.03", "--chunks", *chunks], max_restarts=0)
    start_task(server)
    run_id = wait_for(lambda: ws.task().run_ids(), what="the run")[0]
    stdout = ws.task().run(run_id).stdout
    url = f"{server.url}/api/projects/p/tasks/t/runs/{run_id}/stream/stdout"
    clients: list[Client] = []
    # While the agent writes, clients join at 0 and at whatever line ends the file by then.
    for wanted in range(0, 40, 4):
        # The run's folder comes before its stdout file: on a loaded machine, there is a moment
        # when only the folder is there.
        wait_for(lambda: stdout.is_file() and stdout.read_bytes().count(b"\n") >= wanted,  # noqa: B023
                 what=f"{wanted} lines")  # fmt: skip
        ends = [m.end() for m in re.finditer(b"\n", stdout.read_bytes())][:wanted]
        offset = ends[-1] if ends else 0
        clients.append(Client(url, {"Last-Event-ID": str(offset)}))
        clients.append(Client(url))
    # One client hangs up mid-file and comes back with the id it got last.
    dropping = Client(url)
    dropping.stop_after = 200
    dropping.join()
    last = dropping.ids[-1]
    back = Client(url, {"Last-Event-ID": last})
    for client in [*clients, back]:
        client.join()
        assert client.ended
    whole = stdout.read_bytes()
    assert whole.endswith(bytes.fromhex("".join(chunks)))
    for client in clients:
        assert client.received == whole[client.start :], client.start
    assert dropping.received + back.received == whole
    assert len({c.start for c in clients}) > 2


def test_a_slow_client_gets_every_byte_and_holds_up_no_one(ws: Workspace, server: Server) -> None:
    text = "x" * 199
    lines = 40_000  # 8 MB, several times what the tail keeps and what the sockets hold
    ws.write_config(["--lines", str(lines), "--line-text", text], max_restarts=0)
    start_task(server)
    run_id = wait_for(lambda: ws.task().run_ids(), what="the run")[0]
    path = f"/api/projects/p/tasks/t/runs/{run_id}/stream/stdout"
    # The slow client asks, then reads nothing while the agent writes everything.
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    host, port = server.url.removeprefix("http://").split(":")
    slow.connect((host, int(port)))
    try:
        slow.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        fast = Client(f"{server.url}{path}")
        fast.join()
        whole = ws.task().run(run_id).stdout.read_bytes()
        assert fast.ended and fast.received == whole and len(whole) >= lines * 200
        # Now the slow client reads: all of it, in order, the ids the offsets.
        raw = bytearray()
        slow.settimeout(30)
        while not raw.endswith(b"\r\n\r\n") or b"event: end\r\n" not in raw[-4096:]:
            data = slow.recv(1 << 20)
            assert data, "the server closed the slow client's stream"
            raw += data
    finally:
        slow.close()
    body = raw.split(b"\r\n\r\n", 1)[1]  # past the response's headers
    received = b""
    for message in sse.parse(iter(dechunk(body).decode().split("\r\n"))):
        if message.event == "data":
            received += str(message.json()).encode()
            assert message.id == str(len(received))
    assert received == whole


def dechunk(body: bytes) -> bytes:
    """The payload of an HTTP/1.1 chunked body."""
    out = bytearray()
    while body:
        size, _, body = body.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out += body[:n]
        body = body[n + 2 :]
    return bytes(out)


def test_a_tail_keeps_no_more_than_its_bound(tmp_path: Path) -> None:
    path = tmp_path / "stdout"
    path.write_bytes(("€" * 40_000 + "\n").encode() * 60)  # 7 MB; chunks end inside a "€"
    shared = tail.Tail(path, "", str(tmp_path.resolve()))
    size = shared.size(0)
    offset, text, chunks = 0, "", 0
    while (chunk := shared.chunk_at(offset, size)) is not None:
        assert chunk.start == offset and chunk.end - offset <= tail.CHUNK
        offset, chunks = chunk.end, chunks + 1
        text += json.loads(chunk.data)
        count, kept = shared.kept()
        assert kept <= tail.KEEP_BYTES and count >= 1
        assert shared.chunk_at(chunk.start, size) is chunk  # kept: the next client shares it
    assert offset == size and text.encode() == path.read_bytes()
    assert shared.reads == chunks
    assert shared.chunk_at(0, size) is not None and shared.reads == chunks + 1  # long gone
