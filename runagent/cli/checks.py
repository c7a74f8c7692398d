"""doctor and backends: whether everything a run needs is in place."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

import backends
from runagent.cli.group import cli, fail
from runagent.cli.options import common, json_option, setup
from runagent.config.settings import AgentConfig, Config, ExecutorType
from runagent.errors import ExitCode


def backend_agents(config: Config) -> list[AgentConfig]:
    """Each configured agent, plus a default one for every backend no agent uses."""
    return [*config.agents.values(), *unused_backends(config)]


def unused_backends(config: Config) -> list[AgentConfig]:
    """A default agent for every backend no configured agent uses (`--agent NAME` runs one)."""
    used = {a.type for a in config.agents.values()} | set(config.agents)
    return [AgentConfig(name=n, type=n) for n in backends.names() if n not in used]


def print_sections(sections: list[Any]) -> bool:
    """Each section, headed `ok`, `FAIL` (a needed one that is not), or `note`; whether every
    needed one is ok."""
    for section in sections:
        head = "ok  " if section.ok else "FAIL" if section.needed else "note"
        click.echo(f"{head}  {section.title}")
        for f in section.findings:
            click.echo(
                f"      {'✓' if f.ok else '✗'} {f.what}"
                + (f" — {f.fix}" if f.fix and not f.ok else "")
            )
    return all(s.ok for s in sections if s.needed)


@cli.command(name="backends")
@json_option
@common
def backends_(as_json: bool, config_path: Path | None, root: Path | None) -> None:
    """List every backend and agent, and whether it can run here."""
    from runagent import doctor

    s = setup(config_path, root)
    sections = [doctor.check_agent(a, backends.create) for a in backend_agents(s.config)]
    if as_json:
        data = [
            {
                "agent": a.name,
                "backend": a.type,
                "usable": sec.ok,
                "checks": [{"ok": f.ok, "what": f.what, "fix": f.fix} for f in sec.findings],
            }
            for a, sec in zip(backend_agents(s.config), sections, strict=True)
        ]
        click.echo(json.dumps(data, indent=2))
        return
    print_sections(sections)


@cli.command(name="doctor")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=14355,
    show_default=True,
    help="The port `run-agent serve` would listen on, checked to be free.",
)
@common
def doctor_(port: int, config_path: Path | None, root: Path | None) -> None:
    """Check config, agent CLIs, versions, keys, the runs root and the server port."""
    from runagent import doctor

    s = setup(config_path, root)
    sections = [doctor.check_python(), doctor.check_config(s.config)]
    sections += [doctor.check_agent(a, backends.create) for a in s.config.agents.values()]
    unused = unused_backends(s.config)
    others = doctor.check_other_agents(unused, backends.create)
    sections += [others] if others.findings else []
    sections += [
        doctor.check_root(s.root),
        doctor.check_port(port=port),
        doctor.check_sandbox(s.config.ops.sandbox, sandboxed_agents(s.config)),
        doctor.check_environment(),
    ]
    if s.config.executor.type is ExecutorType.RAY:
        sections.append(doctor.check_cluster(s.config.executor))
    if print_sections(sections):
        missing = [a.name for a, f in zip(unused, others.findings, strict=True) if not f.ok]
        if missing:
            click.echo("everything the configured agents need is in place; not usable here: "
                       f"{', '.join(missing)} (see `note` above)")  # fmt: skip
        else:
            click.echo("everything run-agent needs is in place")
        return
    fail("some checks failed; see the lines marked ✗", ExitCode.MISSING_DEPENDENCY)


def sandboxed_agents(config: Config) -> list[str]:
    """The agents the config runs under bubblewrap (theirs, or the defaults' `sandbox: bwrap`)."""
    from runagent.config.settings import AgentSandbox

    return [name for name, agent in config.agents.items()
            if agent.loop_defaults(config.defaults).sandbox is AgentSandbox.BWRAP]  # fmt: skip
