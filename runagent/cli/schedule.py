"""schedule list, run, now and crontab: cron schedules from config.yaml."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import click

from runagent import python
from runagent import schedule as sched
from runagent.cli.foreground import STOP_SIGNALS, executable_dir
from runagent.cli.group import cli
from runagent.cli.options import Setup, common, json_option, service_for, setup
from runagent.cli.show import plural
from runagent.config.settings import ScheduleConfig
from runagent.errors import UsageError


@cli.group()
def schedule() -> None:
    """Cron schedules from config.yaml: list them, run the scheduler, fire one now, or print
    equivalent crontab lines."""


def schedule_named(s: Setup, name: str) -> ScheduleConfig:
    if name not in s.config.schedules:
        known = ", ".join(s.config.schedules) or "none configured"
        raise UsageError(f"unknown schedule {name!r}; schedules: {known}")
    return s.config.schedules[name]


def scheduler_for(s: Setup, log: Callable[[str], None]) -> sched.Scheduler:
    """The scheduler, firing through the one door."""
    service = service_for(s)
    return sched.Scheduler(
        s.config.schedules, s.root, launch=service.fire, log=log, leader=service.hold_scheduler
    )


def stamped(line: str) -> None:
    click.echo(f"{sched.utc_now():%Y-%m-%dT%H:%M:%SZ} {line}")


@schedule.command(name="list")
@click.option(
    "--count",
    type=click.IntRange(0, 1000),
    default=3,
    show_default=True,
    help="How many next firings to show.",
)
@json_option
@common
def schedule_list(count: int, as_json: bool, config_path: Path | None, root: Path | None) -> None:
    """Each schedule with its next firings and what it last did."""
    s = setup(config_path, root)
    rows = sched.describe(s.config.schedules, s.root, sched.utc_now(), count)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no schedules in the config (add a `schedules:` section)", err=True)
    for row in rows:
        state_text = "" if row["enabled"] else " (disabled)"
        click.echo(f"{row['name']}{state_text}: '{row['cron']}' {row['timezone']}, "
                   f"overlap {row['overlap']} -> {row['project']}/{row['task']}")  # fmt: skip
        for moment in row["next"]:
            click.echo(f"  next  {moment}")
        if row["last_fired"]:
            click.echo(f"  last  {row['last_fired']} {row['last_task']}: "
                       f"{row['last_outcome'] or 'running'}")  # fmt: skip


@schedule.command(name="run")
@click.option("--tick", default=15.0, show_default=True, hidden=True)
@common
def schedule_run(tick: float, config_path: Path | None, root: Path | None) -> None:
    """Run the scheduler in the foreground: fire each schedule as a detached supervisor."""
    import threading

    s = setup(config_path, root)
    if not s.config.schedules:
        raise UsageError("no schedules in the config; add a `schedules:` section")
    if not any(c.enabled for c in s.config.schedules.values()):
        names = ", ".join(s.config.schedules)
        raise UsageError(
            f"every schedule in the config is disabled ({names}); set `enabled: true` on one"
        )
    scheduler = scheduler_for(s, stamped)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in STOP_SIGNALS}
    try:
        scheduler.start(sched.utc_now())
        stamped(f"scheduler started: {', '.join(c.name for c in scheduler.enabled())}")
        while not stop.is_set():
            scheduler.tick(sched.utc_now())
            stop.wait(min(tick, sched.seconds_to_next_minute(sched.utc_now())))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    stamped("scheduler stopped; runs it started go on")


@schedule.command(name="now")
@click.argument("name")
@common
def schedule_now(name: str, config_path: Path | None, root: Path | None) -> None:
    """Fire schedule NAME now (what a crontab line runs)."""
    s = setup(config_path, root)
    config = schedule_named(s, name)
    firing = scheduler_for(s, stamped).fire_now(config, sched.utc_now())
    click.echo(f"{firing.label}")


@schedule.command(name="crontab")
@click.option(
    "--install",
    "action",
    flag_value="install",
    help="Put the lines into your crontab, replacing only run-agent's block.",
)
@click.option(
    "--uninstall",
    "action",
    flag_value="uninstall",
    help="Take run-agent's block of this config out of your crontab.",
)
@common
def schedule_crontab(action: str | None, config_path: Path | None, root: Path | None) -> None:
    """Print crontab lines equivalent to the config's schedules, or install them."""
    from runagent import crontab

    s = setup(config_path, root)
    if s.config.source is None:
        raise UsageError("no config file: crontab lines need one (pass --config)")
    config = s.config.source.resolve()
    if action == "uninstall":
        rest, found = crontab.without_block(crontab.read(), config)
        if found:
            crontab.write(rest)
        click.echo(f"run-agent: {'removed' if found else 'no'} run-agent block of {config} "
                   f"{'from' if found else 'in'} your crontab", err=True)  # fmt: skip
        return
    launcher = executable_dir() / "run-agent"
    command = [str(launcher)] if launcher.exists() else python("-m", "runagent")
    path = os.environ.get("PATH", "/usr/bin:/bin")
    block = crontab.block(s.config.schedules, config, s.root, Path.cwd(), command, path)
    left_out = f"; left out, disabled: {', '.join(block.left_out)}" if block.left_out else ""
    if action == "install":
        crontab.write(crontab.with_block(crontab.read(), block))
        count = plural(len(block.installed), "schedule")
        click.echo(f"run-agent: installed {count} in your crontab{left_out}", err=True)
        return
    click.echo("# run-agent schedules: install with `run-agent schedule crontab --install`, which "
               "replaces only this block in your crontab")  # fmt: skip
    click.echo("# (`| crontab -` would replace your whole crontab). CRON_TZ needs a cron that "
               "supports it (cronie); others use the system zone.")  # fmt: skip
    click.echo(block.text, nl=False)
    if left_out:
        click.echo(f"run-agent: {left_out[2:]}", err=True)
