"""serve: the browser view and its REST/SSE API over the runs root, and the schedules."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

import backends
from runagent.cli.group import cli
from runagent.cli.options import common, setup, usable_backend
from runagent.config.settings import AgentSandbox, Config, ExecutorType
from runagent.errors import UsageError


@cli.command()
@click.option(
    "--host", help="Address to listen on (default 127.0.0.1; others need an API key or a token)."
)
@click.option("--port", type=click.IntRange(1, 65535), help="Port (default 14355).")
@click.option("--no-schedules", is_flag=True, help="Do not fire the config's schedules.")
@common
def serve(
    host: str | None, port: int | None, no_schedules: bool, config_path: Path | None,
    root: Path | None,
) -> None:  # fmt: skip
    """Serve a live view of every run in a browser (REST, SSE and a page)."""
    import uvicorn

    from runagent.doctor import bind_problem
    from runagent.store import tokens
    from server.app import Settings, create_app
    from server.security import allowed_hosts, is_loopback

    s = setup(config_path, root)
    host = host or s.config.server.host
    port = port or s.config.server.port
    key = s.config.server.api_key(os.environ)
    if not is_loopback(host) and not key and not tokens.path(s.root).exists():
        raise UsageError(
            f"refusing to serve on {host}: anything but loopback needs an API key or a token; "
            f"set {s.config.server.api_key_env}, or make one with `run-agent token create`"
        )
    if not key and not tokens.path(s.root).exists():
        _refuse_open_to_sandboxed(s.config, host)
    problem = bind_problem(host, port)
    if problem is not None:
        raise UsageError(f"cannot listen on {host}:{port} ({problem}); pass --port")
    if s.config.executor.type is ExecutorType.RAY:
        from runagent.executors import control

        control.use_broker(None)  # a server lives long: it joins the cluster itself, once
        if not s.config.executor.shared_root:  # hosts send finished task folders to this root
            control.ray_executor(s.config.executor).receive_runs(s.root)
    app = create_app(
        Settings(
            root=s.root,
            api_key=key,
            config_path=s.config.source,
            schedules=s.config.schedules,
            run_schedules=not no_schedules,
            allowed_hosts=allowed_hosts(host, s.config.server.allowed_hosts),
            ops_workspaces=s.config.server.ops_workspaces,
            executor=s.config.executor,
            # What the server asks of the backends: the agent check it runs (reading the config
            # afresh with these names, as the detached supervisor it starts will), and how each
            # backend's lines read, which the page is told.
            check_agent=usable_backend,
            backend_names=backends.known(),
            backend_lines=backends.lines_of,
            metrics_public=s.config.metrics.public,
        )
    )
    enabled = [c.name for c in s.config.schedules.values() if c.enabled]
    if enabled and not no_schedules:
        import logging

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s run-agent: %(message)s"))
        schedule_log = logging.getLogger("run-agent.schedules")
        schedule_log.addHandler(handler)
        schedule_log.setLevel(logging.INFO)
        click.echo(f"run-agent: firing schedules: {', '.join(enabled)}", err=True)
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"run-agent: serving {s.root} at http://{shown}:{port}/", err=True)
    if key or tokens.path(s.root).exists():  # never the key itself: a terminal's log keeps it
        page = s.config.server.page(host, port)
        click.echo(
            f"run-agent: the page asks for a key: open {page}?key=KEY once, with the API key "
            f"({s.config.server.api_key_env}) or a token; `run-agent token create --scope "
            "operate --link` makes a token and prints that address with it",
            err=True,
        )
    click.echo("run-agent: Ctrl-C stops the server; runs it started go on", err=True)
    uvicorn.run(app, host=host, port=port, access_log=False, log_level="warning")


def _refuse_open_to_sandboxed(config: Config, host: str) -> None:
    """A server with neither a key nor a token lets in every process of this machine, and a
    sandboxed agent with the host's network is one: it could start an agent without the
    sandbox through it. Refused in one line while the config runs one so."""
    chosen = [(f"agent {n}", a.loop_defaults(config.defaults)) for n, a in config.agents.items()]
    for name, settings in [*sorted(chosen, key=lambda c: c[0]), ("every agent", config.defaults)]:
        if settings.sandbox is AgentSandbox.BWRAP and settings.network:
            raise UsageError(
                f"refusing to serve on {host} with neither an API key nor a token: "
                f"{name} runs sandboxed with the host's network, and could reach this server "
                f"and start what it likes; set {config.server.api_key_env}, or make a token "
                "with `run-agent token create`"
            )
