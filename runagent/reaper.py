"""The reaper: the one process between a supervisor and its agent, which kills the agent's tree.

Started by `runagent.process` as `python -I -S reaper.py LIFELINE REPORT --standby`, in a
session of its own (so a signal to the supervisor's process group never reaches it), ahead of
need: its interpreter boots while the supervisor loads and prepares the run. Its first message
on LIFELINE says what to start: `S`, then one line of JSON with the executable, argv,
environment, working folder, grace and the paths of the agent's stdin, stdout and stderr, which
become its own. `T` or end of file before that: it exits, having started nothing. (The older form
`LIFELINE REPORT GRACE -- EXE ARGV...` starts at once, with its own stdio, folder and
environment.) It makes
itself a child subreaper (so descendants that leave with `setsid` and lose their parent are
re-parented here, not to init), starts the agent in a new session, and then waits.

- LIFELINE is a pipe from the supervisor. A byte `T` asks for the tree to be stopped; end of file
  means the supervisor is gone (even by SIGKILL), and the tree is stopped too.
- REPORT is a pipe to the supervisor, one line per event: `started PID`, `error ERRNO MESSAGE`,
  `exit CODE` (a shell-style code: 128+N for signal N).

Stopping is SIGTERM to every descendant and the agent's group, GRACE seconds, then SIGKILL until
none is left. When the agent exits by itself, whatever it left behind is stopped the same way
before `exit` is reported: no process of a run outlives it.

Only the standard library is imported (the interpreter runs with -S), and nothing is ever written
to stdout or stderr, which belong to the agent.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
RESET_SIGNALS = (
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGTERM,
    signal.SIGPIPE,
    signal.SIGCHLD,
    signal.SIGQUIT,
    signal.SIGXFSZ,
)


def _become_subreaper() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        # Not Linux: orphans that escape the agent's group then go to init; the group kill and
        # the descendant scan still cover everything that keeps its parent.
        pass


def _descendants(root: int) -> list[int]:
    """Live (non-zombie) descendants of `root`, found by walking /proc."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: split after the last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) < 2 or fields[0] == b"Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


