"""Shared test fixtures: a workspace with a config of fake agents, a CLI runner, process checks."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from backends.command import CommandBackend
from runagent.config.settings import AgentConfig, LoopSettings
from runagent.loop.backend import Backend
from runagent.loop.context import LoopRequest
from runagent.loop.events import Event
from runagent.loop.supervisor import Supervisor
from runagent.store.runfolder import TaskPaths, read_run_info
from runagent.store.runinfo import RunInfo

FAKE_AGENT = Path(__file__).with_name("fake_agent.py")
REPO = Path(__file__).resolve().parent.parent

# Fast, deterministic loop settings for tests; a test overrides what it is about.
TEST_DEFAULTS: dict[str, Any] = {
    "max_restarts": 3,
    "restart_delay": "50ms",
    "restart_delay_max": "200ms",
    "kill_grace": "1s",
    "idle_timeout": 0,
    "crash_loop_runs": 0,
    "stuck_after": 0,  # tests of the loop's other rules fail the same way on purpose
}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Give the session a temp folder of its own (xdist's workers get theirs inside it). pytest's
    numbered folders (/tmp/pytest-of-USER/pytest-N) carry no lock under the retention policy
    "none", and every session that ends deletes all of them: a session started meanwhile (a file
    run by hand, another checkout's suite) would take the folders from under the running tests."""
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = tempfile.mkdtemp(prefix="pytest-run-agent-")
        config.add_cleanup(lambda: shutil.rmtree(config.option.basetemp, ignore_errors=True))
    if not hasattr(config, "workerinput"):
        # The parsed-config cache (runagent/config/parsed.py) of every run-agent the tests start
        # goes to a folder of the session's (workers and their subprocesses inherit it), never
        # to the user's own cache.
        cache = tempfile.mkdtemp(prefix="run-agent-test-cache-")
        os.environ["XDG_CACHE_HOME"] = cache
        config.add_cleanup(lambda: shutil.rmtree(cache, ignore_errors=True))


