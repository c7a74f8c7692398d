"""The checks `run-agent doctor` makes before a long unattended run; it reports, never fixes.

Each check returns Findings: what was checked and, when it is not ok, what to do about it.
Credentials are reported as present or absent, never shown.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from runagent.config.settings import AgentConfig, Config, ExecutorSettings
from runagent.errors import RunAgentError
from runagent.loop.backend import Backend, Finding
from runagent.record import record

MIN_FREE_BYTES = 1 << 30
DEFAULT_PORT = 14355


@record
class Section:
    title: str
    findings: tuple[Finding, ...]
    needed: bool = True  # False: said for a person to know, and no reason for doctor to fail

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.findings)


def check_python() -> Section:
    version = ".".join(map(str, sys.version_info[:3]))
    ok = sys.version_info >= (3, 11)
    return Section(
        "python",
        (Finding(ok, f"Python {version} at {sys.executable}", "use Python 3.11 or newer"),),
    )


def check_config(config: Config) -> Section:
    """Which config is in use, and whether a run without --agent has an agent to run."""
    where = (
        Finding(True, f"config: {config.source}")
        if config.source
        else Finding(
            False,
            "no config.yaml found (./config.yaml, ~/.config/run-agent/config.yaml, "
            "$RUN_AGENT_CONFIG): built-in defaults, with no agents",
            "write one (the repository's config.yaml is an example), or pass --config",
        )
    )
    agents = ", ".join(config.agents) or "none"
    default = config.defaults.agent
    usable = default is not None
    agent = Finding(
        usable,
        f"agents: {agents}; default agent: {default or 'none'}",
        "" if usable else "a run without --agent fails; set defaults.agent in config.yaml",
    )
    return Section("config", (where, agent))


def check_agent(agent: AgentConfig, create: Callable[[AgentConfig], Backend]) -> Section:
    """Whether one configured agent can start here: its backend, executable, version, key."""
    title = f"agent {agent.name} ({agent.type})"
    try:
        backend = create(agent)
    except RunAgentError as exc:
        return Section(title, (Finding(False, str(exc)),))
    findings = backend.check()
    if backend.tells_version() and backend.executable():
        version = backend.version()
        findings.append(
            Finding(True, f"version {version}")
            if version
            else Finding(False, "`--version` gave no answer", "check that the CLI runs at all")
        )
    return Section(title, tuple(findings))


def check_other_agents(
    agents: Sequence[AgentConfig], create: Callable[[AgentConfig], Backend]
) -> Section:
    """The backends no configured agent uses (claude, codex, gemini, ...: each runs as
    `--agent NAME` once it can), each in one line: usable here, or its first problem and the
    fix. Not needed for doctor to pass, but a missing CLI is said, as `backends` says it."""
    findings = []
    for agent in agents:
        section = check_agent(agent, create)
        first = next((f for f in section.findings if not f.ok), section.findings[0])
        findings.append(Finding(first.ok, f"{agent.name}: {first.what}", first.fix))
    title = "backends no agent of the config uses (`--agent NAME` runs one that can)"
    return Section(title, tuple(findings), needed=False)


def check_root(root: Path) -> Section:
    """The runs root exists or can be made, is writable, and has room."""
    findings = []
    existing = next((p for p in (root, *root.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        findings.append(Finding(False, f"runs root {root} is not a folder", "set --root"))
        return Section("runs root", tuple(findings))
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".doctor-"):
            pass
        findings.append(Finding(True, f"runs root {root} is writable"))
    except OSError as exc:
        findings.append(
            Finding(False, f"runs root {root} is not writable ({exc.strerror})", "set --root")
        )
    free = shutil.disk_usage(existing).free
    findings.append(
        Finding(
            free >= MIN_FREE_BYTES,
            f"{free / (1 << 30):.1f} GiB free",
            "free some disk: agents' logs grow for as long as they run",
        )
    )
    return Section("runs root", tuple(findings))


def bind_problem(host: str, port: int) -> str | None:
    """Why `run-agent serve` could not listen on host:port (as uvicorn binds it), or None."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return "in use" if exc.errno == errno.EADDRINUSE else str(exc.strerror or exc)
    return None


def check_port(host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> Section:
    """Whether `run-agent serve` could bind its port."""
    problem = bind_problem(host, port)
    if problem is None:
        return Section("server port", (Finding(True, f"{host}:{port} is free"),))
    if problem == "in use":
        finding = Finding(
            False, f"{host}:{port} is in use", "stop what holds it, or serve with --port"
        )
    else:
        finding = Finding(False, f"cannot bind {host}:{port} ({problem})")
    return Section("server port", (finding,))


def check_sandbox(choice: str, sandboxed: Sequence[str] = ()) -> Section:
    """Which sandbox shell operations get here under the config's `ops.sandbox`: a `bwrap` that
    cannot run is a failure; `auto` without it is not, but the line says why it is not in force.
    And whether bubblewrap can hold the agents themselves (`sandbox: bwrap`; `sandboxed` names
    the agents the config runs so): a failure when one asks for it and it cannot."""
    from runagent.ops.sandbox import Bwrap, InForce, Sandbox

    problem = Bwrap(Path.cwd()).problem()
    if Sandbox(choice) is Sandbox.BWRAP and problem:
        line = Finding(False, f"shell operations: not sandboxed: {problem}", "")
    else:
        line = Finding(True, "shell operations: " + InForce.of(Sandbox(choice), Path.cwd()).line)
    who = f" ({', '.join(sandboxed)} asks for it)" if sandboxed else ""
    if problem is None:
        agents = Finding(True, f"agents: bubblewrap works here (sandbox: bwrap){who}")
    else:
        agents = Finding(
            not sandboxed,
            f"agents: sandbox: bwrap cannot run here{who}: {problem}",
            "bubblewrap needs unprivileged user namespaces (sysctl "
            "kernel.unprivileged_userns_clone=1) and `apt-get install bubblewrap`",
        )
    return Section("sandbox", (line, agents))


def check_cluster(settings: ExecutorSettings) -> Section:
    """For `executor.type: ray`: whether the cluster answers and has hosts for loops, and which
    case it is in when its head dies: state kept in Redis (GCS fault tolerance), so loops on the
    other hosts go on, or in the head's memory, so every loop goes with it."""
    from runagent.executors import control

    try:
        cluster = control.ray_executor(settings)
    except RunAgentError as exc:
        return Section("cluster", (Finding(False, str(exc), ""),))
    hosts, free = cluster.hosts()
    needs = ", ".join(f"{k} {v:g}" for k, v in settings.resources.items()) or "nothing"
    found = Finding(
        hosts > 0,
        f"Ray cluster at {settings.address}: {hosts} host(s) can take a loop ({needs}), "
        f"{free} free now",
        "join hosts with `ray start --address HEAD:PORT --resources '{\"agent_slot\": N}'`",
    )
    kept = cluster.state_kept()
    if kept == "redis":
        line = (
            "the head's state is kept in Redis (GCS fault tolerance): when the head dies and "
            "is started again, loops on the other hosts go on"
        )
    else:
        line = (
            f"the head's state is kept in {kept or 'its memory'}: a head that dies takes every "
            "loop with it (for GCS fault tolerance, start the head with "
            "RAY_REDIS_ADDRESS=HOST:PORT of a Redis)"
        )
    head = Finding(True, line)
    return Section("cluster", (found, head))


def check_environment() -> Section:
    home = Path.home()
    ok = os.access(home, os.W_OK)
    return Section(
        "home",
        (Finding(ok, f"HOME {home} is writable", "agent CLIs keep their logins and state there"),),
    )
