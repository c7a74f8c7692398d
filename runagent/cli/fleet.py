"""fleet: the fleet at a glance, as the page's first view shows it."""

from __future__ import annotations

import json
from pathlib import Path

import click

from runagent import duration
from runagent.cli.group import cli
from runagent.cli.options import common, json_option, service_for, setup
from runagent.cli.show import RACER_HEADER, race_cell, racer_cells
from runagent.fleet.overview import Overview, Running, Spent
from runagent.store.tasks import TaskView


@cli.group(invoke_without_command=True)
@json_option
@common
@click.pass_context
def fleet(ctx: click.Context, as_json: bool, config_path: Path | None, root: Path | None) -> None:
    """The fleet at a glance: what runs, the queue in order, today's spend against each
    budget, what needs a person.

    `fleet hold` holds the whole queue (nothing queued starts, what runs goes on) until `fleet
    release`; `fleet unpause AGENT` lifts the pause a provider's limit put an agent in."""
    if ctx.invoked_subcommand is not None:
        return
    s = setup(config_path, root)
    found = service_for(s).fleet()  # with the agents paused on any host of the cluster
    if as_json:
        click.echo(json.dumps(found.to_dict(), indent=2))
        return
    for line in describe(found):
        click.echo(line)


@fleet.command()
@click.argument("agent")
@common
def unpause(agent: str, config_path: Path | None, root: Path | None) -> None:
    """Lift AGENT's pause: its queued tasks start as their turns come, before the time its
    provider said its limit lifts."""
    s = setup(config_path, root)
    lifted = service_for(s).unpause(agent)  # on every host of the cluster too
    click.echo(f"lifted: {lifted}" if lifted else f"agent {agent} is not paused")


@fleet.command()
@common
def hold(config_path: Path | None, root: Path | None) -> None:
    """Hold the whole queue: no queued task starts (neither by the keeper nor a run waiting its
    turn) until `fleet release`; the loops that run go on. Also spelled `fleet pause`."""
    _hold(config_path, root)


@fleet.command()
@common
def release(config_path: Path | None, root: Path | None) -> None:
    """Release the queue `fleet hold` held: its tasks start as their turns come. Also spelled
    `fleet resume`."""
    _release(config_path, root)


@fleet.command("pause", hidden=True)
@common
def pause(config_path: Path | None, root: Path | None) -> None:
    """`fleet hold`: hold the whole queue."""
    _hold(config_path, root)


@fleet.command("resume", hidden=True)
@common
def resume(config_path: Path | None, root: Path | None) -> None:
    """`fleet release`: release the queue."""
    _release(config_path, root)


def _hold(config_path: Path | None, root: Path | None) -> None:
    from runagent.cli.options import service_for

    held, made = service_for(setup(config_path, root)).hold_queue("run-agent fleet hold")
    if made:
        click.echo(f"{held.words()}: no queued task starts, the loops that run go on; "
                   "`run-agent fleet release` lets it go")  # fmt: skip
    else:
        click.echo(f"the queue was held already: {held.words()}")


def _release(config_path: Path | None, root: Path | None) -> None:
    from runagent.cli.options import service_for

    released = service_for(setup(config_path, root)).release_queue()
    click.echo(f"released: {released.words(past=True)}" if released else "the queue is not held")


def describe(found: Overview) -> list[str]:
    c = found.counts
    cap = found.limits.max_running
    lines = [
        f"{c['running']} running"
        + (f" ({c['races']} {'race' if c['races'] == 1 else 'races'})" if c.get("races") else "")
        + f" · {c['queued']} queued"
        + (f" (max_running {cap})" if cap is not None else "")
        + f" · {c['blocked']} blocked"
        + (f" · {c['unreadable']} unreadable" if c["unreadable"] else "")
        + f" · {c['needs_person']} need a person · {c['tasks']} tasks"
    ]
    if found.hold is not None:
        lines.append(f"{found.hold.words()}: no queued task starts (`run-agent fleet release` "
                     "lets it go)")  # fmt: skip
    lines += [f"{p.words()} (`run-agent fleet unpause {p.agent}` lifts it)" for p in found.paused]
    if found.running:
        lines.append("running:")
        lines += [f"  {running_words(r)}" for r in found.running]
    if found.races:
        lines.append("races:")
        for view in found.races:
            assert view.race is not None
            lines.append(f"  {view.label}  {race_cell(view.race)}")
            rows = [racer_cells(r) for r in view.race.racers]
            widths = [max(len(row[i]) for row in rows) for i in range(len(RACER_HEADER))]
            lines += [
                "    " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                for row in rows
            ]
    if found.queued:
        lines.append("queue, in the order it starts:")
        lines += [f"  {n}. {v.label}  {_waits(v)}" for n, v in enumerate(found.queued, 1)]
    if found.blocked:
        lines.append("blocked:")
        lines += [f"  {v.label}  {_waits(v)}" for v in found.blocked]
    if found.unreadable:
        lines.append("unreadable, never started until a person acts:")
        lines += [f"  {v.label}  {_waits(v)}" for v in found.unreadable]
    lines.append(f"spent today ({found.day}, UTC):")
    lines += [f"  {s.what}: {spent_words(s)}" for s in found.spent]
    if found.needs:
        lines.append("needs a person:")
        for need in found.needs:
            said = f"blocked: {need.message}" if need.waits_for == "blocked" else need.message
            lines += [f"  {need.label}  {said}", f"    {need.answer}"]
    return lines


LINE_WIDTH = 100  # characters of a running task's last line the fleet prints


def running_words(running: Running) -> str:
    """`p/a  claude · attempt 2 · 12m 3s  <its last line, read as the page reads it>`."""
    latest = running.view.latest
    said = [running.view.label]
    if latest is not None:
        said.append(f"{latest.agent} · attempt {latest.attempt}")
    if running.seconds is not None:
        said[-1] += f" · {duration.words(running.seconds)}"
    last = last_line(running)
    if last:
        said.append(last if len(last) <= LINE_WIDTH else last[: LINE_WIDTH - 1] + "…")
    return "  ".join(said)


def last_line(running: Running) -> str:
    """The last of a running task's stdout lines that reads as something, as the page reads it
    (its backend's rules: runagent/loop/lines.py)."""
    import backends
    from runagent.loop import lines

    latest = running.view.latest
    rules = backends.lines_of(latest.backend) if latest is not None and latest.backend else ()
    for line in reversed(running.last_lines):
        text = " ".join(lines.read(line, rules).split())
        if text:
            return text
    return ""


def spent_words(spent: Spent) -> str:
    used = spent.used
    words = f"{used.tokens:,} tokens"
    if used.cost_usd is not None:
        words += f", ${used.cost_usd:.2f}"
    if spent.budget is not None:
        words += f" of {spent.budget.words()}"
        if spent.spent:
            words += " (spent: no new start today)"
    return words


def _waits(view: TaskView) -> str:
    return view.queue.waits_for if view.queue is not None else ""