# The tests that share the Ray cluster of tests/e2e/test_cluster.py (one per module: three Ray
# nodes are too heavy to start once per worker): all of that module but the local executor's.
CLUSTER_TESTS = "tests/e2e/test_cluster.py::"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `--dist loadgroup`, send the cluster's tests to one worker as one unit, every other
    test alone to whichever worker is free. (The xdist_group mark would say so, but under pytest 9
    the group that xdist appends to a test's id no longer reaches its scheduler.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneClusterScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            on_cluster = nodeid.startswith(CLUSTER_TESTS) and not nodeid.endswith("[local]")
            return "ray-cluster" if on_cluster else nodeid

    return OneClusterScheduling(config, log)


# A suite started in the background of a script (`cmd &` where the shell has no job control)
# inherits SIGINT and SIGQUIT ignored, as POSIX has it, and so would every process a test
# starts: Python leaves an ignored SIGINT ignored, so the tests of ^C would wait on a signal
# their process never takes. The suite's own processes take it as a person's shell gives it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def wait_for(condition: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll `condition` until it returns something truthy, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def slow_loops(folder: Path, seconds: float) -> dict[str, str]:
    """The environment of processes whose loops start `seconds` late: a site hook in FOLDER
    holds each loop's interpreter (the command lines that carry `--admitted`) before run-agent
    begins, as a loaded machine's slow start does."""
    hook = folder / "slow-loops"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        f"import sys, time\nif '--admitted' in sys.argv:\n    time.sleep({seconds})\n"
    )
    return {"PYTHONPATH": f"{hook}:{REPO}"}


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@dataclass
class Workspace:
    path: Path
    marker: str
    pid_file: Path
    events: list[Event] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.path / "runs"

    @property
    def config(self) -> Path:
        return self.path / "config.yaml"

    def agent_argv(self, args: Sequence[str] = ()) -> list[str]:
        return [
            sys.executable,
            str(FAKE_AGENT),
            "--marker",
            self.marker,
            "--pid-file",
            str(self.pid_file),
            *args,
        ]

    def write_config(
        self,
        args: Sequence[str] = (),
        agents: dict[str, Sequence[str]] | None = None,
        env: dict[str, str] | None = None,
        **defaults: Any,
    ) -> Path:
        """A config whose agent `fake` runs the fake agent with `args`."""
        entries = {"fake": args, **(agents or {})}
        data = {
            "agents": {
                name: {"type": "command", "command": self.agent_argv(a), "env": env or {}}
                for name, a in entries.items()
            },
            "defaults": {"agent": "fake", **TEST_DEFAULTS, **defaults},
            "storage": {"runs_dir": str(self.root)},
        }
        self.config.write_text(yaml.safe_dump(data))
        return self.config

    def cli_argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "runagent", *args]

    def cli(
        self, *args: str, env: dict[str, str] | None = None, input: str | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """Run `run-agent ARGS` in the workspace folder (which holds config.yaml)."""
        return subprocess.run(
            self.cli_argv(*args),
            cwd=self.path,
            env={**os.environ, **(env or {})},
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def invoke(
        self, *args: str, env: dict[str, str] | None = None, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run `run-agent ARGS` in this process with click's CliRunner, in the workspace folder:
        fast, for argument and validation tests (signals, detaching and trees use `cli`)."""
        import contextlib

        from click.testing import CliRunner

        from runagent.cli.group import cli

        with contextlib.chdir(self.path):
            result = CliRunner().invoke(
                cli, list(args), input=input, env=env, prog_name="run-agent",
                catch_exceptions=False,
            )  # fmt: skip
        return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout,
                                           result.stderr)  # fmt: skip

    def start_cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """Start `run-agent ARGS` in its own process group, as a shell would in a terminal."""
        return subprocess.Popen(
            self.cli_argv(*args),
            cwd=self.path,
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def task(self, project: str = "p", task: str = "t") -> TaskPaths:
        return TaskPaths(self.root, project, task)

    def runs(self, project: str = "p", task: str = "t") -> list[RunInfo]:
        paths = self.task(project, task)
        infos = [read_run_info(paths.run_folder(r)) for r in paths.run_ids()]
        return [i for i in infos if i is not None]

    def agent_pids(self) -> list[int]:
        if not self.pid_file.exists():
            return []
        return [int(line) for line in self.pid_file.read_text().split()]

    def leftovers(self) -> list[psutil.Process]:
        """Live processes that name this workspace: agents, reapers, supervisors."""
        return _leftovers(self.marker)

    def supervisor(
        self, args: Sequence[str] = (), prompt: str = "do the thing", task: str = "t",
        env: dict[str, str] | None = None, backend: Backend | None = None,
        seams: dict[str, Any] | None = None, cwd: Path | None = None, **settings: Any,
    ) -> Supervisor:  # fmt: skip
        """An in-process supervisor of the fake agent (or of `backend`), recording its events;
        `seams` are Supervisor's `start` and `clock`."""
        base = {
            "max_restarts": 3,
            "restart_delay": 0.05,
            "restart_delay_max": 0.2,
            "kill_grace": 1.0,
            "idle_timeout": None,
            "crash_loop_runs": 0,
            "stuck_after": 0,
        }
        agent = AgentConfig(
            name="fake", type="command", command=tuple(self.agent_argv(args)), env=env or {}
        )
        request = LoopRequest(
            task=TaskPaths(self.root, "p", task),
            prompt=prompt,
            agent_name="fake",
            working_dir=cwd or self.path,
            settings=LoopSettings(**{**base, **settings}),
            base_env=dict(os.environ),
        )
        return Supervisor(
            request,
            backend or CommandBackend(agent),
            on_event=self.events.append,
            tick=0.05,
            **(seams or {}),
        )


def _leftovers(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            if any(marker in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Workspace]:
    """A workspace folder; at the end, no process that names it may still be alive."""
    workspace = Workspace(tmp_path, marker=str(tmp_path), pid_file=tmp_path / "agent-pids")
    workspace.write_config()
    yield workspace
    _insist_none_left(workspace.marker, workspace.root)


def _insist_none_left(marker: str, root: Path | None = None) -> None:
    """Give trees being torn down by the test's last step a moment, then insist. The cluster
    broker a command on a Ray cluster started for `root` lives past its commands, as it does
    for a person: its session, the test, ends here, and so does it."""
    if root is not None:
        from runagent.executors import broker

        broker.stop_all(root)
    # A wait that ends at its event: on a loaded machine a tree's last processes took more
    # than 10 s to leave after the step that stopped them.
    deadline = time.monotonic() + 60
    while _leftovers(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _leftovers(marker)
    for proc in left:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"processes outlived the test: {[p.info['cmdline'] for p in left]}"


@pytest.fixture
def ws_outside() -> Iterator[Workspace]:
    """A workspace whose folder (and so its runs root) is outside /tmp and the home, as a
    person's is: the sandbox hides both, which would hide what a test of containment looks at."""
    import shutil
    import tempfile

    base = Path("/var/tmp")
    folder = Path(tempfile.mkdtemp(prefix="run-agent-test-", dir=base))
    home = Path.home().resolve()
    assert not folder.resolve().is_relative_to(home), f"{folder} is under the home {home}"
    workspace = Workspace(folder, marker=str(folder), pid_file=folder / "agent-pids")
    workspace.write_config()
    try:
        yield workspace
        _insist_none_left(workspace.marker, workspace.root)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# The address TestClient requests name: the server answers only hosts it is meant to be reached by.
LOCAL = "http://127.0.0.1:14355"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    process: subprocess.Popen[str]


@pytest.fixture
def server(ws: Workspace) -> Iterator[Server]:
    """`run-agent serve` on a free port of 127.0.0.1, over the workspace's runs root."""
    import httpx

    port = free_port()
    proc = subprocess.Popen(
        ws.cli_argv("serve", "--port", str(port), "--config", str(ws.config)),
        cwd=ws.path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/api/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            return False

    try:  # a loaded machine (the suite on more workers than cores) can take its time to start it
        wait_for(healthy, 60, "the server to answer")
        yield Server(url, proc)
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


@contextlib.contextmanager
def serving(
    ws: Workspace, env: dict[str, str] | None = None, log: Path | None = None
) -> Iterator[str]:
    """`run-agent serve` of the workspace's config on a free port, for a `with` block (a test
    that starts it at a moment of its own), with `env` added and its output into `log`; its
    URL."""
    import httpx

    port = free_port()
    with contextlib.ExitStack() as files:
        out = files.enter_context(log.open("ab")) if log is not None else subprocess.DEVNULL
        proc = subprocess.Popen(
            ws.cli_argv("serve", "--port", str(port), "--config", str(ws.config)),
            cwd=ws.path, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
            stdout=out, stderr=out, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:  # answering at all: behind a key or a token, with a 401
        try:
            return httpx.get(f"{url}/api/health", timeout=1).status_code in (200, 401)
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, 60, "the server")
        yield url
    finally:
        proc.terminate()
        proc.wait(30)
