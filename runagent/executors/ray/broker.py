"""The broker's side (executors/broker.py says why there is one): a process that joined the
cluster once and carries the Ray executor's calls of the commands of its runs root on this
host, each over its own connection to the broker's Unix socket, in a thread of its own.

It holds `.broker/KEY.lock` while it lives (one per root, cluster and host), answers at
`.broker/KEY.sock`, and leaves after IDLE seconds without a connection or a call, on SIGTERM,
or with its cluster (Ray ends a driver whose head is gone for good). A peer is admitted only if
the kernel says it is a process of this user in this process's user and mount namespaces.

    RUN_AGENT_BROKER_ROOT=ROOT python -m runagent.executors.brokerd ADDRESS NAMESPACE
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import runagent
from runagent.config.settings import ExecutorSettings, ExecutorType
from runagent.errors import RunAgentError
from runagent.executors import broker
from runagent.executors.ray.driver import connect, disconnect
from runagent.store import runfolder

ACCEPT_TICK = 1.0  # seconds between looks at whether it is to leave


class Broker:
    def __init__(self, root: Path, settings: ExecutorSettings, idle: float) -> None:
        self.root, self.settings, self.idle = root, settings, idle
        self.lock = threading.Lock()
        self.active = 0
        self.last = time.monotonic()
        self.leaving = threading.Event()

    def serve(self, listener: socket.socket) -> None:
        listener.settimeout(ACCEPT_TICK)
        while not self.leaving.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                with self.lock:
                    if self.active == 0 and time.monotonic() - self.last > self.idle:
                        return
                continue
            except OSError:
                if self.leaving.is_set():
                    return
                raise
            with self.lock:
                self.active += 1
                self.last = time.monotonic()
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        try:
            with conn:
                self._answer(conn)
        except (OSError, EOFError):
            pass  # the command ended
        except Exception as exc:  # never let one command's failure take the broker down
            print(f"run-agent broker: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        finally:
            with self.lock:
                self.active -= 1
                self.last = time.monotonic()

    def _answer(self, conn: socket.socket) -> None:
        pid, uid = broker.peer(conn)
        if not broker.admitted(pid, uid):
            print(f"run-agent broker: refused pid {pid} (uid {uid}): not this user's process in "
                  "this user and mount namespace", file=sys.stderr, flush=True)  # fmt: skip
            return
        hello = broker.receive(conn)
        settings = hello.get("settings") if isinstance(hello, dict) else None
        why = self._refusal(hello, settings)
        if why is not None:
            broker.send(conn, ("no", why))
            return
        assert isinstance(settings, ExecutorSettings)
        executor = connect(settings)
        broker.send(conn, ("ok", os.getpid()))
        while True:
            method, args, kwargs = broker.receive(conn)
            with self.lock:
                self.last = time.monotonic()
            try:
                if method not in broker.CALLS:
                    raise RunAgentError(f"the cluster broker carries no call {method!r}")
                answer: tuple[str, Any] = ("ok", getattr(executor, method)(*args, **kwargs))
            except RunAgentError as exc:
                answer = ("err", broker.error_words(exc))
            except Exception as exc:
                said = f"the cluster broker's {method} failed: {type(exc).__name__}: {exc}"
                answer = ("err", ("RunAgentError", said, 1))
            broker.send(conn, answer)

    def _refusal(self, hello: Any, settings: Any) -> str | None:
        """Why a command's hello is not answered; None when it is."""
        if not isinstance(hello, dict) or hello.get("version") != runagent.__version__:
            self.leaving.set()  # another version of run-agent: it starts a broker of its own
            return "another version of run-agent"
        if not isinstance(settings, ExecutorSettings) or settings.type is not ExecutorType.RAY:
            return "no Ray executor's settings"
        mine = self.settings
        if (settings.address, settings.namespace) != (mine.address, mine.namespace):
            return f"this broker's cluster is {mine.address} ({mine.namespace})"
        return None


def main(argv: list[str]) -> int:
    root, (address, namespace) = Path(os.environ[broker.ROOT_ENV]).resolve(), argv[:2]
    settings = ExecutorSettings(type=ExecutorType.RAY, address=address, namespace=namespace)
    where, key = broker.folder(root), broker.key(settings)
    where.mkdir(mode=runfolder.FOLDER_MODE, parents=True, exist_ok=True)
    fd = os.open(where / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another broker has it
    path, pid_file = where / f"{key}.sock", where / f"{key}.pid"
    made = Broker(root, settings, float(os.environ.get("RUN_AGENT_BROKER_IDLE") or broker.IDLE))
    signal.signal(signal.SIGTERM, lambda *_: made.leaving.set())
    try:
        try:
            connect(settings)
        except RunAgentError as exc:  # MissingDependencyError: no cluster at the address
            print(f"run-agent broker: {exc}", file=sys.stderr, flush=True)
            return int(exc.exit_code)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        with broker.short_path(path) as name:
            listener.bind(name)
        os.chmod(path, 0o600)
        listener.listen(64)
        runfolder.atomic_write(pid_file, f"{os.getpid()}\n")
        print(f"run-agent broker: pid {os.getpid()} answers for {address} ({namespace})",
              file=sys.stderr, flush=True)  # fmt: skip
        with listener:
            made.serve(listener)
        return 0
    finally:
        for left in (path, pid_file):
            with contextlib.suppress(FileNotFoundError):
                left.unlink()
        os.close(fd)
        disconnect()
