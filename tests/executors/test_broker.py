"""The cluster broker's command side, without a cluster: who it answers (the kernel's word for
the peer), what crosses its socket, and stopping the brokers of a root (tests/e2e/test_cluster.py
runs commands through a real one)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import MappingProxyType

import pytest

from runagent.config.settings import ExecutorSettings, ExecutorType
from runagent.errors import AlreadyRunningError, ExitCode, RunAgentError
from runagent.executors import broker
from runagent.ops.sandbox import Bwrap
from tests.conftest import alive, wait_for

CONNECT = "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.recv(1)"


def judged(tmp_path: Path, client: list[str]) -> bool:
    """Whether a broker would admit the process `client` (which connects to the socket path
    given as its last argument)."""
    path = tmp_path / f"{len(list(tmp_path.iterdir()))}.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    found: list[bool] = []

    def accept() -> None:
        conn, _ = listener.accept()
        with conn:
            found.append(broker.admitted(*broker.peer(conn)))
            conn.sendall(b"x")

    thread = threading.Thread(target=accept)
    thread.start()
    try:
        subprocess.run([*client, str(path)], check=True, timeout=60, capture_output=True)
        thread.join(60)
    finally:
        listener.close()
    return found[0]


def test_a_process_of_this_user_here_is_admitted(tmp_path: Path) -> None:
    assert judged(tmp_path, [sys.executable, "-c", CONNECT])


@pytest.mark.skipif(Bwrap(Path("/")).problem() is not None, reason="bubblewrap cannot run here")
def test_a_process_in_other_namespaces_is_refused_even_when_it_reaches_the_socket(
    tmp_path: Path,
) -> None:
    """An agent in the sandbox is in namespaces of its own: refused by the kernel's word, even
    with the socket in its view (here it is; the sandbox hides the runs root)."""
    wrap = ["bwrap", "--unshare-user", "--dev-bind", "/", "/", "--"]
    assert not judged(tmp_path, [*wrap, sys.executable, "-c", CONNECT])
    mounts = ["bwrap", "--dev-bind", "/", "/", "--tmpfs", "/mnt", "--"]  # its own mounts only
    assert not judged(tmp_path, [*mounts, sys.executable, "-c", CONNECT])


def test_settings_and_answers_cross_the_socket_as_they_were() -> None:
    settings = ExecutorSettings(
        type=ExecutorType.RAY, address="10.0.0.1:6379", resources=MappingProxyType({"gpu": 1.0})
    )
    a, b = socket.socketpair()
    with a, b:
        broker.send(a, {"settings": settings, "data": b"\0" * 100_000})
        got = broker.receive(b)
    assert got["settings"] == settings and dict(got["settings"].resources) == {"gpu": 1.0}
    assert got["data"] == b"\0" * 100_000


def test_an_error_comes_back_as_run_agents_own_with_its_exit_code() -> None:
    refused = broker.rebuilt(*broker.error_words(AlreadyRunningError("task p/t is running")))
    assert type(refused) is AlreadyRunningError and refused.exit_code == ExitCode.ALREADY_RUNNING
    assert str(refused) == "task p/t is running"
    # A class of the Ray package (a ClusterError) comes back as a RunAgentError, its code kept.
    other = broker.rebuilt("GoneError", "no actor 'host:x'", int(ExitCode.FAILED))
    assert type(other) is RunAgentError and str(other) == "no actor 'host:x'"


def test_a_broker_never_starts_where_it_is_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(broker.BROKER_ENV, "0")
    assert broker.disabled()
    monkeypatch.setenv(broker.BROKER_ENV, "1")
    assert not broker.disabled()


def test_stopping_a_roots_brokers_leaves_a_process_that_took_a_pid_alone(tmp_path: Path) -> None:
    """A pid file left by a broker that died names another process later: never signalled."""
    other = subprocess.Popen(["sleep", "60"])
    try:
        folder = broker.folder(tmp_path)
        folder.mkdir()
        (folder / "0123456789abcdef.pid").write_text(f"{other.pid}\n")
        assert broker.stop_all(tmp_path) == []
        assert alive(other.pid)
    finally:
        other.kill()
        other.wait()


def test_stopping_a_roots_brokers_ends_them(tmp_path: Path) -> None:
    """Only a process whose command line is a broker's of this root is stopped (here one that
    takes its place: the real one needs a cluster)."""
    root = tmp_path.resolve()
    stand_in = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", broker.SERVER],
        env={**os.environ, broker.ROOT_ENV: str(root)},
    )
    try:
        folder = broker.folder(root)
        folder.mkdir()
        (folder / "0123456789abcdef.pid").write_text(f"{stand_in.pid}\n")
        wait_for(lambda: broker._is_broker(stand_in.pid, root), 10, "its command line")
        assert broker.stop_all(root) == [stand_in.pid]
        assert stand_in.wait(10) != 0
    finally:
        stand_in.kill()
        stand_in.wait()
    assert not os.path.exists(f"/proc/{stand_in.pid}/cmdline") or not alive(stand_in.pid)
