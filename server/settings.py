"""What `run-agent serve` is started with: the runs root, who may call it, the config's schedules,
and the one door (runagent.service) through which its API and its scheduler start work."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import field
from datetime import datetime
from pathlib import Path

from runagent.config.settings import ExecutorSettings, ScheduleConfig
from runagent.loop.lines import LineRule
from runagent.record import record
from runagent.schedule import utc_now
from runagent.service import AgentCheck, Service
from server.security import allowed_hosts

HEARTBEAT = 15


@record
class Settings:
    """What a server is started with: its runs root and config, its key, where operations may
    act, what runs the loops it starts."""

    root: Path
    api_key: str | None = None
    config_path: Path | None = None
    workdir: Path = field(default_factory=Path.cwd)
    env: dict[str, str] | None = None
    schedules: Mapping[str, ScheduleConfig] = field(default_factory=dict)
    run_schedules: bool = True
    clock: Callable[[], datetime] = utc_now  # the scheduler's clock (a seam for tests)
    heartbeat: float = HEARTBEAT  # seconds between SSE comments on a quiet stream
    allowed_hosts: frozenset[str] = field(default_factory=lambda: allowed_hosts("127.0.0.1"))
    ops_workspaces: tuple[Path, ...] = ()  # where API-created operations may act; () = workdir
    executor: ExecutorSettings | None = None  # what runs the loops it starts (None: here)
    # The agent check the command line hands in (the server imports no backend), and the
    # backend names the config file is read with, afresh for each start as the loop started
    # will read it. Without them no agent is checked and the start form offers a free-text agent.
    check_agent: AgentCheck | None = None
    backend_names: Collection[str] = ()
    # How each backend's stdout lines read (backends.lines_of), handed in likewise: the page is
    # told them for a run of that backend. Without it the page shows every line as written.
    backend_lines: Callable[[str], Sequence[LineRule]] | None = None
    metrics_public: bool = False  # `metrics.public`: /metrics answers without a key

    @property
    def workspaces(self) -> tuple[Path, ...]:
        """Where operations act, and where a token below admin starts tasks."""
        return self.ops_workspaces or (self.workdir,)

    def service(self) -> Service:
        """The one door, as this server opens it."""
        return Service(
            self.root, self.check_agent, config_path=self.config_path,
            backend_names=self.backend_names, executor=self.executor, workdir=self.workdir,
            env=self.env,
        )  # fmt: skip
