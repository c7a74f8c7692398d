"""Detached supervisors started by forking a process that loaded run-agent ahead of need.

A loop's supervisor is `run-agent run --admitted ...`: a new interpreter that imports the command
line, the loop and the backends before it does anything, a tenth of a second on a quiet machine
and several on a loaded one. A cluster's host agent starts one for every loop placed on its host,
and the queue's keeper one for every queued task whose turn comes, each while a slot waits for
it. So each keeps one fork server (this module run as a program, its own child) that imported
those modules once, and asks it for each supervisor: the server forks, and the child becomes the
supervisor exactly as `python -m runagent ARGV` would (its own session, its output in the task's
supervisor.log, the environment and folder it is given). The server reports each child's pid
and, when it exits, its exit code.

A host agent's server and children are bound: each child dies with the server
(PR_SET_PDEATHSIG), and the server with the host agent's thread that started it, as a
supervisor the host agent starts itself does; so a host agent that is killed still leaves no
loop running. A keeper's children are detached loops, which outlive the keeper as those that
the door starts do: only its server dies with it. Where the server cannot start or answer,
the supervisor is started as a new interpreter (local.spawn_local).

The server is one thread (forking a process with threads is unsafe); it reads requests, one
JSON line each, on its stdin, and writes answers and exits, one JSON line each, on its stdout.
A forked child waits until its asker, having read its pid, says `go`: a request not answered
in time is started as a new interpreter instead, and the asker says `drop` to a late answer, so
a task never gets a second supervisor. The server says `went` once it passed `go` on; should it
die first, the child reads the end of its pipe and exits unrun, and the asker, told nothing,
reads from the child itself whether it went (its own session, which it makes at once).

    python -m runagent.executors.forkserver
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from runagent import python
from runagent.store.pids import stat_fields

# What a supervisor's command line loads before it runs, loaded once by the server.
WARM = (
    "runagent.cli",
    "runagent.cli.group",
    "runagent.cli.run",
    "runagent.cli.foreground",
    "runagent.cli.console",
    "runagent.loop.supervisor",
    "runagent.loop.attempt",
    "runagent.service",
    "runagent.fleet.queue",
    "runagent.process",
    "backends",
    "backends.command",
    "yaml",
    "click",
)
READY_WAIT = 60.0  # seconds a server may take to load what a supervisor loads
ANSWER_WAIT = 30.0  # seconds a request waits for the server's pid
HAND_TICK = 0.005  # seconds between looks at a child whose server died as it was told `go`
TITLE_ROOM = 4096  # bytes of the server's command line a child's is written over (_retitle)


# The server ----------------------------------------------------------------------------------


def serve() -> int:
    import importlib

    for name in WARM:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    requests, answers = sys.stdin.fileno(), sys.stdout.fileno()
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the loop
    selector = selectors.DefaultSelector()
    selector.register(requests, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    pending = b""
    held: dict[int, int] = {}  # a forked child's `go` pipe, by its request's id
    own = (wake_r, wake_w, selector, held)
    _write(answers, {"ready": os.getpid()})
    while True:
        for key, _ in selector.select():
            if key.fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                _reap(answers)
                continue
            chunk = os.read(requests, 65536)
            if not chunk:  # the host agent is gone: its children go with this process
                return 0
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    _handle(json.loads(line), answers, own)


def _handle(
    request: Mapping[str, Any], answers: int, own: tuple[int, int, Any, dict[int, int]]
) -> None:
    held = own[3]
    if "go" in request or "drop" in request:  # what the asker says of a child it was told of
        said = "go" if "go" in request else "drop"
        go = held.pop(int(request[said]), -1)
        if go >= 0:
            went = False
            with contextlib.suppress(OSError):
                went = said == "go" and os.write(go, b"g") == 1
            os.close(go)
            if went:
                _write(answers, {"id": request["go"], "went": True})
        return
    try:
        _fork(request, answers, own)
    except OSError as exc:  # out of processes or descriptors: this start fails, not the server
        _write(answers, {"id": request["id"], "error": f"cannot fork: {exc.strerror}"})


def _reap(answers: int) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        _write(answers, {"exited": pid, "code": code})


def _fork(
    request: Mapping[str, Any], answers: int, own: tuple[int, int, Any, dict[int, int]]
) -> None:
    server = os.getpid()
    try:
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        _write(answers, {"id": request["id"], "error": f"{request['log']}: {exc.strerror}"})
        return
    sys.stdout.flush()
    sys.stderr.flush()
    # The child goes on once its asker, told its pid, says `go` (_handle).
    try:
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        try:
            pid = os.fork()
        except OSError:
            os.close(go_r)
            os.close(go_w)
            raise
    except OSError:
        os.close(log)
        raise
    if pid != 0:
        os.close(log)
        os.close(go_r)
        own[3][int(request["id"])] = go_w
        _write(answers, {"id": request["id"], "pid": pid})
        return
    code = 1
    try:
        wake_r, wake_w, selector, held = own
        for fd in (go_w, *held.values()):  # another child's `go` must end with the server
            os.close(fd)
        if os.read(go_r, 1) != b"g":  # dropped, or the server died before its asker spoke
            os._exit(1)
        os.close(go_r)
        os.setsid()
        if request.get("bound", True):
            _die_with_parent()
            if os.getppid() != server:  # the server died meanwhile
                os._exit(1)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        selector.close()
        for fd in (wake_r, wake_w):
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(devnull)
        os.close(log)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _retitle(python("-m", "runagent", *request["argv"]))
        code = _run(list(request["argv"]))
        for thread in threading.enumerate():  # as the interpreter's exit waits for them
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
    except BaseException as exc:  # the child never returns into the server's loop
        with contextlib.suppress(Exception):
            print(f"run-agent: the supervisor could not start: {exc}", file=sys.stderr)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _retitle(argv: list[str]) -> None:
    """Show `argv` as this process's command line (`ps`, /proc/PID/cmdline), as a supervisor
    started as a new interpreter shows it: written over the server's own, which it padded for
    this (TITLE_ROOM); a longer one is cut."""
    import ctypes

    try:
        fields = stat_fields("self")
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
    except (OSError, ValueError, IndexError):
        return
    room = end - start
    said = "\0".join(argv).encode()[: room - 1]
    ctypes.memmove(start, said + b" " * (room - 1 - len(said)) + b"\0", room)


def _run(argv: list[str]) -> int:
    """`python -m runagent ARGV` in this process; its exit code."""
    import runpy

    import runagent

    sys.argv = [str(Path(runagent.__file__).with_name("__main__.py")), *argv]
    try:
        runpy.run_module("runagent", run_name="__main__", alter_sys=True)
    except SystemExit as done:
        said = done.code
        if said is None or isinstance(said, int):
            return said or 0
        print(said, file=sys.stderr)
        return 1
    except Exception:  # as the interpreter says an error nothing caught: its whole traceback
        import traceback

        traceback.print_exc()
        return 1
    return 0


def _write(fd: int, message: Mapping[str, Any]) -> None:
    data = json.dumps(message).encode() + b"\n"
    while data:
        data = data[os.write(fd, data) :]


# What an interpreter reads from its environment as it starts, which a forked child keeps from
# the server whatever its own environment says.
INTERPRETER = ("PYTHON", "LANG", "LC_", "TZ")


def _interpreter(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(INTERPRETER)}


def _code_stamp() -> int:
    """When run-agent's code was last installed (its package's first file written)."""
    import runagent

    try:
        return os.stat(runagent.__file__).st_mtime_ns
    except OSError:
        return 0


def _ready(fd: int) -> bool:
    """Whether the server on the other end of `fd` says it is ready within READY_WAIT."""
    deadline = time.monotonic() + READY_WAIT
    said = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while b"\n" not in said:
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                return False
            chunk = os.read(fd, 4096)  # nothing follows the line until it is asked
            if not chunk:
                return False
            said += chunk
    return said.startswith(b'{"ready"')


def _went(pid: int) -> bool:
    """Whether a forked child whose server died about when it was told `go` went: on `go` it
    makes its own session at once, and on the end of its pipe it exits at once. Until one of
    the two shows (ANSWER_WAIT at most), it is taken to have gone: a start is never made twice."""
    deadline = time.monotonic() + ANSWER_WAIT
    while time.monotonic() < deadline:
        try:
            fields = stat_fields(pid)
        except OSError:
            return False  # gone, and reaped
        if int(fields[3]) == pid:  # field 6, its session
            return True
        if fields[0] == b"Z":  # ended, still in the server's session: it never went
            return False
        time.sleep(HAND_TICK)
    return True


def _die_with_parent() -> None:
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


# The host agent's side -----------------------------------------------------------------------


class Forked:
    """A supervisor the server forked, as the host agent waits on it (a Popen's pid, poll,
    wait)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.done = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self.done.wait(timeout):
            raise subprocess.TimeoutExpired(f"supervisor {self.pid}", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def ended(self, code: int) -> None:
        self.returncode = code
        self.done.set()


class ForkServer:
    """A fork server: started by `start` (from the thread it is to die with), asked for a
    supervisor by `fork`. Its children die with it (`bound`, a host agent's) or outlive it (the
    queue's keeper's, whose detached loops go on after it exits)."""

    def __init__(self, bound: bool = True) -> None:
        self.bound = bound
        self.loaded: tuple[dict[str, str], int] = ({}, 0)  # what the server started with
        self.lock = threading.Lock()
        self.process: subprocess.Popen[bytes] | None = None
        self.asked: dict[int, tuple[threading.Event, dict[str, Any]]] = {}
        self.children: dict[int, Forked] = {}
        self.dropped: set[int] = set()  # requests given up before their answer came
        self.next_id = 0

    def start(self, env: Mapping[str, str]) -> bool:
        """Start the server (in the thread its children are to die with); whether it is up."""
        if self.alive():
            return True
        self.loaded = (_interpreter(env), _code_stamp())
        try:
            process = subprocess.Popen(
                python("-m", "runagent.executors.forkserver", " " * TITLE_ROOM),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env=dict(env), preexec_fn=_die_with_parent, cwd="/",
            )  # fmt: skip
        except OSError:
            return False
        assert process.stdout is not None
        if not _ready(process.stdout.fileno()):  # it imported what a supervisor loads
            process.kill()
            process.wait()
            return False
        self.process = process
        threading.Thread(target=self._read, args=(process, process.stdout), daemon=True).start()
        return True

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def serves(self, env: Mapping[str, str]) -> bool:
        """Whether a supervisor forked by the server would be the one a new interpreter started
        with `env` would be: the server is up, was started with the same settings of the
        interpreter itself (PYTHONPATH, say, where plugins are found), and run-agent's code has
        not been installed again since it loaded it."""
        return self.alive() and self.loaded == (_interpreter(env), _code_stamp())

    def fork(self, argv: list[str], cwd: Path, env: Mapping[str, str], log: Path) -> Forked:
        """A supervisor `run-agent ARGV` forked by the server; OSError if it cannot be."""
        process = self.process
        if process is None or process.poll() is not None or process.stdin is None:
            raise OSError("the fork server is not running")
        with self.lock:
            self.next_id += 1
            ask = self.next_id
            answered = threading.Event()
            answer: dict[str, Any] = {}
            self.asked[ask] = (answered, answer)
            try:
                self._say(process, {"id": ask, "argv": argv, "cwd": str(cwd), "env": dict(env),
                                    "log": str(log), "bound": self.bound})  # fmt: skip
            except OSError:
                self.asked.pop(ask, None)
                raise
        answered.wait(ANSWER_WAIT)
        with self.lock:
            if "pid" not in answer:
                if self.asked.pop(ask, None) is not None:  # a late answer is dropped (_read)
                    self.dropped.add(ask)
                raise OSError(answer.get("error") or "the fork server did not answer")
            # Known before it can end: its exit is read only once it went.
            child = self.children[int(answer["pid"])] = Forked(int(answer["pid"]))
            went, told = threading.Event(), dict[str, Any]()
            self.asked[ask] = (went, told)
            try:
                self._say(process, {"go": ask})
            except OSError:  # the server is gone: its child read the end of its pipe
                self.asked.pop(ask, None)
                self.children.pop(child.pid, None)
                raise
        went.wait(ANSWER_WAIT)  # the server says it went, or the reader meets its end
        if not told.get("went") and not _went(child.pid):
            with self.lock:
                self.children.pop(child.pid, None)
            raise OSError("the fork server died as it started the supervisor")
        return child

    def _say(self, process: subprocess.Popen[bytes], message: Mapping[str, Any]) -> None:
        """Write a line to the server (under the lock); OSError if it is gone."""
        if process.stdin is None:
            raise OSError("the fork server is not running")
        try:
            process.stdin.write(json.dumps(message).encode() + b"\n")
            process.stdin.flush()
        except (OSError, ValueError) as exc:
            raise OSError(f"the fork server is gone: {exc}") from None

    def _read(self, process: subprocess.Popen[bytes], out: IO[bytes]) -> None:
        try:
            for line in out:
                with contextlib.suppress(ValueError, TypeError, KeyError):
                    self._heard(process, json.loads(line))
        finally:
            self._gone(process)

    def _heard(self, process: subprocess.Popen[bytes], said: dict[str, Any]) -> None:
        with self.lock:
            if "exited" in said:  # a child that went: one that never did is nobody's
                child = self.children.pop(int(said["exited"]), None)
                if child is not None:
                    child.ended(int(said["code"]))
            elif "id" in said and int(said["id"]) in self.asked:
                answered, answer = self.asked.pop(int(said["id"]))
                answer.update(said)
                answered.set()
            elif "id" in said and int(said["id"]) in self.dropped:
                self.dropped.discard(int(said["id"]))
                if "pid" in said:  # started as a new interpreter meanwhile: never this one
                    with contextlib.suppress(OSError):
                        self._say(process, {"drop": said["id"]})

    def _gone(self, process: subprocess.Popen[bytes]) -> None:
        process.wait()
        with self.lock:  # bound, its children died with it (PR_SET_PDEATHSIG)
            for child in self.children.values() if self.bound else ():
                child.ended(-signal.SIGKILL)
            self.children.clear()
            for answered, _ in self.asked.values():
                answered.set()
            self.asked.clear()


if __name__ == "__main__":
    sys.exit(serve())