class Reaper:
    def __init__(
        self, lifeline: int, report: int, grace: float, exe: str, argv: list[str],
        env: dict[str, str],
    ) -> None:  # fmt: skip
        self.lifeline = lifeline
        self.report = report
        self.grace = grace
        self.exe = exe
        self.argv = argv
        self.env = env
        self.agent_pid = 0
        self.agent_status: int | None = None
        self.stop_requested = False

    def say(self, line: str) -> None:
        try:
            os.write(self.report, (line + "\n").encode())
        except OSError:
            pass  # The supervisor is gone; the lifeline tells us so.

    def reap(self) -> None:
        """Collect every exited child, remembering the agent's status."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.agent_pid:
                self.agent_status = status

    def signal_tree(self, sig: int) -> list[int]:
        targets = _descendants(os.getpid())
        if self.agent_pid:
            try:
                os.killpg(self.agent_pid, sig)
            except OSError:
                pass
        for pid in targets:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        return targets

    def stop_tree(self) -> None:
        """SIGTERM, up to `grace` seconds for the tree to go, then SIGKILL until none is left."""
        if not self.signal_tree(signal.SIGTERM):
            self.reap()
            return
        deadline = time.monotonic() + self.grace
        while time.monotonic() < deadline:
            self.reap()
            if not _descendants(os.getpid()):
                return
            time.sleep(0.02)
        for _ in range(500):
            if not self.signal_tree(signal.SIGKILL):
                break
            time.sleep(0.01)
            self.reap()
        self.reap()

    def start(self) -> bool:
        try:
            self.agent_pid = os.posix_spawn(
                self.exe,
                self.argv,
                self.env,
                setsid=True,
                setsigdef=RESET_SIGNALS,
                setsigmask=(),
            )
        except OSError as exc:
            self.say(f"error {exc.errno} {exc.strerror}")
            return False
        self.say(f"started {self.agent_pid}")
        return True

    def run(self) -> int:
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._on_term)
        if not self.start():
            return 1
        while self.agent_status is None:
            try:
                ready, _, _ = select.select([self.lifeline, wake_r], [], [])
            except InterruptedError:
                ready = []
            if wake_r in ready:
                os.read(wake_r, 4096)
            self.reap()
            if self.lifeline in ready:
                try:
                    data = os.read(self.lifeline, 64)
                except OSError:
                    data = b""
                if not data or b"T" in data:
                    self.stop_requested = True
            if self.stop_requested and self.agent_status is None:
                self.stop_tree()
                # The agent is our child and was killed: wait for its status.
                while self.agent_status is None:
                    try:
                        _, status = os.waitpid(self.agent_pid, 0)
                    except ChildProcessError:
                        self.agent_status = signal.SIGKILL  # a raw wait status: killed by 9
                        break
                    self.agent_status = status
        # The agent is gone; nothing it started may stay behind.
        self.stop_tree()
        self.say(f"exit {_exit_code(self.agent_status)}")
        return 0

    def _on_term(self, signum: int, frame: object) -> None:
        self.stop_requested = True


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _read_spec(lifeline: int) -> dict[str, object] | None:
    """What to start, as the supervisor sends it; None if it lets go first (`T`, end of file)."""
    data = b""
    while b"\n" not in data:
        try:
            chunk = os.read(lifeline, 1 << 16)
        except InterruptedError:
            continue
        except OSError:
            return None
        if not chunk or (not data and chunk.startswith(b"T")):
            return None
        data += chunk
    line = data.split(b"\n", 1)[0]
    if not line.startswith(b"S"):
        return None
    import json  # the supervisor is still getting ready: this costs it nothing

    spec = json.loads(line[1:])
    return spec if isinstance(spec, dict) else None


def _take_stdio(spec: dict[str, object]) -> None:
    """Make the agent's stdin, stdout and stderr this process's own, and enter its folder."""
    stdin = spec.get("stdin")
    mode = 0o600  # runfolder.FILE_MODE (this module imports nothing of run-agent's)
    files = [
        os.open(str(stdin) if stdin else os.devnull, os.O_RDONLY),
        os.open(str(spec["stdout"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, mode),
        os.open(str(spec["stderr"]), os.O_WRONLY | os.O_CREAT | os.O_APPEND, mode),
    ]
    for target, fd in enumerate(files):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(str(spec["cwd"]))


def _launch(spec: dict[str, object]) -> tuple[str, list[str], dict[str, str], float]:
    """The executable, argv, environment and grace of a spec (the supervisor's own message)."""
    argv, env, grace = spec["argv"], spec["env"], spec["grace"]
    if not isinstance(argv, list) or not isinstance(env, dict):
        raise ValueError("argv must be a list and env a mapping")
    if not isinstance(grace, int | float):
        raise ValueError("grace must be a number")
    return str(spec["exe"]), [str(a) for a in argv], {str(k): str(v) for k, v in env.items()}, grace


def main(args: list[str]) -> int:
    lifeline, report = int(args[0]), int(args[1])
    for fd in (lifeline, report):
        os.set_inheritable(fd, False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    _become_subreaper()
    if args[2:] == ["--standby"]:
        spec = _read_spec(lifeline)
        if spec is None:
            return 0
        try:
            _take_stdio(spec)
        except OSError as exc:
            os.write(report, f"error {exc.errno} {exc.strerror}\n".encode())
            return 1
        exe, argv, env, grace = _launch(spec)
        return Reaper(lifeline, report, grace, exe, argv, env).run()
    if len(args) < 6 or args[3] != "--":
        return 2
    return Reaper(lifeline, report, float(args[2]), args[4], args[5:], dict(os.environ)).run()


if __name__ == "__main__":
    # Nothing is left to flush or close: skip interpreter shutdown, which the supervisor would
    # otherwise wait out between an agent's exit and the next attempt.
    os._exit(main(sys.argv[1:]))
