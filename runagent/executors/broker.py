"""A command's way to a Ray cluster without joining it: the broker.

Joining a cluster costs a command about a second (importing Ray, then `ray.init`), four times a
local command's whole time. So the command line hands its calls to the cluster to a broker: one
long-lived process per runs root, cluster and host (ray/broker.py), which joined the cluster once
and carries each call over a Unix socket under the runs root (`.broker/`), a few milliseconds
each. The first command that finds none starts one and waits for it (as long as joining takes);
it leaves after IDLE seconds without a command, or when its cluster goes. Where no broker can
start or answer, the command joins the cluster itself, as before, and says so in one line.

Who may use it: only a process of the broker's own user, in its own user and mount namespaces,
judged by the kernel's word for the peer (SO_PEERCRED, /proc/PID/ns), never by anything sent.
Its folder and socket are the user's alone (0700, 0600), under the runs root that the agents'
sandbox hides; an agent in the sandbox is in other namespaces, and is refused even if it found
the socket. What it runs is what the user could run with `run-agent` directly: it is a shortcut,
not a way up.

This module is the command's side and imports no Ray; ray/broker.py is the broker's side.
"""

from __future__ import annotations

import contextlib
import copyreg
import hashlib
import io
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import runagent
from runagent import errors, python
from runagent.config.settings import ExecutorSettings
from runagent.errors import RunAgentError
from runagent.store import host, runfolder
from runagent.store.pids import stat_fields

BROKER_ENV = "RUN_AGENT_BROKER"  # "0": never hand calls to a broker (each command joins itself)
IDLE = 600.0  # seconds a broker stays without a command before it leaves
SPAWN_WAIT = 60.0  # seconds a command waits for the broker it started to answer
SERVER = "runagent.executors.brokerd"  # the broker's program
ROOT_ENV = "RUN_AGENT_BROKER_ROOT"  # the runs root a broker serves, in its environment
FRAME_LIMIT = 64 << 20  # bytes of one message (a read of a file is at most 1 MiB)
# The calls a broker carries: the Ray executor's, each the same there as here.
CALLS = frozenset({
    "start", "stop", "withdraw", "read", "locate", "ended", "hosts", "present", "state_kept",
    "judge", "waits", "sync_pauses", "unpause",
})  # fmt: skip
# Calls that change nothing on the cluster: asked again of a broker that went, or of the
# cluster directly.
READS = frozenset({"read", "locate", "ended", "hosts", "present", "state_kept", "judge", "waits"})


class BrokerError(RunAgentError):
    """A broker did not answer as one (gone mid-call, refused us, or another version)."""


class CannotJoinError(BrokerError):
    """The broker could not join the cluster: the command cannot either, and says why itself."""


def key(settings: ExecutorSettings) -> str:
    """Which broker serves `settings` on this host: its cluster (address, namespace)."""
    said = f"{host.this_host()}\0{settings.address}\0{settings.namespace}"
    return hashlib.sha256(said.encode()).hexdigest()[:16]


def folder(root: Path) -> Path:
    return root / runfolder.BROKER


@contextlib.contextmanager
def short_path(path: Path) -> Iterator[str]:
    """`path` as a socket may be named by it: through its folder's descriptor, as a socket's
    path is at most 107 bytes and a runs root's may be longer."""
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def peer(sock: socket.socket) -> tuple[int, int]:
    """The pid and uid of the process at the other end, as the kernel says."""
    pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid, uid


def admitted(pid: int, uid: int) -> bool:
    """Whether the peer `pid` (the kernel's word) is this user's, in this process's user and
    mount namespaces: never a process in the agent's sandbox, nor another user's."""
    if uid != os.getuid() or pid <= 0:
        return False
    try:
        return all(
            os.readlink(f"/proc/{pid}/ns/{ns}") == os.readlink(f"/proc/self/ns/{ns}")
            for ns in ("user", "mnt")
        )
    except OSError:
        return False


def send(sock: socket.socket, message: Any) -> None:
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    # Settings hold their mappings read-only (a mappingproxy, which pickle refuses): as dicts.
    pickler.dispatch_table = {**copyreg.dispatch_table, MappingProxyType: _proxy}
    pickler.dump(message)
    data = buffer.getvalue()
    sock.sendall(struct.pack(">I", len(data)) + data)


def _proxy(mapping: MappingProxyType[Any, Any]) -> tuple[Any, tuple[dict[Any, Any]]]:
    return read_only, (dict(mapping),)


def read_only(mapping: dict[Any, Any]) -> MappingProxyType[Any, Any]:
    return MappingProxyType(mapping)


def receive(sock: socket.socket) -> Any:
    """The next message; EOFError when the other end closed."""
    (size,) = struct.unpack(">I", _exactly(sock, 4))
    if size > FRAME_LIMIT:
        raise BrokerError(f"a message of {size} bytes from the broker's socket is too large")
    return pickle.loads(_exactly(sock, size))


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return bytes(data)


def error_words(exc: BaseException) -> tuple[str, str, int]:
    """An error as it crosses the socket: its class's name, its message, its exit code."""
    code = int(getattr(exc, "exit_code", errors.ExitCode.FAILED))
    return type(exc).__name__, str(exc), code


def rebuilt(name: str, message: str, code: int) -> RunAgentError:
    """The error the broker's call raised, as this side raises it: run-agent's own class when
    it is one of runagent.errors (a refusal of the start, say), else a RunAgentError."""
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, RunAgentError):
        try:
            made = cls(message)
        except TypeError:
            made = RunAgentError(message)
    else:
        made = RunAgentError(message)
    made.exit_code = (
        errors.ExitCode(code) if code in errors.ExitCode._value2member_map_ else (made.exit_code)
    )
    return made


class Brokered:
    """The Ray executor (control.Executor) whose calls a broker carries; `hold_name` and
    `receive_runs`, which hold something for as long as this process lives, join the cluster
    here."""

    def __init__(
        self, settings: ExecutorSettings, sock: socket.socket, pid: int, direct: Callable[[], Any]
    ) -> None:
        self.settings = settings
        self._direct = direct  # the executor joined here (control.ray_executor's, direct)
        self.sock = sock
        self.pid = pid  # the broker's
        self.lock = threading.Lock()

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            with self.lock:
                send(self.sock, (method, args, kwargs))
                kind, value = receive(self.sock)
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            if method in READS:  # nothing changed: asked of the cluster directly instead
                return getattr(self._direct(), method)(*args, **kwargs)
            raise BrokerError(
                f"the cluster broker (pid {self.pid}) went away during {method}: "
                f"{exc or type(exc).__name__}; look at the task with `run-agent status`"
            ) from None
        if kind == "ok":
            return value
        raise rebuilt(*value)

    def start(self, task: Any, command: str, overrides: Any, **kwargs: Any) -> Any:
        from runagent.loop.context import QUEUED_SINCE

        kwargs.setdefault("queued_since", os.environ.get(QUEUED_SINCE, ""))
        return self._call("start", task, command, overrides, **kwargs)

    def stop(self, task: Any, wait: float | None) -> Any:
        return self._call("stop", task, wait)

    def withdraw(self, task: Any) -> Any:
        return self._call("withdraw", task)

    def read(self, task: Any, relative: str, offset: int, limit: int) -> bytes:
        return bytes(self._call("read", task, relative, offset, limit))

    def locate(self, label: str) -> Any:
        return self._call("locate", label)

    def ended(self, label: str, since: float) -> Any:
        return self._call("ended", label, since)

    def hosts(self) -> tuple[int, int]:
        found = self._call("hosts")
        return int(found[0]), int(found[1])

    def present(self, label: str) -> bool:
        return bool(self._call("present", label))

    def state_kept(self) -> str:
        return str(self._call("state_kept"))

    def judge(self, label: str, on: str, pid: int, start: float | None) -> bool:
        return bool(self._call("judge", label, on, pid, start))

    def waits(self, label: str, group_id: str) -> bool:
        return bool(self._call("waits", label, group_id))

    def sync_pauses(self, root: Path) -> None:
        self._call("sync_pauses", root)

    def unpause(self, agent: str) -> Any:
        return self._call("unpause", agent)

    def hold_name(self, name: str) -> bool:
        return bool(self._direct().hold_name(name))

    def receive_runs(self, root: Path) -> None:
        self._direct().receive_runs(root)


_reached: dict[tuple[str, str], Brokered] = {}


def disabled() -> bool:
    return os.environ.get(BROKER_ENV, "").strip().lower() in ("0", "no", "off", "false")


def reach(root: Path, settings: ExecutorSettings, direct: Callable[[], Any]) -> Brokered | None:
    """The broker of `root` for `settings`' cluster, started if none answers (and waited for);
    None if none can answer, said in one line (the command then joins the cluster itself).
    `direct`: the executor joined in this process, for what must be held by it."""
    root = root.resolve()
    cache = (str(root), repr(settings))
    if cache in _reached:
        return _reached[cache]
    try:
        found = _answer(root, settings, direct) or _spawn(root, settings, direct)
    except CannotJoinError:
        return None  # joining fails here too, and says why in its own one line
    except (OSError, BrokerError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"run-agent: no cluster broker for {root} ({why}); this command joins the Ray "
              "cluster itself (about a second)", file=sys.stderr)  # fmt: skip
        return None
    _reached[cache] = found
    return found


def _answer(root: Path, settings: ExecutorSettings, direct: Callable[[], Any]) -> Brokered | None:
    """The broker's answer at its socket, or None if nothing listens there."""
    path = folder(root) / f"{key(settings)}.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        with short_path(path) as name:
            sock.connect(name)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except OSError:
        sock.close()
        raise
    try:
        pid, uid = peer(sock)
        if uid != os.getuid():
            raise BrokerError(f"the socket {path} is another user's (uid {uid})")
        send(sock, {"version": runagent.__version__, "settings": settings})
        kind, _ = receive(sock)
    except (OSError, EOFError, pickle.UnpicklingError, BrokerError):
        sock.close()
        return None  # it is leaving (idle, or another version's): a new one is started
    if kind != "ok":
        sock.close()
        return None
    return Brokered(settings, sock, pid, direct)


def _spawn(root: Path, settings: ExecutorSettings, direct: Callable[[], Any]) -> Brokered:
    """Start the broker (detached, its output in its log) and wait until it answers."""
    where = folder(root)
    where.mkdir(mode=runfolder.FOLDER_MODE, parents=True, exist_ok=True)
    os.chmod(where, runfolder.FOLDER_MODE)
    from runagent.store import credentials

    env = credentials.scrub(os.environ, "")  # it runs no agent: it needs no credential
    env[BROKER_ENV] = "0"  # its own calls join the cluster (it is the one that joined)
    # Its root, in its environment rather than on its command line: a process that names a
    # folder on its command line is taken for one of that folder's loops (`ps`, the tests).
    env[ROOT_ENV] = str(root)
    log = where / f"{key(settings)}.log"
    with open(log, "ab", opener=runfolder.private) as out:
        proc = subprocess.Popen(
            python("-m", SERVER, settings.address, settings.namespace),
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, cwd="/",
            start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + SPAWN_WAIT
    while time.monotonic() < deadline:
        found = _answer(root, settings, direct)
        if found is not None:
            return found
        if proc.poll() is not None and not held(root, settings):
            if proc.returncode == errors.ExitCode.MISSING_DEPENDENCY:
                raise CannotJoinError("no cluster to join")
            tail = runfolder.tail(log, 400).strip().splitlines()
            raise BrokerError(f"it exited: {tail[-1] if tail else f'exit code {proc.returncode}'}")
        time.sleep(0.02)
    raise BrokerError(f"it did not answer within {SPAWN_WAIT:g}s; see {log}")


def held(root: Path, settings: ExecutorSettings) -> bool:
    """Whether a broker holds its lock (is up, or starting)."""
    return runfolder.is_held(folder(root) / f"{key(settings)}.lock")


def stop_all(root: Path, wait: float = 10.0) -> list[int]:
    """Stop every broker of `root` (SIGTERM, then SIGKILL after `wait`); their pids."""
    pids = []
    for path in sorted(folder(root).glob("*.pid")) if folder(root).is_dir() else []:
        try:
            pid = int(path.read_text().split()[0])
            if not _is_broker(pid, root):  # gone, and its pid another process's since
                continue
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError, IndexError):
            continue
        pids.append(pid)
    deadline = time.monotonic() + wait
    for pid in pids:
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return pids


def _is_broker(pid: int, root: Path) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    return SERVER.encode() in argv and f"{ROOT_ENV}={root.resolve()}".encode() in env


def _alive(pid: int) -> bool:
    try:
        return stat_fields(pid)[0] != b"Z"
    except (OSError, IndexError):
        return False
